//! Frames for one path as a gather list: headers and small bodies copied
//! into one buffer, large bodies (a batch, a big message) handed over by
//! reference, so a shell can write them with one vectored system call and
//! no copy of the payloads in user space.

use bytes::{Bytes, BytesMut};

/// A gather list of frame bytes. See the module docs.
#[derive(Debug, Default)]
pub struct TransmitBuf {
    /// Bytes being appended (headers, small bodies).
    head: BytesMut,
    /// Finished pieces, in order, before `head`.
    chunks: Vec<Bytes>,
    /// Bytes in `chunks`.
    sealed: usize,
}

impl TransmitBuf {
    /// Bodies at least this long are referenced rather than copied: below
    /// it, another `iovec` costs more than the copy.
    pub const ZERO_COPY_MIN: usize = 1024;

    /// An empty list.
    pub fn new() -> TransmitBuf {
        TransmitBuf::default()
    }

    /// An empty list appending to `head` (reusing its capacity).
    pub fn with_head(mut head: BytesMut) -> TransmitBuf {
        head.clear();
        TransmitBuf {
            head,
            chunks: Vec::new(),
            sealed: 0,
        }
    }

    /// Where headers and small bodies are appended.
    #[inline]
    pub fn head(&mut self) -> &mut BytesMut {
        &mut self.head
    }

    /// Appends `b`: by reference if it is long, else copied.
    #[inline]
    pub fn put_bytes(&mut self, b: &Bytes) {
        if b.len() < Self::ZERO_COPY_MIN {
            self.head.extend_from_slice(b);
            return;
        }
        self.seal();
        self.sealed += b.len();
        self.chunks.push(b.clone());
    }

    fn seal(&mut self) {
        if !self.head.is_empty() {
            self.sealed += self.head.len();
            self.chunks.push(self.head.split().freeze());
        }
    }

    /// Bytes in the list.
    pub fn len(&self) -> usize {
        self.sealed + self.head.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the pieces, in order (the list is empty afterwards).
    pub fn drain(&mut self) -> std::vec::Drain<'_, Bytes> {
        self.seal();
        self.sealed = 0;
        self.chunks.drain(..)
    }

    /// The bytes as one buffer (copies the referenced pieces).
    pub fn into_flat(mut self) -> BytesMut {
        if self.chunks.is_empty() {
            return self.head;
        }
        self.seal();
        let mut out = BytesMut::with_capacity(self.sealed);
        for c in &self.chunks {
            out.extend_from_slice(c);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pieces_are_copied_large_ones_referenced_order_kept() {
        let mut t = TransmitBuf::new();
        t.head().extend_from_slice(b"h1");
        t.put_bytes(&Bytes::from_static(b"small"));
        let big = Bytes::from(vec![7u8; TransmitBuf::ZERO_COPY_MIN]);
        t.put_bytes(&big);
        t.head().extend_from_slice(b"h2");
        assert_eq!(t.len(), 2 + 5 + big.len() + 2);
        let pieces: Vec<Bytes> = t.drain().collect();
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[0], Bytes::from_static(b"h1small"));
        assert_eq!(pieces[1].as_ptr(), big.as_ptr(), "referenced, not copied");
        assert_eq!(pieces[2], Bytes::from_static(b"h2"));
        assert!(t.is_empty());
        t.head().extend_from_slice(b"x");
        t.put_bytes(&big);
        let flat = t.into_flat();
        assert_eq!(flat.len(), 1 + big.len());
        assert_eq!(flat[0], b'x');
    }
}
