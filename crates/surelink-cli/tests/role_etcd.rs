//! `role.backend = "etcd"` end to end, as an operator runs it (needs the
//! `etcd` feature: `cargo test -p surelink-cli --features etcd --test
//! role_etcd`): a real etcd on loopback serving only TLS and requiring
//! client certificates (made by `surelink certs`), the example cache
//! cluster's files with the cluster file switched to the etcd backend over
//! TLS, each node its own `surelink` process. `surelink status` shows one elected candidate's
//! table on every node; when that process is killed the other candidate's
//! table (a higher epoch) reaches the survivors and the proxy keeps
//! serving. Prints `SKIPPED: …` where etcd is not installed.

#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn etcd(dir: &Path) -> Option<(Child, u16)> {
    let have = Command::new("sh")
        .args(["-c", "command -v etcd"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        println!("SKIPPED: etcd not installed (apt-get install etcd-server)");
        return None;
    }
    // TLS with client certificates, from `surelink certs`: etcd serves
    // node 99's certificate, each node presents its own (`{node}` in the
    // cluster file's paths).
    let out = Command::new(env!("CARGO_BIN_EXE_surelink"))
        .args([
            "certs",
            "--cluster",
            "11",
            "--nodes",
            "1,2,3,100,99",
            "--out",
        ])
        .arg(dir.join("tls"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let tls = |f: &str| dir.join("tls").join(f).display().to_string();
    let (client, peer) = (free_port(), free_port());
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let child = Command::new("etcd")
        .arg("--name=t")
        .arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--cert-file={}", tls("node-99.crt")))
        .arg(format!("--key-file={}", tls("node-99.key.pem")))
        .arg(format!("--trusted-ca-file={}", tls("ca.crt")))
        .arg("--client-cert-auth")
        .arg(format!("--listen-client-urls=https://127.0.0.1:{client}"))
        .arg(format!(
            "--advertise-client-urls=https://127.0.0.1:{client}"
        ))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=t=http://127.0.0.1:{peer}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Some((child, client))
}

/// The example cache cluster's files, on other ports, with the cluster
/// file switched to the etcd backend at `client`.
fn files(dir: &Path, client: u16) {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/cache");
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let mut text = std::fs::read_to_string(&p).unwrap();
        text = text
            .replace(":7201", ":7401")
            .replace("127.0.0.1:921", "127.0.0.1:941")
            .replace("127.0.0.1:11311", "127.0.0.1:11511");
        if p.file_name().is_some_and(|n| n == "cluster.toml") {
            let line = "candidates = [1, 2]            # role-server candidates, in order\n";
            assert!(text.contains(line), "the example cluster file changed");
            text = text.replace(
                line,
                &format!(
                    "candidates = [1, 2]\nbackend = \"etcd\"\n\n[role.etcd]\nendpoints = [\"https://127.0.0.1:{client}\"]\nca_file = \"tls/ca.crt\"\ncert_file = \"tls/node-{{node}}.crt\"\nkey_file = \"tls/node-{{node}}.key.pem\"\nserver_name = \"node-99.cluster-11.surelink\"\n"
                ),
            );
        }
        std::fs::write(dir.join(p.file_name().unwrap()), text).unwrap();
    }
}

fn ask(req: &[u8], end: &[u8]) -> Option<Vec<u8>> {
    common::ask("127.0.0.1:11511", req, end)
}

/// `surelink status --cluster`: the text, per node asked the (role
/// server, epoch) of the table it holds, and the epochs served.
fn status(dir: &Path) -> (String, Vec<(u64, u64)>, Vec<u64>) {
    let (text, nodes) = common::role_status(dir, None);
    let tables = nodes.iter().map(|n| n.1).collect();
    let serving = nodes.iter().filter_map(|n| n.2).collect();
    (text, tables, serving)
}

#[test]
fn nodes_elect_through_etcd_and_fail_over() {
    let dir = std::env::temp_dir().join(format!("surelink-role-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let Some((etcd, client)) = etcd(&dir) else {
        return;
    };
    files(&dir, client);
    let mut procs = common::Procs(vec![("etcd".into(), etcd)]);
    for (kind, f) in [
        ("node", "node1.toml"),
        ("node", "node2.toml"),
        ("node", "node3.toml"),
        ("proxy", "proxy.toml"),
    ] {
        procs.0.push(common::start_cache(&dir, kind, f));
    }
    common::until("a set through the proxy", Duration::from_secs(30), || {
        (ask(b"set hello 0 0 5\r\nworld\r\n", b"\r\n").as_deref() == Some(b"STORED\r\n"))
            .then_some(())
    });
    // Every node, the proxy included, holds the elected candidate's table;
    // that candidate says it serves, through the external backend.
    let (leader, epoch) = common::until(
        "one elected table everywhere",
        Duration::from_secs(20),
        || {
            let (text, tables, serving) = status(&dir);
            let first = *tables.first()?;
            (tables.len() == 4
                && tables.iter().all(|t| *t == first)
                && serving == vec![first.1]
                && text.matches("role backend: external").count() == 4)
                .then_some(first)
        },
    );
    assert!(leader == 1 || leader == 2, "leader {leader}");
    eprintln!("elected through etcd: node {leader}, epoch {epoch}");
    // Kill the leader's process: the other candidate's table, of a higher
    // epoch, reaches the three survivors.
    let killed = Instant::now();
    procs.kill(&format!("node{leader}.toml"));
    let other = 3 - leader;
    let took = common::until("the next leader's table", Duration::from_secs(20), || {
        let (_, tables, serving) = status(&dir);
        (tables.len() == 3
            && tables.iter().all(|t| t.0 == other && t.1 > epoch)
            && serving.len() == 1)
            .then(|| killed.elapsed())
    });
    eprintln!("leader process killed: next leader's table on every survivor within {took:?} (status polled every 100 ms)");
    // The key may have lived on the killed node: a hit or a clean miss,
    // never an error.
    let got = ask(b"get hello\r\n", b"END\r\n").expect("the proxy answers");
    assert!(
        got == b"VALUE hello 0 5\r\nworld\r\nEND\r\n" || got == b"END\r\n",
        "{}",
        String::from_utf8_lossy(&got)
    );
    common::until("a set after the failover", Duration::from_secs(10), || {
        (ask(b"set after 0 0 2\r\nok\r\n", b"\r\n").as_deref() == Some(b"STORED\r\n")).then_some(())
    });
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
