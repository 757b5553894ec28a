//! A PostMan helper on a link (`SimConfig::helper_links`): the link's
//! transmissions do not cross on their own but through a helper that
//! packs them as the product's relay records (`helper::Record`, 7-byte
//! header, the link's slot) into batches the core's [`Batcher`] decides
//! (self-clocking by default), and splits them at the far side with
//! `helper::decode_records`. What the two sessions exchange through it is
//! exactly what they would exchange directly, sealed as they sealed it;
//! the helper only delays, holds, drops or cuts.
//!
//! The helper's own session to the server is modelled as an in-order
//! carrier with the link's latency while the helper lives (its own
//! reliability is what the sessions prove elsewhere in the simulator).
//! Its faults: `HelperPause` (frozen: it holds what it has and what
//! arrives, and sends nothing, until it resumes), `HelperCrash` (it dies
//! with everything it holds: the client's connection resets at once, the
//! server learns of it only `HELPER_DEAD_AFTER` later, as from its
//! detector; a new helper is dialled after `reconnect_after`), and a
//! helper cut off is the link's own `LinkDown` / `OneWay`.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use surelink_proto::helper::{decode_records, Batcher, BatcherConfig, Record};
use surelink_proto::Time;

use super::{Action, Job, Sim};

/// How long after a helper's death the server side of its path is told
/// (the helper's session reported dead by the server's detector).
pub(super) const HELPER_DEAD_AFTER: Duration = Duration::from_millis(300);

/// One helper's state on a link.
#[derive(Debug)]
pub(super) struct HelperModel {
    cfg: BatcherConfig,
    /// Per direction (0: a to b): the batching decision.
    batcher: [Batcher; 2],
    /// Per direction: encoded records waiting, with their connection's
    /// generation.
    queued: [VecDeque<(u64, Bytes)>; 2],
    /// Frozen until then.
    paused_until: Time,
    /// A flush job is scheduled for this time (per direction).
    wake_at: [Option<Time>; 2],
    /// Batches sent (both directions).
    pub(super) batches: u64,
    /// Records carried (both directions).
    pub(super) records: u64,
}

impl HelperModel {
    pub(super) fn new(cfg: BatcherConfig) -> HelperModel {
        let b = Batcher::new(cfg.clone()).expect("simulator helper batching is valid");
        HelperModel {
            batcher: [b.clone(), b],
            cfg,
            queued: [VecDeque::new(), VecDeque::new()],
            paused_until: Time::ZERO,
            wake_at: [None, None],
            batches: 0,
            records: 0,
        }
    }
}

impl Sim {
    /// A transmission of connection `gen` reached the helper of `link`.
    pub(super) fn helper_queue(&mut self, link: usize, gen: u64, dir: usize, bytes: Bytes) {
        let now = self.world.now;
        let Some(h) = self.links[link].helper.as_mut() else {
            return;
        };
        let rec = Record::Data {
            slot: u32::try_from(link).unwrap_or(0),
            body: bytes,
        };
        let mut out = BytesMut::with_capacity(rec.encoded_len());
        if rec.encode(&mut out).is_err() {
            return;
        }
        // Anything from the far side answers what went to it (as the
        // helper's shell counts any reply from the server).
        h.batcher[1 - dir].handle_answered(now, u64::MAX);
        if h.batcher[dir].handle_queued(now, out.len()).is_err() {
            // The helper's bound: it refuses (the session re-sends).
            return;
        }
        h.queued[dir].push_back((gen, out.freeze()));
        self.helper_flush(link, dir);
        self.helper_flush(link, 1 - dir);
    }

    /// Sends what the batcher says is due in direction `dir`, and sets
    /// the next flush job.
    pub(super) fn helper_flush(&mut self, link: usize, dir: usize) {
        let now = self.world.now;
        let current = self.links[link].conn.as_ref().map(|c| c.gen);
        let Some(h) = self.links[link].helper.as_mut() else {
            return;
        };
        if h.wake_at[dir].is_some_and(|t| t <= now) {
            h.wake_at[dir] = None;
        }
        if now < h.paused_until {
            let at = h.paused_until;
            if h.wake_at[dir].is_none_or(|t| t > at) {
                h.wake_at[dir] = Some(at);
                self.schedule(at, Job::HelperFlush { link, dir });
            }
            return;
        }
        let mut batches = Vec::new();
        while let Some(f) = h.batcher[dir].poll_flush(now) {
            let mut msg = BytesMut::with_capacity(f.bytes);
            let mut gen = None;
            for _ in 0..f.messages {
                let Some((g, rec)) = h.queued[dir].pop_front() else {
                    break;
                };
                // A record of a connection that is gone goes nowhere.
                if Some(g) == current {
                    gen = Some(g);
                    msg.extend_from_slice(&rec);
                    h.records += 1;
                }
            }
            if let Some(g) = gen {
                h.batches += 1;
                batches.push((g, msg.freeze()));
            }
        }
        if let Some(at) = h.batcher[dir].poll_timeout() {
            if h.wake_at[dir].is_none_or(|t| t > at) {
                h.wake_at[dir] = Some(at);
                self.schedule(at, Job::HelperFlush { link, dir });
            }
        }
        for (gen, msg) in batches {
            self.helper_send(link, gen, dir, msg);
        }
    }

    /// One batch over the helper's session: in order, after the latency.
    fn helper_send(&mut self, link: usize, gen: u64, dir: usize, msg: Bytes) {
        let mut at = self.world.now + self.cfg.link.latency;
        let Some(conn) = self.links[link].conn.as_mut().filter(|c| c.gen == gen) else {
            return;
        };
        at = at.max(conn.last_arrival[dir]);
        conn.last_arrival[dir] = at;
        self.schedule(
            at,
            Job::HelperArrive {
                link,
                gen,
                dir,
                msg,
            },
        );
    }

    /// A batch reached the far side: its records, split, are the
    /// connection's bytes.
    pub(super) fn helper_arrive(&mut self, link: usize, gen: u64, dir: usize, msg: Bytes) {
        let l = &self.links[link];
        if l.conn.as_ref().is_none_or(|c| c.gen != gen) {
            return;
        }
        let to = if dir == 0 { l.b } else { l.a };
        let Ok(records) = decode_records(msg) else {
            self.checker
                .violations
                .push(format!("link {link}: a helper batch did not decode"));
            return;
        };
        let now = self.world.now;
        for r in records {
            if let Record::Data { body, .. } = r {
                let bytes = body;
                self.schedule(
                    now,
                    Job::Node(
                        to,
                        Action::Deliver {
                            link,
                            gen,
                            dir,
                            bytes,
                        },
                    ),
                );
            }
        }
    }

    /// The helper of `link` dies with what it holds; a new one takes its
    /// place when the link is dialled again.
    pub(super) fn helper_crash(&mut self, link: usize) {
        let now = self.world.now;
        let l = &mut self.links[link];
        let Some(h) = l.helper.as_mut() else {
            return;
        };
        let (batches, records) = (h.batches, h.records);
        let mut fresh = HelperModel::new(h.cfg.clone());
        fresh.batches = batches;
        fresh.records = records;
        **h = fresh;
        let Some(conn) = l.conn.take() else {
            return;
        };
        let (a, b) = (l.a, l.b);
        // The client's connection to the helper resets now; the server
        // hears of the helper's death from its detector, later.
        self.schedule(now, Job::Node(a, Action::PathDown { path: conn.a_path }));
        self.schedule(
            now + HELPER_DEAD_AFTER,
            Job::Node(b, Action::PathDown { path: conn.b_path }),
        );
        self.schedule_reconnect(link);
    }

    /// The helper of `link` freezes for `dur`.
    pub(super) fn helper_pause(&mut self, link: usize, dur: Duration) {
        let now = self.world.now;
        if let Some(h) = self.links[link].helper.as_mut() {
            h.paused_until = h.paused_until.max(now + dur);
        }
        for dir in 0..2 {
            self.helper_flush(link, dir);
        }
    }
}
