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
