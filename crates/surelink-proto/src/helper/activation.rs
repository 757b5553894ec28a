//! When a client goes through a helper and when it goes back direct
//! (PostMan's activation, L190–193), as a state machine fed once per
//! window with the client's own p99: above the SLA for `windows_above`
//! windows in a row, it moves to the least loaded of `choices` helpers
//! drawn at random; helped, below `release` (under the SLA) for
//! `windows_below` windows in a row, it goes direct again.
//!
//! No flapping: the two thresholds are apart, both need windows in a
//! row, and a client that has to be helped again within `dwell` of going
//! direct doubles its next dwell (up to `max_dwell`) — it stays helped
//! longer before it tries direct again — so switches per minute are
//! bounded whatever the load does. The shell supplies the randomness and
//! the helpers' loads; this decides.

use std::time::Duration;

use crate::config::ConfigError;
use crate::time::Time;

/// Activation's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActivationConfig {
    /// How often the client's p99 is taken (over the calls that ended in
    /// the window).
    pub window: Duration,
    /// The p99 a client wants; above it for `windows_above` windows it
    /// goes through a helper.
    pub sla: Duration,
    /// Helped, a p99 below this for `windows_below` windows in a row
    /// sends it direct again (must be below `sla`).
    pub release: Duration,
    /// Windows in a row above the SLA before moving to a helper.
    pub windows_above: u32,
    /// Windows in a row below `release` before going direct again.
    pub windows_below: u32,
    /// Helpers drawn at random per move (PostMan's d; 2 is the power of
    /// two choices).
    pub choices: usize,
    /// Least time helped before going direct again; doubled each time
    /// the client had to come back within it.
    pub dwell: Duration,
    /// The dwell's ceiling.
    pub max_dwell: Duration,
}

impl Default for ActivationConfig {
    fn default() -> Self {
        ActivationConfig {
            // Short windows: a client decides within about 0.2 s of its
            // p99 crossing the SLA (two windows in a row that held calls),
            // so that moving completes within PostMan's 550 ms (L230–239);
            // going back takes 5 s below release.
            window: Duration::from_millis(100),
            sla: Duration::from_millis(2),
            release: Duration::from_millis(1),
            windows_above: 2,
            windows_below: 50,
            choices: 2,
            dwell: Duration::from_secs(5),
            max_dwell: Duration::from_secs(80),
        }
    }
}

impl ActivationConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let zero = |field| Err(ConfigError::Zero { field });
        if self.sla.is_zero() {
            return zero("sla");
        }
        if self.window.is_zero() {
            return zero("window");
        }
        if self.windows_above == 0 {
            return zero("windows_above");
        }
        if self.windows_below == 0 {
            return zero("windows_below");
        }
        if self.choices == 0 {
            return zero("choices");
        }
        if self.release >= self.sla {
            return Err(ConfigError::Inconsistent {
                field: "sla",
                value: us(self.sla),
                other: "release",
                other_value: us(self.release),
                why: "the gap between going through a helper and going back is the hysteresis (µs)",
            });
        }
        if self.max_dwell < self.dwell {
            return Err(ConfigError::Inconsistent {
                field: "max_dwell",
                value: us(self.max_dwell),
                other: "dwell",
                other_value: us(self.dwell),
                why: "the dwell doubles up to its ceiling (µs)",
            });
        }
        Ok(())
    }
}

/// What to do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Go through the helper at this index (of the list the shell gave).
    UseHelper(usize),
    /// Go direct again.
    GoDirect,
}

/// Where the client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationState {
    /// Direct.
    Direct,
    /// Through the helper at this index, since the time given.
    Helped(usize, Time),
}

/// The activation state of one client towards one server.
#[derive(Clone, Debug)]
pub struct Activation {
    cfg: ActivationConfig,
    state: ActivationState,
    above: u32,
    below: u32,
    dwell: Duration,
    /// When it last went direct.
    direct_since: Option<Time>,
    switches: u64,
    /// Moves due in a row that no drawn helper's load answer reached.
    unanswered: u32,
}

impl Activation {
    /// Direct, with nothing seen yet.
    pub fn new(cfg: ActivationConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let dwell = cfg.dwell;
        Ok(Activation {
            cfg,
            state: ActivationState::Direct,
            above: 0,
            below: 0,
            dwell,
            direct_since: None,
            switches: 0,
            unanswered: 0,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ActivationConfig {
        &self.cfg
    }

    /// Where the client is.
    pub fn state(&self) -> ActivationState {
        self.state
    }

    /// Moves so far (each way counts one).
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// The current dwell.
    pub fn dwell(&self) -> Duration {
        self.dwell
    }

    /// One window ended at `now` with the client's p99 (`None`: no call
    /// finished in it). `draw` gives `choices` helper indices at random
    /// (the shell's randomness) and `load` each one's load (lower is
    /// better; `None`: it did not answer, and is not chosen).
    pub fn handle_window(
        &mut self,
        now: Time,
        p99: Option<Duration>,
        draw: impl FnOnce(usize) -> Vec<usize>,
        load: impl Fn(usize) -> Option<u64>,
    ) -> Option<Decision> {
        let Some(p99) = p99 else {
            // Nothing measured says nothing: keep the counts as they are.
            return None;
        };
        match self.state {
            ActivationState::Direct => {
                self.above = if p99 > self.cfg.sla {
                    self.above + 1
                } else {
                    0
                };
                if self.above < self.cfg.windows_above {
                    return None;
                }
                // Equal loads go to the first drawn, not the lowest index:
                // clients that decide in the same window all read the
                // same loads (all 0 before anyone moved), and a tie broken
                // by index sent every one of them to helper 0.
                let drawn = draw(self.cfg.choices);
                let answered = drawn
                    .iter()
                    .enumerate()
                    .filter_map(|(k, &i)| load(i).map(|l| (l, k, i)))
                    .min()
                    .map(|(_, _, i)| i);
                let best = match answered {
                    Some(i) => i,
                    None => {
                        // No drawn helper answered its load query. Once is
                        // a dead or frozen helper: draw again. Twice in a
                        // row is more likely our own core or network too
                        // loaded to hear answers in time — the state in
                        // which moving matters most (500 clients on one
                        // core never heard one): the first drawn, unweighed.
                        // A dead one is left once its path stays down.
                        self.unanswered += 1;
                        if self.unanswered < 2 {
                            return None;
                        }
                        *drawn.first()?
                    }
                };
                self.unanswered = 0;
                self.above = 0;
                if self
                    .direct_since
                    .is_some_and(|t| now.saturating_since(t) < self.dwell)
                {
                    // Back within the dwell: stay helped longer next time.
                    self.dwell = (self.dwell * 2).min(self.cfg.max_dwell);
                }
                self.state = ActivationState::Helped(best, now);
                self.switches += 1;
                Some(Decision::UseHelper(best))
            }
            ActivationState::Helped(_, since) => {
                self.below = if p99 < self.cfg.release {
                    self.below + 1
                } else {
                    0
                };
                if self.below < self.cfg.windows_below || now.saturating_since(since) < self.dwell {
                    return None;
                }
                self.below = 0;
                self.state = ActivationState::Direct;
                self.direct_since = Some(now);
                self.switches += 1;
                Some(Decision::GoDirect)
            }
        }
    }
}

impl Activation {
    /// The helper in use is gone (its path stayed down): the client goes
    /// direct at once — before the dwell, which is for leaving by choice,
    /// and without doubling the next dwell when it soon needs a helper
    /// again; windows above the SLA then draw helpers anew (one that
    /// does not answer its load query is not chosen).
    pub fn handle_helper_lost(&mut self) -> Option<Decision> {
        if matches!(self.state, ActivationState::Direct) {
            return None;
        }
        self.state = ActivationState::Direct;
        self.above = 0;
        self.below = 0;
        self.direct_since = None;
        self.switches += 1;
        Some(Decision::GoDirect)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn act() -> Activation {
        Activation::new(ActivationConfig {
            window: Duration::from_secs(1),
            sla: ms(2),
            release: ms(1),
            windows_above: 2,
            windows_below: 3,
            choices: 2,
            dwell: Duration::from_secs(5),
            max_dwell: Duration::from_secs(40),
        })
        .unwrap()
    }

    fn at(s: u64) -> Time {
        Time::from_millis(s * 1000)
    }

    #[test]
    fn a_lost_helper_sends_it_direct_at_once_and_a_helper_is_drawn_again() {
        let mut a = act();
        let slow = Some(ms(5));
        assert_eq!(
            a.handle_window(at(1), slow, |_| vec![0, 1], |_| Some(1)),
            None
        );
        assert_eq!(
            a.handle_window(at(2), slow, |_| vec![0, 1], |i| Some(i as u64)),
            Some(Decision::UseHelper(0))
        );
        // Within the dwell, still slow: lost helper, direct at once.
        assert_eq!(a.handle_helper_lost(), Some(Decision::GoDirect));
        assert_eq!(a.state(), ActivationState::Direct);
        assert_eq!(a.handle_helper_lost(), None);
        // Helper 0 no longer answers: helper 1 after two windows, and
        // the dwell was not doubled by the quick return.
        assert_eq!(
            a.handle_window(at(3), slow, |_| vec![0, 1], |i| (i == 1).then_some(7)),
            None
        );
        assert_eq!(
            a.handle_window(at(4), slow, |_| vec![0, 1], |i| (i == 1).then_some(7)),
            Some(Decision::UseHelper(1))
        );
        assert_eq!(a.dwell(), Duration::from_secs(5));
        assert_eq!(a.switches(), 3);
    }

    #[test]
    fn moves_to_the_least_loaded_of_the_drawn_after_windows_above() {
        let mut a = act();
        let loads = [50u64, 10, 30];
        let draw = |_| vec![0, 2];
        assert_eq!(
            a.handle_window(at(1), Some(ms(3)), draw, |i| Some(loads[i])),
            None
        );
        // A window below resets the count.
        assert_eq!(
            a.handle_window(at(2), Some(ms(1)), draw, |i| Some(loads[i])),
            None
        );
        assert_eq!(
            a.handle_window(at(3), Some(ms(3)), draw, |i| Some(loads[i])),
            None
        );
        // Helper 1 is lighter but not drawn: the lighter of 0 and 2.
        assert_eq!(
            a.handle_window(at(4), Some(ms(3)), draw, |i| Some(loads[i])),
            Some(Decision::UseHelper(2))
        );
        assert_eq!(a.state(), ActivationState::Helped(2, at(4)));
    }

    #[test]
    fn equal_loads_go_to_the_first_drawn() {
        for order in [vec![0, 1], vec![1, 0], vec![2, 0, 1]] {
            let mut a = act();
            let first = order[0];
            a.handle_window(at(1), Some(ms(3)), |_| order.clone(), |_| Some(0));
            assert_eq!(
                a.handle_window(at(2), Some(ms(3)), |_| order.clone(), |_| Some(0)),
                Some(Decision::UseHelper(first))
            );
        }
    }

    #[test]
    fn a_helper_that_does_not_answer_is_not_chosen() {
        let mut a = act();
        let draw = |_| vec![0, 1];
        a.handle_window(at(1), Some(ms(3)), draw, |_| None);
        assert_eq!(a.handle_window(at(2), Some(ms(3)), draw, |_| None), None);
        assert_eq!(a.state(), ActivationState::Direct);
        assert_eq!(
            a.handle_window(at(3), Some(ms(3)), draw, |i| (i == 1).then_some(7)),
            Some(Decision::UseHelper(1))
        );
    }

    /// No load answer at two moves due in a row (our own core too loaded
    /// to hear them): the first drawn, unweighed; one answer resets that.
    #[test]
    fn no_answer_twice_in_a_row_takes_the_first_drawn() {
        let mut a = act();
        let draw = |_| vec![1, 0];
        a.handle_window(at(1), Some(ms(3)), draw, |_| None);
        assert_eq!(
            a.handle_window(at(2), Some(ms(3)), draw, |_| None),
            None,
            "the first move due without answers waits"
        );
        assert_eq!(
            a.handle_window(at(3), Some(ms(3)), draw, |_| None),
            Some(Decision::UseHelper(1))
        );
        // Back direct (the helper lost); a due move with answers resets
        // the count, so one unanswered due move afterwards waits again.
        a.handle_helper_lost();
        a.handle_window(at(5), Some(ms(3)), draw, |_| None);
        assert_eq!(
            a.handle_window(at(6), Some(ms(3)), draw, |_| None),
            None,
            "the count restarted after the move"
        );
    }

    #[test]
    fn goes_direct_after_windows_below_release_and_the_dwell() {
        let mut a = act();
        let one = |_| vec![0];
        a.handle_window(at(0), Some(ms(3)), one, |_| Some(0));
        a.handle_window(at(1), Some(ms(3)), one, |_| Some(0));
        assert!(matches!(a.state(), ActivationState::Helped(0, _)));
        // Between release and SLA: stays.
        for s in 2..10 {
            assert_eq!(
                a.handle_window(at(s), Some(ms(1) + ms(1) / 2), one, |_| Some(0)),
                None
            );
        }
        // Below release: three windows, and past the 5 s dwell.
        assert_eq!(a.handle_window(at(10), Some(ms(0)), one, |_| Some(0)), None);
        assert_eq!(a.handle_window(at(11), Some(ms(0)), one, |_| Some(0)), None);
        assert_eq!(
            a.handle_window(at(12), Some(ms(0)), one, |_| Some(0)),
            Some(Decision::GoDirect)
        );
    }

    #[test]
    fn coming_back_within_the_dwell_doubles_it() {
        let mut a = act();
        let one = |_| vec![0];
        let mut t = 0;
        let mut w = |a: &mut Activation, p: u64| {
            t += 1;
            a.handle_window(at(t), Some(ms(p)), one, |_| Some(0))
        };
        w(&mut a, 3);
        assert_eq!(w(&mut a, 3), Some(Decision::UseHelper(0)));
        for _ in 0..5 {
            w(&mut a, 0);
        }
        assert_eq!(a.state(), ActivationState::Direct);
        w(&mut a, 3);
        assert_eq!(w(&mut a, 3), Some(Decision::UseHelper(0)));
        assert_eq!(a.dwell(), Duration::from_secs(10));
    }

    proptest! {
        /// Whatever the p99s, switches are bounded by the dwell: at most
        /// two (there and back) per `dwell` of time, plus one.
        #[test]
        fn switches_are_bounded_by_the_dwell(p99s in proptest::collection::vec(0u64..5, 1..600)) {
            let mut a = act();
            for (s, p) in p99s.iter().enumerate() {
                a.handle_window(at(s as u64), Some(ms(*p)), |_| vec![0, 1], |i| Some(i as u64));
            }
            let secs = p99s.len() as u64;
            prop_assert!(a.switches() <= 2 * (secs / 5) + 1, "{} switches in {} s", a.switches(), secs);
        }
    }
}
