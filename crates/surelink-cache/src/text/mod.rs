//! memcached's text protocol: requests parsed from a client's bytes
//! ([`Parser`]), re-encoded for a node ([`Command::encode`]), and the
//! replies' shapes.

pub mod fuzz;
pub mod meta;
mod meta_parse;
mod parse;

use bytes::{BufMut, Bytes, BytesMut};

pub use meta_parse::{decode_key as meta_decode_key, encode_key as meta_key};
pub use parse::{strtoull, Limits, ParseError, Parser, MAX_KEY};

/// A storage command's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreOp {
    /// Store unconditionally.
    Set,
    /// Only if absent.
    Add,
    /// Only if present.
    Replace,
    /// Add bytes after the value (flags and exptime ignored).
    Append,
    /// Add bytes before the value.
    Prepend,
    /// Only if the item's CAS unique is unchanged.
    Cas,
}

impl StoreOp {
    fn name(self) -> &'static str {
        match self {
            StoreOp::Set => "set",
            StoreOp::Add => "add",
            StoreOp::Replace => "replace",
            StoreOp::Append => "append",
            StoreOp::Prepend => "prepend",
            StoreOp::Cas => "cas",
        }
    }
}

/// One client request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Command {
    /// `get`/`gets` (`cas`: with CAS uniques), and `gat`/`gats` (with
    /// `touch`: each key found gets that exptime first).
    Get {
        /// The keys, in order (repeats allowed: each is answered).
        keys: Vec<Bytes>,
        /// `gets`/`gats`.
        cas: bool,
        /// `gat`/`gats`: the new exptime.
        touch: Option<i32>,
    },
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    Store {
        /// Which.
        op: StoreOp,
        /// The key.
        key: Bytes,
        /// Opaque client flags.
        flags: u32,
        /// memcached's exptime: 0 never, up to 30 days relative seconds,
        /// beyond that a Unix time, negative already expired.
        exptime: i32,
        /// The value.
        data: Bytes,
        /// For `cas`: the unique the client read.
        cas: u64,
        /// No answer wanted.
        noreply: bool,
    },
    /// `delete`.
    Delete {
        /// The key.
        key: Bytes,
        /// No answer wanted.
        noreply: bool,
    },
    /// `incr`/`decr`.
    Arith {
        /// `incr` (else `decr`).
        incr: bool,
        /// The key.
        key: Bytes,
        /// By how much.
        delta: u64,
        /// No answer wanted.
        noreply: bool,
    },
    /// `touch`: a new exptime.
    Touch {
        /// The key.
        key: Bytes,
        /// The new exptime.
        exptime: i32,
        /// No answer wanted.
        noreply: bool,
    },
    /// A storage command whose value exceeds the item limit: answered
    /// `SERVER_ERROR object too large for cache`; its value was swallowed.
    TooLarge {
        /// The key.
        key: Bytes,
        /// A refused `set` (or `ms`, in any mode) also removes the old
        /// value (as memcached does).
        unlink: bool,
        /// No answer wanted.
        noreply: bool,
        /// The key came base64-encoded (an `ms` with `b`): the node is
        /// told to remove it in that form.
        base64: bool,
    },
    /// `flush_all [delay]`: every item on every node goes, now (delay 0
    /// or less) or at `delay` (items written or read before then).
    FlushAll {
        /// memcached's exptime of the flush (0: now).
        delay: i32,
        /// No answer wanted.
        noreply: bool,
    },
    /// A meta command (`mg`, `ms`, `md`, `ma`, `me`).
    Meta(Box<meta::Meta>),
    /// `mn`: answered `MN` once everything before it is.
    Noop,
    /// `cache_memlimit <mb>`: every node's store limit.
    MemLimit {
        /// Megabytes (8 to 10^9: others are answered at once).
        mb: u64,
        /// No answer wanted.
        noreply: bool,
    },
    /// `version`.
    Version,
    /// `stats [args]`.
    Stats {
        /// The words after `stats`.
        args: Vec<Bytes>,
    },
    /// `quit`: close the connection.
    Quit,
    /// Answer `text` at once (a malformed or unknown command); nothing
    /// else happens.
    Reply {
        /// The answer line, without `\r\n`.
        text: &'static str,
        /// Suppress it (memcached does for `noreply` commands).
        noreply: bool,
    },
}

impl Command {
    /// The key that decides which node serves it (none for commands that
    /// go everywhere or nowhere; `get` is split per key).
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Command::Store { key, .. }
            | Command::Delete { key, .. }
            | Command::Arith { key, .. }
            | Command::Touch { key, .. }
            | Command::TooLarge { key, .. } => Some(key),
            Command::Meta(m) => Some(&m.key),
            _ => None,
        }
    }

    /// Asks for the answer after all (a node forwarding to memcached: the
    /// proxy drops what its client did not want).
    pub fn clear_noreply(&mut self) {
        match self {
            Command::Store { noreply, .. }
            | Command::Delete { noreply, .. }
            | Command::Arith { noreply, .. }
            | Command::Touch { noreply, .. }
            | Command::TooLarge { noreply, .. }
            | Command::FlushAll { noreply, .. }
            | Command::MemLimit { noreply, .. }
            | Command::Reply { noreply, .. } => *noreply = false,
            _ => {}
        }
    }

    /// Whether the client wants no answer.
    pub fn noreply(&self) -> bool {
        match self {
            Command::Store { noreply, .. }
            | Command::Delete { noreply, .. }
            | Command::Arith { noreply, .. }
            | Command::Touch { noreply, .. }
            | Command::TooLarge { noreply, .. }
            | Command::FlushAll { noreply, .. }
            | Command::MemLimit { noreply, .. }
            | Command::Reply { noreply, .. } => *noreply,
            _ => false,
        }
    }

    /// The command as text a node (or memcached) parses back to the same
    /// command, always asking for an answer (the proxy drops it for a
    /// `noreply` client; it still needs to know the node applied it).
    /// `None` for what is answered by the proxy alone.
    pub fn encode(&self, out: &mut BytesMut) -> Option<()> {
        match self {
            Command::Get { keys, cas, touch } => {
                match touch {
                    None => out.put_slice(if *cas { b"gets" } else { b"get" }),
                    Some(t) => {
                        out.put_slice(if *cas { b"gats " } else { b"gat " });
                        out.put_slice(itoa::Buffer::new().format(*t).as_bytes());
                    }
                }
                for k in keys {
                    out.put_u8(b' ');
                    out.put_slice(k);
                }
            }
            Command::Store {
                op,
                key,
                flags,
                exptime,
                data,
                cas,
                ..
            } => {
                out.put_slice(op.name().as_bytes());
                out.put_u8(b' ');
                out.put_slice(key);
                let tail = if *op == StoreOp::Cas {
                    format!(" {flags} {exptime} {} {cas}\r\n", data.len())
                } else {
                    format!(" {flags} {exptime} {}\r\n", data.len())
                };
                out.put_slice(tail.as_bytes());
                out.put_slice(data);
            }
            Command::Delete { key, .. } => {
                out.put_slice(b"delete ");
                out.put_slice(key);
            }
            Command::Arith {
                incr, key, delta, ..
            } => {
                out.put_slice(if *incr { b"incr " } else { b"decr " });
                out.put_slice(key);
                out.put_slice(format!(" {delta}").as_bytes());
            }
            Command::Touch { key, exptime, .. } => {
                out.put_slice(b"touch ");
                out.put_slice(key);
                out.put_slice(format!(" {exptime}").as_bytes());
            }
            Command::TooLarge {
                key,
                unlink,
                base64,
                ..
            } => {
                // Only the unlink reaches a node.
                if !*unlink {
                    return None;
                }
                if *base64 {
                    out.put_slice(b"md ");
                    out.put_slice(meta_parse::encode_key(key).as_bytes());
                    out.put_slice(b" b");
                } else {
                    out.put_slice(b"delete ");
                    out.put_slice(key);
                }
            }
            Command::Meta(m) => {
                m.encode(out);
                return Some(());
            }
            Command::MemLimit { mb, .. } => {
                out.put_slice(b"cache_memlimit ");
                out.put_slice(itoa::Buffer::new().format(*mb).as_bytes());
            }
            Command::FlushAll { delay, .. } => {
                out.put_slice(b"flush_all");
                if *delay != 0 {
                    out.put_u8(b' ');
                    out.put_slice(itoa::Buffer::new().format(*delay).as_bytes());
                }
            }
            Command::Version
            | Command::Stats { .. }
            | Command::Noop
            | Command::Quit
            | Command::Reply { .. } => return None,
        }
        out.put_slice(b"\r\n");
        Some(())
    }
}

/// The `VALUE` blocks of a `get`/`gets` reply, each with its key, in the
/// order they came; `None` if the reply is not one (an error line).
pub fn split_values(reply: &Bytes) -> Option<Vec<(Bytes, Bytes)>> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let rest = &reply[at..];
        if rest == b"END\r\n" {
            return Some(out);
        }
        let nl = rest.iter().position(|&b| b == b'\n')?;
        let line = rest.get(..nl.checked_sub(1)?)?;
        let mut parts = line.split(|&b| b == b' ');
        if parts.next()? != b"VALUE" {
            return None;
        }
        let key = parts.next()?;
        let _flags = parts.next()?;
        let len: usize = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let end = nl + 1 + len + 2;
        if rest.len() < end || &rest[end - 2..end] != b"\r\n" {
            return None;
        }
        let key_at = at + (key.as_ptr() as usize - rest.as_ptr() as usize);
        out.push((
            reply.slice(key_at..key_at + key.len()),
            reply.slice(at..at + end),
        ));
        at += end;
    }
}

#[cfg(test)]
mod tests;
