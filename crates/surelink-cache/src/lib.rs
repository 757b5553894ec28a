//! A memcached-compatible cache cluster on surelink: unmodified memcached
//! clients talk to a [`Proxy`] on a local port; the proxy routes each key
//! by consistent hashing ([`Ring`]) to a cache node over surelink sessions
//! on every network, so a connection killed, a link down or silent one
//! way costs a failover of milliseconds instead of an error; a node the
//! detector reports dead leaves the ring until it is heard again.
//!
//! - [`text`]: memcached's text protocol (parser with memcached 1.6's
//!   answers to bad input; command encoding for nodes);
//! - [`Store`]: a node's embedded store, bounded in bytes (`quick_cache`),
//!   in [`Shards`] that are the node's recovery groups;
//! - [`StoreHandler`]: the node's surelink request handler;
//!   [`backend::MemcachedHandler`] instead fronts a local memcached;
//! - [`Ring`], [`Proxy`].
//!
//! It speaks memcached 1.6's whole text protocol, meta commands included
//! (docs/cache.md lists the differences). What it does not do: replicate
//! items (a dead node's keys are lost, as with memcached), or the binary
//! protocol (read as text, as memcached `-B ascii` does).

pub mod backend;
pub mod local;
pub mod node;
pub mod proxy;
pub mod ring;
pub mod shards;
pub mod store;
mod store_meta;
pub mod text;

pub use node::{StoreHandler, CACHE_CHANNEL};
pub use proxy::{Proxy, ProxyConfig, ProxyConfigError, ProxyError};
pub use ring::Ring;
pub use shards::Shards;
pub use store::{Store, StoreStats};
