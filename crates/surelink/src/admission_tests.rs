#![allow(clippy::cast_possible_truncation)] // small test counts

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn limits() -> Limits {
    Limits {
        max_total: 40,
        reserve: 10,
        max_per_ip: 6,
        max_handshaking: 12,
        max_handshaking_per_ip: 3,
        max_handshaking_per_prefix: 5,
        prefix_v4: 24,
        prefix_v6: 64,
        rate: 1000,
        rate_total: 1000,
        max_per_member: 4,
    }
}

fn with(l: Limits, members: &[&str]) -> Arc<ConnLimits> {
    Arc::new(ConnLimits::new(l, members.iter().map(|m| ip(m))))
}

#[test]
fn prefixes_keep_the_leading_bits() {
    assert_eq!(prefix_of(ip("10.1.2.3"), 24, 64), ip("10.1.2.0"));
    assert_eq!(prefix_of(ip("10.1.2.3"), 32, 64), ip("10.1.2.3"));
    assert_eq!(prefix_of(ip("10.1.2.3"), 0, 64), ip("0.0.0.0"));
    assert_eq!(
        prefix_of(ip("2001:db8:1:2:3:4:5:6"), 24, 64),
        ip("2001:db8:1:2::")
    );
    assert_eq!(prefix_of(ip("2001:db8::1"), 24, 0), ip("::"));
}

#[test]
fn strangers_are_held_per_address_and_per_prefix() {
    let l = with(limits(), &[]);
    let now = Instant::now();
    let a: Vec<_> = (0..3)
        .map(|_| l.acquire(ip("10.0.0.1"), now).unwrap())
        .collect();
    assert_eq!(
        l.acquire(ip("10.0.0.1"), now).unwrap_err(),
        LimitHit::HandshakingPerIp(3)
    );
    let b: Vec<_> = (0..2)
        .map(|_| l.acquire(ip("10.0.0.2"), now).unwrap())
        .collect();
    // Five of this /24 in their handshake: its third address is refused.
    assert_eq!(
        l.acquire(ip("10.0.0.3"), now).unwrap_err(),
        LimitHit::HandshakingPerPrefix(5)
    );
    // Another prefix is not.
    let c = l.acquire(ip("10.0.1.1"), now).unwrap();
    // A handshake done frees its prefix's place, not the connection's.
    let mut a = a;
    a[0].authenticated(None).unwrap();
    let d = l.acquire(ip("10.0.0.3"), now).unwrap();
    assert_eq!(l.open(), 7);
    drop((a, b, c, d));
    assert_eq!(l.open(), 0);
    let s = l.state.lock();
    assert!(s.per_ip.is_empty() && s.per_prefix.is_empty());
    assert_eq!(s.handshaking, [0, 0]);
    assert_eq!(s.pooled, 0);
}

#[test]
fn members_addresses_keep_their_room_whatever_strangers_hold() {
    let mut lim = limits();
    lim.max_handshaking_per_prefix = 100;
    lim.max_handshaking_per_ip = 100;
    lim.max_per_ip = 100;
    let l = with(lim, &["10.9.9.9", "::ffff:10.9.9.8"]);
    let now = Instant::now();
    // Strangers fill their handshake pool…
    let mut held: Vec<_> = (0..12)
        .map(|i| l.acquire(ip(&format!("10.0.{i}.1")), now).unwrap())
        .collect();
    assert_eq!(
        l.acquire(ip("10.0.50.1"), now).unwrap_err(),
        LimitHit::Handshaking(12)
    );
    // …and, handshakes done (members at unlisted addresses), their share
    // of the connections.
    for s in &mut held {
        s.authenticated(None).unwrap();
    }
    held.extend((0..18).map(|i| {
        let mut s = l.acquire(ip(&format!("10.1.{i}.1")), now).unwrap();
        s.authenticated(None).unwrap();
        s
    }));
    assert_eq!(
        l.acquire(ip("10.0.60.1"), now).unwrap_err(),
        LimitHit::SharedPool(30)
    );
    // A member's listed address still gets in (also in IPv4-mapped form),
    // up to the total.
    let m: Vec<_> = (0..5)
        .map(|_| l.acquire(ip("10.9.9.9"), now).unwrap())
        .chain((0..5).map(|_| l.acquire(ip("::ffff:10.9.9.9"), now).unwrap()))
        .collect();
    assert_eq!(l.open(), 40);
    assert_eq!(
        l.acquire(ip("10.9.9.8"), now).unwrap_err(),
        LimitHit::Total(40)
    );
    drop(m);
    assert!(l.acquire(ip("10.9.9.8"), now).is_ok());
}

#[test]
fn a_member_holds_a_bounded_number_across_its_connections() {
    let l = with(limits(), &[]);
    let now = Instant::now();
    let mut held = Vec::new();
    for i in 0..4 {
        let mut s = l.acquire(ip(&format!("10.0.{i}.1")), now).unwrap();
        s.authenticated(Some(NodeId(7))).unwrap();
        held.push(s);
    }
    let mut extra = l.acquire(ip("10.0.9.1"), now).unwrap();
    assert_eq!(
        extra.authenticated(Some(NodeId(7))),
        Err(LimitHit::PerMember(NodeId(7), 4))
    );
    drop(extra);
    // Another member is not affected.
    let mut other = l.acquire(ip("10.0.9.1"), now).unwrap();
    other.authenticated(Some(NodeId(8))).unwrap();
    assert_eq!(l.of_member(NodeId(7)), 4);
    held.pop();
    let mut again = l.acquire(ip("10.0.9.2"), now).unwrap();
    again.authenticated(Some(NodeId(7))).unwrap();
    drop((held, again, other));
    assert!(l.state.lock().per_member.is_empty());
    assert_eq!(l.open(), 0);
}

#[test]
fn handshake_rate_is_a_token_bucket_per_prefix_and_for_the_pool() {
    let mut lim = limits();
    lim.rate = 5;
    lim.rate_total = 8;
    let l = with(lim, &["10.9.9.9"]);
    let t0 = Instant::now();
    // A burst of twice the rate, then nothing until tokens come back.
    for _ in 0..10 {
        drop(l.acquire(ip("10.0.0.1"), t0).unwrap());
    }
    assert_eq!(
        l.acquire(ip("10.0.0.2"), t0).unwrap_err(),
        LimitHit::Rate(5)
    );
    // Another prefix has its own bucket, until the pool's runs out.
    for _ in 0..6 {
        drop(l.acquire(ip("10.0.1.1"), t0).unwrap());
    }
    assert_eq!(
        l.acquire(ip("10.0.2.1"), t0).unwrap_err(),
        LimitHit::RateTotal(8)
    );
    // A member's address is not charged to the pool.
    drop(l.acquire(ip("10.9.9.9"), t0).unwrap());
    // A second later the prefix has 5 more.
    let t1 = t0 + Duration::from_secs(1);
    for _ in 0..5 {
        drop(l.acquire(ip("10.0.0.1"), t1).unwrap());
    }
    assert_eq!(
        l.acquire(ip("10.0.0.1"), t1).unwrap_err(),
        LimitHit::Rate(5)
    );
}

#[test]
fn the_rate_table_is_bounded_and_full_buckets_make_room() {
    let mut lim = limits();
    lim.rate = 1;
    lim.rate_total = 1_000_000;
    lim.max_handshaking = usize::MAX;
    lim.max_total = usize::MAX;
    let l = with(lim, &[]);
    let t0 = Instant::now();
    let addr = |i: u32| IpAddr::V4(Ipv4Addr::from((10 << 24) | (i << 8)));
    for i in 0..RATE_TABLE_CAP as u32 {
        drop(l.acquire(addr(i), t0).unwrap());
    }
    assert_eq!(l.state.lock().rates.map.len(), RATE_TABLE_CAP);
    // Newcomers share the overflow bucket (burst 2).
    let n = RATE_TABLE_CAP as u32;
    assert!(l.acquire(addr(n), t0).is_ok());
    assert!(l.acquire(addr(n + 1), t0).is_ok());
    assert_eq!(l.acquire(addr(n + 2), t0).unwrap_err(), LimitHit::Rate(1));
    // Once the old buckets have refilled, a sweep drops them.
    let t1 = t0 + Duration::from_secs(3);
    assert!(l.acquire(addr(n + 3), t1).is_ok());
    assert_eq!(l.state.lock().rates.map.len(), 1);
}

#[test]
fn refused_connections_take_no_token() {
    let mut lim = limits();
    lim.rate = 2;
    let l = with(lim, &[]);
    let now = Instant::now();
    let mut held: Vec<_> = (0..3)
        .map(|_| l.acquire(ip("10.0.0.1"), now).unwrap())
        .collect();
    for _ in 0..5 {
        assert_eq!(
            l.acquire(ip("10.0.0.1"), now).unwrap_err(),
            LimitHit::HandshakingPerIp(3)
        );
    }
    // The bucket (burst 4) still has the token the refusals did not take.
    held.pop();
    held.push(l.acquire(ip("10.0.0.1"), now).unwrap());
    held.pop();
    assert_eq!(
        l.acquire(ip("10.0.0.1"), now).unwrap_err(),
        LimitHit::Rate(2)
    );
}

/// Random accepts, handshakes and closes from a few prefixes and members:
/// no limit is ever exceeded, and everything is given back.
#[test]
fn random_traffic_never_exceeds_a_limit_and_leaves_nothing_behind() {
    let mut lim = limits();
    lim.rate = 3;
    lim.rate_total = 7;
    let l = with(lim.clone(), &["10.9.9.1", "10.9.9.2"]);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let t0 = Instant::now();
    let mut held: Vec<ConnSlot> = Vec::new();
    for step in 0..20_000u64 {
        let now = t0 + Duration::from_millis(step);
        match next(4) {
            0 | 1 => {
                let a = match next(6) {
                    0 => ip(&format!("10.9.9.{}", 1 + next(2))),
                    _ => ip(&format!("10.0.{}.{}", next(4), next(4))),
                };
                if let Ok(s) = l.acquire(a, now) {
                    held.push(s);
                }
            }
            2 if !held.is_empty() => {
                let i = next(held.len() as u64) as usize;
                let node = NodeId(1 + next(3));
                if held[i].authenticated(Some(node)).is_err() {
                    held.swap_remove(i);
                }
            }
            _ if !held.is_empty() => {
                let i = next(held.len() as u64) as usize;
                held.swap_remove(i);
            }
            _ => {}
        }
        let s = l.state.lock();
        assert!(s.total <= lim.max_total && s.total == held.len());
        assert!(s.pooled <= lim.max_total - lim.reserve);
        assert!(s.handshaking.iter().all(|&h| h <= lim.max_handshaking));
        assert!(s
            .per_prefix
            .values()
            .all(|&n| n <= lim.max_handshaking_per_prefix));
        assert!(s.per_ip.values().all(|e| e.open <= lim.max_per_ip));
        assert!(s.per_member.values().all(|&n| n <= lim.max_per_member));
    }
    drop(held);
    let s = l.state.lock();
    assert_eq!((s.total, s.pooled, s.handshaking), (0, 0, [0, 0]));
    assert!(s.per_ip.is_empty() && s.per_prefix.is_empty() && s.per_member.is_empty());
}
