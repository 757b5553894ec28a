//! Fuzz targets: each takes arbitrary bytes and must never panic, hang or
//! grow memory without bound, whatever the bytes. `fuzz/` (cargo-fuzz,
//! nightly) runs them coverage-guided; `tests/fuzz_smoke.rs` runs them on
//! stable over the seeds below and seeded mutations of them, in CI.
//!
//! The targets: the frame decoder, a session's input after a valid HELLO
//! (DATA, BATCH, ACK, RESUME, CLOSE ... with any values), the Noise
//! handshake on both sides, the mutual-TLS handshake on both sides (our
//! preamble and framing around rustls), the record layer, the
//! detector's datagrams, the role service's messages, and a helper's
//! relay records applied to a server's slot table. Keys and
//! certificates are fixed per process so a crash reproduces from its input.
//!
//! Endpoints are driven through the [`World`] fixture like every other
//! test. The handshake targets drive `secure::` initiator and responder
//! objects, not endpoints: they feed fuzz bytes to one side and need no
//! shuttle between two.

use std::sync::{Arc, OnceLock};

use bytes::BytesMut;
use surelink_proto::detector::datagram::{
    decode_datagram, encode_barrier, encode_heartbeat, verify_heartbeat, Freshness, HeartbeatKey,
};
use surelink_proto::secure::{
    Accept, Dial, Handshake, Keypair, Members, Opener, PathHandshake, Protection, Sealer,
    SecretKey, TestCa, Ticket, TlsHandshake, TlsSetup,
};
use surelink_proto::{
    ClusterId, Endpoint, EndpointConfig, Epoch, LocalIdentity, NodeId, PathId, Time,
};

use crate::fixture::World;

/// A fuzz target.
pub type Target = fn(&[u8]);

/// Every target, by name (the names of `fuzz/fuzz_targets/*.rs`).
pub const TARGETS: [(&str, Target); 8] = [
    ("frame_decoder", frame_decoder),
    ("session_input", session_input),
    ("handshake", handshake),
    ("tls_handshake", tls_handshake),
    ("records", records),
    ("datagrams", datagrams),
    ("role_messages", role_messages),
    ("relay_records", relay_records),
];

const MAX_BODY: u32 = 1 << 20;

/// Splits `data` into chunks whose sizes come from the data itself, so
/// the fuzzer also explores how input is cut into reads.
fn chunks(data: &[u8]) -> impl Iterator<Item = &[u8]> + Clone {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = usize::from(rest[0]).max(1).min(rest.len());
        let (a, b) = rest.split_at(n);
        rest = b;
        Some(a)
    })
}

/// The wire decoder, whole buffer and frame by frame.
pub fn frame_decoder(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    // Each step consumes a frame or stops: bounded by the input.
    while let Ok(Some(_)) = surelink_proto::wire::decode(&mut buf, MAX_BODY) {}
    let _ = surelink_proto::wire::decode_frame(bytes::Bytes::copy_from_slice(data), MAX_BODY);
}

fn identity(n: u64) -> LocalIdentity {
    LocalIdentity {
        cluster: ClusterId(9),
        node: NodeId(n),
        epoch: Epoch(100 + n),
    }
}

/// Node 2 (index 0) and node 1 (index 1) with the default configuration,
/// at time zero, path 1 dialled from node 2; events stay in the cores.
fn dialled() -> Option<World> {
    let cfg = EndpointConfig::default();
    let a = Endpoint::new(cfg.clone(), identity(2)).ok()?;
    let b = Endpoint::new(cfg, identity(1)).ok()?;
    let mut w = World::new(vec![a, b], Time::ZERO);
    w.collect_events = false;
    w.connect(DIALLER, ACCEPTOR, PATH);
    Some(w)
}

const DIALLER: usize = 0;
const ACCEPTOR: usize = 1;
const PATH: PathId = PathId(1);

/// A session's input: node 2 dials node 1 and its HELLO arrives; then the
/// fuzz bytes arrive on the same path in chunks, and node 1 answers and
/// runs its timers.
pub fn session_input(data: &[u8]) {
    let Some(mut w) = dialled() else {
        return;
    };
    w.flush_from(DIALLER);
    w.deliver(DIALLER, PATH);
    let mut buf = BytesMut::new();
    for c in chunks(data) {
        buf.extend_from_slice(c);
        if w.input(ACCEPTOR, PATH, &mut buf).is_err() {
            break;
        }
        w.now = Time::from_millis(w.now.since_origin().as_millis() as u64 + 7);
        // What node 1 answers goes nowhere.
        w.flush_from(ACCEPTOR);
        w.clear_queues();
        let _ = w.take_events(ACCEPTOR);
    }
    w.now = Time::from_millis(60_000);
    w.handle_timeout(ACCEPTOR);
    w.flush_from(ACCEPTOR);
}

/// Node `n`'s key pair (1 or 2), derived once: a fuzz input should pay for
/// the handshake it drives, not for deriving the same public keys again.
fn keys(n: u8) -> Keypair {
    static KEYS: OnceLock<[Keypair; 2]> = OnceLock::new();
    let k =
        KEYS.get_or_init(|| [1u8, 2].map(|i| Keypair::from_secret(SecretKey::from_bytes([i; 32]))));
    k[usize::from(n - 1)].clone()
}

fn members() -> Arc<Members> {
    static MEMBERS: OnceLock<Arc<Members>> = OnceLock::new();
    MEMBERS
        .get_or_init(|| {
            let mut m = Members::new();
            let _ = m.insert(NodeId(1), keys(1).public());
            let _ = m.insert(NodeId(2), keys(2).public());
            Arc::new(m)
        })
        .clone()
}

/// The protection a handshake input asks for (its first byte's low bit).
fn protection(data: &[u8]) -> Protection {
    if data.first().is_some_and(|b| b & 1 == 1) {
        Protection::IntegrityOnly
    } else {
        Protection::Encrypt
    }
}

/// Feeds `data` to a responder in chunks (answering after each), until it
/// finishes or fails.
fn respond(mut r: PathHandshake, data: &[u8]) {
    let mut buf = BytesMut::new();
    let mut out = BytesMut::new();
    for c in chunks(data) {
        buf.extend_from_slice(c);
        let done = r.handle_input(&mut buf);
        r.poll_transmit(&mut out);
        if !matches!(done, Ok(None)) {
            break;
        }
    }
}

/// Sends an initiator's first flight, then feeds it `data` whole.
fn initiate(mut i: PathHandshake, data: &[u8]) {
    let mut out = BytesMut::new();
    i.poll_transmit(&mut out);
    let mut buf = BytesMut::from(data);
    let _ = i.handle_input(&mut buf);
    i.poll_transmit(&mut out);
}

/// Nodes 2's and 1's tickets from one full handshake (node 2 dialled),
/// made once per process per protection.
fn tickets(p: Protection) -> Option<(Ticket, Ticket)> {
    static TICKETS: OnceLock<[Option<(Ticket, Ticket)>; 2]> = OnceLock::new();
    let make = |p: Protection| {
        let m = members();
        let mut i = Handshake::initiator(&keys(2), m.clone(), ClusterId(9), p, NodeId(1)).ok()?;
        let mut r = Handshake::responder(&keys(1), m, ClusterId(9), p).ok()?;
        let (mut to_r, mut to_i) = (BytesMut::new(), BytesMut::new());
        let (mut ie, mut re) = (None, None);
        for _ in 0..4 {
            i.poll_transmit(&mut to_r);
            if re.is_none() {
                re = r.handle_input(&mut to_r).ok()?;
            }
            r.poll_transmit(&mut to_i);
            if ie.is_none() {
                ie = i.handle_input(&mut to_i).ok()?;
            }
        }
        Some((ie?.ticket?, re?.ticket?))
    };
    let all = TICKETS.get_or_init(|| [make(Protection::Encrypt), make(Protection::IntegrityOnly)]);
    all[usize::from(p == Protection::IntegrityOnly)].clone()
}

/// The handshake: a responder (Noise alone, and ready for a ticket it
/// knows) and an initiator (full, and resuming) fed the fuzz bytes.
pub fn handshake(data: &[u8]) {
    let (m, p) = (members(), protection(data));
    if let Ok(r) = Handshake::responder(&keys(1), m.clone(), ClusterId(9), p) {
        respond(PathHandshake::Noise(Box::new(r)), data);
    }
    if let Ok(i) = Handshake::initiator(&keys(2), m.clone(), ClusterId(9), p, NodeId(1)) {
        initiate(PathHandshake::Noise(Box::new(i)), data);
    }
    let Some((dialler, known)) = tickets(p) else {
        return;
    };
    let lookup = Box::new(move |id: &[u8; 16]| (known.id() == *id).then(|| known.clone()));
    let m1 = m.clone();
    let noise = Box::new(move || Handshake::responder(&keys(1), m1, ClusterId(9), p));
    respond(
        PathHandshake::Accept(Box::new(Accept::new(noise, lookup, ClusterId(9), p))),
        data,
    );
    let fallback = Box::new(move || Handshake::initiator(&keys(2), m, ClusterId(9), p, NodeId(1)));
    if let Ok(d) = Dial::new(dialler, ClusterId(9), p, fallback) {
        initiate(PathHandshake::Dial(Box::new(d)), data);
    }
}

/// Nodes 1 and 2's TLS setups from one throwaway CA, made once per
/// process (`None` if the CA cannot be made, which no input causes).
fn tls_setups() -> Option<&'static [TlsSetup; 2]> {
    static SETUPS: OnceLock<Option<[TlsSetup; 2]>> = OnceLock::new();
    SETUPS
        .get_or_init(|| {
            let ca = TestCa::new(ClusterId(9)).ok()?;
            Some([
                ca.setup(ClusterId(9), NodeId(1)).ok()?,
                ca.setup(ClusterId(9), NodeId(2)).ok()?,
            ])
        })
        .as_ref()
}

/// The mutual-TLS handshake: a responder fed the fuzz bytes in chunks, and
/// an initiator (after sending its first flight) fed them whole.
pub fn tls_handshake(data: &[u8]) {
    let Some([one, two]) = tls_setups() else {
        return;
    };
    let p = protection(data);
    if let Ok(r) = TlsHandshake::responder(one, p) {
        respond(PathHandshake::Tls(Box::new(r)), data);
    }
    if let Ok(i) = TlsHandshake::initiator(two, p, NodeId(1)) {
        initiate(PathHandshake::Tls(Box::new(i)), data);
    }
}

/// The record layer: the fuzz bytes as a received stream, both modes.
pub fn records(data: &[u8]) {
    for p in [Protection::Encrypt, Protection::IntegrityOnly] {
        let mut o = Opener::new(&[3; 32], p);
        let mut raw = BytesMut::new();
        let mut out = BytesMut::new();
        for c in chunks(data) {
            raw.extend_from_slice(c);
            if o.open(&mut raw, &mut out).is_err() {
                break;
            }
        }
        // And sealing arbitrary pieces round-trips.
        let mut s = Sealer::new(&[4; 32], p);
        let mut o = Opener::new(&[4; 32], p);
        let Ok(sealed) = s.seal_to_bytes(chunks(data)) else {
            continue;
        };
        let mut raw = BytesMut::from(&sealed[..]);
        let mut out = BytesMut::new();
        assert!(
            o.open(&mut raw, &mut out).is_ok(),
            "a sealed stream must open"
        );
        assert_eq!(&out[..], data, "records changed the bytes");
    }
}

/// Heartbeat and barrier datagrams: decode, verify, replay window.
pub fn datagrams(data: &[u8]) {
    let key = HeartbeatKey::new(&[5; 32]);
    let mut fresh = Freshness::default();
    for c in chunks(data) {
        if let Ok(surelink_proto::detector::datagram::Datagram::Heartbeat {
            node,
            epoch,
            seq,
            ..
        }) = decode_datagram(c)
        {
            if verify_heartbeat(c, &key) {
                let _ = fresh.accept(node, 0, epoch, seq);
            }
        }
    }
}

fn role_config() -> surelink_proto::role::RoleConfig {
    surelink_proto::role::RoleConfig {
        nodes: (1..=3).map(NodeId).collect(),
        networks: 2,
        candidates: vec![NodeId(1), NodeId(2)],
        ..surelink_proto::role::RoleConfig::default()
    }
}

/// The role service's messages: decoded, then a table offered to a node's
/// gate and a report or ack to a role server, as the shell will.
pub fn role_messages(data: &[u8]) {
    use surelink_proto::role::{self, RoleMessage, RoleServer, TableGate};
    let Ok(mut server) = RoleServer::new(role_config(), NodeId(1), 1, Time::ZERO) else {
        return;
    };
    let mut gate = TableGate::new(role_config(), NodeId(3));
    // Messages as `length u8, bytes`: one message per chunk.
    let mut rest = data;
    let messages = std::iter::from_fn(move || {
        let (&n, tail) = rest.split_first()?;
        let (c, after) = tail.split_at(usize::from(n).min(tail.len()));
        rest = after;
        Some(c)
    });
    for (k, c) in messages.enumerate() {
        let from = NodeId(1 + (k as u64 % 3));
        let now = Time::from_millis(k as u64);
        match role::decode(c) {
            Ok(RoleMessage::Table(view)) => {
                let _ = gate.apply(from, view);
            }
            Ok(RoleMessage::TableRingDelta { view, ring }) => {
                let _ = gate.apply_ring_delta(from, view, &ring);
            }
            Ok(RoleMessage::Report(r)) => {
                let _ = server.handle_report(now, from, &r);
            }
            Ok(RoleMessage::Ack { epoch, version }) => server.handle_ack(from, epoch, version),
            Ok(RoleMessage::HelperReport(r)) => {
                let _ = server.handle_helper_report(now, from, &r);
            }
            Err(_) => {}
        }
        server.handle_timeout(now);
        while server.poll_push(now, Some(Time::MAX)).is_some() {}
    }
}

/// A helper's relay messages as a server takes them: decoded into
/// records (or refused whole), each applied to a small slot table, with
/// the bytes per open slot counted against a bound as the shell does.
/// Messages as `length u16 (big-endian), bytes`.
pub fn relay_records(data: &[u8]) {
    use surelink_proto::helper::{decode_records, Record, SlotAction, SlotTable};
    let mut table: SlotTable<u64> = SlotTable::new(16);
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let (m, after) = rest[2..].split_at(n.min(rest.len() - 2));
        rest = after;
        let Ok(records) = decode_records(bytes::Bytes::copy_from_slice(m)) else {
            continue;
        };
        let mut total = 0usize;
        for r in &records {
            assert!(r.encoded_len() <= m.len());
            total += r.encoded_len();
            if let (Ok(SlotAction::Data(_)), Record::Data { slot, body }) =
                (table.apply(r, |_| 0), r)
            {
                // The shell's per-slot bound: past it, the slot closes.
                if body.len() > 1 << 16 {
                    table.remove(*slot);
                }
            }
            assert!(table.len() <= table.max());
        }
        // Accepted whole: the records are exactly the message.
        assert_eq!(total, m.len());
    }
}

/// Valid inputs per target, for the corpus and the smoke test.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = Vec::new();
    match target {
        "frame_decoder" | "session_input" => {
            // What a real peer sends: its HELLO, data, acks, a close.
            if let Some(mut w) = dialled() {
                let now = w.now;
                for i in 0..8u8 {
                    let _ = w[DIALLER].send(
                        now,
                        NodeId(1),
                        surelink_proto::ChannelId(u16::from(i % 2)),
                        bytes::Bytes::from(vec![i; usize::from(i) * 9]),
                    );
                }
                w.flush_from(DIALLER);
                v.push(w.queued(DIALLER, PATH).to_vec());
                w.deliver(DIALLER, PATH);
                w.flush_from(ACCEPTOR);
                v.push(w.queued(ACCEPTOR, PATH).to_vec());
            }
        }
        "handshake" => {
            if let Ok(mut i) = Handshake::initiator(
                &keys(2),
                members(),
                ClusterId(9),
                Protection::Encrypt,
                NodeId(1),
            ) {
                let mut first = BytesMut::new();
                i.poll_transmit(&mut first);
                v.push(first.to_vec());
            }
            // A resuming dialler's opening with the ticket the responder
            // knows.
            if let Some((dialler, _)) = tickets(Protection::Encrypt) {
                let fallback = Box::new(|| Err(surelink_proto::secure::SecureError::Failed));
                if let Ok(mut d) = Dial::new(dialler, ClusterId(9), Protection::Encrypt, fallback) {
                    let mut first = BytesMut::new();
                    d.poll_transmit(&mut first);
                    v.push(first.to_vec());
                }
            }
        }
        "tls_handshake" => {
            // The client's first flight, and the server's answer to it.
            if let Some([one, two]) = tls_setups() {
                if let (Ok(mut i), Ok(mut r)) = (
                    TlsHandshake::initiator(two, Protection::Encrypt, NodeId(1)),
                    TlsHandshake::responder(one, Protection::Encrypt),
                ) {
                    let mut first = BytesMut::new();
                    i.poll_transmit(&mut first);
                    v.push(first.to_vec());
                    let mut copy = first.clone();
                    let _ = r.handle_input(&mut copy);
                    let mut answer = BytesMut::new();
                    r.poll_transmit(&mut answer);
                    v.push(answer.to_vec());
                }
            }
        }
        "records" => {
            let mut s = Sealer::new(&[3; 32], Protection::Encrypt);
            if let Ok(r) = s.seal_to_bytes([&b"hello records"[..]]) {
                v.push(r.to_vec());
            }
            v.push(b"some plaintext to seal in pieces".to_vec());
        }
        "role_messages" => {
            use surelink_proto::role::{self, RoleMessage, RoleServer, TableView};
            if let Ok(mut s) = RoleServer::new(role_config(), NodeId(1), 1, Time::ZERO) {
                if let Some(p) = s.poll_push(Time::ZERO, Some(Time::MAX)) {
                    // The whole row, then the next version with one
                    // member's state changed, as a ring delta.
                    let mut next = p.view.clone();
                    next.version += 1;
                    if let Some(m) = next.ring.first_mut() {
                        m.state = role::MemberState::Down;
                    }
                    let delta = role::RingDelta::between(&p.view.ring, &next.ring);
                    // A helper's report, and a row listing it (tags 5, 6).
                    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 7400));
                    let report = role::HelperReport {
                        helper: NodeId(2),
                        seq: 1,
                        addr,
                        level: 9,
                    };
                    let mut helped = next.clone();
                    helped.version += 1;
                    helped.helpers = vec![role::HelperEntry {
                        node: NodeId(2),
                        addr,
                        level: 9,
                    }];
                    let mut d = Vec::new();
                    for m in [
                        Some(RoleMessage::HelperReport(report)),
                        Some(RoleMessage::Table(helped)),
                        Some(RoleMessage::Table(p.view)),
                        delta.map(|ring| RoleMessage::TableRingDelta {
                            view: TableView {
                                ring: Vec::new(),
                                ..next
                            },
                            ring,
                        }),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        let mut b = Vec::new();
                        role::encode(&m, &mut b);
                        d.push(u8::try_from(b.len()).unwrap_or(u8::MAX));
                        d.extend_from_slice(&b);
                    }
                    v.push(d);
                }
            }
        }
        "relay_records" => {
            use surelink_proto::helper::Record;
            let mut m = BytesMut::new();
            for r in [
                Record::Open { slot: 1 },
                Record::Data {
                    slot: 1,
                    body: bytes::Bytes::from_static(b"a client's sealed bytes"),
                },
                Record::Open { slot: 2 },
                Record::Close { slot: 1, code: 0 },
            ] {
                let _ = r.encode(&mut m);
            }
            let mut d = u16::try_from(m.len()).unwrap_or(0).to_be_bytes().to_vec();
            d.extend_from_slice(&m);
            v.push(d);
        }
        "datagrams" => {
            let key = HeartbeatKey::new(&[5; 32]);
            let mut d =
                encode_heartbeat(ClusterId(9), NodeId(2), Epoch(7), 1, 0, 0, Some(&key)).to_vec();
            d.extend_from_slice(&encode_barrier(42, 1));
            v.push(d);
        }
        _ => {}
    }
    v.push(Vec::new());
    v
}
