//! Assembling what a session writes next: control frames, acknowledgements,
//! re-sends (always before new messages, SQR), then new messages on the path
//! the balance rule picks.

use bytes::{Bytes, BytesMut};

use super::paths::{self, PathState, Phase};
use super::send::{Entry, EntryState, Prefix};
use super::{Ctx, Queued, Session};
use crate::config::message_cost;
use crate::event::{Event, RejectReason};
use crate::ids::{ChannelId, PathId};
use crate::time::Time;
use crate::wire::{
    encode_data_parts, encode_hello, encode_ping, encode_pong, AckWriter, FrameKind, Hello,
    DATA_FLAG_RETRANSMIT, DATA_FLAG_WITHDRAWN, MAX_ACK_RANGES,
};

/// Quiet channels re-acknowledged in every ACK frame (see `RecvSide::refresh`).
const REFRESH_PER_ACK: usize = 2;

/// Largest ACK/RESUME frame we write; within every peer's `max_frame_body`.
const ACK_FRAME_CAP: usize = AckWriter::EMPTY_LEN + AckWriter::entry_len(MAX_ACK_RANGES) * 64;

/// Writes one message to a path and records where and when it went.
fn write_entry(
    buf: &mut BytesMut,
    e: &mut Entry,
    ch: ChannelId,
    seq: u64,
    mut flags: u16,
    p: &mut PathState,
    now: Time,
) {
    if e.withdrawn {
        flags |= DATA_FLAG_WITHDRAWN;
    }
    encode_data_parts(buf, ch, seq, flags, e.prefix.as_slice(), &e.payload);
    e.state = EntryState::InFlight;
    e.path = p.id;
    e.sent_at = now;
    e.transmissions = e.transmissions.saturating_add(1);
    p.inflight_bytes += message_cost(e.len());
    p.inflight.push_back((ch, seq, now));
    p.stats.data_sent += 1;
}

impl Session {
    /// Appends the next frames for one path to `buf` (about `budget` bytes,
    /// at least one frame) and says which path they are for.
    pub(crate) fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut BytesMut,
        budget: usize,
        ctx: &mut Ctx<'_>,
    ) -> Option<PathId> {
        let start = buf.len();
        if let Some(i) = self.paths.iter().position(PathState::has_control) {
            self.write_control(now, i, buf, ctx);
            let p = &mut self.paths[i];
            p.stats.bytes_sent += (buf.len() - start) as u64;
            return Some(p.id);
        }
        let cfg = ctx.cfg;
        let ack_due = self.recv.ack_due(now, cfg.ack_frequency, cfg.max_ack_delay);
        let has_new = match (self.peer, self.send.new_queue.front()) {
            (Some(peer), Some(&(ch, seq))) => {
                let len = self
                    .send
                    .entry(ch, seq)
                    .map_or(0, |e| e.len().min(peer.max_message as usize));
                self.send.outstanding_bytes + message_cost(len) <= peer.recv_window
            }
            _ => false,
        };
        let want_data = has_new || !self.send.retx_queue.is_empty();
        let data_path = if want_data {
            paths::select(&self.paths, self.last_path, cfg)
        } else {
            None
        };
        let pi = match data_path {
            Some(i) => i,
            None if ack_due => self.ack_path()?,
            None => return None,
        };
        if !self.recv.dirty.is_empty() {
            self.write_acks(now, buf, FrameKind::Ack, false);
        }
        if data_path.is_some() {
            self.write_data(now, pi, buf, start, budget, ctx);
        }
        let p = &mut self.paths[pi];
        if buf.len() == start {
            return None;
        }
        p.stats.bytes_sent += (buf.len() - start) as u64;
        Some(p.id)
    }

    fn write_control(&mut self, now: Time, i: usize, buf: &mut BytesMut, ctx: &mut Ctx<'_>) {
        let (hello, resume) = {
            let p = &mut self.paths[i];
            let r = (p.hello_due, p.resume_due && p.peer_hello_seen);
            p.hello_due = false;
            p.resume_due = false;
            r
        };
        if hello {
            let local = ctx.local;
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
                    recv_window: ctx.cfg.recv_window,
                    max_message: ctx.cfg.max_message_size,
                    max_channels: ctx.cfg.max_channels,
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

    /// Writes acknowledgements: for dirty channels (`all = false`) or for every
    /// channel with state (RESUME). Splits into several frames if needed; the
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
            recv.channels.len()
        } else {
            recv.dirty.len()
        };
        for k in 0..n {
            let idx = if all { k } else { usize::from(recv.dirty[k].0) };
            let ch = &mut recv.channels[idx];
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
                ChannelId(u16::try_from(idx).unwrap_or(u16::MAX)),
                ch.consumed,
                scratch,
            );
        }
        w.finish(buf);
        for c in recv.dirty.drain(..) {
            recv.channels[usize::from(c.0)].dirty = false;
        }
        recv.acked();
    }

    fn write_data(
        &mut self,
        now: Time,
        pi: usize,
        buf: &mut BytesMut,
        start: usize,
        budget: usize,
        ctx: &mut Ctx<'_>,
    ) {
        let cfg = ctx.cfg;
        let Session {
            send,
            paths,
            stats,
            peer,
            node,
            id,
            ..
        } = self;
        let Some(peer) = *peer else { return };
        let p = &mut paths[pi];
        // Re-sends first: SQR's promise that a failed path's messages go out
        // again at once, ahead of anything new.
        while buf.len() - start < budget && p.inflight_bytes < cfg.path_inflight_limit {
            let Some((ch, seq)) = send.retx_queue.pop_front() else {
                break;
            };
            let Some(e) = send.entry_mut(ch, seq) else {
                continue;
            };
            if e.state != EntryState::Pending {
                continue; // acknowledged meanwhile
            }
            write_entry(buf, e, ch, seq, DATA_FLAG_RETRANSMIT, p, now);
            stats.resent += 1;
            p.stats.resent += 1;
        }
        while buf.len() - start < budget && p.inflight_bytes < cfg.path_inflight_limit {
            let Some(&(ch, seq)) = send.new_queue.front() else {
                break;
            };
            let Some(chan) = send.channels.get_mut(usize::from(ch.0)) else {
                send.new_queue.pop_front();
                continue;
            };
            let Some(e) = chan.get_mut(seq) else {
                send.new_queue.pop_front();
                continue;
            };
            let len = e.len();
            let sent_len = if len > peer.max_message as usize {
                0
            } else {
                len
            };
            if send.outstanding_bytes + message_cost(sent_len) > peer.recv_window {
                break; // the peer's window is full; wait for acknowledgements
            }
            send.new_queue.pop_front();
            if sent_len != len {
                // Too large for this peer (learned after `send` took it):
                // withdraw it, keeping the sequence number so order holds.
                e.payload = Bytes::new();
                e.prefix = Prefix::default();
                e.withdrawn = true;
                send.cache_bytes -= message_cost(len) - message_cost(0);
                ctx.events
                    .push_back(Queued::Event(Box::new(Event::MessageRejected {
                        peer: *node,
                        session: *id,
                        channel: ch,
                        seq,
                        reason: RejectReason::TooLarge {
                            len,
                            max: peer.max_message,
                        },
                    })));
            }
            write_entry(buf, e, ch, seq, 0, p, now);
            chan.sent_end = seq + 1;
            send.outstanding_bytes += message_cost(sent_len);
        }
        self.last_path = Some(self.paths[pi].id);
    }
}
