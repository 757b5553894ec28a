//! The NATS contender: a `nats-server` child process on a free port of
//! 127.0.1.1 and the pure-Rust `async-nats` client, one connection per side
//! with default options (request timeout set to the bench's common 5 s).
//!
//! * Latency: callers (tokio tasks) share the client connection and loop
//!   `client.request("bench.echo", payload)`; the client multiplexes them
//!   over its one reply-inbox subscription. On the server-side connection a
//!   task subscribed to `bench.echo` answers each request with
//!   `publish(reply_subject, payload)`.
//! * Throughput: one task loops `client.publish("bench.sink", payload)`
//!   (then `flush`); a task subscribed to `bench.sink` on the server-side
//!   connection counts. NATS core is at-most-once: the server drops
//!   messages for a consumer that falls too far behind, and so does the
//!   client when a subscription's buffer is full, so the drain ends once
//!   nothing more arrives and the missing messages are reported lost.
//!
//! The server is killed when the contender shuts down, and also when it is
//! dropped (error, Ctrl-C). It runs in its own process group (a terminal's
//! Ctrl-C reaches only the bench, which then kills it), and, where
//! util-linux's `setpriv` is installed, with a parent-death signal, so it
//! dies with the bench even if the bench is killed outright.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use async_nats::{Client, ConnectOptions, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::oneshot;
use tokio::task::coop::consume_budget;
use tokio::task::JoinHandle;

use super::fixture::{Delivered, Setup, CALL_TIMEOUT, SERVER_IPS};
use super::report::ThroughputRound;
use super::throughput::{measure, Delivery};
use super::Plan;

const ECHO_SUBJECT: &str = "bench.echo";
const SINK_SUBJECT: &str = "bench.sink";
/// How long `nats-server` may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Where to look for `nats-server` besides `PATH` (Debian installs it in
/// /usr/sbin, which is not on a normal user's `PATH`).
const SBIN_DIRS: [&str; 2] = ["/usr/sbin", "/usr/local/sbin"];
/// `SKIPPED nats: ...` when there is none.
const NOT_FOUND: &str = "nats-server not found (apt-get install nats-server)";
/// Warning lines of the server's log kept for the report.
const MAX_WARNINGS: usize = 20;

/// The NATS contender: the server process and both sides' connections.
pub(super) struct NatsContender {
    server: NatsServer,
    /// The calling and publishing side.
    client: Client,
    /// The answering and receiving side.
    responder: Client,
    delivered: Arc<Delivered>,
    /// The echo responder and the sink subscriber.
    tasks: AbortOnDrop,
    /// What the client connections reported.
    events: Arc<Events>,
}

impl NatsContender {
    /// Starts `nats-server` and connects both sides; skips when there is no
    /// `nats-server` (`SURELINK_NATS_SERVER` names one explicitly).
    pub(super) async fn setup() -> Result<Setup<NatsContender>> {
        let Some(bin) = find_server() else {
            return Ok(Setup::Skipped(NOT_FOUND.to_owned()));
        };
        let server = NatsServer::start(&bin).await?;
        let url = format!("nats://{}", server.addr);
        let events = Arc::new(Events::default());
        let connect = |name: &'static str| {
            let events = events.clone();
            ConnectOptions::new()
                .name(name)
                .request_timeout(Some(CALL_TIMEOUT))
                // Only observes: what the client reports (e.g. that it
                // dropped messages for a slow subscriber) goes in the report.
                .event_callback(move |event| {
                    events.note(name, &event);
                    async {}
                })
                .connect(url.clone())
        };
        let client = connect("surelink-bench-client")
            .await
            .with_context(|| format!("connecting the NATS client to {url}"))?;
        let responder = connect("surelink-bench-server")
            .await
            .with_context(|| format!("connecting the NATS responder to {url}"))?;
        let echo = responder
            .subscribe(ECHO_SUBJECT)
            .await
            .context("subscribing the NATS responder")?;
        let sink = responder
            .subscribe(SINK_SUBJECT)
            .await
            .context("subscribing the NATS sink")?;
        // The server has both subscriptions once it answered the flush.
        responder
            .flush()
            .await
            .context("flushing the NATS responder")?;
        let delivered = Arc::new(Delivered::default());
        let tasks = AbortOnDrop(vec![
            tokio::spawn(answer(echo, responder.clone())),
            tokio::spawn(count(sink, delivered.clone())),
        ]);
        let nats = NatsContender {
            server,
            client,
            responder,
            delivered,
            tasks,
            events,
        };
        nats.wait_ready().await?;
        Ok(Setup::Ready(nats))
    }

    /// Waits until the server has both subscriptions in place: a request
    /// is answered and a published message arrives. (The client's `flush`
    /// only says that the subscriptions left the client; the server reads
    /// each connection on its own, so a request on the other connection
    /// could overtake them and find no responder.)
    async fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.client.request(ECHO_SUBJECT, Bytes::new()).await {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).context("the NATS responder never answered")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        loop {
            let before = self.delivered.msgs();
            self.client
                .publish(SINK_SUBJECT, Bytes::new())
                .await
                .context("NATS publish")?;
            let probe = Instant::now();
            while probe.elapsed() < Duration::from_millis(100) {
                if self.delivered.msgs() > before {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            ensure!(
                Instant::now() < deadline,
                "the NATS subscriber never received a message"
            );
        }
    }

    /// What this contender is, for `bench.json`.
    pub(super) fn describe(&self) -> String {
        format!(
            "nats-server {} on {} (child process), async-nats client; one connection per side, \
             default options but a 5 s request timeout; request/reply, publish/subscribe",
            self.client.server_info().version,
            self.server.addr
        )
    }

    /// A latency caller.
    pub(super) fn caller(&self) -> NatsCaller {
        NatsCaller(self.client.clone())
    }

    /// One throughput round: `publish` in a loop, the subscriber counting.
    pub(super) async fn throughput_round(
        &self,
        payload: &Bytes,
        plan: &Plan,
    ) -> Result<ThroughputRound> {
        let (round, ()) = measure(&self.delivered, plan, Delivery::AtMostOnce, |stop| {
            let task = tokio::spawn(publish_loop(self.client.clone(), payload.clone(), stop));
            async move { task.await.context("publisher task failed")? }
        })
        .await?;
        Ok(round)
    }

    /// Closes both connections and kills the server; returns what the
    /// clients reported and the warnings the server logged, as notes for the
    /// report.
    pub(super) async fn shutdown(self) -> Vec<String> {
        drop((self.tasks, self.client, self.responder));
        let mut notes = self.events.notes();
        notes.extend(self.server.stop().await);
        notes
    }
}

/// The client connections' events, counted by kind.
#[derive(Default)]
struct Events(Mutex<std::collections::BTreeMap<String, u64>>);

impl Events {
    fn note(&self, connection: &str, event: &async_nats::Event) {
        // Slow-consumer events name a subscription id; count them as one kind.
        use async_nats::Event;
        let kind = match event {
            // The normal life of a connection.
            Event::Connected | Event::Draining | Event::Closed => return,
            Event::SlowConsumer(_) => {
                "slow consumer: a subscription's buffer was full, messages dropped".to_owned()
            }
            other => other.to_string(),
        };
        *lock(&self.0)
            .entry(format!("{connection}: {kind}"))
            .or_default() += 1;
    }

    fn notes(&self) -> Vec<String> {
        lock(&self.0)
            .iter()
            .map(|(what, n)| format!("async-nats event x{n}: {what}"))
            .collect()
    }
}

/// Tasks aborted when this is dropped.
struct AbortOnDrop(Vec<JoinHandle<Result<()>>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.iter().for_each(JoinHandle::abort);
    }
}

/// A latency caller: one request on the shared client connection.
#[derive(Clone)]
pub(super) struct NatsCaller(Client);

impl NatsCaller {
    pub(super) async fn call(&self, payload: &Bytes) -> Result<Bytes> {
        let reply = self
            .0
            .request(ECHO_SUBJECT, payload.clone())
            .await
            .context("NATS request")?;
        Ok(reply.payload)
    }
}

/// The server side of request/reply: answers every request with its
/// payload.
async fn answer(mut requests: Subscriber, responder: Client) -> Result<()> {
    while let Some(m) = requests.next().await {
        if let Some(reply) = m.reply {
            responder
                .publish(reply, m.payload)
                .await
                .context("NATS responder publish")?;
        }
    }
    Ok(())
}

/// The receiving side of the throughput rounds.
async fn count(mut messages: Subscriber, delivered: Arc<Delivered>) -> Result<()> {
    while let Some(m) = messages.next().await {
        delivered.add(m.payload.len());
    }
    Ok(())
}

/// The throughput sender: `publish` until told to stop, then a flush.
async fn publish_loop(client: Client, payload: Bytes, stop: Arc<AtomicBool>) -> Result<((), u64)> {
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        client
            .publish(SINK_SUBJECT, payload.clone())
            .await
            .context("NATS publish")?;
        sent += 1;
        consume_budget().await;
    }
    client.flush().await.context("NATS flush")?;
    Ok(((), sent))
}

// ---------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------

/// `SURELINK_NATS_SERVER`, else `nats-server` on `PATH` or in an sbin
/// directory.
fn find_server() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SURELINK_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    find_program("nats-server", &SBIN_DIRS)
}

/// An executable `name` on `PATH` or in one of `extra` directories.
fn find_program(name: &str, extra: &[&str]) -> Option<PathBuf> {
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running `nats-server`, killed on drop.
struct NatsServer {
    child: Child,
    addr: SocketAddr,
    /// `[WRN]` and `[ERR]` lines of its log (the first [`MAX_WARNINGS`]).
    warnings: Arc<Mutex<Vec<String>>>,
    log_reader: JoinHandle<()>,
}

impl NatsServer {
    /// Starts `bin` on a port of its choosing on 127.0.1.1 and waits until
    /// it listens.
    async fn start(bin: &Path) -> Result<NatsServer> {
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
    async fn stop(mut self) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_plan() -> Plan {
        Plan {
            rounds: 1,
            measure: Duration::from_millis(50),
            warmup: Duration::from_millis(20),
            latency: Vec::new(),
            throughput: Vec::new(),
        }
    }

    #[tokio::test]
    async fn echoes_counts_and_leaves_no_server_behind() {
        let nats = match NatsContender::setup().await.unwrap() {
            Setup::Ready(n) => n,
            Setup::Skipped(why) => {
                eprintln!("SKIPPED nats: {why}");
                return;
            }
        };
        let pid = nats.server.child.id().unwrap();
        let body = Bytes::from_static(b"ping");
        assert_eq!(nats.caller().call(&body).await.unwrap(), body);
        let round = nats.throughput_round(&body, &tiny_plan()).await.unwrap();
        assert!(round.delivered > 0 && round.sent > 0, "{round:?}");
        assert!(nats.describe().contains("nats-server 2."));
        nats.shutdown().await;
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "nats-server {pid} still running"
        );
    }
}
