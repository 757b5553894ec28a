//! The promises, checked on every run: nothing lost, nothing duplicated,
//! order kept per channel, and every message either delivered or reported.

use std::collections::{BTreeMap, HashMap};

use bytes::{BufMut, Bytes, BytesMut};
use surelink_proto::{ChannelId, Event, MessageId, NodeId, SessionId};

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

/// Tracks every message and checks each delivery against the promises.
#[derive(Debug, Default)]
pub struct Checker {
    records: Vec<Record>,
    /// (src node, src incarnation, session, channel, seq) -> uid
    by_id: HashMap<(usize, u32, SessionId, ChannelId, u64), u64>,
    /// (dst node, dst incarnation, session at dst, channel) -> next expected seq
    order: HashMap<(usize, u32, SessionId, ChannelId), u64>,
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
            .insert((src, src_incarnation, id.session, id.channel, id.seq), uid);
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
            Event::Message {
                peer,
                session,
                channel,
                seq,
                payload,
            } => {
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
                if rec.id.channel != *channel || rec.id.seq != *seq {
                    self.violation(
                        now_ms,
                        format!(
                            "uid {uid} sent as {:?} delivered as channel {channel} seq {seq}",
                            rec.id
                        ),
                    );
                }
                let next = self
                    .order
                    .entry((node, inc, *session, *channel))
                    .or_insert(0);
                if *seq != *next {
                    let expected = *next;
                    self.out_of_order += 1;
                    self.violation(
                        now_ms,
                        format!("node {node} session {session} channel {channel}: got seq {seq}, expected {expected}"),
                    );
                }
                *self
                    .order
                    .entry((node, inc, *session, *channel))
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
                channel,
                seq,
                ..
            } => {
                if let Some(&uid) = self.by_id.get(&(node, inc, *session, *channel, *seq)) {
                    let r = &mut self.records[uid as usize];
                    if r.outcome == Outcome::Pending {
                        r.outcome = Outcome::Abandoned;
                        self.pending -= 1;
                    }
                }
            }
            Event::SessionEnded {
                session, abandoned, ..
            } => {
                for a in abandoned {
                    for seq in a.start..a.end {
                        let Some(&uid) = self.by_id.get(&(node, inc, *session, a.channel, seq))
                        else {
                            self.violation(
                                now_ms,
                                format!(
                                    "node {node}: abandoned unknown message {session}/{}/{seq}",
                                    a.channel
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

    /// Node `node`'s process died: its undelivered messages may be lost.
    pub fn sender_died(&mut self, node: usize, inc: u32) {
        for r in &mut self.records {
            if r.src == node && r.src_incarnation == inc && r.outcome == Outcome::Pending {
                r.outcome = Outcome::SenderDied;
                self.pending -= 1;
            }
        }
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
