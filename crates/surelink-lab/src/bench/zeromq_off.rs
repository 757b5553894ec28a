//! Stands in for the ZeroMQ contender (`zeromq.rs`) in a build
//! without the `zeromq` cargo feature: setting it up reports it skipped,
//! and there is never a value to measure.

use anyhow::Result;
use bytes::Bytes;
use hdrhistogram::Histogram;

use super::fixture::Setup;
use super::report::{LatencyRound, ThroughputRound};
use super::Plan;

/// Why, and how to get it.
const SKIPPED: &str = "built without the zeromq feature (apt-get install libzmq3-dev; \
     cargo run --release -p surelink-cli --features zeromq -- bench)";

/// No ZeroMQ in this build: no value of this type exists.
pub(super) enum ZmqContender {}

impl ZmqContender {
    pub(super) fn setup() -> Result<Setup<ZmqContender>> {
        Ok(Setup::Skipped(SKIPPED.to_owned()))
    }

    pub(super) fn describe(&self) -> String {
        match *self {}
    }

    pub(super) async fn latency_round(
        &mut self,
        _payload: &Bytes,
        _callers: usize,
        _plan: &Plan,
    ) -> Result<(LatencyRound, Histogram<u64>)> {
        match *self {}
    }

    pub(super) async fn throughput_round(
        &mut self,
        _payload: &Bytes,
        _plan: &Plan,
    ) -> Result<ThroughputRound> {
        match *self {}
    }

    pub(super) async fn shutdown(self) -> Result<()> {
        match self {}
    }
}
