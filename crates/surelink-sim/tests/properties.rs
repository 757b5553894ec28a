//! Property test: random fault schedules against the promises.
//!
//! Each case draws a seed and a few knobs (nodes, paths, whether the failure
//! detector is modelled, whether a connection keeps FIFO order, whether
//! processes restart); the seed fixes the fault schedule, the latencies and
//! the workload (one-way messages, in bursts that leave as BATCH frames,
//! and — in half the cases — calls between every pair of nodes, each node
//! serving through the product's scheduler). Every run must hold every
//! promise (see `surelink_sim` checker): no loss, no duplicate, order per
//! stream, buffers within their bounds, every call run at most once and
//! answered with its own reply, and everything delivered, answered or
//! reported within the drain bound once faults and load stop. A failing
//! case prints a replay command.
//!
//! `PROPTEST_CASES` sets the number of cases (default 500).

use std::time::Duration;

use proptest::prelude::*;
use surelink_proto::secure::Protection;
use surelink_sim::{random_schedule, ScheduleSpec, Sim, SimConfig, SimReport};

#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    nodes: usize,
    paths: usize,
    detect: bool,
    fifo: bool,
    restarts: bool,
    faults: usize,
    /// Tiny buffers and a heavy load: backpressure and flow control at work.
    pressure: bool,
    /// Messages per send tick (above 1: BATCH frames).
    burst: usize,
    /// Nodes also call each other (requests, re-sends, at most once).
    calls: bool,
    /// Connections run the secure layer (Noise handshake, AEAD records),
    /// as the product does by default; only with FIFO links.
    secure: bool,
}

impl Case {
    fn encode(&self) -> String {
        format!(
            "seed={},nodes={},paths={},detect={},fifo={},restarts={},faults={},pressure={},burst={},calls={},secure={}",
            self.seed,
            self.nodes,
            self.paths,
            self.detect,
            self.fifo,
            self.restarts,
            self.faults,
            self.pressure,
            self.burst,
            self.calls,
            self.secure
        )
    }

    fn decode(s: &str) -> Option<Case> {
        let mut c = Case {
            seed: 0,
            nodes: 2,
            paths: 2,
            detect: true,
            fifo: true,
            restarts: false,
            faults: 6,
            pressure: false,
            burst: 1,
            calls: false,
            secure: false,
        };
        for kv in s.split(',') {
            let (k, v) = kv.split_once('=')?;
            match k.trim() {
                "seed" => c.seed = v.parse().ok()?,
                "nodes" => c.nodes = v.parse().ok()?,
                "paths" => c.paths = v.parse().ok()?,
                "detect" => c.detect = v.parse().ok()?,
                "fifo" => c.fifo = v.parse().ok()?,
                "restarts" => c.restarts = v.parse().ok()?,
                "faults" => c.faults = v.parse().ok()?,
                "pressure" => c.pressure = v.parse().ok()?,
                "burst" => c.burst = v.parse().ok()?,
                "calls" => c.calls = v.parse().ok()?,
                "secure" => c.secure = v.parse().ok()?,
                _ => return None,
            }
        }
        Some(c)
    }
}

fn drain_bound(cfg: &SimConfig) -> Duration {
    cfg.drain_bound()
}

fn faults_of(c: &Case) -> Vec<surelink_sim::Fault> {
    let links = c.nodes * (c.nodes - 1) / 2 * c.paths;
    random_schedule(c.seed, links, c.nodes, &spec(c))
}

fn spec(c: &Case) -> ScheduleSpec {
    ScheduleSpec {
        window: Duration::from_millis(1500),
        count: c.faults,
        max_duration: Duration::from_millis(800),
        restarts: c.restarts,
        pauses: true,
    }
}

fn run_case(c: &Case) -> (SimReport, SimConfig) {
    let mut cfg = SimConfig::small(c.seed);
    cfg.nodes = c.nodes;
    cfg.paths = c.paths;
    cfg.link.fifo = c.fifo;
    if c.secure && c.fifo {
        // The seed picks the protection mode and the authentication
        // (Noise with member keys, or mutual TLS with certificates).
        cfg.secure = Some(if c.seed % 2 == 0 {
            Protection::Encrypt
        } else {
            Protection::IntegrityOnly
        });
        cfg.tls = (c.seed >> 1) % 2 == 1;
    }
    if !c.detect {
        cfg.detect_after = None;
    }
    cfg.workload.until = Duration::from_millis(1500);
    cfg.workload.burst = c.burst;
    if c.calls {
        cfg.workload.call_every = Some(Duration::from_millis(3));
    }
    if c.pressure {
        cfg.endpoint.send_buffer = 24 << 10;
        cfg.endpoint.recv_window = 8 << 10;
        cfg.endpoint.path_inflight_limit = 6 << 10;
        cfg.endpoint.max_message_size = 2 << 10;
        cfg.workload.interval = Duration::from_micros(300);
        cfg.workload.max_len = 2 << 10;
    }
    let links = c.nodes * (c.nodes - 1) / 2 * c.paths;
    let faults = random_schedule(c.seed, links, c.nodes, &spec(c));
    let drain = std::env::var("SURELINK_SIM_DRAIN_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or_else(|| drain_bound(&cfg), Duration::from_millis);
    let report = Sim::new(cfg.clone(), &faults).run(drain);
    (report, cfg)
}

fn check(c: &Case) -> Result<SimReport, String> {
    let (r, _) = run_case(c);
    let replay = format!(
        "replay: SURELINK_SIM_REPLAY='{}' cargo test -p surelink-sim --test properties replay -- --nocapture",
        c.encode()
    );
    if !r.ok() {
        return Err(format!("{:#?}\n{replay}", r.violations));
    }
    if !c.restarts && (r.tally.delivered != r.tally.sent || r.tally.abandoned != 0) {
        // Without restarts no outage outlasts the linger time, so nothing may
        // be abandoned.
        return Err(format!("{:?}\n{replay}", r.tally));
    }
    if !c.restarts && r.calls.answered + r.calls.timed_out != r.calls.calls {
        // Without restarts every session lives: a call is answered, or its
        // caller gave up waiting.
        return Err(format!("{:?}\n{replay}", r.calls));
    }
    Ok(r)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn promises_hold_under_random_faults(
        seed in any::<u64>(),
        nodes in 2usize..=3,
        paths in 1usize..=3,
        detect in any::<bool>(),
        fifo in prop::bool::weighted(0.8),
        restarts in prop::bool::weighted(0.3),
        faults in 0usize..=8,
        pressure in prop::bool::weighted(0.25),
        burst in prop_oneof![3 => Just(1usize), 1 => 2usize..=12],
        calls in prop::bool::weighted(0.5),
        secure in prop::bool::weighted(0.5),
    ) {
        let c = Case { seed, nodes, paths, detect, fifo, restarts, faults, pressure, burst, calls, secure };
        if let Err(e) = check(&c) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// Re-runs one case with a trace of the simulator's events.
#[test]
fn replay() {
    let Ok(spec) = std::env::var("SURELINK_SIM_REPLAY") else {
        return;
    };
    let c = Case::decode(&spec).expect(
        "SURELINK_SIM_REPLAY: seed=..,nodes=..,paths=..,detect=..,fifo=..,restarts=..,faults=..",
    );
    let (r, cfg) = run_case(&c);
    eprintln!(
        "refused_full={} peak_cache={} peak_recv={}",
        r.refused_full, r.peak_cache, r.peak_recv
    );
    eprintln!(
        "{c:?}\ndrain bound {:?}\n{:?}\n{:?}\nbatches={} drained_at={:?} faults_end={:?}",
        drain_bound(&cfg),
        r.tally,
        r.calls,
        r.batches,
        r.drained_at,
        r.faults_end
    );
    for v in &r.violations {
        eprintln!("VIOLATION {v}");
    }
    eprintln!("faults: {:#?}", faults_of(&c));
    assert!(check(&c).is_ok());
}

/// The random cases above must really exercise batches, calls and the
/// secure layer under faults: a run of fixed seeds counts them (and keeps
/// every promise).
#[test]
fn batches_calls_and_the_secure_layer_are_exercised_under_faults() {
    let (mut batches, mut answered, mut executed, mut calls) = (0, 0, 0, 0);
    let (mut handshakes, mut broken) = (0, 0);
    for seed in 0..12u64 {
        let c = Case {
            seed,
            nodes: 2 + (seed % 2) as usize,
            paths: 2,
            detect: seed % 3 != 0,
            fifo: true,
            restarts: false,
            faults: 6,
            pressure: seed % 4 == 0,
            burst: 8,
            calls: true,
            secure: seed % 2 == 0,
        };
        let r = check(&c).unwrap_or_else(|e| panic!("{e}"));
        if !c.secure {
            assert_eq!(r.handshakes, 0, "plaintext runs have no handshake");
        }
        handshakes += r.handshakes;
        broken += r.records_refused;
        batches += r.batches;
        answered += r.calls.answered;
        executed += r.calls.executed;
        calls += r.calls.calls;
    }
    assert!(batches > 100, "{batches} batches");
    assert!(
        answered > 1000 && answered * 10 > calls * 9,
        "{answered} of {calls}"
    );
    assert!(executed >= answered, "{executed} ran, {answered} answered");
    // Six secure runs, at least two links each, both ends per handshake.
    assert!(handshakes >= 24, "{handshakes} handshake ends completed");
    assert!(broken > 0, "no record stream was ever broken by a fault");
}
