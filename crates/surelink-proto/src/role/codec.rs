//! The role service's messages, as carried in ROUTE_UPDATE frames.
//!
//! All integers big-endian. A message is a tag byte and a body:
//!
//! | tag | message | body |
//! |---|---|---|
//! | 1 | report | reporter u64, seq u64, watched u32, held epoch u64, held version u64, peers u16, peers × (peer u64, alive u8, networks u8, networks × (status u8, rtt_us u32)) |
//! | 2 | table | role u64, epoch u64, version u64, node u64, routes u16, routes × (to u64, paths u8, paths × (network u8, status u8, weight u8)), ring u16, ring × (node u64, state u8) |
//! | 3 | ack | epoch u64, version u64 (the table the node now holds) |
//! | 4 | table, ring as changes | as tag 2 up to the routes, then base ring digest u64, changes u16, changes × (node u64, state u8), ring digest u64 ([`RingDelta`]) |
//! | 5 | helper report | helper u64, seq u64, addr, level u8 ([`HelperReport`]) |
//! | 6 | table with helpers | as tag 2, then helpers u16, helpers × (node u64, addr, level u8) |
//! | 7 | table with helpers, ring as changes | as tag 4, then helpers as in tag 6 |
//!
//! An `addr` is a family byte (4 or 6), the address (4 or 16 bytes) and
//! the port u16. A row lists helpers only with tags 6 and 7, used only
//! when it has some: a cluster without helpers sends what nodes built
//! before them read.
//! Decoding is bounded: counts are checked against the bytes left before
//! anything is allocated, and every byte must be consumed.

use std::net::{IpAddr, SocketAddr};

use bytes::{Buf, BufMut};
use thiserror::Error;

use crate::ids::NodeId;

use super::helpers::{HelperEntry, HelperReport, MAX_LEVEL};
use super::matrix::{PathStatus, PeerReport, StatusReport};
use super::table::{MemberState, PathChoice, RingDelta, RingMember, Route, TableView};
use super::MAX_NETWORKS;

/// Largest encoded role message accepted (a table for ~30 000 nodes' ring,
/// or ~60 000 unusual routes of two networks).
pub const MAX_ROLE_MESSAGE: usize = 1 << 20;

/// One message of the role service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RoleMessage {
    /// A node's view of its peers, to the role server.
    Report(StatusReport),
    /// A node's row of the routing table, from the role server.
    Table(TableView),
    /// A node's row with its ring as the changes to a ring the node holds
    /// (the role server knows which from the node's acknowledgements): tens
    /// of bytes instead of 9 per cluster node.
    TableRingDelta {
        /// The row; its `ring` is empty.
        view: TableView,
        /// The ring.
        ring: RingDelta,
    },
    /// The `(epoch, version)` a node holds after a push (applied or not):
    /// tells the role server to stop re-pushing, or that a newer epoch
    /// exists.
    Ack {
        /// Role epoch of the node's table.
        epoch: u64,
        /// Version of the node's table.
        version: u64,
    },
    /// A helper's address and load level, to the role server.
    HelperReport(HelperReport),
}

/// A role message that cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RoleDecodeError {
    /// Longer than [`MAX_ROLE_MESSAGE`].
    #[error("role message of {0} bytes exceeds the {MAX_ROLE_MESSAGE}-byte limit")]
    TooLarge(usize),
    /// Ends before its fields do.
    #[error("role message truncated")]
    Truncated,
    /// Bytes left after the last field.
    #[error("{0} bytes after the end of the role message")]
    Trailing(usize),
    /// A tag this version does not know.
    #[error("unknown role message tag {0}")]
    UnknownTag(u8),
    /// A field holds a value outside its range.
    #[error("bad role message field: {0}")]
    BadField(&'static str),
}

/// Encodes `msg` onto `out`.
pub fn encode(msg: &RoleMessage, out: &mut Vec<u8>) {
    match msg {
        RoleMessage::Report(r) => {
            out.put_u8(1);
            out.put_u64(r.reporter.0);
            out.put_u64(r.seq);
            out.put_u32(r.watched);
            out.put_u64(r.held.0);
            out.put_u64(r.held.1);
            let peers = &r.peers[..r.peers.len().min(usize::from(u16::MAX))];
            out.put_u16(u16::try_from(peers.len()).unwrap_or(u16::MAX));
            for p in peers {
                out.put_u64(p.peer.0);
                out.put_u8(u8::from(p.alive));
                let nets = &p.networks[..p.networks.len().min(MAX_NETWORKS)];
                out.put_u8(u8::try_from(nets.len()).unwrap_or(0));
                for (status, rtt) in nets {
                    out.put_u8(*status as u8);
                    out.put_u32(*rtt);
                }
            }
        }
        RoleMessage::Table(t) => {
            out.put_u8(if t.helpers.is_empty() { 2 } else { 6 });
            put_row_head(t, out);
            put_members(&t.ring, out);
            put_helpers(&t.helpers, out);
        }
        RoleMessage::TableRingDelta { view, ring } => {
            out.put_u8(if view.helpers.is_empty() { 4 } else { 7 });
            put_row_head(view, out);
            out.put_u64(ring.base);
            put_members(&ring.changes, out);
            out.put_u64(ring.digest);
            put_helpers(&view.helpers, out);
        }
        RoleMessage::HelperReport(r) => {
            out.put_u8(5);
            out.put_u64(r.helper.0);
            out.put_u64(r.seq);
            put_addr(r.addr, out);
            out.put_u8(r.level);
        }
        RoleMessage::Ack { epoch, version } => {
            out.put_u8(3);
            out.put_u64(*epoch);
            out.put_u64(*version);
        }
    }
}

/// Ring members: a u16 count (at most `u16::MAX` carried), then each.
fn put_members(ring: &[RingMember], out: &mut Vec<u8>) {
    let ring = &ring[..ring.len().min(usize::from(u16::MAX))];
    out.put_u16(u16::try_from(ring.len()).unwrap_or(u16::MAX));
    for m in ring {
        out.put_u64(m.node.0);
        out.put_u8(m.state as u8);
    }
}

fn get_members(b: &mut &[u8]) -> Result<Vec<RingMember>, RoleDecodeError> {
    need(b, 2)?;
    let count = usize::from(b.get_u16());
    need(b, count.saturating_mul(9))?;
    let mut ring = Vec::with_capacity(count);
    for _ in 0..count {
        let node = NodeId(b.get_u64());
        let state =
            MemberState::from_u8(b.get_u8()).ok_or(RoleDecodeError::BadField("member state"))?;
        ring.push(RingMember { node, state });
    }
    Ok(ring)
}

/// A row's helpers (tags 6 and 7; nothing when it has none).
fn put_helpers(helpers: &[HelperEntry], out: &mut Vec<u8>) {
    if helpers.is_empty() {
        return;
    }
    let helpers = &helpers[..helpers.len().min(usize::from(u16::MAX))];
    out.put_u16(u16::try_from(helpers.len()).unwrap_or(u16::MAX));
    for h in helpers {
        out.put_u64(h.node.0);
        put_addr(h.addr, out);
        out.put_u8(h.level);
    }
}

fn get_helpers(b: &mut &[u8]) -> Result<Vec<HelperEntry>, RoleDecodeError> {
    need(b, 2)?;
    let count = usize::from(b.get_u16());
    // Each takes at least 16 bytes (an IPv4 address).
    need(b, count.saturating_mul(16))?;
    let mut helpers = Vec::with_capacity(count);
    for _ in 0..count {
        need(b, 8)?;
        let node = NodeId(b.get_u64());
        let addr = get_addr(b)?;
        need(b, 1)?;
        let level = b.get_u8();
        if level > MAX_LEVEL {
            return Err(RoleDecodeError::BadField("helper level"));
        }
        helpers.push(HelperEntry { node, addr, level });
    }
    if helpers.is_empty() || helpers.windows(2).any(|w| w[0].node >= w[1].node) {
        return Err(RoleDecodeError::BadField("helpers not sorted"));
    }
    Ok(helpers)
}

fn put_addr(a: SocketAddr, out: &mut Vec<u8>) {
    match a.ip() {
        IpAddr::V4(ip) => {
            out.put_u8(4);
            out.put_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.put_u8(6);
            out.put_slice(&ip.octets());
        }
    }
    out.put_u16(a.port());
}

fn get_addr(b: &mut &[u8]) -> Result<SocketAddr, RoleDecodeError> {
    need(b, 1)?;
    let ip = match b.get_u8() {
        4 => {
            need(b, 4 + 2)?;
            let mut o = [0u8; 4];
            b.copy_to_slice(&mut o);
            IpAddr::from(o)
        }
        6 => {
            need(b, 16 + 2)?;
            let mut o = [0u8; 16];
            b.copy_to_slice(&mut o);
            IpAddr::from(o)
        }
        _ => return Err(RoleDecodeError::BadField("address family")),
    };
    Ok(SocketAddr::new(ip, b.get_u16()))
}

/// A row's fields up to its routes (tags 2 and 4).
fn put_row_head(t: &TableView, out: &mut Vec<u8>) {
    out.put_u64(t.role.0);
    out.put_u64(t.epoch);
    out.put_u64(t.version);
    out.put_u64(t.node.0);
    let routes = &t.routes[..t.routes.len().min(usize::from(u16::MAX))];
    out.put_u16(u16::try_from(routes.len()).unwrap_or(u16::MAX));
    for r in routes {
        out.put_u64(r.to.0);
        let paths = &r.paths[..r.paths.len().min(MAX_NETWORKS)];
        out.put_u8(u8::try_from(paths.len()).unwrap_or(0));
        for p in paths {
            out.put_u8(p.network);
            out.put_u8(p.status as u8);
            out.put_u8(p.weight);
        }
    }
}

fn need(b: &[u8], n: usize) -> Result<(), RoleDecodeError> {
    if b.remaining() < n {
        Err(RoleDecodeError::Truncated)
    } else {
        Ok(())
    }
}

/// A row's fields up to its routes (tags 2 and 4); the ring left empty.
fn get_row_head(b: &mut &[u8]) -> Result<TableView, RoleDecodeError> {
    need(b, 34)?;
    let role = NodeId(b.get_u64());
    let epoch = b.get_u64();
    let version = b.get_u64();
    let node = NodeId(b.get_u64());
    let count = usize::from(b.get_u16());
    need(b, count.saturating_mul(9))?;
    let mut routes = Vec::with_capacity(count);
    for _ in 0..count {
        need(b, 9)?;
        let to = NodeId(b.get_u64());
        let n = usize::from(b.get_u8());
        if n > MAX_NETWORKS {
            return Err(RoleDecodeError::BadField("paths"));
        }
        need(b, n * 3)?;
        let mut paths = Vec::with_capacity(n);
        for _ in 0..n {
            let network = b.get_u8();
            let status =
                PathStatus::from_u8(b.get_u8()).ok_or(RoleDecodeError::BadField("path status"))?;
            paths.push(PathChoice {
                network,
                status,
                weight: b.get_u8(),
            });
        }
        routes.push(Route {
            from: node,
            to,
            paths,
        });
    }
    if routes.windows(2).any(|w| w[0].to >= w[1].to) {
        return Err(RoleDecodeError::BadField("routes not sorted"));
    }
    Ok(TableView {
        role,
        epoch,
        version,
        node,
        routes,
        ring: Vec::new(),
        helpers: Vec::new(),
    })
}

/// Decodes one role message; the whole of `buf` must be it.
pub fn decode(mut buf: &[u8]) -> Result<RoleMessage, RoleDecodeError> {
    if buf.len() > MAX_ROLE_MESSAGE {
        return Err(RoleDecodeError::TooLarge(buf.len()));
    }
    let b = &mut buf;
    need(b, 1)?;
    let msg = match b.get_u8() {
        1 => {
            need(b, 38)?;
            let reporter = NodeId(b.get_u64());
            let seq = b.get_u64();
            let watched = b.get_u32();
            let held = (b.get_u64(), b.get_u64());
            let count = usize::from(b.get_u16());
            // Each peer takes at least 10 bytes.
            need(b, count.saturating_mul(10))?;
            let mut peers = Vec::with_capacity(count);
            for _ in 0..count {
                need(b, 10)?;
                let peer = NodeId(b.get_u64());
                let alive = match b.get_u8() {
                    0 => false,
                    1 => true,
                    _ => return Err(RoleDecodeError::BadField("alive")),
                };
                let nets = usize::from(b.get_u8());
                if nets > MAX_NETWORKS {
                    return Err(RoleDecodeError::BadField("networks"));
                }
                need(b, nets * 5)?;
                let mut networks = Vec::with_capacity(nets);
                for _ in 0..nets {
                    let status = PathStatus::from_u8(b.get_u8())
                        .ok_or(RoleDecodeError::BadField("path status"))?;
                    networks.push((status, b.get_u32()));
                }
                peers.push(PeerReport {
                    peer,
                    alive,
                    networks,
                });
            }
            RoleMessage::Report(StatusReport {
                reporter,
                seq,
                watched,
                held,
                peers,
            })
        }
        tag @ (2 | 6) => {
            let mut view = get_row_head(b)?;
            view.ring = get_members(b)?;
            if tag == 6 {
                view.helpers = get_helpers(b)?;
            }
            RoleMessage::Table(view)
        }
        tag @ (4 | 7) => {
            let mut view = get_row_head(b)?;
            need(b, 8)?;
            let base = b.get_u64();
            let changes = get_members(b)?;
            need(b, 8)?;
            let digest = b.get_u64();
            if tag == 7 {
                view.helpers = get_helpers(b)?;
            }
            RoleMessage::TableRingDelta {
                view,
                ring: RingDelta {
                    base,
                    changes,
                    digest,
                },
            }
        }
        5 => {
            need(b, 16)?;
            let helper = NodeId(b.get_u64());
            let seq = b.get_u64();
            let addr = get_addr(b)?;
            need(b, 1)?;
            let level = b.get_u8();
            if level > MAX_LEVEL {
                return Err(RoleDecodeError::BadField("helper level"));
            }
            RoleMessage::HelperReport(HelperReport {
                helper,
                seq,
                addr,
                level,
            })
        }
        3 => {
            need(b, 16)?;
            RoleMessage::Ack {
                epoch: b.get_u64(),
                version: b.get_u64(),
            }
        }
        t => return Err(RoleDecodeError::UnknownTag(t)),
    };
    if !buf.is_empty() {
        return Err(RoleDecodeError::Trailing(buf.len()));
    }
    Ok(msg)
}
