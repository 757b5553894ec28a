//! The ZeroMQ contender (built with the `zeromq` cargo feature): real
//! libzmq — Debian's, linked through the `zmq` crate — over TCP on
//! 127.0.1.1, tuned as its users would: default HWMs (1000 messages) and
//! socket options (libzmq sets `TCP_NODELAY` itself), one context (with its
//! default single I/O thread) for the server side and one for the client
//! side, as two processes would have.
//!
//! zmq sockets are not thread-safe and their calls block, so every socket
//! is driven by a std thread of its own, never by a tokio worker; the async
//! bench waits for those threads through oneshot channels.
//!
//! * Latency: a ROUTER thread echoes every message back to its sender
//!   (zero-copy: the received frames are sent back as they are). Each
//!   caller is a thread with a DEALER socket of its own, sending `[8-byte
//!   request id, payload]` and waiting for the reply with the same id
//!   (replies with an older id, to a call that timed out, are dropped).
//!   One socket per caller is what ZeroMQ users do for concurrent requests
//!   (the guide's pattern, rather than sharing a socket behind a lock or a
//!   multiplexer thread, which would add a thread hop per call that no
//!   user pays). Caller sockets are made once and reused by later rounds.
//!   Measured on the 2-core VM, neither alternative changed the picture:
//!   one thread driving all 16 callers' sockets with `zmq_poll` gave the
//!   same 34–38 k calls/s as 16 caller threads, and one context shared by
//!   both sides was ~10 µs faster at 1 caller and ~15 % slower at 16. The
//!   hops through libzmq's I/O threads (caller → I/O thread → kernel → I/O
//!   thread → ROUTER thread, and back) bound it, not the caller threads.
//! * Throughput: PUSH/PULL. A sender thread loops `send` (libzmq batches
//!   writes on its I/O thread, and `send` blocks when the HWM is reached);
//!   the receiver thread loops `recv` into a reused message and counts.
//!
//! Sockets have `LINGER` 0 (nothing is left to send at shutdown), the
//! callers and the sender 5 s send and receive timeouts (the bench's call
//! timeout), and the two server threads a 100 ms receive timeout so that
//! they notice the stop flag when idle (it never fires under traffic).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use tokio::sync::oneshot;

use super::fixture::{Delivered, Setup, CALL_TIMEOUT, SERVER_IPS};
use super::latency::{check_echo, summarize, CallerOutcome, Timing};
use super::report::{LatencyRound, ThroughputRound};
use super::throughput::{measure, Delivery};
use super::Plan;

/// The server threads' receive timeout: how often they look at the stop
/// flag when no message comes.
const SERVER_POLL: Duration = Duration::from_millis(100);
/// How long shutdown waits for the threads and contexts to finish.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The ZeroMQ contender: both sides' contexts, the idle client sockets,
/// and the server threads (ROUTER echo, PULL sink).
pub(super) struct ZmqContender {
    client_ctx: zmq::Context,
    server_ctx: zmq::Context,
    /// Where the ROUTER listens.
    echo_endpoint: String,
    /// Caller sockets between rounds (a round takes as many as it needs).
    callers: Vec<CallerSocket>,
    /// The throughput sender's socket between rounds.
    push: Option<zmq::Socket>,
    delivered: Arc<Delivered>,
    /// Tells the server threads to end.
    stop: Arc<AtomicBool>,
    servers: Vec<(&'static str, JoinHandle<Result<()>>)>,
}

impl ZmqContender {
    /// Binds the ROUTER and the PULL socket on 127.0.1.1, connects the PUSH
    /// socket and starts the server threads.
    pub(super) fn setup() -> Result<Setup<ZmqContender>> {
        let server_ctx = zmq::Context::new();
        let client_ctx = zmq::Context::new();
        let bind_to = format!("tcp://{}:*", SERVER_IPS[0]);

        let router = socket(&server_ctx, zmq::ROUTER)?;
        router.set_rcvtimeo(millis(SERVER_POLL)?)?;
        router
            .bind(&bind_to)
            .with_context(|| format!("binding the ZeroMQ ROUTER to {bind_to}"))?;
        let echo_endpoint = last_endpoint(&router)?;

        let pull = socket(&server_ctx, zmq::PULL)?;
        pull.set_rcvtimeo(millis(SERVER_POLL)?)?;
        pull.bind(&bind_to)
            .with_context(|| format!("binding the ZeroMQ PULL socket to {bind_to}"))?;
        let sink_endpoint = last_endpoint(&pull)?;

        let push = socket(&client_ctx, zmq::PUSH)?;
        push.set_sndtimeo(millis(CALL_TIMEOUT)?)?;
        push.connect(&sink_endpoint)
            .with_context(|| format!("connecting the ZeroMQ PUSH socket to {sink_endpoint}"))?;

        let mut contender = ZmqContender {
            client_ctx,
            server_ctx,
            echo_endpoint,
            callers: Vec::new(),
            push: Some(push),
            delivered: Arc::new(Delivered::default()),
            stop: Arc::new(AtomicBool::new(false)),
            servers: Vec::new(),
        };
        // An error from here on drops `contender`, which stops the threads.
        let stop = contender.stop.clone();
        contender.servers.push((
            "ROUTER echo",
            spawn("zmq-echo", move || echo(&router, &stop))?,
        ));
        let (stop, delivered) = (contender.stop.clone(), contender.delivered.clone());
        contender.servers.push((
            "PULL sink",
            spawn("zmq-sink", move || sink(&pull, &delivered, &stop))?,
        ));
        Ok(Setup::Ready(contender))
    }

    /// What this contender is, for `bench.json`.
    pub(super) fn describe(&self) -> String {
        let (major, minor, patch) = zmq::version();
        format!(
            "libzmq {major}.{minor}.{patch} over TCP (zmq crate), one context per side, default HWMs; \
             a DEALER socket and thread per caller -> ROUTER echo thread; PUSH/PULL, one thread each"
        )
    }

    /// One latency round: `callers` threads, each with its own DEALER.
    pub(super) async fn latency_round(
        &mut self,
        payload: &Bytes,
        callers: usize,
        plan: &Plan,
    ) -> Result<(LatencyRound, Histogram<u64>)> {
        self.check_servers()?;
        while self.callers.len() < callers {
            let caller = CallerSocket::connect(&self.client_ctx, &self.echo_endpoint)?;
            self.callers.push(caller);
        }
        let timing = Timing::starting_now(plan);
        let mut running = Vec::with_capacity(callers);
        for (i, mut caller) in self.callers.drain(..callers).enumerate() {
            let payload = payload.clone();
            running.push(on_thread(format!("zmq-caller-{i}"), move || {
                let outcome = caller.call_loop(&payload, &timing);
                (caller, outcome)
            })?);
        }
        let mut outcomes = Vec::with_capacity(callers);
        let mut failed = None;
        for r in running {
            let (caller, outcome) = r.await?;
            self.callers.push(caller);
            match outcome {
                Ok(o) => outcomes.push(o),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e.context("a ZeroMQ caller failed"));
        }
        summarize(outcomes, plan)
    }

    /// One throughput round: a thread loops `send` on the PUSH socket, the
    /// PULL thread counts.
    pub(super) async fn throughput_round(
        &mut self,
        payload: &Bytes,
        plan: &Plan,
    ) -> Result<ThroughputRound> {
        self.check_servers()?;
        let push = self
            .push
            .take()
            .context("the ZeroMQ PUSH socket was lost in an earlier round")?;
        let (round, push) = measure(&self.delivered, plan, Delivery::Reliable, |stop| {
            let payload = payload.clone();
            let sender = on_thread("zmq-push".to_owned(), move || {
                push_loop(push, &payload, &stop)
            });
            async move { sender?.await? }
        })
        .await?;
        self.push = Some(push);
        Ok(round)
    }

    /// Fails with a server thread's error if one has stopped.
    fn check_servers(&mut self) -> Result<()> {
        let Some(i) = self.servers.iter().position(|(_, t)| t.is_finished()) else {
            return Ok(());
        };
        let (name, thread) = self.servers.remove(i);
        join_server(name, thread).and_then(|()| bail!("the ZeroMQ {name} thread stopped"))
    }

    /// Stops the server threads, closes every socket and terminates both
    /// contexts (off the tokio workers: these calls block).
    pub(super) async fn shutdown(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let servers = std::mem::take(&mut self.servers);
        let sockets = (std::mem::take(&mut self.callers), self.push.take());
        let contexts = (self.client_ctx.clone(), self.server_ctx.clone());
        drop(self);
        let stopping = tokio::task::spawn_blocking(move || {
            let mut result = Ok(());
            for (name, thread) in servers {
                let r = join_server(name, thread);
                result = result.and(r);
            }
            drop(sockets);
            // The last references: zmq_ctx_term, with every socket closed.
            drop(contexts);
            result
        });
        match tokio::time::timeout(SHUTDOWN_TIMEOUT, stopping).await {
            Ok(r) => r.context("the ZeroMQ shutdown thread failed")?,
            Err(_) => bail!("ZeroMQ did not stop within {SHUTDOWN_TIMEOUT:?}"),
        }
    }
}

impl Drop for ZmqContender {
    fn drop(&mut self) {
        // The server threads end within SERVER_POLL; each closes its socket.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One caller's DEALER socket, its next request id and its reply buffer.
struct CallerSocket {
    socket: zmq::Socket,
    next_id: u64,
    reply: zmq::Message,
}

impl CallerSocket {
    fn connect(ctx: &zmq::Context, endpoint: &str) -> Result<CallerSocket> {
        let socket = socket(ctx, zmq::DEALER)?;
        socket.set_rcvtimeo(millis(CALL_TIMEOUT)?)?;
        socket.set_sndtimeo(millis(CALL_TIMEOUT)?)?;
        socket
            .connect(endpoint)
            .with_context(|| format!("connecting a ZeroMQ DEALER to {endpoint}"))?;
        Ok(CallerSocket {
            socket,
            next_id: 1,
            reply: zmq::Message::new(),
        })
    }

    /// Calls back to back until `timing.until` (on the caller's thread).
    fn call_loop(&mut self, payload: &[u8], timing: &Timing) -> Result<CallerOutcome> {
        let mut outcome = CallerOutcome::new()?;
        loop {
            let start = std::time::Instant::now();
            if start >= timing.until {
                return Ok(outcome);
            }
            let result = self.call(payload);
            outcome.record(timing, start, result);
        }
    }

    /// One request and its reply.
    fn call(&mut self, payload: &[u8]) -> Result<()> {
        let id = self.send_request(payload)?;
        loop {
            match self.recv_reply()? {
                Some(got) if got == id => return check_echo(&self.reply, payload),
                // The late reply to a call that timed out: not this one's.
                Some(_) => {}
                None => bail!("ZeroMQ call timed out after {CALL_TIMEOUT:?}"),
            }
        }
    }

    /// Sends `[id, payload]`; returns the id.
    fn send_request(&mut self, payload: &[u8]) -> Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        self.socket
            .send(&id.to_be_bytes()[..], zmq::SNDMORE)
            .context("ZeroMQ DEALER send")?;
        self.socket.send(payload, 0).context("ZeroMQ DEALER send")?;
        Ok(id)
    }

    /// Receives one reply into `self.reply` (its payload); returns its id,
    /// or `None` if none came within the timeout.
    fn recv_reply(&mut self) -> Result<Option<u64>> {
        match self.socket.recv(&mut self.reply, 0) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(e) => return Err(e).context("ZeroMQ DEALER recv"),
        }
        let id: [u8; 8] = self.reply[..]
            .try_into()
            .context("ZeroMQ reply with a bad id frame")?;
        ensure!(self.reply.get_more(), "ZeroMQ reply without a payload");
        // The rest of a multipart message is there once its first frame is.
        self.socket
            .recv(&mut self.reply, 0)
            .context("ZeroMQ DEALER recv")?;
        Ok(Some(u64::from_be_bytes(id)))
    }
}

/// The ROUTER echo server: every message goes back, frames as received
/// (the first is the sender's identity, which routes the reply).
fn echo(router: &zmq::Socket, stop: &AtomicBool) -> Result<()> {
    let mut parts: Vec<zmq::Message> = Vec::with_capacity(4);
    while !stop.load(Ordering::Relaxed) {
        let mut part = zmq::Message::new();
        match router.recv(&mut part, 0) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) => continue,
            Err(e) => return Err(e).context("ZeroMQ ROUTER recv"),
        }
        let more = part.get_more();
        parts.push(part);
        if !more {
            router
                .send_multipart(parts.drain(..), 0)
                .context("ZeroMQ ROUTER send")?;
        }
    }
    Ok(())
}

/// The PULL receiver: counts every message.
fn sink(pull: &zmq::Socket, delivered: &Delivered, stop: &AtomicBool) -> Result<()> {
    let mut msg = zmq::Message::new();
    while !stop.load(Ordering::Relaxed) {
        match pull.recv(&mut msg, 0) {
            Ok(()) => delivered.add(msg.len()),
            Err(zmq::Error::EAGAIN) => {}
            Err(e) => return Err(e).context("ZeroMQ PULL recv"),
        }
    }
    Ok(())
}

/// The throughput sender: `send` until told to stop; hands the socket back
/// with the count.
fn push_loop(push: zmq::Socket, payload: &[u8], stop: &AtomicBool) -> Result<(zmq::Socket, u64)> {
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match push.send(payload, 0) {
            Ok(()) => sent += 1,
            Err(zmq::Error::EAGAIN) => {
                bail!("ZeroMQ PUSH blocked for {CALL_TIMEOUT:?}: the receiver takes nothing")
            }
            Err(e) => return Err(e).context("ZeroMQ PUSH send"),
        }
    }
    Ok((push, sent))
}

/// A socket of `kind` with `LINGER` 0.
fn socket(ctx: &zmq::Context, kind: zmq::SocketType) -> Result<zmq::Socket> {
    let s = ctx
        .socket(kind)
        .with_context(|| format!("creating a ZeroMQ {kind:?} socket"))?;
    s.set_linger(0).context("setting ZMQ_LINGER")?;
    Ok(s)
}

/// The address a socket bound to `tcp://host:*` got.
fn last_endpoint(s: &zmq::Socket) -> Result<String> {
    match s.get_last_endpoint().context("ZMQ_LAST_ENDPOINT")? {
        Ok(e) => Ok(e),
        Err(raw) => bail!("ZMQ_LAST_ENDPOINT is not UTF-8: {raw:?}"),
    }
}

fn millis(d: Duration) -> Result<i32> {
    i32::try_from(d.as_millis()).context("timeout too long for ZeroMQ")
}

/// A named server thread.
fn spawn(
    name: &str,
    f: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<JoinHandle<Result<()>>> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .with_context(|| format!("spawning thread {name}"))
}

fn join_server(name: &str, thread: JoinHandle<Result<()>>) -> Result<()> {
    match thread.join() {
        Ok(r) => r.with_context(|| format!("the ZeroMQ {name} thread failed")),
        Err(_) => bail!("the ZeroMQ {name} thread panicked"),
    }
}

/// Runs `f` on a new thread named `name`; the future is its result.
fn on_thread<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<impl Future<Output = Result<T>>> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .with_context(|| format!("spawning thread {name}"))?;
    Ok(async move { rx.await.with_context(|| format!("thread {name} panicked")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn echoes_counts_and_stops() {
        let Setup::Ready(mut z) = ZmqContender::setup().unwrap() else {
            panic!("ZeroMQ is built in: it cannot be skipped");
        };
        let plan = Plan::tiny();
        let body = Bytes::from(vec![7u8; 100]);
        let (round, _) = z.latency_round(&body, 3, &plan).await.unwrap();
        assert!(
            round.calls > 0 && round.errors == 0,
            "{:?}",
            round.first_error
        );
        assert_eq!(z.callers.len(), 3);
        let round = z.throughput_round(&body, &plan).await.unwrap();
        assert!(round.delivered > 0 && round.lost == 0);
        z.shutdown().await.unwrap();
    }
}
