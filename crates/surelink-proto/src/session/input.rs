//! What arrives on a session's paths: frames decoded, data offered to the
//! receiving half, acknowledgements applied to the sending half.

use bytes::BytesMut;

use super::deliver::Released;
use super::paths::Phase;
use super::recv::{Chunk, ChunkBody, Offer};
use super::send::{AckError, AckOutcome};
use super::{Input, Session};
use crate::error::{PathError, ProtocolViolation};
use crate::event::{Event, PathCloseReason, SessionEndReason};
use crate::ids::{Epoch, PathId, StreamId, StreamKind};
use crate::rpc::header;
use crate::time::Time;
use crate::wire::{
    decode, AckFrame, BatchFrame, Close, CloseCode, CloseScope, DataFrame, Frame,
    DATA_FLAG_WITHDRAWN,
};

impl Session {
    /// Feeds bytes that arrived on `path`. Decodes every whole frame in
    /// `buf` and leaves a trailing partial frame there for the next call;
    /// stops after a HELLO and hands it back (see [`Input::Hello`]).
    ///
    /// On error the path is being closed: a CLOSE frame carrying the reason
    /// is queued for it, an [`Event::PathClosed`] follows, and the caller
    /// should stop reading from the transport. Other paths carry on.
    pub fn handle_input(
        &mut self,
        now: Time,
        path: PathId,
        buf: &mut BytesMut,
    ) -> Result<Input, PathError> {
        self.tick(now);
        if self.ended.is_some() || self.path_index(path).is_none() {
            // Closing (or moved away): what follows is moot.
            buf.clear();
            return if self.has_path(path) || self.ended.is_some() {
                Ok(Input::Done)
            } else {
                Err(PathError::UnknownPath(path))
            };
        }
        let max_body = self.cfg.max_frame_body();
        loop {
            let frame = match decode(buf, max_body) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(Input::Done),
                Err(e) => {
                    let e = PathError::from(e);
                    self.refuse_path(now, path, e.clone());
                    buf.clear();
                    return Err(e);
                }
            };
            if let Frame::Hello(h) = frame {
                return Ok(Input::Hello(h));
            }
            let Some(pi) = self.path_index(path) else {
                buf.clear();
                return Ok(Input::Done);
            };
            if let Err(e) = self.handle_frame(now, pi, frame) {
                self.refuse_path(now, path, e.clone());
                buf.clear();
                return Err(e);
            }
            if self.ended.is_some() || self.path_index(path).is_none() {
                // This input closed the path or the session (the peer's
                // CLOSE): anything after it is moot.
                buf.clear();
                return Ok(Input::Done);
            }
        }
    }

    /// Handles one frame (not HELLO) that arrived on path index `pi`.
    fn handle_frame(&mut self, now: Time, pi: usize, frame: Frame) -> Result<(), PathError> {
        self.paths[pi].last_recv = now;
        if !self.paths[pi].peer_hello_seen {
            // Possible only over a lossy or reordering transport; the sender
            // re-sends whatever this was.
            if let Frame::Close(c) = frame {
                self.peer_closed(now, pi, c);
            } else {
                self.stats.early_frames += 1;
            }
            return Ok(());
        }
        match frame {
            Frame::Data(d) => self.on_data(now, pi, d),
            Frame::Batch(b) => self.on_batch(now, pi, b),
            Frame::Ack(a) => self.on_ack(now, &a),
            Frame::Resume(a) => {
                self.on_ack(now, &a)?;
                let p = &mut self.paths[pi];
                if p.phase == Phase::Handshaking {
                    p.phase = Phase::Active;
                    let path = p.id;
                    self.events.push_back(Event::PathUp {
                        peer: self.node,
                        path,
                    });
                    // A new path is as good news as an answered probe:
                    // what waits on suspected paths goes now.
                    self.path_proven(pi, Time::ZERO);
                    self.update_reachability(now);
                }
                Ok(())
            }
            Frame::Ping(token) => {
                self.paths[pi].pong_due = Some(token);
                // A probe may mean our last acknowledgements were lost.
                self.recv.request_full_ack(now);
                Ok(())
            }
            Frame::Pong(token) => {
                let p = &mut self.paths[pi];
                if let Some((t, sent)) = p.ping_outstanding {
                    if t == token {
                        p.rtt.sample(now.saturating_since(sent));
                        p.ping_outstanding = None;
                        let was_suspect = std::mem::replace(&mut p.suspect, false);
                        p.backoff = 0;
                        if was_suspect {
                            self.path_proven(pi, sent);
                        }
                    }
                }
                Ok(())
            }
            Frame::Close(c) => {
                self.peer_closed(now, pi, c);
                Ok(())
            }
            Frame::RouteUpdate(body) => {
                self.on_route_update(body);
                Ok(())
            }
            Frame::Hello(_) => Ok(()), // handed back by `handle_input`
        }
    }

    /// Checks that `stream` exists here and that every message of a frame
    /// on it fits our limit and carries a well-formed message-layer header.
    fn check_messages<'a>(
        &self,
        stream: StreamId,
        max_len: usize,
        messages: impl Iterator<Item = &'a [u8]>,
    ) -> Result<(), PathError> {
        if !stream.fits(self.cfg.max_channels) {
            return Err(ProtocolViolation::StreamOutOfRange(stream.0).into());
        }
        if max_len > self.cfg.max_message_size as usize {
            return Err(ProtocolViolation::MessageTooLarge {
                len: max_len,
                max: self.cfg.max_message_size,
            }
            .into());
        }
        if matches!(stream.kind(), StreamKind::Oneway(_)) {
            return Ok(());
        }
        for m in messages {
            header::check(stream, m)
                .map_err(|e| PathError::from(ProtocolViolation::MalformedMessage(e.0)))?;
        }
        Ok(())
    }

    fn on_data(&mut self, now: Time, pi: usize, d: DataFrame) -> Result<(), PathError> {
        let withdrawn = d.flags & DATA_FLAG_WITHDRAWN != 0;
        if withdrawn {
            self.check_messages(d.stream, 0, std::iter::empty())?;
        } else {
            self.check_messages(d.stream, d.payload.len(), std::iter::once(&d.payload[..]))?;
        }
        let len = d.payload.len();
        let body = ChunkBody::Single((!withdrawn).then_some(d.payload));
        self.offer(now, pi, d.stream, d.seq, Chunk::new(1, len, body))
    }

    fn on_batch(&mut self, now: Time, pi: usize, b: BatchFrame) -> Result<(), PathError> {
        self.check_messages(b.stream, b.max_len as usize, b.slices())?;
        let len = b.body().len();
        let chunk = Chunk::new(u32::from(b.count), len, ChunkBody::Batch(b.body().clone()));
        self.offer(now, pi, b.stream, b.first, chunk)
    }

    /// Offers a frame's messages to the receiving half and routes what it
    /// releases: replies are handled at once, one-way messages and
    /// requests wait for their driver.
    fn offer(
        &mut self,
        now: Time,
        pi: usize,
        stream: StreamId,
        first: u64,
        chunk: Chunk,
    ) -> Result<(), PathError> {
        let p = &mut self.paths[pi];
        p.stats.data_received += 1;
        self.last_data_path = Some(p.id);
        let window = u64::from(self.cfg.recv_window);
        // A scratch vector kept across calls: no allocation per frame.
        let mut released = std::mem::take(&mut self.released_scratch);
        let offer = self.recv.offer(now, stream, first, chunk, window, |q, c| {
            released.push((q, c))
        });
        match offer {
            Offer::Duplicate => self.stats.duplicates_received += 1,
            Offer::Buffered => self.stats.frames_reordered += 1,
            Offer::OverWindow => self.stats.over_window += 1,
            Offer::BeyondWindow => {
                return Err(ProtocolViolation::SeqBeyondWindow {
                    stream: stream.0,
                    seq: first,
                }
                .into())
            }
            Offer::Overlap => {
                return Err(ProtocolViolation::Overlap {
                    stream: stream.0,
                    seq: first,
                }
                .into())
            }
            Offer::Released => {}
        }
        for (q, c) in released.drain(..) {
            self.stats.messages_delivered += u64::from(c.count);
            let r = Released::new(stream, q, c);
            match stream.kind() {
                StreamKind::Reply | StreamKind::ReplyLane => self.on_replies(now, r),
                StreamKind::Request(_) | StreamKind::RequestLane => self.requests.push_back(r),
                StreamKind::Oneway(_) | StreamKind::OnewayHigh => self.oneway.push_back(r),
            }
        }
        self.released_scratch = released;
        Ok(())
    }

    fn on_ack(&mut self, now: Time, a: &AckFrame) -> Result<(), PathError> {
        let mut out = AckOutcome::default();
        self.ack_frames += 1;
        let stamp = self.ack_frames;
        let max_channels = self.cfg.max_channels;
        let Session { send, paths, .. } = self;
        for e in a.entries() {
            if !e.stream.fits(max_channels) {
                return Err(ProtocolViolation::StreamOutOfRange(e.stream.0).into());
            }
            send.apply_ack(
                e.stream,
                e.cumulative,
                e.ranges,
                stamp,
                &mut out,
                |path, cost| {
                    if let Some(p) = paths.iter_mut().find(|p| p.id == path) {
                        p.inflight_bytes = p.inflight_bytes.saturating_sub(cost);
                        // Progress on the path: it works again.
                        p.backoff = 0;
                        p.suspect = false;
                    }
                },
            )
            .map_err(|err| match err {
                AckError::Unsent(seq) => ProtocolViolation::AckOfUnsent {
                    stream: e.stream.0,
                    seq,
                },
                AckError::RepeatedStream => ProtocolViolation::RepeatedAckStream(e.stream.0),
            })?;
        }
        if let Some((path, sent_at)) = out.rtt_sample {
            if let Some(p) = paths.iter_mut().find(|p| p.id == path) {
                let rtt = now.saturating_since(sent_at).saturating_sub(a.delay());
                p.rtt.sample(rtt.max(std::time::Duration::from_micros(1)));
            }
        }
        if out.progress {
            self.last_progress = now;
            self.probe_backoff = 0;
            // Room freed: replies that waited for it go first.
            self.flush_pending_replies();
        }
        for i in 0..self.paths.len() {
            self.trim_inflight(i);
        }
        Ok(())
    }

    /// Drops references at the front of a path's in-flight queue that no
    /// longer describe an entry in flight on it.
    pub(super) fn trim_inflight(&mut self, i: usize) {
        let p = &mut self.paths[i];
        while let Some(&(st, seq, t)) = p.inflight.front() {
            match self.send.entry(st, seq) {
                Some(e)
                    if e.state == super::send::EntryState::InFlight
                        && e.path == p.id
                        && e.sent_at == t =>
                {
                    break
                }
                _ => {
                    p.inflight.pop_front();
                }
            }
        }
    }

    fn peer_closed(&mut self, now: Time, pi: usize, c: Close) {
        match c.scope {
            CloseScope::Path => {
                let reason = PathCloseReason::ClosedByPeer {
                    code: c.code,
                    reason: c.reason,
                };
                self.path_failed(now, pi, reason, None);
            }
            CloseScope::Session => {
                let reason = match c.code {
                    CloseCode::SESSION_UNKNOWN => SessionEndReason::PeerReset,
                    CloseCode::RESTARTED => SessionEndReason::PeerRestarted {
                        old: self.peer.map_or(Epoch(0), |p| p.epoch),
                        new: None,
                    },
                    CloseCode::STALE => SessionEndReason::Rejected(c.code),
                    code => SessionEndReason::ClosedByPeer {
                        code,
                        reason: c.reason,
                    },
                };
                let _ = pi;
                self.end(now, reason, CloseCode::NORMAL);
            }
        }
    }
}
