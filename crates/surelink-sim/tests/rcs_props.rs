//! The recovery-conscious scheduler under random work, failures and
//! recoveries in random groups (every mapping): every task is dispatched
//! exactly once or handed back exactly once to be failed; nothing of a
//! recovering (or suspended) group is dispatched; no group runs past σ
//! except where the mapping allows; and a healthy group is never kept
//! waiting by a recovering one — a pool that serves it, with an idle
//! worker, gives it a task while it has room under σ.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use surelink_proto::rpc::recovery::{
    GroupEvent, GroupId, GroupState, Mapping, PoolId, RecoveryConfig, RecoveryPolicy,
    RecoveryScheduler, TaskOutcome,
};
use surelink_proto::rpc::{Priority, TicketKey};
use surelink_proto::{CallId, Time};

#[derive(Clone, Debug)]
enum Op {
    Push(u16),
    Pop(u16),
    /// Ends the `n`th running task with this outcome (0 ok, 1 failed, 2
    /// cancelled).
    Done(usize, u8),
    Recover(u16),
    CleanUp,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..4).prop_map(Op::Push),
        4 => (0u16..3).prop_map(Op::Pop),
        3 => (0usize..8, prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)])
            .prop_map(|(n, o)| Op::Done(n, o)),
        1 => (0u16..4).prop_map(Op::Recover),
        2 => Just(Op::CleanUp),
    ]
}

fn mapping() -> impl Strategy<Value = Mapping> {
    prop_oneof![
        Just(Mapping::PerformanceOriented),
        Just(Mapping::Static),
        Just(Mapping::PartiallyDynamic),
        Just(Mapping::Dynamic),
    ]
}

fn check(mapping: Mapping, fail_policy: [bool; 4], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut cfg = RecoveryConfig::new(3, 2, &["a", "b", "c", "d"]);
    cfg.mapping = mapping;
    cfg.groups[1].suspended_by = vec![GroupId(0)];
    cfg.groups[3].isolated = true;
    for (g, fail) in cfg.groups.iter_mut().zip(fail_policy) {
        if fail {
            g.policy = RecoveryPolicy::Fail;
        }
    }
    let sigma: Vec<usize> = (0..4).map(|g| cfg.sigma_of(g)).collect();
    let homes: Vec<Vec<PoolId>> = (0..4).map(|g| cfg.homes(g)).collect();
    let mut s = RecoveryScheduler::<u64>::new(&cfg).unwrap();
    let mut now = Time::ZERO;
    let mut next = 0u64;
    let mut pushed = BTreeSet::new();
    let mut dispatched = BTreeSet::new();
    let mut handed_back = BTreeSet::new();
    // (task, group, pool)
    let mut running: Vec<(u64, GroupId, PoolId)> = Vec::new();
    let mut to_clean: Vec<GroupId> = Vec::new();
    let mut recovering: BTreeMap<GroupId, bool> = BTreeMap::new();
    let held = |recovering: &BTreeMap<GroupId, bool>, g: GroupId| {
        mapping != Mapping::PerformanceOriented
            && (recovering.contains_key(&g)
                || (g == GroupId(1) && recovering.contains_key(&GroupId(0))))
    };
    for op in ops {
        now += std::time::Duration::from_millis(1);
        match *op {
            Op::Push(g) => {
                next += 1;
                let key = TicketKey {
                    session: next % 3,
                    call: CallId(next),
                };
                s.push(now, GroupId(g), key, Priority::Normal, next)
                    .unwrap();
                pushed.insert(next);
            }
            Op::Pop(p) => {
                let pool = PoolId(p);
                let got = s.pop(now, pool);
                if let Some(t) = &got {
                    let g = t.group;
                    prop_assert!(!held(&recovering, g), "{g} dispatched while held");
                    prop_assert!(dispatched.insert(t.dispatch.item), "dispatched twice");
                    running.push((t.dispatch.item, g, pool));
                    let n = running.iter().filter(|r| r.1 == g).count();
                    // Partially dynamic: a pool that would idle lends itself
                    // (past σ) to any group but the isolated one, which
                    // keeps to its homes and σ.
                    let may_lend = mapping == Mapping::PartiallyDynamic && g != GroupId(3);
                    if mapping != Mapping::PerformanceOriented && !may_lend {
                        prop_assert!(n <= sigma[usize::from(g.0)], "{g} past σ: {n}");
                    }
                    if mapping == Mapping::Static
                        || (mapping == Mapping::PartiallyDynamic && !may_lend)
                    {
                        prop_assert!(
                            homes[usize::from(g.0)].contains(&pool),
                            "{g} away from home"
                        );
                    }
                } else if s.busy(pool) < 2 {
                    // Isolation: no healthy group this pool serves is left
                    // waiting with room under σ.
                    for g in 0..4u16 {
                        let gid = GroupId(g);
                        let st = s.stats(gid).unwrap();
                        let serves = match mapping {
                            Mapping::Static | Mapping::PartiallyDynamic => {
                                homes[usize::from(g)].contains(&pool)
                            }
                            _ => true,
                        };
                        if serves && !held(&recovering, gid) && st.queued > 0 {
                            prop_assert!(
                                st.running >= st.sigma,
                                "{gid} waits on an idle worker of {pool}: {st:?}"
                            );
                        }
                    }
                }
                prop_assert!(s.busy(pool) <= 2);
            }
            Op::Done(n, o) => {
                if running.is_empty() {
                    continue;
                }
                let (_, g, pool) = running.remove(n % running.len());
                let outcome = match o {
                    0 => TaskOutcome::Completed,
                    1 => TaskOutcome::Failed,
                    _ => TaskOutcome::Cancelled,
                };
                s.handle_done(now, pool, g, outcome);
            }
            Op::Recover(g) => {
                s.enter_recovery(now, GroupId(g));
            }
            Op::CleanUp => {
                if let Some(g) = to_clean.pop() {
                    s.handle_cleanup_done(now, g).unwrap();
                }
            }
        }
        while let Some(e) = s.poll_event() {
            match e {
                GroupEvent::RecoveryStarted { group, .. } => {
                    recovering.insert(group, false);
                }
                GroupEvent::CleanUp { group } => {
                    prop_assert!(
                        running.iter().all(|r| r.1 != group),
                        "clean-up while running"
                    );
                    recovering.insert(group, true);
                    to_clean.push(group);
                }
                GroupEvent::Recovered { group, .. } => {
                    prop_assert_eq!(recovering.remove(&group), Some(true));
                }
                _ => {}
            }
        }
        while let Some((g, d)) = s.poll_failed() {
            prop_assert!(fail_policy[usize::from(g.0)], "handed back under re-drive");
            prop_assert!(handed_back.insert(d.item));
        }
        if let GroupState::Recovering { .. } = s.stats(GroupId(0)).unwrap().state {
            prop_assert!(
                s.stats(GroupId(1)).unwrap().suspended || recovering.contains_key(&GroupId(1))
            );
        }
    }
    // Finish: end what runs, clean up every recovery, take what is left.
    for (_, g, pool) in running.drain(..) {
        s.handle_done(now, pool, g, TaskOutcome::Completed);
    }
    for g in to_clean.drain(..) {
        s.handle_cleanup_done(now, g).unwrap();
    }
    for _ in 0..100 {
        while let Some(e) = s.poll_event() {
            if let GroupEvent::CleanUp { group } = e {
                s.handle_cleanup_done(now, group).unwrap();
            }
        }
        while let Some((_, d)) = s.poll_failed() {
            prop_assert!(handed_back.insert(d.item));
        }
        let mut any = false;
        for p in 0..3 {
            while let Some(t) = s.pop(now, PoolId(p)) {
                prop_assert!(dispatched.insert(t.dispatch.item), "dispatched twice");
                s.handle_done(now, t.pool, t.group, TaskOutcome::Completed);
                any = true;
            }
        }
        if !any && s.is_empty() {
            break;
        }
    }
    prop_assert!(s.is_empty(), "tasks left: {}", s.len());
    prop_assert!(dispatched.is_disjoint(&handed_back));
    let accounted: BTreeSet<u64> = dispatched.union(&handed_back).copied().collect();
    prop_assert_eq!(accounted, pushed, "every task once");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_task_once_and_healthy_groups_never_wait_on_a_recovering_one(
        m in mapping(),
        fail in proptest::array::uniform4(any::<bool>()),
        ops in proptest::collection::vec(op(), 0..300),
    ) {
        check(m, fail, &ops)?;
    }
}
