//! PostMan helpers' logic (issue 28, `../shared/papers/postman.txt`):
//! what a helper that relays many clients' small messages to a hot server
//! decides, as state machines with no clock and no socket.
//!
//! - [`Batcher`]: when to send what has been gathered for one server —
//!   PostMan's Algorithm 1 (an interval and a size, each retuned when a
//!   batch's observed period or size leaves [0.5×, 1.5×] of it, with
//!   floors) or a self-clocking policy (send when the server has answered
//!   everything sent to it, or the frame is full), chosen by
//!   [`BatchPolicy`].
//! - [`Record`]: what a helper packs into one message to a server — many
//!   clients' streams (virtual connections), each record behind a 7-byte
//!   header — and [`decode_records`].
//!
//! - [`SlotTable`]: a server's table of one helper's open slots, with
//!   the bound on how many a helper may hold.
//! - [`Preamble`] and [`HelperLoad`]: what a client says first to a
//!   helper (relay to a server, or a load query), and the load answer.
//! - [`Activation`]: when a client goes through a helper (its p99 above
//!   the SLA; the least loaded of a few drawn at random) and when it goes
//!   back direct, without flapping.
//! - [`DEFAULT_RELAY_CHANNEL`]: the channel a helper's session to a server
//!   carries those records on.
//!
//! What it does not do: move bytes (the shell's relay does), measure
//! p99 or ask helpers their load (the shell does); see docs/postman.md for the design and what
//! is built.

mod activation;
mod batcher;
mod preamble;
mod record;
mod slots;

/// The one-way channel that carries relay records between a helper and a
/// server by default (the last of the default 256 channels), reserved: a
/// server configured to accept helpers takes messages on it from them as
/// relay traffic, not as the application's.
pub const DEFAULT_RELAY_CHANNEL: u16 = 255;

pub use activation::{Activation, ActivationConfig, ActivationState, Decision};
pub use batcher::{
    AdaptiveConfig, BatchPolicy, Batcher, BatcherConfig, BatcherError, Flush, MIN_ANSWER_WAIT,
};
pub use preamble::{HelperLoad, Preamble, PreambleError, LOAD_LEN, PREAMBLE_LEN};
pub use record::{decode_records, Record, RecordError, MAX_RECORD_BODY, MAX_SLOT, RECORD_HEADER};
pub use slots::{SlotAction, SlotError, SlotTable, DEFAULT_MAX_SLOTS};
