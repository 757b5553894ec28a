//! A replicated pool (`[proxy] replicas = 2`) on the example cache cluster
//! (a temporary copy on free ports, four `surelink` processes): a node
//! frozen (SIGSTOP) for twice the peer window while its keys are written
//! through the proxy, then thawed. No read through the proxy ever returns
//! a value written before the freeze, none misses, and none fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn signal(pid: u32, sig: &str) {
    let ok = surelink_lab::child::run(&["kill", sig, &pid.to_string()]).is_ok();
    assert!(ok, "kill {sig} {pid}");
}

/// One request on `s` and its answer up to `end` (10 s at most: a write
/// waits for a frozen replica until it leaves the ring).
fn ask(s: &mut TcpStream, req: &[u8], end: &[u8]) -> String {
    s.write_all(req).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 65536];
    while !got.ends_with(end) {
        let n = s.read(&mut b).expect("an answer within 10 s");
        assert!(n > 0, "the proxy closed the connection");
        got.extend_from_slice(&b[..n]);
    }
    String::from_utf8(got).unwrap()
}

fn connect(proxy: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn a_replica_frozen_past_its_peer_window_serves_nothing_stale() {
    let copy = common::example_cluster("replica-freeze");
    let dir = copy.path().to_path_buf();
    let file = dir.join("proxy.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let text = text.replace("[proxy]\n", "[proxy]\nreplicas = 2\n");
    std::fs::write(&file, text).unwrap();
    let proxy = common::proxy_addr(&copy);
    let procs = common::Procs(vec![
        common::start_cache(&dir, "node", "node1.toml"),
        common::start_cache(&dir, "node", "node2.toml"),
        common::start_cache(&dir, "node", "node3.toml"),
        common::start_cache(&dir, "proxy", "proxy.toml"),
    ]);
    common::until("the cluster up", Duration::from_secs(30), || {
        common::ask(proxy, b"set up 0 0 1\r\nx\r\n", b"\r\n").filter(|r| r == b"STORED\r\n")
    });
    let keys: Vec<String> = (0..60).map(|i| format!("fk{i}")).collect();
    let mut s = connect(proxy);
    for k in &keys {
        assert_eq!(
            ask(
                &mut s,
                format!("set {k} 0 0 3\r\nold\r\n").as_bytes(),
                b"\r\n"
            ),
            "STORED\r\n"
        );
    }
    // Node 3 (not the role server) frozen for 4 s, twice its peer window;
    // every key written again meanwhile (two thirds of them have node 3
    // as a replica).
    let node3 = procs.0[2].pid();
    let frozen = Instant::now();
    signal(node3, "-STOP");
    for k in &keys {
        assert_eq!(
            ask(
                &mut s,
                format!("set {k} 0 0 3\r\nnew\r\n").as_bytes(),
                b"\r\n"
            ),
            "STORED\r\n",
            "{k}"
        );
    }
    let wrote = frozen.elapsed();
    while frozen.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(node3, "-CONT");
    // Reads for 6 s after the thaw, while node 3 comes back: every one
    // the new value.
    let thawed = Instant::now();
    let mut reads = 0;
    while thawed.elapsed() < Duration::from_secs(6) {
        for chunk in keys.chunks(20) {
            let got = ask(
                &mut s,
                format!("get {}\r\n", chunk.join(" ")).as_bytes(),
                b"END\r\n",
            );
            assert!(!got.contains("old"), "a stale value: {got}");
            assert_eq!(got.matches("new\r\n").count(), chunk.len(), "{got}");
            reads += chunk.len();
        }
        for k in keys.iter().take(10) {
            let got = ask(&mut s, format!("mg {k} v\r\nmn\r\n").as_bytes(), b"MN\r\n");
            assert_eq!(got, "VA 3\r\nnew\r\nMN\r\n", "{k}");
        }
    }
    let stats = ask(&mut s, b"stats\r\n", b"END\r\n");
    eprintln!("writes during the freeze took {wrote:?}; {reads} reads after the thaw, none stale");
    let stat = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {stats}"))
    };
    assert_eq!(stat("node_errors"), 0, "{stats}");
    assert_eq!(stat("get_misses"), 0, "{stats}");
    assert!(stat("ejections") >= 1, "node 3 was never ejected: {stats}");
}
