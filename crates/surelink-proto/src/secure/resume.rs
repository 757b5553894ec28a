//! Resumption: a further path between two members that already completed a
//! full handshake, authenticated by a secret that handshake left them,
//! without any public-key work.
//!
//! ```text
//! both  -> preamble (initiator: auth = Resume; responder: auth = Noise)
//! I -> R: ticket id (16) | nonce_i (32)
//! R -> I: 0 | nonce_r (32) | mac_r (32)     I checks mac_r
//!    or:  1                                  ticket unknown: both run Noise XX now
//! I -> R: mac_i (32)                         R checks mac_i
//! then records both ways, keyed from the secret and both nonces
//! ```
//!
//! Why: every path starts with a Noise XX handshake, three X25519
//! operations a side (~240 µs of a server's CPU here). When clients move
//! to a helper under load — the moment the server has least CPU to spare
//! — each move is one more path to the hot server. A member that proved
//! itself once need not prove its static key again: like MPTCP's MP_JOIN
//! or TLS 1.3's PSK-only resumption, the pair keeps a secret from the full
//! handshake ([`Ticket`], derived from that handshake's transport keys,
//! which no eavesdropper has) and proves knowledge of it over fresh nonces
//! from both ends. Only HMAC-SHA256 runs.
//!
//! What it gives and does not: both ends prove they hold the secret of an
//! earlier authenticated handshake with each other, so the peer is the
//! member that handshake proved (or someone who read that secret out of
//! one of the two processes' memory); a replayed first message meets a
//! fresh `nonce_r`, a replayed third a wrong MAC. Records are keyed per
//! path from both nonces. No forward secrecy beyond the ticket's life:
//! whoever learns a ticket's secret can read the paths resumed with it, as
//! with TLS's `psk_ke`. Tickets therefore live in memory only, expire
//! ([`TicketStore`], one hour by default), and are never made from a
//! resumed path — only a full handshake mints one. The preambles of both
//! ends are in both MACs, so cluster and protection are agreed as in the
//! full handshake.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use rustc_hash::FxHashMap as HashMap;

use super::noise::{Established, Handshake};
use super::preamble::{self, Auth, CIPHERS, PREAMBLE_LEN};
use super::record::{Opener, RecordCipher, Sealer};
use super::{Protection, SecureError};
use crate::ids::{ClusterId, NodeId};
use crate::time::Time;

/// Bytes of a ticket's public id.
pub const TICKET_ID_LEN: usize = 16;
const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;
const STATUS_OK: u8 = 0;
const STATUS_UNKNOWN: u8 = 1;

/// What a full handshake leaves both ends for resuming further paths: the
/// peer it proved, a public id and a secret. Its `Debug` hides the secret.
#[derive(Clone)]
pub struct Ticket {
    peer: NodeId,
    id: [u8; TICKET_ID_LEN],
    secret: [u8; 32],
    /// When it was minted (the caller's clock).
    made: Time,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Ticket {
    /// Minted from a full handshake's transport keys (initiator to
    /// responder, responder to initiator): the same at both ends.
    pub(super) fn from_split(peer: NodeId, i2r: &[u8; 32], r2i: &[u8; 32]) -> Ticket {
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"surelink resume ticket v1");
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(i2r);
        ctx.update(r2i);
        let prk = ctx.sign();
        let secret = expand(prk.as_ref(), b"secret");
        let id_full = expand(&secret, b"id");
        let mut id = [0u8; TICKET_ID_LEN];
        id.copy_from_slice(&id_full[..TICKET_ID_LEN]);
        Ticket {
            peer,
            id,
            secret,
            made: Time::ZERO,
        }
    }

    /// The member the full handshake proved.
    pub fn peer(&self) -> NodeId {
        self.peer
    }

    /// Its public id (sent in the clear when resuming).
    pub fn id(&self) -> [u8; TICKET_ID_LEN] {
        self.id
    }
}

/// One HKDF-Expand block (RFC 5869, 32 bytes out).
fn expand(prk: &[u8], info: &[u8]) -> [u8; 32] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, prk);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(info);
    ctx.update(&[1]);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

/// The tickets an endpoint holds: the newest few per peer, each for
/// `lifetime` after it was minted. Bounded by peers × `PER_PEER`.
#[derive(Debug)]
pub struct TicketStore {
    lifetime: Duration,
    by_peer: HashMap<NodeId, VecDeque<Ticket>>,
}

impl TicketStore {
    /// Tickets kept per peer: paths dialled both ways and several helpers
    /// mint more than one; the newest is used to dial, any is accepted.
    pub const PER_PEER: usize = 4;
    /// How long a ticket is used and accepted by default.
    pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
    /// A ticket younger than this is not dialled with while an older one
    /// lives: each side stores a minted ticket when its own part of the
    /// handshake ends, the peer's possibly a little after ours, so paths
    /// dialled right after a full handshake offered the ticket it had just
    /// minted before the peer held it, and fell back to a full handshake
    /// (1 time in 8 with tests running beside).
    pub const SETTLE: Duration = Duration::from_millis(250);

    /// An empty store whose tickets live `lifetime`.
    pub fn new(lifetime: Duration) -> TicketStore {
        TicketStore {
            lifetime,
            by_peer: HashMap::default(),
        }
    }

    /// Keeps `t`, minted at `now`; the oldest of its peer's beyond
    /// [`TicketStore::PER_PEER`] are dropped.
    pub fn insert(&mut self, now: Time, mut t: Ticket) {
        t.made = now;
        let q = self.by_peer.entry(t.peer).or_default();
        q.retain(|o| o.id != t.id);
        q.push_front(t);
        q.truncate(Self::PER_PEER);
    }

    fn fresh(&self, now: Time, t: &Ticket) -> bool {
        now.saturating_since(t.made) < self.lifetime
    }

    /// The newest live ticket for dialling `peer` that has settled
    /// ([`TicketStore::SETTLE`]); the newest live one if none has.
    pub fn for_dial(&self, now: Time, peer: NodeId) -> Option<Ticket> {
        let mut live = self
            .by_peer
            .get(&peer)?
            .iter()
            .filter(|t| self.fresh(now, t));
        let newest = live.next()?;
        if now.saturating_since(newest.made) >= Self::SETTLE {
            return Some(newest.clone());
        }
        Some(
            live.find(|t| now.saturating_since(t.made) >= Self::SETTLE)
                .unwrap_or(newest)
                .clone(),
        )
    }

    /// The live ticket with this id (a resuming peer names it).
    pub fn lookup(&self, now: Time, id: &[u8; TICKET_ID_LEN]) -> Option<Ticket> {
        self.by_peer
            .values()
            .flatten()
            .find(|t| &t.id == id)
            .filter(|t| self.fresh(now, t))
            .cloned()
    }

    /// Forgets the ticket with this id (the peer no longer knows it).
    pub fn forget(&mut self, peer: NodeId, id: &[u8; TICKET_ID_LEN]) {
        if let Some(q) = self.by_peer.get_mut(&peer) {
            q.retain(|t| &t.id != id);
        }
    }

    /// Drops expired tickets (call now and then; lookups ignore them
    /// anyway).
    pub fn handle_timeout(&mut self, now: Time) {
        let life = self.lifetime;
        self.by_peer.retain(|_, q| {
            q.retain(|t| now.saturating_since(t.made) < life);
            !q.is_empty()
        });
    }

    /// Tickets held.
    pub fn len(&self) -> usize {
        self.by_peer.values().map(VecDeque::len).sum()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn random<const N: usize>() -> Result<[u8; N], SecureError> {
    let mut b = [0u8; N];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| SecureError::Noise("the system random number generator failed".into()))?;
    Ok(b)
}

/// The transcript both MACs cover: both preambles, the ticket id, both
/// nonces; `who` tells the two MACs apart.
fn mac(
    t: &Ticket,
    who: &[u8],
    pre_i: &[u8],
    pre_r: &[u8],
    nonce_i: &[u8],
    nonce_r: &[u8],
) -> hmac::Tag {
    let key = hmac::Key::new(hmac::HMAC_SHA256, &t.secret);
    let mut ctx = hmac::Context::with_key(&key);
    for part in [who, pre_i, pre_r, &t.id, nonce_i, nonce_r] {
        ctx.update(part);
    }
    ctx.sign()
}

fn verify(t: &Ticket, who: &[u8], parts: [&[u8]; 4], got: &[u8]) -> Result<(), SecureError> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, &t.secret);
    let mut msg = Vec::with_capacity(2 * PREAMBLE_LEN + TICKET_ID_LEN + 2 * NONCE_LEN + 8);
    msg.extend_from_slice(who);
    msg.extend_from_slice(parts[0]);
    msg.extend_from_slice(parts[1]);
    msg.extend_from_slice(&t.id);
    msg.extend_from_slice(parts[2]);
    msg.extend_from_slice(parts[3]);
    hmac::verify(&key, &msg, got).map_err(|_| SecureError::Failed)
}

/// The path's record keys: (initiator to responder, responder to initiator).
fn path_keys(t: &Ticket, nonce_i: &[u8], nonce_r: &[u8]) -> ([u8; 32], [u8; 32]) {
    let salt = hmac::Key::new(hmac::HMAC_SHA256, &t.secret);
    let mut ctx = hmac::Context::with_key(&salt);
    ctx.update(nonce_i);
    ctx.update(nonce_r);
    let prk = ctx.sign();
    (
        expand(prk.as_ref(), b"surelink resume i2r"),
        expand(prk.as_ref(), b"surelink resume r2i"),
    )
}

fn established(
    peer: NodeId,
    send: &[u8; 32],
    recv: &[u8; 32],
    p: Protection,
    cipher: RecordCipher,
) -> Established {
    Established {
        peer,
        sealer: Sealer::with_cipher(send, p, cipher),
        opener: Opener::with_cipher(recv, p, cipher),
        exporter: None,
        ticket: None,
    }
}

/// Appends our own bytes, then the Noise side's (if one runs), to `buf`.
fn transmit(out: &mut BytesMut, noise: Option<&mut Handshake>, buf: &mut BytesMut) -> bool {
    let mut any = false;
    if !out.is_empty() {
        buf.extend_from_slice(out);
        out.clear();
        any = true;
    }
    if let Some(h) = noise {
        any |= h.poll_transmit(buf);
    }
    any
}

/// The dialling side of a path that may resume: resumes with its ticket,
/// or runs Noise XX on the same connection when the responder no longer
/// knows it.
pub struct Dial {
    ticket: Ticket,
    nonce_i: [u8; NONCE_LEN],
    pre_i: [u8; PREAMBLE_LEN],
    cluster: ClusterId,
    protection: Protection,
    got_preamble: bool,
    pre_r: [u8; PREAMBLE_LEN],
    /// Built when the responder refused the ticket.
    fallback: Option<Box<Handshake>>,
    /// Makes the fallback (it needs the member list and our keys).
    make_noise: Option<MakeHandshake>,
    out: BytesMut,
    done: bool,
}

impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dial")
            .field("peer", &self.ticket.peer)
            .field("fallback", &self.fallback.is_some())
            .finish_non_exhaustive()
    }
}

impl Dial {
    /// Dials `ticket`'s peer; `make_noise` builds the full handshake
    /// ([`Handshake::initiator`]) should the ticket be refused.
    pub fn new(
        ticket: Ticket,
        cluster: ClusterId,
        protection: Protection,
        make_noise: MakeHandshake,
    ) -> Result<Dial, SecureError> {
        let offer = preamble::offer(RecordCipher::fastest_here());
        let pre_i = preamble::encode(cluster, protection, Auth::Resume, offer);
        let nonce_i = random::<NONCE_LEN>()?;
        let mut out = BytesMut::with_capacity(PREAMBLE_LEN + TICKET_ID_LEN + NONCE_LEN);
        out.extend_from_slice(&pre_i);
        out.extend_from_slice(&ticket.id);
        out.extend_from_slice(&nonce_i);
        Ok(Dial {
            ticket,
            nonce_i,
            pre_i,
            cluster,
            protection,
            got_preamble: false,
            pre_r: [0; PREAMBLE_LEN],
            fallback: None,
            make_noise: Some(make_noise),
            out,
            done: false,
        })
    }

    /// See [`Handshake::prefer_cipher`] (the fallback's preference comes
    /// from here too).
    pub fn prefer_cipher(&mut self, cipher: RecordCipher) {
        self.pre_i[CIPHERS] = preamble::offer(cipher);
        if self.out.starts_with(b"SLNK") && self.out.len() >= PREAMBLE_LEN {
            self.out[CIPHERS] = self.pre_i[CIPHERS];
        }
    }

    /// The ticket tried (to forget it when refused).
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }

    /// Whether the responder refused the ticket and Noise runs instead.
    pub fn fell_back(&self) -> bool {
        self.fallback.is_some()
    }

    /// See [`Handshake::poll_transmit`].
    pub fn poll_transmit(&mut self, buf: &mut BytesMut) -> bool {
        transmit(&mut self.out, self.fallback.as_deref_mut(), buf)
    }

    /// See [`Handshake::handle_input`].
    pub fn handle_input(&mut self, buf: &mut BytesMut) -> Result<Option<Established>, SecureError> {
        if let Some(h) = self.fallback.as_mut() {
            return h.handle_input(buf);
        }
        if self.done {
            return Err(SecureError::Malformed("handshake already finished"));
        }
        if !self.got_preamble {
            if buf.len() >= PREAMBLE_LEN {
                self.pre_r.copy_from_slice(&buf[..PREAMBLE_LEN]);
            }
            if preamble::read(buf, self.cluster, self.protection, Auth::Noise)?.is_none() {
                return Ok(None);
            }
            self.got_preamble = true;
        }
        let Some(&status) = buf.first() else {
            return Ok(None);
        };
        match status {
            STATUS_UNKNOWN => {
                buf.advance(1);
                let make = self
                    .make_noise
                    .take()
                    .ok_or(SecureError::Malformed("fallback made twice"))?;
                let mut h = make()?;
                // Both preambles are already exchanged.
                h.skip_preamble(&self.pre_i, &self.pre_r);
                self.fallback = Some(Box::new(h));
                self.fallback
                    .as_mut()
                    .map_or(Ok(None), |h| h.handle_input(buf))
            }
            STATUS_OK => {
                if buf.len() < 1 + NONCE_LEN + MAC_LEN {
                    return Ok(None);
                }
                buf.advance(1);
                let nonce_r = buf.split_to(NONCE_LEN);
                let mac_r = buf.split_to(MAC_LEN);
                verify(
                    &self.ticket,
                    b"R",
                    [&self.pre_i, &self.pre_r, &self.nonce_i, &nonce_r],
                    &mac_r,
                )?;
                let mac_i = mac(
                    &self.ticket,
                    b"I",
                    &self.pre_i,
                    &self.pre_r,
                    &self.nonce_i,
                    &nonce_r,
                );
                self.out.extend_from_slice(mac_i.as_ref());
                self.done = true;
                let (i2r, r2i) = path_keys(&self.ticket, &self.nonce_i, &nonce_r);
                let cipher = preamble::choose(self.pre_i[CIPHERS], self.pre_r[CIPHERS])?;
                Ok(Some(established(
                    self.ticket.peer,
                    &i2r,
                    &r2i,
                    self.protection,
                    cipher,
                )))
            }
            _ => Err(SecureError::Malformed("resume status")),
        }
    }
}

/// Finds a ticket by the id a resuming peer names (the caller's store, at
/// its clock).
pub type TicketLookup = Box<dyn Fn(&[u8; TICKET_ID_LEN]) -> Option<Ticket> + Send>;

enum AcceptStep {
    /// Waiting for the initiator's preamble.
    Preamble,
    /// Noise XX (a full handshake, or a refused ticket's fallback).
    Noise,
    /// Resume: waiting for id and nonce.
    ResumeFirst,
    /// Resume: waiting for `mac_i`.
    ResumeThird {
        ticket: Ticket,
        nonce_r: [u8; NONCE_LEN],
    },
    Done,
}

/// Builds a full handshake's side when one is needed (its construction
/// alone costs a public-key operation: deriving our public key).
pub type MakeHandshake = Box<dyn FnOnce() -> Result<Handshake, SecureError> + Send>;

/// The accepting side when the initiator may resume: Noise XX, or
/// resumption with a ticket `lookup` knows. The Noise side is built only
/// when the peer runs it, so a resumption costs no public-key work at all.
pub struct Accept {
    noise: Option<Box<Handshake>>,
    make_noise: Option<MakeHandshake>,
    lookup: TicketLookup,
    pre_r: [u8; PREAMBLE_LEN],
    pre_i: [u8; PREAMBLE_LEN],
    nonce_i: [u8; NONCE_LEN],
    cluster: ClusterId,
    protection: Protection,
    step: AcceptStep,
    out: BytesMut,
    resumed: bool,
}

impl std::fmt::Debug for Accept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accept")
            .field("resumed", &self.resumed)
            .finish_non_exhaustive()
    }
}

impl Accept {
    /// Accepts with a Noise responder `make_noise` builds
    /// ([`Handshake::responder`]) or a ticket `lookup` finds.
    pub fn new(
        make_noise: MakeHandshake,
        lookup: TicketLookup,
        cluster: ClusterId,
        protection: Protection,
    ) -> Accept {
        let offer = preamble::offer(RecordCipher::fastest_here());
        let pre_r = preamble::encode(cluster, protection, Auth::Noise, offer);
        let mut out = BytesMut::with_capacity(PREAMBLE_LEN + 1 + NONCE_LEN + MAC_LEN);
        out.extend_from_slice(&pre_r);
        Accept {
            noise: None,
            make_noise: Some(make_noise),
            lookup,
            pre_r,
            pre_i: [0; PREAMBLE_LEN],
            nonce_i: [0; NONCE_LEN],
            cluster,
            protection,
            step: AcceptStep::Preamble,
            out,
            resumed: false,
        }
    }

    /// See [`Handshake::prefer_cipher`] (the Noise side's preference comes
    /// from here too).
    pub fn prefer_cipher(&mut self, cipher: RecordCipher) {
        self.pre_r[CIPHERS] = preamble::offer(cipher);
        if self.out.starts_with(b"SLNK") && self.out.len() >= PREAMBLE_LEN {
            self.out[CIPHERS] = self.pre_r[CIPHERS];
        }
    }

    /// Switches to Noise XX (both preambles already exchanged).
    fn start_noise(&mut self) -> Result<(), SecureError> {
        let make = self
            .make_noise
            .take()
            .ok_or(SecureError::Malformed("handshake made twice"))?;
        let mut h = make()?;
        h.skip_preamble(&self.pre_r, &self.pre_i);
        self.noise = Some(Box::new(h));
        self.step = AcceptStep::Noise;
        Ok(())
    }

    /// Whether the peer resumed with a ticket (no public-key work).
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// See [`Handshake::poll_transmit`]. Our preamble and resumption
    /// messages first, then the Noise side's.
    pub fn poll_transmit(&mut self, buf: &mut BytesMut) -> bool {
        transmit(&mut self.out, self.noise.as_deref_mut(), buf)
    }

    /// See [`Handshake::handle_input`].
    pub fn handle_input(&mut self, buf: &mut BytesMut) -> Result<Option<Established>, SecureError> {
        loop {
            match &self.step {
                AcceptStep::Preamble => {
                    if buf.len() >= PREAMBLE_LEN {
                        self.pre_i.copy_from_slice(&buf[..PREAMBLE_LEN]);
                    }
                    let Some((auth, _)) = preamble::read_either(
                        buf,
                        self.cluster,
                        self.protection,
                        [Auth::Noise, Auth::Resume],
                    )?
                    else {
                        return Ok(None);
                    };
                    if auth == Auth::Resume {
                        self.step = AcceptStep::ResumeFirst;
                    } else {
                        self.start_noise()?;
                    }
                }
                AcceptStep::Noise => {
                    return match self.noise.as_mut() {
                        Some(h) => h.handle_input(buf),
                        None => Err(SecureError::Malformed("no handshake")),
                    };
                }
                AcceptStep::ResumeFirst => {
                    if buf.len() < TICKET_ID_LEN + NONCE_LEN {
                        return Ok(None);
                    }
                    let mut id = [0u8; TICKET_ID_LEN];
                    id.copy_from_slice(&buf[..TICKET_ID_LEN]);
                    buf.advance(TICKET_ID_LEN);
                    self.nonce_i.copy_from_slice(&buf[..NONCE_LEN]);
                    buf.advance(NONCE_LEN);
                    let Some(ticket) = (self.lookup)(&id) else {
                        // Unknown (we restarted, or it expired): a full
                        // handshake on this connection instead.
                        self.out.put_u8(STATUS_UNKNOWN);
                        self.start_noise()?;
                        continue;
                    };
                    let nonce_r = random::<NONCE_LEN>()?;
                    let mac_r = mac(
                        &ticket,
                        b"R",
                        &self.pre_i,
                        &self.pre_r,
                        &self.nonce_i,
                        &nonce_r,
                    );
                    self.out.put_u8(STATUS_OK);
                    self.out.extend_from_slice(&nonce_r);
                    self.out.extend_from_slice(mac_r.as_ref());
                    self.step = AcceptStep::ResumeThird { ticket, nonce_r };
                }
                AcceptStep::ResumeThird { ticket, nonce_r } => {
                    if buf.len() < MAC_LEN {
                        return Ok(None);
                    }
                    let mac_i = buf.split_to(MAC_LEN);
                    verify(
                        ticket,
                        b"I",
                        [&self.pre_i, &self.pre_r, &self.nonce_i, nonce_r],
                        &mac_i,
                    )?;
                    let (i2r, r2i) = path_keys(ticket, &self.nonce_i, nonce_r);
                    let cipher = preamble::choose(self.pre_i[CIPHERS], self.pre_r[CIPHERS])?;
                    let peer = ticket.peer;
                    self.step = AcceptStep::Done;
                    self.resumed = true;
                    return Ok(Some(established(peer, &r2i, &i2r, self.protection, cipher)));
                }
                AcceptStep::Done => {
                    return Err(SecureError::Malformed("handshake already finished"))
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "resume_tests.rs"]
mod tests;
