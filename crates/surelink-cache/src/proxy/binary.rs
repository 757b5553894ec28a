//! A connection whose first byte is memcached's binary-protocol magic:
//! answered in that protocol instead of left waiting for a text line.
//!
//! The proxy routes only the text protocol. It answers the binary
//! requests memcached 1.6 answers without touching an item as memcached
//! does (`NOOP`, `VERSION`, `QUIT`/`QUITQ`), every other one with the
//! status memcached gives a command it does not serve ("Unknown command",
//! 0x0081), echoing its opcode and opaque, so a binary client gets an
//! error at once instead of a hang. A request whose magic is wrong closes
//! the connection, one whose body is longer than an item could be gets
//! "Invalid arguments" (0x0004) and is closed — both as memcached does.
//! Bodies are skipped as they arrive, never held.

use std::sync::Arc;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Shared, VERSION};

/// A request's first byte.
pub(super) const MAGIC: u8 = 0x80;
const RESPONSE: u8 = 0x81;
const HEADER: usize = 24;

const QUIT: u8 = 0x07;
const NOOP: u8 = 0x0a;
const VERSION_OP: u8 = 0x0b;
const QUITQ: u8 = 0x17;

const UNKNOWN_COMMAND: u16 = 0x0081;
const INVALID_ARGUMENTS: u16 = 0x0004;

/// One request header's fields the answer needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    opcode: u8,
    body: u32,
    opaque: [u8; 4],
}

/// What to do with one request.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    /// Answer `status` and `body`, then go on (or close, `close`).
    Answer {
        status: u16,
        body: &'static [u8],
        close: bool,
    },
    /// Close without a word.
    Close,
}

/// The header at the front of `b` (24 bytes), or `None` if its magic is
/// not a request's.
fn header(b: &[u8]) -> Option<Header> {
    if b[0] != MAGIC {
        return None;
    }
    Some(Header {
        opcode: b[1],
        body: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        opaque: [b[12], b[13], b[14], b[15]],
    })
}

fn action(h: Header, max_body: usize) -> Action {
    if h.body as usize > max_body {
        return Action::Answer {
            status: INVALID_ARGUMENTS,
            body: b"Invalid arguments",
            close: true,
        };
    }
    let ok = |body, close| Action::Answer {
        status: 0,
        body,
        close,
    };
    match h.opcode {
        NOOP => ok(b"", false),
        VERSION_OP => ok(VERSION.as_bytes(), false),
        QUIT => ok(b"", true),
        QUITQ => Action::Close,
        _ => Action::Answer {
            status: UNKNOWN_COMMAND,
            body: b"Unknown command",
            close: false,
        },
    }
}

fn encode(out: &mut BytesMut, h: Header, status: u16, body: &[u8]) {
    out.put_u8(RESPONSE);
    out.put_u8(h.opcode);
    out.put_u16(0); // key length
    out.put_u8(0); // extras length
    out.put_u8(0); // data type
    out.put_u16(status);
    out.put_u32(u32::try_from(body.len()).unwrap_or(u32::MAX));
    out.put_slice(&h.opaque);
    out.put_u64(0); // cas
    out.put_slice(body);
}

/// Answers the whole requests in `buf` (consumed) into `out`; `skip`:
/// body bytes still to discard, across calls. `true`: close now.
pub(crate) fn answer(
    buf: &mut BytesMut,
    skip: &mut usize,
    max_body: usize,
    out: &mut BytesMut,
) -> bool {
    loop {
        let n = (*skip).min(buf.len());
        buf.advance(n);
        *skip -= n;
        if *skip > 0 || buf.len() < HEADER {
            return false;
        }
        let Some(h) = header(&buf[..HEADER]) else {
            return true;
        };
        buf.advance(HEADER);
        *skip = h.body as usize;
        match action(h, max_body) {
            Action::Answer {
                status,
                body,
                close,
            } => {
                encode(out, h, status, body);
                if close {
                    return true;
                }
            }
            Action::Close => return true,
        }
    }
}

/// Serves the connection in the binary protocol; `buf` holds what was
/// read so far.
pub(super) async fn serve(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    mut buf: BytesMut,
) -> std::io::Result<()> {
    let max_body = shared.cfg.limits.max_item + 1024;
    let idle = shared.cfg.idle_timeout;
    let mut skip = 0usize;
    loop {
        let mut out = BytesMut::new();
        let close = answer(&mut buf, &mut skip, max_body, &mut out);
        if !out.is_empty() {
            stream.write_all(&out).await?;
        }
        if close {
            return Ok(());
        }
        buf.reserve(16 * 1024);
        let read = stream.read_buf(&mut buf);
        let n = if idle.is_zero() {
            read.await?
        } else {
            match tokio::time::timeout(idle, read).await {
                Ok(n) => n?,
                Err(_) => {
                    shared
                        .stats
                        .idle_kicks
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Ok(());
                }
            }
        };
        if n == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(opcode: u8, body: u32, opaque: u32) -> Vec<u8> {
        let mut b = vec![MAGIC, opcode, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&body.to_be_bytes());
        b.extend_from_slice(&opaque.to_be_bytes());
        b.extend_from_slice(&[0; 8]);
        b
    }

    #[test]
    fn answers_as_memcached_does_without_an_item() {
        let h = header(&req(NOOP, 0, 7)).unwrap();
        assert_eq!(h.opaque, [0, 0, 0, 7]);
        assert_eq!(
            action(h, 1 << 20),
            Action::Answer {
                status: 0,
                body: b"",
                close: false
            }
        );
        let get = header(&req(0x00, 1, 9)).unwrap();
        let Action::Answer {
            status,
            body,
            close,
        } = action(get, 1 << 20)
        else {
            panic!("a get is answered");
        };
        assert_eq!(
            (status, body, close),
            (UNKNOWN_COMMAND, &b"Unknown command"[..], false)
        );
        let mut out = BytesMut::new();
        encode(&mut out, get, status, body);
        assert_eq!(&out[..2], &[RESPONSE, 0x00]);
        assert_eq!(&out[6..8], &[0x00, 0x81]);
        assert_eq!(&out[8..12], &15u32.to_be_bytes());
        assert_eq!(&out[12..16], &9u32.to_be_bytes(), "opaque echoed");
        assert_eq!(&out[HEADER..], b"Unknown command");
        // A body longer than any item: refused and closed, never read.
        let huge = header(&req(0x01, u32::MAX, 1)).unwrap();
        assert!(matches!(
            action(huge, 1 << 20),
            Action::Answer {
                status: INVALID_ARGUMENTS,
                close: true,
                ..
            }
        ));
        assert_eq!(action(header(&req(QUITQ, 0, 0)).unwrap(), 0), Action::Close);
        let mut bad = req(NOOP, 0, 0);
        bad[0] = 0x42;
        assert_eq!(header(&bad), None);
    }
}
