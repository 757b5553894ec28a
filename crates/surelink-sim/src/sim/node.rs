//! What a node does with a job: bytes arriving, a path up or down, a
//! timer, the workload's sends and calls, its worker finishing; held in an
//! inbox while the process is paused. After each job the node's endpoint
//! is drained (transmissions onto the network, events to the checker and
//! the node's scheduler) and its next timer scheduled.

use bytes::BytesMut;
use rand::RngExt;
use surelink_proto::rpc::{CallOptions, Scheduler, TicketKey};
use surelink_proto::{ChannelId, Event, SendError};

use super::{ms, node_id, Action, Job, Sim};
use crate::checker::make_payload;

impl Sim {
    pub(super) fn node_action(&mut self, n: usize, action: Action) {
        let node = &mut self.nodes[n];
        if self.world.now < node.paused_until || !node.inbox.is_empty() {
            node.inbox.push_back(action);
            if !node.resume_scheduled {
                node.resume_scheduled = true;
                let at = node.paused_until;
                self.schedule(at, Job::Resume(n));
            }
            return;
        }
        self.apply(n, action);
        self.service(n);
    }

    pub(super) fn resume(&mut self, n: usize) {
        self.nodes[n].resume_scheduled = false;
        if self.world.now < self.nodes[n].paused_until {
            self.nodes[n].resume_scheduled = true;
            let at = self.nodes[n].paused_until;
            self.schedule(at, Job::Resume(n));
            return;
        }
        while let Some(a) = self.nodes[n].inbox.pop_front() {
            self.apply(n, a);
        }
        // Timers that expired during the pause fire now.
        self.nodes[n].wake_at = None;
        self.world.handle_timeout(n);
        self.service(n);
    }

    pub(super) fn apply(&mut self, n: usize, action: Action) {
        let now = self.world.now;
        match action {
            Action::Deliver {
                link,
                gen,
                dir,
                bytes,
            } => {
                let Some(c) = self.links[link].conn.as_mut().filter(|c| c.gen == gen) else {
                    return; // connection gone
                };
                let path = if dir == 0 { c.b_path } else { c.a_path };
                let mut buf = match &mut c.sec {
                    None => BytesMut::from(&bytes[..]),
                    Some(sec) => {
                        // The receiving side is the one the bytes travel to.
                        let side = 1 - dir;
                        match sec.receive(now, side, &bytes) {
                            Ok(r) => {
                                if let Some(reply) = r.reply {
                                    self.send_on(link, gen, side, reply);
                                }
                                if r.established {
                                    self.handshakes += 1;
                                    self.handshakes_resumed += u64::from(r.resumed);
                                    let l = &self.links[link];
                                    let dial = (side == 0).then(|| node_id(l.b));
                                    self.apply(
                                        n,
                                        Action::AddPath {
                                            link,
                                            gen,
                                            path,
                                            dial,
                                        },
                                    );
                                }
                                r.plaintext
                            }
                            Err(e) => {
                                if std::env::var_os("SIM_TRACE").is_some() {
                                    eprintln!("t={:.3}ms node {n}: link {link}: {e}", ms(now));
                                }
                                match e {
                                    crate::secure::Broken::Handshake(_) => {
                                        self.handshakes_failed += 1;
                                    }
                                    crate::secure::Broken::Record(_) => self.records_refused += 1,
                                }
                                self.drop_conn(link, gen);
                                return;
                            }
                        }
                    }
                };
                if buf.is_empty() || !self.nodes[n].paths.contains_key(&path) {
                    return; // nothing for the core, or this end already closed it
                }
                // On error the core queues a CLOSE and reports PathClosed, after
                // which `service` closes the transport.
                let _ = self.world.input(n, path, &mut buf);
            }
            Action::AddPath {
                link,
                gen,
                path,
                dial,
            } => {
                if !matches!(&self.links[link].conn, Some(c) if c.gen == gen) {
                    return;
                }
                self.nodes[n].paths.insert(path, (link, gen));
                if self.world[n].add_path(now, path, dial).is_err() {
                    self.drop_conn(link, gen);
                }
            }
            Action::PathDown { path } => {
                self.nodes[n].paths.remove(&path);
                self.world[n].handle_path_down(now, path);
            }
            Action::Wake => {
                let node = &mut self.nodes[n];
                if node.wake_at.is_some_and(|t| t <= now) {
                    node.wake_at = None;
                    if node.last_wake == now {
                        node.spins += 1;
                        if node.spins == 10_000 {
                            self.checker.violations.push(format!(
                                "t={:.3}ms: node {n} timer livelock (wakes at one instant)",
                                ms(now)
                            ));
                        }
                    } else {
                        node.spins = 0;
                        node.last_wake = now;
                    }
                    if node.spins < 10_000 {
                        self.world.handle_timeout(n);
                    }
                }
            }
            Action::AppTick(inc) => {
                if inc != self.nodes[n].incarnation {
                    return;
                }
                self.app_send(n);
                let w = &self.cfg.workload;
                if now.since_origin() + w.interval < w.until {
                    let at = now + w.interval;
                    self.schedule(at, Job::Node(n, Action::AppTick(inc)));
                }
            }
            Action::CallTick(inc) => {
                if inc != self.nodes[n].incarnation {
                    return;
                }
                self.app_call(n);
                let w = &self.cfg.workload;
                if let Some(every) = w.call_every {
                    if now.since_origin() + every < w.until {
                        self.schedule(now + every, Job::Node(n, Action::CallTick(inc)));
                    }
                }
            }
            Action::Complete(inc, t) => {
                let node = &mut self.nodes[n];
                if inc != node.incarnation {
                    return; // the process that ran it is gone
                }
                node.busy = false;
                let reply = crate::checker::answer(&t.body);
                // Refused if the session ended meanwhile: the caller learns
                // that from its own side.
                let _ = self.world[n].complete(now, t.session, t.call, Ok(reply));
            }
        }
    }

    /// A random node other than `n` (none in a one-node run).
    pub(super) fn other_node(&mut self, n: usize) -> Option<usize> {
        if self.cfg.nodes < 2 {
            return None;
        }
        let dst = self.rng.random_range(0..self.cfg.nodes - 1);
        Some(if dst >= n { dst + 1 } else { dst })
    }

    pub(super) fn app_call(&mut self, n: usize) {
        let Some(dst) = self.other_node(n) else {
            return;
        };
        let channel = ChannelId(self.rng.random_range(0..self.cfg.workload.channels.max(1)));
        let len = self
            .rng
            .random_range(8..=self.cfg.workload.max_len.clamp(8, 256));
        let uid = self.checker.next_call_uid();
        let body = make_payload(uid, len);
        let now = self.world.now;
        let opts = CallOptions::new(self.cfg.workload.call_timeout);
        match self.world[n].call(now, node_id(dst), channel, body, &opts) {
            Ok((session, call)) => {
                let inc = self.nodes[n].incarnation;
                self.checker
                    .call_started(ms(now), uid, n, inc, dst, session, call, len);
            }
            Err(SendError::Full { .. }) => self.refused_full += 1,
            Err(e) => self
                .checker
                .violations
                .push(format!("node {n}: call refused: {e}")),
        }
    }

    pub(super) fn app_send(&mut self, n: usize) {
        let Some(dst) = self.other_node(n) else {
            return;
        };
        let channel = ChannelId(self.rng.random_range(0..self.cfg.workload.channels.max(1)));
        for _ in 0..self.cfg.workload.burst.max(1) {
            let len = self.rng.random_range(8..=self.cfg.workload.max_len.max(8));
            let uid = self.checker.next_uid();
            let payload = make_payload(uid, len);
            let now = self.world.now;
            match self.world[n].send(now, node_id(dst), channel, payload) {
                Ok(id) => {
                    let inc = self.nodes[n].incarnation;
                    self.checker.sent(ms(now), uid, n, inc, dst, id, len);
                }
                Err(SendError::Full { .. }) => self.refused_full += 1,
                Err(e) => self
                    .checker
                    .violations
                    .push(format!("node {n}: send failed: {e}")),
            }
        }
    }

    /// Drains a node's outputs: transmissions, events, and its timer.
    pub(super) fn service(&mut self, n: usize) {
        let now = self.world.now;
        for round in 0.. {
            if round == 1_000_000 {
                self.checker.violations.push(format!(
                    "t={:.3}ms: node {n} poll_transmit never returns None",
                    ms(now)
                ));
                break;
            }
            let Some((path, bytes)) = self.world.transmit(n) else {
                break;
            };
            self.carry(n, path, bytes);
        }
        for ev in self.world.take_events(n) {
            let inc = self.nodes[n].incarnation;
            if std::env::var_os("SIM_TRACE").is_some() && !matches!(ev, Event::Message { .. }) {
                eprintln!("t={:.3}ms node {n}.{inc}: {ev:?}", ms(now));
            }
            self.checker.event(ms(now), n, inc, &ev, &self.ids);
            match ev {
                Event::PathClosed { path, .. } => {
                    // The core is done with the path; close the transport.
                    if let Some((link, gen)) = self.nodes[n].paths.remove(&path) {
                        self.close_conn_from(n, link, gen);
                    }
                }
                Event::Request(t) => {
                    let key = TicketKey {
                        session: t.session.0,
                        call: t.call,
                    };
                    let prio = t.priority;
                    self.nodes[n].sched.push(now, key, prio, t);
                }
                Event::Promote { session, call, .. } => {
                    self.nodes[n].sched.promote(TicketKey {
                        session: session.0,
                        call,
                    });
                }
                Event::SessionEnded { session, .. } => {
                    self.nodes[n].sched.remove_session(session.0);
                }
                _ => {}
            }
        }
        // The node's one worker takes the next request.
        if !self.nodes[n].busy {
            if let Some(d) = self.nodes[n].sched.pop(now) {
                let inc = self.nodes[n].incarnation;
                self.checker.executed(ms(now), n, &d.item.body);
                self.nodes[n].busy = true;
                let at = now + self.cfg.workload.service;
                self.schedule(at, Job::Node(n, Action::Complete(inc, Box::new(d.item))));
            }
        }
        // Memory bounds, checked after every step.
        for (peer, cache, recv) in self.world[n].session_buffers() {
            self.peak_cache = self.peak_cache.max(cache);
            self.peak_recv = self.peak_recv.max(recv);
            if cache > self.cfg.endpoint.send_buffer
                || recv > u64::from(self.cfg.endpoint.recv_window)
            {
                self.checker.violations.push(format!(
                    "t={:.3}ms: node {n} session with {peer}: cache {cache} / recv {recv} bytes over the bound",
                    ms(now)
                ));
            }
        }
        if let Some(t) = self.world[n].poll_timeout() {
            let node = &mut self.nodes[n];
            if node.wake_at.is_none_or(|w| t < w) {
                node.wake_at = Some(t);
                self.schedule(t, Job::Node(n, Action::Wake));
            }
        }
    }
}
