//! The record layer: after the handshake every byte on a path travels in
//! AEAD records (AES-256-GCM or ChaCha20-Poly1305, as the two ends agreed:
//! see [`RecordCipher`]), so a frame is
//! accepted only if the authenticated peer sent it, unaltered, once, in
//! this position of this connection.
//!
//! A record is `length: u32 BE | body | tag: 16 bytes`, `length` counting
//! the body only; the header is the associated data. With
//! [`Protection::Encrypt`] the body is the ciphertext. With
//! [`Protection::IntegrityOnly`] the body is the plaintext and the tag is
//! the one AES-GCM gives its encryption; the receiver encrypts a copy to
//! check it. An altered plaintext is an altered ciphertext to an AEAD, so
//! this is exactly as hard to forge, and with ring it is ~5x faster than
//! GMAC over the body as associated data (measured 6.8 against 1.45 GB/s).
//! Nonces are a per-direction counter (for both ciphers: 32 zero bits,
//! 64-bit big-endian counter) never
//! sent: TCP delivers records in order, so a replayed, dropped or
//! reordered record fails its tag. Keys are fresh per connection (the
//! ephemeral keys of the handshake), so nothing replays across
//! connections either.

use bytes::{BufMut, Bytes, BytesMut};
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};

use super::Protection;

/// Header bytes before each record's body.
pub const RECORD_HEADER: usize = 4;
/// Tag bytes after each record's body.
pub const RECORD_TAG: usize = 16;
/// Largest body of one record. Bounds what a receiver buffers before it can
/// check anything (TLS uses 16 KiB; larger records cost fewer tags).
pub const MAX_RECORD: usize = 64 * 1024;

/// A record that cannot be accepted: the connection must be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The length header exceeds [`MAX_RECORD`].
    #[error("record of {0} bytes exceeds the {MAX_RECORD}-byte limit")]
    TooLong(usize),
    /// The tag does not verify: altered, replayed, reordered or not from
    /// the authenticated peer.
    #[error("record failed authentication (altered, replayed or forged)")]
    Forged,
    /// 2^64 records on one connection (cannot happen in practice; the
    /// connection would have to be re-established).
    #[error("record counter exhausted; reconnect")]
    Exhausted,
}

/// The AEAD of a path's records. Both have 256-bit keys; the ends agree on
/// one per connection (see `preamble`): the accepting side's preference
/// when the dialler offers it.
///
/// `cargo bench -p surelink-proto --bench ciphers` compares them: with
/// AES instructions AES-256-GCM costs a third to a half of
/// ChaCha20-Poly1305; without them ChaCha20-Poly1305 is the faster (and
/// constant-time in software, which AES is not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordCipher {
    /// AES-256-GCM.
    Aes256Gcm,
    /// ChaCha20-Poly1305 (RFC 8439).
    ChaCha20Poly1305,
}

impl RecordCipher {
    /// Every cipher, in code order.
    pub const ALL: [RecordCipher; 2] = [RecordCipher::Aes256Gcm, RecordCipher::ChaCha20Poly1305];

    /// The faster on this CPU: AES-256-GCM where it has AES and carry-less
    /// multiply instructions, ChaCha20-Poly1305 elsewhere. The default
    /// preference. (A fact of the hardware, read once; not a measurement.)
    pub fn fastest_here() -> RecordCipher {
        if aes_in_hardware() {
            RecordCipher::Aes256Gcm
        } else {
            RecordCipher::ChaCha20Poly1305
        }
    }

    pub(super) fn code(self) -> u8 {
        match self {
            RecordCipher::Aes256Gcm => 0,
            RecordCipher::ChaCha20Poly1305 => 1,
        }
    }

    pub(super) fn from_code(c: u8) -> Option<RecordCipher> {
        RecordCipher::ALL.into_iter().find(|x| x.code() == c)
    }

    fn algorithm(self) -> &'static ring::aead::Algorithm {
        match self {
            RecordCipher::Aes256Gcm => &AES_256_GCM,
            RecordCipher::ChaCha20Poly1305 => &CHACHA20_POLY1305,
        }
    }
}

impl std::fmt::Display for RecordCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecordCipher::Aes256Gcm => "aes-256-gcm",
            RecordCipher::ChaCha20Poly1305 => "chacha20-poly1305",
        })
    }
}

impl std::str::FromStr for RecordCipher {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RecordCipher::ALL
            .into_iter()
            .find(|c| c.to_string() == s)
            .ok_or_else(|| {
                format!("unknown record cipher {s:?} (aes-256-gcm or chacha20-poly1305)")
            })
    }
}

#[cfg(target_arch = "x86_64")]
fn aes_in_hardware() -> bool {
    std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
}

#[cfg(target_arch = "aarch64")]
fn aes_in_hardware() -> bool {
    std::arch::is_aarch64_feature_detected!("aes")
        && std::arch::is_aarch64_feature_detected!("pmull")
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn aes_in_hardware() -> bool {
    false
}

#[derive(Debug)]
struct Cipher {
    key: LessSafeKey,
    counter: u64,
    protection: Protection,
    /// Integrity only: where the copy is encrypted to compute the tag.
    scratch: Vec<u8>,
}

impl Cipher {
    fn new(key: &[u8; 32], protection: Protection, cipher: RecordCipher) -> Cipher {
        // A 32-byte key is always valid for both ciphers.
        #[allow(clippy::expect_used)]
        let key = UnboundKey::new(cipher.algorithm(), key).expect("32-byte key");
        Cipher {
            key: LessSafeKey::new(key),
            counter: 0,
            protection,
            scratch: Vec::new(),
        }
    }

    /// The tag of `body` (encrypted in place when `Encrypt`, a copy of it
    /// when `IntegrityOnly`).
    fn seal(&mut self, hdr: &[u8], body: &mut [u8]) -> Result<Tag, RecordError> {
        let nonce = self.next_nonce()?;
        let target = match self.protection {
            Protection::Encrypt => body,
            Protection::IntegrityOnly => {
                self.scratch.clear();
                self.scratch.extend_from_slice(body);
                &mut self.scratch[..]
            }
        };
        self.key
            .seal_in_place_separate_tag(nonce, Aad::from(hdr), target)
            .map_err(|_| RecordError::Exhausted)
    }

    /// Checks `tag` and, when `Encrypt`, decrypts `body` in place.
    fn open(&mut self, hdr: &[u8], body: &mut [u8], tag: &[u8]) -> Result<(), RecordError> {
        let nonce = self.next_nonce()?;
        let tag: [u8; RECORD_TAG] = tag.try_into().map_err(|_| RecordError::Forged)?;
        match self.protection {
            Protection::Encrypt => self
                .key
                .open_in_place_separate_tag(nonce, Aad::from(hdr), Tag::from(tag), body, 0..)
                .map(|_| ())
                .map_err(|_| RecordError::Forged),
            Protection::IntegrityOnly => {
                self.scratch.clear();
                self.scratch.extend_from_slice(body);
                let want = self
                    .key
                    .seal_in_place_separate_tag(nonce, Aad::from(hdr), &mut self.scratch)
                    .map_err(|_| RecordError::Forged)?;
                // Constant time: no early exit on the first differing byte.
                let diff = want
                    .as_ref()
                    .iter()
                    .zip(&tag)
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b));
                if diff == 0 {
                    Ok(())
                } else {
                    Err(RecordError::Forged)
                }
            }
        }
    }

    fn cipher(&self) -> RecordCipher {
        if std::ptr::eq(self.key.algorithm(), &CHACHA20_POLY1305) {
            RecordCipher::ChaCha20Poly1305
        } else {
            RecordCipher::Aes256Gcm
        }
    }

    fn next_nonce(&mut self) -> Result<Nonce, RecordError> {
        if self.counter == u64::MAX {
            return Err(RecordError::Exhausted);
        }
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&self.counter.to_be_bytes());
        self.counter += 1;
        Ok(Nonce::assume_unique_for_key(n))
    }
}

/// Seals outgoing bytes into records (one per path and direction).
#[derive(Debug)]
pub struct Sealer(Cipher);

/// Opens incoming records (one per path and direction).
#[derive(Debug)]
pub struct Opener(Cipher);

impl Sealer {
    /// A sealer for one direction of a connection. Keys come from a
    /// finished [`super::Handshake`]; this constructor is public for tests
    /// and fuzzing.
    pub fn new(key: &[u8; 32], protection: Protection) -> Sealer {
        Sealer::with_cipher(key, protection, RecordCipher::Aes256Gcm)
    }

    /// [`Sealer::new`] with `cipher`.
    pub fn with_cipher(key: &[u8; 32], protection: Protection, cipher: RecordCipher) -> Sealer {
        Sealer(Cipher::new(key, protection, cipher))
    }

    /// The cipher these records use.
    pub fn cipher(&self) -> RecordCipher {
        self.0.cipher()
    }

    /// Appends `pieces` (concatenated, in order) to `out` as records.
    pub fn seal<'a>(
        &mut self,
        pieces: impl IntoIterator<Item = &'a [u8]>,
        out: &mut BytesMut,
    ) -> Result<(), RecordError> {
        let mut start = out.len();
        out.put_u32(0);
        for mut p in pieces {
            while !p.is_empty() {
                let room = MAX_RECORD - (out.len() - start - RECORD_HEADER);
                if room == 0 {
                    self.finish(out, start)?;
                    start = out.len();
                    out.put_u32(0);
                    continue;
                }
                let n = room.min(p.len());
                out.extend_from_slice(&p[..n]);
                p = &p[n..];
            }
        }
        if out.len() - start == RECORD_HEADER {
            // Nothing (left) to seal.
            out.truncate(start);
            return Ok(());
        }
        self.finish(out, start)
    }

    /// Seals the record whose header starts at `start` and whose body runs
    /// to the end of `out`.
    fn finish(&mut self, out: &mut BytesMut, start: usize) -> Result<(), RecordError> {
        let body_len = out.len() - start - RECORD_HEADER;
        let len = u32::try_from(body_len).map_err(|_| RecordError::TooLong(body_len))?;
        out[start..start + RECORD_HEADER].copy_from_slice(&len.to_be_bytes());
        let tag = {
            let (hdr, body) = out[start..].split_at_mut(RECORD_HEADER);
            self.0.seal(hdr, body)?
        };
        out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// `seal` into a fresh buffer.
    pub fn seal_to_bytes<'a>(
        &mut self,
        pieces: impl IntoIterator<Item = &'a [u8]> + Clone,
    ) -> Result<Bytes, RecordError> {
        let total: usize = pieces.clone().into_iter().map(<[u8]>::len).sum();
        let records = total.div_ceil(MAX_RECORD).max(1);
        let mut out = BytesMut::with_capacity(total + records * (RECORD_HEADER + RECORD_TAG));
        self.seal(pieces, &mut out)?;
        Ok(out.freeze())
    }
}

impl Opener {
    /// An opener for one direction of a connection (see [`Sealer::new`]).
    pub fn new(key: &[u8; 32], protection: Protection) -> Opener {
        Opener::with_cipher(key, protection, RecordCipher::Aes256Gcm)
    }

    /// [`Opener::new`] with `cipher`.
    pub fn with_cipher(key: &[u8; 32], protection: Protection, cipher: RecordCipher) -> Opener {
        Opener(Cipher::new(key, protection, cipher))
    }

    /// Opens the record at the front of `raw` (removing it) and returns
    /// its body, `None` while it is incomplete. The body is `raw`'s own
    /// memory, opened in place: no copy.
    pub fn open_record(&mut self, raw: &mut BytesMut) -> Result<Option<BytesMut>, RecordError> {
        if raw.len() < RECORD_HEADER {
            return Ok(None);
        }
        let mut hdr = [0u8; RECORD_HEADER];
        hdr.copy_from_slice(&raw[..RECORD_HEADER]);
        let len = u32::from_be_bytes(hdr) as usize;
        if len > MAX_RECORD {
            return Err(RecordError::TooLong(len));
        }
        let whole = RECORD_HEADER + len + RECORD_TAG;
        if raw.len() < whole {
            // Make room for the rest in one go rather than growing per read.
            raw.reserve(whole - raw.len());
            return Ok(None);
        }
        let mut rec = raw.split_to(whole);
        {
            let (head, rest) = rec.split_at_mut(RECORD_HEADER);
            let (body, tag) = rest.split_at_mut(len);
            self.0.open(head, body, tag)?;
        }
        let _ = rec.split_to(RECORD_HEADER);
        rec.truncate(len);
        Ok(Some(rec))
    }

    /// Opens every whole record at the front of `raw` and appends the
    /// bodies to `out` (handing the first over without a copy when `out`
    /// is empty); a partial record stays in `raw`.
    pub fn open(&mut self, raw: &mut BytesMut, out: &mut BytesMut) -> Result<(), RecordError> {
        while let Some(rec) = self.open_record(raw)? {
            if out.is_empty() {
                *out = rec;
            } else {
                out.extend_from_slice(&rec);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(p: Protection, c: RecordCipher) -> (Sealer, Opener) {
        let k = [7u8; 32];
        (Sealer::with_cipher(&k, p, c), Opener::with_cipher(&k, p, c))
    }

    /// Every protection mode with every cipher.
    fn modes() -> impl Iterator<Item = (Protection, RecordCipher)> {
        [Protection::Encrypt, Protection::IntegrityOnly]
            .into_iter()
            .flat_map(|p| RecordCipher::ALL.into_iter().map(move |c| (p, c)))
    }

    fn open_all(o: &mut Opener, raw: &[u8]) -> Result<Vec<u8>, RecordError> {
        let mut raw = BytesMut::from(raw);
        let mut out = BytesMut::new();
        o.open(&mut raw, &mut out)?;
        assert!(raw.is_empty(), "whole records left {} bytes", raw.len());
        Ok(out.to_vec())
    }

    #[test]
    fn round_trip_in_pieces_and_across_reads() {
        for (p, c) in modes() {
            let (mut s, mut o) = pair(p, c);
            let big = vec![3u8; MAX_RECORD * 2 + 100];
            let mut wire = BytesMut::new();
            s.seal([&b"hello "[..], b"world"], &mut wire).unwrap();
            s.seal([big.as_slice()], &mut wire).unwrap();
            s.seal(std::iter::empty(), &mut wire).unwrap();
            // Three records for the big one.
            assert_eq!(
                wire.len(),
                11 + big.len() + 4 * (RECORD_HEADER + RECORD_TAG)
            );
            if p == Protection::Encrypt {
                assert!(
                    !wire.windows(5).any(|w| w == b"hello"),
                    "plaintext on the wire"
                );
            } else {
                assert!(wire.windows(5).any(|w| w == b"hello"));
            }
            // Delivered a few bytes at a time.
            let mut raw = BytesMut::new();
            let mut out = BytesMut::new();
            for chunk in wire.chunks(777) {
                raw.extend_from_slice(chunk);
                o.open(&mut raw, &mut out).unwrap();
            }
            assert!(raw.is_empty());
            assert_eq!(&out[..11], b"hello world");
            assert_eq!(&out[11..], big.as_slice());
        }
    }

    #[test]
    fn any_altered_byte_replay_or_drop_is_refused() {
        for (p, c) in modes() {
            let (mut s, _) = pair(p, c);
            let r1 = s.seal_to_bytes([&b"first"[..]]).unwrap();
            let r2 = s.seal_to_bytes([&b"second"[..]]).unwrap();
            for i in 0..r1.len() {
                let mut bad = r1.to_vec();
                bad[i] ^= 0x40;
                let (_, mut o) = pair(p, c);
                let mut raw = BytesMut::from(bad.as_slice());
                let mut out = BytesMut::new();
                let r = o.open(&mut raw, &mut out);
                // Refused, or (a length made longer) still waiting for
                // bytes: never accepted.
                assert!(out.is_empty(), "byte {i} altered was accepted: {r:?}");
                assert!(r.is_err() || i < RECORD_HEADER, "byte {i} altered: {r:?}");
            }
            // Dropped record: the second alone fails (wrong nonce).
            let (_, mut o) = pair(p, c);
            assert_eq!(open_all(&mut o, &r2), Err(RecordError::Forged));
            // Replayed record fails.
            let (_, mut o) = pair(p, c);
            let mut both = r1.to_vec();
            both.extend_from_slice(&r1);
            assert_eq!(open_all(&mut o, &both), Err(RecordError::Forged));
            // In order: fine.
            let (_, mut o) = pair(p, c);
            let mut both = r1.to_vec();
            both.extend_from_slice(&r2);
            assert_eq!(open_all(&mut o, &both).unwrap(), b"firstsecond");
            // Another key: refused.
            let mut o = Opener::with_cipher(&[8u8; 32], p, c);
            assert_eq!(open_all(&mut o, &r1), Err(RecordError::Forged));
            // The same key under the other cipher: refused.
            let other = RecordCipher::ALL.into_iter().find(|x| *x != c).unwrap();
            let mut o = Opener::with_cipher(&[7u8; 32], p, other);
            assert_eq!(open_all(&mut o, &r1), Err(RecordError::Forged));
            assert_eq!(s.cipher(), c);
        }
    }

    #[test]
    fn cipher_names_parse_back() {
        for c in RecordCipher::ALL {
            assert_eq!(c.to_string().parse::<RecordCipher>(), Ok(c));
            assert_eq!(RecordCipher::from_code(c.code()), Some(c));
        }
        assert!("aes-128-gcm".parse::<RecordCipher>().is_err());
        assert_eq!(RecordCipher::from_code(7), None);
    }

    #[test]
    fn oversized_header_is_refused_before_buffering() {
        let (_, mut o) = pair(Protection::Encrypt, RecordCipher::Aes256Gcm);
        let mut raw = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        let mut out = BytesMut::new();
        assert_eq!(
            o.open(&mut raw, &mut out),
            Err(RecordError::TooLong(u32::MAX as usize))
        );
    }
}
