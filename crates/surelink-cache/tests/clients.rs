//! Clients nobody here wrote, against the proxy over a three-node cluster
//! on loopback (two networks): libmemcached's `memcslap` (load) and
//! `memccapable -a` (its ASCII protocol checks), and the Python suite
//! `tests/conformance.py` (pymemcache and raw bytes) comparing every
//! answer with a real `memcached`'s. Each prints SKIPPED and returns when
//! its tool is missing (`.ci/run` installs them).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use surelink_cache::local::{Items, LocalCluster};

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

async fn cluster() -> LocalCluster {
    LocalCluster::start(3, 64 << 20, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

/// Runs `args` off the runtime, stdout and stderr interleaved as written;
/// its exit status and output.
async fn run(args: Vec<String>) -> (bool, String) {
    tokio::task::spawn_blocking(move || {
        let line = args
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(" ");
        let out = Command::new("sh")
            .args(["-c", &format!("{line} 2>&1")])
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// `memcslap` set, get and mget through `server`: each must pass without
/// an error.
async fn memcslap(server: SocketAddr, what: &str) {
    for test in ["set", "get", "mget"] {
        let (ok, out) = run(vec![
            "memcslap".into(),
            format!("--servers={server}"),
            format!("--test={test}"),
            "--concurrency=4".into(),
            "--execute-number=2000".into(),
        ])
        .await;
        eprintln!("memcslap --test={test} ({what}): {}", out.trim());
        assert!(ok, "memcslap --test={test} failed: {out}");
        assert!(
            !out.to_lowercase().contains("error"),
            "memcslap reported errors: {out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcslap_runs_set_get_and_mget_through_the_proxy() {
    if !have("memcslap") {
        eprintln!("SKIPPED memcslap: not installed (apt-get install libmemcached-tools)");
        return;
    }
    let c = cluster().await;
    memcslap(c.proxy.local_addr(), "embedded store").await;
    let s = c.proxy.stats();
    let sets = s.cmd_set.load(std::sync::atomic::Ordering::Relaxed);
    let hits = s.get_hits.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sets >= 8000, "memcslap's sets reached the nodes: {sets}");
    assert!(hits > 0, "memcslap's gets found what it set");
    assert_eq!(s.node_errors.load(std::sync::atomic::Ordering::Relaxed), 0);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memccapable_ascii_checks_pass() {
    if !have("memccapable") {
        eprintln!("SKIPPED memccapable: not installed (apt-get install libmemcached-tools)");
        return;
    }
    let c = cluster().await;
    let a = c.proxy.local_addr();
    let (ok, out) = run(vec![
        "memccapable".into(),
        "-a".into(),
        "-h".into(),
        a.ip().to_string(),
        "-p".into(),
        a.port().to_string(),
    ])
    .await;
    eprintln!("memccapable -a:\n{}", out.trim());
    assert!(ok, "memccapable -a failed:\n{out}");
    c.shutdown().await;
}

/// Kills the child when dropped.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port for memcached.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Starts a memcached on a free loopback port (killed when dropped).
async fn memcached() -> (Reap, SocketAddr) {
    memcached_with(&[]).await
}

async fn memcached_with(extra: &[&str]) -> (Reap, SocketAddr) {
    let port = free_port();
    let mut mc = Command::new("memcached");
    mc.args(extra);
    mc.args([
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-m",
        "64",
    ]);
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    if root {
        mc.args(["-u", "root"]);
    }
    let child = Reap(mc.spawn().unwrap());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(addr).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (child, addr)
}

/// The Python suite against the proxy (nodes with the embedded store, then
/// nodes fronting another memcached) and against a real memcached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_match_a_real_memcached() {
    let python = "/usr/bin/python3";
    let pymemcache = Command::new(python)
        .args(["-c", "import pymemcache"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have("memcached") || !pymemcache {
        eprintln!("SKIPPED conformance: needs memcached and python3-pymemcache (apt-get install memcached python3-pymemcache)");
        return;
    }
    // The binary protocol is not spoken: the reference has it off too.
    let (_reference, mc_addr) = memcached_with(&["-B", "ascii"]).await;
    let (_backend, backend_addr) = memcached().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/conformance.py");
    for items in [
        Items::Embedded(64 << 20),
        Items::Memcached(vec![backend_addr]),
    ] {
        let what = format!("{items:?}");
        let c = LocalCluster::start_with(3, items, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let (ok, out) = run(vec![
            python.into(),
            script.into(),
            c.proxy.local_addr().to_string(),
            mc_addr.to_string(),
        ])
        .await;
        eprintln!("nodes with {what}:\n{}", out.trim());
        assert!(
            ok,
            "the proxy's answers (nodes with {what}) differ from memcached's:\n{out}"
        );
        c.shutdown().await;
    }
}

/// memcslap through nodes that front a memcached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcslap_through_nodes_fronting_memcached() {
    if !have("memcslap") || !have("memcached") {
        eprintln!(
            "SKIPPED memcslap with a memcached backend: needs memcached and libmemcached-tools"
        );
        return;
    }
    let (_mc, addr) = memcached().await;
    let c = LocalCluster::start_with(
        3,
        Items::Memcached(vec![addr]),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    memcslap(c.proxy.local_addr(), "memcached backend").await;
    let s = c.proxy.stats();
    assert!(s.get_hits.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(s.node_errors.load(std::sync::atomic::Ordering::Relaxed), 0);
    c.shutdown().await;
}

/// Reads queued together on a node fronting memcached go out as one
/// multi-get, each key once, and every asker gets exactly memcached's
/// answer to its own read; a write between reads is not passed. One
/// thread: the connection's writer runs only once all are queued (on two,
/// a loaded machine let it take each read as it came: one line each).
#[tokio::test(flavor = "current_thread")]
async fn queued_reads_merge_into_one_multi_get_and_split_back() {
    use bytes::Bytes;
    use std::sync::atomic::Ordering::Relaxed;
    use surelink_cache::backend::MemcachedHandler;
    if !have("memcached") {
        eprintln!("SKIPPED read merging: needs memcached (apt-get install memcached)");
        return;
    }
    let (_mc, addr) = memcached().await;
    let h = MemcachedHandler::connect(addr, 1, surelink_cache::text::Limits::default())
        .await
        .unwrap();
    let b = |s: &str| Bytes::from(s.to_string());
    for k in ["a", "b", "hot"] {
        let r = h
            .execute(&b(&format!("set {k} 7 0 3\r\nv-{}\r\n", &k[..1])))
            .await
            .unwrap();
        assert_eq!(r, &b"STORED\r\n"[..]);
    }
    let lines_before = h.merge_stats().get_lines.load(Relaxed);
    // Queued in one go (no await between): 60 reads of the hot key, reads
    // of other keys and of a missing one, a `gets`, and a write between.
    let mut asked = Vec::new();
    for i in 0..60 {
        let cmd = match i % 6 {
            0 => "get a hot\r\n".to_string(),
            1 => "get nothing\r\n".to_string(),
            2 => "gets b\r\n".to_string(),
            _ => "get hot\r\n".to_string(),
        };
        asked.push((cmd.clone(), h.execute(&b(&cmd))));
    }
    let set = h.execute(&b("set hot 0 0 3\r\nnew\r\n"));
    let after = h.execute(&b("get hot\r\n"));
    let mut answers = Vec::new();
    for (cmd, f) in asked {
        answers.push((cmd, f.await.unwrap()));
    }
    assert_eq!(set.await.unwrap(), &b"STORED\r\n"[..]);
    assert_eq!(
        after.await.unwrap(),
        &b"VALUE hot 0 3\r\nnew\r\nEND\r\n"[..],
        "the read after the write sees it"
    );
    for (cmd, got) in &answers {
        let want: &[u8] = match cmd.as_str() {
            "get a hot\r\n" => b"VALUE a 7 3\r\nv-a\r\nVALUE hot 7 3\r\nv-h\r\nEND\r\n",
            "get nothing\r\n" => b"END\r\n",
            "get hot\r\n" => b"VALUE hot 7 3\r\nv-h\r\nEND\r\n",
            _ => {
                // `gets`: the value with its CAS unique.
                assert!(
                    got.starts_with(b"VALUE b 7 3 ") && got.ends_with(b"\r\nv-b\r\nEND\r\n"),
                    "{cmd:?} answered {got:?}"
                );
                continue;
            }
        };
        assert_eq!(got, want, "{cmd:?}");
    }
    let lines = h.merge_stats().get_lines.load(Relaxed) - lines_before;
    // `get`s and `gets` alternate, so they cannot all share one line; the
    // runs of plain reads merge (not one line per read).
    eprintln!("61 reads went out in {lines} get lines");
    assert!(lines < 50, "61 reads went out in {lines} get lines");
}
