//! The 16 bytes each end of a path sends before its handshake:
//!
//! ```text
//! "SLNK" | version | protection | auth | 0 | cluster (u64 BE)
//! ```
//!
//! They make mismatches name themselves (another cluster, an insecure
//! peer, another protection mode, Noise keys against certificates) instead
//! of failing as "bad MAC". Each side checks the peer's preamble against its
//! own values; the Noise handshake also binds its own as the prologue.

use bytes::{Buf, BytesMut};

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

/// This end's preamble.
pub(super) fn encode(cluster: ClusterId, protection: Protection, auth: Auth) -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[..4].copy_from_slice(MAGIC);
    p[4] = VERSION;
    p[5] = protection.code();
    p[6] = auth.code();
    p[8..].copy_from_slice(&cluster.0.to_be_bytes());
    p
}

/// Reads the peer's preamble from the front of `buf` and checks it against
/// ours: `Ok(true)` once read (and consumed), `Ok(false)` while incomplete.
/// A wrong magic is refused as soon as it shows, even in fewer bytes.
pub(super) fn read(
    buf: &mut BytesMut,
    cluster: ClusterId,
    protection: Protection,
    auth: Auth,
) -> Result<bool, SecureError> {
    Ok(read_either(buf, cluster, protection, [auth, auth])?.is_some())
}

/// [`read`] accepting either of `auths`: which the peer sent, once read.
pub(super) fn read_either(
    buf: &mut BytesMut,
    cluster: ClusterId,
    protection: Protection,
    auths: [Auth; 2],
) -> Result<Option<Auth>, SecureError> {
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
    if p[7] != 0 {
        return Err(SecureError::Malformed("preamble"));
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
    Ok(Some(theirs))
}
