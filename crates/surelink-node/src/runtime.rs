//! The tokio runtime a daemon runs on, sized by its configuration file's
//! `[runtime] worker_threads` (read before the runtime exists; the rest
//! of the file is checked when the daemon loads it).

use std::path::Path;

use tokio::runtime::Runtime;

use crate::config_file::{self, LoadError};

/// Worker threads when neither the command nor the file says otherwise
/// (the cache daemons use [`crate::cache::WORKER_THREADS`]).
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
/// else `default_workers` (also without a file).
pub fn for_config(config: Option<&Path>, default_workers: usize) -> Result<Runtime, RuntimeError> {
    let workers = match config {
        Some(path) => config_file::runtime(path)?
            .worker_threads
            .unwrap_or(default_workers),
        None => default_workers,
    };
    build(workers).map_err(RuntimeError::Build)
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
