//! The plain-TCP baseline: framing, the echo server, the multiplexed
//! request/reply client, the one-way sink and its sender.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use surelink_lab::lock;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::coop::consume_budget;
use tokio::task::JoinHandle;

use super::fixture::{Delivered, CALL_TIMEOUT, CLIENT_IPS, SERVER_IPS};
use super::report::ThroughputRound;
use super::throughput::{measure_task, Delivery};
use super::Plan;

/// How the baseline is set up, for `bench.json`.
pub(super) const DESCRIPTION: &str =
    "one tokio TcpStream per measurement kind, TCP_NODELAY, 4-byte length + 8-byte id + payload; \
     callers multiplexed with write combining; 64 KiB BufWriter sender";

/// Bytes before the payload: length (of id + payload) and id.
const FRAME_HEADER: usize = 12;
/// Largest frame the baseline accepts.
const MAX_FRAME: usize = 16 << 20;
/// Bytes asked of the kernel per read (as surelink's connections do).
const READ_CHUNK: usize = 64 * 1024;
/// The throughput sender's buffer.
const WRITE_BUFFER: usize = 64 * 1024;

/// The baseline: the request/reply client, the one-way sink, and the tasks
/// behind them (echo server, reply reader, sink reader). Dropping it stops
/// them.
pub(super) struct TcpBaseline {
    pub(super) rpc: Arc<TcpRpc>,
    sink: TcpSink,
    tasks: Vec<JoinHandle<Result<()>>>,
}

impl TcpBaseline {
    pub(super) async fn setup() -> Result<TcpBaseline> {
        let (rpc, tasks) = TcpRpc::setup().await?;
        let mut baseline = TcpBaseline {
            rpc,
            sink: TcpSink {
                writer: None,
                delivered: Arc::default(),
            },
            tasks,
        };
        // An error here drops `baseline`, which stops the rpc tasks.
        let (sink, sink_task) = TcpSink::setup().await?;
        baseline.sink = sink;
        baseline.tasks.push(sink_task);
        Ok(baseline)
    }

    /// One throughput round: frames through a `BufWriter`, the receiver
    /// counting.
    pub(super) async fn throughput_round(
        &mut self,
        payload: &Bytes,
        plan: &Plan,
    ) -> Result<ThroughputRound> {
        let writer = self
            .sink
            .writer
            .take()
            .context("the baseline writer was lost in an earlier round")?;
        let (round, writer) =
            measure_task(&self.sink.delivered, plan, Delivery::Reliable, |stop| {
                send_loop(writer, payload.clone(), stop)
            })
            .await?;
        self.sink.writer = Some(writer);
        Ok(round)
    }
}

impl Drop for TcpBaseline {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.rpc.close();
    }
}

/// The throughput sender: frames until told to stop, then a flush; hands
/// the writer back with the count.
async fn send_loop(
    mut writer: BufWriter<TcpStream>,
    payload: Bytes,
    stop: Arc<AtomicBool>,
) -> Result<(BufWriter<TcpStream>, u64)> {
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let header = frame_header(sent, payload.len())?;
        writer.write_all(&header).await?;
        writer.write_all(&payload).await?;
        sent += 1;
        consume_budget().await;
    }
    writer.flush().await?;
    Ok((writer, sent))
}

/// Appends one frame to `buf`.
fn put_frame(buf: &mut BytesMut, id: u64, payload: &[u8]) -> Result<()> {
    let len = u32::try_from(8 + payload.len()).context("payload too large for a frame")?;
    buf.reserve(FRAME_HEADER + payload.len());
    buf.put_u32(len);
    buf.put_u64(id);
    buf.put_slice(payload);
    Ok(())
}

/// The header of one frame.
fn frame_header(id: u64, payload_len: usize) -> Result<[u8; FRAME_HEADER]> {
    let len = u32::try_from(8 + payload_len).context("payload too large for a frame")?;
    let mut h = [0u8; FRAME_HEADER];
    h[..4].copy_from_slice(&len.to_be_bytes());
    h[4..].copy_from_slice(&id.to_be_bytes());
    Ok(h)
}

/// Takes the next complete frame off `buf`: its id and payload.
fn take_frame(buf: &mut BytesMut) -> Result<Option<(u64, Bytes)>> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = usize::try_from(u32::from_be_bytes(prefix.try_into()?))?;
    ensure!(
        (8..=MAX_FRAME).contains(&len),
        "baseline frame of bad length {len}"
    );
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len).freeze();
    frame.advance(4);
    let id = frame.get_u64();
    Ok(Some((id, frame)))
}

/// Keeps room for a full read at the end of `buf`.
fn reserve_read(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
}

/// One connection from 127.0.1.2 to a fresh listener on 127.0.1.1, with
/// `TCP_NODELAY` on both ends: (client side, server side).
async fn tcp_pair() -> Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(SERVER_IPS[0]), 0))
        .await
        .context("baseline listener")?;
    let addr = listener.local_addr()?;
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(CLIENT_IPS[0]), 0))?;
    let (client, (server, _)) =
        tokio::try_join!(socket.connect(addr), listener.accept()).context("baseline connection")?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

/// Writes all of `data`, trying the socket first and waiting for it only
/// when it is full (what surelink's connections do).
async fn write_all(stream: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match stream.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The frames callers appended and nobody has written yet.
#[derive(Debug, Default)]
struct Outbox {
    buf: BytesMut,
    /// Some caller is writing the outbox to the socket now.
    writing: bool,
}

/// The baseline's request/reply client: callers multiplexed over one
/// connection.
#[derive(Debug)]
pub(super) struct TcpRpc {
    stream: TcpStream,
    outbox: Mutex<Outbox>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Bytes>>>,
    next_id: AtomicU64,
}

impl TcpRpc {
    /// Connects a client to an echo server; returns it and the tasks (echo
    /// server, reply reader).
    async fn setup() -> Result<(Arc<TcpRpc>, Vec<JoinHandle<Result<()>>>)> {
        let (client, server) = tcp_pair().await?;
        let echo = tokio::spawn(echo_server(server));
        let rpc = Arc::new(TcpRpc {
            stream: client,
            outbox: Mutex::new(Outbox::default()),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        });
        let reader = tokio::spawn(read_replies(rpc.clone()));
        Ok((rpc, vec![echo, reader]))
    }

    /// Sends `payload` as a request and waits for the echo.
    pub(super) async fn call(&self, payload: &[u8]) -> Result<Bytes> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiting).insert(id, tx);
        let result = async {
            let write = {
                let mut out = lock(&self.outbox);
                put_frame(&mut out.buf, id, payload)?;
                !std::mem::replace(&mut out.writing, true)
            };
            // Not under the timeout: a writer cancelled half-way would keep
            // the writer role for ever. (The server always reads, so the
            // write cannot block for long.)
            if write {
                self.write_outbox().await?;
            }
            match tokio::time::timeout(CALL_TIMEOUT, rx).await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) => bail!("baseline connection closed"),
                Err(_) => bail!("baseline call timed out"),
            }
        }
        .await;
        if result.is_err() {
            lock(&self.waiting).remove(&id);
        }
        result
    }

    /// Writes the outbox until it is empty, then hands the writer role back.
    async fn write_outbox(&self) -> Result<()> {
        loop {
            let chunk = {
                let mut out = lock(&self.outbox);
                if out.buf.is_empty() {
                    out.writing = false;
                    return Ok(());
                }
                out.buf.split()
            };
            if let Err(e) = write_all(&self.stream, &chunk).await {
                lock(&self.outbox).writing = false;
                return Err(e).context("baseline write");
            }
        }
    }

    fn close(&self) {
        // Dropping the waiters fails any call still waiting.
        lock(&self.waiting).clear();
    }
}

/// The baseline client's reader: completes the callers' `oneshot`s.
async fn read_replies(rpc: Arc<TcpRpc>) -> Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut replies = Vec::new();
    let mut ready = Vec::new();
    loop {
        reserve_read(&mut buf);
        rpc.stream.readable().await?;
        match rpc.stream.try_read_buf(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e).context("baseline read"),
        }
        while let Some(frame) = take_frame(&mut buf)? {
            replies.push(frame);
        }
        if replies.is_empty() {
            continue;
        }
        {
            let mut waiting = lock(&rpc.waiting);
            for (id, body) in replies.drain(..) {
                if let Some(tx) = waiting.remove(&id) {
                    ready.push((tx, body));
                }
            }
        }
        for (tx, body) in ready.drain(..) {
            let _ = tx.send(body);
        }
    }
}

/// The baseline's echo server: the replies to one read leave in one write.
async fn echo_server(mut stream: TcpStream) -> Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = BytesMut::with_capacity(READ_CHUNK);
    loop {
        reserve_read(&mut buf);
        if stream.read_buf(&mut buf).await.context("echo read")? == 0 {
            return Ok(());
        }
        while let Some((id, body)) = take_frame(&mut buf)? {
            put_frame(&mut out, id, &body)?;
        }
        if !out.is_empty() {
            stream.write_all(&out).await.context("echo write")?;
            out.clear();
        }
    }
}

/// The baseline's one-way connection: the sender's buffered writer (handed
/// to each round's sender task and back) and the receiver's counter.
struct TcpSink {
    writer: Option<BufWriter<TcpStream>>,
    delivered: Arc<Delivered>,
}

impl TcpSink {
    async fn setup() -> Result<(TcpSink, JoinHandle<Result<()>>)> {
        let (client, server) = tcp_pair().await?;
        let delivered = Arc::new(Delivered::default());
        let task = tokio::spawn(sink_receiver(server, delivered.clone()));
        Ok((
            TcpSink {
                writer: Some(BufWriter::with_capacity(WRITE_BUFFER, client)),
                delivered,
            },
            task,
        ))
    }
}

/// The baseline's receiver: parses frames into `Bytes` and counts them.
async fn sink_receiver(mut stream: TcpStream, delivered: Arc<Delivered>) -> Result<()> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        reserve_read(&mut buf);
        if stream.read_buf(&mut buf).await.context("sink read")? == 0 {
            return Ok(());
        }
        while let Some((_, body)) = take_frame(&mut buf)? {
            delivered.add(body.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_split_anywhere() {
        let mut wire = BytesMut::new();
        put_frame(&mut wire, 7, b"hello").unwrap();
        put_frame(&mut wire, 8, b"").unwrap();
        let whole = wire.freeze();
        for cut in 0..=whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            let mut got = Vec::new();
            while let Some(f) = take_frame(&mut buf).unwrap() {
                got.push(f);
            }
            buf.extend_from_slice(&whole[cut..]);
            while let Some(f) = take_frame(&mut buf).unwrap() {
                got.push(f);
            }
            assert_eq!(
                got,
                vec![(7, Bytes::from_static(b"hello")), (8, Bytes::new())]
            );
        }
        let mut h = BytesMut::new();
        h.extend_from_slice(&frame_header(9, 3).unwrap());
        h.extend_from_slice(b"abc");
        assert_eq!(
            take_frame(&mut h).unwrap(),
            Some((9, Bytes::from_static(b"abc")))
        );
        let mut bad = BytesMut::from(&[0u8, 0, 0, 3][..]);
        assert!(take_frame(&mut bad).is_err());
    }
}
