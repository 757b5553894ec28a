//! The tokio runtime a daemon runs on, sized by its configuration file's
//! `[runtime] worker_threads` (read before the runtime exists; the rest
//! of the file is checked when the daemon loads it).

use std::path::Path;

use tokio::runtime::Runtime;

use crate::config_file::{self, LoadError};

/// Worker threads when neither the command nor the file says otherwise
/// (the cache daemons use [`crate::cache::WORKER_THREADS`]), at most the
/// CPUs the process may use ([`usable_workers`]).
pub const WORKER_THREADS: usize = 2;

/// Why no runtime was built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The configuration file's `[runtime]` could not be read.
    #[error(transparent)]
    Config(#[from] LoadError),
    /// The runtime could not start its threads or drivers.
    #[error("building the tokio runtime")]
    Build(#[source] std::io::Error),
}

/// A runtime of `[runtime] worker_threads` from `config` if that says,
/// else `default_workers` but no more than the CPUs this process may run
/// on ([`usable_workers`]; also without a file).
pub fn for_config(config: Option<&Path>, default_workers: usize) -> Result<Runtime, RuntimeError> {
    let file = match config {
        Some(path) => config_file::runtime(path)?.worker_threads,
        None => None,
    };
    let workers = file.unwrap_or_else(|| usable_workers(default_workers));
    build(workers).map_err(RuntimeError::Build)
}

/// `wanted` worker threads, but no more than the CPUs this process may
/// use (its CPU affinity and cgroup CPU quota, as
/// `std::thread::available_parallelism` reads them): a server pinned to
/// one core, or given a quarter of one, runs one event loop instead of
/// two threads that wake each other on that core — a futex wake and a
/// context switch per hand-off, which measured as a third of a capped
/// server's CPU (docs/postman.md).
pub fn usable_workers(wanted: usize) -> usize {
    std::thread::available_parallelism().map_or(wanted, |n| wanted.clamp(1, n.get()))
}

/// A runtime of `workers` threads. One worker: a current-thread runtime,
/// whose run queue is plain FIFO (a multi-thread one with one worker still
/// runs a just-woken task first, through its LIFO slot) and cheaper per
/// wake-up.
pub fn build(workers: usize) -> std::io::Result<Runtime> {
    if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_workers_never_exceed_the_usable_cpus() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(usable_workers(1), 1);
        assert_eq!(usable_workers(2), 2.min(cpus));
        assert_eq!(usable_workers(cpus + 8), cpus);
        assert_eq!(usable_workers(0), 1);
    }
}
