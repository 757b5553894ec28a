use super::*;
use crate::ids::CallId;

fn t(ms: u64) -> Time {
    Time::from_millis(ms)
}

fn key(n: u64) -> TicketKey {
    TicketKey {
        session: 1,
        call: CallId(n),
    }
}

fn sched(mapping: Mapping, pools: usize, workers: usize, groups: usize) -> RecoveryScheduler<u64> {
    let names: Vec<String> = (0..groups).map(|g| format!("g{g}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut cfg = RecoveryConfig::new(pools, workers, &names);
    cfg.mapping = mapping;
    RecoveryScheduler::new(&cfg).unwrap()
}

fn with(cfg: RecoveryConfig) -> RecoveryScheduler<u64> {
    RecoveryScheduler::new(&cfg).unwrap()
}

/// Queues `n` tasks of `group`, numbered from `from`.
fn fill(s: &mut RecoveryScheduler<u64>, group: u16, from: u64, n: u64) {
    for i in from..from + n {
        s.push(t(0), GroupId(group), key(i), Priority::Normal, i)
            .unwrap();
    }
}

/// Pops from every pool until none gives more; the tasks in pop order.
fn drain(s: &mut RecoveryScheduler<u64>) -> Vec<Task<u64>> {
    let mut out = Vec::new();
    loop {
        let before = out.len();
        for p in 0..s.pools() {
            if let Some(task) = s.pop(t(1), PoolId(u16::try_from(p).unwrap())) {
                out.push(task);
            }
        }
        if out.len() == before {
            return out;
        }
    }
}

fn events(s: &mut RecoveryScheduler<u64>) -> Vec<GroupEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

#[test]
fn dynamic_keeps_each_group_within_sigma() {
    // 4 workers in 4 pools, σ = 2 by default (half the workers).
    let mut s = sched(Mapping::Dynamic, 4, 1, 2);
    fill(&mut s, 0, 0, 10);
    fill(&mut s, 1, 100, 10);
    let running = drain(&mut s);
    assert_eq!(running.len(), 4);
    let of = |g| running.iter().filter(|x| x.group == GroupId(g)).count();
    assert_eq!((of(0), of(1)), (2, 2));
    // Only group 0 left with work: it still stops at σ.
    let mut s = sched(Mapping::Dynamic, 4, 1, 2);
    fill(&mut s, 0, 0, 10);
    assert_eq!(drain(&mut s).len(), 2);
    assert_eq!(s.stats(GroupId(0)).unwrap().running, 2);
    // A task ends: one more of the group may go.
    s.handle_done(t(2), PoolId(0), GroupId(0), TaskOutcome::Completed);
    assert!(s.pop(t(2), PoolId(0)).is_some());
    assert!(s.pop(t(2), PoolId(2)).is_none());
}

#[test]
fn a_pool_serves_its_groups_round_robin_in_arrival_order_within_each() {
    let mut cfg = RecoveryConfig::new(1, 1, &["a", "b", "c"]);
    cfg.mapping = Mapping::Static;
    for g in &mut cfg.groups {
        g.sigma = Some(1);
    }
    let mut s = with(cfg);
    fill(&mut s, 0, 0, 3);
    fill(&mut s, 1, 10, 3);
    fill(&mut s, 2, 20, 3);
    let mut order = Vec::new();
    for _ in 0..9 {
        let task = s.pop(t(1), PoolId(0)).unwrap();
        order.push(task.dispatch.item);
        s.handle_done(t(1), PoolId(0), task.group, TaskOutcome::Completed);
    }
    assert_eq!(order, vec![0, 10, 20, 1, 11, 21, 2, 12, 22]);
}

#[test]
fn static_pools_serve_only_their_home_groups() {
    let mut cfg = RecoveryConfig::new(2, 1, &["a", "b"]);
    cfg.mapping = Mapping::Static;
    let mut s = with(cfg);
    // Group 0 is at home in pool 0 (index mod pools), group 1 in pool 1.
    fill(&mut s, 0, 0, 5);
    assert!(
        s.pop(t(1), PoolId(1)).is_none(),
        "pool 1 does not serve group 0"
    );
    assert_eq!(s.pop(t(1), PoolId(0)).unwrap().group, GroupId(0));
    assert!(
        s.pop(t(1), PoolId(0)).is_none(),
        "pool 0's one worker is busy"
    );
}

#[test]
fn partially_dynamic_lends_idle_pools_but_not_to_isolated_groups() {
    let mut cfg = RecoveryConfig::new(3, 1, &["heavy", "iso", "idle"]);
    cfg.mapping = Mapping::PartiallyDynamic;
    cfg.groups[0].sigma = Some(1);
    cfg.groups[1].isolated = true;
    cfg.groups[1].sigma = Some(1);
    let mut s = with(cfg);
    fill(&mut s, 0, 0, 10);
    fill(&mut s, 1, 100, 10);
    let running = drain(&mut s);
    let of = |g| running.iter().filter(|x| x.group == GroupId(g)).count();
    // Pool 2 (group "idle" has nothing) lends itself to "heavy", past
    // its σ of 1; "iso" keeps to its home and σ.
    assert_eq!(of(0), 2, "{running:?}");
    assert_eq!(of(1), 1);
    // Its home work comes first once it has some.
    s.handle_done(t(2), PoolId(2), GroupId(0), TaskOutcome::Completed);
    fill(&mut s, 2, 200, 1);
    assert_eq!(s.pop(t(2), PoolId(2)).unwrap().group, GroupId(2));
}

#[test]
fn performance_oriented_has_no_bound_and_no_recovery() {
    let mut s = sched(Mapping::PerformanceOriented, 4, 1, 2);
    fill(&mut s, 0, 0, 10);
    assert_eq!(drain(&mut s).len(), 4, "one group takes every worker");
    s.handle_done(t(2), PoolId(0), GroupId(0), TaskOutcome::Failed);
    assert!(events(&mut s).is_empty());
    assert!(s.pop(t(2), PoolId(0)).is_some(), "dispatch goes on");
}

/// normal → recovering (queued held, others served) → clean-up once its
/// running tasks ended → normal, queued tasks re-driven in order.
#[test]
fn a_failed_task_suspends_its_group_until_cleaned_up_then_redrives() {
    let mut s = sched(Mapping::Dynamic, 4, 1, 2);
    fill(&mut s, 0, 0, 6);
    let first = drain(&mut s);
    assert_eq!(first.len(), 2, "σ = 2");
    s.handle_done(t(5), PoolId(0), GroupId(0), TaskOutcome::Failed);
    assert_eq!(
        events(&mut s),
        vec![GroupEvent::RecoveryStarted {
            group: GroupId(0),
            running: 1,
            at: t(5)
        }]
    );
    let st = s.stats(GroupId(0)).unwrap();
    assert!(matches!(
        st.state,
        GroupState::Recovering {
            cleaning: false,
            ..
        }
    ));
    assert_eq!((st.queued, st.running, st.recoveries), (4, 1, 1));
    // Held: nothing of group 0; group 1 is served in full.
    fill(&mut s, 1, 100, 3);
    let during = drain(&mut s);
    assert!(during.iter().all(|x| x.group == GroupId(1)), "{during:?}");
    assert_eq!(during.len(), 2, "group 1 within its own σ");
    // Too early to clean up: a task of the group still runs.
    assert_eq!(
        s.handle_cleanup_done(t(6), GroupId(0)),
        Err(CleanupError::StillRunning {
            group: GroupId(0),
            running: 1
        })
    );
    s.handle_done(t(7), PoolId(1), GroupId(0), TaskOutcome::Completed);
    assert_eq!(
        events(&mut s),
        vec![GroupEvent::CleanUp { group: GroupId(0) }]
    );
    s.handle_cleanup_done(t(9), GroupId(0)).unwrap();
    assert_eq!(
        events(&mut s),
        vec![GroupEvent::Recovered {
            group: GroupId(0),
            took: Duration::from_millis(4),
            failed: 0
        }]
    );
    for p in 0..4 {
        s.handle_done(t(9), PoolId(p), GroupId(1), TaskOutcome::Completed);
    }
    let after: Vec<u64> = drain(&mut s)
        .into_iter()
        .filter(|x| x.group == GroupId(0))
        .map(|x| x.dispatch.item)
        .collect();
    assert_eq!(after, vec![2, 3], "re-driven in order, within σ");
    let st = s.stats(GroupId(0)).unwrap();
    assert_eq!(st.in_recovery, Duration::from_millis(4));
    assert_eq!(st.failed, 1);
    assert_eq!(
        s.handle_cleanup_done(t(10), GroupId(0)),
        Err(CleanupError::NotRecovering(GroupId(0)))
    );
}

#[test]
fn under_the_fail_policy_queued_tasks_are_handed_back() {
    let mut cfg = RecoveryConfig::new(2, 1, &["a", "b"]);
    cfg.groups[0].policy = RecoveryPolicy::Fail;
    let mut s = with(cfg);
    fill(&mut s, 0, 0, 5);
    assert!(s.enter_recovery(t(1), GroupId(0)), "the service says so");
    assert!(!s.enter_recovery(t(1), GroupId(0)), "already recovering");
    // Nothing ran: clean-up is asked for at once.
    assert_eq!(
        events(&mut s),
        vec![
            GroupEvent::RecoveryStarted {
                group: GroupId(0),
                running: 0,
                at: t(1)
            },
            GroupEvent::CleanUp { group: GroupId(0) }
        ]
    );
    s.handle_cleanup_done(t(3), GroupId(0)).unwrap();
    let back: Vec<u64> = std::iter::from_fn(|| s.poll_failed())
        .map(|(_, d)| d.item)
        .collect();
    assert_eq!(back, vec![0, 1, 2, 3, 4]);
    assert!(s.is_empty());
    assert_eq!(s.stats(GroupId(0)).unwrap().handed_back, 5);
}

#[test]
fn a_group_is_suspended_while_a_group_it_depends_on_recovers() {
    let mut cfg = RecoveryConfig::new(2, 1, &["store", "index", "other"]);
    cfg.groups[1].suspended_by = vec![GroupId(0)];
    let mut s = with(cfg);
    fill(&mut s, 1, 0, 2);
    fill(&mut s, 2, 10, 2);
    s.enter_recovery(t(1), GroupId(0));
    assert!(s.stats(GroupId(1)).unwrap().suspended);
    let during = drain(&mut s);
    assert!(during.iter().all(|x| x.group == GroupId(2)), "{during:?}");
    events(&mut s);
    s.handle_cleanup_done(t(2), GroupId(0)).unwrap();
    for task in during {
        s.handle_done(t(2), task.pool, task.group, TaskOutcome::Completed);
    }
    assert!(drain(&mut s).iter().any(|x| x.group == GroupId(1)));
}

#[test]
fn time_in_recovery_counts_the_current_one() {
    let mut s = sched(Mapping::Dynamic, 1, 1, 1);
    s.enter_recovery(t(10), GroupId(0));
    s.pop(t(25), PoolId(0));
    assert_eq!(
        s.stats(GroupId(0)).unwrap().in_recovery,
        Duration::from_millis(15)
    );
}

#[test]
fn unknown_groups_and_bad_settings_are_typed_errors() {
    let mut s = sched(Mapping::Dynamic, 1, 1, 1);
    assert_eq!(
        s.push(t(0), GroupId(3), key(1), Priority::Normal, 7),
        Err(UnknownGroup {
            group: GroupId(3),
            item: 7
        })
    );
    assert!(s.pop(t(0), PoolId(9)).is_none());
    let bad = |f: &dyn Fn(&mut RecoveryConfig)| {
        let mut c = RecoveryConfig::new(2, 1, &["a", "b"]);
        f(&mut c);
        c.validate().unwrap_err()
    };
    assert_eq!(bad(&|c| c.pools.clear()), RecoveryConfigError::NoWorkers);
    assert_eq!(bad(&|c| c.pools[1] = 0), RecoveryConfigError::NoWorkers);
    assert_eq!(bad(&|c| c.groups.clear()), RecoveryConfigError::NoGroups);
    assert_eq!(
        bad(&|c| c.groups[1].sigma = Some(0)),
        RecoveryConfigError::ZeroSigma(GroupId(1))
    );
    assert_eq!(
        bad(&|c| c.groups[0].home = vec![PoolId(2)]),
        RecoveryConfigError::NoSuchPool {
            group: GroupId(0),
            pool: PoolId(2)
        }
    );
    assert_eq!(
        bad(&|c| c.groups[0].suspended_by = vec![GroupId(5)]),
        RecoveryConfigError::NoSuchGroup {
            group: GroupId(0),
            other: GroupId(5)
        }
    );
}

#[test]
fn high_priority_goes_first_within_a_group_and_promotion_finds_its_task() {
    let mut s = sched(Mapping::Dynamic, 1, 1, 2);
    fill(&mut s, 1, 0, 3);
    s.push(t(0), GroupId(1), key(50), Priority::High, 50)
        .unwrap();
    assert!(s.promote(key(2)));
    assert!(!s.promote(key(99)));
    let mut order = Vec::new();
    while let Some(task) = s.pop(t(1), PoolId(0)) {
        order.push(task.dispatch.item);
        s.handle_done(t(1), PoolId(0), task.group, TaskOutcome::Completed);
    }
    // The re-sent 2 goes to the head with its session's earlier 0 and 1
    // (a re-send never passes its own session's requests).
    assert_eq!(order, vec![0, 1, 2, 50]);
}

/// `has_ready` says exactly whether `pop` would give the pool a task: not
/// for a group at σ, a recovering group, or a full pool (a driver that
/// woke pools for any waiting task would spin).
#[test]
fn has_ready_matches_what_pop_would_give() {
    let mut s = sched(Mapping::Dynamic, 2, 2, 2);
    assert!(!s.has_ready(PoolId(0)), "nothing queued");
    fill(&mut s, 0, 0, 5);
    assert!(s.has_ready(PoolId(0)));
    // σ = 2 (half of 4 workers): two run, three wait and none is ready.
    assert!(s.pop(t(1), PoolId(0)).is_some());
    assert!(s.pop(t(1), PoolId(1)).is_some());
    assert_eq!(s.len(), 3);
    for p in [PoolId(0), PoolId(1)] {
        assert!(!s.has_ready(p), "group 0 at σ");
        assert!(s.pop(t(1), p).is_none());
    }
    // A task of it failed: recovering, still nothing ready.
    s.handle_done(t(2), PoolId(0), GroupId(0), TaskOutcome::Failed);
    assert!(!s.has_ready(PoolId(0)));
    // Another group's task is ready meanwhile, on a pool with room.
    fill(&mut s, 1, 100, 1);
    assert!(s.has_ready(PoolId(0)));
    assert!(s.pop(t(3), PoolId(0)).is_some());
    assert!(!s.has_ready(PoolId(1)));
    assert!(!s.has_ready(PoolId(9)), "no such pool");
}
