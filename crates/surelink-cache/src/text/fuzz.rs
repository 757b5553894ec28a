//! The fuzz target of the memcached text protocol (`fuzz/` runs it
//! coverage-guided; the property test below on stable): arbitrary client
//! bytes, cut into reads by the bytes themselves, must never panic, never
//! stall the parser without consuming input, and every command parsed
//! must re-encode to text a node parses back to the same command and a
//! store can run.

use bytes::BytesMut;

use super::{Command, Limits, Parser};
use crate::store::Store;

/// Runs one input (see the module docs). Panics on a broken promise.
pub fn parser(data: &[u8]) {
    let mut p = Parser::new(Limits {
        max_item: 4096,
        max_get_line: 8192,
    });
    let store = Store::new(1 << 16);
    let mut buf = BytesMut::new();
    let mut rest = data;
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
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
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
    assert!(out.ends_with(b"\r\n"), "every answer is whole lines");
}

fn strip_noreply(c: &mut Command) {
    match c {
        Command::Store { noreply, .. }
        | Command::Delete { noreply, .. }
        | Command::Arith { noreply, .. }
        | Command::Touch { noreply, .. }
        | Command::FlushAll { noreply } => *noreply = false,
        _ => {}
    }
}
