//! Call round trips as a lock-free log-linear histogram: 16 buckets per
//! power of two (every value within 1/16 of its bucket's bounds) from
//! 1 µs to 2^32 µs (71 minutes), one atomic add per value. Quantiles are
//! read from a snapshot of the counts; they are the bucket's upper bound,
//! so a reported p99 is never below the true one and at most 1/16 above.
//!
//! Why not a general histogram crate: this is on the call path of every
//! caller thread at once, where a lock per value was measurable, and the
//! counters need nothing but quantiles and a maximum.

// Bucket indices are below `BUCKETS` (464) and ranks below the count:
// the casts below cannot truncate.
#![allow(clippy::cast_possible_truncation)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Sub-buckets per power of two (a power of two itself).
const SUB: u64 = 16;
const SUB_BITS: u32 = SUB.trailing_zeros();
/// Largest power of two kept apart (values beyond share the last bucket).
const MAX_EXP: u32 = 32;
/// Values below `SUB` have a bucket each; then `SUB` per power of two.
const BUCKETS: usize = (SUB + (MAX_EXP as u64 - SUB_BITS as u64) * SUB) as usize;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Histogram {
    counts: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    if e >= MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
    (SUB + u64::from(e - SUB_BITS) * SUB + sub) as usize
}

/// The largest value bucket `i` holds.
fn upper(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let e = (i - SUB) / SUB + u64::from(SUB_BITS);
    let sub = (i - SUB) % SUB;
    ((SUB + sub + 1) << (e - u64::from(SUB_BITS))) - 1
}

impl Histogram {
    /// Counts one value.
    pub(crate) fn record(&self, v: u64) {
        self.counts[bucket(v)].fetch_add(1, Relaxed);
        self.max.fetch_max(v, Relaxed);
    }

    /// The counts now, to take quantiles of what came after
    /// ([`Histogram::quantile_since`]).
    pub(crate) fn snapshot(&self) -> Vec<u64> {
        self.counts.iter().map(|c| c.load(Relaxed)).collect()
    }

    /// The value at quantile `q` of what was recorded between `before`
    /// and `after` (two snapshots); `None` when nothing was.
    pub(crate) fn quantile_since(before: &[u64], after: &[u64], q: f64) -> Option<u64> {
        let counts: Vec<u64> = after
            .iter()
            .zip(before)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(upper(i));
            }
        }
        None
    }

    /// The values at each quantile in `qs` (ascending, in 0..=1), and the
    /// maximum; zeros when nothing was recorded.
    pub(crate) fn quantiles<const N: usize>(&self, qs: [f64; N]) -> ([u64; N], u64) {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let max = self.max.load(Relaxed);
        let mut out = [0u64; N];
        if total == 0 {
            return (out, 0);
        }
        for (slot, q) in out.iter_mut().zip(qs) {
            // The rank of the quantile, 1-based: at least one value.
            let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    *slot = upper(i).min(max);
                    break;
                }
            }
        }
        (out, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_values_and_tile_the_range() {
        let mut last = 0;
        for i in 0..BUCKETS - 1 {
            let u = upper(i);
            assert!(i == 0 || u > last, "bucket {i} ends at {u}, after {last}");
            assert_eq!(bucket(u), i, "upper bound of {i}");
            assert_eq!(bucket(u + 1), i + 1, "first value after {i}");
            last = u;
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_a_sixteenth_above_the_true_ones() {
        let h = Histogram::default();
        // A skewed sample: 1..=10_000 µs, and a tail to 2 s.
        let mut vals: Vec<u64> = (1..=10_000).collect();
        vals.extend((1..=100).map(|k| k * 20_000));
        for &v in &vals {
            h.record(v);
        }
        vals.sort_unstable();
        let qs = [0.5, 0.9, 0.99, 0.999];
        let (got, max) = h.quantiles(qs);
        assert_eq!(max, 2_000_000);
        for (q, g) in qs.iter().zip(got) {
            let rank = ((q * vals.len() as f64).ceil() as usize).max(1);
            let truth = vals[rank - 1];
            assert!(g >= truth, "q{q}: {g} below the true {truth}");
            assert!(
                g <= truth + truth / 16 + 1,
                "q{q}: {g} too far above {truth}"
            );
        }
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(Histogram::default().quantiles([0.5]), ([0], 0));
    }
}
