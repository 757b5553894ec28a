//! What a session shows of itself: counters, gauges, a debugging dump.

use super::paths::{PathStats, Phase};
use super::Session;
use crate::event::Event;
use crate::ids::{PathId, StreamId};

/// Counters and gauges of one session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionStats {
    /// Messages accepted by `send` and `call` (and replies sent).
    pub messages_sent: u64,
    /// Messages released in order.
    pub messages_delivered: u64,
    /// DATA and BATCH frames written for the first time.
    pub frames_sent: u64,
    /// BATCH frames among them.
    pub batches_sent: u64,
    /// Frames re-sent (after a path failure, timeout, or resume).
    pub resent: u64,
    /// Frames received that we already had.
    pub duplicates_received: u64,
    /// Frames that arrived ahead of a gap and waited in the reorder buffer.
    pub frames_reordered: u64,
    /// Frames dropped because they would exceed the receive window.
    pub over_window: u64,
    /// Frames ignored because they arrived on a path before its handshake.
    pub early_frames: u64,
    /// Paths lost while they had messages in flight (failovers).
    pub failovers: u64,
    /// Retransmission timeouts across paths.
    pub timeouts: u64,
    /// Window probes: re-sends that ask a silent peer for its acknowledgement.
    pub probes: u64,
    /// Messages re-sent at once because a path proved to work (a
    /// suspected one answered its PING, or a new one came up): what was in
    /// flight on suspected paths.
    pub resent_on_answer: u64,
    /// Paths closed because nothing arrived on them for `path_idle_timeout`.
    pub idle_paths_closed: u64,
    /// Calls made.
    pub calls: u64,
    /// Call requests re-sent (same id).
    pub calls_resent: u64,
    /// Calls outstanding now.
    pub calls_outstanding: u64,
    /// Requests admitted (each at most once).
    pub requests_admitted: u64,
    /// Duplicate requests answered without running them.
    pub duplicate_requests: u64,
    /// Requests admitted and not completed now.
    pub requests_outstanding: u64,
    /// Bytes held in the retransmit cache now.
    pub cache_bytes: u64,
    /// Role messages (ROUTE_UPDATE frames) written.
    pub role_sent: u64,
    /// Role messages received.
    pub role_received: u64,
    /// Role messages dropped from a full queue (either way) or too large
    /// for the peer.
    pub role_dropped: u64,
    /// Messages held in the retransmit cache now.
    pub cache_messages: u64,
    /// Bytes held on the receiving side now (reorder + undelivered).
    pub recv_buffered_bytes: u64,
    /// Out-of-order frames held now.
    pub reorder_frames: u64,
    /// Bytes held for the peer's calls now beyond the send buffer and the
    /// reply cache: admitted requests and replies waiting for room
    /// (bounded by `call_bytes_per_peer`).
    pub call_bytes_held: u64,
    /// Every byte the session holds for its peer now (see
    /// [`Session::held_bytes`]).
    pub held_bytes: u64,
    /// Times admission stopped because the peer's calls held
    /// `call_bytes_per_peer` (once per stop).
    pub call_bound_hits: u64,
    /// Per path: id, phase, srtt, in-flight bytes, counters.
    pub paths: Vec<PathSnapshot>,
}

/// A path's state at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathSnapshot {
    /// The path.
    pub id: PathId,
    /// Whether it carries traffic.
    pub active: bool,
    /// Whether it timed out recently.
    pub suspect: bool,
    /// Smoothed RTT.
    pub srtt: std::time::Duration,
    /// Unacknowledged bytes on it.
    pub inflight_bytes: u64,
    /// Its counters.
    pub stats: PathStats,
}

/// What a normal one-way message must stay within to be accepted by
/// [`Session::send`] on both ends' limits, once the peer's HELLO told
/// them (see [`Session::send_limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendLimits {
    /// Longest message, in bytes.
    pub max_message: usize,
    /// Channels below this one exist at both ends.
    pub channels: u32,
}

impl Session {
    /// The limits a normal one-way message must meet at both ends, or
    /// `None` while the peer's are unknown or once the session ended. A
    /// shell that queues messages in front of the session's lock checks
    /// them there, so that only a full send buffer can refuse them later.
    pub fn send_limits(&self) -> Option<SendLimits> {
        if self.ended.is_some() {
            return None;
        }
        let p = self.peer?;
        Some(SendLimits {
            max_message: self.cfg.max_message_size.min(p.max_message) as usize,
            channels: self
                .cfg
                .max_channels
                .min(p.max_channels)
                .min(crate::StreamId::MAX_CHANNELS),
        })
    }

    /// The next path, peer or call event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// A snapshot of counters and gauges.
    pub fn stats(&self) -> SessionStats {
        let mut s = self.stats.clone();
        s.cache_bytes = self.send.cache_bytes;
        s.cache_messages = self.send.cache_len;
        s.recv_buffered_bytes = self.recv.buffered_bytes;
        s.reorder_frames = self.recv.reorder_len() as u64;
        s.calls_outstanding = self.calls.len() as u64;
        s.requests_admitted = self.serve.executed;
        s.duplicate_requests = self.serve.duplicates;
        s.requests_outstanding = self.serve.admitted as u64;
        s.call_bytes_held = self.call_bytes_held();
        s.held_bytes = self.held_bytes();
        s.paths = self
            .paths
            .iter()
            .map(|p| PathSnapshot {
                id: p.id,
                active: p.phase == Phase::Active,
                suspect: p.suspect,
                srtt: p.rtt.srtt,
                inflight_bytes: p.inflight_bytes,
                stats: p.stats,
            })
            .collect();
        s
    }

    /// Every byte this session holds for its peer (cheap; for bound checks
    /// and gauges): the retransmit cache (our messages and replies until
    /// the peer's application has them), the receiving side (out of order,
    /// or released and not yet taken) and its calls (admitted requests,
    /// replies waiting for room, cached replies). Bounded by `send_buffer +
    /// recv_window + call_bytes_per_peer + reply_cache_bytes` plus the
    /// replies to requests admitted before the call bound was reached.
    pub fn held_bytes(&self) -> u64 {
        self.send.cache_bytes
            + self.recv.buffered_bytes
            + self.call_bytes_held()
            + self.serve.cached_bytes()
    }

    /// Bytes in the retransmit cache and on the receiving side (cheap; for
    /// bound checks and gauges).
    pub fn buffers(&self) -> (u64, u64) {
        (self.send.cache_bytes, self.recv.buffered_bytes)
    }

    /// A one-screen dump of the session's state, for debugging.
    #[doc(hidden)]
    pub fn debug_dump(&self) -> String {
        let s = self;
        let mut out = format!(
            "outstanding={} cache={} new_q={} retx_q={} peer={:?} recv_buffered={} dirty={:?} ended={:?}\n",
            s.send.outstanding_bytes,
            s.send.cache_bytes,
            s.send.new_queue.len(),
            s.send.retx_queue.len(),
            s.peer,
            s.recv.buffered_bytes,
            s.recv.dirty,
            s.ended,
        );
        for (i, st) in s.send.streams.iter().enumerate() {
            if st.entries.is_empty() && st.base == 0 {
                continue;
            }
            let states: Vec<_> = st
                .entries
                .iter()
                .take(8)
                .map(|e| (e.seq, e.count, e.state, e.path, e.transmissions))
                .collect();
            out += &format!(
                " send {:?}: base={} sent_end={} entries={} first={:?}\n",
                StreamId(u16::try_from(i).unwrap_or(u16::MAX)),
                st.base,
                st.sent_end,
                st.entries.len(),
                states
            );
        }
        for (i, st) in s.recv.streams.iter().enumerate() {
            if !st.has_state() {
                continue;
            }
            out += &format!(
                " recv {:?}: consumed={} next={} dirty={}\n",
                StreamId(u16::try_from(i).unwrap_or(u16::MAX)),
                st.consumed,
                st.next,
                st.dirty
            );
        }
        for p in &s.paths {
            out += &format!(
                " path {:?} {:?} network={:?} avoided={} suspect={} backoff={} inflight={} fifo={} ping={:?}\n",
                p.id,
                p.phase,
                p.network,
                p.avoided(s.avoid),
                p.suspect,
                p.backoff,
                p.inflight_bytes,
                p.inflight.len(),
                p.ping_outstanding
            );
        }
        out
    }
}
