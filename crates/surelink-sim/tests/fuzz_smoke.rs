//! The fuzz targets (`surelink_sim::fuzz`) on stable, as CI runs them: each
//! over its seeds and seeded mutations of them (bit flips, truncations,
//! splices, random bytes). Not coverage-guided — `fuzz/` with cargo-fuzz
//! is — but it keeps every target exercised on every change. The seed is
//! printed; `FUZZ_SMOKE_SEED` and `FUZZ_SMOKE_RUNS` override it and the
//! number of inputs per target.

#![allow(clippy::unwrap_used)]

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use surelink_sim::fuzz::{seeds, TARGETS};

fn mutate(rng: &mut ChaCha8Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..rng.random_range(1..8) {
        match rng.random_range(0..6) {
            0 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v[i] = rng.random();
            }
            2 if !v.is_empty() => v.truncate(rng.random_range(0..v.len())),
            3 => {
                let i = rng.random_range(0..=v.len());
                let n = rng.random_range(0..64);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                v.splice(i..i, bytes);
            }
            4 if !other.is_empty() => {
                let i = rng.random_range(0..=v.len());
                let j = rng.random_range(0..other.len());
                v.splice(i..i, other[j..].iter().copied().take(256));
            }
            _ => {
                // Interesting integers at a random place (lengths, counts).
                if v.len() >= 4 {
                    let i = rng.random_range(0..v.len() - 3);
                    let x: u32 =
                        [0, 1, 0x7fff_ffff, u32::MAX, 65_535, 65_536][rng.random_range(0..6)];
                    v[i..i + 4].copy_from_slice(&x.to_be_bytes());
                }
            }
        }
    }
    v
}

#[test]
fn every_target_survives_mutations_of_its_seeds() {
    let seed: u64 = std::env::var("FUZZ_SMOKE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(1))
        });
    let runs: usize = std::env::var("FUZZ_SMOKE_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    eprintln!(
        "fuzz smoke: seed {seed} (rerun with FUZZ_SMOKE_SEED={seed}), {runs} inputs per target"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (name, target) in TARGETS {
        let s = seeds(name);
        for input in &s {
            target(input);
        }
        for _ in 0..runs {
            let base = &s[rng.random_range(0..s.len())];
            let other = &s[rng.random_range(0..s.len())];
            let input = mutate(&mut rng, base, other);
            target(&input);
        }
    }
}
