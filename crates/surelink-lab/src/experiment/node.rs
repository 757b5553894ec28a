//! `surelink-lab experiment-node`: one endpoint in its own process, driven by
//! an experiment (which may SIGSTOP or kill it).
//!
//! It prints JSON lines on stdout, each with `t` (wall clock, µs since the
//! Unix epoch, comparable across processes on one host) and `ev`:
//! `ready` (with its listen and heartbeat addresses), `peer_up`,
//! `path_silent`, `path_heard`, `peer_dead`, `peer_alive`, `fenced`,
//! `session_ended`, and on the receiving side one `msg` per message (the
//! sender's epoch and sequence number). It reads commands on stdin:
//! `delay reader|checker|sender MS`, `rcvbuf BYTES`, `quit`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::json;
use surelink::proto::{ClusterId, NodeId};
use surelink::{Config, DelayPoint, DetectorConfig, DetectorMode, Endpoint, NetEvent, PeerConfig};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::node_counts::{summary, Counts, ServerOrder, StreamCheck};

/// The cluster of experiment nodes.
pub(crate) const CLUSTER: ClusterId = ClusterId(0x5afe);
/// The receiving node.
pub(crate) const RECEIVER: NodeId = NodeId(1);
/// The sending node.
pub(crate) const SENDER: NodeId = NodeId(2);

/// Which side of the experiment a node plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Role {
    /// Listens, receives the stream, reports the sender.
    Receiver,
    /// Dials the receiver and streams one-way messages to it.
    Sender,
}

/// The detector a node runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// SafeTimer checks and the send fence.
    Safetimer,
    /// A plain timeout.
    Plain,
}

/// Arguments of `surelink-lab experiment-node`.
#[derive(Args, Debug, Clone)]
pub(crate) struct NodeArgs {
    /// Receiver or sender.
    #[arg(long, value_enum)]
    pub(crate) role: Role,
    /// Detector mode.
    #[arg(long, value_enum, default_value = "safetimer")]
    pub(crate) mode: Mode,
    /// Heartbeat interval, ms. Without it (and the four below) the node
    /// runs the product's default detector; with it, the compact profile
    /// `DetectorConfig::with_interval` — a labelled tuning.
    #[arg(long)]
    pub(crate) interval_ms: Option<u64>,
    /// Peer window (the timeout), ms.
    #[arg(long)]
    pub(crate) timeout_ms: Option<u64>,
    /// Path window, ms.
    #[arg(long)]
    pub(crate) path_timeout_ms: Option<u64>,
    /// Sender slack, ms.
    #[arg(long)]
    pub(crate) slack_ms: Option<u64>,
    /// Assumed network delay bound, ms.
    #[arg(long)]
    pub(crate) network_delay_ms: Option<u64>,
    /// Data as heartbeats (`DetectorConfig::data_as_heartbeat`): `true` or
    /// `false`; without it, the product's default.
    #[arg(long)]
    pub(crate) data_as_heartbeat: Option<bool>,
    /// The pace following answers (`DetectorConfig::answer_grace`), ms;
    /// 0: off; absent: the product's default (10 ms; off with
    /// `--interval-ms`, a labelled tuning).
    #[arg(long)]
    pub(crate) answer_grace_ms: Option<u64>,
    /// Local addresses, one per network (port 0: any).
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) local: Vec<SocketAddr>,
    /// The receiver's addresses (sender only).
    #[arg(long, value_delimiter = ',')]
    pub(crate) peer: Vec<SocketAddr>,
    /// Sender: one message every this many ms (0: none).
    #[arg(long, default_value_t = 1)]
    pub(crate) stream_ms: u64,
    /// Sender: one call every this many ms (0: none); prints a `reply`
    /// line per answer. The receiver answers with the request's first 64
    /// bytes.
    #[arg(long, default_value_t = 0)]
    pub(crate) calls_ms: u64,
    /// Sender: request size, bytes: `N`, or `MIN-MAX` for sizes spread
    /// log-uniformly between them (fixed per request id).
    #[arg(long, default_value = "64", value_parser = parse_sizes)]
    pub(crate) call_bytes: (usize, usize),
    /// Sender: stream with `send` (waits while the session is full, so
    /// every message counts) instead of `try_send` (drops its own message
    /// when full or fenced).
    #[arg(long)]
    pub(crate) reliable: bool,
    /// Print counts once a second and at `quit` instead of a line per
    /// message or reply; the receiver checks the stream's order itself.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Directory with `node-<id>.key` / `node-<id>.pub` for both nodes
    /// (made by the experiment that starts the node; missing ones are
    /// made here).
    #[arg(long, required_unless_present = "insecure")]
    pub(crate) key_dir: Option<std::path::PathBuf>,
    /// No authentication or encryption (the `insecure` setting).
    #[arg(long)]
    pub(crate) insecure: bool,
}

pub(crate) fn parse_sizes(s: &str) -> Result<(usize, usize), String> {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let n = |x: &str| x.trim().parse::<usize>().map_err(|e| format!("{x:?}: {e}"));
    let (lo, hi) = (n(lo)?, n(hi)?);
    if lo < 8 || hi < lo {
        return Err(format!("sizes need 8 <= MIN <= MAX, got {lo}-{hi}"));
    }
    Ok((lo, hi))
}

/// SplitMix64's output function: a well-mixed 64-bit value from `x`
/// (request sizes from ids, the soak's fault schedule from its seed).
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Request `id`'s size: log-uniform in `lo..=hi`, the same for an id in
/// every run (a hash of the id, not a random draw).
pub(crate) fn request_size((lo, hi): (usize, usize), id: u64) -> usize {
    if lo == hi {
        return lo;
    }
    let z = splitmix64(id);
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
    ((l + u * (h - l)).exp().round() as usize).clamp(lo, hi)
}

impl NodeArgs {
    /// The product's default detector, unless settings are given.
    pub(crate) fn detector(&self) -> DetectorConfig {
        let ms = Duration::from_millis;
        let mut d = match self.interval_ms {
            None => DetectorConfig::default(),
            Some(i) => {
                let mut d = DetectorConfig::with_interval(ms(i));
                d.check_every = (ms(i) / 2).max(Duration::from_millis(1));
                d.barrier_timeout = ms(i).max(Duration::from_millis(5));
                d
            }
        };
        d.mode = match self.mode {
            Mode::Safetimer => DetectorMode::SafeTimer,
            Mode::Plain => DetectorMode::Plain,
        };
        if let Some(t) = self.timeout_ms {
            d.timeout = ms(t);
            d.path_timeout = ms(t);
        }
        if let Some(t) = self.path_timeout_ms {
            d.path_timeout = ms(t);
        }
        if let Some(t) = self.slack_ms {
            d.send_slack = ms(t);
        }
        if let Some(t) = self.network_delay_ms {
            d.max_network_delay = ms(t);
        }
        if let Some(on) = self.data_as_heartbeat {
            d.data_as_heartbeat = on;
        }
        if let Some(g) = self.answer_grace_ms {
            d.answer_grace = (g > 0).then(|| ms(g));
        }
        if self.interval_ms.is_some() {
            // Windows given in busy intervals: the idle pace fits in what
            // the peer window leaves after the slack and the delay, and an
            // idle path's window holds two of its heartbeats.
            let room = d.timeout.saturating_sub(d.send_slack + d.max_network_delay);
            d.idle_interval = d.idle_interval.min(room).max(d.interval);
            d.idle_path_timeout = d
                .idle_path_timeout
                .max(d.idle_interval * 2 + d.max_network_delay)
                .max(d.path_timeout);
        }
        d
    }
}

/// The wall-clock time (µs) of a timer tick's *scheduled* instant: a
/// request counts from when it was due, not from when a blocked or busy
/// client got to it (no coordinated omission).
pub(crate) fn scheduled_wall_us(at: tokio::time::Instant) -> u64 {
    let now = tokio::time::Instant::now();
    let behind = u64::try_from(now.saturating_duration_since(at).as_micros()).unwrap_or(0);
    wall_us().saturating_sub(behind)
}

/// Wall clock in µs since the Unix epoch.
pub(crate) fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn emit(v: serde_json::Value) {
    println!("{v}");
}

fn event_json(e: &NetEvent) -> Option<serde_json::Value> {
    let t = wall_us();
    Some(match e {
        NetEvent::PeerUp { peer, epoch } => {
            json!({"t": t, "ev": "peer_up", "peer": peer.0, "epoch": epoch.0})
        }
        NetEvent::PathSilent {
            peer,
            network,
            silent_for_us,
        } => json!({"t": t, "ev": "path_silent", "peer": peer.0, "network": network,
                    "silent_for_us": silent_for_us}),
        NetEvent::PathHeard { peer, network } => {
            json!({"t": t, "ev": "path_heard", "peer": peer.0, "network": network})
        }
        NetEvent::PeerDead { peer } => json!({"t": t, "ev": "peer_dead", "peer": peer.0}),
        NetEvent::PeerAlive { peer } => json!({"t": t, "ev": "peer_alive", "peer": peer.0}),
        NetEvent::Fenced {
            old_epoch,
            new_epoch,
            ..
        } => json!({"t": t, "ev": "fenced", "old_epoch": old_epoch.0, "new_epoch": new_epoch.0}),
        NetEvent::SessionEnded { peer, reason, .. } => {
            json!({"t": t, "ev": "session_ended", "peer": peer.0, "reason": format!("{reason:?}")})
        }
        _ => return None,
    })
}

/// Runs one node until `quit` or the end of stdin.
pub(crate) async fn run(args: &NodeArgs) -> Result<()> {
    let (node, peer) = match args.role {
        Role::Receiver => (RECEIVER, None),
        Role::Sender => (SENDER, Some(RECEIVER)),
    };
    let mut cfg = Config::new(node, CLUSTER);
    cfg.detector = args.detector();
    cfg.insecure = args.insecure;
    if let Some(dir) = &args.key_dir {
        // Both nodes' keys, made by whichever node starts first (an
        // experiment makes them before starting either).
        surelink_node::keys::make_key_dir(dir, &[RECEIVER, SENDER])?;
        let (keys, members) = surelink_node::keys::load_key_dir(dir, node, &[RECEIVER, SENDER])?;
        cfg.identity = Some(keys);
        for (n, k) in members {
            cfg.members.insert(n, k)?;
        }
    }
    match args.role {
        Role::Receiver => cfg.listen = args.local.clone(),
        Role::Sender => {
            if args.peer.len() != args.local.len() {
                bail!("--peer needs one address per --local network");
            }
            cfg.dial_from = args.local.clone();
            cfg.peers = vec![PeerConfig::new(
                RECEIVER,
                args.peer.iter().copied().map(Some).collect(),
            )];
        }
    }
    let ep = Endpoint::bind(cfg).await.context("binding the node")?;
    let mut events = ep.events();
    // (A session that came up before this subscription is replayed to it
    // as PeerUp: no event is missed.)
    // The receiver counts, per request id (its first 8 bytes), how often
    // it ran and whether it came after a later one: printed at `quit`.
    let order = Arc::new(Mutex::new(ServerOrder::default()));
    if args.role == Role::Receiver {
        let order = order.clone();
        ep.serve(move |r: surelink::Request| {
            if let Some(id) = r.body.get(..8) {
                let id = u64::from_be_bytes(id.try_into().unwrap_or_default());
                order.lock().saw(id);
            }
            let n = r.body.len().min(64);
            async move { r.body.slice(..n) }
        });
    }
    emit(json!({
        "t": wall_us(), "ev": "ready", "node": node.0, "epoch": ep.epoch().0,
        "listen": ep.local_addrs().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "heartbeat": ep.heartbeat_addrs().iter().map(ToString::to_string).collect::<Vec<_>>(),
    }));
    let counts = Arc::new(Counts::default());
    let check = Arc::new(Mutex::new(StreamCheck::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(peer) = peer {
        if args.calls_ms > 0 {
            let ep = ep.clone();
            let every = Duration::from_millis(args.calls_ms);
            let (sizes, quiet) = (args.call_bytes, args.quiet);
            let (counts, mut stop) = (counts.clone(), stop_rx.clone());
            tokio::spawn(async move {
                // One task issues the calls in id order (each call's first
                // poll sends it), so the server can check the order they
                // arrive in; replies are printed as they complete.
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut pending = FuturesUnordered::new();
                let mut next_id = 0u64;
                loop {
                    tokio::select! {
                        at = tick.tick(), if !*stop.borrow() => {
                            let sent = scheduled_wall_us(at);
                            let id = next_id;
                            next_id += 1;
                            counts.calls.fetch_add(1, Relaxed);
                            let ep = ep.clone();
                            let outages = counts.outages.load(Relaxed);
                            pending.push(async move {
                                let mut body = vec![0u8; request_size(sizes, id)];
                                body[..8].copy_from_slice(&id.to_be_bytes());
                                let r = ep.call(peer, 0, Bytes::from(body), Duration::from_secs(30)).await;
                                (id, sent, outages, r)
                            });
                        }
                        Some((id, sent, outages, r)) = pending.next() => match r {
                            Ok(r) => {
                                counts.replies.fetch_add(1, Relaxed);
                                let took = wall_us().saturating_sub(sent);
                                // Made and answered with no outage of every
                                // link in between (the controller says when).
                                let now_outages = counts.outages.load(Relaxed);
                                let pathful = outages % 2 == 0 && now_outages == outages;
                                counts.record_rtt(took, pathful);
                                if !pathful && now_outages % 2 == 0 {
                                    // How long it still took once every
                                    // link was back: the recovery's share.
                                    let off = counts.outage_off_us.load(Relaxed);
                                    counts.record_after_outage(wall_us().saturating_sub(off.max(sent)));
                                }
                                if quiet && took > 100_000 {
                                    // Slow calls are worth a line even when quiet.
                                    emit(json!({"t": wall_us(), "ev": "slow_call", "id": id, "sent": sent, "us": took}));
                                }
                                let echoed = r
                                    .get(..8)
                                    .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default()));
                                if echoed != Some(id) {
                                    counts.wrong.fetch_add(1, Relaxed);
                                }
                                if !quiet {
                                    emit(json!({"t": wall_us(), "ev": "reply", "id": id, "sent": sent, "echo": echoed}));
                                }
                            }
                            Err(e) => {
                                counts.call_errors.fetch_add(1, Relaxed);
                                emit(json!({"t": wall_us(), "ev": "call_error", "id": id, "error": e.to_string()}));
                            }
                        },
                        _ = stop.changed(), if !*stop.borrow() => {}
                        else => break,
                    }
                }
            });
        }
        if args.stream_ms > 0 {
            let ep = ep.clone();
            let every = Duration::from_millis(args.stream_ms);
            let (reliable, counts, stop) = (args.reliable, counts.clone(), stop_rx.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut seq = 0u64;
                while !*stop.borrow() {
                    tick.tick().await;
                    let epoch = ep.epoch().0;
                    let mut body = Vec::with_capacity(16);
                    body.extend_from_slice(&epoch.to_be_bytes());
                    body.extend_from_slice(&seq.to_be_bytes());
                    if reliable {
                        // Every message counts: the receiver must see
                        // 0, 1, 2, ... exactly.
                        if let Err(e) = ep.send(peer, 0, Bytes::from(body)).await {
                            emit(
                                json!({"t": wall_us(), "ev": "send_error", "seq": seq, "error": e.to_string()}),
                            );
                            continue;
                        }
                    } else {
                        // try_send: a fenced or cut-off sender drops its
                        // own stream rather than queue it (the detector
                        // experiment counts arrivals, not completeness).
                        let _ = ep.try_send(peer, 0, Bytes::from(body));
                        if ep.epoch().0 != epoch {
                            // A fence came between reading the epoch and
                            // queueing: the message went out under the new
                            // epoch with the old one in its body.
                            emit(json!({"t": wall_us(), "ev": "epoch_race", "seq": seq}));
                        }
                    }
                    seq += 1;
                    counts.sent.store(seq, Relaxed);
                }
            });
        }
    } else {
        let ep = ep.clone();
        let (quiet, check) = (args.quiet, check.clone());
        tokio::spawn(async move {
            while let Some(m) = ep.recv().await {
                let b = &m.body;
                if b.len() >= 16 {
                    let epoch = u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
                    let seq = u64::from_be_bytes(b[8..16].try_into().unwrap_or_default());
                    if quiet {
                        check.lock().saw(epoch, seq);
                    } else {
                        emit(json!({"t": wall_us(), "ev": "msg", "epoch": epoch, "seq": seq}));
                    }
                }
            }
        });
    }
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut progress = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = progress.tick(), if args.quiet => emit(summary(args.role, &counts, &check, &order, "progress")),
            e = events.recv() => match e {
                Ok(e) => if let Some(v) = event_json(&e) { emit(v) },
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => break,
            },
            line = stdin.next_line() => {
                let Some(line) = line? else { break };
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["quit"] => break,
                    // Stops the stream and the calls (what is in flight
                    // still completes).
                    ["stop"] => {
                        let _ = stop_tx.send(true);
                    }
                    ["delay", what, ms] => {
                        let point = match *what {
                            "reader" => DelayPoint::Reader,
                            "checker" => DelayPoint::Checker,
                            "sender" => DelayPoint::Sender,
                            other => bail!("unknown delay point {other}"),
                        };
                        ep.testing().inject_delay(point, Duration::from_millis(ms.parse()?));
                    }
                    ["rcvbuf", bytes] => ep.testing().set_heartbeat_recv_buffer(bytes.parse()?)?,
                    // The controller cut (or restored) every link: calls
                    // overlapping that are counted apart.
                    ["outage", on_off @ ("on" | "off")] => {
                        if *on_off == "off" {
                            counts.outage_off_us.store(wall_us(), Relaxed);
                        }
                        counts.outages.fetch_add(1, Relaxed);
                    }
                    _ => bail!("unknown command {line:?}"),
                }
                emit(json!({"t": wall_us(), "ev": "ack", "cmd": line}));
            }
        }
    }
    if args.role == Role::Receiver {
        let o = order.lock();
        emit(
            json!({"t": wall_us(), "ev": "server_order", "requests": o.runs.len(),
                    "reordered": o.reordered, "duplicated": o.duplicated}),
        );
    }
    if args.quiet {
        emit(summary(args.role, &counts, &check, &order, "final"));
    }
    ep.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_sizes_stay_in_range_and_repeat() {
        let r = (1024, 102_400);
        let sizes: Vec<usize> = (0..10_000).map(|id| request_size(r, id)).collect();
        assert!(sizes.iter().all(|s| (1024..=102_400).contains(s)));
        assert_eq!(sizes[17], request_size(r, 17), "same id, same size");
        // Log-uniform: about half below the geometric mean (10 KiB).
        let below = sizes.iter().filter(|s| **s < 10_240).count();
        assert!(
            (4_000..6_000).contains(&below),
            "{below} of 10 000 below 10 KiB"
        );
        assert_eq!(request_size((64, 64), 5), 64);
    }

    #[test]
    fn size_ranges_are_checked() {
        assert_eq!(parse_sizes("64"), Ok((64, 64)));
        assert_eq!(parse_sizes("1024-102400"), Ok((1024, 102_400)));
        assert!(parse_sizes("4").is_err(), "shorter than the id");
        assert!(parse_sizes("100-10").is_err());
        assert!(parse_sizes("x").is_err());
    }
}
