//! surelink: message passing for cluster services over redundant paths.
//!
//! This crate will be the tokio shell around [`surelink_proto`]: it owns the
//! sockets (one or more TCP connections per network), the timers and the
//! tasks, and gives services `call`, `send` and `serve`. For now it only
//! re-exports the sans-IO core, which is complete and tested on its own with
//! the deterministic simulator in `surelink-sim`; the shell is the next
//! piece of work (see the project's issues).

pub use surelink_proto as proto;
