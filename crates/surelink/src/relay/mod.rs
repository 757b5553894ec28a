//! Helpers (PostMan, issue 28; docs/postman.md): a helper carries many
//! clients' connections to this server as *virtual connections* — each
//! client's byte stream in records of the helper's own session (see
//! `surelink_proto::helper::Record`). Here:
//!
//! - the server's side (this file, `link.rs`, `slot.rs`): relay messages
//!   from a configured helper are taken off the application's channel,
//!   their records applied through the core's `SlotTable`, and each
//!   opened slot becomes a connection that the handshake and the router
//!   take like any accepted one — the client authenticates end to end,
//!   the helper holds no key of the session and cannot read or forge it;
//! - the client's side (`client.rs`): a path to a server through a helper;
//! - the helper itself (`helper.rs`).
//!
//! - activation (`activate.rs`): a client's own p99 against an SLA moves
//!   it to the least loaded of a few helpers drawn at random and back
//!   direct (the core's `Activation` decides).
//!
//! Helpers' loads: a helper reports its address and load level to the
//! role service with its status reports, and every node's row lists the
//! helpers that reported lately (`surelink_proto::role::HelperEntry`); a
//! client without such a row asks the helpers it drew.

mod activate;
mod client;
mod helper;
mod link;
mod slot;

use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::{debug, warn};

use surelink_proto::helper::{decode_records, Record, SlotAction, SlotError};
use surelink_proto::wire::CloseCode;
use surelink_proto::NodeId;

pub use activate::{Helped, HelpedStatus};
pub use client::RelayPath;
pub use helper::{Helper, HelperError, HelperStats};
pub(crate) use link::RelayLink;
pub(crate) use slot::{SlotEnd, SlotStream};

use crate::events::NetEvent;
use crate::shared::Shared;

/// The network index the core's path policy gives paths through a
/// helper (the last of the 8 it knows): activation steers a server's
/// traffic onto them by avoiding the direct networks.
pub(crate) const RELAY_NETWORK: u8 = 7;

/// The server's relays: one per helper that opened slots here.
#[derive(Debug)]
pub(crate) struct Relays {
    helpers: FxHashSet<NodeId>,
    pub(crate) channel: u16,
    max_slots: usize,
    links: Mutex<FxHashMap<NodeId, Arc<RelayLink>>>,
}

impl Relays {
    /// `None` when no helper is configured (relay messages are then the
    /// application's, like any other).
    pub(crate) fn new(helpers: &[NodeId], channel: u16, max_slots: usize) -> Option<Relays> {
        (!helpers.is_empty()).then(|| Relays {
            helpers: helpers.iter().copied().collect(),
            channel,
            max_slots,
            links: Mutex::new(FxHashMap::default()),
        })
    }

    /// Whether a message from `peer` on `channel` is relay traffic.
    pub(crate) fn takes(&self, peer: NodeId, channel: u16) -> bool {
        channel == self.channel && self.helpers.contains(&peer)
    }

    fn link(&self, helper: NodeId, started: &mut Started) -> Arc<RelayLink> {
        let mut links = self.links.lock();
        if let Some(l) = links.get(&helper) {
            if !l.is_ended() {
                return l.clone();
            }
        }
        let l = RelayLink::new(helper, self.max_slots);
        links.insert(helper, l.clone());
        started.links.push(l.clone());
        l
    }

    /// One relay message from `helper`: its records, applied in order.
    /// Runs under the helper's session lock, so relay messages are
    /// applied in the order the core delivered them (a slot's bytes stay
    /// in order); what must start outside it goes in `started`.
    pub(crate) fn deliver(
        &self,
        shared: &Shared,
        helper: NodeId,
        payload: Bytes,
        started: &mut Started,
    ) {
        let records = match decode_records(payload) {
            Ok(r) => r,
            Err(e) => {
                shared.stats.refused_input();
                warn!(%helper, error = %e, "refused a relay message from a helper; ending its relay");
                self.helper_down(helper);
                return;
            }
        };
        let link = self.link(helper, started);
        for r in records {
            let mut made = None;
            let action = {
                let mut t = link.slots.lock();
                match t.apply(&r, |slot| {
                    let e = SlotEnd::new(slot, link.clone());
                    made = Some(e.clone());
                    e
                }) {
                    Ok(SlotAction::Opened) => Ok(None),
                    Ok(SlotAction::Data(e)) => Ok(Some((e.clone(), true))),
                    Ok(SlotAction::Closed(e)) => Ok(Some((e, false))),
                    Err(e) => Err(e),
                }
            };
            match (action, r) {
                (Ok(None), _) => started.slots.extend(made),
                (Ok(Some((e, true))), Record::Data { body, .. }) => {
                    if !e.push(body) {
                        debug!(%helper, slot = e.slot, "a slot's unread bytes passed their bound; closing it");
                        e.close(CloseCode::LIMIT.0);
                    } else if e.wants_drain() {
                        started.drains.push(e);
                    }
                }
                (Ok(Some((e, _))), _) => e.end_inbound(),
                // A CLOSE or DATA crossing our own CLOSE.
                (Err(SlotError::NotOpen(_)), _) => {}
                (Err(SlotError::Full { max }), Record::Open { slot }) => {
                    debug!(%helper, slot, max, "helper's slot table full; slot refused");
                    link.close_slot(slot, CloseCode::LIMIT.0);
                }
                (Err(e), _) => {
                    shared.stats.refused_input();
                    warn!(%helper, error = %e, "refused a relay record from a helper");
                }
            }
        }
    }

    /// `helper` is gone: its slots end, so their sessions fail over.
    pub(crate) fn helper_down(&self, helper: NodeId) {
        if let Some(l) = self.links.lock().remove(&helper) {
            debug!(%helper, slots = l.slots.lock().len(), "helper gone; ending its relay");
            l.end();
        }
    }
}

/// Relays and slots opened while a session's lock was held: their tasks
/// start after it ([`Started::start`]).
#[derive(Debug, Default)]
pub(crate) struct Started {
    links: Vec<Arc<RelayLink>>,
    slots: Vec<Arc<SlotEnd>>,
    /// Running slots that were brought bytes: fed after the lock, here.
    drains: Vec<Arc<SlotEnd>>,
}

impl Started {
    pub(crate) fn is_empty(&self) -> bool {
        self.links.is_empty() && self.slots.is_empty() && self.drains.is_empty()
    }

    /// Starts each new relay's sender and each new slot's handshake, and
    /// feeds the running slots their bytes (in this task: one relay
    /// message's clients without a task hand-off each).
    pub(crate) fn start(self, shared: &Arc<Shared>) {
        for e in self.drains {
            e.drain();
        }
        let channel = shared.relays.as_ref().map_or(0, |r| r.channel);
        for l in self.links {
            shared.spawn(link::flush_loop(Arc::downgrade(shared), l, channel));
        }
        for e in self.slots {
            shared.spawn(accepted(shared.clone(), e));
        }
    }
}

/// Watches the endpoint's events: a helper found dead or unreachable
/// ends its relay at once (its clients' sessions then use their other
/// paths; the helper's own session may linger, its slots do not).
pub(crate) async fn watch_helpers(shared: Weak<Shared>, mut events: crate::Events) {
    loop {
        let e = match events.recv().await {
            Ok(e) => e,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(_) => return,
        };
        let peer = match e {
            NetEvent::PeerDead { peer }
            | NetEvent::PeerUnreachable { peer }
            | NetEvent::PeerRefused { peer }
            | NetEvent::SessionEnded { peer, .. } => peer,
            _ => continue,
        };
        let Some(sh) = shared.upgrade() else { return };
        if let Some(r) = &sh.relays {
            r.helper_down(peer);
        }
    }
}

/// A slot a helper opened: authenticate it end to end (unless insecure),
/// then start it as a connection the router binds by its HELLO.
async fn accepted(shared: Arc<Shared>, end: Arc<SlotEnd>) {
    let secured = match &shared.secure {
        None => None,
        Some(setup) => {
            // A helper carries anyone's connection: the handshakes it can
            // make us run at once are bounded like strangers' are
            // (`max_handshaking`), per helper.
            let link = end.link().clone();
            let busy = link
                .handshaking
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            if busy >= shared.config.max_handshaking {
                link.handshaking
                    .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                shared.stats.refused_input();
                debug!(helper = %link.helper, slot = end.slot, "a helper's slots in their handshake are at max_handshaking; slot closed");
                end.close(CloseCode::LIMIT.0);
                return;
            }
            let timeout = shared.config.core.handshake_timeout;
            let mut s = SlotStream(end.clone());
            let r = crate::secure::handshake(setup, &mut s, None, timeout).await;
            link.handshaking
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
            match r {
                Ok(s) => Some(s),
                Err(e) => {
                    shared.stats.handshake_failed();
                    debug!(slot = end.slot, error = %e, "handshake through a helper failed; slot closed");
                    end.close(0);
                    return;
                }
            }
        }
    };
    if shared.closed.load(std::sync::atomic::Ordering::Relaxed) {
        end.close(0);
        return;
    }
    if let Err(e) = crate::conn::start(
        &shared,
        crate::conn::Transport::Relay(end.clone()),
        0,
        None,
        secured,
        None,
    ) {
        debug!(slot = end.slot, error = %e, "relayed connection not started");
        end.close(0);
    }
}
