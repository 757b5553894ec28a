//! Property test: PostMan helpers (issue 28) crash, freeze and are cut off
//! under load, and every promise holds for the client they carry — each
//! message once and in order, each call run at most once and answered
//! with its own reply, nothing left neither delivered nor reported.
//!
//! Two nodes (a client and a server) with two paths: path 1 always goes
//! through a helper (the core's batcher and relay records in the path,
//! see the simulator's `helper` module); in half the cases path 0 goes
//! through a second helper too, so the client moves between helpers
//! rather than to a direct path. The seed draws the faults — helper
//! crashes, helper freezes, helper cut off (its link down), process
//! pauses — the latencies and the workload (one-way messages in bursts,
//! calls every 3 ms). `PROPTEST_CASES` sets the number of cases
//! (default 200).

use std::time::Duration;

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use surelink_proto::helper::{AdaptiveConfig, BatchPolicy};
use surelink_proto::secure::Protection;
use surelink_sim::{Fault, Sim, SimConfig, SimReport};

#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    /// Path 0 goes through a helper too.
    both: bool,
    faults: usize,
    secure: bool,
    /// PostMan's Algorithm 1 instead of self-clocking.
    adaptive: bool,
    burst: usize,
}

fn faults_of(c: &Case) -> Vec<Fault> {
    let mut rng = ChaCha8Rng::seed_from_u64(c.seed ^ 0x4E1F);
    let helper_links: Vec<usize> = if c.both { vec![0, 1] } else { vec![1] };
    let mut out = Vec::new();
    for _ in 0..c.faults {
        let at = Duration::from_millis(rng.random_range(0..1500));
        let dur = Duration::from_millis(rng.random_range(1..=800));
        let link = helper_links[rng.random_range(0..helper_links.len())];
        out.push(match rng.random_range(0..5) {
            0 | 1 => Fault::HelperCrash { link, at },
            2 => Fault::HelperPause { link, at, dur },
            3 => Fault::LinkDown { link, at, dur },
            _ => Fault::Pause {
                node: rng.random_range(0..2),
                at,
                dur: dur / 4,
            },
        });
    }
    out
}

fn config(c: &Case) -> SimConfig {
    let mut cfg = SimConfig::small(c.seed);
    cfg.nodes = 2;
    cfg.paths = 2;
    cfg.helper_links = if c.both { vec![0, 1] } else { vec![1] };
    if c.adaptive {
        cfg.helper_batching.policy = BatchPolicy::Adaptive(AdaptiveConfig::default());
    }
    if c.secure {
        cfg.secure = Some(Protection::Encrypt);
    }
    cfg.workload.until = Duration::from_millis(1500);
    cfg.workload.burst = c.burst;
    cfg.workload.call_every = Some(Duration::from_millis(3));
    cfg
}

fn drain_bound(cfg: &SimConfig) -> Duration {
    cfg.drain_bound()
}

fn check(c: &Case) -> Result<SimReport, String> {
    let cfg = config(c);
    let r = Sim::new(cfg.clone(), &faults_of(c)).run(drain_bound(&cfg));
    let why = format!("{c:?}\nfaults: {:?}", faults_of(c));
    if !r.ok() {
        return Err(format!("{:#?}\n{why}", r.violations));
    }
    if r.tally.delivered != r.tally.sent || r.tally.abandoned != 0 {
        return Err(format!("not every message delivered: {:?}\n{why}", r.tally));
    }
    if r.calls.answered + r.calls.timed_out != r.calls.calls {
        return Err(format!(
            "a call neither answered nor timed out: {:?}\n{why}",
            r.calls
        ));
    }
    if r.helper_records == 0 {
        return Err(format!("the helpers carried nothing\n{why}"));
    }
    Ok(r)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn helpers_crash_freeze_and_are_cut_off_and_every_promise_holds(
        seed in any::<u64>(),
        both in any::<bool>(),
        faults in 1usize..=6,
        secure in any::<bool>(),
        adaptive in prop::bool::weighted(0.3),
        burst in prop_oneof![3 => Just(1usize), 1 => 2usize..=8],
    ) {
        let c = Case { seed, both, faults, secure, adaptive, burst };
        if let Err(e) = check(&c) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// The helpers really batch: with no fault, most of the traffic goes
/// through them, several records to a batch at times, and all of it
/// arrives.
#[test]
fn helpers_carry_and_batch_the_traffic() {
    let c = Case {
        seed: 7,
        both: true,
        faults: 0,
        secure: true,
        adaptive: false,
        burst: 4,
    };
    let r = check(&c).unwrap();
    eprintln!(
        "{:?} {:?} helper batches={} records={}",
        r.tally, r.calls, r.helper_batches, r.helper_records
    );
    assert!(
        r.helper_records > 500,
        "records carried: {}",
        r.helper_records
    );
    assert!(
        r.helper_records > r.helper_batches,
        "{} records in {} batches: some batches hold several",
        r.helper_records,
        r.helper_batches
    );
    assert!(r.calls.answered > 100, "{:?}", r.calls);
}

/// A helper crash with traffic in flight is survived by re-sending: the
/// sessions re-send what the dead helper held, and nothing is lost.
#[test]
fn a_helper_crash_under_load_is_survived_by_re_sending() {
    let c = Case {
        seed: 11,
        both: true,
        faults: 0,
        secure: false,
        adaptive: false,
        burst: 4,
    };
    let cfg = config(&c);
    let faults = [
        Fault::HelperCrash {
            link: 0,
            at: Duration::from_millis(400),
        },
        Fault::HelperCrash {
            link: 1,
            at: Duration::from_millis(401),
        },
        Fault::HelperPause {
            link: 1,
            at: Duration::from_millis(900),
            dur: Duration::from_millis(300),
        },
    ];
    let r = Sim::new(cfg.clone(), &faults).run(drain_bound(&cfg));
    eprintln!(
        "{:?} {:?} resent={} helper batches={} records={}",
        r.tally, r.calls, r.resent, r.helper_batches, r.helper_records
    );
    assert!(r.ok(), "{:#?}", r.violations);
    assert_eq!(r.tally.delivered, r.tally.sent);
    assert_eq!(r.tally.abandoned, 0);
    assert!(
        r.resent > 0,
        "the crash lost frames in flight, re-sent: {}",
        r.resent
    );
}
