//! Experiment nodes as child processes (through the lab's one child-process
//! helper): spawning, commands, the events they print.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;
use surelink_lab::child::{Child, Command, Output};

use super::node::wall_us;

/// One running experiment node (`surelink-lab experiment-node` or
/// another hidden node subcommand), its JSON event lines collected.
pub(crate) struct NodeProc {
    child: Child<Value>,
    pub(crate) pid: u32,
}

/// Key files for the experiment nodes of this process (receiver and
/// sender), under the system's temporary directory.
fn experiment_key_dir() -> Result<std::path::PathBuf> {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    if let Some(d) = DIR.get() {
        return Ok(d.clone());
    }
    let dir = std::env::temp_dir().join(format!("surelink-experiment-keys-{}", std::process::id()));
    surelink_node::keys::make_key_dir(&dir, &[super::node::RECEIVER, super::node::SENDER])?;
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

    /// Starts `surelink-lab <sub> <args>` (inside network namespace `ns`,
    /// if given) and waits for its `ready` line.
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
        let exe = std::env::current_exe().context("locating the surelink-lab binary")?;
        // Experiment nodes authenticate like any deployment: with key files
        // (one directory per experiment process, made on first use).
        let mut args = args.to_vec();
        if sub == "experiment-node" && !args.iter().any(|a| a == "--insecure" || a == "--key-dir") {
            args.push("--key-dir".into());
            args.push(experiment_key_dir()?.display().to_string());
        }
        let child = Command::new("an experiment node", &exe)
            .netns(ns)
            .arg(sub)
            .args(args)
            .stdin()
            .stdout(Output::Lines)
            .stderr(Output::Inherit)
            // Nodes log errors only unless asked (their events are on stdout).
            .env(
                "RUST_LOG",
                std::env::var("SURELINK_NODE_LOG").unwrap_or_else(|_| "error".into()),
            )
            .spawn_parsed(|line| serde_json::from_str::<Value>(line).ok())?;
        let pid = child.pid();
        let node = NodeProc { child, pid };
        let ready = node
            .wait_for(Duration::from_secs(10), |v| v["ev"] == first)
            .await
            .with_context(|| format!("the node did not report {first}"))?;
        Ok((node, ready))
    }

    /// Sends one command line.
    pub(crate) async fn command(&mut self, line: &str) -> Result<()> {
        self.child.send_line(line)
    }

    /// The first event matching `pred`, waiting up to `timeout`.
    pub(crate) async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        self.child.wait_for_async(timeout, pred).await
    }

    /// Every event so far.
    pub(crate) fn events(&self) -> Vec<Value> {
        self.child.lines()
    }

    /// SIGKILL, now; returns the wall-clock time it was sent.
    pub(crate) async fn kill(&mut self) -> Result<u64> {
        let t = wall_us();
        self.child.kill();
        Ok(t)
    }

    /// Asks the node to quit, killing it if it does not within two
    /// seconds; every event it printed.
    pub(crate) async fn quit(mut self) -> Vec<Value> {
        let _ = self.command("quit").await;
        self.child.wait_or_kill(Duration::from_secs(2)).await;
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
