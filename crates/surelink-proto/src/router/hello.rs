//! What a HELLO means, as one decision every driver applies the same way
//! (quinn-proto's `Endpoint::handle` returning a `DatagramEvent`).
//!
//! [`Router::handle_hello`](super::Router::handle_hello) decides; the
//! result is a [`HelloDecision`]: the steps, in order, that the sessions
//! involved must take — refuse the path, let it go, end a session its peer
//! replaced, install the new one, hand it the HELLO — and what the path
//! belongs to afterwards. [`HelloDecision::apply`] runs those steps on
//! the driver's sessions through [`SessionTable`]; a driver supplies only
//! access to its sessions (behind whatever locks it keeps) and its own
//! bookkeeping of which transport sits under which session. No driver
//! re-derives a step, so the simulator tests exactly what a shell runs.
//!
//! What this does not do: decide (that is [`handshake`](crate::handshake)
//! and the router's tables) or hold sessions (the driver does).

use crate::error::PathError;
use crate::event::SessionEndReason;
use crate::ids::{PathId, SessionId};
use crate::session::Session;
use crate::time::Time;
use crate::wire::Hello;

/// One step of a [`HelloDecision`], on one session.
#[derive(Debug)]
#[non_exhaustive]
pub enum HelloStep {
    /// The session holding the path closes it with `error` (a CLOSE frame
    /// tells the peer why). The path is not handed anywhere else.
    Refuse {
        /// The session holding the path.
        session: SessionId,
        /// Why the HELLO was refused.
        error: PathError,
    },
    /// The path leaves this session without being closed: its transport
    /// carries on under the session the HELLO joins.
    Detach {
        /// The session giving up the path.
        session: SessionId,
    },
    /// The peer replaced this session (a restart, or a reset of its side):
    /// it gives up the path if it holds it, then ends — its outstanding
    /// messages and calls are reported, never replayed into the new one.
    Supersede {
        /// The session that ends.
        session: SessionId,
        /// Why it ends.
        reason: SessionEndReason,
    },
    /// The router opened a session for the HELLO: the driver now holds it.
    Install(Box<Session>),
    /// The session takes the HELLO: it binds to the peer's incarnation (on
    /// its first) and answers on the path, which it holds from now on.
    Hello {
        /// The session the path joins.
        session: SessionId,
    },
}

/// The router's complete answer to a HELLO on one path. Apply it with
/// [`HelloDecision::apply`]; dropping it unapplied leaves sessions and
/// the router out of step.
#[derive(Debug)]
#[must_use = "a HELLO decision does nothing until applied"]
pub struct HelloDecision {
    pub(crate) path: PathId,
    pub(crate) hello: Hello,
    pub(crate) steps: Vec<HelloStep>,
    /// The router's refusal, if it refused.
    pub(crate) refused: Option<PathError>,
}

/// A driver's sessions, as a [`HelloDecision`] needs them.
///
/// The simulator's endpoint implements it over a slot table; the tokio
/// shell over its session map, locking each session for the call and
/// driving it afterwards.
pub trait SessionTable {
    /// Runs `f` on session `id`. Returns `false` (and does not call `f`)
    /// when the driver no longer holds that session.
    fn with_session(&mut self, id: SessionId, f: &mut dyn FnMut(&mut Session)) -> bool;

    /// Takes a session the router opened (before it is handed anything).
    fn install(&mut self, session: Session);

    /// `path` left session `id` and carries on elsewhere: the driver moves
    /// its transport out of that session's books (called after the session
    /// let go of it).
    fn path_left(&mut self, id: SessionId, path: PathId) {
        let _ = (id, path);
    }

    /// `path` joins session `id`: the driver files its transport there
    /// (called before the session takes the HELLO, so the session's first
    /// output for the path finds it).
    fn path_joined(&mut self, id: SessionId, path: PathId) {
        let _ = (id, path);
    }
}

impl HelloDecision {
    /// The path the HELLO arrived on.
    pub fn path(&self) -> PathId {
        self.path
    }

    /// The HELLO.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// The steps, in the order [`HelloDecision::apply`] takes them.
    pub fn steps(&self) -> &[HelloStep] {
        &self.steps
    }

    /// The refusal, when the router refused the HELLO.
    pub fn refused(&self) -> Option<&PathError> {
        self.refused.as_ref()
    }

    /// Takes every step on `table`'s sessions, in order, and returns the
    /// session that holds the path now — or why the path is being closed
    /// (an unbound path the router closes itself; a bound one its session
    /// closes in the [`HelloStep::Refuse`] step). `network`: the network
    /// the driver knows the path runs on, given to the session it joins.
    pub fn apply(
        self,
        now: Time,
        network: Option<u8>,
        table: &mut impl SessionTable,
    ) -> Result<SessionId, PathError> {
        let HelloDecision {
            path,
            hello,
            steps,
            refused,
        } = self;
        let mut result = refused.map_or(Err(PathError::UnknownPath(path)), Err);
        for step in steps {
            match step {
                HelloStep::Refuse { session, error } => {
                    table.with_session(session, &mut |s| s.refuse_path(now, path, error.clone()));
                }
                HelloStep::Detach { session } => {
                    if table.with_session(session, &mut |s| s.detach_path(path)) {
                        table.path_left(session, path);
                    }
                }
                HelloStep::Supersede { session, reason } => {
                    let found = table.with_session(session, &mut |s| {
                        s.detach_path(path);
                        s.supersede(now, reason.clone());
                    });
                    if found {
                        table.path_left(session, path);
                    }
                }
                HelloStep::Install(s) => table.install(*s),
                HelloStep::Hello { session } => {
                    table.path_joined(session, path);
                    let mut r = Err(PathError::UnknownPath(path));
                    table.with_session(session, &mut |s| {
                        r = s.handle_hello(now, path, &hello).map(|()| session);
                        if let Some(n) = network {
                            s.set_path_network(path, n);
                        }
                    });
                    result = r;
                }
            }
        }
        result
    }
}
