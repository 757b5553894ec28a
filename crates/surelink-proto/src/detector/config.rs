//! Detector settings.

use std::time::Duration;

use crate::config::ConfigError;

/// Which detector runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DetectorMode {
    /// SafeTimer: barrier and drop checks before a report, and the sender
    /// fence.
    #[default]
    SafeTimer,
    /// The baseline: the same heartbeats, a plain timeout, no checks, no
    /// fence. Reports a live peer dead when this process is slow.
    Plain,
    /// No heartbeats at all; paths fail only through TCP errors and the
    /// session's retransmission timeout.
    Off,
}

/// Heartbeat timing. The defaults detect a dead path in about 100 ms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectorConfig {
    /// Which detector runs.
    pub mode: DetectorMode,
    /// Heartbeat period.
    pub interval: Duration,
    /// The receiver's window: a path silent this long is suspected.
    pub timeout: Duration,
    /// How late after its scheduled time a heartbeat may leave the host
    /// before the sender fences itself. Too small fences a merely busy
    /// process (a new epoch, messages abandoned); it costs detection time
    /// through `timeout`.
    pub send_slack: Duration,
    /// The longest the network itself may take to deliver a heartbeat (the
    /// paper's blackbox assumption). Local delays are not part of it.
    pub max_network_delay: Duration,
    /// How often the receiver checks its windows.
    pub check_every: Duration,
    /// A barrier not back within this is lost: no report that round.
    pub barrier_timeout: Duration,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig::with_interval(Duration::from_millis(20))
    }
}

impl DetectorConfig {
    /// Settings scaled to one heartbeat `interval`: window 5 intervals,
    /// send slack 2, network delay 1, checks twice per interval.
    pub fn with_interval(interval: Duration) -> Self {
        DetectorConfig {
            mode: DetectorMode::SafeTimer,
            interval,
            timeout: interval * 5,
            send_slack: interval * 2,
            max_network_delay: interval,
            check_every: interval / 2,
            barrier_timeout: interval.max(Duration::from_millis(5)),
        }
    }

    /// Checks the settings; the relation between them is what makes a
    /// report safe (see the module docs).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        for (field, v) in [
            ("detector.interval", self.interval),
            ("detector.timeout", self.timeout),
            ("detector.check_every", self.check_every),
            ("detector.barrier_timeout", self.barrier_timeout),
        ] {
            if v.is_zero() {
                return Err(ConfigError::Zero { field });
            }
        }
        let need = self.interval + self.send_slack + self.max_network_delay;
        if self.timeout < need {
            return Err(ConfigError::Inconsistent {
                field: "detector.timeout (µs)",
                value: ms(self.timeout),
                other: "interval + send_slack + max_network_delay (µs)",
                other_value: ms(need),
                why: "a shorter window could report a sender whose heartbeat is still on time",
            });
        }
        if self.check_every > self.timeout {
            return Err(ConfigError::Inconsistent {
                field: "detector.timeout (µs)",
                value: ms(self.timeout),
                other: "detector.check_every (µs)",
                other_value: ms(self.check_every),
                why: "windows must be checked at least once per window",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_scaled() {
        DetectorConfig::default().validate().unwrap();
        for ms in [1, 10, 100, 1000] {
            DetectorConfig::with_interval(Duration::from_millis(ms))
                .validate()
                .unwrap();
        }
    }

    #[test]
    fn window_shorter_than_schedule_is_rejected() {
        let mut c = DetectorConfig::with_interval(Duration::from_millis(10));
        c.timeout = Duration::from_millis(30);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Inconsistent { .. })
        ));
        c.timeout = Duration::from_millis(40);
        c.validate().unwrap();
        c.interval = Duration::ZERO;
        assert!(matches!(c.validate(), Err(ConfigError::Zero { .. })));
    }
}
