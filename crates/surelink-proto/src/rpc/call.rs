//! hr-net's client message state machine, with typed states.
//!
//! ```text
//! INIT ──select──▶ SELECT ──send──▶ SEND ──reply──▶ DONE
//!                    ▲   └─send error─┐  │
//!                    │                ▼  ├─timeout────────┐
//!                    └───select─── RESEND ◀─receive error─┘
//! ```
//!
//! Priority adjustments (hr-net's client table): a RESEND after a RECEIVE
//! ERROR or a TIMEOUT becomes high priority; after a SEND ERROR it keeps its
//! priority. A call made with `adjust = false` (hr-net's synchronous
//! transmission) is never re-prioritised.
//!
//! [`Call<S>`] carries its state in its type, so an illegal transition does
//! not compile:
//!
//! ```compile_fail
//! use surelink_proto::rpc::{Call, Priority};
//! let call = Call::new(1, Priority::Normal, true);
//! call.reply(); // a call that was never sent cannot be answered
//! ```
//!
//! [`AnyCall`] is the same machine for tables that hold calls in different
//! states; [`AnyCall::apply`] refuses an illegal input with a typed error.

use super::Priority;

/// Why a request is sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResendReason {
    /// The reply could not be received (the path it was on failed).
    ReceiveError,
    /// The request could not be sent.
    SendError,
    /// No reply within the re-send timeout.
    Timeout,
}

/// State: created, no path chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Init;
/// State: a path (or the session) chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selected;
/// State: sent, waiting for the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent;
/// State: to be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resend {
    /// Why.
    pub reason: ResendReason,
}
/// State: answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done;

/// A call in state `S`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call<S> {
    id: u64,
    priority: Priority,
    adjust: bool,
    sends: u32,
    state: S,
}

impl<S> Call<S> {
    /// The call id (the same on every re-send).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its current priority.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// How many times it was sent.
    pub fn sends(&self) -> u32 {
        self.sends
    }

    /// The state.
    pub fn state(&self) -> &S {
        &self.state
    }

    fn to<T>(self, state: T) -> Call<T> {
        Call {
            id: self.id,
            priority: self.priority,
            adjust: self.adjust,
            sends: self.sends,
            state,
        }
    }
}

impl Call<Init> {
    /// A new call. `adjust = false` keeps `priority` whatever happens.
    pub fn new(id: u64, priority: Priority, adjust: bool) -> Self {
        Call {
            id,
            priority,
            adjust,
            sends: 0,
            state: Init,
        }
    }

    /// INIT → SELECT.
    pub fn select(self) -> Call<Selected> {
        self.to(Selected)
    }
}

impl Call<Selected> {
    /// SELECT → SEND.
    pub fn send(mut self) -> Call<Sent> {
        self.sends += 1;
        self.to(Sent)
    }

    /// SELECT → RESEND (SEND ERROR): priority unchanged.
    pub fn send_failed(self) -> Call<Resend> {
        self.to(Resend {
            reason: ResendReason::SendError,
        })
    }
}

impl Call<Sent> {
    /// SEND → DONE.
    pub fn reply(self) -> Call<Done> {
        self.to(Done)
    }

    /// SEND → RESEND (TIMEOUT): high priority.
    pub fn timeout(self) -> Call<Resend> {
        self.escalate(ResendReason::Timeout)
    }

    /// SEND → RESEND (RECEIVE ERROR): high priority.
    pub fn receive_error(self) -> Call<Resend> {
        self.escalate(ResendReason::ReceiveError)
    }

    fn escalate(mut self, reason: ResendReason) -> Call<Resend> {
        if self.adjust {
            self.priority = Priority::High;
        }
        self.to(Resend { reason })
    }
}

impl Call<Resend> {
    /// RESEND → SELECT (a path is chosen again).
    pub fn select(self) -> Call<Selected> {
        self.to(Selected)
    }
}

/// An input to [`AnyCall::apply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallInput {
    /// Choose a path.
    Select,
    /// The request went out.
    Send,
    /// The request could not go out.
    SendError,
    /// The reply arrived.
    Reply,
    /// The re-send timeout passed.
    Timeout,
    /// The reply was lost with its path.
    ReceiveError,
}

/// An input the current state does not accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("call {id}: {input:?} is not allowed in state {state}")]
pub struct IllegalTransition {
    /// The call.
    pub id: u64,
    /// The refused input.
    pub input: CallInput,
    /// The state's name.
    pub state: &'static str,
}

/// A call in any state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AnyCall {
    /// INIT.
    Init(Call<Init>),
    /// SELECT.
    Selected(Call<Selected>),
    /// SEND.
    Sent(Call<Sent>),
    /// RESEND.
    Resend(Call<Resend>),
    /// DONE.
    Done(Call<Done>),
}

impl AnyCall {
    /// The state's name.
    pub fn state_name(&self) -> &'static str {
        match self {
            AnyCall::Init(_) => "INIT",
            AnyCall::Selected(_) => "SELECT",
            AnyCall::Sent(_) => "SEND",
            AnyCall::Resend(_) => "RESEND",
            AnyCall::Done(_) => "DONE",
        }
    }

    /// The call's priority now.
    pub fn priority(&self) -> Priority {
        match self {
            AnyCall::Init(c) => c.priority(),
            AnyCall::Selected(c) => c.priority(),
            AnyCall::Sent(c) => c.priority(),
            AnyCall::Resend(c) => c.priority(),
            AnyCall::Done(c) => c.priority(),
        }
    }

    /// Times sent.
    pub fn sends(&self) -> u32 {
        match self {
            AnyCall::Init(c) => c.sends(),
            AnyCall::Selected(c) => c.sends(),
            AnyCall::Sent(c) => c.sends(),
            AnyCall::Resend(c) => c.sends(),
            AnyCall::Done(c) => c.sends(),
        }
    }

    /// Applies `input`, or refuses it (the call is unchanged then).
    pub fn apply(self, input: CallInput) -> Result<AnyCall, IllegalTransition> {
        Ok(match (self, input) {
            (AnyCall::Init(c), CallInput::Select) => AnyCall::Selected(c.select()),
            (AnyCall::Selected(c), CallInput::Send) => AnyCall::Sent(c.send()),
            (AnyCall::Selected(c), CallInput::SendError) => AnyCall::Resend(c.send_failed()),
            (AnyCall::Sent(c), CallInput::Reply) => AnyCall::Done(c.reply()),
            (AnyCall::Sent(c), CallInput::Timeout) => AnyCall::Resend(c.timeout()),
            (AnyCall::Sent(c), CallInput::ReceiveError) => AnyCall::Resend(c.receive_error()),
            (AnyCall::Resend(c), CallInput::Select) => AnyCall::Selected(c.select()),
            (s, input) => {
                let id = match s {
                    AnyCall::Init(c) => c.id(),
                    AnyCall::Selected(c) => c.id(),
                    AnyCall::Sent(c) => c.id(),
                    AnyCall::Resend(c) => c.id(),
                    AnyCall::Done(c) => c.id(),
                };
                return Err(IllegalTransition {
                    id,
                    input,
                    state: s.state_name(),
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_priority_table() {
        let sent = || Call::new(1, Priority::Normal, true).select().send();
        assert_eq!(sent().timeout().priority(), Priority::High);
        assert_eq!(sent().receive_error().priority(), Priority::High);
        let c = Call::new(1, Priority::Normal, true).select().send_failed();
        assert_eq!(c.priority(), Priority::Normal, "SEND ERROR keeps normal");
        assert_eq!(c.state().reason, ResendReason::SendError);
        // Synchronous calls are not re-prioritised.
        let c = Call::new(2, Priority::Normal, false)
            .select()
            .send()
            .timeout();
        assert_eq!(c.priority(), Priority::Normal);
        // A re-send keeps the id and counts the sends.
        let c = sent().timeout().select().send();
        assert_eq!((c.id(), c.sends()), (1, 2));
    }

    #[test]
    fn every_illegal_transition_is_refused() {
        let inputs = [
            CallInput::Select,
            CallInput::Send,
            CallInput::SendError,
            CallInput::Reply,
            CallInput::Timeout,
            CallInput::ReceiveError,
        ];
        let init = Call::new(7, Priority::Normal, true);
        let states = [
            AnyCall::Init(init),
            AnyCall::Selected(init.select()),
            AnyCall::Sent(init.select().send()),
            AnyCall::Resend(init.select().send().timeout()),
            AnyCall::Done(init.select().send().reply()),
        ];
        let legal = |s: &AnyCall, i: CallInput| {
            matches!(
                (s, i),
                (AnyCall::Init(_), CallInput::Select)
                    | (AnyCall::Selected(_), CallInput::Send | CallInput::SendError)
                    | (
                        AnyCall::Sent(_),
                        CallInput::Reply | CallInput::Timeout | CallInput::ReceiveError
                    )
                    | (AnyCall::Resend(_), CallInput::Select)
            )
        };
        let mut refused = 0;
        for s in states {
            for i in inputs {
                match s.apply(i) {
                    Ok(_) => assert!(legal(&s, i), "{} accepted {i:?}", s.state_name()),
                    Err(e) => {
                        assert!(!legal(&s, i), "{} refused legal {i:?}", s.state_name());
                        assert_eq!(e.id, 7);
                        refused += 1;
                    }
                }
            }
        }
        assert_eq!(refused, 30 - 7, "7 legal transitions of 30");
    }
}
