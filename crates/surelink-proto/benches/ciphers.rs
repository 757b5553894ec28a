//! The record cipher, chosen by measurement: ring's three TLS 1.3 AEADs
//! — AES-256-GCM (today's record cipher), AES-128-GCM and
//! ChaCha20-Poly1305 — sealing and opening one record in place, at the
//! record sizes the data path makes: 64 B (a lone small message), 1 KiB,
//! 16 KiB and 64 KiB (`MAX_RECORD`, what a busy session seals).
//!
//! Baseline in the same run, `copy`: the record's bytes copied once, the
//! least any layer that touches every byte costs. Each case reports bytes
//! per second; per record time is criterion's time per iteration.
//!
//! ring's AES-GCM uses the CPU's AES-NI / VAES and CLMUL units where they
//! exist (this VM has them); ChaCha20-Poly1305 is the choice of machines
//! without them. All three are IETF-standard AEADs with 128-bit tags; the
//! nonce discipline (a per-direction counter, never sent) is the same for
//! each.
//!
//! Run: `cargo bench -p surelink-proto --bench ciphers`

#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ring::aead::{
    Aad, Algorithm, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM, CHACHA20_POLY1305,
};

/// Record bodies measured, bytes.
const SIZES: [usize; 4] = [64, 1024, 16 * 1024, 64 * 1024];

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_be_bytes());
    Nonce::assume_unique_for_key(b)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ciphers");
    for size in SIZES {
        g.throughput(Throughput::Bytes(size as u64));
        let body = vec![7u8; size];
        let hdr = (size as u32).to_be_bytes();
        g.bench_with_input(BenchmarkId::new("copy", size), &body, |b, body| {
            let mut out = vec![0u8; size];
            b.iter(|| {
                out.copy_from_slice(black_box(body));
                black_box(&out);
            });
        });
        let algs: [(&str, &'static Algorithm); 3] = [
            ("aes_256_gcm", &AES_256_GCM),
            ("aes_128_gcm", &AES_128_GCM),
            ("chacha20_poly1305", &CHACHA20_POLY1305),
        ];
        for (name, alg) in algs {
            let key = vec![9u8; alg.key_len()];
            let sealer = LessSafeKey::new(UnboundKey::new(alg, &key).unwrap());
            let opener = LessSafeKey::new(UnboundKey::new(alg, &key).unwrap());
            g.bench_with_input(
                BenchmarkId::new(format!("{name}_seal_open"), size),
                &body,
                |b, body| {
                    let mut buf = body.clone();
                    let mut n = 0u64;
                    b.iter(|| {
                        n += 1;
                        buf.copy_from_slice(body);
                        let tag = sealer
                            .seal_in_place_separate_tag(nonce(n), Aad::from(hdr), &mut buf)
                            .unwrap();
                        let plain = opener
                            .open_in_place_separate_tag(
                                nonce(n),
                                Aad::from(hdr),
                                tag,
                                &mut buf,
                                0..,
                            )
                            .unwrap();
                        black_box(plain.len());
                    });
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
