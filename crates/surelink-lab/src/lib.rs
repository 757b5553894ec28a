//! The harness's shared pieces: what the `surelink-lab` binary and the
//! process tests of both binaries (`surelink`'s and `surelink-lab`'s) use
//! alike.
//!
//! - [`child`]: child processes — spawn (in a network namespace if asked),
//!   wait for a ready line, collect output, kill on drop — and commands
//!   run to completion.
//! - [`host`]: root, programs, free ports, whether the netns testbed can
//!   run here.
//! - [`examples`]: temporary copies of the example files on free ports.
//!
//! Not here: the demo, benchmarks, experiments and testbed themselves
//! (the binary's modules), and nothing a shipped binary links.

pub mod child;
pub mod examples;
pub mod host;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a standard mutex, taking the data a panicked holder left. The
/// benchmarks' baselines (plain TCP, NATS) and the load generator keep
/// the standard library's mutex, as their users would write them; the
/// rest of the lab uses `parking_lot`'s.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
