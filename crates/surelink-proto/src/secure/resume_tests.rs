use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;

use super::*;
use crate::secure::test_nodes::{members, node, Node};
use crate::secure::{Keypair, Members, PathHandshake};

const CLUSTER: ClusterId = ClusterId(7);
const P: Protection = Protection::Encrypt;

/// Both sides through the module's one driver.
fn run(
    i: PathHandshake,
    r: PathHandshake,
) -> (
    Result<Established, SecureError>,
    Result<Established, SecureError>,
) {
    let (ie, re, _) = crate::secure::run_both(i, r);
    (ie, re)
}

fn accept(keys: &Keypair, m: &Arc<Members>, store: &Arc<Mutex<TicketStore>>) -> PathHandshake {
    let store = store.clone();
    let lookup: TicketLookup =
        Box::new(move |id| store.lock().unwrap().lookup(Time::from_millis(1), id));
    let (keys, m) = (keys.clone(), m.clone());
    PathHandshake::Accept(Box::new(Accept::new(
        Box::new(move || Handshake::responder(&keys, m, CLUSTER, P)),
        lookup,
        CLUSTER,
        P,
    )))
}

fn dial(ticket: Ticket, keys: &Keypair, m: &Arc<Members>) -> PathHandshake {
    let (keys, m, peer) = (keys.clone(), m.clone(), ticket.peer());
    PathHandshake::Dial(Box::new(
        Dial::new(
            ticket,
            CLUSTER,
            P,
            Box::new(move || Handshake::initiator(&keys, m, CLUSTER, P, peer)),
        )
        .unwrap(),
    ))
}

/// A full handshake through `Accept`: both ends' tickets, stored.
fn full(a: &Node, b: &Node, m: &Arc<Members>) -> (Ticket, Arc<Mutex<TicketStore>>) {
    let store = Arc::new(Mutex::new(TicketStore::new(TicketStore::DEFAULT_LIFETIME)));
    let i = PathHandshake::Noise(Box::new(
        Handshake::initiator(&a.keys, m.clone(), CLUSTER, P, b.id).unwrap(),
    ));
    let (ie, re) = run(i, accept(&b.keys, m, &store));
    let (ie, re) = (ie.unwrap(), re.unwrap());
    assert_eq!((ie.peer, re.peer), (b.id, a.id));
    let (ti, tr) = (ie.ticket.unwrap(), re.ticket.unwrap());
    assert_eq!(ti.id, tr.id, "both ends mint the same ticket");
    assert_eq!((ti.peer(), tr.peer()), (b.id, a.id));
    store.lock().unwrap().insert(Time::ZERO, tr);
    (ti, store)
}

/// Seals `msg` on one end, opens it on the other.
fn carries(from: &mut Established, to: &mut Established, msg: &[u8]) -> bool {
    let mut wire = BytesMut::new();
    from.sealer.seal([msg], &mut wire).unwrap();
    matches!(to.opener.open_record(&mut wire), Ok(Some(b)) if &b[..] == msg)
}

#[test]
fn a_ticket_resumes_a_path_and_both_ends_agree_on_the_keys() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let (ticket, store) = full(&a, &b, &m);
    let (ie, re) = run(dial(ticket, &a.keys, &m), accept(&b.keys, &m, &store));
    let (mut ie, mut re) = (ie.unwrap(), re.unwrap());
    assert_eq!((ie.peer, re.peer), (b.id, a.id));
    assert!(
        ie.ticket.is_none() && re.ticket.is_none(),
        "only full handshakes mint"
    );
    assert!(carries(&mut ie, &mut re, b"hello from a"));
    assert!(carries(&mut re, &mut ie, b"hello from b"));
}

#[test]
fn two_resumed_paths_get_different_keys() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let (ticket, store) = full(&a, &b, &m);
    let (i1, _) = run(
        dial(ticket.clone(), &a.keys, &m),
        accept(&b.keys, &m, &store),
    );
    let (_, r2) = run(dial(ticket, &a.keys, &m), accept(&b.keys, &m, &store));
    let (mut i1, mut r2) = (i1.unwrap(), r2.unwrap());
    assert!(!carries(&mut i1, &mut r2, b"path 1's record on path 2"));
}

#[test]
fn an_unknown_ticket_falls_back_to_noise_on_the_same_connection() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let (ticket, _) = full(&a, &b, &m);
    // A responder that restarted: no tickets.
    let empty = Arc::new(Mutex::new(TicketStore::new(TicketStore::DEFAULT_LIFETIME)));
    let mut d = Dial::new(ticket, CLUSTER, P, {
        let (keys, m) = (a.keys.clone(), m.clone());
        Box::new(move || Handshake::initiator(&keys, m, CLUSTER, P, NodeId(2)))
    })
    .unwrap();
    let mut acc = accept(&b.keys, &m, &empty);
    let (mut to_r, mut to_i) = (BytesMut::new(), BytesMut::new());
    let (mut ie, mut re) = (None, None);
    for _ in 0..8 {
        d.poll_transmit(&mut to_r);
        if re.is_none() {
            re = acc.handle_input(&mut to_r).unwrap();
        }
        acc.poll_transmit(&mut to_i);
        if ie.is_none() {
            ie = d.handle_input(&mut to_i).unwrap();
        }
    }
    assert!(d.fell_back());
    let (mut ie, mut re) = (ie.expect("initiator done"), re.expect("responder done"));
    assert_eq!((ie.peer, re.peer), (b.id, a.id));
    assert!(ie.ticket.is_some(), "the fallback mints a new ticket");
    assert!(carries(&mut ie, &mut re, b"after the fallback"));
}

#[test]
fn a_forged_ticket_gets_nowhere() {
    let (a, b, c) = (node(1), node(2), node(3));
    let m = members(&[&a, &b, &c]);
    let (ticket, store) = full(&a, &b, &m);
    // Same id, wrong secret: the responder's MAC fails at the dialler,
    // and the dialler's MAC would fail at the responder.
    let mut forged = ticket.clone();
    forged.secret[0] ^= 1;
    let (ie, re) = run(dial(forged, &c.keys, &m), accept(&b.keys, &m, &store));
    assert_eq!(ie.unwrap_err(), SecureError::Failed);
    assert!(re.is_err(), "the responder never establishes");
}

#[test]
fn a_responder_with_a_wrong_secret_is_refused_by_the_dialler() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let (ticket, store) = full(&a, &b, &m);
    {
        let mut s = store.lock().unwrap();
        let mut t = s.for_dial(Time::ZERO, a.id).unwrap();
        t.secret[5] ^= 0x80;
        s.insert(Time::ZERO, t);
    }
    let (ie, re) = run(dial(ticket, &a.keys, &m), accept(&b.keys, &m, &store));
    assert_eq!(ie.unwrap_err(), SecureError::Failed);
    assert!(re.is_err());
}

#[test]
fn a_replayed_opening_meets_a_fresh_nonce() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let (ticket, store) = full(&a, &b, &m);
    // Record the dialler's bytes of one resumption, all of them.
    let mut d = dial(ticket, &a.keys, &m);
    let mut acc = accept(&b.keys, &m, &store);
    let (mut to_r, mut to_i, mut sent) = (BytesMut::new(), BytesMut::new(), BytesMut::new());
    for _ in 0..4 {
        d.poll_transmit(&mut to_r);
        sent.extend_from_slice(&to_r);
        let _ = acc.handle_input(&mut to_r);
        acc.poll_transmit(&mut to_i);
        let _ = d.handle_input(&mut to_i);
    }
    // Replay them to a new accepting side: the last MAC answers another
    // nonce_r.
    let mut again = accept(&b.keys, &m, &store);
    let mut out = BytesMut::new();
    again.poll_transmit(&mut out);
    assert_eq!(
        again.handle_input(&mut sent).unwrap_err(),
        SecureError::Failed
    );
}

#[test]
fn other_preamble_values_still_name_themselves() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let (ticket, _) = full(&a, &b, &m);
    let store = Arc::new(Mutex::new(TicketStore::new(TicketStore::DEFAULT_LIFETIME)));
    let lookup: TicketLookup = Box::new(move |id| store.lock().unwrap().lookup(Time::ZERO, id));
    let other = ClusterId(8);
    let (keys, m2) = (b.keys.clone(), m.clone());
    let r = PathHandshake::Accept(Box::new(Accept::new(
        Box::new(move || Handshake::responder(&keys, m2, other, P)),
        lookup,
        other,
        P,
    )));
    let (ie, re) = run(dial(ticket, &a.keys, &m), r);
    assert!(
        matches!(ie, Err(SecureError::WrongCluster { .. })),
        "{ie:?}"
    );
    assert!(
        matches!(re, Err(SecureError::WrongCluster { .. })),
        "{re:?}"
    );
}

#[test]
fn the_store_keeps_a_few_tickets_per_peer_for_their_lifetime() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let mut s = TicketStore::new(Duration::from_secs(10));
    let mut ids = Vec::new();
    for k in 0..6u64 {
        let (t, _) = full(&a, &b, &m);
        ids.push(t.id);
        s.insert(Time::from_millis(k), t);
    }
    assert_eq!(s.len(), TicketStore::PER_PEER, "bounded per peer");
    let newest = s.for_dial(Time::from_millis(6), b.id).unwrap();
    assert_eq!(newest.id, ids[5], "the newest dials");
    assert!(
        s.lookup(Time::from_millis(6), &ids[0]).is_none(),
        "the oldest went"
    );
    assert!(s.lookup(Time::from_millis(6), &ids[2]).is_some());
    s.forget(b.id, &ids[5]);
    assert_eq!(s.for_dial(Time::from_millis(6), b.id).unwrap().id, ids[4]);
    let late = Time::from_millis(10_004);
    assert!(s.for_dial(late, b.id).is_none(), "expired");
    assert!(s.lookup(late, &ids[4]).is_none(), "expired");
    s.handle_timeout(late);
    assert!(s.is_empty());
}

#[test]
fn a_ticket_just_minted_waits_to_settle_while_an_older_one_lives() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let mut s = TicketStore::new(Duration::from_secs(10));
    let (old, _) = full(&a, &b, &m);
    let (young, _) = full(&a, &b, &m);
    s.insert(Time::from_millis(0), old.clone());
    s.insert(Time::from_millis(1_000), young.clone());
    let at = |s: &TicketStore, ms| s.for_dial(Time::from_millis(ms), b.id).unwrap().id;
    assert_eq!(
        at(&s, 1_100),
        old.id,
        "the peer may not hold the young one yet"
    );
    assert_eq!(at(&s, 1_000 + 250), young.id, "settled");
    // Alone, the young one dials at once (better than a full handshake).
    s.forget(b.id, &old.id);
    assert_eq!(at(&s, 1_010), young.id);
}

#[test]
fn a_resumed_path_uses_the_acceptor_s_cipher_and_a_rewritten_offer_fails() {
    let (a, b) = (node(1), node(2));
    let m = members(&[&a, &b]);
    let (ticket, store) = full(&a, &b, &m);
    for (pi, pr, want) in [
        (
            RecordCipher::ChaCha20Poly1305,
            RecordCipher::ChaCha20Poly1305,
            RecordCipher::ChaCha20Poly1305,
        ),
        (
            RecordCipher::ChaCha20Poly1305,
            RecordCipher::Aes256Gcm,
            RecordCipher::Aes256Gcm,
        ),
        // Preferring AES, the dialler offers it alone.
        (
            RecordCipher::Aes256Gcm,
            RecordCipher::ChaCha20Poly1305,
            RecordCipher::Aes256Gcm,
        ),
    ] {
        let mut i = dial(ticket.clone(), &a.keys, &m);
        i.prefer_cipher(pi);
        let mut r = accept(&b.keys, &m, &store);
        r.prefer_cipher(pr);
        let (ie, re) = run(i, r);
        let (mut ie, mut re) = (ie.unwrap(), re.unwrap());
        assert_eq!((ie.sealer.cipher(), re.sealer.cipher()), (want, want));
        assert!(carries(&mut ie, &mut re, b"hello from a"));
        assert!(carries(&mut re, &mut ie, b"hello from b"));
    }
    // The dialler's offer rewritten in flight: both preambles are in the
    // MACs, so the acceptor refuses the resumption.
    let mut i = dial(ticket, &a.keys, &m);
    let mut r = accept(&b.keys, &m, &store);
    let mut to_r = BytesMut::new();
    i.poll_transmit(&mut to_r);
    let aes = preamble::offer(RecordCipher::Aes256Gcm);
    to_r[CIPHERS] = if to_r[CIPHERS] == aes {
        preamble::offer(RecordCipher::ChaCha20Poly1305)
    } else {
        aes
    };
    let mut failed = false;
    let mut to_i = BytesMut::new();
    for _ in 0..4 {
        if r.handle_input(&mut to_r).is_err() {
            failed = true;
            break;
        }
        r.poll_transmit(&mut to_i);
        if i.handle_input(&mut to_i).is_err() {
            failed = true;
            break;
        }
        i.poll_transmit(&mut to_r);
    }
    assert!(
        failed,
        "a resumption with a rewritten cipher offer completed"
    );
}
