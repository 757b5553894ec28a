//! Why a relay or a link could not be set up.
//!
//! Only setting up can fail: once a link runs, an I/O error ends the one
//! connection or datagram it hit (counted in the link's status) and never
//! the relay. The enum is `#[non_exhaustive]`: a new way to fail may be
//! added without a breaking release.

use std::io;
use std::net::{IpAddr, SocketAddr};

/// Why [`Relay::add_link`](crate::Relay::add_link) or
/// [`Relay::with_limits`](crate::Relay::with_limits) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// A listening socket could not be bound.
    #[error("binding {protocol} {addr}: {source}")]
    Bind {
        /// `"TCP"` or `"UDP"`.
        protocol: &'static str,
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Port 0 was asked for, and no port the kernel offered for TCP was
    /// also free for UDP.
    #[error("no port on {ip} was free for both TCP and UDP after {tries} tries")]
    NoFreePort {
        /// The listen IP.
        ip: IpAddr,
        /// Ports tried.
        tries: u32,
    },
    /// The link's addresses do not make sense together.
    #[error("link {listen} -> {upstream}: {reason}")]
    Config {
        /// The listen address asked for.
        listen: SocketAddr,
        /// The upstream address.
        upstream: SocketAddr,
        /// What is wrong.
        reason: &'static str,
    },
    /// A limit is zero.
    #[error("limit {field} must be positive")]
    Limit {
        /// The field of [`Limits`](crate::Limits).
        field: &'static str,
    },
}
