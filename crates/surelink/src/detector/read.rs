//! A reader thread per heartbeat socket: feeds heartbeats to the monitor
//! in queue order, with the socket's drop count, and the drop counters the
//! barrier check relies on. (Our barriers come back through a private
//! socket: see `private.rs`.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use surelink_proto::detector::datagram::{self, Datagram, MAX_DATAGRAM};
use surelink_proto::detector::HeartbeatQueue;
use surelink_sys::{counters, HeartbeatSocket};

use super::strays::Refused;
use super::{DelayPoint, Detector, SYSTEM_COUNTERS_EVERY};

impl Detector {
    pub(super) fn reader_thread(self: Arc<Self>, network: usize) {
        let Some(sock) = self.socks().get(network).cloned() else {
            return;
        };
        let mut buf = [0u8; MAX_DATAGRAM + 64];
        while !self.closed.load(Ordering::Relaxed) {
            match sock.wait(super::READ_POLL) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    debug!(network, error = %e, "heartbeat wait failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
            // In hand from before it leaves the queue until it is
            // processed (a round's end reads the queue, then this).
            self.members_in_hand.fetch_add(1, Ordering::SeqCst);
            self.read_one(network, &sock, &mut buf);
            self.members_in_hand.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn read_one(&self, network: usize, sock: &HeartbeatSocket, buf: &mut [u8]) {
        let r = match sock.recv(buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return
            }
            Err(e) => {
                debug!(network, error = %e, "heartbeat read failed");
                std::thread::sleep(Duration::from_millis(10));
                return;
            }
        };
        self.stall(DelayPoint::Reader);
        let mut c = self.checker.lock();
        if let Some(d) = r.drops {
            if c.ovfl[network] != u64::from(d) {
                c.ovfl[network] = u64::from(d);
                // Dated now, with the datagram that told us (the checker
                // sleeps until a window ends: dated at its next wake, a
                // drop would hold back reports for longer than it must).
                let total = self.drop_total(&c.ovfl, false);
                c.monitor.handle_drop_count(self.gate.now(), total);
            }
        }
        let bytes = &buf[..r.len.min(buf.len())];
        match datagram::decode_datagram(bytes) {
            Ok(Datagram::Heartbeat { .. }) => {
                let hb = match self.check_heartbeat(bytes) {
                    Ok(hb) => hb,
                    Err(why) => {
                        // Forged, from a stranger: as if never sent.
                        self.refuse(why);
                        self.dispatch(&mut c);
                        return;
                    }
                };
                if let Err(why) =
                    self.accept_heartbeat(&mut c, network, &hb, r.from, HeartbeatQueue::Members)
                {
                    self.refuse(why);
                }
            }
            // Ours come back through a private socket: one here is
            // someone else's.
            Ok(Datagram::Barrier { .. }) => self.refuse(Refused::Barrier),
            Ok(_) => self.refuse(Refused::Malformed),
            Err(e) => {
                self.refuse(Refused::Malformed);
                debug!(network, from = %r.from, error = %e, "datagram ignored");
            }
        }
        self.dispatch(&mut c);
    }

    /// Every receive drop counter that a heartbeat of ours may be in,
    /// summed: the sockets' `SO_RXQ_OVFL` (the socket's own `sk_drops`,
    /// free: it comes with each datagram) and the interfaces' `rx_dropped`
    /// (the device and the per-CPU backlogs; files: read when a barrier
    /// returns, `fresh`, and otherwise at most every
    /// [`SYSTEM_COUNTERS_EVERY`]). Only changes matter. An unreadable
    /// counter counts as a change (no report on a guess).
    ///
    /// Not the host's UDP counters (`RcvbufErrors`/`InErrors` in
    /// `/proc/net/snmp`): every drop at the UDP layer of a datagram bound
    /// for our socket also counts in that socket's `sk_drops`; what they
    /// add is other sockets' drops, and a datagram whose checksum failed
    /// (as a heartbeat it would fail its MAC too: loss on the way). With
    /// them, any socket of the host that overflows — a frozen peer on the
    /// same host among them — held back every report for as long as it
    /// dropped.
    pub(super) fn drop_total(&self, ovfl: &[u64], fresh: bool) -> u64 {
        ovfl.iter()
            .sum::<u64>()
            .wrapping_add(self.system_drop_total(fresh))
    }

    /// The interfaces' drop counters alone (see [`Detector::drop_total`]):
    /// what every queue's packets, private ones too, may meet.
    pub(super) fn system_drop_total(&self, fresh: bool) -> u64 {
        let now = self.gate.now();
        let mut sys = self.system_drops.lock();
        if fresh
            || sys
                .1
                .is_none_or(|at| now.saturating_since(at) >= SYSTEM_COUNTERS_EVERY)
        {
            let mut total = 0u64;
            for i in &self.interfaces {
                match counters::interface_rx_dropped(i) {
                    Ok(n) => total = total.wrapping_add(n),
                    Err(_) => total = total.wrapping_add(now.as_nanos()),
                }
            }
            *sys = (total, Some(now));
        }
        sys.0
    }
}
