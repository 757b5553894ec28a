//! What the cache's loopback tests share: a raw memcached-protocol client
//! (send a request, read to the answer's end), connections from a chosen
//! loopback address, and waiting for a condition with a deadline.

// Each test binary uses its own subset.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long an answer may take (a node failing over on the way included).
const ANSWER_WITHIN: Duration = Duration::from_secs(12);

/// Sends `req`, reads until the answer ends with `end`; what came before
/// the connection closed if it closes first. Panics without an answer in
/// [`ANSWER_WITHIN`].
pub(crate) async fn ask(s: &mut TcpStream, req: &[u8], end: &[u8]) -> Vec<u8> {
    s.write_all(req).await.unwrap();
    read_until(s, end).await
}

/// [`ask`], and the connection must stay open until the answer ends.
pub(crate) async fn ask_open(s: &mut TcpStream, req: &[u8], end: &[u8]) -> Vec<u8> {
    let got = ask(s, req, end).await;
    assert!(
        got.ends_with(end),
        "the proxy closed the connection; got {:?}",
        String::from_utf8_lossy(&got)
    );
    got
}

/// [`ask_open`], the answer as text.
pub(crate) async fn ask_str(s: &mut TcpStream, req: &[u8], end: &[u8]) -> String {
    String::from_utf8(ask_open(s, req, end).await).unwrap()
}

/// Reads until what arrived ends with `end` (or the connection closed).
pub(crate) async fn read_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + ANSWER_WITHIN;
    let mut b = vec![0u8; 1 << 16];
    while !got.ends_with(end) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut b))
            .await
            .unwrap_or_else(|_| {
                let shown = String::from_utf8_lossy(&got[..got.len().min(512)]).into_owned();
                panic!("no answer in time; got {} bytes: {shown:?}", got.len())
            })
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&b[..n]);
    }
    got
}

/// Connects to `addr` from loopback address `ip` (any port), with a small
/// receive buffer if `rcvbuf` (so the kernel holds little of what the
/// proxy writes).
pub(crate) async fn connect_from(addr: SocketAddr, ip: [u8; 4], rcvbuf: Option<u32>) -> TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(n) = rcvbuf {
        s.set_recv_buffer_size(n).unwrap();
    }
    s.bind(SocketAddr::from((ip, 0))).unwrap();
    s.connect(addr).await.unwrap()
}

/// Waits until `cond` holds, looking every 20 ms; panics with `what` if
/// it does not within `within`.
pub(crate) async fn wait_until(what: &str, within: Duration, cond: impl Fn() -> bool) {
    wait_until_at(what, std::time::Instant::now() + within, cond).await;
}

/// [`wait_until`] with a deadline (one shared by several waits).
pub(crate) async fn wait_until_at(
    what: &str,
    deadline: std::time::Instant,
    cond: impl Fn() -> bool,
) {
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
