//! The monitor's checks: which paths and peers are suspect when a window
//! ends, the barrier round they start, and when the next check is due.

use super::{nanos, DetectorMode, Monitor, MonitorAction, NodeId, Round, Suspect, Time};

impl Monitor {
    /// Runs the checks due by `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        if self
            .round
            .as_ref()
            .is_some_and(|r| self.barrier_lost(r, now))
        {
            // No report for this round; the next check starts another.
            self.round = None;
            self.stats.barriers_lost += 1;
        }
        if now < self.next_check {
            return;
        }
        self.fail_over_or_abandon_held(now);
        let start_of = |window| Time::from_nanos(now.as_nanos().saturating_sub(nanos(window)));
        let mut suspects: Vec<(Suspect, Time)> = Vec::new();
        // The earliest window still open: the next check.
        let mut next = Time::from_nanos(u64::MAX);
        for (w, p) in &self.paths {
            if p.down {
                for t in [p.failover_at, p.abandon_at].into_iter().flatten() {
                    next = next.min(t);
                }
                continue;
            }
            let widest = self.config.slow_path_timeout();
            let window = self
                .window(p.pace)
                .max(self.drop_window(*w, p.queue, now, widest));
            let asked = p.asked.filter(|(t, _)| p.last_heard < *t);
            if p.last_heard + window < now {
                suspects.push((Suspect::Path(*w), start_of(window)));
            } else if let Some((t, _)) = asked.filter(|(t, within)| *t + *within < now) {
                // Asked for the busy pace, and nothing since.
                suspects.push((Suspect::Path(*w), t));
            } else {
                next = next.min(p.last_heard + window);
                if let Some((t, within)) = asked {
                    next = next.min(t + within);
                }
            }
        }
        // Per peer: heard last, and its widest dead window (a slow path's).
        let mut last: Option<(NodeId, Time, std::time::Duration)> = None;
        let mut peers: Vec<(NodeId, Time, std::time::Duration)> = Vec::new();
        for (w, p) in &self.paths {
            let window = self.peer_window(p.pace).max(self.drop_window(
                *w,
                p.queue,
                now,
                self.config.slow_timeout(),
            ));
            match &mut last {
                Some((peer, t, pw)) if *peer == w.peer => {
                    *t = (*t).max(p.last_heard);
                    *pw = (*pw).max(window);
                }
                _ => {
                    peers.extend(last.take());
                    last = Some((w.peer, p.last_heard, window));
                }
            }
        }
        peers.extend(last);
        for (peer, heard, peer_window) in peers {
            if self.dead.contains_key(&peer) {
                continue;
            }
            if heard + peer_window < now {
                suspects.push((Suspect::Peer(peer), start_of(peer_window)));
            } else {
                next = next.min(heard + peer_window);
            }
        }
        // A suspect not reported this time (a round under way, a drop)
        // is looked at again after `check_every`; otherwise the next
        // window's end, but late checks do not pile up.
        let floor = now + self.config.check_every;
        self.next_check = if suspects.is_empty() {
            (next + std::time::Duration::from_micros(1)).max(floor)
        } else {
            floor
        };
        if suspects.is_empty() {
            return;
        }
        match self.config.mode {
            DetectorMode::Plain => {
                self.report(now, suspects.into_iter().map(|(s, _)| s).collect());
            }
            DetectorMode::SafeTimer if self.round.is_none() => {
                let token = self.next_token;
                self.next_token += 1;
                self.stats.barrier_rounds += 1;
                self.round = Some(Round {
                    token,
                    sent_at: now,
                    suspects,
                });
                self.actions.push_back(MonitorAction::SendBarrier { token });
            }
            _ => {}
        }
    }

    /// A drop in the queue a path's heartbeats come through, within
    /// `widest`: the lost datagrams may have said the pace dropped (a
    /// notice, `SLOW`), so the path (or its peer) is watched with `widest`
    /// until that drop is that old. Zero: no such drop. `widest` is
    /// `slow_path_timeout()` for a path, `slow_timeout()` for a peer.
    fn drop_window(
        &self,
        w: super::Watch,
        queue: super::HeartbeatQueue,
        now: Time,
        widest: std::time::Duration,
    ) -> std::time::Duration {
        if self.last_drop(w, queue).is_some_and(|t| t + widest >= now) {
            widest
        } else {
            std::time::Duration::ZERO
        }
    }

    /// The latest drop that may have been one of `w`'s heartbeats.
    fn last_drop(&self, w: super::Watch, queue: super::HeartbeatQueue) -> Option<Time> {
        let private = self.private_drops.get(&w).and_then(|d| d.1);
        let public = match queue {
            super::HeartbeatQueue::Private => None,
            super::HeartbeatQueue::Strays => self.t_stray_drop.max(self.t_drop),
            _ => self.t_drop,
        };
        private.max(public).max(self.t_system_drop)
    }

    /// Whether a round's barrier counts as lost at `now`: overdue and a
    /// drop was counted since it was sent (it may have been the barrier), or
    /// overdue by a whole peer window. A barrier that is merely slow (our
    /// reader stalled) is waited for: sending more would only fill the
    /// stalled queue and cause the very drops that block reports.
    fn barrier_lost(&self, r: &Round, now: Time) -> bool {
        let overdue = now >= r.sent_at + self.config.barrier_timeout;
        let dropped = self.t_drop.is_some_and(|t| t >= r.sent_at);
        let given_up = now >= r.sent_at + self.config.barrier_timeout.max(self.config.timeout);
        (overdue && dropped) || given_up
    }

    /// When to call [`Monitor::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Time {
        match &self.round {
            Some(r) => {
                // When the round would count as lost: soon if a drop was
                // counted since it began (the next check reads the
                // counters), else only when given up — never a time already
                // past, which would make the caller spin.
                let dropped = self.t_drop.is_some_and(|t| t >= r.sent_at);
                let lost = if dropped {
                    r.sent_at + self.config.barrier_timeout
                } else {
                    r.sent_at + self.config.barrier_timeout.max(self.config.timeout)
                };
                self.next_check.min(lost)
            }
            None => self.next_check,
        }
    }
}
