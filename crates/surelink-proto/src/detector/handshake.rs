//! The private heartbeat ports' handshake, per peer and network (the
//! heartbeat flags in [`super::datagram`]): what a heartbeat we send says
//! ([`Handshake::flags`]) and where its counted copy goes
//! ([`Handshake::counted`]).
//!
//! We commit to the peer's private port — our fence counts that copy
//! alone, and the public copy thins to every `public_every`th heartbeat —
//! only while the peer says our private copies reach it (an `ACK` within
//! `window`). Until then (behind a relay or NAT that forwards the public
//! port only: for ever) the public copy is the counted one and a private
//! copy goes along as a probe. We say `ACK` while a heartbeat of the
//! peer's current incarnation came out of our private socket for it within
//! `window`.

use std::net::SocketAddr;
use std::time::Duration;

use super::datagram::{FLAG_ACK, FLAG_COMMITTED};
use crate::ids::Epoch;
use crate::time::Time;

/// One path's handshake state (the shell keeps one per peer and network).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handshake {
    /// Where our heartbeats go privately: the peer's address on the
    /// network and the port it gave us.
    pub dest: Option<SocketAddr>,
    /// When a heartbeat of the peer last carried `FLAG_ACK`.
    pub acked_at: Option<Time>,
    /// The peer's newest incarnation we accepted a heartbeat of.
    pub epoch: Option<Epoch>,
    /// When a heartbeat of the peer last came out of our private socket
    /// for it, and of which incarnation.
    pub heard_at: Option<(Epoch, Time)>,
}

/// Where one heartbeat's copies go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copies {
    /// The copy the fence counts.
    pub counted: SocketAddr,
    /// A copy that goes along, uncounted.
    pub extra: Option<SocketAddr>,
    /// The heartbeat's flags.
    pub flags: u16,
}

impl Handshake {
    /// An authentic heartbeat of `epoch` arrived at `now`, its private
    /// port for us `port` (0: none) at `from`'s address, with `flags`.
    pub fn handle_heartbeat(
        &mut self,
        now: Time,
        from: SocketAddr,
        epoch: Epoch,
        port: u16,
        flags: u16,
    ) {
        self.dest = (port != 0).then(|| SocketAddr::new(from.ip(), port));
        self.epoch = Some(epoch);
        if flags & FLAG_ACK != 0 {
            self.acked_at = Some(now);
        }
    }

    /// An authentic heartbeat of `epoch` came out of our private socket
    /// for the peer at `now` (a second copy of one taken counts too).
    pub fn handle_private_arrival(&mut self, now: Time, epoch: Epoch) {
        self.heard_at = Some((epoch, now));
    }

    /// Our private socket for the peer was replaced (destroyed from
    /// outside): nothing has come out of the new one, and the peer may
    /// have lost its own too (`ss -K` takes both ends), so until the peer
    /// acknowledges again our counted copy goes to its public port. Else
    /// each side would send its counted copies to the other's dead port,
    /// each learning the other's new port only from the thinned public
    /// copies — a silence longer than a window, on a working path.
    pub fn handle_socket_replaced(&mut self) {
        self.acked_at = None;
        self.heard_at = None;
    }

    /// Whether our heartbeat at `now` counts the private copy alone: the
    /// peer acknowledged within `window`.
    pub fn committed(&self, now: Time, window: Duration) -> bool {
        self.dest.is_some()
            && self
                .acked_at
                .is_some_and(|t| now.saturating_since(t) <= window)
    }

    /// Whether our heartbeat at `now` tells the peer its private copies
    /// reach us.
    pub fn ack(&self, now: Time, window: Duration) -> bool {
        self.heard_at
            .is_some_and(|(e, t)| Some(e) == self.epoch && now.saturating_since(t) <= window)
    }

    /// Heartbeat `seq`'s copies at `now` for a peer whose public address
    /// is `public`.
    pub fn copies(
        &self,
        now: Time,
        window: Duration,
        seq: u64,
        public_every: u64,
        public: SocketAddr,
    ) -> Copies {
        let mut flags = if self.ack(now, window) { FLAG_ACK } else { 0 };
        let (counted, extra) = match self.dest {
            Some(private) if self.committed(now, window) => {
                flags |= FLAG_COMMITTED;
                (private, (seq % public_every.max(1) == 0).then_some(public))
            }
            Some(private) => (public, Some(private)),
            None => (public, None),
        };
        Copies {
            counted,
            extra,
            flags,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    const W: Duration = Duration::from_millis(50);

    /// Uncommitted until acknowledged (public counted, private probe);
    /// committed while acks keep coming (private counted, public every
    /// 8th); back to public when they stop; the ack we send needs the
    /// peer's current incarnation through our private socket, recently.
    #[test]
    fn commits_only_while_acknowledged() {
        let public: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let from: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let private: SocketAddr = "10.0.0.2:41000".parse().unwrap();
        let mut h = Handshake::default();
        let c = h.copies(at(0), W, 1, 8, public);
        assert_eq!(
            (c.counted, c.extra, c.flags),
            (public, None, 0),
            "no port yet"
        );
        h.handle_heartbeat(at(10), from, Epoch(3), 41000, 0);
        let c = h.copies(at(10), W, 1, 8, public);
        assert_eq!(
            (c.counted, c.extra, c.flags),
            (public, Some(private), 0),
            "probe"
        );
        h.handle_heartbeat(at(20), from, Epoch(3), 41000, FLAG_ACK);
        let c = h.copies(at(30), W, 1, 8, public);
        assert_eq!(
            (c.counted, c.extra, c.flags),
            (private, None, FLAG_COMMITTED)
        );
        let c = h.copies(at(30), W, 8, 8, public);
        assert_eq!(c.extra, Some(public), "every 8th also public");
        // No ack for longer than the window: public again.
        let c = h.copies(at(71), W, 1, 8, public);
        assert_eq!((c.counted, c.flags), (public, 0));
        // Our ack: the peer's current incarnation, recently, privately.
        assert!(!h.ack(at(71), W));
        h.handle_private_arrival(at(80), Epoch(3));
        assert!(h.ack(at(100), W));
        assert!(!h.ack(at(131), W), "too long ago");
        h.handle_private_arrival(at(140), Epoch(3));
        h.handle_heartbeat(at(141), from, Epoch(4), 0, 0);
        assert!(
            !h.ack(at(142), W),
            "a new incarnation's copies have not come"
        );
        assert!(!h.committed(at(142), W), "no port: nothing to commit to");
    }

    /// A replaced private socket: no ack from us, and our counted copy
    /// public (the private one a probe) until the peer acknowledges again.
    #[test]
    fn a_replaced_socket_uncommits_until_acknowledged_again() {
        let public: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let private: SocketAddr = "10.0.0.2:41000".parse().unwrap();
        let mut h = Handshake::default();
        h.handle_heartbeat(at(10), public, Epoch(3), 41000, FLAG_ACK);
        h.handle_private_arrival(at(11), Epoch(3));
        let c = h.copies(at(12), W, 1, 8, public);
        assert_eq!((c.counted, c.flags), (private, FLAG_COMMITTED | FLAG_ACK));
        h.handle_socket_replaced();
        let c = h.copies(at(13), W, 1, 8, public);
        assert_eq!((c.counted, c.extra, c.flags), (public, Some(private), 0));
        h.handle_heartbeat(at(20), public, Epoch(3), 41002, FLAG_ACK);
        let c = h.copies(at(21), W, 1, 8, public);
        assert_eq!(c.counted, "10.0.0.2:41002".parse().unwrap());
    }
}
