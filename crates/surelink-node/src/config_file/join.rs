//! What a cluster file gives a process's configuration, and how the
//! process's own file is checked against it. The cluster file is the one
//! place for the cluster's id, each node's addresses, metrics port and
//! public key, and the role service; a process's own file says what is
//! only its own. An own entry that repeats the cluster file is accepted
//! and listed as [`Redundant`] (the loader warns once); one that
//! contradicts it is an error naming both values.
//!
//! For node `n`, whose file names the cluster file:
//! - `cluster`: the cluster file's;
//! - `listen`: `n`'s `addrs` there, `metrics`: `n`'s `metrics` there — an
//!   own value overrides (to bind other addresses than those the others
//!   dial, say `0.0.0.0` or a NAT's inside address), and is no
//!   contradiction;
//! - members: every node there with a `public_key`; `key_file` must hold
//!   `n`'s;
//! - peers: a process with a `[proxy]` section dials every node there with
//!   addresses (its ring); any other process dials the nodes listed
//!   before it that have addresses, so each pair has one side that dials;
//! - the role service: the cluster file's `[role]`;
//! - `dial_from`: `n`'s `dial_from` there unless the own file gives one;
//! - members' addresses (`member_addrs`): every other node's `addrs` and
//!   `dial_from` there, so the nodes and clients that dial this one have
//!   the room kept for members, as the ones it dials do.
//!
//! Own `[[members]]` entries for nodes the cluster file does not list, or
//! lists without a key, and own `[[peers]]` entries for nodes it does not
//! list are kept: they are the process's own. So is a `[[peers]]` entry
//! with the cluster file's addresses for a node the rule leaves to dial
//! this one (both then dial; not redundant, since removing it changes
//! who dials).

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use surelink::proto::NodeId;
use surelink::{Config, PeerConfig, PublicKey};
use tracing::info;

use super::ConfigError;
use crate::cluster_file::{Cluster, ClusterNode};

/// An entry of a process's own file that only repeats its cluster file
/// (accepted; it can be removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Redundant {
    /// `cluster`, the cluster file's id.
    Cluster,
    /// `listen`, this node's `addrs` there.
    Listen,
    /// `metrics`, this node's `metrics` there.
    Metrics,
    /// `dial_from`, this node's `dial_from` there.
    DialFrom,
    /// A `[[members]]` entry with the key the cluster file gives.
    Member(NodeId),
    /// A `[[peers]]` entry for a node the cluster file already makes this
    /// one dial, with the same addresses.
    Peer(NodeId),
}

impl fmt::Display for Redundant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundant::Cluster => f.write_str("cluster"),
            Redundant::Listen => f.write_str("listen"),
            Redundant::Metrics => f.write_str("metrics"),
            Redundant::DialFrom => f.write_str("dial_from"),
            Redundant::Member(n) => write!(f, "[[members]] node {n}"),
            Redundant::Peer(n) => write!(f, "[[peers]] node {n}"),
        }
    }
}

/// What the own file says that the cluster file also says.
pub(super) struct Own<'a> {
    /// `listen`, if given.
    pub(super) listen: Option<&'a [SocketAddr]>,
    /// `metrics`, if given.
    pub(super) metrics: Option<SocketAddr>,
    /// `dial_from`, if given (not empty).
    pub(super) dial_from: Option<&'a [SocketAddr]>,
    /// The `[[members]]` entries, parsed.
    pub(super) members: &'a [(NodeId, PublicKey)],
    /// Whether the file has a `[proxy]` section.
    pub(super) proxy: bool,
}

/// The cluster id: the cluster file's; an own `cluster` must equal it.
pub(super) fn cluster_id(
    own: Option<u64>,
    cl: &Cluster,
    path: &Path,
    redundant: &mut Vec<Redundant>,
) -> Result<u64, ConfigError> {
    match own {
        None => Ok(cl.cluster),
        Some(id) if id == cl.cluster => {
            redundant.push(Redundant::Cluster);
            Ok(id)
        }
        Some(id) => Err(ConfigError::OtherCluster {
            cluster_file: path.into(),
            own: id,
            cluster: cl.cluster,
        }),
    }
}

/// Applies the cluster file `cl` (read from `path`) to `c`, which holds
/// the own file's settings; returns the metrics address.
pub(super) fn join(
    c: &mut Config,
    own: &Own<'_>,
    cl: &Cluster,
    path: &Path,
    redundant: &mut Vec<Redundant>,
) -> Result<Option<SocketAddr>, ConfigError> {
    let Some(me) = cl.node(c.node) else {
        return Err(ConfigError::NotInCluster {
            node: c.node,
            cluster_file: path.into(),
        });
    };
    // Listen and metrics: the cluster file's unless this file says.
    match own.listen {
        None => c.listen = listen_of(me, path)?,
        Some(l) => {
            let l: Vec<Option<SocketAddr>> = l.iter().copied().map(Some).collect();
            if trimmed(&l) == trimmed(&me.addrs) {
                redundant.push(Redundant::Listen);
            } else {
                info!(node = %c.node, listen = ?c.listen, advertised = ?me.addrs,
                    "listening on other addresses than the cluster file's");
            }
        }
    }
    // Dial-from: likewise (a client's; an own value is its own choice).
    match own.dial_from {
        None => c.dial_from = dial_from_of(me, path)?,
        Some(d) => {
            let d: Vec<Option<SocketAddr>> = d.iter().copied().map(Some).collect();
            if trimmed(&d) == trimmed(&me.dial_from) {
                redundant.push(Redundant::DialFrom);
            }
        }
    }
    let metrics = match own.metrics {
        None => me.metrics,
        Some(m) => {
            if me.metrics == Some(m) {
                redundant.push(Redundant::Metrics);
            }
            Some(m)
        }
    };
    keys(c, own, cl, me, path, redundant)?;
    peers(c, own, cl, me, path, redundant)?;
    for n in cl.nodes.iter().filter(|n| n.node != me.node) {
        let ips = n
            .addrs
            .iter()
            .chain(&n.dial_from)
            .flatten()
            .map(SocketAddr::ip);
        for ip in ips {
            if !c.member_addrs.contains(&ip) {
                c.member_addrs.push(ip);
            }
        }
    }
    c.role = Some(cl.role.clone());
    Ok(metrics)
}

/// This node's key against its entry, the own `[[members]]` against the
/// cluster file's keys; then every key there becomes a member.
fn keys(
    c: &mut Config,
    own: &Own<'_>,
    cl: &Cluster,
    me: &ClusterNode,
    path: &Path,
    redundant: &mut Vec<Redundant>,
) -> Result<(), ConfigError> {
    if let Some(id) = &c.identity {
        match me.public_key {
            Some(k) if k != id.public() => {
                return Err(ConfigError::KeyFileMismatch {
                    node: c.node,
                    own: id.public(),
                    cluster: k,
                    cluster_file: path.into(),
                })
            }
            None if !c.insecure && c.tls.is_none() => {
                return Err(ConfigError::OwnKeyMissing {
                    node: c.node,
                    own: id.public(),
                    cluster_file: path.into(),
                })
            }
            _ => {}
        }
    }
    for &(node, key) in own.members {
        match cl.node(node).and_then(|n| n.public_key) {
            Some(k) if k == key => redundant.push(Redundant::Member(node)),
            Some(k) => {
                return Err(ConfigError::MemberKey {
                    node,
                    own: key,
                    cluster: k,
                    cluster_file: path.into(),
                })
            }
            None => {}
        }
    }
    for n in &cl.nodes {
        if let Some(k) = n.public_key {
            c.members
                .insert(n.node, k)
                .map_err(|source| ConfigError::ClusterKey {
                    node: n.node,
                    source,
                })?;
        }
    }
    Ok(())
}

/// The own `[[peers]]` against the cluster file's addresses; then every
/// node this one dials by the cluster file's rule becomes a peer.
fn peers(
    c: &mut Config,
    own: &Own<'_>,
    cl: &Cluster,
    me: &ClusterNode,
    path: &Path,
    redundant: &mut Vec<Redundant>,
) -> Result<(), ConfigError> {
    let dials: Vec<&ClusterNode> = if own.proxy {
        cl.nodes
            .iter()
            .filter(|n| n.node != me.node && has_addr(n))
            .collect()
    } else {
        cl.dials(me.node).collect()
    };
    for p in &c.peers {
        let Some(n) = cl.node(p.node) else { continue };
        if trimmed(&p.addrs) != trimmed(&n.addrs) {
            return Err(ConfigError::PeerAddrs {
                node: p.node,
                own: p.addrs.clone(),
                cluster: n.addrs.clone(),
                cluster_file: path.into(),
            });
        }
        if dials.iter().any(|d| d.node == p.node) {
            redundant.push(Redundant::Peer(p.node));
        }
    }
    let keyed = !c.insecure && c.tls.is_none();
    for n in dials {
        if keyed && c.members.key_of(n.node).is_none() {
            return Err(ConfigError::PeerKeyMissing {
                node: n.node,
                cluster_file: path.into(),
            });
        }
        if !c.peers.iter().any(|p| p.node == n.node) {
            c.peers.push(PeerConfig::new(n.node, n.addrs.clone()));
        }
    }
    Ok(())
}

/// `[proxy] nodes` against the cluster file: each must be there, with
/// addresses.
pub(super) fn check_ring(nodes: &[u64], cl: &Cluster, path: &Path) -> Result<(), ConfigError> {
    for &n in nodes {
        let reason = match cl.node(NodeId(n)) {
            None => "is not listed",
            Some(x) if !has_addr(x) => "has no addrs",
            Some(_) => continue,
        };
        return Err(ConfigError::ProxyNode {
            node: NodeId(n),
            reason,
            cluster_file: path.into(),
        });
    }
    Ok(())
}

/// A listener per network from the node's `addrs` (`""` at the end
/// dropped; one in between cannot be a listener).
fn listen_of(me: &ClusterNode, path: &Path) -> Result<Vec<SocketAddr>, ConfigError> {
    trimmed(&me.addrs)
        .iter()
        .enumerate()
        .map(|(network, a)| {
            a.ok_or_else(|| ConfigError::ListenGap {
                node: me.node,
                network,
                cluster_file: path.into(),
            })
        })
        .collect()
}

fn has_addr(n: &ClusterNode) -> bool {
    n.addrs.iter().any(Option::is_some)
}

/// Addresses per network without the trailing networks it is not on
/// (`["a", ""]` and `["a"]` say the same).
/// `me`'s `dial_from` in the cluster file, per network; a gap is an
/// error (a client dials on every network it lists).
fn dial_from_of(me: &ClusterNode, path: &Path) -> Result<Vec<SocketAddr>, ConfigError> {
    trimmed(&me.dial_from)
        .iter()
        .enumerate()
        .map(|(network, a)| {
            a.ok_or_else(|| ConfigError::DialFromGap {
                node: me.node,
                network,
                cluster_file: path.into(),
            })
        })
        .collect()
}

fn trimmed(addrs: &[Option<SocketAddr>]) -> &[Option<SocketAddr>] {
    let end = addrs.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    &addrs[..end]
}
