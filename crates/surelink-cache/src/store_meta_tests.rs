//! The meta commands on the store, where a real memcached cannot be
//! compared byte for byte (time passing, CAS values fed back); the rest
//! is `tests/conformance.py`'s.

use bytes::BytesMut;

use crate::store::Store;
use crate::text::{Limits, Parser};

fn run(s: &Store, now: i64, input: &str) -> String {
    let mut p = Parser::new(Limits::default());
    let mut buf = BytesMut::from(input.as_bytes());
    let mut out = BytesMut::new();
    while let Ok(Some(c)) = p.next(&mut buf) {
        s.apply(&c, now, &mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The CAS an `mg … c` answer shows.
fn cas_of(s: &Store, now: i64, key: &str) -> u64 {
    let r = run(s, now, &format!("mg {key} c\r\n"));
    r.trim()
        .strip_prefix("HD c")
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no cas in {r:?}"))
}

#[test]
fn an_invalidating_set_with_an_older_cas_stores_stale_and_one_reader_wins() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    assert_eq!(run(&s, t, "ms a 1 T100\r\nx\r\n"), "HD\r\n");
    let c = cas_of(&s, t, "a");
    // An older CAS without `I` is refused; with it, stored and stale,
    // keeping the old TTL.
    assert_eq!(run(&s, t, &format!("ms a 1 C{}\r\ny\r\n", c - 1)), "EX\r\n");
    assert_eq!(
        run(&s, t, &format!("ms a 1 C{} I T5\r\ny\r\n", c - 1)),
        "HD\r\n"
    );
    assert_eq!(run(&s, t, "mg a v t\r\n"), "VA 1 t100 X W\r\ny\r\n");
    assert_eq!(run(&s, t, "mg a v t\r\n"), "VA 1 t100 Z X\r\ny\r\n");
    // A plain set clears it all.
    assert_eq!(
        run(&s, t, "ms a 1\r\nz\r\nmg a v\r\n"),
        "HD\r\nVA 1\r\nz\r\n"
    );
    // The right CAS stores normally.
    let c = cas_of(&s, t, "a");
    assert_eq!(
        run(&s, t, &format!("ms a 1 C{c} c\r\nw\r\n")),
        format!("HD c{}\r\n", c + 1)
    );
}

#[test]
fn reads_count_as_memcached_counts_them() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    run(&s, t, "ms a 1\r\nx\r\n");
    // First read: marks fetched, leaves the last access alone.
    assert_eq!(run(&s, t + 3, "mg a h l\r\n"), "HD h0 l3\r\n");
    assert!(run(&s, t + 3, "me a\r\n").contains("la=3 cas=1 fetch=yes"));
    // Second: stamps the access.
    assert_eq!(run(&s, t + 3, "mg a h l\r\n"), "HD h1 l3\r\n");
    assert!(run(&s, t + 3, "me a\r\n").contains("la=0"));
    // Later ones change nothing; `u` never counts.
    assert_eq!(run(&s, t + 6, "mg a h l u\r\n"), "HD h1 l3\r\n");
    assert_eq!(run(&s, t + 6, "mg a h l\r\n"), "HD h1 l3\r\n");
    assert!(run(&s, t + 9, "me a\r\n").contains("la=6"));
    run(&s, t, "ms b 1\r\nx\r\n");
    assert_eq!(run(&s, t, "mg b u\r\nmg b h\r\n"), "HD\r\nHD h0\r\n");
}

#[test]
fn a_delayed_flush_takes_what_was_there_when_its_time_comes() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    run(&s, t, "set a 0 0 1\r\nx\r\nflush_all 10\r\n");
    assert_eq!(run(&s, t + 5, "get a\r\n"), "VALUE a 0 1\r\nx\r\nEND\r\n");
    // Stored after the flush was asked for, before its time: taken too.
    run(&s, t + 6, "set b 0 0 1\r\ny\r\n");
    assert_eq!(run(&s, t + 9, "get a b\r\n"), "END\r\n");
    // Stored after its time: kept.
    run(&s, t + 11, "set c 0 0 1\r\nz\r\n");
    assert_eq!(run(&s, t + 12, "get c\r\n"), "VALUE c 0 1\r\nz\r\nEND\r\n");
    // A negative delay is now.
    assert_eq!(
        run(&s, t + 12, "flush_all -1\r\nget c\r\n"),
        "OK\r\nEND\r\n"
    );
}

#[test]
fn quiet_mode_hides_only_what_memcached_hides() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    assert_eq!(run(&s, t, "ms a 2 q\r\n10\r\n"), "");
    assert_eq!(run(&s, t, "ms a 2 q ME\r\n10\r\n"), "NS\r\n");
    assert_eq!(run(&s, t, "mg a q\r\nmg zz q\r\nmg zz\r\n"), "HD\r\nEN\r\n");
    assert_eq!(run(&s, t, "ma a q\r\nma a q v\r\n"), "");
    assert_eq!(run(&s, t, "mg a v\r\n"), "VA 2\r\n12\r\n");
    // A creation is always answered, a miss too.
    assert_eq!(run(&s, t, "ma n N0 J7 q\r\nma zz q\r\n"), "HD\r\nNF\r\n");
    assert_eq!(run(&s, t, "md a q\r\nmd a q\r\n"), "NF\r\n");
    assert_eq!(run(&s, t, "mg v N30 q\r\n"), "HD W\r\n");
}

#[test]
fn ttl_flags_act_where_they_stand() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    assert_eq!(
        run(&s, t, "mg v t N30\r\nmg v t\r\n"),
        "HD t-1 W\r\nHD t30 Z\r\n"
    );
    assert_eq!(
        run(&s, t, "ma n N100 T5 t\r\nma m T5 N100 t\r\n"),
        "HD t5\r\nHD t100\r\n"
    );
    assert_eq!(
        run(&s, t, "ma n t T10 v\r\nmg n t\r\n"),
        "VA 1 t5\r\n1\r\nHD t10\r\n"
    );
    // R wins only below it, never with no expiry, never twice.
    run(&s, t, "ms r 1 T20\r\nx\r\nms f 1\r\nx\r\n");
    assert_eq!(
        run(&s, t, "mg r R20\r\nmg r R21\r\nmg r R21\r\nmg f R99\r\n"),
        "HD\r\nHD W\r\nHD Z\r\nHD\r\n"
    );
}

#[test]
fn base64_keys_are_binary_items() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    assert_eq!(
        run(&s, t, "ms Zm9vYg== 3 b k\r\nbar\r\n"),
        "HD kZm9vYg== b\r\n"
    );
    // The item is the decoded key's, shown in base64 whoever asks.
    assert_eq!(run(&s, t, "mg foob k v\r\n"), "VA 3 kZm9vYg== b\r\nbar\r\n");
    assert_eq!(
        run(&s, t, "get foob\r\n"),
        "VALUE foob 0 3\r\nbar\r\nEND\r\n"
    );
    assert!(run(&s, t, "me foob\r\n").starts_with("ME Zm9vYg== exp=-1"));
    assert_eq!(run(&s, t, "md Zm9vYg== b q\r\nmg foob\r\n"), "EN\r\n");
}

#[test]
fn a_smaller_limit_evicts_down_to_it() {
    let s = Store::new(64 << 20);
    let t = 1_000_000;
    let value = "x".repeat(100_000);
    for i in 0..100 {
        run(
            &s,
            t,
            &format!("set k{i} 0 0 {}\r\n{value}\r\n", value.len()),
        );
    }
    assert!(s.stats().bytes > 9 << 20);
    assert_eq!(run(&s, t, "cache_memlimit 8\r\n"), "OK\r\n");
    assert!(s.stats().bytes <= 8 << 20, "{}", s.stats().bytes);
}
