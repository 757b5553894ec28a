//! A deterministic simulator for surelink's sans-IO core, and the checkers
//! that hold it to its promises.
//!
//! [`Sim`] drives N endpoints with M paths between each pair through
//! [`surelink_proto::Endpoint`] — the same router, sessions and message
//! layer the shell runs — on a virtual clock. Every random choice (latency
//! jitter, loss, the workload) comes from one seed, so a run replays
//! exactly. The workload is one-way messages (in bursts, so they batch) and
//! calls between every pair of nodes; every node serves its admitted
//! requests through the product's `PriorityScheduler`. Faults ([`Fault`]):
//! link down and up, one-way silence, random loss, connection reset,
//! process pause (GC, SIGSTOP) and restart (new epoch). [`Sim::step`] jumps
//! to the next event; nothing sleeps and nothing reads the wall clock.
//!
//! The [`Checker`] sees every `send`, every call and every event and
//! reports broken promises: a message delivered twice, out of order,
//! corrupted, to the wrong node, or neither delivered nor reported abandoned
//! once faults stop; a call run twice, answered with another call's reply,
//! or neither answered nor failed; and any session buffer over its
//! configured bound.
//!
//! [`rpc::RpcScenario`] stalls paths (nothing fails) under a stream of calls
//! to check re-sends, priorities and at-most-once through the product's
//! call table, dispatcher admission and schedulers.
//!
//! [`fixture::World`] is the one driver that moves bytes between core
//! endpoints: the simulator, the targeted tests (a two-node
//! [`fixture::World::pair`] whose bytes cross only when the test says so),
//! the `rpc` scenario, the fuzz targets and the core benchmark all run on
//! it.
//!
//! Links listed in [`SimConfig::helper_links`] are carried by a PostMan
//! helper: their bytes travel as the core's relay records in batches the
//! core's `helper::Batcher` decides, and the helper can freeze or die
//! (`Fault::HelperPause`, `Fault::HelperCrash`) with what it holds.
//!
//! With [`SimConfig::secure`] set, every connection first runs the
//! product's Noise handshake and then carries AEAD records (the shell's
//! secure layer, sans-IO in `surelink_proto::secure`); a transmission lost
//! inside a connection then breaks its record stream and the connection
//! closes, as a deleted byte would on TCP.
//!
//! What it does not model: congestion, bandwidth, kernel buffers, or byte-level
//! stream splitting (each transmission arrives whole or not at all).

// Test support: virtual-time arithmetic on small simulated values.
#![allow(clippy::cast_possible_truncation)]

mod checker;
pub mod detector;
mod faults;
pub mod fixture;
pub mod fuzz;
pub mod rcs;
pub mod role;
pub mod role_scale;
pub mod rpc;
mod secure;
mod sim;

pub use checker::{answer, make_payload, CallOutcome, CallTally, Checker, Outcome, Tally};
pub use faults::{random_schedule, Fault, ScheduleSpec};
pub use sim::{LinkSpec, Sim, SimConfig, SimReport, Workload};
