//! What the README tells a newcomer to do: start three cache nodes and a
//! proxy from `examples/cache/*.toml`, each its own `surelink` process, and
//! point a memcached client at the proxy (127.0.0.1:11311 in the files; a
//! temporary copy with every port moved to a free one here, so a user
//! running the example cluster on this machine sees no clash). `memcslap`
//! is used when installed (SKIPPED otherwise); a raw set/get always runs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use surelink_lab::child;

#[test]
fn the_example_cluster_serves_memcached_clients() {
    let copy = common::example_cluster("cache-examples");
    let dir = copy.path();
    let proxy = common::proxy_addr(&copy);
    let ask = |req: &[u8], end: &[u8]| common::ask(proxy, req, end);
    let _procs = common::Procs(vec![
        common::start_cache(dir, "node", "node1.toml"),
        common::start_cache(dir, "node", "node2.toml"),
        common::start_cache(dir, "node", "node3.toml"),
        common::start_cache(dir, "proxy", "proxy.toml"),
    ]);
    // Up when a set through the proxy is stored on its node and read back.
    // (While the nodes are still joining, a key stored on the node that
    // stands in for one not yet up is a miss once that one is: a cache
    // miss, never a wrong value — so the pair is retried until it holds.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    loop {
        if ask(b"set hello 0 0 5\r\nworld\r\n", b"\r\n").as_deref() == Some(b"STORED\r\n") {
            let got = ask(b"get hello\r\n", b"END\r\n");
            if let Some(v) = &got {
                assert!(
                    v == b"VALUE hello 0 5\r\nworld\r\nEND\r\n" || v == b"END\r\n",
                    "a wrong answer: {}",
                    String::from_utf8_lossy(v)
                );
            }
            if got.as_deref() == Some(b"VALUE hello 0 5\r\nworld\r\nEND\r\n") {
                break;
            }
            last = got;
        }
        assert!(
            Instant::now() < deadline,
            "the example cluster did not come up (last get: {last:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The role service (cluster.toml): every node, the proxy included,
    // holds node 1's table, and `surelink status` shows it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let cluster = dir.join("cluster.toml").display().to_string();
        let out =
            child::output(&[common::SURELINK, "status", "--cluster", &cluster], None).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let held = text
            .matches("table: role server node 1, epoch 1, version")
            .count();
        if out.status.success() && held == 4 && text.contains("serving as role server, epoch 1") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "status never showed the table everywhere:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("{status}");
    let have = surelink_lab::host::find_program("memcslap", &[]).is_some();
    if !have {
        eprintln!("SKIPPED memcslap against the example cluster: not installed (apt-get install libmemcached-tools)");
        return;
    }
    for test in ["set", "get"] {
        let out = child::output(
            &[
                "memcslap",
                &format!("--servers={proxy}"),
                &format!("--test={test}"),
                "--concurrency=4",
                "--execute-number=1000",
            ],
            None,
        )
        .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("memcslap --test={test}: {}", text.trim());
        assert!(
            out.status.success() && !text.to_lowercase().contains("error"),
            "{text}"
        );
    }
}
