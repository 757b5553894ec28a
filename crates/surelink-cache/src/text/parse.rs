//! The memcached text protocol's request side: an incremental parser over
//! the bytes a client sent, with memcached 1.6's answers to bad input
//! (checked against a real memcached by `tests/conformance.py`).
//!
//! What it copies from memcached, deliberately: tokens split on spaces
//! (runs of spaces are one separator), one trailing `\r` stripped, numbers
//! read as C's `strtoul`/`strtol` read them (leading `+`, truncation to 32
//! bits for flags and exptime), a value block read as exactly `bytes + 2`
//! bytes whatever they hold, a line over 2 KiB without a newline closing
//! the connection unless it is a `get`, a too-large value swallowed.

use bytes::{Buf, Bytes, BytesMut};

use super::meta::{Meta, MetaOp};
use super::meta_parse::{meta_line, MetaLine};
use super::{Command, StoreOp};

/// Longest key memcached accepts.
pub const MAX_KEY: usize = 250;

/// A line this long without a newline ends the connection, unless it is a
/// `get`/`gets` (multi-gets may be long; those are bounded by
/// [`Limits::max_get_line`]).
const MAX_LINE: usize = 2048;

/// What a parser accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest item, as memcached counts it (value + key + 59 bytes of
    /// header): memcached's `-I`, 1 MiB by default.
    pub max_item: usize,
    /// Longest `get` line (its keys); longer ones close the connection.
    pub max_get_line: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_item: 1 << 20,
            // memcached has no bound; memcslap's mget sends 80 KB lines.
            max_get_line: 1 << 20,
        }
    }
}

/// The connection must be closed (memcached closes it without a word).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// A line longer than 2 KiB without a newline that is not a `get`, or
    /// a `get` line longer than [`Limits::max_get_line`].
    #[error("request line too long")]
    LineTooLong,
    /// An HTTP request line (an unknown command whose last word starts
    /// with `HTTP/`): memcached closes such a connection without a word.
    #[error("an HTTP request, not a memcached command")]
    Http,
}

/// The largest length a storage command may declare (memcached 1.6:
/// `INT_MAX - 2`, so that the block with its `\r\n` fits an int).
pub(super) const MAX_VALUE_LEN: usize = i32::MAX as usize - 2;

/// Bytes per item beyond key and value, as memcached 1.6 counts them
/// (item header with CAS, the key's NUL, the value's `\r\n`).
const ITEM_OVERHEAD: usize = 59;

/// The incremental request parser of one client connection.
#[derive(Debug, Default)]
pub struct Parser {
    limits: Limits,
    /// A storage command whose line was read, waiting for its value block.
    pending: Option<PendingStore>,
    /// An `ms` whose line was read, waiting for its value block.
    pending_meta: Option<(Meta, usize)>,
    /// Bytes still to discard (the value block of a refused storage command).
    swallow: usize,
    /// How far the buffer was searched for a newline without finding one:
    /// a line trickled in small reads is scanned once, not once per read.
    scanned: usize,
}

#[derive(Debug)]
struct PendingStore {
    op: StoreOp,
    key: Bytes,
    flags: u32,
    exptime: i32,
    len: usize,
    cas: u64,
    noreply: bool,
}

impl Parser {
    /// A parser with `limits`.
    pub fn new(limits: Limits) -> Parser {
        Parser {
            limits,
            pending: None,
            pending_meta: None,
            swallow: 0,
            scanned: 0,
        }
    }

    /// The next whole command in `buf` (consumed), `Ok(None)` when more
    /// bytes are needed. Between calls the caller only appends to `buf`
    /// (the parser remembers how much of it it has searched).
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Command>, ParseError> {
        loop {
            if self.swallow > 0 {
                let n = self.swallow.min(buf.len());
                buf.advance(n);
                self.swallow -= n;
                if self.swallow > 0 {
                    return Ok(None);
                }
            }
            if let Some(p) = &self.pending {
                if buf.len() < p.len + 2 {
                    return Ok(None);
                }
                let p = self.pending.take().unwrap_or_else(|| unreachable!());
                let block = buf.split_to(p.len + 2).freeze();
                if &block[p.len..] != b"\r\n" {
                    return Ok(Some(Command::Reply {
                        text: "CLIENT_ERROR bad data chunk",
                        noreply: p.noreply,
                    }));
                }
                return Ok(Some(Command::Store {
                    op: p.op,
                    key: p.key,
                    flags: p.flags,
                    exptime: p.exptime,
                    data: block.slice(..p.len),
                    cas: p.cas,
                    noreply: p.noreply,
                }));
            }
            if let Some((_, len)) = &self.pending_meta {
                let len = *len;
                if buf.len() < len + 2 {
                    return Ok(None);
                }
                let (mut m, _) = self.pending_meta.take().unwrap_or_else(|| unreachable!());
                let block = buf.split_to(len + 2).freeze();
                if &block[len..] != b"\r\n" {
                    // Sent even in quiet mode, as memcached does.
                    return Ok(Some(Command::Reply {
                        text: "CLIENT_ERROR bad data chunk",
                        noreply: false,
                    }));
                }
                m.data = block.slice(..len);
                return Ok(Some(Command::Meta(Box::new(m))));
            }
            let from = self.scanned.min(buf.len());
            let Some(nl) = buf[from..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| from + i)
            else {
                self.scanned = buf.len();
                if buf.len() > MAX_LINE {
                    let start = buf.iter().position(|&b| b != b' ').unwrap_or(buf.len());
                    let rest = &buf[start..];
                    let is_get = rest.starts_with(b"get ") || rest.starts_with(b"gets ");
                    if start > 100 || !is_get || buf.len() > self.limits.max_get_line {
                        return Err(ParseError::LineTooLong);
                    }
                }
                return Ok(None);
            };
            self.scanned = 0;
            let mut line = buf.split_to(nl + 1).freeze();
            line.truncate(nl);
            if line.last() == Some(&b'\r') {
                line.truncate(nl - 1);
            }
            if let Some(c) = self.command(line)? {
                return Ok(Some(c));
            }
        }
    }

    /// How much of the buffer was searched for a newline so far.
    #[cfg(test)]
    pub(super) fn scanned(&self) -> usize {
        self.scanned
    }

    /// One request line: a command, or `None` when it starts a value block
    /// (or a swallow) and the caller must read on.
    fn command(&mut self, mut line: Bytes) -> Result<Option<Command>, ParseError> {
        // memcached reads the line as a C string.
        if let Some(nul) = line.iter().position(|&b| b == 0) {
            line.truncate(nul);
        }
        let mut http = false;
        let c = self.line(line, &mut http);
        if http {
            return Err(ParseError::Http);
        }
        Ok(c)
    }

    fn line(&mut self, line: Bytes, http: &mut bool) -> Option<Command> {
        let tokens: Vec<Bytes> = line
            .split(|&b| b == b' ')
            .filter(|t| !t.is_empty())
            .map(|t| line.slice_ref(t))
            .collect();
        let error = Some(Command::Reply {
            text: "ERROR",
            noreply: false,
        });
        let Some(name) = tokens.first() else {
            return error;
        };
        let n = tokens.len();
        let noreply = n > 1 && &tokens[n - 1][..] == b"noreply";
        match &name[..] {
            b"get" | b"gets" => {
                if n < 2 {
                    return error;
                }
                if tokens[1..].iter().any(|k| k.len() > MAX_KEY) {
                    return Some(bad_format(false));
                }
                Some(Command::Get {
                    keys: tokens[1..].to_vec(),
                    cas: &name[..] == b"gets",
                    touch: None,
                })
            }
            b"gat" | b"gats" => {
                if n < 2 {
                    return error;
                }
                let Some(exptime) = strtol32(&tokens[1]) else {
                    return Some(Command::Reply {
                        text: "CLIENT_ERROR invalid exptime argument",
                        noreply: false,
                    });
                };
                if tokens[2..].iter().any(|k| k.len() > MAX_KEY) {
                    return Some(bad_format(false));
                }
                Some(Command::Get {
                    keys: tokens[2..].to_vec(),
                    cas: &name[..] == b"gats",
                    touch: Some(exptime),
                })
            }
            b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
                let op = match &name[..] {
                    b"set" => StoreOp::Set,
                    b"add" => StoreOp::Add,
                    b"replace" => StoreOp::Replace,
                    b"append" => StoreOp::Append,
                    b"prepend" => StoreOp::Prepend,
                    _ => StoreOp::Cas,
                };
                let want = if op == StoreOp::Cas { 6 } else { 5 };
                if n != want && n != want + 1 {
                    return error;
                }
                self.store(op, &tokens, noreply)
            }
            b"delete" => {
                // memcached: `delete <key> [0] [noreply]` (`delete noreply`
                // deletes the key "noreply", with an answer).
                let noreply = n > 2 && noreply;
                let zero = n > 2 && &tokens[2][..] == b"0";
                let ok = n == 2 || (n == 3 && (zero || noreply)) || (n == 4 && zero && noreply);
                if !(2..=4).contains(&n) {
                    return error;
                }
                if tokens[1].len() > MAX_KEY {
                    return Some(bad_format(noreply));
                }
                if !ok {
                    return Some(Command::Reply {
                        text:
                            "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]",
                        noreply,
                    });
                }
                Some(Command::Delete {
                    key: tokens[1].clone(),
                    noreply,
                })
            }
            b"incr" | b"decr" => {
                if n != 3 && n != 4 {
                    return error;
                }
                if tokens[1].len() > MAX_KEY {
                    return Some(bad_format(noreply));
                }
                let Some(delta) = strtoull(&tokens[2]) else {
                    return Some(Command::Reply {
                        text: "CLIENT_ERROR invalid numeric delta argument",
                        noreply,
                    });
                };
                Some(Command::Arith {
                    incr: &name[..] == b"incr",
                    key: tokens[1].clone(),
                    delta,
                    noreply,
                })
            }
            b"touch" => {
                if n != 3 && n != 4 {
                    return error;
                }
                if tokens[1].len() > MAX_KEY {
                    return Some(bad_format(noreply));
                }
                let Some(exptime) = strtol32(&tokens[2]) else {
                    return Some(Command::Reply {
                        text: "CLIENT_ERROR invalid exptime argument",
                        noreply,
                    });
                };
                Some(Command::Touch {
                    key: tokens[1].clone(),
                    exptime,
                    noreply,
                })
            }
            // memcached ignores anything after these two.
            b"version" => Some(Command::Version),
            b"quit" => Some(Command::Quit),
            b"verbosity" if n == 2 || n == 3 => Some(Command::Reply {
                text: "OK",
                noreply,
            }),
            b"flush_all" if n <= 3 => {
                let delay = tokens.get(1).filter(|t| &t[..] != b"noreply");
                match delay.map(|d| strtol32(d)) {
                    None => Some(Command::FlushAll { delay: 0, noreply }),
                    Some(Some(delay)) => Some(Command::FlushAll { delay, noreply }),
                    Some(None) => Some(Command::Reply {
                        text: "CLIENT_ERROR invalid exptime argument",
                        noreply,
                    }),
                }
            }
            b"mn" => Some(Command::Noop),
            b"mg" | b"ms" | b"md" | b"ma" | b"me" => self.meta(&line, &tokens),
            b"stats" => Some(Command::Stats {
                args: tokens[1..].to_vec(),
            }),
            b"cache_memlimit" if n == 2 || n == 3 => {
                let noreply = n == 3 && noreply;
                let reply = |text| Some(Command::Reply { text, noreply });
                match strtoull(&tokens[1]) {
                    None => reply("ERROR"),
                    Some(mb) if mb < 8 => {
                        reply("MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m")
                    }
                    Some(mb) if mb > 1_000_000_000 => {
                        reply("MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes")
                    }
                    Some(mb) => Some(Command::MemLimit { mb, noreply }),
                }
            }
            _ => {
                *http = tokens[n - 1].starts_with(b"HTTP/");
                error
            }
        }
    }

    /// A meta command's line: refused (its value block swallowed for
    /// `ms`), run, or (`ms`) its value block to read next.
    fn meta(&mut self, line: &Bytes, tokens: &[Bytes]) -> Option<Command> {
        match meta_line(line, tokens) {
            Err(r) => {
                if let Some(len) = r.swallow {
                    self.swallow = len + 2;
                }
                Some(Command::Reply {
                    text: r.text,
                    noreply: false,
                })
            }
            Ok(MetaLine { meta, len }) if meta.op == MetaOp::Set => {
                let extra = if meta.opts.client_flags.unwrap_or(0) != 0 {
                    4
                } else {
                    0
                };
                if len + meta.key.len() + ITEM_OVERHEAD + extra > self.limits.max_item {
                    // memcached swallows the value and drops the old one,
                    // whatever the mode.
                    self.swallow = len + 2;
                    return Some(Command::TooLarge {
                        key: meta.key,
                        unlink: true,
                        noreply: false,
                        base64: meta.opts.base64,
                    });
                }
                self.pending_meta = Some((meta, len));
                None
            }
            Ok(MetaLine { meta, .. }) => Some(Command::Meta(Box::new(meta))),
        }
    }

    /// A storage command's line: either a refusal (memcached reads no
    /// value block then, so the block's lines are read as commands), a
    /// swallowed too-large value, or the value block to read next.
    fn store(&mut self, op: StoreOp, tokens: &[Bytes], noreply: bool) -> Option<Command> {
        let key = &tokens[1];
        if key.len() > MAX_KEY {
            return Some(bad_format(noreply));
        }
        let (Some(flags), Some(exptime), Some(len)) = (
            strtoul32(&tokens[2]),
            strtol32(&tokens[3]),
            strtol32(&tokens[4]),
        ) else {
            return Some(bad_format(noreply));
        };
        let cas = if op == StoreOp::Cas {
            match strtoull(&tokens[5]) {
                Some(c) => c,
                None => return Some(bad_format(noreply)),
            }
        } else {
            0
        };
        // memcached refuses a length whose block (`len + 2`) would not fit
        // a C int, and a negative one, before looking at the item limit.
        let Ok(len) = usize::try_from(len) else {
            return Some(bad_format(noreply));
        };
        if len > MAX_VALUE_LEN {
            return Some(bad_format(noreply));
        }
        if len + key.len() + ITEM_OVERHEAD > self.limits.max_item {
            // memcached swallows the block, and a refused `set` also
            // removes the key's old value (no stale data).
            self.swallow = len + 2;
            return Some(Command::TooLarge {
                key: key.clone(),
                unlink: op == StoreOp::Set,
                noreply,
                base64: false,
            });
        }
        self.pending = Some(PendingStore {
            op,
            key: key.clone(),
            flags,
            exptime,
            len,
            cas,
            noreply,
        });
        None
    }
}

fn bad_format(noreply: bool) -> Command {
    Command::Reply {
        text: "CLIENT_ERROR bad command line format",
        noreply,
    }
}

/// C's `strtoull` as memcached's `safe_strtoull` uses it: optional leading
/// whitespace and sign, decimal digits, then the end or whitespace; a
/// value that overflows is refused, and so is a negative one (`-0` is 0).
pub fn strtoull(t: &[u8]) -> Option<u64> {
    let start = t.iter().position(|b| !b.is_ascii_whitespace())?;
    let mut s = &t[start..];
    let neg = s.first() == Some(&b'-');
    if matches!(s.first(), Some(b'+' | b'-')) {
        s = &s[1..];
    }
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let rest = &s[digits..];
    if !(rest.is_empty() || rest[0].is_ascii_whitespace()) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in &s[..digits] {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        // strtoull negates; memcached refuses it when that looks negative
        // as a signed number.
        let n = v.wrapping_neg();
        return if (n as i64) < 0 { None } else { Some(n) };
    }
    Some(v)
}

/// `safe_strtoul` into a 32-bit field: read as 64 bits, kept modulo 2^32.
pub(super) fn strtoul32(t: &[u8]) -> Option<u32> {
    // Truncation is the point: memcached stores the low 32 bits.
    #[allow(clippy::cast_possible_truncation)]
    strtoull(t).map(|v| v as u32)
}

/// `safe_strtol` into a 32-bit field: a signed 64-bit read (overflow
/// refused), kept modulo 2^32.
pub(super) fn strtol32(t: &[u8]) -> Option<i32> {
    let s = t.strip_prefix(b"-");
    let (neg, body) = match s {
        Some(b) => (true, b),
        None => (false, t.strip_prefix(b"+").unwrap_or(t)),
    };
    if body.is_empty() || !body.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: i64 = 0;
    for &d in body {
        v = v.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    // Truncation is the point: memcached keeps the low 32 bits.
    #[allow(clippy::cast_possible_truncation)]
    Some((if neg { -v } else { v }) as i32)
}
