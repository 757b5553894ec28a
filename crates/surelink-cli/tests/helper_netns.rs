//! PostMan helpers on a real kernel network (issue 28): a server in one
//! network namespace, two `surelink helper` processes and a `surelink
//! call` client in another, joined by a veth link. The client reaches the
//! server only through the helpers (a path through each). Twice, the
//! helper carrying the calls (by the kernel's byte counts) is SIGKILLed
//! and a new one started in its place:
//! every call must still be answered with its own body (the echo server
//! checks nothing; `surelink call` counts any error or wrong body), each
//! within half a second.
//!
//! Needs root and `ip`; without them the test prints SKIPPED. The
//! namespaces (`sl-ha`, `sl-hb`) are removed afterwards, also on failure.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use surelink_lab::child::{self, Child, Command, Output};
use surelink_lab::host::netns_unavailable;
use surelink_node::surelink::proto::NodeId;

const BIN: &str = env!("CARGO_BIN_EXE_surelink");
const A: &str = "sl-ha";
const B: &str = "sl-hb";

/// Removes the namespaces (and with them the veth pair) when dropped.
struct Netns;

impl Netns {
    fn up() -> Netns {
        let g = Netns;
        g.clean();
        for cmd in [
            vec!["ip", "netns", "add", A],
            vec!["ip", "netns", "add", B],
            vec![
                "ip", "link", "add", "sl-ha0", "type", "veth", "peer", "name", "sl-hb0",
            ],
            vec!["ip", "link", "set", "sl-ha0", "netns", A],
            vec!["ip", "link", "set", "sl-hb0", "netns", B],
            vec![
                "ip",
                "-n",
                A,
                "addr",
                "add",
                "10.78.1.1/24",
                "dev",
                "sl-ha0",
            ],
            vec![
                "ip",
                "-n",
                B,
                "addr",
                "add",
                "10.78.1.2/24",
                "dev",
                "sl-hb0",
            ],
            vec!["ip", "-n", A, "link", "set", "sl-ha0", "up"],
            vec!["ip", "-n", B, "link", "set", "sl-hb0", "up"],
            vec!["ip", "-n", A, "link", "set", "lo", "up"],
            vec!["ip", "-n", B, "link", "set", "lo", "up"],
        ] {
            child::run(&cmd).unwrap_or_else(|e| panic!("{cmd:?}: {e:#}"));
        }
        g
    }

    fn clean(&self) {
        for ns in [A, B] {
            let _ = child::run(&["ip", "netns", "del", ns]);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.clean();
    }
}

fn public(dir: &Path, node: u64) -> String {
    std::fs::read_to_string(dir.join(format!("node-{node}.pub")))
        .unwrap()
        .trim()
        .to_string()
}

fn member(dir: &Path, node: u64) -> String {
    format!(
        "\n[[members]]\nnode = {node}\npublic_key = \"{}\"\n",
        public(dir, node)
    )
}

fn write_configs(dir: &Path) {
    let mut server = String::from(
        "node = 1\ncluster = 9\nkey_file = \"node-1.key\"\nlisten = [\"10.78.1.2:7401\"]\nhelpers = [3, 4]\n",
    );
    for n in [2, 3, 4] {
        server.push_str(&member(dir, n));
    }
    std::fs::write(dir.join("server.toml"), server).unwrap();
    for n in [3u64, 4] {
        let h = format!(
            "node = {n}\ncluster = 9\nkey_file = \"node-{n}.key\"\ndial_from = [\"10.78.1.1:0\"]\n\n\
             [helper]\nlisten = \"10.78.1.1:75{n}0\"\n{}\n[[peers]]\nnode = 1\naddrs = [\"10.78.1.2:7401\"]\n",
            member(dir, 1)
        );
        std::fs::write(dir.join(format!("helper-{n}.toml")), h).unwrap();
    }
    let client = format!(
        "node = 2\ncluster = 9\nkey_file = \"node-2.key\"\ndial_from = [\"10.78.1.1:0\"]\n{}\n\
         [[relays]]\nserver = 1\nhelper = \"10.78.1.1:7530\"\n\n\
         [[relays]]\nserver = 1\nhelper = \"10.78.1.1:7540\"\n",
        member(dir, 1)
    );
    std::fs::write(dir.join("client.toml"), client).unwrap();
}

fn start(ns: &str, name: &str, args: &[&str]) -> Child {
    Command::new(name, BIN)
        .netns(Some(ns))
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(Output::Lines)
        .spawn()
        .unwrap()
}

fn helper(dir: &Path, n: u64) -> Child {
    let cfg = dir.join(format!("helper-{n}.toml"));
    let h = start(
        A,
        &format!("helper {n}"),
        &["helper", "--config", cfg.to_str().unwrap()],
    );
    assert!(
        h.wait_for(Duration::from_secs(10), |l| l.contains("relaying on"))
            .is_some(),
        "helper {n} did not start: {:?}",
        h.lines()
    );
    h
}

/// Bytes helper `n` has received from clients so far (the kernel's count
/// on its accepted connections, `ss -ti` in the clients' namespace).
fn helper_rx_bytes(n: u64) -> u64 {
    let out = child::run(&[
        "ip",
        "netns",
        "exec",
        A,
        "ss",
        "-tinH",
        "state",
        "established",
        "sport",
        "=",
        &format!(":75{n}0"),
    ])
    .unwrap_or_default();
    out.split_whitespace()
        .filter_map(|w| w.strip_prefix("bytes_received:"))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

/// The helper carrying the calls now (the one whose received bytes grow
/// most over 300 ms), and by how much they grew.
fn carrier() -> (u64, u64) {
    let before = [helper_rx_bytes(3), helper_rx_bytes(4)];
    std::thread::sleep(Duration::from_millis(300));
    let after = [helper_rx_bytes(3), helper_rx_bytes(4)];
    let grew = [
        after[0].saturating_sub(before[0]),
        after[1].saturating_sub(before[1]),
    ];
    if grew[1] > grew[0] {
        (4, grew[1])
    } else {
        (3, grew[0])
    }
}

#[test]
fn calls_survive_helper_processes_killed_on_a_real_network() {
    if let Some(why) = netns_unavailable() {
        eprintln!("SKIPPED helper_netns: {why}");
        return;
    }
    let _ns = Netns::up();
    let dir = std::env::temp_dir().join(format!("surelink-helper-netns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    surelink_node::keys::make_key_dir(&dir, &[1, 2, 3, 4].map(NodeId)).unwrap();
    write_configs(&dir);
    let server_cfg = dir.join("server.toml");
    let server = start(
        B,
        "server",
        &["serve", "--config", server_cfg.to_str().unwrap()],
    );
    assert!(
        server
            .wait_for(Duration::from_secs(10), |l| l.starts_with("serving echo"))
            .is_some(),
        "the server did not start: {:?}",
        server.lines()
    );
    let h3 = helper(&dir, 3);
    let h4 = helper(&dir, 4);
    let client_cfg = dir.join("client.toml");
    let calls = 1600;
    let client = start(
        A,
        "client",
        &[
            "call",
            "--config",
            client_cfg.to_str().unwrap(),
            "--peer",
            "1",
            "--count",
            &calls.to_string(),
            "--interval-ms",
            "4",
            "--timeout-ms",
            "5000",
        ],
    );
    let reply = |i: u32| move |l: &String| l.starts_with(&format!("reply {i}:"));
    assert!(
        client
            .wait_for(Duration::from_secs(20), reply(150))
            .is_some(),
        "no replies through the helpers: {:?}",
        client.lines().last()
    );
    // Twice: the helper carrying the calls (by the kernel's byte counts)
    // is SIGKILLed and a new one started in its place.
    let mut helpers = [Some(h3), Some(h4)];
    for (k, at) in [(0, 600), (1, 1200)] {
        let (victim, grew) = carrier();
        let i = usize::from(victim == 4);
        assert!(grew > 0, "kill {k}: neither helper carries the calls");
        if let Some(h) = helpers[i].take() {
            h.kill();
        }
        helpers[i] = Some(helper(&dir, victim));
        assert!(
            client
                .wait_for(Duration::from_secs(30), reply(at))
                .is_some(),
            "kill {k} (helper {victim}): no reply {at}: {:?}",
            client.lines().last()
        );
    }
    let t = Instant::now();
    let status = loop {
        if let Some(s) = client.exited() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the client hangs");
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines = client.lines();
    let summary = lines
        .iter()
        .find(|l| l.contains(" replies, "))
        .cloned()
        .unwrap_or_default();
    eprintln!("client: {summary}");
    let failed: Vec<&String> = lines.iter().filter(|l| l.starts_with("call ")).collect();
    assert!(failed.is_empty(), "calls failed: {failed:?}");
    assert!(status.success(), "surelink call failed: {summary}");
    assert!(
        summary.starts_with(&format!("{calls} replies, 0 errors")),
        "{summary}"
    );
    // Every call answered within half a second of being made, kills and
    // all (the bound for clients served again after a helper dies).
    let max_us: f64 = summary
        .rsplit("max ")
        .next()
        .and_then(|m| m.trim_end_matches(" µs").parse().ok())
        .expect("the summary's max");
    assert!(max_us < 500_000.0, "a call took {max_us} µs: {summary}");
    drop(helpers);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
