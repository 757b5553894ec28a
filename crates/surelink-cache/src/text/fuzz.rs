//! The fuzz target of the memcached text protocol (`fuzz/` runs it
//! coverage-guided; the property test below on stable): arbitrary client
//! bytes, cut into reads by the bytes themselves, must never panic, never
//! stall the parser without consuming input, every command parsed must
//! re-encode to text a node parses back to the same command and a store
//! can run, and the commands must not depend on how the bytes were cut
//! into reads (the parser resumes its newline search where it stopped).

use bytes::BytesMut;

use super::{Command, Limits, Parser};
use crate::store::Store;

/// Runs one input (see the module docs). Panics on a broken promise.
pub fn parser(data: &[u8]) {
    let limits = Limits {
        max_item: 4096,
        max_get_line: 8192,
    };
    let mut p = Parser::new(limits);
    let store = Store::new(1 << 16);
    let mut buf = BytesMut::new();
    let mut rest = data;
    let mut cut = Vec::new();
    while !rest.is_empty() {
        let n = usize::from(rest[0]).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        loop {
            let before = buf.len();
            match p.next(&mut buf) {
                Ok(Some(cmd)) => {
                    assert!(buf.len() < before, "a command consumed nothing");
                    check(&cmd, &store);
                    cut.push(cmd);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    // The same bytes in one read: the same commands (a read-by-read run
    // that ended without an error never had a line too long, and neither
    // has this one).
    let mut whole = Vec::new();
    let mut p = Parser::new(limits);
    let mut buf = BytesMut::from(data);
    while let Ok(Some(cmd)) = p.next(&mut buf) {
        whole.push(cmd);
    }
    assert_eq!(cut, whole, "commands depend on how the input was cut");
}

fn check(cmd: &Command, store: &Store) {
    let mut wire = BytesMut::new();
    if cmd.encode(&mut wire).is_some() && !matches!(cmd, Command::TooLarge { .. }) {
        let back = crate::node::decode(&wire.clone().freeze(), Limits::default());
        let mut expect = cmd.clone();
        // The node is always asked for an answer.
        strip_noreply(&mut expect);
        assert_eq!(back.as_ref().ok(), Some(&expect), "{wire:?}");
    }
    let mut out = BytesMut::new();
    store.apply(cmd, 1_000_000, &mut out);
    let quiet = matches!(cmd, Command::Meta(m) if m.opts.quiet);
    assert!(
        out.ends_with(b"\r\n") || (quiet && out.is_empty()),
        "every answer is whole lines (a quiet meta command's may be none)"
    );
}

fn strip_noreply(c: &mut Command) {
    match c {
        Command::Store { noreply, .. }
        | Command::Delete { noreply, .. }
        | Command::Arith { noreply, .. }
        | Command::Touch { noreply, .. }
        | Command::FlushAll { noreply, .. } => *noreply = false,
        _ => {}
    }
}

/// The binary-protocol answerer (`proxy/binary.rs`): arbitrary bytes cut
/// into reads by themselves never panic, every answer is a whole response
/// (header and the body it declares), a body is never held (what is
/// skipped is only counted), and the connection closes on the first
/// request that is not one.
pub fn binary(data: &[u8]) {
    let max_body = 4096;
    let (mut buf, mut skip, mut out) = (BytesMut::new(), 0usize, BytesMut::new());
    let mut rest = data;
    while !rest.is_empty() {
        let n = usize::from(rest[0]).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        let close = crate::proxy::binary::answer(&mut buf, &mut skip, max_body, &mut out);
        assert!(
            buf.len() < 24 || skip == 0 || close,
            "a whole header left unread"
        );
        assert!(skip <= u32::MAX as usize);
        if close {
            break;
        }
    }
    let mut at = 0;
    while at < out.len() {
        assert_eq!(out[at], 0x81, "a response's magic");
        let body =
            u32::from_be_bytes([out[at + 8], out[at + 9], out[at + 10], out[at + 11]]) as usize;
        at += 24 + body;
    }
    assert_eq!(at, out.len(), "whole responses only");
}
