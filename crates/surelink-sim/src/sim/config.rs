//! What a simulation is set up with ([`SimConfig`]: nodes, paths, seed,
//! the endpoints' configuration, links, the workload, the secure layer)
//! and what a run reports ([`SimReport`]). No behaviour lives here.

use std::time::Duration;

use surelink_proto::secure::Protection;
use surelink_proto::EndpointConfig;

use crate::checker::{CallTally, Tally};

/// Link behaviour in the absence of faults.
#[derive(Clone, Debug)]
pub struct LinkSpec {
    /// One-way latency.
    pub latency: Duration,
    /// Extra random delay in `[0, jitter)` per transmission.
    pub jitter: Duration,
    /// Keep each direction first-in first-out, like a TCP stream. When false,
    /// jitter may reorder transmissions within a connection.
    pub fifo: bool,
}

/// The application load each node offers.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Each node sends one message every `interval` to a random peer.
    pub interval: Duration,
    /// Sending stops at this time.
    pub until: Duration,
    /// Channels used, `0..channels`.
    pub channels: u16,
    /// Payload lengths are drawn from `[8, max_len]`.
    pub max_len: usize,
    /// Messages sent back to back per tick (to the same peer and channel):
    /// above 1, they queue behind each other and leave as BATCH frames.
    pub burst: usize,
    /// Each node also calls a random peer this often (`None`: no calls).
    /// Every node serves: admitted requests go through the product's
    /// `PriorityScheduler` to one worker per node.
    pub call_every: Option<std::time::Duration>,
    /// Each request takes this long to run.
    pub service: std::time::Duration,
    /// Calls fail with a timeout after this long.
    pub call_timeout: std::time::Duration,
}

/// A simulation's setup.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Number of endpoints.
    pub nodes: usize,
    /// Paths (links) between each pair of nodes.
    pub paths: usize,
    /// Seeds every random choice.
    pub seed: u64,
    /// Configuration of every endpoint.
    pub endpoint: EndpointConfig,
    /// Per-link latency and jitter.
    pub link: LinkSpec,
    /// How long after a link goes silent both ends are told its transport
    /// failed (models the failure detector). `None`: never; only the core's
    /// retransmission timeout reacts.
    pub detect_after: Option<Duration>,
    /// Delay between connection attempts on a link without a connection.
    pub reconnect_after: Duration,
    /// Bytes per `poll_transmit` call.
    pub transmit_budget: usize,
    /// The offered load.
    pub workload: Workload,
    /// Run every connection through the secure layer (handshake, then
    /// records) with this protection; `None`: plaintext, as `insecure = true`.
    /// Needs FIFO links (records must arrive in order, as on TCP).
    pub secure: Option<Protection>,
    /// With `secure`: mutual TLS with certificates from one simulated CA
    /// instead of Noise with member keys.
    pub tls: bool,
    /// Links carried by a PostMan helper (indices into the links): their
    /// bytes go as relay records in the helper's batches (see the
    /// `helper` module), subject to `Fault::HelperPause`/`HelperCrash`.
    pub helper_links: Vec<usize>,
    /// The helpers' batching.
    pub helper_batching: surelink_proto::helper::BatcherConfig,
}

impl SimConfig {
    /// Bound on the time from "faults and load stopped" to "everything
    /// delivered or reported": reconnect + handshake + two backed-off
    /// retransmission timeouts, with room for the jitter of a few round
    /// trips; with the secure layer, plus a handshake that lost a message
    /// and waits for its timeout; with helpers, plus the time a server
    /// takes to hear of a dead one.
    pub fn drain_bound(&self) -> Duration {
        let secure = if self.secure.is_some() {
            self.endpoint.handshake_timeout
        } else {
            Duration::ZERO
        };
        let helpers = if self.helper_links.is_empty() {
            Duration::ZERO
        } else {
            super::helper::HELPER_DEAD_AFTER
        };
        secure
            + helpers
            + self.reconnect_after
            + self.endpoint.handshake_retry
            + self.endpoint.max_rto * 2
            + self.detect_after.unwrap_or_default()
            + Duration::from_millis(100)
    }

    /// A small, fast setup suited to property tests.
    pub fn small(seed: u64) -> Self {
        SimConfig {
            nodes: 2,
            paths: 2,
            seed,
            endpoint: {
                let mut e = EndpointConfig::default();
                e.min_rto = Duration::from_millis(40);
                e.max_rto = Duration::from_millis(500);
                e.handshake_retry = Duration::from_millis(50);
                e.handshake_timeout = Duration::from_secs(2);
                e.linger = Duration::from_secs(10);
                e.send_buffer = 256 << 10;
                e.recv_window = 256 << 10;
                e.max_message_size = 16 << 10;
                e.path_inflight_limit = 128 << 10;
                e.max_channels = 8;
                e.batch_bytes = 4 << 10;
                e.batch_message_max = 1 << 10;
                e
            },
            link: LinkSpec {
                latency: Duration::from_micros(200),
                jitter: Duration::from_micros(300),
                fifo: true,
            },
            detect_after: Some(Duration::from_millis(30)),
            reconnect_after: Duration::from_millis(20),
            transmit_budget: 16 << 10,
            workload: Workload {
                interval: Duration::from_millis(2),
                until: Duration::from_secs(2),
                channels: 3,
                max_len: 600,
                burst: 1,
                call_every: None,
                service: Duration::from_micros(300),
                call_timeout: Duration::from_secs(2),
            },
            secure: None,
            tls: false,
            helper_links: Vec::new(),
            helper_batching: surelink_proto::helper::BatcherConfig::default(),
        }
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// Outcome counts.
    pub tally: Tally,
    /// Broken promises (empty on success).
    pub violations: Vec<String>,
    /// Virtual time when the last pending message was delivered or reported.
    pub drained_at: Option<Duration>,
    /// When the last fault ended.
    pub faults_end: Duration,
    /// `send` calls refused with `Full` (backpressure, not loss).
    pub refused_full: u64,
    /// Frames re-sent, summed over the sessions alive at the end.
    pub resent: u64,
    /// BATCH frames sent, summed over the sessions alive at the end.
    pub batches: u64,
    /// Largest send cache and receive buffer seen in any session, in bytes.
    pub peak_cache: u64,
    /// Largest receive-side buffer seen.
    pub peak_recv: u64,
    /// `(sent at, latency)` in virtual ms per delivery, when recording.
    pub latencies: Vec<(f64, f64)>,
    /// Call outcome counts.
    pub calls: CallTally,
    /// Events processed.
    pub steps: u64,
    /// Secure layer: handshakes completed (both ends), failed, and
    /// connections closed for a refused record.
    pub handshakes: u64,
    /// Of them, ends that resumed with a ticket (no public-key work).
    pub handshakes_resumed: u64,
    /// Handshakes that failed or timed out.
    pub handshakes_failed: u64,
    /// Connections closed because a record failed its tag.
    pub records_refused: u64,
    /// Batches the helpers sent, and the records in them.
    pub helper_batches: u64,
    /// Records the helpers carried.
    pub helper_records: u64,
}

impl SimReport {
    /// Whether every promise held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}
