//! The start's churn in `bench idle-peers`: when the clients' start has
//! quietened (their shared log stops growing), and what the log says
//! happened meanwhile (handshakes refused or cut, sessions ended by a
//! fence). Both builds log these lines alike, so steps compare.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What the clients' log holds for one step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Churn {
    /// Warnings logged by the clients.
    pub(crate) warnings: u64,
    /// Re-dial handshakes with the server that failed.
    pub(crate) failed_handshakes: u64,
    /// Sessions with the server that ended (the server fenced itself and
    /// came back as a new incarnation).
    pub(crate) sessions_ended: u64,
}

/// The log's length now (0 if unreadable).
pub(crate) fn log_len(log: &Path) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// Waits until `log` has not grown for `quiet`, at most `cap`; returns how
/// long it waited. A start that churns on (clients reporting paths,
/// re-dialling) keeps the log growing, and measuring then would measure
/// the churn, not the idle state.
pub(crate) fn wait_quiet(log: &Path, quiet: Duration, cap: Duration) -> Duration {
    let t0 = Instant::now();
    let mut len = log_len(log);
    let mut since = Instant::now();
    while t0.elapsed() < cap {
        std::thread::sleep(Duration::from_millis(200));
        let now = log_len(log);
        if now != len {
            len = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            break;
        }
    }
    t0.elapsed()
}

/// Counts the churn in `log` from byte `from` to its end.
pub(crate) fn count(log: &Path, from: u64) -> Churn {
    let mut text = Vec::new();
    let read = std::fs::File::open(log).and_then(|mut f| {
        f.seek(SeekFrom::Start(from))?;
        f.read_to_end(&mut text)
    });
    if read.is_err() {
        return Churn::default();
    }
    let text = String::from_utf8_lossy(&text);
    let mut c = Churn::default();
    for line in text.lines() {
        if line.contains("WARN") {
            c.warnings += 1;
        }
        if line.contains("handshake with the dialled peer failed") {
            c.failed_handshakes += 1;
        }
        if line.contains("session ended") {
            c.sessions_ended += 1;
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary one.
    fn scratch(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("idle-peers-churn-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn counts_only_what_follows_the_offset() {
        let dir = scratch("count");
        let log = dir.join("c.log");
        std::fs::write(
            &log,
            " WARN surelink::dial: handshake with the dialled peer failed\n",
        )
        .unwrap();
        let from = log_len(&log);
        let mut more = std::fs::read_to_string(&log).unwrap();
        more.push_str(" WARN surelink::dial: handshake with the dialled peer failed peer=1\n");
        more.push_str(" WARN surelink::session::drive: session ended peer=1\n");
        more.push_str(" INFO surelink::detector::react: path heard again\n");
        std::fs::write(&log, more).unwrap();
        assert_eq!(
            count(&log, from),
            Churn {
                warnings: 2,
                failed_handshakes: 1,
                sessions_ended: 1
            }
        );
        assert_eq!(count(&dir.join("missing"), 0), Churn::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_log_that_stops_growing_is_quiet() {
        let dir = scratch("quiet");
        let log = dir.join("c.log");
        std::fs::write(&log, "x\n").unwrap();
        let waited = wait_quiet(&log, Duration::from_millis(400), Duration::from_secs(5));
        assert!(waited >= Duration::from_millis(400) && waited < Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
