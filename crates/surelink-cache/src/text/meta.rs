//! memcached 1.6's meta commands (`mg`, `ms`, `md`, `ma`, `me`; `mn` is
//! [`super::Command::Noop`]): a request line of a two-letter command, a
//! key, and single-letter flags, some with a token (`T30`, `Oabc`).
//!
//! A [`Meta`] keeps the line as the client sent it: the proxy routes by
//! its key (base64-decoded with `b`) and forwards the line itself, so a
//! node parses what the client wrote. Syntax errors are answered where
//! the line is parsed, with memcached 1.6's words (checked against a real
//! memcached by `tests/conformance.py`); what depends on the item (a miss,
//! a CAS mismatch, a value that is not a number) is the node's answer.
//!
//! Quiet mode (`q`) is applied by whoever talks to the client
//! ([`Meta::suppressed`]): the node always answers, so the proxy knows
//! the command ran.

use bytes::{BufMut, Bytes, BytesMut};

/// Which meta command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetaOp {
    /// `mg`: read, and optionally touch, vivify or win the recache.
    Get,
    /// `ms`: store, in one of five modes.
    Set,
    /// `md`: delete, or mark stale.
    Delete,
    /// `ma`: increment or decrement.
    Arith,
    /// `me`: a human-readable dump of an item's metadata.
    Debug,
}

impl MetaOp {
    /// The command's two letters.
    pub fn name(self) -> &'static str {
        match self {
            MetaOp::Get => "mg",
            MetaOp::Set => "ms",
            MetaOp::Delete => "md",
            MetaOp::Arith => "ma",
            MetaOp::Debug => "me",
        }
    }
}

/// `ms`'s `M` token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SetMode {
    /// `S`: store unconditionally.
    #[default]
    Set,
    /// `E`: only if absent (`add`).
    Add,
    /// `A`: add after the value.
    Append,
    /// `P`: add before the value.
    Prepend,
    /// `R`: only if present.
    Replace,
}

/// One meta command, parsed and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Which command.
    pub op: MetaOp,
    /// The key as the store knows it (decoded when `b` was given).
    pub key: Bytes,
    /// The request line as the client sent it, without its line end.
    pub line: Bytes,
    /// `ms`'s value (empty for the others).
    pub data: Bytes,
    /// The flags, in the order given (each at most once).
    pub flags: Vec<MetaFlag>,
    /// Options the flags set.
    pub opts: MetaOpts,
}

/// One flag and its token (empty for flags without one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaFlag {
    /// The letter.
    pub flag: u8,
    /// What followed it up to the next space.
    pub token: Bytes,
}

/// What the flags ask for, read once.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MetaOpts {
    /// `b`: the key was base64 (the answer's `k` gives it decoded, as
    /// memcached 1.6.18 does).
    pub base64: bool,
    /// `q`: quiet mode.
    pub quiet: bool,
    /// `v`: return the value.
    pub value: bool,
    /// `u`: do not count this read as an access.
    pub no_bump: bool,
    /// `I`: invalidate (mark stale) instead of failing or removing.
    pub invalidate: bool,
    /// `C`: compare against this CAS unique.
    pub compare_cas: Option<u64>,
    /// `F`: client flags to store.
    pub client_flags: Option<u32>,
    /// `T`: a new exptime.
    pub ttl: Option<i32>,
    /// `N`: create on a miss with this exptime.
    pub vivify: Option<i32>,
    /// `R`: win the recache when less TTL than this remains.
    pub recache: Option<i32>,
    /// `ms`'s mode.
    pub mode: SetMode,
    /// `ma`: decrement (`MD`, `M-`) instead of increment.
    pub decr: bool,
    /// `ma`'s `D` (default 1).
    pub delta: u64,
    /// `ma`'s `J`: the value created by `N` (default 0).
    pub initial: u64,
}

impl Meta {
    /// The command as a node parses it back: the line as the client sent
    /// it, and `ms`'s value block.
    pub fn encode(&self, out: &mut BytesMut) {
        out.put_slice(&self.line);
        out.put_slice(b"\r\n");
        if self.op == MetaOp::Set {
            out.put_slice(&self.data);
            out.put_slice(b"\r\n");
        }
    }

    /// The command for a memcached that must answer whatever happens:
    /// the line without `q` (memcached says nothing to a quiet command
    /// that went well, and a backend connection waits for every answer).
    pub fn encode_loud(&self, out: &mut BytesMut) {
        if !self.opts.quiet {
            return self.encode(out);
        }
        let mut first = true;
        for w in self.line.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
            if w == b"q" {
                continue;
            }
            if !first {
                out.put_u8(b' ');
            }
            out.put_slice(w);
            first = false;
        }
        out.put_slice(b"\r\n");
        if self.op == MetaOp::Set {
            out.put_slice(&self.data);
            out.put_slice(b"\r\n");
        }
    }

    /// Whether quiet mode hides `reply` from the client: a miss for `mg`,
    /// success for `ms` and `md`, success with or without the value for
    /// `ma` (memcached 1.6.18). Errors and other codes are always sent.
    pub fn suppressed(&self, reply: &[u8]) -> bool {
        if !self.opts.quiet {
            return false;
        }
        let code = reply.get(..2).unwrap_or_default();
        match self.op {
            MetaOp::Get => code == b"EN",
            MetaOp::Set | MetaOp::Delete => code == b"HD",
            MetaOp::Arith => code == b"HD" || code == b"VA",
            MetaOp::Debug => false,
        }
    }

    /// The flag `f`'s token, if it was given.
    pub fn token(&self, f: u8) -> Option<&Bytes> {
        self.flags.iter().find(|x| x.flag == f).map(|x| &x.token)
    }
}
