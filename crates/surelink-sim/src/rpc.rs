//! Calls over the real session core, with the client state machine and the
//! server dispatcher from `surelink_proto::rpc`, on a virtual clock.
//!
//! A client (node 1) and a server (node 2) share two paths with a fixed
//! one-way latency. A path can *stall* for a while: what is written on it
//! arrives only when the stall ends (nothing fails, nothing is reported).
//! The client starts a call every `call_every`; a call not answered within
//! its re-send timeout is sent again with the same id (RESEND, high
//! priority, on the priority lane — its own channel, so it does not wait
//! behind the stalled original in the session's per-channel order), with
//! the timeout doubling each time; the client first tells the core the
//! original is overdue, which suspects the path it is on (hr-net: RESEND →
//! SELECT another path). The server queues requests in a
//! [`Dispatcher`] and runs `workers` of them at a time, each for
//! `service` of virtual time. Replies go back on the request's channel.
//!
//! Message header (inside the session payload): kind (1 = request,
//! 2 = reply, 3 = still running), flags (bit 0: re-send, bit 1: high), id.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink_proto::rpc::{
    AnyCall, Call, CallInput, Caller, Dispatcher, DispatcherConfig, Duplicate, Priority,
    RequestClass,
};
use surelink_proto::{
    ChannelId, Endpoint, EndpointConfig, Epoch, Event, MessageId, NodeId, PathId, Prefix, Time,
};

use crate::pair::identity;

const CLIENT: NodeId = NodeId(1);
const SERVER: NodeId = NodeId(2);
/// Channel of normal calls.
pub const NORMAL_CHANNEL: u16 = 0;
/// The priority lane: re-sends and high-priority calls.
pub const LANE_CHANNEL: u16 = 1;

const REQUEST: u8 = 1;
const REPLY: u8 = 2;
const STILL_RUNNING: u8 = 3;
const FLAG_RESEND: u8 = 1;
const FLAG_HIGH: u8 = 2;

const TICK: Duration = Duration::from_micros(100);

/// A scenario.
#[derive(Clone, Debug)]
pub struct RpcScenario {
    /// One-way latency of both paths.
    pub latency: Duration,
    /// Stalls: (path, from, length). A stalled path holds everything
    /// written on it until the stall ends. Path 0 is the one the session
    /// uses first.
    pub stalls: Vec<(u64, Duration, Duration)>,
    /// A burst of calls starts this often.
    pub call_every: Duration,
    /// Calls per burst (at least 1).
    pub burst: u64,
    /// Requests from other clients, straight into the server's queue, one
    /// this often (their ids count down from `u64::MAX`).
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
    /// Server dispatcher settings.
    pub dispatcher: DispatcherConfig,
    /// Stop after this long.
    pub run_for: Duration,
}

/// One request dispatched by the server.
#[derive(Clone, Debug)]
pub struct DispatchRecord {
    /// The call id.
    pub id: u64,
    /// When it was dispatched.
    pub at: Time,
    /// When the server first received it.
    pub arrived: Time,
    /// Its place in the server's arrival order.
    pub arrival_order: u64,
    /// Its priority then.
    pub priority: Priority,
    /// Whether it had been re-sent before it was dispatched.
    pub was_resent: bool,
    /// When the first re-send reached the server, if one did before the
    /// dispatch.
    pub resend_arrived: Option<Time>,
    /// How long it waited in the queue.
    pub waited: Duration,
    /// The longest any normal request still queued had waited, at this
    /// dispatch.
    pub oldest_normal_waiting: Option<Duration>,
}

/// What happened.
#[derive(Clone, Debug, Default)]
pub struct RpcOutcome {
    /// Executions per call id.
    pub executions: BTreeMap<u64, u32>,
    /// Sends per call id (1 + re-sends).
    pub sends: BTreeMap<u64, u32>,
    /// Replies matched to their call (right id, right body).
    pub replied: BTreeMap<u64, Time>,
    /// Calls that failed with a timeout.
    pub timed_out: Vec<u64>,
    /// Replies whose body did not match the call (must stay empty).
    pub mismatched: Vec<u64>,
    /// The server's dispatch order.
    pub dispatched: Vec<DispatchRecord>,
    /// Duplicates the server answered without running them.
    pub duplicates: u64,
}

struct ClientCall {
    state: AnyCall,
    /// The last transmission's message id.
    msg: Option<MessageId>,
    body: Bytes,
    resend_at: Time,
    backoff: Duration,
    deadline: Time,
}

struct Running {
    caller: Caller,
    id: u64,
    channel: u16,
    body: Bytes,
    done_at: Time,
}

fn header(kind: u8, flags: u8, id: u64) -> Prefix {
    let mut h = [0u8; 10];
    h[0] = kind;
    h[1] = flags;
    h[2..].copy_from_slice(&id.to_be_bytes());
    Prefix::new(&h).unwrap_or_default()
}

fn parse(p: &Bytes) -> Option<(u8, u8, u64, Bytes)> {
    if p.len() < 10 {
        return None;
    }
    let id = u64::from_be_bytes(p[2..10].try_into().ok()?);
    Some((p[0], p[1], id, p.slice(10..)))
}

/// The reply a request body gets (the server's "work").
pub fn answer(body: &[u8]) -> Bytes {
    body.iter().rev().copied().collect::<Vec<u8>>().into()
}

impl RpcScenario {
    fn stalled(&self, path: PathId, now: Time) -> bool {
        self.stalls.iter().any(|&(p, from, len)| {
            PathId(p) == path && now >= Time::ZERO + from && now < Time::ZERO + from + len
        })
    }

    /// Runs it.
    #[allow(clippy::too_many_lines)]
    pub fn run(&self) -> RpcOutcome {
        let cfg = EndpointConfig::default();
        let mut client = Endpoint::new(cfg.clone(), identity(CLIENT.0, 1)).expect("config");
        let mut server = Endpoint::new(cfg, identity(SERVER.0, 1)).expect("config");
        let mut out = RpcOutcome::default();
        let mut now = Time::from_millis(1);
        for p in [PathId(0), PathId(1)] {
            client.add_path(now, p, Some(SERVER)).expect("path");
            server.add_path(now, p, None).expect("path");
        }
        // In flight: (path, to_server) -> (deliver at, bytes).
        let mut wire: BTreeMap<(PathId, bool), VecDeque<(Time, Bytes)>> = BTreeMap::new();
        let mut calls: BTreeMap<u64, ClientCall> = BTreeMap::new();
        let mut dispatcher: Dispatcher<(u16, Bytes, bool)> =
            Dispatcher::new(self.dispatcher.clone());
        let mut arrived: BTreeMap<u64, (Time, bool, u64)> = BTreeMap::new();
        let mut resend_arrived: BTreeMap<u64, Time> = BTreeMap::new();
        let mut running: Vec<Running> = Vec::new();
        // The message that carried each reply (a duplicate request means it
        // may be stuck: the server then suspects its path).
        let mut reply_msgs: BTreeMap<u64, MessageId> = BTreeMap::new();
        let mut client_epoch = Epoch(1);
        let mut next_id = 0u64;
        let mut next_call = now;
        let mut next_background = now;
        let mut background_id = u64::MAX;
        let other = Caller {
            node: NodeId(99),
            epoch: Epoch(1),
        };
        let end = Time::ZERO + self.run_for;
        while now <= end {
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
                let priority = if high {
                    Priority::High
                } else {
                    Priority::Normal
                };
                let body = Bytes::from(id.to_be_bytes().to_vec());
                let call = Call::new(id, priority, true).select();
                let flags = if high { FLAG_HIGH } else { 0 };
                let channel = if high { LANE_CHANNEL } else { NORMAL_CHANNEL };
                let sent = client.send_with_prefix(
                    now,
                    SERVER,
                    ChannelId(channel),
                    header(REQUEST, flags, id),
                    body.clone(),
                );
                let msg = sent.as_ref().ok().copied();
                let state = match sent {
                    Ok(_) => AnyCall::Sent(call.send()),
                    Err(_) => AnyCall::Resend(call.send_failed()),
                };
                *out.sends.entry(id).or_default() += 1;
                calls.insert(
                    id,
                    ClientCall {
                        state,
                        msg,
                        body,
                        resend_at: now + self.resend_after,
                        backoff: self.resend_after,
                        deadline: now + self.deadline,
                    },
                );
            }
            // ---- client: deadlines and re-sends ----
            let due: Vec<u64> = calls
                .iter()
                .filter(|(_, c)| now >= c.resend_at || now >= c.deadline)
                .map(|(id, _)| *id)
                .collect();
            for id in due {
                let Some(c) = calls.get_mut(&id) else {
                    continue;
                };
                if now >= c.deadline {
                    out.timed_out.push(id);
                    calls.remove(&id);
                    continue;
                }
                let resend = match c.state {
                    AnyCall::Sent(_) => c.state.apply(CallInput::Timeout),
                    _ => Ok(c.state),
                }
                .and_then(|s| s.apply(CallInput::Select));
                let Ok(selected) = resend else { continue };
                if let Some(m) = c.msg {
                    client.handle_message_overdue(now, SERVER, m);
                }
                let flags = FLAG_RESEND
                    | if selected.priority() == Priority::High {
                        FLAG_HIGH
                    } else {
                        0
                    };
                let sent = client.send_with_prefix(
                    now,
                    SERVER,
                    ChannelId(LANE_CHANNEL),
                    header(REQUEST, flags, id),
                    c.body.clone(),
                );
                if let Ok(m) = &sent {
                    c.msg = Some(*m);
                }
                c.state = selected
                    .apply(if sent.is_ok() {
                        CallInput::Send
                    } else {
                        CallInput::SendError
                    })
                    .unwrap_or(selected);
                *out.sends.entry(id).or_default() += 1;
                c.backoff *= 2;
                c.resend_at = now + c.backoff;
            }
            // ---- other clients' load ----
            if let Some(every) = self.background_every {
                if now >= next_background && now < Time::ZERO + self.run_for / 2 {
                    next_background = now + every;
                    let order = arrived.len() as u64;
                    arrived.insert(background_id, (now, false, order));
                    dispatcher.handle_request(
                        now,
                        other,
                        background_id,
                        RequestClass::Send,
                        Priority::Normal,
                        (u16::MAX, Bytes::new(), false),
                    );
                    background_id -= 1;
                }
            }
            // ---- server: finish and dispatch ----
            running.retain(|r| {
                if r.done_at > now {
                    return true;
                }
                let reply = answer(&r.body);
                dispatcher.complete(r.caller, r.id, reply.clone());
                if r.caller == other {
                    return false; // not ours to answer
                }
                if let Ok(m) = server.send_with_prefix(
                    now,
                    CLIENT,
                    ChannelId(r.channel),
                    header(REPLY, 0, r.id),
                    reply,
                ) {
                    reply_msgs.insert(r.id, m);
                }
                false
            });
            while running.len() < self.workers {
                let oldest = dispatcher.oldest_normal_wait(now);
                let Some(d) = dispatcher.next(now) else { break };
                *out.executions.entry(d.id).or_default() += 1;
                let (channel, body, _) = d.request;
                let (first, resent, order) =
                    arrived
                        .get(&d.id)
                        .copied()
                        .unwrap_or((now, false, u64::MAX));
                out.dispatched.push(DispatchRecord {
                    id: d.id,
                    at: now,
                    arrived: first,
                    arrival_order: order,
                    priority: d.priority,
                    was_resent: resent,
                    resend_arrived: resend_arrived.get(&d.id).copied(),
                    waited: d.waited,
                    oldest_normal_waiting: oldest,
                });
                running.push(Running {
                    caller: d.caller,
                    id: d.id,
                    channel,
                    body,
                    done_at: now + self.service,
                });
            }
            // ---- network ----
            for (ep, to_server) in [(&mut client, true), (&mut server, false)] {
                let mut buf = BytesMut::new();
                while let Some(path) = ep.poll_transmit(now, &mut buf, 64 << 10) {
                    let at = now + self.latency;
                    wire.entry((path, to_server))
                        .or_default()
                        .push_back((at, buf.split().freeze()));
                }
            }
            for ((path, to_server), q) in wire.iter_mut() {
                if self.stalled(*path, now) {
                    continue;
                }
                while q.front().is_some_and(|(t, _)| *t <= now) {
                    let Some((_, bytes)) = q.pop_front() else {
                        break;
                    };
                    let mut b = BytesMut::from(&bytes[..]);
                    let to = if *to_server { &mut server } else { &mut client };
                    let _ = to.handle_input(now, *path, &mut b);
                }
            }
            // ---- timers ----
            for ep in [&mut client, &mut server] {
                if ep.poll_timeout().is_some_and(|t| t <= now) {
                    ep.handle_timeout(now);
                }
            }
            // ---- events ----
            while let Some(e) = server.poll_event() {
                match e {
                    Event::PeerUp { epoch, .. } => client_epoch = epoch,
                    Event::Message {
                        channel, payload, ..
                    } => {
                        let Some((REQUEST, flags, id, body)) = parse(&payload) else {
                            continue;
                        };
                        let resent = flags & FLAG_RESEND != 0;
                        let class = if resent {
                            RequestClass::Resend
                        } else {
                            RequestClass::Send
                        };
                        let hint = if flags & FLAG_HIGH != 0 {
                            Priority::High
                        } else {
                            Priority::Normal
                        };
                        let order = arrived.len() as u64;
                        let entry = arrived.entry(id).or_insert((now, false, order));
                        entry.1 |= resent;
                        if resent {
                            resend_arrived.entry(id).or_insert(now);
                        }
                        let caller = Caller {
                            node: CLIENT,
                            epoch: client_epoch,
                        };
                        let dup = dispatcher.handle_request(
                            now,
                            caller,
                            id,
                            class,
                            hint,
                            (channel.0, body, resent),
                        );
                        match &dup {
                            None | Some(Duplicate::Queued) | Some(Duplicate::StillRunning) => {}
                            Some(Duplicate::Answered) | Some(Duplicate::Reply(_)) => {
                                // The caller did not get the reply: the
                                // path under it may be stalled (RECEIVE
                                // ERROR at the caller).
                                if let Some(m) = reply_msgs.get(&id) {
                                    server.handle_message_overdue(now, CLIENT, *m);
                                }
                            }
                        }
                        // "I have it" (the caller waits a full period
                        // before sending again), or the cached reply.
                        let (kind, body) = match dup {
                            Some(Duplicate::Reply(r)) => (REPLY, r),
                            Some(_) => (STILL_RUNNING, Bytes::new()),
                            None => continue,
                        };
                        let _ = server.send_with_prefix(
                            now,
                            CLIENT,
                            channel,
                            header(kind, 0, id),
                            body,
                        );
                    }
                    _ => {}
                }
            }
            while let Some(e) = client.poll_event() {
                let Event::Message { payload, .. } = e else {
                    continue;
                };
                match parse(&payload) {
                    Some((REPLY, _, id, body)) => {
                        let Some(c) = calls.remove(&id) else {
                            continue; // a second reply to a finished call
                        };
                        if body != answer(&c.body) || c.state.apply(CallInput::Reply).is_err() {
                            out.mismatched.push(id);
                        }
                        out.replied.insert(id, now);
                    }
                    Some((STILL_RUNNING, _, id, _)) => {
                        // The server has it: wait a full period more.
                        if let Some(c) = calls.get_mut(&id) {
                            c.resend_at = now + c.backoff;
                        }
                    }
                    _ => {}
                }
            }
            now += TICK;
        }
        out.duplicates = dispatcher.duplicates();
        out
    }
}
