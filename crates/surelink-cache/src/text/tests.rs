use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::*;

fn all(input: &[u8]) -> (Vec<Command>, Option<ParseError>) {
    let mut p = Parser::new(Limits::default());
    let mut buf = BytesMut::from(input);
    let mut out = Vec::new();
    loop {
        match p.next(&mut buf) {
            Ok(Some(c)) => out.push(c),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

fn reply(text: &'static str) -> Command {
    Command::Reply {
        text,
        noreply: false,
    }
}

#[test]
fn storage_commands_and_their_value_blocks() {
    let (c, e) = all(b"set a 5 0 3\r\nxyz\r\ncas b 0 10 1 77 noreply\r\nq\r\n");
    assert_eq!(e, None);
    assert_eq!(
        c,
        vec![
            Command::Store {
                op: StoreOp::Set,
                key: Bytes::from_static(b"a"),
                flags: 5,
                exptime: 0,
                data: Bytes::from_static(b"xyz"),
                cas: 0,
                noreply: false,
            },
            Command::Store {
                op: StoreOp::Cas,
                key: Bytes::from_static(b"b"),
                flags: 0,
                exptime: 10,
                data: Bytes::from_static(b"q"),
                cas: 77,
                noreply: true,
            },
        ]
    );
}

#[test]
fn bad_input_gets_memcacheds_answers() {
    // A value block that does not end in \r\n: exactly bytes+2 read, then
    // the rest is a (bad) command.
    let (c, _) = all(b"set a 0 0 2\r\nxyz\r\n");
    assert_eq!(
        c,
        vec![reply("CLIENT_ERROR bad data chunk"), reply("ERROR")]
    );
    // A refused storage line reads no block: the block is a command.
    let long = format!("set {} 0 0 1\r\nx\r\n", "k".repeat(251));
    let (c, _) = all(long.as_bytes());
    assert_eq!(
        c,
        vec![
            reply("CLIENT_ERROR bad command line format"),
            reply("ERROR")
        ]
    );
    let (c, _) = all(b"set a -1 0 1\r\nx\r\nset a 0 0 -1\r\n");
    assert_eq!(c.len(), 3);
    let (c, _) = all(b"GET a\r\nget\r\n\r\nset a 0 0\r\nincr\r\n");
    assert!(c.iter().all(|x| *x == reply("ERROR")), "{c:?}");
    // Found by the fuzzer: a key named "noreply" is a key.
    let (c, _) = all(b"delete noreply\r\n");
    assert_eq!(
        c,
        vec![Command::Delete {
            key: Bytes::from_static(b"noreply"),
            noreply: false
        }]
    );
    let (c, _) = all(b"incr n -1\r\ntouch a x\r\ndelete a 1\r\n");
    assert_eq!(
        c,
        vec![
            reply("CLIENT_ERROR invalid numeric delta argument"),
            reply("CLIENT_ERROR invalid exptime argument"),
            reply("CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"),
        ]
    );
}

#[test]
fn numbers_read_as_memcached_reads_them() {
    let (c, _) = all(b"set a 4294967296 99999999999 +1\r\nx\r\n");
    match &c[0] {
        Command::Store { flags, exptime, .. } => {
            assert_eq!(*flags, 0);
            assert_eq!(*exptime, 1_215_752_191);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(strtoull(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(strtoull(b"18446744073709551616"), None);
    assert_eq!(strtoull(b" 12\r\n"), Some(12));
    assert_eq!(strtoull(b"-1"), None);
    assert_eq!(strtoull(b"12a"), None);
    assert_eq!(strtoull(b""), None);
}

#[test]
fn too_large_values_are_swallowed_and_long_lines_close() {
    let mut input = b"set a 0 0 2000000\r\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 2_000_000));
    input.extend_from_slice(b"\r\nget a\r\n");
    let (c, e) = all(&input);
    assert_eq!(e, None);
    assert_eq!(c.len(), 2);
    assert!(matches!(c[0], Command::TooLarge { unlink: true, .. }));
    assert!(matches!(c[1], Command::Get { .. }));
    let (_, e) = all(&[b'x'; 3000]);
    assert_eq!(e, Some(ParseError::LineTooLong));
    // A long multi-get is fine.
    let mut get = b"get".to_vec();
    for i in 0..1000 {
        get.extend_from_slice(format!(" k{i}").as_bytes());
    }
    let (c, e) = all(&get);
    assert!(c.is_empty() && e.is_none(), "incomplete get waits");
    get.extend_from_slice(b"\r\n");
    let (c, e) = all(&get);
    assert_eq!(e, None);
    assert!(matches!(&c[0], Command::Get { keys, .. } if keys.len() == 1000));
}

#[test]
fn a_trickled_line_is_searched_once_not_once_per_read() {
    let mut p = Parser::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut line = b"get".to_vec();
    for i in 0..40_000 {
        line.extend_from_slice(format!(" k{i}").as_bytes());
    }
    // In 100-byte reads: each call starts where the last one stopped.
    for piece in line.chunks(100) {
        let before = buf.len();
        buf.extend_from_slice(piece);
        assert_eq!(p.scanned(), before, "searched up to what it had");
        assert_eq!(p.next(&mut buf), Ok(None));
        assert_eq!(p.scanned(), buf.len());
    }
    buf.extend_from_slice(b"\r\nget x\r\n");
    assert!(
        matches!(p.next(&mut buf), Ok(Some(Command::Get { keys, .. })) if keys.len() == 40_000)
    );
    assert_eq!(p.scanned(), 0, "a new line is searched from its start");
    assert!(matches!(p.next(&mut buf), Ok(Some(Command::Get { keys, .. })) if keys.len() == 1));
}

#[test]
fn lengths_beyond_a_c_int_get_memcacheds_answer() {
    let bad = Command::Reply {
        text: "CLIENT_ERROR bad command line format",
        noreply: false,
    };
    // Above INT_MAX - 2, or negative once read as 32 bits: a bad line,
    // and no block is read (what follows is a command again).
    for len in ["2147483647", "2147483646", "4294967295", "-2"] {
        let (c, e) = all(format!("set a 0 0 {len}\r\nget a\r\n").as_bytes());
        assert_eq!(e, None);
        assert_eq!(c[0], bad, "{len}");
        assert!(matches!(c[1], Command::Get { .. }), "{len}");
    }
    let (c, _) = all(b"set a 0 0 2147483647 noreply\r\n");
    assert_eq!(
        c,
        vec![Command::Reply {
            text: "CLIENT_ERROR bad command line format",
            noreply: true
        }]
    );
    // Up to it (9999999999 is 1410065407 in 32 bits): too large, swallowed.
    for len in ["2147483645", "9999999999"] {
        let (c, _) = all(format!("set a 0 0 {len}\r\nget a\r\n").as_bytes());
        assert_eq!(c.len(), 1, "{len}");
        assert!(matches!(c[0], Command::TooLarge { .. }), "{len}");
    }
}

#[test]
fn values_split_by_key() {
    let r = Bytes::from_static(b"VALUE a 0 1\r\nx\r\nVALUE b 3 2 9\r\nyz\r\nEND\r\n");
    let v = split_values(&r).unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(&v[0].0[..], b"a");
    assert_eq!(&v[1].1[..], b"VALUE b 3 2 9\r\nyz\r\n");
    assert!(split_values(&Bytes::from_static(b"SERVER_ERROR x\r\n")).is_none());
    assert!(split_values(&Bytes::from_static(b"VALUE a 0 5\r\nx\r\nEND\r\n")).is_none());
}

proptest! {
    #[test]
    fn the_fuzz_target_holds_on_random_and_mutated_commands(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
        seed in prop::sample::select(vec![
            &b"set a 0 0 1\r\nx\r\n"[..], &b"get a b\r\n"[..], &b"cas k 1 2 3 4 noreply\r\nabc\r\n"[..],
            &b"incr n 5\r\n"[..], &b"touch k -1\r\n"[..], &b"flush_all noreply\r\n"[..], &b"delete a 0\r\n"[..],
            &b"ms k 2 T10 F3 c k O1 q\r\nhi\r\n"[..], &b"mg k v c f s t h l k O9 N30 R5 T7 q\r\n"[..],
            &b"md k I T3 C5 q k\r\n"[..], &b"ma k N0 J5 D2 MD v t c q\r\n"[..], &b"me Zm9vYg== b\r\n"[..],
            &b"ms Zm9vYg== 1 b MA C0 I\r\nx\r\n"[..], &b"gats 10 a b\r\n"[..], &b"flush_all 5\r\n"[..],
            &b"cache_memlimit 64\r\n"[..], &b"stats cachedump 1 2\r\n"[..], &b"mn\r\n"[..],
        ]),
        at in 0usize..64,
    ) {
        let mut input = seed.to_vec();
        let at = at.min(input.len());
        input.splice(at..at, data.iter().copied().take(16));
        // Chunk sizes come from the first byte: make it small.
        input.insert(0, 7);
        fuzz::parser(&input);
        fuzz::parser(&data);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_always_progress(data in proptest::collection::vec(any::<u8>(), 0..4096), cut in 1usize..64) {
        let mut p = Parser::new(Limits::default());
        let mut buf = BytesMut::new();
        for chunk in data.chunks(cut) {
            buf.extend_from_slice(chunk);
            loop {
                let before = buf.len();
                match p.next(&mut buf) {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(_) => return Ok(()),
                }
                // A command always consumes input (no loop without progress).
                prop_assert!(buf.len() < before);
            }
        }
    }

    #[test]
    fn encoded_commands_parse_back(key in "[a-z0-9:]{1,40}", data in proptest::collection::vec(any::<u8>(), 0..200),
                                   flags in any::<u32>(), exptime in any::<i32>(), cas in any::<u64>(), delta in any::<u64>()) {
        let key = Bytes::from(key);
        let cmds = [
            Command::Store { op: StoreOp::Cas, key: key.clone(), flags, exptime, data: Bytes::from(data.clone()), cas, noreply: false },
            Command::Store { op: StoreOp::Append, key: key.clone(), flags, exptime, data: Bytes::from(data), cas: 0, noreply: false },
            Command::Arith { incr: false, key: key.clone(), delta, noreply: false },
            Command::Touch { key: key.clone(), exptime, noreply: false },
            Command::Delete { key: key.clone(), noreply: false },
            Command::Get { keys: vec![key.clone(), key], cas: true, touch: None },
        ];
        for c in cmds {
            let mut b = BytesMut::new();
            prop_assert!(c.encode(&mut b).is_some());
            let (back, e) = all(&b);
            prop_assert_eq!(e, None);
            prop_assert_eq!(back, vec![c]);
        }
    }
}
