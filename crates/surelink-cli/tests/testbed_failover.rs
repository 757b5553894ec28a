//! Real kernel network: two network namespaces joined by two veth links
//! (`surelink testbed up`), a receiver and a streaming sender as separate
//! processes, and every fault of the failover experiment hitting network 1
//! in turn (link down, one-way drop, both-way drop, 10 % loss, connection
//! kill, blackhole route). Nothing may be lost, duplicated or reordered.
//!
//! Needs root, `ip`, `ss` and `nft`; without them the test prints a
//! SKIPPED notice and does nothing (`.ci/run` runs as root and installs
//! the tools). The testbed is removed afterwards, also when the test fails.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_surelink");

fn surelink(args: &[&str]) -> Result<String, String> {
    let out = Command::new(EXE)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn missing_requirements() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    for tool in ["ip", "ss", "nft"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(format!("`{tool}` missing"));
        }
    }
    None
}

/// Removes the testbed when dropped (also on panic).
struct Testbed;

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = surelink(&["testbed", "down"]);
    }
}

/// A node process inside a namespace, its stdout lines collected.
struct Node {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Node {
    fn start(ns: &str, args: &[&str]) -> Node {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, EXE, "experiment-node"])
            .args(args)
            .env("RUST_LOG", "error")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str(&line) {
                    l.lock().unwrap().push(v);
                }
            }
        });
        Node { child, lines }
    }

    fn wait_for(&self, what: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.lines.lock().unwrap().iter().any(|v| v["ev"] == what) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn stop(mut self) -> Vec<serde_json::Value> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(Duration::from_millis(50));
        self.lines.lock().unwrap().clone()
    }
}

#[test]
fn no_loss_duplicate_or_reorder_under_every_fault_on_a_real_network() {
    if let Some(why) = missing_requirements() {
        eprintln!("SKIPPED testbed_failover: {why} (run as root with iproute2 and nftables)");
        return;
    }
    let _guard = Testbed;
    surelink(&["testbed", "up"]).unwrap();
    // The nodes authenticate with key files, made here by the first node.
    let keys = std::env::temp_dir().join(format!("surelink-testbed-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&keys);
    let keys_arg = keys.display().to_string();
    let detector = [
        "--interval-ms",
        "10",
        "--timeout-ms",
        "150",
        "--path-timeout-ms",
        "50",
        "--slack-ms",
        "100",
        "--network-delay-ms",
        "10",
    ];
    let mut args = vec![
        "--role",
        "receiver",
        "--local",
        "10.77.1.2:7400,10.77.2.2:7400",
    ];
    args.extend(detector);
    args.extend(["--key-dir", &keys_arg]);
    let rx = Node::start("sl-b", &args);
    assert!(
        rx.wait_for("ready", Duration::from_secs(10)),
        "receiver did not start"
    );
    let mut args = vec![
        "--role",
        "sender",
        "--local",
        "10.77.1.1:0,10.77.2.1:0",
        "--peer",
        "10.77.1.2:7400,10.77.2.2:7400",
        "--stream-ms",
        "1",
    ];
    args.extend(detector);
    args.extend(["--key-dir", &keys_arg]);
    let tx = Node::start("sl-a", &args);
    assert!(
        rx.wait_for("peer_up", Duration::from_secs(10)),
        "sender never connected"
    );
    std::thread::sleep(Duration::from_millis(1000));
    for fault in [
        "link-down",
        "one-way",
        "both-ways",
        "loss",
        "kill",
        "blackhole",
    ] {
        surelink(&["testbed", "fault", fault]).unwrap();
        std::thread::sleep(Duration::from_millis(800));
        surelink(&["testbed", "undo", fault]).unwrap();
        std::thread::sleep(Duration::from_millis(800));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let tx_lines = tx.stop();
    let rx_lines = rx.stop();
    let _ = std::fs::remove_dir_all(&keys);
    let fenced = tx_lines.iter().filter(|v| v["ev"] == "fenced").count();
    assert_eq!(
        fenced, 0,
        "the sender was fenced: the comparison below would be moot"
    );
    let seqs: Vec<u64> = rx_lines
        .iter()
        .filter(|v| v["ev"] == "msg")
        .filter_map(|v| v["seq"].as_u64())
        .collect();
    assert!(
        seqs.len() > 5000,
        "too few messages arrived: {}",
        seqs.len()
    );
    let first = seqs[0];
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(
            *s,
            first + i as u64,
            "message {i}: lost, duplicated or out of order"
        );
    }
    let silent = rx_lines.iter().filter(|v| v["ev"] == "path_silent").count();
    eprintln!(
        "testbed_failover: {} messages in order, none lost or doubled; {silent} path failovers by the detector",
        seqs.len()
    );
}
