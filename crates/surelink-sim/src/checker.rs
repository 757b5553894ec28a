//! The promises, checked on every run: nothing lost, nothing duplicated,
//! order kept per channel, and every message either delivered or reported.

use std::collections::{BTreeMap, HashMap};

use bytes::{BufMut, Bytes, BytesMut};
use surelink_proto::rpc::CallFailure;
use surelink_proto::{CallId, Event, MessageId, NodeId, SessionId, StreamId, StreamKind};

/// What became of a message the application handed to `send`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted, not yet delivered.
    Pending,
    /// Delivered once.
    Delivered,
    /// Reported abandoned by its sender (session ended) and not delivered.
    Abandoned,
    /// Reported abandoned, but it had been delivered (allowed: the sender
    /// could not know).
    DeliveredAndAbandoned,
    /// Its sender's process died before it was delivered (allowed).
    SenderDied,
}

#[derive(Clone, Debug)]
struct Record {
    src: usize,
    src_incarnation: u32,
    dst: usize,
    id: MessageId,
    len: usize,
    sent_ms: f64,
    outcome: Outcome,
}

/// Builds a checkable payload: a unique id, then filler derived from it.
pub fn make_payload(uid: u64, len: usize) -> Bytes {
    let len = len.max(8);
    let mut b = BytesMut::with_capacity(len);
    b.put_u64(uid);
    let mut x = uid.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while b.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.put_u8(x as u8);
    }
    b.freeze()
}

fn payload_uid(p: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(p.get(..8)?.try_into().ok()?))
}

/// The reply a request body gets (the servers' "work"): the body reversed.
pub fn answer(body: &[u8]) -> Bytes {
    body.iter().rev().copied().collect::<Vec<u8>>().into()
}

/// Call uids live apart from message uids.
const CALL_UID: u64 = 1 << 62;

/// What became of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// Made, no answer yet.
    Pending,
    /// Answered with the right reply.
    Answered,
    /// Failed with a timeout (it may or may not have run).
    TimedOut,
    /// Failed because its session ended (restart, linger).
    SessionEnded,
    /// Its caller's process died.
    CallerDied,
}

#[derive(Clone, Debug)]
struct CallRecord {
    src: usize,
    src_incarnation: u32,
    dst: usize,
    len: usize,
    outcome: CallOutcome,
    executions: u32,
}

/// Tracks every message and checks each delivery against the promises.
#[derive(Debug, Default)]
pub struct Checker {
    records: Vec<Record>,
    /// (src node, src incarnation, session, stream, seq) -> uid
    by_id: HashMap<(usize, u32, SessionId, StreamId, u64), u64>,
    /// (dst node, dst incarnation, session at dst, stream) -> next expected seq
    order: HashMap<(usize, u32, SessionId, StreamId), u64>,
    /// What went wrong, in the order seen.
    pub violations: Vec<String>,
    /// Deliveries counted.
    pub delivered: u64,
    /// Duplicate deliveries seen (each also a violation).
    pub duplicates: u64,
    /// Messages in `Outcome::Pending`.
    pending: usize,
    /// Deliveries out of order within their channel (each also a violation).
    pub out_of_order: u64,
    /// `(sent at, latency)` in virtual ms of every delivery, when recording.
    pub latencies: Option<Vec<(f64, f64)>>,
    calls: Vec<CallRecord>,
    /// (caller node, incarnation, session, call) -> call uid
    call_ids: HashMap<(usize, u32, SessionId, CallId), u64>,
}

impl Checker {
    /// A message was accepted by `send`; returns its uid for the payload.
    pub fn next_uid(&self) -> u64 {
        self.records.len() as u64
    }

    /// Records an accepted message (`uid` from [`Checker::next_uid`]).
    #[allow(clippy::too_many_arguments)]
    pub fn sent(
        &mut self,
        now_ms: f64,
        uid: u64,
        src: usize,
        src_incarnation: u32,
        dst: usize,
        id: MessageId,
        len: usize,
    ) {
        debug_assert_eq!(uid, self.records.len() as u64);
        self.pending += 1;
        self.records.push(Record {
            src,
            src_incarnation,
            dst,
            id,
            len,
            sent_ms: now_ms,
            outcome: Outcome::Pending,
        });
        self.by_id
            .insert((src, src_incarnation, id.session, id.stream, id.seq), uid);
    }

    fn violation(&mut self, now_ms: f64, msg: String) {
        if self.violations.len() < 50 {
            self.violations.push(format!("t={now_ms:.3}ms: {msg}"));
        }
    }

    /// An event came out of node `node` (incarnation `inc`); `ids` maps
    /// node ids to node indices.
    pub fn event(
        &mut self,
        now_ms: f64,
        node: usize,
        inc: u32,
        ev: &Event,
        ids: &BTreeMap<NodeId, usize>,
    ) {
        match ev {
            Event::Message(m) => {
                let (peer, session, stream, seq, payload) =
                    (&m.peer, &m.session, &m.stream, &m.seq, &m.payload);
                self.delivered += 1;
                let Some(uid) = payload_uid(payload) else {
                    self.violation(
                        now_ms,
                        format!("node {node}: payload without uid ({} bytes)", payload.len()),
                    );
                    return;
                };
                let Some(rec) = self.records.get(uid as usize).cloned() else {
                    self.violation(now_ms, format!("node {node}: unknown uid {uid}"));
                    return;
                };
                if *payload != make_payload(uid, rec.len) {
                    self.violation(
                        now_ms,
                        format!("node {node}: payload of uid {uid} corrupted"),
                    );
                }
                if rec.dst != node || ids.get(peer) != Some(&rec.src) {
                    self.violation(
                        now_ms,
                        format!(
                            "uid {uid} from {} to {} delivered at {node} from {peer}",
                            rec.src, rec.dst
                        ),
                    );
                }
                if rec.id.stream != *stream || rec.id.seq != *seq {
                    self.violation(
                        now_ms,
                        format!(
                            "uid {uid} sent as {:?} delivered as {stream} seq {seq}",
                            rec.id
                        ),
                    );
                }
                let next = self
                    .order
                    .entry((node, inc, *session, *stream))
                    .or_insert(0);
                if *seq != *next {
                    let expected = *next;
                    self.out_of_order += 1;
                    self.violation(
                        now_ms,
                        format!("node {node} session {session} {stream}: got seq {seq}, expected {expected}"),
                    );
                }
                *self
                    .order
                    .entry((node, inc, *session, *stream))
                    .or_insert(0) = seq + 1;
                if let Some(l) = &mut self.latencies {
                    l.push((rec.sent_ms, now_ms - rec.sent_ms));
                }
                let r = &mut self.records[uid as usize];
                match r.outcome {
                    Outcome::Pending => {
                        r.outcome = Outcome::Delivered;
                        self.pending -= 1;
                    }
                    Outcome::SenderDied => r.outcome = Outcome::Delivered,
                    Outcome::Abandoned => r.outcome = Outcome::DeliveredAndAbandoned,
                    Outcome::Delivered | Outcome::DeliveredAndAbandoned => {
                        self.duplicates += 1;
                        self.violation(
                            now_ms,
                            format!("uid {uid} delivered twice (at node {node})"),
                        );
                    }
                }
            }
            Event::MessageRejected {
                session,
                stream,
                seq,
                ..
            } => {
                if let Some(&uid) = self.by_id.get(&(node, inc, *session, *stream, *seq)) {
                    let r = &mut self.records[uid as usize];
                    if r.outcome == Outcome::Pending {
                        r.outcome = Outcome::Abandoned;
                        self.pending -= 1;
                    }
                }
            }
            Event::CallDone {
                session,
                call,
                result,
                ..
            } => self.call_done(now_ms, node, inc, *session, *call, result),
            Event::SessionEnded {
                session, abandoned, ..
            } => {
                // Requests and replies are the message layer's own traffic,
                // checked as calls; one-way messages are checked here.
                for a in abandoned.iter().filter(|a| {
                    matches!(
                        a.stream.kind(),
                        StreamKind::Oneway(_) | StreamKind::OnewayHigh
                    )
                }) {
                    for seq in a.start..a.end {
                        let Some(&uid) = self.by_id.get(&(node, inc, *session, a.stream, seq))
                        else {
                            self.violation(
                                now_ms,
                                format!(
                                    "node {node}: abandoned unknown message {session}/{}/{seq}",
                                    a.stream
                                ),
                            );
                            continue;
                        };
                        let r = &mut self.records[uid as usize];
                        if r.outcome == Outcome::Pending {
                            self.pending -= 1;
                        }
                        r.outcome = match r.outcome {
                            Outcome::Pending => Outcome::Abandoned,
                            Outcome::Delivered => Outcome::DeliveredAndAbandoned,
                            o => o,
                        };
                    }
                }
            }
            _ => {}
        }
    }

    /// Node `node`'s process died: its undelivered messages may be lost,
    /// and its calls have no one to answer to.
    pub fn sender_died(&mut self, node: usize, inc: u32) {
        for r in &mut self.records {
            if r.src == node && r.src_incarnation == inc && r.outcome == Outcome::Pending {
                r.outcome = Outcome::SenderDied;
                self.pending -= 1;
            }
        }
        for c in &mut self.calls {
            if c.src == node && c.src_incarnation == inc && c.outcome == CallOutcome::Pending {
                c.outcome = CallOutcome::CallerDied;
            }
        }
    }

    /// The uid for the next call's body.
    pub fn next_call_uid(&self) -> u64 {
        CALL_UID | self.calls.len() as u64
    }

    /// A call was made (`uid` from [`Checker::next_call_uid`]).
    #[allow(clippy::too_many_arguments)]
    pub fn call_started(
        &mut self,
        _now_ms: f64,
        uid: u64,
        src: usize,
        src_incarnation: u32,
        dst: usize,
        session: SessionId,
        call: CallId,
        len: usize,
    ) {
        debug_assert_eq!(uid, self.next_call_uid());
        self.calls.push(CallRecord {
            src,
            src_incarnation,
            dst,
            len,
            outcome: CallOutcome::Pending,
            executions: 0,
        });
        self.call_ids
            .insert((src, src_incarnation, session, call), uid);
    }

    /// A server started running the request with `body`: at most once per
    /// call, ever (any server incarnation).
    pub fn executed(&mut self, now_ms: f64, node: usize, body: &[u8]) {
        let Some(uid) = payload_uid(body).filter(|u| u & CALL_UID != 0) else {
            self.violation(
                now_ms,
                format!("node {node}: ran a request without a call uid"),
            );
            return;
        };
        let Some(c) = self.calls.get_mut((uid & !CALL_UID) as usize) else {
            self.violation(now_ms, format!("node {node}: ran unknown call {uid}"));
            return;
        };
        c.executions += 1;
        let (n, dst, len) = (c.executions, c.dst, c.len);
        if dst != node {
            self.violation(
                now_ms,
                format!("call {uid} for node {dst} ran at node {node}"),
            );
        }
        if *body != make_payload(uid, len) {
            self.violation(now_ms, format!("call {uid}: request corrupted"));
        }
        if n > 1 {
            self.violation(now_ms, format!("call {uid} ran {n} times"));
        }
    }

    fn call_done(
        &mut self,
        now_ms: f64,
        node: usize,
        inc: u32,
        session: SessionId,
        call: CallId,
        result: &Result<Bytes, CallFailure>,
    ) {
        let Some(&uid) = self.call_ids.get(&(node, inc, session, call)) else {
            self.violation(
                now_ms,
                format!("node {node}: outcome of unknown call {call}"),
            );
            return;
        };
        let idx = (uid & !CALL_UID) as usize;
        let Some(c) = self.calls.get(idx).cloned() else {
            return;
        };
        if c.outcome != CallOutcome::Pending {
            self.violation(now_ms, format!("call {uid}: a second outcome {result:?}"));
            return;
        }
        let outcome = match result {
            Ok(reply) => {
                if *reply != answer(&make_payload(uid, c.len)) {
                    self.violation(now_ms, format!("call {uid}: wrong reply"));
                }
                if c.executions == 0 {
                    self.violation(now_ms, format!("call {uid}: answered but never ran"));
                }
                CallOutcome::Answered
            }
            Err(CallFailure::Timeout) => CallOutcome::TimedOut,
            Err(CallFailure::SessionEnded(_)) => CallOutcome::SessionEnded,
            Err(e) => {
                self.violation(now_ms, format!("call {uid}: unexpected failure {e}"));
                CallOutcome::SessionEnded
            }
        };
        self.calls[idx].outcome = outcome;
    }

    /// Calls of live callers with no outcome yet.
    pub fn calls_pending(&self) -> usize {
        self.calls
            .iter()
            .filter(|c| c.outcome == CallOutcome::Pending)
            .count()
    }

    /// Calls by outcome, and how many ran.
    pub fn call_tally(&self) -> CallTally {
        let mut t = CallTally {
            calls: self.calls.len() as u64,
            ..CallTally::default()
        };
        for c in &self.calls {
            match c.outcome {
                CallOutcome::Pending => t.pending += 1,
                CallOutcome::Answered => t.answered += 1,
                CallOutcome::TimedOut => t.timed_out += 1,
                CallOutcome::SessionEnded => t.session_ended += 1,
                CallOutcome::CallerDied => t.caller_died += 1,
            }
            if c.executions > 0 {
                t.executed += 1;
            }
        }
        t
    }

    /// Messages still pending.
    pub fn pending(&self) -> usize {
        self.records
            .iter()
            .filter(|r| r.outcome == Outcome::Pending)
            .count()
    }

    /// Counts per outcome.
    pub fn tally(&self) -> Tally {
        let mut t = Tally {
            sent: self.records.len() as u64,
            ..Tally::default()
        };
        for r in &self.records {
            match r.outcome {
                Outcome::Pending => t.pending += 1,
                Outcome::Delivered => t.delivered += 1,
                Outcome::Abandoned => t.abandoned += 1,
                Outcome::DeliveredAndAbandoned => {
                    t.delivered += 1;
                    t.abandoned_but_delivered += 1
                }
                Outcome::SenderDied => t.sender_died += 1,
            }
        }
        debug_assert_eq!(t.pending, self.pending as u64);
        t.duplicates = self.duplicates;
        t.out_of_order = self.out_of_order;
        t
    }

    /// The first few pending messages, for a failure report.
    pub fn describe_pending(&self, max: usize) -> Vec<String> {
        self.records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.outcome == Outcome::Pending)
            .take(max)
            .map(|(uid, r)| format!("uid {uid}: {} -> {} {:?}", r.src, r.dst, r.id))
            .collect()
    }
}

/// Counts of call outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTally {
    /// Calls made.
    pub calls: u64,
    /// Answered with the right reply.
    pub answered: u64,
    /// Failed with a timeout.
    pub timed_out: u64,
    /// Failed because their session ended.
    pub session_ended: u64,
    /// Lost with their caller's process.
    pub caller_died: u64,
    /// No outcome (a loss, if the run has drained).
    pub pending: u64,
    /// Calls that ran (each at most once).
    pub executed: u64,
}

/// Counts of outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Accepted by `send`.
    pub sent: u64,
    /// Delivered exactly once.
    pub delivered: u64,
    /// Reported abandoned and not delivered.
    pub abandoned: u64,
    /// Reported abandoned though delivered.
    pub abandoned_but_delivered: u64,
    /// Lost with their sender's process.
    pub sender_died: u64,
    /// Still pending (a loss, if the run has drained).
    pub pending: u64,
    /// Delivered more than once.
    pub duplicates: u64,
    /// Delivered out of order within their channel.
    pub out_of_order: u64,
}
