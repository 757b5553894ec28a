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

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data a panicked holder left (the lab's counters
/// and logs stay readable after one of its tasks failed).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
