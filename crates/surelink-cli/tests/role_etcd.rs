//! `role.backend = "etcd"` end to end, as an operator runs it (needs the
//! `etcd` feature: `cargo test -p surelink-cli --features etcd --test
//! role_etcd`): a real etcd on loopback serving only TLS and requiring
//! client certificates (made by `surelink certs`), the example cache
//! cluster's files (a temporary copy on free ports) with the cluster file
//! switched to the etcd backend over TLS, each node its own `surelink`
//! process. `surelink status` shows one elected candidate's table on every
//! node; when that process is killed the other candidate's table (a higher
//! epoch) reaches the survivors and the proxy keeps serving. Prints
//! `SKIPPED: …` where etcd is not installed.

#![cfg(feature = "etcd")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use surelink_lab::child::{self, Child, Command, Output};
use surelink_lab::examples::ExampleCopy;
use surelink_lab::host::{find_program, free_port};

fn etcd(dir: &Path) -> Option<Child> {
    if find_program("etcd", &[]).is_none() {
        println!("SKIPPED: etcd not installed (apt-get install etcd-server)");
        return None;
    }
    // TLS with client certificates, from `surelink certs`: etcd serves
    // node 99's certificate, each node presents its own (`{node}` in the
    // cluster file's paths).
    let tls_dir = dir.join("tls").display().to_string();
    child::run(&[
        common::SURELINK,
        "certs",
        "--cluster",
        "11",
        "--nodes",
        "1,2,3,100,99",
        "--out",
        &tls_dir,
    ])
    .unwrap();
    let tls = |f: &str| dir.join("tls").join(f).display().to_string();
    let client = client_port(dir);
    let peer = free_port([127, 0, 0, 1].into()).unwrap();
    let child = Command::new("etcd", "etcd")
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
        .stderr(Output::Log(dir.join("etcd.log")))
        .spawn()
        .unwrap();
    Some(child)
}

/// The client port written into the cluster file by [`files`].
fn client_port(dir: &Path) -> u16 {
    let text = std::fs::read_to_string(dir.join("cluster.toml")).unwrap();
    let url = text
        .split("https://127.0.0.1:")
        .nth(1)
        .expect("the cluster file names etcd");
    url.split('"').next().unwrap().parse().unwrap()
}

/// The example cache cluster's files (a temporary copy on free ports),
/// with the cluster file switched to the etcd backend on a free port.
fn files() -> ExampleCopy {
    let copy = common::example_cluster("role-etcd");
    let client = free_port([127, 0, 0, 1].into()).unwrap();
    let path = copy.path().join("cluster.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    let line = "candidates = [1, 2]            # role-server candidates, in order\n";
    assert!(text.contains(line), "the example cluster file changed");
    text = text.replace(
        line,
        &format!(
            "candidates = [1, 2]\nbackend = \"etcd\"\n\n[role.etcd]\nendpoints = [\"https://127.0.0.1:{client}\"]\nca_file = \"tls/ca.crt\"\ncert_file = \"tls/node-{{node}}.crt\"\nkey_file = \"tls/node-{{node}}.key.pem\"\nserver_name = \"node-99.cluster-11.surelink\"\n"
        ),
    );
    std::fs::write(&path, text).unwrap();
    copy
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
    let copy = files();
    let dir = copy.path();
    let proxy = common::proxy_addr(&copy);
    let ask = |req: &[u8], end: &[u8]| common::ask(proxy, req, end);
    let Some(etcd) = etcd(dir) else {
        return;
    };
    let mut procs = common::Procs(vec![etcd]);
    for (kind, f) in [
        ("node", "node1.toml"),
        ("node", "node2.toml"),
        ("node", "node3.toml"),
        ("proxy", "proxy.toml"),
    ] {
        procs.0.push(common::start_cache(dir, kind, f));
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
            let (text, tables, serving) = status(dir);
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
        let (_, tables, serving) = status(dir);
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
}
