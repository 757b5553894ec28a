//! The recovery-conscious scheduling experiment (FAST '08, §5) on virtual
//! workers and time: the core's [`RecoveryScheduler`] under each mapping,
//! driven by a closed-loop workload of short tasks in 16 recovery groups
//! on 8 one-worker pools, on the good path and with one group failing.
//!
//! The model:
//! - `outstanding` requests (the paper's IOs) are always in the system;
//!   each is a chain of `tasks_per_request` tasks, one after another, each
//!   of a group drawn by the workload shares (a command processor, then a
//!   cache manager, …), with exponential service times; when a request's
//!   last task ends another request starts (a closed loop, as the paper's
//!   storage benchmark keeps its IOs outstanding).
//! - Bad path: a task of the faulty group fails with probability
//!   `fail_prob` at its end; its worker then runs the group's recovery for
//!   `recovery` (clean-up, re-reading state). The probability is chosen so
//!   recovery is `overhead` (the paper: 5 %) of the aggregate execution
//!   time. A task of the same group that *starts* while its group
//!   recovers depends on the state being rebuilt: it holds its worker
//!   until the recovery is over, then runs. Under the recovery-conscious
//!   mappings the group is suspended meanwhile (reactive), so none starts;
//!   under the performance-oriented baseline they do, and pile up.
//!
//! What it measures: completed requests per second and their mean and p99
//! response time, of all requests and of those that never touched the
//! faulty group. What it leaves out: the paper's lock spinning and CPU
//! utilisation.

use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use surelink_proto::rpc::recovery::{
    GroupEvent, GroupId, Mapping, PoolId, RecoveryConfig, RecoveryScheduler, TaskOutcome,
};
use surelink_proto::rpc::{Priority, TicketKey};
use surelink_proto::{CallId, Time};

/// One run's settings.
#[derive(Clone, Debug)]
pub struct RcsScenario {
    /// The mapping (or the performance-oriented baseline).
    pub mapping: Mapping,
    /// Workers per pool, one entry per pool.
    pub pools: Vec<usize>,
    /// Workload share per group (its length is the number of groups).
    pub shares: Vec<f64>,
    /// Groups kept to their homes and σ under the partially dynamic
    /// mapping.
    pub isolated: Vec<usize>,
    /// σ for every group under the dynamic and partially dynamic mappings
    /// (`None`: the core's default, half the workers).
    pub sigma: Option<usize>,
    /// Mean service time of a task.
    pub service: Duration,
    /// Tasks per request, run one after another.
    pub tasks_per_request: usize,
    /// Requests always in the system.
    pub outstanding: usize,
    /// The faulty group (`None`: the good path).
    pub faulty: Option<usize>,
    /// How long one recovery holds its worker.
    pub recovery: Duration,
    /// Recovery time as a fraction of the aggregate execution time.
    pub overhead: f64,
    /// Virtual time simulated (after a warm-up of a tenth of it).
    pub run_for: Duration,
    /// Seeds the draws.
    pub seed: u64,
}

impl RcsScenario {
    /// The paper's shape: 16 groups (three doing no work), 8 pools of one
    /// worker, requests of 4 tasks of 18.75 µs (75 µs of CPU each, so
    /// ≈ 107 k requests/s), 1 400 outstanding (≈ 13 ms response time: the
    /// paper's good path), 10 ms recoveries, 5 % overhead in group 1 on
    /// the bad path, groups 4 and 5 isolated.
    pub fn paper(mapping: Mapping, bad_path: bool) -> Self {
        RcsScenario {
            mapping,
            pools: vec![1; 8],
            shares: vec![
                0.20, 0.15, 0.12, 0.10, 0.08, 0.08, 0.06, 0.05, 0.04, 0.04, 0.03, 0.03, 0.02, 0.0,
                0.0, 0.0,
            ],
            isolated: vec![4, 5],
            sigma: None,
            service: Duration::from_nanos(18_750),
            tasks_per_request: 4,
            outstanding: 1400,
            faulty: bad_path.then_some(1),
            recovery: Duration::from_millis(10),
            overhead: 0.05,
            run_for: Duration::from_secs(10),
            seed: 1,
        }
    }

    /// The scheduler's settings: static homes proportional to the shares
    /// (the paper's static mapping), round robin over the pools.
    pub fn config(&self) -> RecoveryConfig {
        let names: Vec<String> = (0..self.shares.len()).map(|g| format!("g{g}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut cfg = RecoveryConfig::new(self.pools.len(), 1, &names);
        cfg.pools.clone_from(&self.pools);
        cfg.mapping = self.mapping;
        let workers = cfg.workers();
        let mut next = 0usize;
        for (g, c) in cfg.groups.iter_mut().enumerate() {
            let want = ((self.shares[g] * workers as f64).round() as usize).clamp(1, workers);
            c.home = (0..want)
                .map(|k| PoolId(u16::try_from((next + k) % self.pools.len()).unwrap_or(0)))
                .collect();
            next = (next + want) % self.pools.len();
            c.isolated = self.isolated.contains(&g);
            if self.mapping != Mapping::Static {
                c.sigma = self.sigma;
            }
        }
        cfg
    }

    /// Chance that a task of the faulty group fails, for `overhead`.
    pub fn fail_prob(&self) -> f64 {
        let Some(f) = self.faulty else { return 0.0 };
        let share = self.shares.get(f).copied().unwrap_or(0.0);
        if share <= 0.0 {
            return 0.0;
        }
        (self.overhead * self.service.as_secs_f64() / (share * self.recovery.as_secs_f64()))
            .min(1.0)
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct RcsOutcome {
    /// Requests completed per second.
    pub throughput: f64,
    /// Mean response time (start to last task's end), all requests.
    pub mean: Duration,
    /// Its 99th percentile.
    pub p99: Duration,
    /// Mean response time of the requests that never touched the faulty
    /// group.
    pub healthy_mean: Duration,
    /// Its 99th percentile.
    pub healthy_p99: Duration,
    /// Recoveries run.
    pub recoveries: u64,
    /// Time workers spent held by a task waiting for its group's recovery.
    pub blocked: Duration,
}

/// A worker's next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// The task failed at its end: its recovery begins.
    Fail,
    /// The task (and recovery, if any) is over.
    Done,
}

struct Running {
    group: usize,
    request: usize,
}

/// A request in the system.
#[derive(Clone, Copy)]
struct Request {
    started: Time,
    left: usize,
    touched_faulty: bool,
}

fn exp(rng: &mut ChaCha8Rng, mean: Duration) -> Duration {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    mean.mul_f64(-u.ln())
}

fn pick(rng: &mut ChaCha8Rng, cumulative: &[f64]) -> usize {
    let x: f64 = rng.random_range(0.0..1.0);
    cumulative
        .iter()
        .position(|c| x < *c)
        .unwrap_or(cumulative.len().saturating_sub(1))
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn mean(v: &[Duration]) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap_or(u32::MAX)
}

impl RcsScenario {
    /// Runs the model.
    pub fn run(&self) -> RcsOutcome {
        let cfg = self.config();
        let Ok(mut sched) = RecoveryScheduler::<usize>::new(&cfg) else {
            return RcsOutcome::default();
        };
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let total: f64 = self.shares.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        let cumulative: Vec<f64> = self
            .shares
            .iter()
            .scan(0.0, |acc, s| {
                *acc += s / total;
                Some(*acc)
            })
            .collect();
        let fail_prob = self.fail_prob();
        let mut next_key = 0u64;
        // The next task of request `r`.
        let mut submit = |sched: &mut RecoveryScheduler<usize>,
                          rng: &mut ChaCha8Rng,
                          reqs: &mut [Request],
                          r: usize,
                          now: Time| {
            let g = pick(rng, &cumulative);
            reqs[r].touched_faulty |= Some(g) == self.faulty;
            next_key += 1;
            let key = TicketKey {
                session: 0,
                call: CallId(next_key),
            };
            let _ = sched.push(now, GroupId(g as u16), key, Priority::Normal, r);
        };
        let mut now = Time::ZERO;
        let fresh = |now| Request {
            started: now,
            left: self.tasks_per_request.max(1),
            touched_faulty: false,
        };
        let mut reqs: Vec<Request> = (0..self.outstanding).map(|_| fresh(now)).collect();
        for r in 0..self.outstanding {
            submit(&mut sched, &mut rng, &mut reqs, r, now);
        }
        // Per pool, per worker: what it runs.
        let mut running: Vec<Vec<Option<Running>>> = self
            .pools
            .iter()
            .map(|&w| (0..w).map(|_| None).collect())
            .collect();
        // (Reverse(when), step, pool, worker)
        let mut heap: BinaryHeap<(std::cmp::Reverse<Time>, Step, usize, usize)> = BinaryHeap::new();
        let mut recovering_until = vec![Time::ZERO; self.shares.len()];
        let warm = Time::ZERO + self.run_for / 10;
        let end = warm + self.run_for;
        let (mut all, mut healthy) = (Vec::new(), Vec::new());
        let mut out = RcsOutcome::default();
        let mut cleanups: VecDeque<GroupId> = VecDeque::new();
        loop {
            // Idle workers take what the scheduler gives their pool.
            for (p, workers) in running.iter_mut().enumerate() {
                let pool = PoolId(p as u16);
                for (w, slot) in workers.iter_mut().enumerate() {
                    if slot.is_some() {
                        continue;
                    }
                    let Some(task) = sched.pop(now, pool) else {
                        break;
                    };
                    let g = usize::from(task.group.0);
                    let mut start = now;
                    if recovering_until[g] > now {
                        // Depends on the state its group is rebuilding.
                        out.blocked += recovering_until[g].saturating_since(now);
                        start = recovering_until[g];
                    }
                    let fails = Some(g) == self.faulty && rng.random_bool(fail_prob);
                    let step = if fails { Step::Fail } else { Step::Done };
                    heap.push((
                        std::cmp::Reverse(start + exp(&mut rng, self.service)),
                        step,
                        p,
                        w,
                    ));
                    *slot = Some(Running {
                        group: g,
                        request: task.dispatch.item,
                    });
                }
            }
            let Some((std::cmp::Reverse(at), step, p, w)) = heap.pop() else {
                break;
            };
            now = at;
            if now > end {
                break;
            }
            let Some(r) = running[p][w].as_ref() else {
                continue;
            };
            let g = r.group;
            match step {
                Step::Fail => {
                    out.recoveries += 1;
                    recovering_until[g] = recovering_until[g].max(now + self.recovery);
                    sched.enter_recovery(now, GroupId(g as u16));
                    heap.push((std::cmp::Reverse(now + self.recovery), Step::Done, p, w));
                }
                Step::Done => {
                    let req = r.request;
                    running[p][w] = None;
                    sched.handle_done(
                        now,
                        PoolId(p as u16),
                        GroupId(g as u16),
                        TaskOutcome::Completed,
                    );
                    reqs[req].left -= 1;
                    if reqs[req].left == 0 {
                        if now >= warm {
                            let rt = now.saturating_since(reqs[req].started);
                            all.push(rt);
                            if !reqs[req].touched_faulty {
                                healthy.push(rt);
                            }
                        }
                        reqs[req] = fresh(now);
                    }
                    submit(&mut sched, &mut rng, &mut reqs, req, now);
                }
            }
            while let Some(e) = sched.poll_event() {
                if let GroupEvent::CleanUp { group } = e {
                    cleanups.push_back(group);
                }
            }
            // The recovery ran on the failing worker: clean-up is done.
            while let Some(group) = cleanups.pop_front() {
                let _ = sched.handle_cleanup_done(now, group);
            }
        }
        out.throughput = all.len() as f64 / self.run_for.as_secs_f64();
        out.mean = mean(&all);
        out.p99 = percentile(&mut all, 0.99);
        out.healthy_mean = mean(&healthy);
        out.healthy_p99 = percentile(&mut healthy, 0.99);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mapping: Mapping, bad: bool) -> RcsOutcome {
        let mut s = RcsScenario::paper(mapping, bad);
        s.run_for = Duration::from_secs(1);
        s.run()
    }

    /// The model reproduces the paper's shape: on the good path the
    /// dynamic mapping matches the baseline and the static one loses
    /// throughput; with a failing group the baseline loses throughput to
    /// dependent tasks waiting on workers, and the dynamic mapping less.
    #[test]
    fn the_papers_shape() {
        let po = run(Mapping::PerformanceOriented, false);
        let dynamic = run(Mapping::Dynamic, false);
        let fixed = run(Mapping::Static, false);
        assert!(po.throughput > 90_000.0, "{po:?}");
        assert!(
            dynamic.throughput >= 0.98 * po.throughput,
            "{dynamic:?} vs {po:?}"
        );
        assert!(fixed.throughput < 0.8 * po.throughput, "{fixed:?}");
        let po_bad = run(Mapping::PerformanceOriented, true);
        let dyn_bad = run(Mapping::Dynamic, true);
        assert!(po_bad.recoveries > 0 && dyn_bad.recoveries > 0);
        assert!(
            po_bad.blocked > Duration::ZERO,
            "dependent tasks held workers"
        );
        assert_eq!(
            dyn_bad.blocked,
            Duration::ZERO,
            "a recovering group is not dispatched"
        );
        assert!(po_bad.throughput < 0.95 * po.throughput, "{po_bad:?}");
        assert!(
            dyn_bad.throughput > po_bad.throughput,
            "{dyn_bad:?} vs {po_bad:?}"
        );
    }

    #[test]
    fn the_failure_rate_gives_the_overhead_asked_for() {
        let s = RcsScenario::paper(Mapping::Dynamic, true);
        // share × rate of failures × recovery = overhead × service.
        let got = s.shares[1] * s.fail_prob() * s.recovery.as_secs_f64();
        assert!((got - 0.05 * s.service.as_secs_f64()).abs() < 1e-12);
        assert_eq!(RcsScenario::paper(Mapping::Dynamic, false).fail_prob(), 0.0);
    }
}
