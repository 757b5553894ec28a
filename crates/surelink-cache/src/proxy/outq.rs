//! A client's replies waiting to be written: the nodes' own buffers
//! (reference-counted `Bytes`, a value named twice queued twice by
//! reference), written with vectored writes as the socket takes them.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes};

/// Buffers per vectored write (Linux takes up to 1024; a few dozen
/// already fill a socket buffer).
const SLICES: usize = 64;

/// Replies not yet written, in order.
#[derive(Debug, Default)]
pub(super) struct OutQueue {
    chunks: VecDeque<Bytes>,
    /// Their bytes (a buffer queued twice counts twice).
    len: usize,
}

impl OutQueue {
    /// Queues `b` after what is there.
    pub(super) fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.chunks.push_back(b);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The front buffers, for one vectored write.
    pub(super) fn slices(&self) -> Vec<IoSlice<'_>> {
        self.chunks
            .iter()
            .take(SLICES)
            .map(|b| IoSlice::new(b))
            .collect()
    }

    /// Drops the first `n` bytes (written).
    pub(super) fn advance(&mut self, mut n: usize) {
        self.len -= n.min(self.len);
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.chunks.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_writes_advance_across_buffers_and_shared_ones_count_each_time() {
        let mut q = OutQueue::default();
        let v = Bytes::from_static(b"VALUE k 0 3\r\nabc\r\n");
        q.push(v.clone());
        q.push(Bytes::new());
        q.push(v.clone());
        q.push(Bytes::from_static(b"END\r\n"));
        assert_eq!(q.len(), 2 * v.len() + 5);
        assert_eq!(q.slices().len(), 3, "the empty buffer is not queued");
        q.advance(v.len() + 2);
        assert_eq!(q.len(), v.len() - 2 + 5);
        let mut rest = Vec::new();
        for s in q.slices() {
            rest.extend_from_slice(&s);
        }
        assert_eq!(rest, b"LUE k 0 3\r\nabc\r\nEND\r\n");
        q.advance(rest.len());
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }
}
