use bytes::{Bytes, BytesMut};

use super::*;
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

#[test]
fn commands_answer_as_memcached() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    assert_eq!(run(&s, t, "set a 5 0 1\r\nx\r\n"), "STORED\r\n");
    assert_eq!(run(&s, t, "add a 0 0 1\r\ny\r\n"), "NOT_STORED\r\n");
    assert_eq!(run(&s, t, "replace q 0 0 1\r\ny\r\n"), "NOT_STORED\r\n");
    assert_eq!(
        run(
            &s,
            t,
            "append a 9 0 2\r\nyz\r\nprepend a 0 0 1\r\nw\r\nget a\r\n"
        ),
        "STORED\r\nSTORED\r\nVALUE a 5 4\r\nwxyz\r\nEND\r\n"
    );
    assert_eq!(
        run(
            &s,
            t,
            "set n 0 0 3\r\n100\r\nincr n 5\r\ndecr n 10\r\ndecr n 90\r\nget n\r\n"
        ),
        "STORED\r\n105\r\n95\r\n5\r\nVALUE n 0 3\r\n5  \r\nEND\r\n"
    );
    assert_eq!(
        run(
            &s,
            t,
            "set n 0 0 20\r\n18446744073709551615\r\nincr n 1\r\n"
        ),
        "STORED\r\n0\r\n"
    );
    assert_eq!(
        run(&s, t, "incr a 1\r\nincr zz 1\r\n"),
        "CLIENT_ERROR cannot increment or decrement non-numeric value\r\nNOT_FOUND\r\n"
    );
    assert_eq!(
        run(&s, t, "delete a\r\ndelete a\r\n"),
        "DELETED\r\nNOT_FOUND\r\n"
    );
}

#[test]
fn cas_uniques_guard_writes() {
    let s = Store::new(1 << 20);
    let t = 1_000_000;
    run(&s, t, "set k 0 0 1\r\nx\r\n");
    let g = run(&s, t, "gets k\r\n");
    let cas: u64 = g.split_whitespace().nth(4).unwrap().parse().unwrap();
    assert_eq!(
        run(&s, t, &format!("cas k 0 0 1 {}\r\ny\r\n", cas + 1)),
        "EXISTS\r\n"
    );
    assert_eq!(
        run(&s, t, &format!("cas k 0 0 1 {cas}\r\ny\r\n")),
        "STORED\r\n"
    );
    assert_eq!(
        run(&s, t, &format!("cas k 0 0 1 {cas}\r\nz\r\n")),
        "EXISTS\r\n"
    );
    assert_eq!(run(&s, t, "cas nope 0 0 1 1\r\nz\r\n"), "NOT_FOUND\r\n");
}

#[test]
fn items_expire_relative_absolute_and_negative() {
    let s = Store::new(1 << 20);
    // Past memcached's 30 days, an exptime is a Unix time.
    let t = 10_000_000;
    run(
        &s,
        t,
        "set r 0 10 1\r\nx\r\nset abs 0 10000005 1\r\nx\r\nset neg 0 -1 1\r\nx\r\n",
    );
    assert_eq!(run(&s, t, "get neg\r\n"), "END\r\n");
    assert!(run(&s, t + 9, "get r abs\r\n").contains("VALUE r"));
    assert_eq!(run(&s, t + 10, "get r\r\n"), "END\r\n");
    assert_eq!(run(&s, t + 5, "get abs\r\n"), "END\r\n");
    run(&s, t, "set k 0 1 1\r\nx\r\n");
    assert_eq!(run(&s, t, "touch k 100\r\n"), "TOUCHED\r\n");
    assert!(run(&s, t + 50, "get k\r\n").contains("VALUE"));
    assert_eq!(run(&s, t, "touch nope 1\r\n"), "NOT_FOUND\r\n");
    // An expired key is absent to add.
    assert_eq!(run(&s, t + 200, "add k 0 0 1\r\ny\r\n"), "STORED\r\n");
}

#[test]
fn memory_is_bounded_in_bytes() {
    let s = Store::new(1 << 20);
    let v = "x".repeat(1000);
    for i in 0..10_000 {
        run(&s, 1, &format!("set key{i} 0 0 1000\r\n{v}\r\n"));
    }
    let st = s.stats();
    assert!(st.bytes <= 1 << 20, "{st:?}");
    assert!(st.curr_items > 500 && st.curr_items < 1100, "{st:?}");
    let _ = Bytes::new();
}
