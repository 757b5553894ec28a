//! The `nats-server` child process of the NATS contender: finding the
//! binary, starting it on a free port of 127.0.1.1, its log, and killing it.
//!
//! The server is killed (and reaped) by [`NatsServer::stop`], and also when
//! it is dropped (error, Ctrl-C during the setup). It runs in its own
//! process group (a terminal's Ctrl-C reaches only the bench, which then
//! stops it), and, where util-linux's `setpriv` is installed, with a
//! parent-death signal, so it dies with the bench even if the bench is
//! killed outright.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::fixture::SERVER_IPS;

/// How long `nats-server` may take to listen.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Where to look for `nats-server` besides `PATH` (Debian installs it in
/// /usr/sbin, which is not on a normal user's `PATH`).
const SBIN_DIRS: [&str; 2] = ["/usr/sbin", "/usr/local/sbin"];
/// Warning lines of the server's log kept for the report.
const MAX_WARNINGS: usize = 20;

/// `SURELINK_NATS_SERVER`, else `nats-server` on `PATH` or in an sbin
/// directory.
pub(super) fn find_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SURELINK_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    find_program("nats-server", &SBIN_DIRS)
}

/// An executable `name` on `PATH` or in one of `extra` directories.
pub(super) fn find_program(name: &str, extra: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running `nats-server`, killed on drop.
pub(super) struct NatsServer {
    pub(super) child: Child,
    pub(super) addr: SocketAddr,
    /// `[WRN]` and `[ERR]` lines of its log (the first [`MAX_WARNINGS`]).
    warnings: Arc<Mutex<Vec<String>>>,
    log_reader: JoinHandle<()>,
}

impl NatsServer {
    /// Starts `bin` on a port of its choosing on 127.0.1.1 and waits until
    /// it listens.
    pub(super) async fn start(bin: &Path) -> Result<NatsServer> {
        let host = SERVER_IPS[0].to_string();
        let mut cmd = match find_program("setpriv", &[]) {
            // The parent-death signal: the server dies with the bench, even
            // if the bench is killed with SIGKILL.
            Some(setpriv) => {
                let mut c = Command::new(setpriv);
                c.args(["--pdeathsig", "KILL", "--"]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        // `-p -1`: a free port, which the server logs.
        cmd.args(["-a", &host, "-p", "-1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("nats-server stderr")?;
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let (listening_tx, listening) = oneshot::channel();
        let log_reader = tokio::spawn(read_log(stderr, listening_tx, warnings.clone()));
        let mut server = NatsServer {
            child,
            addr: SocketAddr::from((SERVER_IPS[0], 0)),
            warnings,
            log_reader,
        };
        // On an error from here on, dropping `server` kills the process.
        let addr = tokio::select! {
            r = tokio::time::timeout(START_TIMEOUT, listening) => match r {
                Ok(Ok(Ok(addr))) => addr,
                Ok(Ok(Err(log))) => bail!("{} did not start: {log}", bin.display()),
                Ok(Err(_)) => bail!("{} stopped before it listened", bin.display()),
                Err(_) => bail!("{} did not listen within {START_TIMEOUT:?}", bin.display()),
            },
            status = server.child.wait() => {
                // Let the reader pass on the last lines first.
                let status = status.context("waiting for nats-server")?;
                bail!("{} exited at start ({status}): {}", bin.display(), server.log_tail())
            }
        };
        server.addr = addr;
        Ok(server)
    }

    fn log_tail(&self) -> String {
        let w = lock(&self.warnings);
        if w.is_empty() {
            "no warning logged".to_owned()
        } else {
            w.join(" | ")
        }
    }

    /// Kills the server and reaps it; returns the warnings it logged.
    pub(super) async fn stop(mut self) -> Vec<String> {
        if let Err(e) = self.child.kill().await {
            eprintln!("warning: killing nats-server: {e}");
        }
        self.log_reader.abort();
        let warnings = std::mem::take(&mut *lock(&self.warnings));
        warnings
            .into_iter()
            .map(|w| format!("nats-server logged: {w}"))
            .collect()
    }
}

/// Reads the server's log: reports the address once it listens (or, if
/// it stops before, the lines it logged), then keeps its warnings.
async fn read_log(
    stderr: ChildStderr,
    listening: oneshot::Sender<std::result::Result<SocketAddr, String>>,
    warnings: Arc<Mutex<Vec<String>>>,
) {
    const LISTENING: &str = "Listening for client connections on ";
    let mut listening = Some(listening);
    let mut startup_log = Vec::new();
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(tx) = listening.take() {
            match line.split_once(LISTENING).map(|(_, a)| a.trim().parse()) {
                Some(Ok(addr)) => {
                    let _ = tx.send(Ok(addr));
                }
                Some(Err(e)) => {
                    let _ = tx.send(Err(format!("cannot parse {line:?}: {e}")));
                }
                None => {
                    startup_log.push(line.clone());
                    listening = Some(tx);
                }
            }
        }
        if line.contains("[WRN]") || line.contains("[ERR]") || line.contains("[FTL]") {
            let mut w = lock(&warnings);
            if w.len() < MAX_WARNINGS {
                w.push(line);
            }
        }
    }
    if let Some(tx) = listening {
        let _ = tx.send(Err(startup_log.join(" | ")));
    }
}
