//! What the process tests of the `surelink` binary share: the example
//! cache cluster started from a temporary copy on free ports (the lab's
//! child-process helper kills every process when the test ends, also when
//! it fails), `surelink status` parsed, a memcached request. (Each test
//! binary uses part of it.)
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use surelink_lab::child::{self, Child, Command};
use surelink_lab::examples::ExampleCopy;

/// The shipped binary under test.
pub(crate) const SURELINK: &str = env!("CARGO_BIN_EXE_surelink");

/// Child processes, each killed and reaped when dropped (also when the
/// test fails).
pub(crate) struct Procs(pub(crate) Vec<Child>);

impl Procs {
    /// Kills the process named `name` now.
    pub(crate) fn kill(&mut self, name: &str) {
        if let Some(i) = self.0.iter().position(|c| c.name() == name) {
            drop(self.0.remove(i));
        }
    }
}

/// The example cache cluster's files (`examples/cache`) in a temporary
/// directory, every port moved to a free one.
pub(crate) fn example_cluster(name: &str) -> ExampleCopy {
    ExampleCopy::new("cache", name).expect("copying examples/cache")
}

/// The example proxy's memcached address in `copy`.
pub(crate) fn proxy_addr(copy: &ExampleCopy) -> SocketAddr {
    copy.moved("127.0.0.1:11311").expect("the proxy's listener")
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
    let cluster = dir.join("cluster.toml").display().to_string();
    let node = only.map(|n| n.to_string());
    let mut argv = vec![SURELINK, "status", "--cluster", &cluster];
    if let Some(n) = &node {
        argv.extend(["--node", n]);
    }
    let out = child::output(&argv, None).expect("running surelink status");
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
pub(crate) fn start_cache(dir: &Path, kind: &str, file: &str) -> Child {
    Command::new(file, SURELINK)
        .args(["cache", kind, "--config"])
        .arg(dir.join(file))
        .spawn()
        .expect("spawning surelink")
}

/// One memcached text-protocol request to `addr` and its reply up to
/// `end`, or `None` on any failure.
pub(crate) fn ask(addr: SocketAddr, req: &[u8], end: &[u8]) -> Option<Vec<u8>> {
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
