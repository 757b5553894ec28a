//! Endpoint configuration: plain values with defaults, validated once.

use std::time::Duration;

use crate::ids::StreamId;
use crate::wire::{AckWriter, BATCH_FIXED, DATA_OVERHEAD, HEADER_LEN, MAX_ACK_RANGES};

/// Accounting cost of one message beyond its payload, in bytes. Both sides
/// use the same figure, so a receiver's window and a sender's view of it
/// agree; it also keeps millions of empty messages from fitting in "0 bytes".
pub const MESSAGE_OVERHEAD: u64 = 64;

/// The accounting cost of a message with `len` payload bytes.
#[inline]
pub(crate) fn message_cost(len: usize) -> u64 {
    len as u64 + MESSAGE_OVERHEAD
}

/// How an endpoint's sessions behave. `Default` gives values suited to a
/// LAN cluster; [`EndpointConfig::validate`] checks a hand-made one.
///
/// Non-exhaustive: later versions add settings with defaults, so build one
/// from `EndpointConfig::default()` and change fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Largest application message, in bytes.
    pub max_message_size: u32,
    /// Bytes (payload + [`MESSAGE_OVERHEAD`] each) a session keeps in its
    /// retransmit cache: every message from `send` until the peer's
    /// application has it. When full, `send` hands the message back.
    pub send_buffer: u64,
    /// Bytes a session will buffer on the receiving side (out-of-order
    /// messages plus delivered messages the application has not yet polled).
    /// Advertised to the peer, which never sends beyond it.
    pub recv_window: u32,
    /// Application channels per session; channel ids must be below this
    /// (at most [`StreamId::MAX_CHANNELS`]).
    pub max_channels: u32,
    /// Sessions (peers) an endpoint keeps at once.
    pub max_sessions: u32,
    /// Acknowledge after this many messages arrived or were delivered...
    pub ack_frequency: u32,
    /// ...or after this long, whichever comes first.
    pub max_ack_delay: Duration,
    /// RTT assumed for a path before its first sample.
    pub initial_rtt: Duration,
    /// Lower bound of a path's retransmission timeout. A path whose oldest
    /// unacknowledged message is older than its timeout is marked suspect and
    /// its messages are re-sent on another path.
    pub min_rto: Duration,
    /// Upper bound of a path's retransmission timeout, after backoff.
    pub max_rto: Duration,
    /// Longest wait between PINGs to a path that has not answered, however
    /// far its timeout has backed off (never shorter than the path's own
    /// timeout before backoff). A suspected path is found working again
    /// within about this long after its fault ends; data waits for that
    /// PONG instead of backing off with the path.
    pub max_probe_interval: Duration,
    /// Interval between handshake retransmissions on a path still handshaking.
    pub handshake_retry: Duration,
    /// A path that has not finished its handshake after this long is closed.
    pub handshake_timeout: Duration,
    /// An active path on which nothing arrived for this long is probed with
    /// a PING (answered by a PONG), so a quiet but healthy path keeps
    /// proving itself and a dead one is found.
    pub path_keepalive: Duration,
    /// An active path on which nothing valid arrived for this long is
    /// closed: a peer that completed its handshake cannot hold a connection
    /// open without answering, and a half-open one is not kept forever.
    pub path_idle_timeout: Duration,
    /// How long a session outlives the loss of all its paths. Messages sent
    /// meanwhile wait in the cache; when it expires they are reported abandoned.
    pub linger: Duration,
    /// Bytes of unacknowledged messages one path may carry at once.
    pub path_inflight_limit: u64,
    /// Load balancing keeps using the last path until another is lighter by
    /// more than this many in-flight bytes (avoids needless reordering).
    /// The default, equal to `path_inflight_limit`, keeps a stream on one
    /// healthy path while that path has room: it spills to another only
    /// when full, suspected or steered away from.
    pub balance_slack: u64,
    /// Messages up to this size join a BATCH frame with the messages queued
    /// behind them on their stream (never delaying a lone message). Larger
    /// ones go alone, their payload written without a copy. The default,
    /// 8 KiB (a quarter of `batch_bytes`): 4 KiB messages batched cost less
    /// than their per-frame work alone (docs/data-path.md).
    pub batch_message_max: u32,
    /// Largest BATCH frame body, messages and their framing.
    pub batch_bytes: u32,
    /// Requests a session admits (handed out and not completed) before it
    /// stops taking more from that peer, which holds the peer back.
    pub max_requests_per_peer: u32,
    /// Bytes of calls one peer can make this node hold beyond the send
    /// buffer: requests admitted and not yet answered, replies waiting for
    /// send-buffer room (a peer that does not acknowledge replies fills
    /// the buffer); cached replies have their own bound. At the bound the
    /// session admits no new request from that peer (they wait
    /// unacknowledged, so the peer's own flow control holds it back); one
    /// request is always admitted when none is outstanding. A node has one live session per peer and an
    /// ended session frees all of it, so this bounds the peer across its
    /// sessions and epochs.
    pub call_bytes_per_peer: u64,
    /// Replies kept per session to answer re-sent requests.
    pub reply_cache_entries: usize,
    /// Bytes of replies kept per session.
    pub reply_cache_bytes: usize,
    /// Finished call ids remembered per session (without their replies),
    /// so a late re-send is never run twice.
    pub remember_calls: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            max_message_size: 1 << 20,
            send_buffer: 16 << 20,
            recv_window: 16 << 20,
            max_channels: 256,
            max_sessions: 4096,
            ack_frequency: 32,
            max_ack_delay: Duration::from_millis(25),
            initial_rtt: Duration::from_millis(10),
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(4),
            max_probe_interval: Duration::from_millis(50),
            handshake_retry: Duration::from_millis(250),
            handshake_timeout: Duration::from_secs(10),
            path_keepalive: Duration::from_secs(15),
            path_idle_timeout: Duration::from_secs(60),
            linger: Duration::from_secs(30),
            path_inflight_limit: 2 << 20,
            balance_slack: 2 << 20,
            batch_message_max: 8192,
            batch_bytes: 32 << 10,
            max_requests_per_peer: 1024,
            call_bytes_per_peer: 16 << 20,
            reply_cache_entries: 1024,
            reply_cache_bytes: 1 << 20,
            remember_calls: 16_384,
        }
    }
}

/// A configuration value that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The field must be greater than zero.
    #[error("`{field}` must be greater than zero")]
    Zero {
        /// The field's name.
        field: &'static str,
    },
    /// The field is outside its allowed range.
    #[error("`{field}` is {value}, outside the allowed range {min}..={max}")]
    OutOfRange {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed.
        max: u64,
    },
    /// Two fields contradict each other.
    #[error("`{field}` ({value}) must be at least `{other}` ({other_value}): {why}")]
    Inconsistent {
        /// The field that is too small.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The field it is compared with.
        other: &'static str,
        /// That field's value.
        other_value: u64,
        /// Why they must relate so.
        why: &'static str,
    },
}

impl EndpointConfig {
    /// Checks every field; returns the first problem found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let range = |field, value: u64, min: u64, max: u64| {
            if value < min || value > max {
                Err(ConfigError::OutOfRange {
                    field,
                    value,
                    min,
                    max,
                })
            } else {
                Ok(())
            }
        };
        let nonzero = |field, d: Duration| {
            if d.is_zero() {
                Err(ConfigError::Zero { field })
            } else {
                Ok(())
            }
        };
        range(
            "max_message_size",
            u64::from(self.max_message_size),
            1,
            1 << 30,
        )?;
        range(
            "max_channels",
            u64::from(self.max_channels),
            1,
            u64::from(StreamId::MAX_CHANNELS),
        )?;
        range("batch_bytes", u64::from(self.batch_bytes), 64, 16 << 20)?;
        range(
            "max_requests_per_peer",
            u64::from(self.max_requests_per_peer),
            1,
            1 << 24,
        )?;
        range("max_sessions", u64::from(self.max_sessions), 1, 1 << 24)?;
        range("ack_frequency", u64::from(self.ack_frequency), 1, 1 << 20)?;
        nonzero("max_ack_delay", self.max_ack_delay)?;
        nonzero("initial_rtt", self.initial_rtt)?;
        nonzero("min_rto", self.min_rto)?;
        nonzero("max_probe_interval", self.max_probe_interval)?;
        nonzero("handshake_retry", self.handshake_retry)?;
        nonzero("handshake_timeout", self.handshake_timeout)?;
        nonzero("linger", self.linger)?;
        nonzero("path_keepalive", self.path_keepalive)?;
        if self.path_idle_timeout <= self.path_keepalive {
            return Err(ConfigError::Inconsistent {
                field: "path_idle_timeout",
                value: millis(self.path_idle_timeout),
                other: "path_keepalive",
                other_value: millis(self.path_keepalive),
                why: "a quiet path must get a keepalive before it counts as idle",
            });
        }
        // No lower bound beyond zero: one request is admitted whenever none
        // is outstanding, whatever its size.
        if self.call_bytes_per_peer == 0 {
            return Err(ConfigError::Zero {
                field: "call_bytes_per_peer",
            });
        }
        if self.path_inflight_limit == 0 {
            return Err(ConfigError::Zero {
                field: "path_inflight_limit",
            });
        }
        let largest = message_cost(self.max_message_size as usize);
        for (field, value) in [
            ("send_buffer", self.send_buffer),
            ("recv_window", u64::from(self.recv_window)),
            ("path_inflight_limit", self.path_inflight_limit),
        ] {
            if value < largest {
                return Err(ConfigError::Inconsistent {
                    field,
                    value,
                    other: "max_message_size + MESSAGE_OVERHEAD",
                    other_value: largest,
                    why: "the largest message must fit",
                });
            }
        }
        if self.max_rto < self.min_rto {
            return Err(ConfigError::Inconsistent {
                field: "max_rto",
                value: millis(self.max_rto),
                other: "min_rto",
                other_value: millis(self.min_rto),
                why: "backoff grows from the minimum towards the maximum",
            });
        }
        Ok(())
    }

    /// Largest frame body this endpoint accepts: a maximal DATA frame, a
    /// maximal BATCH, or a RESUME carrying 64 streams with full ranges,
    /// whichever is larger.
    pub fn max_frame_body(&self) -> u32 {
        let data = self.max_message_size as usize + DATA_OVERHEAD - HEADER_LEN;
        let batch = self.batch_bytes as usize + BATCH_FIXED;
        let ack = AckWriter::EMPTY_LEN + AckWriter::entry_len(MAX_ACK_RANGES) * 64;
        u32::try_from(data.max(ack).max(batch)).unwrap_or(u32::MAX)
    }
}

/// A duration in whole milliseconds, for error messages.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        EndpointConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_values_are_named() {
        let c = EndpointConfig {
            max_channels: 0,
            ..Default::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::OutOfRange {
                field: "max_channels",
                ..
            })
        ));
        let c = EndpointConfig {
            send_buffer: 10,
            ..Default::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Inconsistent {
                field: "send_buffer",
                ..
            })
        ));
        let c = EndpointConfig {
            linger: Duration::ZERO,
            ..Default::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::Zero { field: "linger" }));
        let c = EndpointConfig {
            min_rto: Duration::from_secs(2),
            max_rto: Duration::from_secs(1),
            ..Default::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Inconsistent {
                field: "max_rto",
                ..
            })
        ));
        assert!(c.validate().unwrap_err().to_string().contains("min_rto"));
        let c = EndpointConfig {
            path_keepalive: Duration::from_secs(60),
            path_idle_timeout: Duration::from_secs(60),
            ..Default::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Inconsistent {
                field: "path_idle_timeout",
                ..
            })
        ));
    }
}
