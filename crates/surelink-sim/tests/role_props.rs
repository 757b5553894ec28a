//! The role service's promises under random partitions, pauses and
//! crashes (virtual time, the product's gate, candidacy, role server,
//! fence and codec):
//!
//! - no node ever applies tables from two role servers interleaved: the
//!   epochs a node applies never go down, `(epoch, version)` only goes up,
//!   and every table comes from its epoch's owner;
//! - without partitions (pauses and crashes only, what SafeTimer's fence
//!   covers), the old server is fenced before the new one acts: once a
//!   candidate took epoch `e`, no server sends a table of an older epoch.
//!   (A table sent before may still arrive later — queued at a paused
//!   receiver — and is then refused by any node that already holds `e`:
//!   the epoch is the fencing token.)
//! - a table reaches every reachable node within a bound: at every tick,
//!   a node that has been connected to a serving server (no partition
//!   between them, neither paused nor crashed, the server's fence valid)
//!   for [`RoleScenario::reach_bound`] (2 refreshes + the one-way delay +
//!   a tick: 202 ms) holds the version that server had then, or a newer
//!   table;
//! - after the last fault, one server serves and every node holds its
//!   current table within [`RoleScenario::converge_bound`] (a restarted
//!   candidate's listen + a refresh + two delays + two ticks: 404 ms), and
//!   for good (to the end of the run, `BOUND` later).
//!
//! The bounds are derived from the configuration in their docs
//! (`surelink-sim/src/role.rs`). `bounds_survey` (ignored; run it with
//! `--ignored --nocapture`) prints how close random cases come to them.
//!
//! A failing case prints its scenario; paste it into `replay_one`.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use surelink_proto::Time;
use surelink_sim::role::{RoleFault, RoleOutcome, RoleScenario};

const NODES: usize = 5;
const CANDIDATES: usize = 3;
/// Simulated time after the last possible fault's end: the convergence
/// bound, with room to see that convergence lasts.
const BOUND: Duration = Duration::from_millis(1500);

fn fault(partitions: bool) -> impl Strategy<Value = RoleFault> {
    let at = (0u64..3000).prop_map(Duration::from_millis);
    let dur = (1u64..800).prop_map(Duration::from_millis);
    let node = 0..NODES;
    let pause = (at.clone(), dur.clone(), node.clone())
        .prop_map(|(at, dur, node)| RoleFault::Pause { at, dur, node });
    let crash = (at.clone(), dur.clone(), node.clone())
        .prop_map(|(at, down, node)| RoleFault::Crash { at, down, node });
    let path = (at.clone(), dur.clone(), node.clone(), node.clone(), 0u8..2)
        .prop_filter("two ends", |(_, _, a, b, _)| a != b)
        .prop_map(|(at, dur, a, b, network)| RoleFault::PathDown {
            at,
            dur,
            a,
            b,
            network,
        });
    let part = (at, dur, node.clone(), node)
        .prop_filter("two sides", |(_, _, a, b)| a != b)
        .prop_map(|(at, dur, a, b)| RoleFault::Partition { at, dur, a, b });
    if partitions {
        prop_oneof![pause, crash, path, part].boxed()
    } else {
        prop_oneof![pause, crash, path].boxed()
    }
}

fn scenario(partitions: bool) -> impl Strategy<Value = RoleScenario> {
    prop::collection::vec(fault(partitions), 0..6).prop_map(|faults| RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults,
        run: Duration::from_millis(3000 + 800 + 200) + BOUND,
        helper_load_swings: false,
    })
}

fn check_per_node(s: &RoleScenario, o: &RoleOutcome) -> Result<(), String> {
    let cfg = s.config();
    let mut last: HashMap<(usize, u32), (u64, u64)> = HashMap::new();
    for a in &o.applied {
        if cfg.owner(a.epoch) != Some(a.from) {
            return Err(format!("{a:?} not from its epoch's owner"));
        }
        if let Some(prev) = last.get(&(a.node, a.incarnation)) {
            if (a.epoch, a.version) <= *prev {
                return Err(format!("node {} applied {a:?} after {prev:?}", a.node));
            }
        }
        last.insert((a.node, a.incarnation), (a.epoch, a.version));
    }
    if o.decode_errors > 0 {
        return Err(format!(
            "{} role messages failed to decode",
            o.decode_errors
        ));
    }
    if o.ring_not_held > 0 {
        return Err(format!(
            "{} rows with ring changes found no base ring at their node",
            o.ring_not_held
        ));
    }
    if o.wrong_rings > 0 {
        return Err(format!(
            "{} rows applied with a ring their server did not push them with",
            o.wrong_rings
        ));
    }
    if o.helper_wrong > 0 {
        return Err(format!(
            "{} rows applied list a helper, address or level nobody reported",
            o.helper_wrong
        ));
    }
    Ok(())
}

fn check_fenced_before_takeover(o: &RoleOutcome) -> Result<(), String> {
    // Once a server acted in epoch `e` (its first push), nobody pushes an
    // older epoch.
    let mut first: Vec<(Time, usize, u64)> = Vec::new();
    for p in &o.pushes {
        if !first.iter().any(|f| f.2 == p.2) {
            first.push(*p);
        }
    }
    for (t, server, epoch) in &o.pushes {
        if let Some((tt, n, e)) = first.iter().find(|(tt, _, e)| *tt < *t && *e > *epoch) {
            return Err(format!(
                "node {server} pushed epoch {epoch} at {t:?}, after node {n} acted in epoch {e} at {tt:?}"
            ));
        }
    }
    Ok(())
}

fn check_reach(o: &RoleOutcome) -> Result<(), String> {
    match o.late.first() {
        None => Ok(()),
        Some(l) => Err(format!(
            "a table did not reach a connected node in time ({} node-ticks late); first: {l:?}",
            o.late_count
        )),
    }
}

fn check_converge_bound(s: &RoleScenario, o: &RoleOutcome) -> Result<(), String> {
    let due = o.faults_end + s.converge_bound();
    match o.converged_from {
        Some(t) if t <= due => Ok(()),
        other => Err(format!(
            "converged from {other:?}, due by {due:?} (faults ended {:?})",
            o.faults_end
        )),
    }
}

fn check_converged(o: &RoleOutcome) -> Result<(), String> {
    let [(server, epoch, version)] = o.serving_at_end[..] else {
        return Err(format!("serving at the end: {:?}", o.serving_at_end));
    };
    for (i, held) in o.held_at_end.iter().enumerate() {
        if *held != Some((epoch, version)) {
            return Err(format!(
                "node {i} holds {held:?}, node {server} serves ({epoch}, {version})"
            ));
        }
    }
    Ok(())
}

fn check_all(s: &RoleScenario, partitions: bool) -> Result<(), String> {
    let o = s.run();
    check_per_node(s, &o)?;
    if !partitions {
        check_fenced_before_takeover(&o)?;
    }
    check_reach(&o)?;
    check_converge_bound(s, &o)?;
    check_converged(&o)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pauses_and_crashes_fence_the_old_server_first(s in scenario(false)) {
        if let Err(e) = check_all(&s, false) {
            prop_assert!(false, "{e}\nscenario: {s:?}");
        }
    }

    #[test]
    fn partitions_never_interleave_tables_at_a_node(s in scenario(true)) {
        if let Err(e) = check_all(&s, true) {
            prop_assert!(false, "{e}\nscenario: {s:?}");
        }
    }
}

#[test]
fn the_first_candidate_serves_a_quiet_cluster() {
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: Vec::new(),
        run: Duration::from_millis(1000),
        helper_load_swings: false,
    };
    let o = s.run();
    assert_eq!(o.serving_at_end.len(), 1);
    assert_eq!(o.serving_at_end[0].0, 0);
    assert_eq!(o.serving_at_end[0].1, 1);
    check_converged(&o).unwrap();
}

/// The last node is a helper whose load doubles and halves every
/// 350 ms: its levels reach every node's row, each change of them alone
/// at most once a second (the hold), never a level it did not report.
#[test]
fn a_helpers_load_levels_reach_every_row_at_most_once_a_second() {
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: Vec::new(),
        run: Duration::from_millis(6000),
        helper_load_swings: true,
    };
    let o = s.run();
    check_per_node(&s, &o).unwrap();
    assert!(o.helper_levels.len() >= 3, "{:?}", o.helper_levels);
    assert!(o.helper_rows > 0);
    // Versions the quiet cluster's server made: its first, then only
    // the helper's news, held a second apart (≤ 6 in 6 s, and more than
    // one: the levels did change).
    let versions: HashSet<u64> = o.applied.iter().map(|a| a.version).collect();
    eprintln!(
        "levels reported {:?}; versions applied {}",
        o.helper_levels,
        versions.len()
    );
    assert!((2..=7).contains(&versions.len()), "versions {versions:?}");
}

#[test]
fn a_paused_role_server_is_replaced_and_never_pushes_again() {
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: vec![RoleFault::Pause {
            at: Duration::from_millis(500),
            dur: Duration::from_millis(600),
            node: 0,
        }],
        run: Duration::from_millis(3000),
        helper_load_swings: false,
    };
    let o = s.run();
    check_per_node(&s, &o).unwrap();
    check_fenced_before_takeover(&o).unwrap();
    check_converged(&o).unwrap();
    let took = o
        .takeovers
        .iter()
        .find(|(_, n, _)| *n == 1)
        .expect("node 1 took over");
    assert_eq!(took.2, 2);
    assert!(!o
        .pushes
        .iter()
        .any(|(t, n, e)| *n == 0 && *e == 1 && *t > took.0));
}

#[test]
fn a_partition_heals_and_the_table_follows_within_the_bound() {
    // The first candidate's table is lost on the partition to node 4;
    // once it heals the next re-push reaches it.
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: vec![RoleFault::Partition {
            at: Duration::from_millis(200),
            dur: Duration::from_millis(700),
            a: 0,
            b: 4,
        }],
        run: Duration::from_millis(2500),
        helper_load_swings: false,
    };
    let o = s.run();
    check_per_node(&s, &o).unwrap();
    check_reach(&o).unwrap();
    check_converge_bound(&s, &o).unwrap();
    check_converged(&o).unwrap();
    // Node 4 got the first table only after the partition.
    let first = o.applied.iter().find(|a| a.node == 4).unwrap();
    assert!(first.at >= Time::from_millis(900), "{first:?}");
    assert!(
        first.at <= Time::from_millis(900) + s.reach_bound(),
        "{first:?}"
    );
}

#[test]
fn a_path_fault_sends_rows_with_the_ring_as_changes() {
    // Nodes 2 and 3's path on network 1 fails: their route changes, the
    // ring does not, and nodes that acknowledged it get rows with no ring
    // changes — each filled in with the right ring (`check_per_node`).
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: vec![RoleFault::PathDown {
            at: Duration::from_millis(600),
            dur: Duration::from_millis(700),
            a: 2,
            b: 3,
            network: 1,
        }],
        run: Duration::from_millis(2500),
        helper_load_swings: false,
    };
    let o = s.run();
    check_per_node(&s, &o).unwrap();
    check_converge_bound(&s, &o).unwrap();
    check_converged(&o).unwrap();
    assert!(o.delta_rows > 0, "no row went with its ring as changes");
}

#[test]
fn a_paused_node_comes_back_as_ring_changes() {
    // Node 5 pauses past the stale window and the detector's peer window:
    // its ring state changes (suspect, down, up again) and the nodes that
    // acknowledged the ring before get the changed member only.
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: vec![RoleFault::Pause {
            at: Duration::from_millis(600),
            dur: Duration::from_millis(2500),
            node: 4,
        }],
        run: Duration::from_millis(5000),
        helper_load_swings: false,
    };
    let o = s.run();
    check_per_node(&s, &o).unwrap();
    check_converged(&o).unwrap();
    assert!(o.ring_change_rows > 0, "no row changed the ring as changes");
}

/// How close random cases come to the bounds: the largest time from a
/// partition's end (or a node's resumption) to the node holding the
/// server's table is not observable directly, so this prints the margins
/// the two checks leave: the latest convergence after the faults, against
/// `converge_bound`, and whether any case was late.
#[test]
#[ignore = "a survey: run with --ignored --nocapture"]
fn bounds_survey() {
    let cases: u32 = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mut runner = TestRunner::deterministic();
    let mut worst = Duration::ZERO;
    let mut worst_case = None;
    let mut late = 0;
    let mut lag = Duration::ZERO;
    for i in 0..cases {
        let s = scenario(i % 2 == 0)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let o = s.run();
        late += o.late_count;
        lag = lag.max(o.max_reach_lag);
        if let Some(t) = o.converged_from {
            let d = t.saturating_since(o.faults_end);
            if d > worst {
                worst = d;
                worst_case = Some(s.clone());
            }
        }
    }
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: Vec::new(),
        run: Duration::ZERO,
        helper_load_swings: false,
    };
    println!(
        "{cases} cases: latest convergence {worst:?} after the faults (bound {:?}); \
         longest a connected node went without the server's table {lag:?}, late node-ticks {late} (reach bound {:?})\nworst: {worst_case:?}",
        s.converge_bound(),
        s.reach_bound()
    );
}

#[test]
fn replay_one() {
    // Paste a failing scenario's faults here to debug it.
    let s = RoleScenario {
        nodes: NODES,
        candidates: CANDIDATES,
        faults: vec![],
        run: Duration::from_millis(2000),
        helper_load_swings: false,
    };
    check_all(&s, true).unwrap();
}
