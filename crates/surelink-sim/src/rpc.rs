//! Calls through the product's message layer on a virtual clock: the
//! client's call table, re-sends and overdue handling, the server's
//! at-most-once admission and duplicate answers all run inside
//! [`surelink_proto::Session`]s (driven through
//! [`surelink_proto::Endpoint`]s on the [`World`] fixture), and requests
//! are scheduled by the product's [`Scheduler`] implementations. Nothing
//! here models the protocol; it only moves bytes, keeps time and plays the
//! workers.
//!
//! A client (node 1) and a server (node 2) share two paths with a fixed
//! one-way latency. A path can *stall* for a while: what is written on it
//! arrives only when the stall ends (nothing fails, nothing is reported).
//! The client starts calls every `call_every`; the core re-sends a call
//! that has no reply within its re-send timeout (same id, on the request
//! lane, high priority), doubling the timeout each time, after suspecting
//! the path the original is stuck on. The server takes admitted requests
//! (tickets) into the scheduler and runs `workers` of them at a time, each
//! for `service` of virtual time. Optionally a second client (node 3, its
//! own unstalled path) adds background load.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use surelink_proto::rpc::{
    CallFailure, CallOptions, FifoScheduler, Priority, PriorityScheduler, RequestClass, Scheduler,
    Ticket, TicketKey,
};
use surelink_proto::{CallId, ChannelId, EndpointConfig, Event, NodeId, PathId, SessionId, Time};

use crate::fixture::World;

const CLIENT: NodeId = NodeId(1);
const SERVER: NodeId = NodeId(2);
/// The nodes' places in the world (node ids 1, 2, 3).
const C: usize = 0;
const S: usize = 1;
const BG: usize = 2;
/// The background client's path.
const BACKGROUND_PATH: PathId = PathId(10);
/// Channel of the calls.
pub const CHANNEL: u16 = 0;

const TICK: Duration = Duration::from_micros(100);

/// How the server schedules admitted requests.
#[derive(Clone, Debug)]
pub enum SchedulerSpec {
    /// hr-net's queues with this aging bound (the default scheduler).
    Priority(Duration),
    /// One FIFO (the baseline).
    Fifo,
}

/// A scenario.
#[derive(Clone, Debug)]
pub struct RpcScenario {
    /// One-way latency of every path.
    pub latency: Duration,
    /// Stalls: (path, from, length). A stalled path holds everything
    /// written on it until the stall ends. Path 0 is the one the session
    /// uses first.
    pub stalls: Vec<(u64, Duration, Duration)>,
    /// A burst of calls starts this often.
    pub call_every: Duration,
    /// Calls per burst (at least 1).
    pub burst: u64,
    /// Calls from a second client, one this often (first half of the run).
    pub background_every: Option<Duration>,
    /// Every n-th call is high priority (0: none).
    pub high_every: u64,
    /// Calls started in all.
    pub calls: u64,
    /// First re-send timeout (doubles per re-send).
    pub resend_after: Duration,
    /// A call fails after this.
    pub deadline: Duration,
    /// Server workers.
    pub workers: usize,
    /// Time a request takes to run.
    pub service: Duration,
    /// How the server schedules.
    pub scheduler: SchedulerSpec,
    /// Session settings of every endpoint.
    pub endpoint: EndpointConfig,
    /// Stop after this long.
    pub run_for: Duration,
}

/// One request dispatched by the server.
#[derive(Clone, Debug)]
pub struct DispatchRecord {
    /// The client's number for the call (background calls: `None`).
    pub id: Option<u64>,
    /// When it was dispatched.
    pub at: Time,
    /// When the server admitted it.
    pub arrived: Time,
    /// Its place in the server's admission order.
    pub arrival_order: u64,
    /// Its priority then.
    pub priority: Priority,
    /// Whether it was admitted as a re-send or promoted by one before it
    /// was dispatched.
    pub was_resent: bool,
    /// When a re-send of it first reached the server while it waited.
    pub resend_arrived: Option<Time>,
    /// How long it waited in the scheduler.
    pub waited: Duration,
    /// The longest any normal request still queued (and never promoted)
    /// had waited, at this dispatch.
    pub oldest_normal_waiting: Option<Duration>,
}

/// What happened.
#[derive(Clone, Debug, Default)]
pub struct RpcOutcome {
    /// Executions per call (the client's numbers).
    pub executions: BTreeMap<u64, u32>,
    /// Transmissions per answered or failed call (1 + re-sends).
    pub sends: BTreeMap<u64, u32>,
    /// Replies matched to their call (right id, right body).
    pub replied: BTreeMap<u64, Time>,
    /// Calls that failed with a timeout.
    pub timed_out: Vec<u64>,
    /// Calls that failed otherwise (must stay empty).
    pub failed: Vec<(u64, String)>,
    /// Replies whose body did not match the call (must stay empty).
    pub mismatched: Vec<u64>,
    /// The server's dispatch order.
    pub dispatched: Vec<DispatchRecord>,
    /// Duplicate requests the server answered without running them.
    pub duplicates: u64,
}

pub use crate::checker::answer;

/// A request the server admitted, as the scheduler holds it.
struct Job {
    ticket: Ticket,
    /// The client's number (from the body), for our records.
    id: Option<u64>,
}

struct Waiting {
    arrived: Time,
    order: u64,
    priority: Priority,
    resent: bool,
    resend_arrived: Option<Time>,
}

struct Running {
    session: SessionId,
    call: CallId,
    body: Bytes,
    done_at: Time,
}

impl RpcScenario {
    fn stalled(&self, path: PathId, now: Time) -> bool {
        self.stalls.iter().any(|&(p, from, len)| {
            PathId(p) == path && now >= Time::ZERO + from && now < Time::ZERO + from + len
        })
    }

    fn scheduler(&self) -> Box<dyn Scheduler<Job>> {
        match self.scheduler {
            SchedulerSpec::Priority(aging) => Box::new(PriorityScheduler::new(aging)),
            SchedulerSpec::Fifo => Box::new(FifoScheduler::new()),
        }
    }

    /// The aging bound in force (FIFO: none).
    pub fn aging_bound(&self) -> Option<Duration> {
        match self.scheduler {
            SchedulerSpec::Priority(a) => Some(a),
            SchedulerSpec::Fifo => None,
        }
    }

    /// Runs it.
    #[allow(clippy::too_many_lines)]
    pub fn run(&self) -> RpcOutcome {
        // Client, server and background client, at 1 ms.
        let mut world = World::endpoints(&self.endpoint, 3);
        world.latency = self.latency;
        // Events wait in the core until the loop below takes them.
        world.collect_events = false;
        let mut out = RpcOutcome::default();
        for p in [PathId(0), PathId(1)] {
            world.connect(C, S, p);
        }
        if self.background_every.is_some() {
            world.connect(BG, S, BACKGROUND_PATH);
        }
        // The client's calls: core id -> (our number, body).
        let mut calls: BTreeMap<CallId, (u64, Bytes)> = BTreeMap::new();
        let mut sched = self.scheduler();
        let mut waiting: BTreeMap<TicketKey, Waiting> = BTreeMap::new();
        let mut running: Vec<Running> = Vec::new();
        let mut admitted = 0u64;
        let mut next_id = 0u64;
        let mut next_call = world.now;
        let mut next_background = world.now;
        let end = Time::ZERO + self.run_for;
        let opts = |high: bool| {
            CallOptions::new(self.deadline)
                .with_resend_after(Some(self.resend_after))
                .with_priority(if high {
                    Priority::High
                } else {
                    Priority::Normal
                })
        };
        while world.now <= end {
            let now = world.now;
            // ---- client: start calls ----
            let mut burst = 0;
            while next_id < self.calls && now >= next_call {
                burst += 1;
                if burst >= self.burst.max(1) {
                    next_call = now + self.call_every;
                }
                let id = next_id;
                next_id += 1;
                let high = self.high_every > 0 && id % self.high_every == self.high_every - 1;
                let body = Bytes::from(id.to_be_bytes().to_vec());
                match world[C].call(now, SERVER, ChannelId(CHANNEL), body.clone(), &opts(high)) {
                    Ok((_, call)) => {
                        calls.insert(call, (id, body));
                    }
                    Err(e) => out.failed.push((id, format!("call refused: {e}"))),
                }
            }
            // ---- other clients' load ----
            if let Some(every) = self.background_every {
                if now >= next_background && now < Time::ZERO + self.run_for / 2 {
                    next_background = now + every;
                    let _ = world[BG].call(
                        now,
                        SERVER,
                        ChannelId(CHANNEL),
                        Bytes::from_static(b"bg"),
                        &CallOptions::new(self.deadline),
                    );
                }
            }
            // ---- server: finish and dispatch ----
            running.retain(|r| {
                if r.done_at > now {
                    return true;
                }
                let _ = world[S].complete(now, r.session, r.call, Ok(answer(&r.body)));
                false
            });
            while running.len() < self.workers {
                let oldest = waiting
                    .values()
                    .filter(|w| w.priority == Priority::Normal && !w.resent)
                    .map(|w| now.saturating_since(w.arrived))
                    .max();
                let Some(d) = sched.pop(now) else { break };
                let w = waiting.remove(&d.key);
                if let Some(id) = d.item.id {
                    *out.executions.entry(id).or_default() += 1;
                }
                out.dispatched.push(DispatchRecord {
                    id: d.item.id,
                    at: now,
                    arrived: w.as_ref().map_or(now, |w| w.arrived),
                    arrival_order: w.as_ref().map_or(u64::MAX, |w| w.order),
                    priority: d.priority,
                    was_resent: w.as_ref().is_some_and(|w| w.resent),
                    resend_arrived: w.as_ref().and_then(|w| w.resend_arrived),
                    waited: d.waited,
                    oldest_normal_waiting: oldest,
                });
                running.push(Running {
                    session: d.item.ticket.session,
                    call: d.item.ticket.call,
                    body: d.item.ticket.body,
                    done_at: now + self.service,
                });
            }
            // ---- network: what arrived by now, except on stalled paths ----
            for n in [C, BG, S] {
                world.flush_from(n);
            }
            for (from, path) in world.arrived() {
                if !self.stalled(path, now) {
                    world.deliver(from, path);
                }
            }
            // ---- timers ----
            world.run_timeouts();
            // ---- events ----
            for e in world.take_events(S) {
                match e {
                    Event::Request(t) => {
                        let key = TicketKey {
                            session: t.session.0,
                            call: t.call,
                        };
                        let id = (t.peer == CLIENT)
                            .then(|| t.body.as_ref().try_into().ok().map(u64::from_be_bytes))
                            .flatten();
                        waiting.insert(
                            key,
                            Waiting {
                                arrived: now,
                                order: admitted,
                                priority: t.priority,
                                resent: t.class == RequestClass::Resend,
                                resend_arrived: (t.class == RequestClass::Resend).then_some(now),
                            },
                        );
                        admitted += 1;
                        sched.push(now, key, t.priority, Job { ticket: t, id });
                    }
                    Event::Promote { session, call, .. } => {
                        let key = TicketKey {
                            session: session.0,
                            call,
                        };
                        if sched.promote(key) {
                            if let Some(w) = waiting.get_mut(&key) {
                                w.resent = true;
                                w.resend_arrived.get_or_insert(now);
                            }
                        }
                    }
                    Event::SessionEnded { session, .. } => {
                        sched.remove_session(session.0);
                    }
                    _ => {}
                }
            }
            let _ = world.take_events(BG);
            for e in world.take_events(C) {
                let Event::CallDone {
                    call,
                    sends,
                    result,
                    ..
                } = e
                else {
                    continue;
                };
                let Some((id, body)) = calls.remove(&call) else {
                    continue;
                };
                out.sends.insert(id, sends);
                match result {
                    Ok(reply) => {
                        if reply != answer(&body) {
                            out.mismatched.push(id);
                        }
                        out.replied.insert(id, now);
                    }
                    Err(CallFailure::Timeout) => out.timed_out.push(id),
                    Err(e) => out.failed.push((id, e.to_string())),
                }
            }
            world.now += TICK;
        }
        out.duplicates = world[S]
            .session_stats(CLIENT)
            .map_or(0, |s| s.duplicate_requests);
        out
    }
}
