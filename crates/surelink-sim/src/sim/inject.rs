//! The fault schedule applied: links down (both ways or one), loss,
//! connection resets, process pauses and restarts, each started and ended
//! by a job. Overlapping faults on one link count, so the link comes back
//! only when the last one ends.

use std::time::Duration;

use surelink_proto::rpc::PriorityScheduler;
use surelink_proto::Time;

use super::{Action, Job, Sim};
use crate::faults::Fault;

/// The directions a loss fault covers: a to b, b to a, or both.
fn loss_dirs(one_way: Option<bool>) -> &'static [usize] {
    match one_way {
        Some(true) => &[0],
        Some(false) => &[1],
        None => &[0, 1],
    }
}

impl Sim {
    pub(super) fn fault(&mut self, f: Fault) {
        let now = self.world.now;
        match &f {
            Fault::LinkDown { link, dur, .. } | Fault::OneWay { link, dur, .. } => {
                let dirs: &[usize] = match &f {
                    Fault::OneWay { a_to_b: true, .. } => &[0],
                    Fault::OneWay { a_to_b: false, .. } => &[1],
                    _ => &[0, 1],
                };
                let l = &mut self.links[*link];
                for &d in dirs {
                    l.down_count[d] += 1;
                    l.up[d] = false;
                }
                if let (Some(after), Some(conn)) = (self.cfg.detect_after, &l.conn) {
                    let gen = conn.gen;
                    self.schedule(now + after, Job::Detect { link: *link, gen });
                }
                let end = now + *dur;
                self.schedule(end, Job::FaultEnd(f));
            }
            Fault::Loss {
                link,
                percent,
                dur,
                one_way,
                ..
            } => {
                let l = &mut self.links[*link];
                for &d in loss_dirs(*one_way) {
                    l.loss_count[d] += 1;
                    l.loss[d] = f64::from(*percent) / 100.0;
                }
                let end = now + *dur;
                self.schedule(end, Job::FaultEnd(f));
            }
            Fault::Reset { link, .. } => {
                if let Some(gen) = self.links[*link].conn.as_ref().map(|c| c.gen) {
                    self.drop_conn(*link, gen);
                }
            }
            Fault::Pause { node, dur, .. } => {
                let nd = &mut self.nodes[*node];
                nd.paused_until = nd.paused_until.max(now + *dur);
            }
            Fault::Restart { node, .. } => self.restart(*node),
            Fault::HelperPause { link, dur, .. } => self.helper_pause(*link, *dur),
            Fault::HelperCrash { link, .. } => self.helper_crash(*link),
        }
    }

    pub(super) fn fault_end(&mut self, f: Fault) {
        match f {
            Fault::LinkDown { link, .. } | Fault::OneWay { link, .. } => {
                let dirs: &[usize] = match &f {
                    Fault::OneWay { a_to_b: true, .. } => &[0],
                    Fault::OneWay { a_to_b: false, .. } => &[1],
                    _ => &[0, 1],
                };
                let l = &mut self.links[link];
                for &d in dirs {
                    l.down_count[d] -= 1;
                    l.up[d] = l.down_count[d] == 0;
                }
            }
            Fault::Loss { link, one_way, .. } => {
                let l = &mut self.links[link];
                for &d in loss_dirs(one_way) {
                    l.loss_count[d] -= 1;
                    if l.loss_count[d] == 0 {
                        l.loss[d] = 0.0;
                    }
                }
            }
            _ => {}
        }
    }

    pub(super) fn restart(&mut self, n: usize) {
        let inc = self.nodes[n].incarnation;
        self.checker.sender_died(n, inc);
        let node = &mut self.nodes[n];
        node.incarnation += 1;
        let ep = Self::endpoint(&self.cfg, n, node.incarnation);
        self.world.replace(n, ep);
        let node = &mut self.nodes[n];
        node.inbox.clear();
        node.paths.clear();
        node.wake_at = None;
        node.paused_until = Time::ZERO;
        node.sched = PriorityScheduler::new(Duration::from_millis(50));
        node.busy = false;
        // The kernel resets every connection of the dead process; peers see
        // the reset after one latency.
        let at = self.world.now + self.cfg.link.latency;
        for link in 0..self.links.len() {
            let l = &mut self.links[link];
            if l.a != n && l.b != n {
                continue;
            }
            if let Some(conn) = l.conn.take() {
                let (other, path) = if l.a == n {
                    (l.b, conn.b_path)
                } else {
                    (l.a, conn.a_path)
                };
                self.schedule(at, Job::Node(other, Action::PathDown { path }));
                self.schedule_reconnect(link);
            }
        }
        let now = self.world.now;
        if now.since_origin() < self.cfg.workload.until {
            let inc = self.nodes[n].incarnation;
            self.schedule(now, Job::Node(n, Action::AppTick(inc)));
            if self.cfg.workload.call_every.is_some() {
                self.schedule(now, Job::Node(n, Action::CallTick(inc)));
            }
        }
    }
}
