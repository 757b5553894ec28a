//! What the process-level tests share: the netns tests' requirements
//! check, child processes that die with the test, a memcached request.
//! (Each test binary uses part of it.)
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Named child processes, killed and reaped when dropped (also when the
/// test fails).
pub(crate) struct Procs(pub(crate) Vec<(String, Child)>);

impl Procs {
    /// Kills the process named `name` now.
    pub(crate) fn kill(&mut self, name: &str) {
        if let Some(i) = self.0.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.0.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `f` every 100 ms until it gives a value; fails the test naming
/// `what` if none came within `within`.
pub(crate) fn until<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What `surelink status` says of one node: its name, the (role server,
/// epoch) of the table it holds, the epoch it serves.
pub(crate) type Held = (String, (u64, u64), Option<u64>);

/// `surelink status --cluster <dir>/cluster.toml` (`only`: that node
/// alone; a frozen node costs a status call its 2 s read timeout): the
/// text, and per node that holds a table, what it holds.
pub(crate) fn role_status(dir: &Path, only: Option<u64>) -> (String, Vec<Held>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_surelink"));
    cmd.args(["status", "--cluster"])
        .arg(dir.join("cluster.toml"));
    if let Some(n) = only {
        cmd.args(["--node", &n.to_string()]);
    }
    let out = cmd.output().expect("running surelink status");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let num = |s: &str| s.trim_end_matches(',').parse::<u64>().ok();
    // One block per node, each opened by a `== <name> (<addr>)` line.
    type Block = (String, Option<(u64, u64)>, Option<u64>);
    let mut blocks: Vec<Block> = Vec::new();
    for l in text.lines() {
        if let Some(head) = l.strip_prefix("== ") {
            let name = head.split(" (").next().unwrap_or("").to_string();
            blocks.push((name, None, None));
        } else if let Some(b) = blocks.last_mut() {
            if let Some(rest) = l.strip_prefix("table: role server node ") {
                let w: Vec<&str> = rest.split_whitespace().collect();
                if let (Some(role), Some(epoch)) = (num(w[0]), w.get(2).and_then(|e| num(e))) {
                    b.1 = Some((role, epoch));
                }
            }
            if let Some(rest) = l.strip_prefix("serving as role server, epoch ") {
                b.2 = num(rest);
            }
        }
    }
    let nodes = blocks
        .into_iter()
        .filter_map(|(name, t, serving)| t.map(|t| (name, t, serving)))
        .collect();
    (text, nodes)
}

/// `surelink cache <kind> --config <dir>/<file>` as a child process named
/// `file`.
pub(crate) fn start_cache(dir: &Path, kind: &str, file: &str) -> (String, Child) {
    let c = Command::new(env!("CARGO_BIN_EXE_surelink"))
        .args(["cache", kind, "--config"])
        .arg(dir.join(file))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning surelink");
    (file.to_string(), c)
}

/// One memcached text-protocol request to `addr` and its reply up to
/// `end`, or `None` on any failure.
pub(crate) fn ask(addr: &str, req: &[u8], end: &[u8]) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(req).ok()?;
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !got.ends_with(end) {
        let n = s.read(&mut b).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&b[..n]);
    }
    Some(got)
}

/// Why the network-namespace tests cannot run here (not root, or `ip`,
/// `ss` or `nft` missing), or `None` when they can.
pub(crate) fn missing_requirements() -> Option<String> {
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
