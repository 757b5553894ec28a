//! The 16 bytes each end of a path sends before its handshake:
//!
//! ```text
//! "SLNK" | version | protection | auth | ciphers | cluster (u64 BE)
//! ```
//!
//! They make mismatches name themselves (another cluster, an insecure
//! peer, another protection mode, Noise keys against certificates) instead
//! of failing as "bad MAC". Each side checks the peer's preamble against its
//! own values; the Noise handshake also binds its own as the prologue
//! (without the cipher byte, which may differ between the ends).
//!
//! `ciphers` offers record ciphers: low four bits one per
//! [`RecordCipher`] code offered, high four bits the code preferred; `0`
//! offers AES-256-GCM alone, as builds before the cipher byte send, so
//! an end preferring AES-256-GCM sends `0` and old and new nodes still
//! connect (with the keys they derived before). An end preferring
//! ChaCha20-Poly1305 offers both. The path uses the accepting side's
//! preference if the dialler offers it, else the dialler's, else refuses
//! ([`choose`]). Both bytes are bound to the keys: Noise derives its
//! record keys from them unless both are `0` (`noise`), a resumption's
//! MACs cover both preambles, and TLS negotiates its suite itself inside
//! its authenticated handshake.

use bytes::{Buf, BytesMut};

use super::record::RecordCipher;
use super::{Protection, SecureError};
use crate::ids::ClusterId;

const MAGIC: &[u8; 4] = b"SLNK";
const VERSION: u8 = 1;
/// Preamble bytes.
pub const PREAMBLE_LEN: usize = 16;

/// How a path's ends prove who they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Auth {
    /// Noise XX with each member's static key from the member list.
    Noise,
    /// Mutual TLS 1.3 with certificates from a site's certificate authority.
    Tls,
    /// A ticket from an earlier Noise handshake between the same two
    /// members (`resume`); sent only by a dialling side, which a side
    /// configured for Noise accepts.
    Resume,
}

impl Auth {
    fn code(self) -> u8 {
        match self {
            Auth::Noise => 0,
            Auth::Tls => 1,
            Auth::Resume => 2,
        }
    }

    fn from_code(c: u8) -> Option<Auth> {
        match c {
            0 => Some(Auth::Noise),
            1 => Some(Auth::Tls),
            2 => Some(Auth::Resume),
            _ => None,
        }
    }
}

impl std::fmt::Display for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::Noise => "member keys (Noise)",
            Auth::Tls => "certificates (mutual TLS)",
            Auth::Resume => "member keys (Noise, resuming with a ticket)",
        })
    }
}

/// Where the cipher byte sits.
pub(super) const CIPHERS: usize = 7;
const OFFER_MASK: u8 = 0x0f;

/// The cipher byte preferring `prefer`: AES-256-GCM alone as `0` (what
/// builds before the cipher byte send), otherwise every cipher offered.
pub(super) fn offer(prefer: RecordCipher) -> u8 {
    match prefer {
        RecordCipher::Aes256Gcm => 0,
        _ => {
            let all = RecordCipher::ALL.iter().fold(0u8, |m, c| m | 1 << c.code());
            all | prefer.code() << 4
        }
    }
}

/// `0` is AES-256-GCM alone, preferred.
fn expand(ciphers: u8) -> u8 {
    if ciphers == 0 {
        1 << RecordCipher::Aes256Gcm.code()
    } else {
        ciphers
    }
}

/// The cipher a path uses, from the dialler's and the accepting side's
/// cipher bytes (both already checked by [`read_either`]).
pub(super) fn choose(initiator: u8, responder: u8) -> Result<RecordCipher, SecureError> {
    let (initiator, responder) = (expand(initiator), expand(responder));
    let common = u32::from(initiator & responder & OFFER_MASK);
    // Codes are at most 15 (a nibble): the shift never overflows a u32.
    [responder >> 4, initiator >> 4]
        .into_iter()
        .chain(0..4)
        .find(|code| common & (1u32 << code) != 0)
        .and_then(RecordCipher::from_code)
        .ok_or(SecureError::NoCommonCipher {
            initiator: initiator & OFFER_MASK,
            responder: responder & OFFER_MASK,
        })
}

/// `pre` without its cipher byte: what the Noise prologue binds.
pub(super) fn prologue(pre: &[u8; PREAMBLE_LEN]) -> [u8; PREAMBLE_LEN] {
    let mut p = *pre;
    p[CIPHERS] = 0;
    p
}

/// This end's preamble.
pub(super) fn encode(
    cluster: ClusterId,
    protection: Protection,
    auth: Auth,
    ciphers: u8,
) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..4].copy_from_slice(MAGIC);
    p[4] = VERSION;
    p[5] = protection.code();
    p[6] = auth.code();
    p[CIPHERS] = ciphers;
    p[8..].copy_from_slice(&cluster.0.to_be_bytes());
    p
}

/// Reads the peer's preamble from the front of `buf` and checks it against
/// ours: its cipher byte once read (and consumed), `None` while
/// incomplete. A wrong magic is refused as soon as it shows, even in fewer
/// bytes.
pub(super) fn read(
    buf: &mut BytesMut,
    cluster: ClusterId,
    protection: Protection,
    auth: Auth,
) -> Result<Option<u8>, SecureError> {
    Ok(read_either(buf, cluster, protection, [auth, auth])?.map(|(_, c)| c))
}

/// [`read`] accepting either of `auths`: which the peer sent and its
/// cipher byte, once read.
pub(super) fn read_either(
    buf: &mut BytesMut,
    cluster: ClusterId,
    protection: Protection,
    auths: [Auth; 2],
) -> Result<Option<(Auth, u8)>, SecureError> {
    let auth = auths[0];
    let n = buf.len().min(MAGIC.len());
    if buf[..n] != MAGIC[..n] {
        return Err(SecureError::NotSecure);
    }
    if buf.len() < PREAMBLE_LEN {
        return Ok(None);
    }
    let p = &buf[..PREAMBLE_LEN];
    if p[4] != VERSION {
        return Err(SecureError::Version(p[4]));
    }
    let ciphers = p[CIPHERS];
    let preferred = ciphers >> 4;
    let offered = u32::from(ciphers) & (1u32 << preferred) != 0;
    if ciphers != 0 && (RecordCipher::from_code(preferred).is_none() || !offered) {
        // Offers of ciphers we do not know are fine (a newer peer); its
        // preference must be among its offers.
        return Err(SecureError::Malformed("preamble cipher offer"));
    }
    let mut c = [0u8; 8];
    c.copy_from_slice(&p[8..16]);
    let theirs = ClusterId(u64::from_be_bytes(c));
    if theirs != cluster {
        return Err(SecureError::WrongCluster {
            ours: cluster,
            theirs,
        });
    }
    let theirs = Protection::from_code(p[5]).ok_or(SecureError::Malformed("protection"))?;
    if theirs != protection {
        return Err(SecureError::ProtectionMismatch {
            ours: protection,
            theirs,
        });
    }
    let theirs = Auth::from_code(p[6]).ok_or(SecureError::Malformed("preamble"))?;
    if !auths.contains(&theirs) {
        return Err(SecureError::AuthMismatch { ours: auth, theirs });
    }
    buf.advance(PREAMBLE_LEN);
    Ok(Some((theirs, ciphers)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AES: RecordCipher = RecordCipher::Aes256Gcm;
    const CHACHA: RecordCipher = RecordCipher::ChaCha20Poly1305;

    #[test]
    fn the_acceptor_s_preference_wins_then_the_dialler_s() {
        // Preferring AES offers it alone (byte 0, as older builds send).
        assert_eq!(offer(AES), 0);
        assert_eq!(choose(offer(AES), offer(AES)), Ok(AES));
        assert_eq!(choose(offer(CHACHA), offer(AES)), Ok(AES));
        assert_eq!(choose(offer(CHACHA), offer(CHACHA)), Ok(CHACHA));
        // The acceptor prefers ChaCha20 but the dialler offers AES alone.
        assert_eq!(choose(offer(AES), offer(CHACHA)), Ok(AES));
        // Both offer both: the acceptor's preference.
        assert_eq!(choose(0x03, 0x13), Ok(CHACHA));
        assert_eq!(choose(0x13, 0x03), Ok(AES));
        assert_eq!(choose(offer(CHACHA), 0x01), Ok(AES));
        // Any bytes at all: an answer or a typed error, never a panic.
        for i in 0..=255u8 {
            for r in 0..=255u8 {
                let _ = choose(i, r);
            }
        }
        // Only the dialler's preference is common.
        assert_eq!(choose(0x02 | 1 << 4, 0x03 | 3 << 4), Ok(CHACHA));
        assert_eq!(
            choose(0x01, 0x02 | 1 << 4),
            Err(SecureError::NoCommonCipher {
                initiator: 0x01,
                responder: 0x02
            })
        );
    }

    #[test]
    fn a_cipher_byte_must_prefer_what_it_offers() {
        let c = ClusterId(3);
        let p = Protection::Encrypt;
        for (byte, ok) in [
            (offer(AES), true),
            (offer(CHACHA), true),
            (0x01, true),
            (0x0f, true),  // offers unknown to us are fine
            (0x00, true),  // AES alone: older builds
            (0x02, false), // prefers AES without offering it
            (0x31 | 0x08, false),
            (0x4f, false), // prefers an unknown code
        ] {
            let mut buf = BytesMut::from(&encode(c, p, Auth::Noise, byte)[..]);
            let r = read(&mut buf, c, p, Auth::Noise);
            assert_eq!(r.is_ok(), ok, "{byte:#04x}: {r:?}");
            if ok {
                assert_eq!(r, Ok(Some(byte)));
            }
        }
    }

    #[test]
    fn the_prologue_leaves_out_only_the_cipher_byte() {
        let c = ClusterId(3);
        let a = encode(c, Protection::Encrypt, Auth::Noise, offer(AES));
        let b = encode(c, Protection::Encrypt, Auth::Noise, offer(CHACHA));
        assert_ne!(a, b);
        assert_eq!(prologue(&a), prologue(&b));
        let d = encode(ClusterId(4), Protection::Encrypt, Auth::Noise, offer(AES));
        assert_ne!(prologue(&a), prologue(&d));
    }
}
