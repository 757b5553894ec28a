//! All contenders set up once for the whole run, the addresses they use,
//! the receivers' delivery counter, and the one place that dispatches a
//! measurement to a contender.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use surelink::proto::secure::RecordCipher;
use surelink::DetectorConfig;

use super::grpc::{self, GrpcContender};
use super::latency::{latency_round, Caller};
use super::nats::NatsContender;
use super::report::{LatencyRound, ThroughputRound};
use super::surelink_pair::{self, SurelinkPair};
use super::tcp::{self, TcpBaseline};
use super::zeromq::ZmqContender;
use super::{Contender, Plan};

/// Timeout of every call, all contenders.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Every contender uses the shared fixture's loopback addresses.
pub(super) use surelink::testing::{CLIENT_IPS, SERVER_IPS};

/// What setting up an optional contender gave.
pub(super) enum Setup<T> {
    Ready(T),
    /// It cannot run on this machine or in this build: why, and how to fix
    /// it (printed as `SKIPPED <name>: <reason>`).
    Skipped(String),
}

/// All contenders, set up once for the whole run.
pub(super) struct Fixture {
    pub(super) surelink: SurelinkPair,
    /// The same with `insecure = true`: what authentication costs.
    pub(super) surelink_insecure: SurelinkPair,
    tcp: TcpBaseline,
    zeromq: Option<ZmqContender>,
    nats: Option<NatsContender>,
    grpc: GrpcContender,
    /// The contenders that could not run, and why.
    pub(super) skipped: BTreeMap<Contender, String>,
    /// `--record-cipher`: the tuned variant's cipher.
    cipher: Option<RecordCipher>,
}

impl Fixture {
    /// Sets every contender up; skips (with a `SKIPPED` line on stderr) the
    /// ones this machine or build cannot run. On an error, whatever was set
    /// up already is stopped again.
    pub(super) async fn setup(cipher: Option<RecordCipher>) -> Result<Fixture> {
        let surelink =
            SurelinkPair::setup_preferring(DetectorConfig::default(), false, cipher).await?;
        let surelink_insecure = SurelinkPair::setup(DetectorConfig::default(), true).await?;
        let mut skipped = BTreeMap::new();
        let others = async {
            let tcp = TcpBaseline::setup()
                .await
                .context("setting up the plain-TCP baseline")?;
            // From here on an error drops what was set up, which stops it.
            let zeromq = ready(
                Contender::Zeromq,
                ZmqContender::setup().context("setting up ZeroMQ")?,
                &mut skipped,
            );
            let nats = ready(
                Contender::Nats,
                NatsContender::setup().await.context("setting up NATS")?,
                &mut skipped,
            );
            let grpc = GrpcContender::setup()
                .await
                .context("setting up gRPC (tonic)")?;
            Ok::<_, anyhow::Error>((tcp, zeromq, nats, grpc))
        };
        match others.await {
            Ok((tcp, zeromq, nats, grpc)) => Ok(Fixture {
                surelink,
                surelink_insecure,
                tcp,
                zeromq,
                nats,
                grpc,
                skipped,
                cipher,
            }),
            Err(e) => {
                surelink.shutdown().await;
                Err(e)
            }
        }
    }

    /// The contenders that run, in the report's order.
    pub(super) fn contenders(&self) -> Vec<Contender> {
        Contender::ALL
            .into_iter()
            .filter(|&who| match who {
                Contender::Surelink
                | Contender::SurelinkInsecure
                | Contender::Tcp
                | Contender::Grpc => true,
                Contender::Zeromq => self.zeromq.is_some(),
                Contender::Nats => self.nats.is_some(),
            })
            .collect()
    }

    /// What `who` is and how it is tuned, for `bench.json`.
    pub(super) fn describe(&self, who: Contender) -> String {
        match who {
            Contender::Surelink => match self.cipher {
                Some(c) => format!(
                    "{} — TUNED: record_cipher = {c} on both ends",
                    surelink_pair::DESCRIPTION
                ),
                None => surelink_pair::DESCRIPTION.to_owned(),
            },
            Contender::SurelinkInsecure => {
                format!(
                    "{} — insecure = true (no handshake, no AEAD)",
                    surelink_pair::DESCRIPTION
                )
            }
            Contender::Tcp => tcp::DESCRIPTION.to_owned(),
            Contender::Zeromq => self
                .zeromq
                .as_ref()
                .map_or_else(String::new, ZmqContender::describe),
            Contender::Nats => self
                .nats
                .as_ref()
                .map_or_else(String::new, NatsContender::describe),
            Contender::Grpc => grpc::DESCRIPTION.to_owned(),
        }
    }

    /// One latency round of `who`: `callers` concurrent callers.
    pub(super) async fn latency_round(
        &mut self,
        who: Contender,
        payload: &Bytes,
        callers: usize,
        plan: &Plan,
    ) -> Result<(LatencyRound, Histogram<u64>)> {
        let caller = match who {
            Contender::Surelink => Caller::Surelink(self.surelink.client.clone()),
            Contender::SurelinkInsecure => Caller::Surelink(self.surelink_insecure.client.clone()),
            Contender::Tcp => Caller::Tcp(self.tcp.rpc.clone()),
            Contender::Nats => Caller::Nats(present(&self.nats, who)?.caller()),
            Contender::Grpc => Caller::Grpc(self.grpc.caller()),
            // Blocking sockets: callers on threads of their own.
            Contender::Zeromq => {
                return present_mut(&mut self.zeromq, who)?
                    .latency_round(payload, callers, plan)
                    .await;
            }
        };
        latency_round(&caller, payload, callers, plan).await
    }

    /// One throughput round of `who`.
    pub(super) async fn throughput_round(
        &mut self,
        who: Contender,
        payload: &Bytes,
        plan: &Plan,
    ) -> Result<ThroughputRound> {
        match who {
            Contender::Surelink => self.surelink.throughput_round(payload, plan).await,
            Contender::SurelinkInsecure => {
                self.surelink_insecure.throughput_round(payload, plan).await
            }
            Contender::Tcp => self.tcp.throughput_round(payload, plan).await,
            Contender::Zeromq => {
                present_mut(&mut self.zeromq, who)?
                    .throughput_round(payload, plan)
                    .await
            }
            Contender::Nats => {
                present(&self.nats, who)?
                    .throughput_round(payload, plan)
                    .await
            }
            Contender::Grpc => self.grpc.throughput_round(payload, plan).await,
        }
    }

    /// Stops every contender; returns what their servers reported that the
    /// report should mention (e.g. `nats-server` warnings).
    pub(super) async fn shutdown(self) -> Vec<String> {
        let mut notes = Vec::new();
        drop(self.tcp);
        if let Some(z) = self.zeromq {
            if let Err(e) = z.shutdown().await {
                eprintln!("warning: stopping ZeroMQ: {e:#}");
            }
        }
        if let Some(n) = self.nats {
            notes.extend(n.shutdown().await);
        }
        self.grpc.shutdown().await;
        self.surelink.shutdown().await;
        self.surelink_insecure.shutdown().await;
        notes
    }
}

/// The contender of an optional setup; notes (and prints) a skip.
fn ready<T>(
    who: Contender,
    setup: Setup<T>,
    skipped: &mut BTreeMap<Contender, String>,
) -> Option<T> {
    match setup {
        Setup::Ready(t) => Some(t),
        Setup::Skipped(why) => {
            eprintln!("SKIPPED {}: {why}", who.name());
            skipped.insert(who, why);
            None
        }
    }
}

fn present<T>(slot: &Option<T>, who: Contender) -> Result<&T> {
    slot.as_ref()
        .with_context(|| format!("{} was skipped at setup", who.name()))
}

fn present_mut<T>(slot: &mut Option<T>, who: Contender) -> Result<&mut T> {
    slot.as_mut()
        .with_context(|| format!("{} was skipped at setup", who.name()))
}

/// Messages and payload bytes delivered to a receiving application.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    msgs: AtomicU64,
    bytes: AtomicU64,
}

impl Delivered {
    pub(super) fn add(&self, payload_len: usize) {
        self.msgs.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(
            u64::try_from(payload_len).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(super) fn msgs(&self) -> u64 {
        self.msgs.load(Ordering::Relaxed)
    }

    pub(super) fn snapshot(&self) -> (u64, u64, Instant) {
        (
            self.msgs.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
            Instant::now(),
        )
    }
}
