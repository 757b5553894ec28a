//! What one member handshake costs each end, in memory: the CPU a server
//! pays per connection it authenticates — per client path, including each
//! path a client opens through a helper (docs/postman.md, "Activation").
//! Two kinds: the full Noise XX handshake (a pair's first path), and a
//! further path resumed with the ticket it left (`secure::Dial`/`Accept`,
//! HMAC only). The baseline in the same run is one key pair generated (one
//! X25519 base-point multiplication): a Noise XX handshake does four such
//! operations at each end, plus its hashing.
//!
//! `cargo bench -p surelink-proto --bench handshake`

#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::Arc;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion};
use surelink_proto::secure::{
    Accept, Dial, Handshake, Keypair, Members, PathHandshake, Protection, Ticket, TicketLookup,
};
use surelink_proto::{ClusterId, NodeId};

const CLUSTER: ClusterId = ClusterId(7);
const P: Protection = Protection::Encrypt;

/// Both ends of one full handshake (the responder ready to accept a
/// ticket too, as the shell runs it), to completion; the ticket minted.
fn handshake(a: &Keypair, b: &Keypair, members: &Arc<Members>) -> Ticket {
    let i = PathHandshake::Noise(Box::new(
        Handshake::initiator(a, members.clone(), CLUSTER, P, NodeId(2)).unwrap(),
    ));
    let (ie, _) = run(i, accept(b, members, None));
    ie.ticket.unwrap()
}

fn accept(b: &Keypair, members: &Arc<Members>, known: Option<Ticket>) -> PathHandshake {
    let (b, members) = (b.clone(), members.clone());
    let noise = Box::new(move || Handshake::responder(&b, members, CLUSTER, P));
    let lookup: TicketLookup = Box::new(move |_| known.clone());
    PathHandshake::Accept(Box::new(Accept::new(noise, lookup, CLUSTER, P)))
}

/// Both ends of a path resumed with `ticket` (the responder's store holds
/// its twin: a lookup that finds it).
fn resume(a: &Keypair, b: &Keypair, members: &Arc<Members>, ticket: &Ticket, twin: &Ticket) {
    let (keys, m) = (a.clone(), members.clone());
    let i = PathHandshake::Dial(Box::new(
        Dial::new(
            ticket.clone(),
            CLUSTER,
            P,
            Box::new(move || Handshake::initiator(&keys, m, CLUSTER, P, NodeId(2))),
        )
        .unwrap(),
    ));
    let (ie, _) = run(i, accept(b, members, Some(twin.clone())));
    assert!(ie.ticket.is_none(), "resumed, not a full handshake");
}

fn run(
    mut i: PathHandshake,
    mut r: PathHandshake,
) -> (
    surelink_proto::secure::Established,
    surelink_proto::secure::Established,
) {
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
    black_box((ie.unwrap(), re.unwrap()))
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
    // The responder's twin of the dialler's ticket: the same id and secret,
    // naming the dialler (node 1).
    let twin = {
        let i = PathHandshake::Noise(Box::new(
            Handshake::initiator(&a, members.clone(), CLUSTER, P, NodeId(2)).unwrap(),
        ));
        let (ie, re) = run(i, accept(&b, &members, None));
        (ie.ticket.unwrap(), re.ticket.unwrap())
    };
    g.bench_function("resume_both_ends", |bch| {
        bch.iter(|| resume(&a, &b, &members, &twin.0, &twin.1));
    });
    g.bench_function("keypair_generate_baseline", |bch| {
        bch.iter(|| black_box(Keypair::generate().unwrap()));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
