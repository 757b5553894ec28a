//! The monitor's drop counters and the end of a barrier round: which
//! suspects a round reports (see "Two queues" and "Private queues" in the
//! parent module).

use std::collections::BTreeMap;

use super::{HeartbeatQueue, Monitor, QueuesAtBarrier, StraysAtBarrier, Watch};
use crate::ids::Epoch;
use crate::time::Time;

impl Monitor {
    /// The drop counters' total, read at `now` outside a barrier round
    /// (once at start, so the first round has something to compare with).
    pub fn handle_drop_count(&mut self, now: Time, total: u64) {
        if let Some(before) = self.drops {
            if total != before {
                self.t_drop = Some(now);
            }
        }
        self.drops = Some(total);
    }

    /// The strays' queue's drop counter total, read at `now` (only a shell
    /// with two queues calls this).
    pub fn handle_stray_drop_count(&mut self, now: Time, total: u64) {
        if self.stray_drops.is_some_and(|before| before != total) {
            self.t_stray_drop = Some(now);
        }
        self.stray_drops = Some(total);
    }

    /// The interfaces' and per-CPU backlogs' drop total alone, read at
    /// `now` (a shell with private queues; see "Private queues").
    pub fn handle_system_drop_count(&mut self, now: Time, total: u64) {
        if self.system_drops.is_some_and(|before| before != total) {
            self.t_system_drop = Some(now);
        }
        self.system_drops = Some(total);
    }

    /// The private queue of `watch`'s drop total, read at `now`. A drop is
    /// dated by the reading that first sees it (later than it happened, so
    /// it holds back more, never less).
    pub fn handle_private_drop_count(&mut self, now: Time, watch: Watch, total: u64) {
        let e = self.private_drops.entry(watch).or_insert((total, None));
        if e.0 != total {
            *e = (total, Some(now));
        }
    }

    /// The private socket of `watch` was replaced (its peer's address
    /// moved): the peer does not know the new port yet, so the path is
    /// treated as public until a heartbeat comes out of the new one.
    pub fn handle_private_reset(&mut self, watch: Watch) {
        if let Some(p) = self.paths.get_mut(&watch) {
            if p.queue == HeartbeatQueue::Private {
                p.queue = HeartbeatQueue::Members;
            }
        }
        self.private_drops.remove(&watch);
    }

    /// A heartbeat of `epoch` on `watch` says its sender's fence counted
    /// the public copy (its private copies are not acknowledged, or no
    /// longer): the path is public again until a committed one comes out
    /// of the private queue.
    pub fn handle_private_uncommitted(&mut self, watch: Watch, epoch: Epoch) {
        if let Some(p) = self.paths.get_mut(&watch) {
            if p.epoch == epoch && p.queue == HeartbeatQueue::Private {
                p.queue = HeartbeatQueue::Members;
            }
        }
    }

    /// Every barrier of round `token` came out of the heartbeat queue; the
    /// drop counters read right after total `drops`. (One queue: nothing
    /// can be waiting elsewhere.)
    pub fn handle_barrier(&mut self, now: Time, token: u64, drops: u64) {
        self.finish_round(now, token, drops, None);
    }

    /// [`Monitor::handle_barrier`] for a shell with two queues: the
    /// barriers came out of the members' queue, and `strays` is the other
    /// one as the round ends.
    pub fn handle_barrier_steered(
        &mut self,
        now: Time,
        token: u64,
        drops: u64,
        strays: StraysAtBarrier,
    ) {
        self.finish_round(now, token, drops, Some(strays));
    }

    /// The barriers of round `token` came out of the shell's own private
    /// barrier socket (so the per-CPU backlogs are clear up to when they
    /// were sent), and `queues` is every heartbeat queue as the round ends.
    pub fn handle_barrier_queues(&mut self, now: Time, token: u64, queues: &QueuesAtBarrier) {
        self.finish_round_queues(now, token, queues);
    }

    fn finish_round(&mut self, now: Time, token: u64, drops: u64, strays: Option<StraysAtBarrier>) {
        self.finish_round_queues(
            now,
            token,
            &QueuesAtBarrier {
                drops,
                system_drops: self.system_drops.unwrap_or(0),
                members_empty: true,
                strays,
                private: Vec::new(),
                unread_streams: Vec::new(),
            },
        );
    }

    fn finish_round_queues(&mut self, now: Time, token: u64, q: &QueuesAtBarrier) {
        let Some(round) = self.round.take_if(|r| r.token == token) else {
            return;
        };
        self.handle_drop_count(now, q.drops);
        self.handle_system_drop_count(now, q.system_drops);
        let strays_empty = match q.strays {
            Some(s) => {
                self.handle_stray_drop_count(now, s.drops);
                s.empty
            }
            None => true,
        };
        let mut private_empty = BTreeMap::new();
        for (w, s) in &q.private {
            self.handle_private_drop_count(now, *w, s.drops);
            private_empty.insert(*w, s.empty);
        }
        let since = |t: Option<Time>, start: Time| t.is_some_and(|t| t >= start);
        let mut confirmed = Vec::new();
        for (suspect, start) in round.suspects {
            let Some(last_heard) = self.last_heard(suspect) else {
                continue;
            };
            if self.reported(suspect) {
                continue;
            }
            if last_heard >= start {
                // Heard after all: the heartbeat was waiting in our own
                // pipeline.
                self.stats.saved_by_barrier += 1;
                continue;
            }
            if since(self.t_system_drop, start) {
                // Dropped before it reached any queue, maybe.
                self.stats.saved_by_drop += 1;
                continue;
            }
            let watches: Vec<(Watch, HeartbeatQueue)> = self.suspect_paths(suspect).collect();
            let public = watches.iter().any(|(_, q)| *q != HeartbeatQueue::Private);
            if public && (since(self.t_drop, start) || !q.members_empty) {
                // A heartbeat may have been among what we dropped, or still
                // be waiting in the members' queue.
                self.stats.saved_by_drop += 1;
                continue;
            }
            let stray_drop = since(self.t_stray_drop, start);
            let unsorted = watches.iter().any(|(_, q)| *q == HeartbeatQueue::Strays);
            if unsorted && (stray_drop || !strays_empty) {
                // Its heartbeats may go to the strays' queue: dropped
                // there, or still waiting in it (no barrier covers it).
                self.stats.saved_by_stray += 1;
                continue;
            }
            let private_held = watches.iter().any(|(w, q)| {
                *q == HeartbeatQueue::Private
                    && (since(self.private_drops.get(w).and_then(|d| d.1), start)
                        || !private_empty.get(w).copied().unwrap_or(true))
            });
            if private_held {
                self.stats.saved_by_private += 1;
                continue;
            }
            if watches.iter().any(|(w, _)| q.unread_streams.contains(w)) {
                // Its data may be waiting behind our own connection reader.
                self.stats.saved_by_stream += 1;
                continue;
            }
            if stray_drop {
                self.stats.reported_through_stray_drops += 1;
            }
            if !public && since(self.t_drop, start) {
                self.stats.reported_through_member_drops += 1;
            }
            confirmed.push(suspect);
        }
        self.report(now, confirmed);
    }
}
