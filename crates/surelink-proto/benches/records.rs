//! The record layer alone, no IO: bytes per second through a [`Sealer`]
//! and the matching [`Opener`] on one thread, as the shell uses them — 4 KiB
//! messages (each a separate `Bytes`, as the core's gather list hands them
//! over) sealed 256 KiB per round into 64 KiB records, then opened in place.
//!
//! Baseline in the same run, `copy_only`: the same bytes copied once into
//! one buffer and handed over, the least any layer that touches every byte
//! costs. The ratio to it is what authentication (and encryption) add per
//! byte; set against the insecure endpoint's whole cost per byte in
//! `surelink-lab bench` it bounds what authentication can cost there (see
//! docs/security.md).
//!
//! Run: `cargo bench -p surelink-proto --bench records`

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use surelink_proto::secure::{Opener, Protection, Sealer};

/// Bytes sealed per round (the shell's `SEAL_BATCH`).
const ROUND: usize = 256 * 1024;
const MESSAGE: usize = 4096;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("records");
    g.throughput(Throughput::Bytes(ROUND as u64));
    let pieces: Vec<Bytes> = (0..ROUND / MESSAGE)
        .map(|i| Bytes::from(vec![i as u8; MESSAGE]))
        .collect();
    g.bench_function("copy_only", |b| {
        b.iter(|| {
            let mut out = BytesMut::with_capacity(ROUND);
            for p in &pieces {
                out.extend_from_slice(p);
            }
            black_box(out.freeze())
        });
    });
    for (name, p) in [
        ("seal_open_encrypt", Protection::Encrypt),
        ("seal_open_integrity_only", Protection::IntegrityOnly),
    ] {
        let mut sealer = Sealer::new(&[7; 32], p);
        let mut opener = Opener::new(&[7; 32], p);
        g.bench_function(name, |b| {
            b.iter(|| {
                let sealed = sealer.seal_to_bytes(pieces.iter().map(|b| &b[..])).unwrap();
                let mut raw = BytesMut::from(sealed);
                let mut n = 0;
                while let Some(rec) = opener.open_record(&mut raw).unwrap() {
                    n += rec.len();
                }
                assert_eq!(n, ROUND);
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
