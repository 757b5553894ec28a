//! Admission of accepted connections: which ones may take a file
//! descriptor and a key exchange before anyone has authenticated, and how
//! many an authenticated member may hold.
//!
//! Sources are told apart by what TCP proves: its three-way handshake
//! shows the source address can receive (an off-path host cannot complete
//! it from an address it does not own), which is all a cookie/retry step
//! would prove — so per-source limits are sound without one. Two kinds:
//!
//! - **Members' addresses** (the peers' addresses, `member_addrs`, and with
//!   a cluster file every node's): a handshake pool of their own, a rate
//!   bucket per exact address, and `member_reserve` of `max_connections`
//!   nobody else may take. Strangers never count against any of these,
//!   so a member re-dialling from its own address is never refused
//!   because strangers hold slots.
//! - **Everyone else** (strangers, and members at addresses not listed):
//!   the shared pool — `max_handshaking` in all, `max_handshaking_per_ip`
//!   per address, `max_handshaking_per_prefix` per /24 (IPv4) or /64
//!   (IPv6), a token bucket per prefix and one for the pool, and at most
//!   `max_connections − member_reserve` connections.
//!
//! After the handshake, a member (its node id proved) holds at most
//! `max_connections_per_member` accepted connections, across all its
//! sessions and incarnations; a connection beyond that is closed, the
//! ones it has are kept.
//!
//! What this does not do: decide anything about sessions (the core's
//! router does), or limit connections this node dials (it chooses those).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use surelink_proto::NodeId;

use crate::config::Config;

/// Buckets the rate table keeps at most (about 60 bytes each). When it is
/// full, sources without an entry share one overflow bucket.
const RATE_TABLE_CAP: usize = 4096;

/// The limits, resolved from a [`Config`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Limits {
    pub(crate) max_total: usize,
    /// Of `max_total`, kept for members' addresses.
    pub(crate) reserve: usize,
    pub(crate) max_per_ip: usize,
    pub(crate) max_handshaking: usize,
    pub(crate) max_handshaking_per_ip: usize,
    pub(crate) max_handshaking_per_prefix: usize,
    pub(crate) prefix_v4: u8,
    pub(crate) prefix_v6: u8,
    /// Handshakes per second per prefix (per address for members); the
    /// burst is twice that.
    pub(crate) rate: u32,
    /// Handshakes per second of the whole shared pool; burst twice that.
    pub(crate) rate_total: u32,
    pub(crate) max_per_member: usize,
}

impl Limits {
    pub(crate) fn from_config(c: &Config) -> Limits {
        Limits {
            max_total: c.max_connections,
            // `bind` may lower max_connections below the fd limit: the
            // reserve never takes more than half.
            reserve: c.member_reserve.min(c.max_connections / 2),
            max_per_ip: c.max_connections_per_ip,
            max_handshaking: c.max_handshaking,
            max_handshaking_per_ip: c.max_handshaking_per_ip,
            max_handshaking_per_prefix: c.max_handshaking_per_prefix,
            prefix_v4: c.handshake_prefix_v4,
            prefix_v6: c.handshake_prefix_v6,
            rate: c.handshake_rate,
            rate_total: c.handshake_rate_total,
            max_per_member: c.connections_per_member(),
        }
    }
}

/// Why an accepted connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LimitHit {
    #[error("max_connections ({0}) reached")]
    Total(usize),
    #[error("connections from addresses not listed as members' hold their share ({0}: max_connections less member_reserve)")]
    SharedPool(usize),
    #[error("max_connections_per_ip ({0}) reached for this address")]
    PerIp(usize),
    #[error("max_handshaking ({0}) connections of this pool already in their handshake")]
    Handshaking(usize),
    #[error("max_handshaking_per_ip ({0}) reached for this address")]
    HandshakingPerIp(usize),
    #[error("max_handshaking_per_prefix ({0}) reached for this address's prefix")]
    HandshakingPerPrefix(usize),
    #[error("handshake_rate ({0}/s) exceeded for this source")]
    Rate(u32),
    #[error("handshake_rate_total ({0}/s) exceeded by addresses not listed as members'")]
    RateTotal(u32),
    #[error("node {0} already holds max_connections_per_member ({1}) connections")]
    PerMember(NodeId, usize),
}

impl LimitHit {
    /// Every kind, in the order of [`LimitHit::index`].
    pub(crate) const NAMES: [&'static str; 9] = [
        "max_connections",
        "shared_pool",
        "per_ip",
        "handshaking",
        "handshaking_per_ip",
        "handshaking_per_prefix",
        "rate",
        "rate_total",
        "per_member",
    ];

    /// The kind's place in [`LimitHit::NAMES`] (for counters).
    pub(crate) fn index(self) -> usize {
        match self {
            LimitHit::Total(_) => 0,
            LimitHit::SharedPool(_) => 1,
            LimitHit::PerIp(_) => 2,
            LimitHit::Handshaking(_) => 3,
            LimitHit::HandshakingPerIp(_) => 4,
            LimitHit::HandshakingPerPrefix(_) => 5,
            LimitHit::Rate(_) => 6,
            LimitHit::RateTotal(_) => 7,
            LimitHit::PerMember(..) => 8,
        }
    }
}

/// A token bucket: `burst` tokens, refilled at `rate` per second.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant, burst: f64) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant, rate: f64, burst: f64) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * rate).min(burst);
        self.at = now;
    }
}

/// Rate buckets per source key (a prefix, or a member's address), bounded.
#[derive(Debug)]
struct RateTable {
    map: HashMap<IpAddr, Bucket>,
    /// Shared by sources that find the table full.
    overflow: Bucket,
    /// The shared pool's own bucket.
    total: Bucket,
    last_sweep: Instant,
}

impl RateTable {
    fn new(now: Instant, l: &Limits) -> RateTable {
        RateTable {
            map: HashMap::new(),
            overflow: Bucket::full(now, 2.0 * f64::from(l.rate)),
            total: Bucket::full(now, 2.0 * f64::from(l.rate_total)),
            last_sweep: now,
        }
    }

    /// Takes a token for `key` (and one from the pool's bucket when
    /// `pooled`), or says which limit is out of them.
    fn take(
        &mut self,
        key: IpAddr,
        pooled: bool,
        now: Instant,
        l: &Limits,
    ) -> Result<(), LimitHit> {
        let (rate, rate_total) = (f64::from(l.rate), f64::from(l.rate_total));
        let burst = 2.0 * rate;
        if pooled {
            self.total.refill(now, rate_total, 2.0 * rate_total);
            if self.total.tokens < 1.0 {
                return Err(LimitHit::RateTotal(l.rate_total));
            }
        }
        if !self.map.contains_key(&key) && self.map.len() >= RATE_TABLE_CAP {
            // A bucket that has refilled says no more than a new one: drop
            // those, at most once per refill time (the sweep is O(table)).
            let refill = Duration::from_secs_f64(burst / rate.max(1.0));
            if now.saturating_duration_since(self.last_sweep) >= refill {
                self.last_sweep = now;
                self.map.retain(|_, b| {
                    b.refill(now, rate, burst);
                    b.tokens < burst
                });
            }
        }
        let b = if self.map.len() < RATE_TABLE_CAP || self.map.contains_key(&key) {
            self.map
                .entry(key)
                .or_insert_with(|| Bucket::full(now, burst))
        } else {
            &mut self.overflow
        };
        b.refill(now, rate, burst);
        if b.tokens < 1.0 {
            return Err(LimitHit::Rate(l.rate));
        }
        b.tokens -= 1.0;
        if pooled {
            self.total.tokens -= 1.0;
        }
        Ok(())
    }
}

/// Counts per address.
#[derive(Clone, Copy, Debug, Default)]
struct PerIp {
    open: usize,
    handshaking: usize,
}

#[derive(Debug)]
struct State {
    total: usize,
    /// Connections from the shared pool (addresses not listed as members').
    pooled: usize,
    /// In their handshake: [shared pool, members' addresses].
    handshaking: [usize; 2],
    per_ip: HashMap<IpAddr, PerIp>,
    /// Shared pool connections in their handshake, per prefix.
    per_prefix: HashMap<IpAddr, usize>,
    /// Connections per authenticated member.
    per_member: HashMap<NodeId, usize>,
    rates: RateTable,
}

/// The limits on accepted connections and what they count now. A
/// connection over a limit is closed at once (counted per limit in
/// `connections_refused_by`).
#[derive(Debug)]
pub(crate) struct ConnLimits {
    limits: Limits,
    /// Members' addresses (canonical form).
    members: HashSet<IpAddr>,
    state: Mutex<State>,
}

/// One accepted connection's place under the limits; given back on drop.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    limits: Arc<ConnLimits>,
    ip: IpAddr,
    /// The shared pool's prefix, `None` for a member's address.
    prefix: Option<IpAddr>,
    handshaking: bool,
    member: Option<NodeId>,
}

/// `ip` with its host bits cleared: the first `v4` (or `v6`) bits kept.
pub(crate) fn prefix_of(ip: IpAddr, v4: u8, v6: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(v4.min(32)))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(v6.min(128)))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
        }
    }
}

impl ConnLimits {
    pub(crate) fn new(limits: Limits, members: impl IntoIterator<Item = IpAddr>) -> ConnLimits {
        let now = Instant::now();
        ConnLimits {
            members: members.into_iter().map(|a| a.to_canonical()).collect(),
            state: Mutex::new(State {
                total: 0,
                pooled: 0,
                handshaking: [0, 0],
                per_ip: HashMap::new(),
                per_prefix: HashMap::new(),
                per_member: HashMap::new(),
                rates: RateTable::new(now, &limits),
            }),
            limits,
        }
    }

    /// The limits of `c`; members' addresses are the peers' and
    /// `member_addrs`.
    pub(crate) fn from_config(c: &Config) -> ConnLimits {
        let peers = c
            .peers
            .iter()
            .flat_map(|p| p.addrs.iter().flatten().map(|a| a.ip()));
        ConnLimits::new(
            Limits::from_config(c),
            peers.chain(c.member_addrs.iter().copied()),
        )
    }

    /// A place for a connection from `ip` at `now`, counted as in its
    /// handshake.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        ip: IpAddr,
        now: Instant,
    ) -> Result<ConnSlot, LimitHit> {
        let l = &self.limits;
        let ip = ip.to_canonical();
        let listed = self.members.contains(&ip);
        let prefix = (!listed).then(|| prefix_of(ip, l.prefix_v4, l.prefix_v6));
        let mut s = self.state.lock();
        if s.total >= l.max_total {
            return Err(LimitHit::Total(l.max_total));
        }
        if !listed && s.pooled >= l.max_total - l.reserve {
            return Err(LimitHit::SharedPool(l.max_total - l.reserve));
        }
        if s.handshaking[usize::from(listed)] >= l.max_handshaking {
            return Err(LimitHit::Handshaking(l.max_handshaking));
        }
        let here = s.per_ip.get(&ip).copied().unwrap_or_default();
        if here.open >= l.max_per_ip {
            return Err(LimitHit::PerIp(l.max_per_ip));
        }
        if let Some(p) = prefix {
            if here.handshaking >= l.max_handshaking_per_ip {
                return Err(LimitHit::HandshakingPerIp(l.max_handshaking_per_ip));
            }
            if s.per_prefix.get(&p).copied().unwrap_or(0) >= l.max_handshaking_per_prefix {
                return Err(LimitHit::HandshakingPerPrefix(l.max_handshaking_per_prefix));
            }
        }
        // Last: a refused connection costs nothing, so it takes no token.
        s.rates
            .take(prefix.unwrap_or(ip), prefix.is_some(), now, l)?;
        s.total += 1;
        s.handshaking[usize::from(listed)] += 1;
        let e = s.per_ip.entry(ip).or_default();
        e.open += 1;
        e.handshaking += 1;
        if let Some(p) = prefix {
            s.pooled += 1;
            *s.per_prefix.entry(p).or_insert(0) += 1;
        }
        Ok(ConnSlot {
            limits: self.clone(),
            ip,
            prefix,
            handshaking: true,
            member: None,
        })
    }

    /// Accepted connections open now.
    pub(crate) fn open(&self) -> usize {
        self.state.lock().total
    }

    /// Accepted connections open now that authenticated as `node`.
    #[cfg(test)]
    fn of_member(&self, node: NodeId) -> usize {
        self.state
            .lock()
            .per_member
            .get(&node)
            .copied()
            .unwrap_or(0)
    }
}

impl ConnSlot {
    /// The handshake finished; `member`: the node it proved, if it proved
    /// one. The connection no longer counts as in its handshake, and now
    /// counts for its member — unless that member holds its
    /// `max_connections_per_member` already: then the caller closes it.
    pub(crate) fn authenticated(&mut self, member: Option<NodeId>) -> Result<(), LimitHit> {
        let limits = self.limits.clone();
        let mut s = limits.state.lock();
        self.end_handshake(&mut s);
        let Some(node) = member else {
            return Ok(());
        };
        if self.member.is_some() {
            return Ok(());
        }
        let max = self.limits.limits.max_per_member;
        let n = s.per_member.entry(node).or_insert(0);
        if *n >= max {
            if *n == 0 {
                s.per_member.remove(&node);
            }
            return Err(LimitHit::PerMember(node, max));
        }
        *n += 1;
        self.member = Some(node);
        Ok(())
    }

    fn end_handshake(&mut self, s: &mut State) {
        if !std::mem::replace(&mut self.handshaking, false) {
            return;
        }
        s.handshaking[usize::from(self.prefix.is_none())] -= 1;
        if let Some(e) = s.per_ip.get_mut(&self.ip) {
            e.handshaking -= 1;
        }
        if let Some(p) = self.prefix {
            if let Some(n) = s.per_prefix.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
                    s.per_prefix.remove(&p);
                }
            }
        }
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let limits = self.limits.clone();
        let mut s = limits.state.lock();
        self.end_handshake(&mut s);
        if let Some(e) = s.per_ip.get_mut(&self.ip) {
            e.open -= 1;
            if e.open == 0 {
                // Memory returned when the address goes away.
                s.per_ip.remove(&self.ip);
            }
        }
        if let Some(node) = self.member {
            if let Some(n) = s.per_member.get_mut(&node) {
                *n -= 1;
                if *n == 0 {
                    s.per_member.remove(&node);
                }
            }
        }
        if self.prefix.is_some() {
            s.pooled -= 1;
        }
        s.total -= 1;
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
