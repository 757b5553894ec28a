//! Experiment nodes as child processes: spawning, commands, the events
//! they print.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use super::node::wall_us;

/// One running `surelink experiment-node`.
pub(crate) struct NodeProc {
    child: Child,
    stdin: ChildStdin,
    pub(crate) pid: u32,
    events: Arc<Mutex<Vec<Value>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Key files for the experiment nodes of this process (receiver and
/// sender), under the system's temporary directory.
fn experiment_key_dir() -> Result<std::path::PathBuf> {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    if let Some(d) = DIR.get() {
        return Ok(d.clone());
    }
    let dir = std::env::temp_dir().join(format!("surelink-experiment-keys-{}", std::process::id()));
    crate::keys::make_key_dir(&dir, &[super::node::RECEIVER, super::node::SENDER])?;
    Ok(DIR.get_or_init(|| dir).clone())
}

/// Removes this process's experiment key files (best effort).
pub(crate) fn remove_key_dir() {
    let dir = std::env::temp_dir().join(format!("surelink-experiment-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(dir);
}

impl NodeProc {
    /// Starts a node with `args` and waits for its `ready` line.
    pub(crate) async fn spawn(args: &[String]) -> Result<(NodeProc, Value)> {
        Self::spawn_in(None, "experiment-node", args).await
    }

    /// Starts `surelink <sub> <args>` (inside network namespace `ns`, if
    /// given) and waits for its `ready` line.
    pub(crate) async fn spawn_in(
        ns: Option<&str>,
        sub: &str,
        args: &[String],
    ) -> Result<(NodeProc, Value)> {
        Self::spawn_in_until(ns, sub, args, "ready").await
    }

    /// Like [`NodeProc::spawn_in`], waiting for an event named `first`.
    pub(crate) async fn spawn_in_until(
        ns: Option<&str>,
        sub: &str,
        args: &[String],
        first: &str,
    ) -> Result<(NodeProc, Value)> {
        let exe = std::env::current_exe().context("locating the surelink binary")?;
        // Experiment nodes authenticate like any deployment: with key files
        // (one directory per experiment process, made on first use).
        let mut args = args.to_vec();
        if sub == "experiment-node" && !args.iter().any(|a| a == "--insecure" || a == "--key-dir") {
            args.push("--key-dir".into());
            args.push(experiment_key_dir()?.display().to_string());
        }
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let mut child = cmd
            .arg(sub)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Nodes log errors only unless asked (their events are on stdout).
            .env(
                "RUST_LOG",
                std::env::var("SURELINK_NODE_LOG").unwrap_or_else(|_| "error".into()),
            )
            .kill_on_drop(true)
            .spawn()
            .context("starting an experiment node")?;
        let pid = child.id().context("the node exited at once")?;
        let stdin = child.stdin.take().context("node stdin")?;
        let stdout = child.stdout.take().context("node stdout")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let ev = events.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    lock(&ev).push(v);
                }
            }
        });
        let node = NodeProc {
            child,
            stdin,
            pid,
            events,
        };
        let ready = node
            .wait_for(Duration::from_secs(10), |v| v["ev"] == first)
            .await
            .with_context(|| format!("the node did not report {first}"))?;
        Ok((node, ready))
    }

    /// Sends one command line.
    pub(crate) async fn command(&mut self, line: &str) -> Result<()> {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .with_context(|| format!("sending {line:?} to node {}", self.pid))
    }

    /// The first event matching `pred`, waiting up to `timeout`.
    pub(crate) async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(v) = lock(&self.events).iter().find(|v| pred(v)) {
                return Some(v.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Every event so far.
    pub(crate) fn events(&self) -> Vec<Value> {
        lock(&self.events).clone()
    }

    /// SIGKILL, now; returns the wall-clock time it was sent.
    pub(crate) async fn kill(&mut self) -> Result<u64> {
        let t = wall_us();
        self.child.start_kill().context("killing the node")?;
        let _ = self.child.wait().await;
        Ok(t)
    }

    /// Asks the node to quit, killing it if it does not within a second.
    pub(crate) async fn quit(mut self) -> Vec<Value> {
        let _ = self.command("quit").await;
        if tokio::time::timeout(Duration::from_secs(2), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
        // Let the stdout reader take the last lines.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.events()
    }
}

/// The addresses in a `ready` event's field.
pub(crate) fn addrs(ready: &Value, field: &str) -> Result<Vec<String>> {
    let Some(list) = ready[field].as_array() else {
        bail!("ready event without {field}: {ready}");
    };
    Ok(list
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect())
}

/// Time of an event (wall clock, µs).
pub(crate) fn t(v: &Value) -> u64 {
    v["t"].as_u64().unwrap_or(0)
}
