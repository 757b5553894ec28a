//! Parsing a meta command's line, with memcached 1.6.18's answers to bad
//! input: the flags are read in order, each checked as memcached's
//! `_meta_flag_preparse` checks it; `md` and `ma` answer any flag error
//! with one generic line, as memcached does.

use base64::Engine;
use bytes::Bytes;

use super::meta::{Meta, MetaFlag, MetaOp, MetaOpts, SetMode};
use super::parse::{strtol32, strtoul32, strtoull, MAX_KEY};

/// Longest opaque token memcached accepts, its `O` included.
const MAX_OPAQUE: usize = 32;

/// Most words a meta line may have (command, key, `ms`'s length, flags).
const MAX_TOKENS: usize = 19;

/// A base64 key decoded as memcached 1.6.18 decodes it: bytes outside
/// the alphabet skipped, the rest a whole number of 4-character groups,
/// bits left over ignored.
pub fn decode_key(token: &[u8]) -> Option<Bytes> {
    let kept: Vec<u8> = token
        .iter()
        .copied()
        .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        .collect();
    if kept.is_empty() || kept.len() % 4 != 0 {
        return None;
    }
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    engine
        .decode(&kept)
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY)
        .map(Bytes::from)
}

/// A binary key as memcached shows it: canonical base64.
pub fn encode_key(key: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// A meta line that is not run: the answer, and for `ms` whether its
/// value block (of the length given) is swallowed.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refused {
    pub(super) text: &'static str,
    /// `ms` only: the value block's length, when memcached reads and
    /// drops it.
    pub(super) swallow: Option<usize>,
}

fn refuse(text: &'static str) -> Refused {
    Refused {
        text,
        swallow: None,
    }
}

/// A parsed meta line: for `ms`, its value block still to read (`len`).
#[derive(Debug)]
pub(super) struct MetaLine {
    pub(super) meta: Meta,
    pub(super) len: usize,
}

/// Parses `tokens` (the line split on spaces, `tokens[0]` the command
/// `mg`/`ms`/`md`/`ma`/`me`) of `line`.
pub(super) fn meta_line(line: &Bytes, tokens: &[Bytes]) -> Result<MetaLine, Refused> {
    let op = match &tokens[0][..] {
        b"mg" => MetaOp::Get,
        b"ms" => MetaOp::Set,
        b"md" => MetaOp::Delete,
        b"ma" => MetaOp::Arith,
        _ => MetaOp::Debug,
    };
    let n = tokens.len();
    if n < 2 {
        return Err(refuse(if op == MetaOp::Debug {
            "CLIENT_ERROR bad command line format"
        } else {
            "ERROR"
        }));
    }
    if tokens[1].len() > MAX_KEY {
        return Err(refuse("CLIENT_ERROR bad command line format"));
    }
    if op == MetaOp::Debug {
        return debug_line(line, tokens);
    }
    let (len, first_flag) = if op == MetaOp::Set {
        let len = tokens
            .get(2)
            .and_then(|t| strtol32(t))
            .and_then(|l| usize::try_from(l).ok())
            .filter(|&l| l <= super::parse::MAX_VALUE_LEN);
        let Some(len) = len else {
            return Err(refuse("CLIENT_ERROR bad command line format"));
        };
        (len, 3)
    } else {
        (0, 2)
    };
    if n > MAX_TOKENS {
        return Err(refuse(if op == MetaOp::Get {
            "CLIENT_ERROR options flags are too long"
        } else {
            "CLIENT_ERROR options flags too long"
        }));
    }
    let mut opts = MetaOpts {
        delta: 1,
        ..MetaOpts::default()
    };
    let mut key = tokens[1].clone();
    let mut flags = Vec::with_capacity(n - first_flag);
    let mut seen = [false; 128];
    // memcached reads on past a bad token (the last such error is the
    // answer) but stops at an unknown or repeated flag.
    let mut error: Option<&'static str> = None;
    for t in &tokens[first_flag..] {
        let f = t[0];
        let token = t.slice(1..);
        if f >= 127 || seen[usize::from(f)] {
            error = Some("CLIENT_ERROR duplicate flag");
            break;
        }
        seen[usize::from(f)] = true;
        let bad_token = "CLIENT_ERROR bad token in command line format";
        match f {
            b'b' => match decode_key(&tokens[1]) {
                Some(k) => {
                    key = k;
                    opts.base64 = true;
                }
                None => error = Some("CLIENT_ERROR error decoding key"),
            },
            b'N' | b'R' | b'T' => match strtol32(&token) {
                Some(v) if f == b'N' => opts.vivify = Some(v),
                Some(v) if f == b'R' => opts.recache = Some(v),
                Some(v) => opts.ttl = Some(v),
                None => error = Some(bad_token),
            },
            b'C' => match strtoull(&token) {
                Some(c) => opts.compare_cas = Some(c),
                None => error = Some(bad_token),
            },
            b'F' => match strtoul32(&token) {
                Some(v) => opts.client_flags = Some(v),
                None => error = Some("CLIENT_ERROR bad command line format"),
            },
            b'M' if token.len() != 1 => error = Some("CLIENT_ERROR incorrect length for M token"),
            b'J' => match strtoull(&token) {
                Some(v) => opts.initial = v,
                None => error = Some("CLIENT_ERROR invalid numeric initial value"),
            },
            b'D' => match strtoull(&token) {
                Some(v) => opts.delta = v,
                None => error = Some("CLIENT_ERROR invalid numeric delta value"),
            },
            b'q' => opts.quiet = true,
            b'v' => opts.value = true,
            b'u' => opts.no_bump = true,
            b'I' => opts.invalidate = true,
            b'M' | b'O' | b'P' | b'L' | b'k' | b's' | b't' | b'c' | b'f' | b'h' | b'l' => {}
            _ => {
                error = Some("CLIENT_ERROR invalid flag");
                break;
            }
        }
        flags.push(MetaFlag { flag: f, token });
    }
    let swallow = (op == MetaOp::Set).then_some(len);
    if let Some(text) = error {
        let text = if matches!(op, MetaOp::Delete | MetaOp::Arith) {
            "CLIENT_ERROR invalid or duplicate flag"
        } else {
            text
        };
        return Err(Refused { text, swallow });
    }
    // The mode is the command's own check, with its own words.
    if let Some(m) = flags.iter().find(|x| x.flag == b'M') {
        let c = m.token[0];
        match op {
            MetaOp::Set => {
                opts.mode = match c {
                    b'S' => SetMode::Set,
                    b'E' => SetMode::Add,
                    b'A' => SetMode::Append,
                    b'P' => SetMode::Prepend,
                    b'R' => SetMode::Replace,
                    _ => {
                        return Err(Refused {
                            text: "CLIENT_ERROR invalid mode for ms M token",
                            swallow: Some(len),
                        })
                    }
                }
            }
            MetaOp::Arith => {
                opts.decr = match c {
                    b'I' | b'i' | b'+' => false,
                    b'D' | b'd' | b'-' => true,
                    _ => return Err(refuse("CLIENT_ERROR invalid mode for ma M token")),
                }
            }
            _ => {}
        }
    }
    // The whole token, letter included, fits memcached's 32 bytes.
    if flags
        .iter()
        .any(|x| x.flag == b'O' && x.token.len() + 1 > MAX_OPAQUE)
    {
        return Err(Refused {
            text: "CLIENT_ERROR opaque token too long",
            swallow,
        });
    }
    Ok(MetaLine {
        meta: Meta {
            op,
            key,
            line: line.clone(),
            data: Bytes::new(),
            flags,
            opts,
        },
        len,
    })
}

/// `me <key> [b]`.
fn debug_line(line: &Bytes, tokens: &[Bytes]) -> Result<MetaLine, Refused> {
    let mut opts = MetaOpts::default();
    let mut key = tokens[1].clone();
    match tokens.get(2).map(|t| &t[..]) {
        None => {}
        Some(b"b") => {
            let Some(k) = decode_key(&tokens[1]) else {
                return Err(refuse("CLIENT_ERROR bad command line format"));
            };
            key = k;
            opts.base64 = true;
        }
        // memcached looks only at the third word, and only for `b`.
        Some(_) => {}
    }
    Ok(MetaLine {
        meta: Meta {
            op: MetaOp::Debug,
            key,
            line: line.clone(),
            data: Bytes::new(),
            flags: Vec::new(),
            opts,
        },
        len: 0,
    })
}
