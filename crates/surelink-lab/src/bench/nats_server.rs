//! The `nats-server` child process of the NATS contender: finding the
//! binary, starting it on a free port of 127.0.1.1, its log, and killing it.
//!
//! The server is killed (and reaped) by [`NatsServer::stop`], and also when
//! it is dropped (error, Ctrl-C during the setup); the lab's child-process
//! helper gives it its own process group (a terminal's Ctrl-C reaches only
//! the bench, which then stops it) and, where util-linux's `setpriv` is
//! installed, a parent-death signal, so it dies with the bench even if the
//! bench is killed outright.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use surelink_lab::child::{Child, Command, Output};

use super::fixture::SERVER_IPS;

/// How long `nats-server` may take to listen.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Where to look for `nats-server` besides `PATH` (Debian installs it in
/// /usr/sbin, which is not on a normal user's `PATH`).
const SBIN_DIRS: [&str; 2] = ["/usr/sbin", "/usr/local/sbin"];
/// Warning lines of the server's log kept for the report.
const MAX_WARNINGS: usize = 20;
/// The line that gives the address once it listens.
const LISTENING: &str = "Listening for client connections on ";

/// `SURELINK_NATS_SERVER`, else `nats-server` on `PATH` or in an sbin
/// directory.
pub(super) fn find_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SURELINK_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    surelink_lab::host::find_program("nats-server", &SBIN_DIRS)
}

/// A running `nats-server`, killed on drop.
pub(super) struct NatsServer {
    pub(super) child: Child,
    pub(super) addr: SocketAddr,
}

impl NatsServer {
    /// Starts `bin` on a port of its choosing on 127.0.1.1 and waits until
    /// it listens.
    pub(super) async fn start(bin: &Path) -> Result<NatsServer> {
        let host = SERVER_IPS[0].to_string();
        // `-p -1`: a free port, which the server logs (on stderr).
        let child = Command::new("nats-server", bin)
            .args(["-a", &host, "-p", "-1"])
            .stderr(Output::Lines)
            .die_with_parent()
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        // On an error from here on, dropping `child` kills the process.
        let Some(line) = child
            .wait_for_async(START_TIMEOUT, |l| l.contains(LISTENING))
            .await
        else {
            if let Some(status) = child.exited() {
                bail!(
                    "{} exited at start ({status}): {}",
                    bin.display(),
                    log_tail(&child)
                );
            }
            if child.lines().is_empty() {
                bail!("{} did not listen within {START_TIMEOUT:?}", bin.display());
            }
            bail!(
                "{} did not start: {}",
                bin.display(),
                child.lines().join(" | ")
            );
        };
        let addr = match line.split_once(LISTENING).map(|(_, a)| a.trim().parse()) {
            Some(Ok(addr)) => addr,
            Some(Err(e)) => bail!(
                "{} did not start: cannot parse {line:?}: {e}",
                bin.display()
            ),
            None => unreachable!("the line names the address"),
        };
        Ok(NatsServer { child, addr })
    }

    /// Kills the server and reaps it; returns the warnings it logged.
    pub(super) async fn stop(self) -> Vec<String> {
        self.child.kill();
        warnings(&self.child)
            .into_iter()
            .map(|w| format!("nats-server logged: {w}"))
            .collect()
    }
}

/// `[WRN]`, `[ERR]` and `[FTL]` lines of its log (the first
/// [`MAX_WARNINGS`]).
fn warnings(child: &Child) -> Vec<String> {
    child
        .lines()
        .into_iter()
        .filter(|l| l.contains("[WRN]") || l.contains("[ERR]") || l.contains("[FTL]"))
        .take(MAX_WARNINGS)
        .collect()
}

fn log_tail(child: &Child) -> String {
    let w = warnings(child);
    if w.is_empty() {
        "no warning logged".to_owned()
    } else {
        w.join(" | ")
    }
}
