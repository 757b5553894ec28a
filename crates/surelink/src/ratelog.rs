//! Rate-limited log lines: a peer that can make us log (refused
//! connections, failed handshakes, bad input) must not be able to fill the
//! disk or burn a core on formatting.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Allows a few lines per second for one kind of event; counts the rest.
#[derive(Debug, Default)]
pub(crate) struct LogLimit {
    /// Second (since the endpoint started) of the current window.
    window: AtomicU64,
    /// Lines allowed in the current window.
    lines: AtomicU64,
    /// Lines suppressed since the last allowed one.
    suppressed: AtomicU64,
}

/// The kinds of line a remote party can cause.
#[derive(Debug, Default)]
pub(crate) struct LogLimits {
    /// Input refused (bad frames, records).
    pub(crate) refused: LogLimit,
    /// Handshakes failed.
    pub(crate) handshake: LogLimit,
    /// Connections refused at a limit.
    pub(crate) limits: LogLimit,
    /// Recovery groups entering recovery (a faulty group may recover
    /// many times a second).
    pub(crate) recoveries: LogLimit,
}

/// Lines per second per kind.
const PER_SECOND: u64 = 5;

impl LogLimit {
    /// Whether to log now; `Some(n)`: yes, and `n` lines were suppressed
    /// since the last one (say so in the line).
    pub(crate) fn allow(&self, now_secs: u64) -> Option<u64> {
        let w = self.window.load(Relaxed);
        if now_secs != w
            && self
                .window
                .compare_exchange(w, now_secs, Relaxed, Relaxed)
                .is_ok()
        {
            self.lines.store(0, Relaxed);
        }
        if self.lines.fetch_add(1, Relaxed) < PER_SECOND {
            Some(self.suppressed.swap(0, Relaxed))
        } else {
            self.suppressed.fetch_add(1, Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_few_lines_and_counts_the_rest() {
        let l = LogLimit::default();
        let allowed = (0..1000u64).filter(|_| l.allow(7).is_some()).count() as u64;
        assert_eq!(allowed, PER_SECOND);
        assert_eq!(l.allow(8), Some(1000 - PER_SECOND));
        assert_eq!(l.allow(8), Some(0));
    }
}
