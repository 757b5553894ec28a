//! The session's task: its timers (acknowledgements, re-sends, call
//! deadlines, linger) and the deferred writes of a busy session, until it
//! ended and has nothing left to write. Inputs go through
//! [`SessionHandle::with`] like every other.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use surelink_proto::Time;

use super::{SessionHandle, FLUSH_BATCH};
use crate::shared::Shared;

/// Longest the session's task sleeps while the core has any deadline
/// (it then looks again): a new deadline later than where the task sleeps
/// needs no wake-up call from the data path. The tick starts at the
/// acknowledgement delay — every message received sets an ack deadline
/// that far ahead, so on a busy session those never wake the task (a
/// wake-up per message otherwise). It stays there while the session
/// writes, and doubles on each wake-up that finds neither a deadline due
/// nor a write since the last one, up to this bound: a session that only
/// waits (a long call) costs a wake-up a second. (Letting a busy session's
/// tick grow would make every new ack deadline a wake-up call from the data
/// path — a second task scheduled beside the one the data path wakes,
/// which makes tokio unpark another worker and hand every later message
/// across threads.)
const TIMER_TICK_MAX: Duration = Duration::from_secs(1);
/// Most times a flush yields to let senders add to it.
const MAX_FLUSH_YIELDS: usize = 32;

/// Runs the session's timers and deferred writes (see the module docs).
pub(crate) async fn run_session(shared: Arc<Shared>, h: Arc<SessionHandle>) {
    let tick_min = shared
        .config
        .core
        .max_ack_delay
        .max(Duration::from_millis(1));
    let mut tick = tick_min;
    let mut seen_tx = h.last_tx.load(Ordering::Relaxed);
    // One timer for the task's life, reset when the wanted deadline
    // changes. A fresh sleep per turn of this loop (it turns at every
    // flush) registered a new timer each time, and one set ahead of the
    // runtime's next wake-up makes tokio wake its driver (an eventfd write
    // and an extra poll). It follows the deadline later too: on a busy
    // session the ack deadline keeps moving (acks ride on replies), and a
    // timer left at a stale, earlier one fires every tick for nothing — a
    // cross-thread wake-up on a multi-worker runtime.
    let timer = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(timer);
    let mut timer_at: Option<Time> = None;
    loop {
        let notified = h.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut g = h.lock();
            if h.is_ended() && g.core.is_drained() {
                return;
            }
            let now = shared.clock.now();
            let want = g.core.poll_timeout().map(|t| t.min(now + tick));
            if want != timer_at {
                if let Some(t) = want {
                    timer.as_mut().reset(shared.clock.instant(t));
                }
                timer_at = want;
            }
            g.armed = timer_at;
        }
        let timer_armed = timer_at.is_some();
        tokio::select! {
            () = &mut timer, if timer_armed => {
                timer_at = None;
                shared.stats.timer_fires.fetch_add(1, Ordering::Relaxed);
                let due = h.with(&shared, |g, now| {
                    let due = g.core.poll_timeout().is_some_and(|d| d <= now);
                    if due {
                        g.core.handle_timeout(now);
                    }
                    due
                });
                let tx = h.last_tx.load(Ordering::Relaxed);
                if due || tx != seen_tx {
                    tick = tick_min;
                } else {
                    tick = (tick * 2).min(TIMER_TICK_MAX);
                }
                seen_tx = tx;
                h.space.notify_waiters();
            }
            () = &mut notified => {
                if !h.flush_scheduled.load(Ordering::Acquire) {
                    // Re-armed for an earlier deadline: the session is busy.
                    tick = tick_min;
                } else {
                    // Let senders add more first: yield while the queue
                    // grows (up to a write's worth), then write it all in
                    // one go. A message that queues alone is written after
                    // one yield.
                    let queued = || h.unflushed.load(Ordering::Relaxed) + h.stage.bytes_hint();
                    loop {
                        let mut before = queued();
                        for _ in 0..MAX_FLUSH_YIELDS {
                            tokio::task::yield_now().await;
                            let now = queued();
                            if now == before || now >= FLUSH_BATCH || now == 0 {
                                break;
                            }
                            before = now;
                        }
                        // Drains the send stage, which stays open meanwhile;
                        // closed (and the flush done) only if nothing was
                        // staged during the drive.
                        if !h.poke_drain(&shared) {
                            // Full: nothing more can leave until acks come.
                            h.stage.unschedule(&h.flush_scheduled);
                            break;
                        }
                        if h.stage.unschedule_if_empty(&h.flush_scheduled) {
                            break;
                        }
                    }
                }
            }
        }
    }
}
