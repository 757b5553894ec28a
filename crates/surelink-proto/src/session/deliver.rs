//! Handing released messages to the application, by class.
//!
//! Released chunks wait in one queue per class (one-way messages, requests);
//! replies are handled the moment they are released. Taking a message
//! consumes it: the cumulative acknowledgement moves, which frees it from
//! the sender's cache. A driver with no room for a class stops polling
//! that class only, so backpressure on requests never holds up replies.

use bytes::Bytes;

use super::recv::{Chunk, ChunkBody};
use super::Session;
use crate::event::Event;
use crate::ids::{ChannelId, NodeId, SessionId, StreamId, StreamKind};
use crate::rpc::header::{self, ReplyStatus};
use crate::rpc::serve::Arrival;
use crate::rpc::{CallFailure, Priority, RequestClass, Ticket};
use crate::time::Time;
use crate::wire::{BatchIter, BatchSlices};

/// A one-way message, delivered exactly once and in order per channel and
/// priority.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// The sender.
    pub peer: NodeId,
    /// The session it arrived in.
    pub session: SessionId,
    /// Its channel.
    pub channel: ChannelId,
    /// Its priority.
    pub priority: Priority,
    /// The stream it travelled on.
    pub stream: StreamId,
    /// Its number in the stream (0, 1, 2, ... per session).
    pub seq: u64,
    /// The message.
    pub payload: Bytes,
}

/// The one-way messages of one frame, taken together without a reference
/// count per message: iterate them as borrowed slices, or turn them into
/// [`Message`]s. Taking the batch delivers all of it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MessageBatch {
    /// The sender.
    pub peer: NodeId,
    /// The session it arrived in.
    pub session: SessionId,
    /// The stream it travelled on.
    pub stream: StreamId,
    /// Sequence number of the first message.
    pub first: u64,
    /// Messages in it.
    pub count: u32,
    body: BatchBody,
}

#[derive(Clone, Debug)]
enum BatchBody {
    Single(Option<Bytes>),
    Batch(Bytes),
}

impl MessageBatch {
    /// The messages: channel, priority and payload, in order.
    pub fn iter(&self) -> impl Iterator<Item = (ChannelId, Priority, &[u8])> + '_ {
        let kind = self.stream.kind();
        let msgs: Box<dyn Iterator<Item = &[u8]> + '_> = match &self.body {
            BatchBody::Single(p) => Box::new(p.as_deref().into_iter()),
            BatchBody::Batch(b) => Box::new(BatchSlices::new(b)),
        };
        msgs.filter_map(move |m| match kind {
            StreamKind::Oneway(c) => Some((c, Priority::Normal, m)),
            _ => {
                let (c, n) = header::parse_oneway_high(m).ok()?;
                Some((c, Priority::High, &m[n..]))
            }
        })
    }

    /// Messages it holds (a withdrawn number holds none).
    pub fn len(&self) -> usize {
        match &self.body {
            BatchBody::Single(None) => 0,
            _ => self.count as usize,
        }
    }

    /// Whether it holds no message (a withdrawn number).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of its body: the messages and their framing.
    pub fn body_len(&self) -> usize {
        match &self.body {
            BatchBody::Single(p) => p.as_ref().map_or(0, Bytes::len),
            BatchBody::Batch(b) => b.len(),
        }
    }

    /// The messages as [`Message`]s (one reference-counted slice each).
    pub fn into_messages(self) -> impl Iterator<Item = Message> {
        let Self {
            peer,
            session,
            stream,
            first,
            body,
            ..
        } = self;
        let kind = stream.kind();
        let msgs: Box<dyn Iterator<Item = Option<Bytes>>> = match body {
            BatchBody::Single(p) => Box::new(std::iter::once(p)),
            BatchBody::Batch(b) => Box::new(BatchIter::new(b).map(Some)),
        };
        msgs.enumerate().filter_map(move |(i, m)| {
            let mut payload = m?;
            let (channel, priority) = match kind {
                StreamKind::Oneway(c) => (c, Priority::Normal),
                _ => {
                    let (c, n) = header::parse_oneway_high(&payload).ok()?;
                    payload = payload.slice(n..);
                    (c, Priority::High)
                }
            };
            Some(Message {
                peer,
                session,
                channel,
                priority,
                stream,
                seq: first + i as u64,
                payload,
            })
        })
    }
}

#[derive(Debug)]
enum Cursor {
    Single(Option<Bytes>),
    Batch(BatchIter),
}

/// A released chunk the application is taking message by message. It is
/// consumed (acknowledged) when its last message is taken: the sender can
/// only free a frame whole, so per-message bookkeeping would buy nothing.
#[derive(Debug)]
pub(crate) struct Released {
    stream: StreamId,
    /// Sequence number of the next message to take.
    next: u64,
    end: u64,
    cost: u64,
    cursor: Cursor,
}

impl Released {
    pub(crate) fn new(stream: StreamId, first: u64, c: Chunk) -> Released {
        Released {
            stream,
            next: first,
            end: first + u64::from(c.count),
            cost: c.cost,
            cursor: match c.body {
                ChunkBody::Single(p) => Cursor::Single(p),
                ChunkBody::Batch(b) => Cursor::Batch(BatchIter::new(b)),
            },
        }
    }

    /// The next message without taking it (`None` inside: withdrawn).
    fn peek(&self) -> Option<Bytes> {
        match &self.cursor {
            Cursor::Single(p) => p.clone(),
            Cursor::Batch(it) => it.clone().next(),
        }
    }

    /// Takes the next message: its number, payload (`None`: withdrawn), and
    /// whether the chunk is finished.
    fn take(&mut self) -> (u64, Option<Bytes>, bool) {
        let seq = self.next;
        let m = match &mut self.cursor {
            Cursor::Single(p) => p.take(),
            Cursor::Batch(it) => it.next(),
        };
        self.next += 1;
        (seq, m, self.next >= self.end)
    }
}

impl Session {
    /// Records that the application finished a chunk at the front of a
    /// queue (took its last message).
    fn consumed(&mut self, stream: StreamId, end: u64, cost: u64) {
        let now = self.now;
        self.recv.consumed(now, stream, end, cost);
    }

    /// The next one-way message, if one was released. Taking it is
    /// delivery: it is acknowledged to the sender.
    pub fn poll_message(&mut self) -> Option<Message> {
        loop {
            let r = self.oneway.front_mut()?;
            let stream = r.stream;
            let (seq, payload, done) = r.take();
            if done {
                let cost = r.cost;
                self.oneway.pop_front();
                self.consumed(stream, seq + 1, cost);
            }
            let Some(mut payload) = payload else {
                continue; // a withdrawn number: consumed silently
            };
            let (channel, priority) = match stream.kind() {
                StreamKind::Oneway(c) => (c, Priority::Normal),
                _ => match header::parse_oneway_high(&payload) {
                    Ok((c, n)) => {
                        payload = payload.slice(n..);
                        (c, Priority::High)
                    }
                    // Checked on arrival; never here.
                    Err(_) => continue,
                },
            };
            return Some(Message {
                peer: self.node,
                session: self.id,
                channel,
                priority,
                stream,
                seq,
                payload,
            });
        }
    }

    /// The one-way messages of the next released frame (or what is left of
    /// it), taken together: delivered all at once, without a reference
    /// count per message. The cheapest way to take many small messages.
    pub fn poll_batch(&mut self) -> Option<MessageBatch> {
        let r = self.oneway.pop_front()?;
        let count = u32::try_from(r.end - r.next).unwrap_or(u32::MAX);
        let body = match r.cursor {
            Cursor::Single(p) => BatchBody::Single(p),
            Cursor::Batch(it) => BatchBody::Batch(it.into_inner()),
        };
        self.consumed(r.stream, r.end, r.cost);
        Some(MessageBatch {
            peer: self.node,
            session: self.id,
            stream: r.stream,
            first: r.next,
            count,
            body,
        })
    }

    /// What [`Session::poll_batch`] would return next, without taking it:
    /// its stream, messages (withdrawn numbers included) and body bytes
    /// (framing included). Lets a shell take a frame whole only when its
    /// bounds have room for all of it.
    pub fn peek_batch(&self) -> Option<(StreamId, u32, usize)> {
        let r = self.oneway.front()?;
        let count = u32::try_from(r.end - r.next).unwrap_or(u32::MAX);
        let bytes = match &r.cursor {
            Cursor::Single(p) => p.as_ref().map_or(0, Bytes::len),
            Cursor::Batch(it) => it.remaining(),
        };
        Some((r.stream, count, bytes))
    }

    /// Moves up to `max` one-way messages into `out`; returns how many.
    pub fn poll_messages(&mut self, out: &mut Vec<Message>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(m) = self.poll_message() else { break };
            out.push(m);
            n += 1;
        }
        n
    }

    /// Whether one-way messages wait for `poll_message`.
    pub fn has_messages(&self) -> bool {
        !self.oneway.is_empty()
    }

    /// The next admitted request, if one arrived and the session's
    /// admission bounds (`max_requests_per_peer` requests handed out and
    /// not completed, `call_bytes_per_peer` bytes held for its calls)
    /// allow it. Duplicates of requests this session has
    /// seen are answered here and never handed out.
    pub fn poll_request(&mut self) -> Option<Ticket> {
        loop {
            let r = self.requests.front()?;
            let stream = r.stream;
            let lane = stream == StreamId::REQUEST_LANE;
            let channel = match stream.kind() {
                StreamKind::Request(c) => Some(c),
                _ => None,
            };
            let Some(msg) = r.peek() else {
                self.take_request();
                continue;
            };
            let Ok((h, n)) = header::parse_request(&msg, channel) else {
                self.take_request(); // checked on arrival; never here
                continue;
            };
            if !self.serve.knows(h.call)
                && (self.serve.admitted >= self.cfg.max_requests_per_peer as usize
                    || !self.call_room(msg.len()))
            {
                return None; // full: the caller waits, nothing is dropped
            }
            self.take_request();
            let class = if h.flags & header::FLAG_RESEND != 0 {
                RequestClass::Resend
            } else {
                RequestClass::Send
            };
            match self.serve.arrive(h.call, lane, msg.len()) {
                Arrival::New => {
                    let priority =
                        if class == RequestClass::Resend || h.flags & header::FLAG_HIGH != 0 {
                            Priority::High
                        } else {
                            Priority::Normal
                        };
                    let now = self.now;
                    return Some(Ticket {
                        peer: self.node,
                        session: self.id,
                        call: h.call,
                        channel: h.channel,
                        priority,
                        class,
                        arrived: now,
                        deadline: h
                            .timeout_us
                            .map(|t| now + std::time::Duration::from_micros(t)),
                        body: msg.slice(n..),
                    });
                }
                Arrival::Admitted => {
                    // The caller is waiting: it is still ours, and should
                    // go first if it still waits for a worker.
                    self.answer_duplicate(h.call, None);
                    self.events.push_back(Event::Promote {
                        peer: self.node,
                        session: self.id,
                        call: h.call,
                    });
                }
                Arrival::Done(reply) => self.answer_duplicate(h.call, reply),
            }
        }
    }

    /// Consumes the message at the front of the request queue.
    fn take_request(&mut self) {
        if let Some(r) = self.requests.front_mut() {
            let (stream, cost) = (r.stream, r.cost);
            let (seq, _, done) = r.take();
            if done {
                self.requests.pop_front();
                self.consumed(stream, seq + 1, cost);
            }
        }
    }

    /// Whether requests wait for `poll_request` (admitted or not).
    pub fn has_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Handles replies as they are released: each completes its call.
    pub(super) fn on_replies(&mut self, now: Time, mut r: Released) {
        loop {
            let (stream, cost) = (r.stream, r.cost);
            let (seq, msg, done) = r.take();
            if let Some(msg) = msg {
                self.on_reply(now, msg);
            }
            if done {
                self.recv.consumed(now, stream, seq + 1, cost);
                return;
            }
        }
    }

    fn on_reply(&mut self, now: Time, msg: Bytes) {
        // Checked on arrival.
        let Ok((call, status, n)) = header::parse_reply(&msg) else {
            return;
        };
        let result = match status {
            ReplyStatus::StillRunning => {
                self.calls.still_running(now, call);
                return;
            }
            ReplyStatus::Ok => Ok(msg.slice(n..)),
            ReplyStatus::Error(e) => Err(CallFailure::Remote(e)),
        };
        // A second answer to a finished call finds nothing.
        if let Some(o) = self.calls.answered(call) {
            self.events.push_back(Event::CallDone {
                peer: self.node,
                session: self.id,
                call,
                sends: o.state.sends(),
                result,
            });
        }
    }
}
