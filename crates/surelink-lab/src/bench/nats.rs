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
//! The server process is in [`nats_server`](super::nats_server).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use async_nats::{Client, ConnectOptions, Subscriber};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::task::coop::consume_budget;
use tokio::task::JoinHandle;

use super::fixture::{Delivered, Setup, CALL_TIMEOUT};
use super::nats_server::{find_server, NatsServer, START_TIMEOUT};
use super::report::ThroughputRound;
use super::throughput::{measure_task, Delivery};
use super::Plan;
use surelink_lab::lock;

const ECHO_SUBJECT: &str = "bench.echo";
const SINK_SUBJECT: &str = "bench.sink";
/// `SKIPPED nats: ...` when there is none.
const NOT_FOUND: &str = "nats-server not found (apt-get install nats-server)";

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
        let (round, ()) = measure_task(&self.delivered, plan, Delivery::AtMostOnce, |stop| {
            publish_loop(self.client.clone(), payload.clone(), stop)
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    // Two worker threads so the subscriber counts while the publisher runs
    // (on one thread a short window can close before the counter is polled).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn echoes_counts_and_leaves_no_server_behind() {
        let nats = match NatsContender::setup().await.unwrap() {
            Setup::Ready(n) => n,
            Setup::Skipped(why) => {
                eprintln!("SKIPPED nats: {why}");
                return;
            }
        };
        let pid = nats.server.child.pid();
        let body = Bytes::from_static(b"ping");
        assert_eq!(nats.caller().call(&body).await.unwrap(), body);
        let round = nats.throughput_round(&body, &Plan::tiny()).await.unwrap();
        // NATS may drop for a slow consumer; what matters here is that the
        // subscriber counted what arrived (in the window or in the drain).
        assert!(round.sent > 0 && round.lost < round.sent, "{round:?}");
        assert!(nats.describe().contains("nats-server 2."));
        nats.shutdown().await;
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "nats-server {pid} still running"
        );
    }
}
