//! Assembling what a session writes next: CLOSE frames of paths leaving,
//! control frames, acknowledgements, re-sends (always before new messages,
//! SQR), then new messages on the path the balance rule picks.

use bytes::{Bytes, BytesMut};

use super::paths::{self, PathState, Phase};
use super::send::{Body, Entry, EntryState, Prefix};
use super::Session;
use crate::event::{Event, RejectReason};
use crate::ids::{PathId, StreamId};
use crate::time::Time;
use crate::wire::{
    batch_header, data_header, encode_hello, encode_ping, encode_pong, AckWriter, FrameKind, Hello,
    TransmitBuf, DATA_FLAG_RETRANSMIT, DATA_FLAG_WITHDRAWN, MAX_ACK_RANGES,
};

/// Quiet channels re-acknowledged in every ACK frame (see `RecvSide::refresh`).
const REFRESH_PER_ACK: usize = 2;

/// Largest ACK/RESUME frame we write; within every peer's `max_frame_body`.
const ACK_FRAME_CAP: usize = AckWriter::EMPTY_LEN + AckWriter::entry_len(MAX_ACK_RANGES) * 64;

/// Writes one cache entry to a path as a DATA or BATCH frame (headers
/// copied, a large body referenced) and records where and when it went.
fn write_entry(
    out: &mut TransmitBuf,
    e: &mut Entry,
    st: StreamId,
    mut flags: u16,
    p: &mut PathState,
    now: Time,
) {
    if let Body::Batch { messages } = &mut e.body {
        // Written now: it stops growing, and every transmission shares it.
        e.body = Body::Sealed(std::mem::take(messages).freeze());
    }
    match &e.body {
        Body::Single { prefix, payload } => {
            if e.withdrawn {
                flags |= DATA_FLAG_WITHDRAWN;
            }
            let prefix = prefix.as_slice();
            let h = data_header(st, e.seq, flags, prefix.len() + payload.len());
            let head = out.head();
            head.extend_from_slice(&h);
            head.extend_from_slice(prefix);
            out.put_bytes(payload);
        }
        Body::Sealed(messages) => {
            let count = u16::try_from(e.count).unwrap_or(u16::MAX);
            let h = batch_header(st, e.seq, count, flags, messages.len());
            out.head().extend_from_slice(&h);
            out.put_bytes(messages);
        }
        Body::Batch { .. } => {}
    }
    e.state = EntryState::InFlight;
    e.path = p.id;
    e.sent_at = now;
    e.transmissions = e.transmissions.saturating_add(1);
    p.inflight_bytes += e.cost();
    p.inflight.push_back((st, e.seq, now));
    p.stats.data_sent += 1;
}

impl Session {
    /// Appends the next frames for one path to `buf` (about `budget` bytes,
    /// at least one frame) and says which path they are for.
    ///
    /// Call until it returns `None` after every input. (A copying form of
    /// [`Session::poll_transmit_gather`].)
    pub fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut BytesMut,
        budget: usize,
    ) -> Option<PathId> {
        let start = buf.len();
        let mut out = TransmitBuf::with_head(buf.split_off(start));
        let r = self.poll_transmit_gather(now, &mut out, budget);
        buf.unsplit(out.into_flat());
        r
    }

    /// Appends the next frames for one path to `out` as a gather list
    /// (headers copied, large bodies referenced: write them with one
    /// vectored write) and says which path they are for.
    pub fn poll_transmit_gather(
        &mut self,
        now: Time,
        out: &mut TransmitBuf,
        budget: usize,
    ) -> Option<PathId> {
        self.tick(now);
        if let Some(c) = self.closing.pop_front() {
            if let Some(close) = &c.close {
                close.encode(out.head());
            }
            let path = c.path;
            self.finish_close(c);
            return Some(path);
        }
        if self.ended.is_some() {
            return None;
        }
        let start = out.len();
        if let Some(i) = self.paths.iter().position(PathState::has_control) {
            self.write_control(now, i, out.head());
            let p = &mut self.paths[i];
            p.stats.bytes_sent += (out.len() - start) as u64;
            return Some(p.id);
        }
        if let Some(i) = self.role_path() {
            self.write_role(out.head(), budget);
            let p = &mut self.paths[i];
            p.stats.bytes_sent += (out.len() - start) as u64;
            return Some(p.id);
        }
        if !self.pending_replies.is_empty() {
            self.flush_pending_replies();
        }
        let cfg = &self.cfg;
        let ack_due = self.recv.ack_due(now, cfg.ack_frequency, cfg.max_ack_delay);
        let has_new = match (self.peer, self.send.new_queue.front()) {
            (Some(peer), Some(&(st, seq))) => {
                let cost = self.send.entry(st, seq).map_or(0, |e| {
                    if e.wire_len() > peer.max_message as usize {
                        crate::config::message_cost(0)
                    } else {
                        e.cost()
                    }
                });
                self.send.outstanding_bytes + cost <= peer.recv_window
            }
            _ => false,
        };
        let want_data = has_new || !self.send.retx_queue.is_empty();
        let data_path = if want_data {
            paths::select(&self.paths, self.last_path, cfg, self.avoid, self.prefer)
        } else {
            None
        };
        let pi = match data_path {
            Some(i) => i,
            None if ack_due => self.ack_path()?,
            None => return None,
        };
        if !self.recv.dirty.is_empty() {
            self.write_acks(now, out.head(), FrameKind::Ack, false);
        }
        if data_path.is_some() {
            self.write_data(now, pi, out, start, budget);
        }
        let p = &mut self.paths[pi];
        if out.len() == start {
            return None;
        }
        p.stats.bytes_sent += (out.len() - start) as u64;
        Some(p.id)
    }

    fn write_control(&mut self, now: Time, i: usize, buf: &mut BytesMut) {
        let (hello, resume) = {
            let p = &mut self.paths[i];
            let r = (p.hello_due, p.resume_due && p.peer_hello_seen);
            p.hello_due = false;
            p.resume_due = false;
            r
        };
        if hello {
            let local = &self.local;
            encode_hello(
                buf,
                &Hello {
                    cluster: local.cluster,
                    node: local.node,
                    epoch: local.epoch,
                    session: self.id,
                    your_node: self.node,
                    your_epoch: self.peer.map_or(crate::Epoch(0), |p| p.epoch),
                    your_session: self.peer.map_or(crate::SessionId(0), |p| p.session),
                    recv_window: self.cfg.recv_window,
                    max_message: self.cfg.max_message_size,
                    max_channels: self.cfg.max_channels,
                },
            );
        }
        if resume {
            self.write_acks(now, buf, FrameKind::Resume, true);
            self.paths[i].last_resume = Some(now);
        }
        let p = &mut self.paths[i];
        if let Some(token) = p.pong_due.take() {
            encode_pong(buf, token);
        }
        if p.ping_due {
            p.ping_due = false;
            let token = self.next_ping_token;
            self.next_ping_token += 1;
            encode_ping(buf, token);
            p.ping_outstanding = Some((token, now));
        }
    }

    /// Where acknowledgements go when no data is going out: the path data last
    /// came from, else any working path.
    fn ack_path(&self) -> Option<usize> {
        let ok = |p: &PathState| p.phase == Phase::Active || p.peer_hello_seen;
        if let Some(i) = self.last_data_path.and_then(|id| self.path_index(id)) {
            if ok(&self.paths[i]) && !self.paths[i].suspect {
                return Some(i);
            }
        }
        self.paths
            .iter()
            .position(|p| ok(p) && !p.suspect)
            .or_else(|| self.paths.iter().position(ok))
    }

    /// Writes acknowledgements: for dirty streams (`all = false`) or for every
    /// stream with state (RESUME). Splits into several frames if needed; the
    /// first carries `kind`, the rest are ACKs.
    pub(super) fn write_acks(&mut self, now: Time, buf: &mut BytesMut, kind: FrameKind, all: bool) {
        let delay_us = self.recv.first_unacked.map_or(0, |t| {
            u32::try_from(now.saturating_since(t).as_micros()).unwrap_or(u32::MAX)
        });
        if !all {
            self.recv.refresh(REFRESH_PER_ACK, now);
        }
        let Session { recv, scratch, .. } = self;
        let mut frame_start = buf.len();
        let mut w = AckWriter::begin(buf, kind, delay_us);
        let n = if all {
            recv.streams.len()
        } else {
            recv.dirty.len()
        };
        for k in 0..n {
            let idx = if all { k } else { recv.dirty[k].index() };
            let ch = &mut recv.streams[idx];
            if all && !ch.has_state() && !ch.dirty {
                continue;
            }
            ch.dirty = false;
            ch.ack_ranges(scratch, MAX_ACK_RANGES);
            if buf.len() - frame_start + AckWriter::entry_len(scratch.len()) > ACK_FRAME_CAP
                || w.count() == u16::MAX
            {
                w.finish(buf);
                frame_start = buf.len();
                w = AckWriter::begin(buf, FrameKind::Ack, delay_us);
            }
            w.entry(
                buf,
                StreamId(u16::try_from(idx).unwrap_or(u16::MAX)),
                ch.consumed,
                scratch,
            );
        }
        w.finish(buf);
        for c in recv.dirty.drain(..) {
            recv.streams[c.index()].dirty = false;
        }
        recv.acked();
    }

    fn write_data(
        &mut self,
        now: Time,
        pi: usize,
        out: &mut TransmitBuf,
        start: usize,
        budget: usize,
    ) {
        let Session {
            send,
            paths,
            stats,
            peer,
            node,
            id,
            events,
            cfg,
            ..
        } = self;
        let Some(peer) = *peer else { return };
        let p = &mut paths[pi];
        // Re-sends first: SQR's promise that a failed path's messages go out
        // again at once, ahead of anything new.
        while out.len() - start < budget && p.inflight_bytes < cfg.path_inflight_limit {
            let Some((st, seq)) = send.retx_queue.pop_front() else {
                break;
            };
            let Some(e) = send.entry_mut(st, seq) else {
                continue;
            };
            if e.state != EntryState::Pending {
                continue; // acknowledged meanwhile
            }
            write_entry(out, e, st, DATA_FLAG_RETRANSMIT, p, now);
            stats.resent += 1;
            p.stats.resent += 1;
        }
        while out.len() - start < budget && p.inflight_bytes < cfg.path_inflight_limit {
            let Some(&(st, seq)) = send.new_queue.front() else {
                break;
            };
            let Some(stream) = send.streams.get_mut(st.index()) else {
                send.new_queue.pop_front();
                continue;
            };
            let Some(e) = stream.get_mut(seq) else {
                send.new_queue.pop_front();
                continue;
            };
            let len = e.wire_len();
            let too_large =
                matches!(e.body, Body::Single { .. }) && len > peer.max_message as usize;
            let cost = if too_large {
                crate::config::message_cost(0)
            } else {
                e.cost()
            };
            if send.outstanding_bytes + cost > peer.recv_window {
                break; // the peer's window is full; wait for acknowledgements
            }
            send.new_queue.pop_front();
            if too_large {
                // Too large for this peer (learned after `send` took it):
                // withdraw it, keeping the sequence number so order holds.
                send.cache_bytes -= e.cost() - cost;
                e.body = Body::Single {
                    prefix: Prefix::default(),
                    payload: Bytes::new(),
                };
                e.len = 0;
                e.withdrawn = true;
                events.push_back(Event::MessageRejected {
                    peer: *node,
                    session: *id,
                    stream: st,
                    seq,
                    reason: RejectReason::TooLarge {
                        len,
                        max: peer.max_message,
                    },
                });
            }
            if e.count > 1 {
                stats.batches_sent += 1;
            }
            stats.frames_sent += 1;
            write_entry(out, e, st, 0, p, now);
            stream.sent_end = e.end();
            send.outstanding_bytes += cost;
        }
        self.last_path = Some(self.paths[pi].id);
    }
}
