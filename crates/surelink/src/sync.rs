//! The one helper for the standard library's locks. Sessions, connections
//! and the detector use `parking_lot`'s (no poisoning, brief spinning);
//! the request executor keeps the standard mutex, which measured faster
//! there: its queue is taken by every reader, handler and dispatcher at
//! once, and with `parking_lot`'s the same calls took about a third
//! longer (`tests/write_batching.rs`, 16 callers on 2 workers).

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, ignoring poisoning: a panic while it was held leaves the
/// guarded data consistent (every change under these locks is a whole
/// step), and a handler's panic must not take the executor down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads `l`, ignoring poisoning (as [`lock`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes `l`, ignoring poisoning (as [`lock`]).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}
