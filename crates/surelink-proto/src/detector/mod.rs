//! The failure detector's logic (SafeTimer), without sockets or clocks.
//!
//! Three pieces, each a plain state machine driven with explicit `now`:
//!
//! - [`Fence`] (the SafeTimer *sender*, paper Fig. 3): a fixed heartbeat
//!   schedule (every `idle_interval`, to every peer); each heartbeat that provably left the host before its
//!   deadline extends `t_valid` to the next heartbeat's deadline (and covers
//!   earlier heartbeats whose deadline it met, e.g. ones whose sends all
//!   failed). The shell lets no frame leave after `t_valid`; a heartbeat
//!   that missed its deadline fences the process for good (recovery is a
//!   new epoch).
//! - [`Monitor`] (the SafeTimer *receiver*, paper Fig. 2): per watched path
//!   (peer, network), the time something was last heard. A path silent for
//!   a whole window, or a peer silent on every path for a (longer) window,
//!   is only *suspected*: the monitor asks for a barrier through the
//!   heartbeat socket's queue and reports only if the barrier came back,
//!   nothing was heard since the window began, and no receive-side drop was
//!   counted since then. A barrier that does not come back means no report
//!   this round. A plain-timeout mode (no barrier, no drop check) is kept as
//!   the baseline.
//!
//! Two windows, an addition to the paper: a *path* report only moves
//! traffic to another path (a false one costs a re-send), so its window is
//! short and needs no fence; a *peer* report says the process is gone, and
//! only it is backed by the fence, so its window covers the sender's slack.
//! - [`datagram`]: the heartbeat and barrier datagrams.
//! - [`Pacer`]: which peers get heartbeats at the busy pace (traffic in
//!   flight either way) on top of the fence's idle-pace ones, and the
//!   flags that tell the receiver which window to watch a path with;
//!   with many busy peers, a pace stretched to a budget (`crowd.rs`).
//! - [`Handshake`]: whether a heartbeat's private copy is the counted one
//!   (the private ports' handshake, per peer and network).
//!
//! # Why the fence and the window fit together
//!
//! The fence's heartbeat `k` (one to every peer) is scheduled at `origin +
//! k·idle_interval` and must leave by `deadline(k) = scheduled(k) +
//! send_slack`. The receiver reports a peer dead at `t` only for a window
//! `[t − timeout, t]` with nothing in it. If `timeout ≥ idle_interval +
//! send_slack + max_network_delay`, the window holds
//! the schedule of a heartbeat whose deadline plus the network delay is
//! before `t`; if the sender were still valid at `t`, that heartbeat left in
//! time and arrived inside the window. So a report at `t` means the sender
//! sends nothing after `t` (Theorem A.1), with only durations compared on
//! each side (no synchronised clocks), as long as the network delivers a
//! sent heartbeat within `max_network_delay` (the blackbox assumption).
//!
//! What this module does **not** do: open sockets, read drop counters, pin
//! threads to CPUs or read TX timestamps. The shell does those and feeds
//! the results in.

mod config;
mod crowd;
pub mod datagram;
mod fence;
mod handshake;
mod monitor;
mod monitor_types;
mod pace;

pub use config::{DetectorConfig, DetectorMode};
pub use fence::{Fence, FenceState, HeartbeatDue};
pub use handshake::{Copies, Handshake};
pub use monitor::{
    HeartbeatQueue, Monitor, MonitorAction, MonitorStats, Pace, PathReport, QueueAtBarrier,
    QueuesAtBarrier, StraysAtBarrier, Watch,
};
pub use pace::{Pacer, PathUse};
