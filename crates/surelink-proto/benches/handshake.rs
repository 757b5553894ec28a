//! What one member handshake (Noise XX, the default) costs each end, in
//! memory: the CPU a server pays per connection it authenticates — per
//! client path, including each path a client opens through a helper
//! (docs/postman.md, "Activation"). The baseline in the same run is one
//! key pair generated (one X25519 base-point multiplication): a Noise XX
//! handshake does four such operations at each end, plus its hashing.
//!
//! `cargo bench -p surelink-proto --bench handshake`

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion};
use surelink_proto::secure::{Handshake, Keypair, Members, Protection};
use surelink_proto::{ClusterId, NodeId};

/// Both ends of one handshake, run to completion.
fn handshake(a: &Keypair, b: &Keypair, members: &Arc<Members>) {
    let cluster = ClusterId(7);
    let mut i =
        Handshake::initiator(a, members.clone(), cluster, Protection::Encrypt, NodeId(2)).unwrap();
    let mut r = Handshake::responder(b, members.clone(), cluster, Protection::Encrypt).unwrap();
    let (mut to_r, mut to_i) = (BytesMut::new(), BytesMut::new());
    let (mut ie, mut re) = (None, None);
    while ie.is_none() || re.is_none() {
        i.poll_transmit(&mut to_r);
        if re.is_none() {
            re = r.handle_input(&mut to_r).unwrap();
        }
        r.poll_transmit(&mut to_i);
        if ie.is_none() {
            ie = i.handle_input(&mut to_i).unwrap();
        }
    }
    black_box((ie, re));
}

fn bench(c: &mut Criterion) {
    let (a, b) = (Keypair::generate().unwrap(), Keypair::generate().unwrap());
    let mut m = Members::new();
    m.insert(NodeId(1), a.public()).unwrap();
    m.insert(NodeId(2), b.public()).unwrap();
    let members = Arc::new(m);
    let mut g = c.benchmark_group("member_handshake");
    g.bench_function("noise_xx_both_ends", |bch| {
        bch.iter(|| handshake(&a, &b, &members));
    });
    g.bench_function("keypair_generate_baseline", |bch| {
        bch.iter(|| black_box(Keypair::generate().unwrap()));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
