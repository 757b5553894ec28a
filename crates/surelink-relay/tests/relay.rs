//! The relay on loopback with free ports: TCP echo, kill, blackhole and
//! heal, refuse, UDP with two clients at once, one-way UDP blackholes, and
//! the counters.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use surelink_relay::{Direction, Limits, LinkSpec, Relay, RelayError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(5);

fn ip(net: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, net, host))
}

fn any_port(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, 0)
}

/// An upstream whose accepted TCP connections go to the test.
async fn upstream_tcp() -> (SocketAddr, mpsc::UnboundedReceiver<(TcpStream, SocketAddr)>) {
    let l = TcpListener::bind(any_port(ip(1, 1))).await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(s) = l.accept().await {
            if tx.send(s).is_err() {
                break;
            }
        }
    });
    (addr, rx)
}

/// An upstream that echoes every TCP connection (and closes after the
/// client's FIN) and every datagram (to its source); reports the sources
/// of datagrams.
async fn upstream_echo() -> (SocketAddr, mpsc::UnboundedReceiver<SocketAddr>) {
    let l = TcpListener::bind(any_port(ip(1, 1))).await.unwrap();
    let addr = l.local_addr().unwrap();
    let u = UdpSocket::bind(addr).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 2048];
        while let Ok((n, from)) = u.recv_from(&mut buf).await {
            let _ = tx.send(from);
            let _ = u.send_to(&buf[..n], from).await;
        }
    });
    (addr, rx)
}

async fn relay_to(upstream: SocketAddr) -> (Relay, SocketAddr) {
    let relay = Relay::new();
    let info = relay
        .add_link(LinkSpec::new(0, any_port(ip(1, 100)), upstream).from_ip(ip(1, 101)))
        .await
        .unwrap();
    (relay, info.listen)
}

/// Whether `s` sees its connection end (a reset, or EOF) within `WAIT`.
async fn ends(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match timeout(WAIT, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251).to_le_bytes()[0]).collect()
}

#[tokio::test]
async fn tcp_echo_passes_bytes_and_half_close() {
    let (up, _) = upstream_echo().await;
    let (relay, listen) = relay_to(up).await;
    let mut c = TcpStream::connect(listen).await.unwrap();
    let data = pattern(300_000);
    let (mut r, mut w) = c.split();
    let write = async {
        w.write_all(&data).await.unwrap();
        // Half-close: the echo server sees EOF, echoes the rest, closes.
        w.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let read = async { timeout(WAIT, r.read_to_end(&mut back)).await.unwrap() };
    let ((), n) = tokio::join!(write, read);
    assert_eq!(n.unwrap(), data.len());
    assert_eq!(back, data);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let c = &relay.status()[0].counters;
    assert_eq!((c.tcp_accepted, c.tcp_open), (1, 0), "{c:?}");
    assert_eq!(c.tcp_bytes_up, data.len() as u64);
    assert_eq!(c.tcp_bytes_down, data.len() as u64);
    assert_eq!((c.tcp_killed, c.tcp_broken), (0, 0));
}

#[tokio::test]
async fn kill_ends_both_sides_and_a_new_connection_works_at_once() {
    let (up, mut accepted) = upstream_tcp().await;
    let (relay, listen) = relay_to(up).await;
    let mut c = TcpStream::connect(listen).await.unwrap();
    let (mut s, from) = timeout(WAIT, accepted.recv()).await.unwrap().unwrap();
    // Upstream sockets leave from the link's source IP.
    assert_eq!(from.ip(), ip(1, 101));
    c.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await.unwrap();

    assert_eq!(relay.network(0).kill(), 1);
    assert!(ends(&mut c).await, "the client did not see the kill");
    assert!(ends(&mut s).await, "the upstream did not see the kill");

    let mut c2 = TcpStream::connect(listen).await.unwrap();
    c2.write_all(b"again").await.unwrap();
    let (mut s2, _) = timeout(WAIT, accepted.recv()).await.unwrap().unwrap();
    let mut b = [0u8; 5];
    timeout(WAIT, s2.read_exact(&mut b)).await.unwrap().unwrap();
    assert_eq!(&b, b"again");
    let st = &relay.status()[0].counters;
    assert_eq!((st.tcp_accepted, st.tcp_killed, st.tcp_open), (2, 1, 1));
}

#[tokio::test]
async fn blackhole_up_holds_bytes_and_heal_delivers_them_in_order() {
    let (up, mut accepted) = upstream_tcp().await;
    let (relay, listen) = relay_to(up).await;
    let c = TcpStream::connect(listen).await.unwrap();
    let (mut s, _) = timeout(WAIT, accepted.recv()).await.unwrap().unwrap();
    relay.all().blackhole(Direction::Up);
    // More than the relay's chunk and the kernel's buffers hold: the
    // client's writes block until heal.
    let data = pattern(8 << 20);
    let (mut cr, mut cw) = c.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        cw.write_all(&sent).await.unwrap();
        cw
    });
    let mut b = [0u8; 1];
    assert!(
        timeout(Duration::from_millis(200), s.read(&mut b))
            .await
            .is_err(),
        "bytes passed a blackhole"
    );
    // The other direction still flows.
    s.write_all(b"down").await.unwrap();
    let mut d = [0u8; 4];
    timeout(WAIT, cr.read_exact(&mut d)).await.unwrap().unwrap();
    assert_eq!(&d, b"down");
    assert!(
        !writer.is_finished(),
        "8 MiB went into a blackhole without blocking"
    );

    relay.all().heal();
    let mut got = vec![0u8; data.len()];
    timeout(WAIT, s.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == data, "held bytes came out changed");
    let _cw = writer.await.unwrap();
    let c = &relay.status()[0].counters;
    assert_eq!(c.tcp_bytes_up, data.len() as u64);
    assert_eq!(c.tcp_bytes_down, 4);
}

#[tokio::test]
async fn blackhole_down_holds_the_fin_too() {
    let (up, mut accepted) = upstream_tcp().await;
    let (relay, listen) = relay_to(up).await;
    let mut c = TcpStream::connect(listen).await.unwrap();
    let (mut s, _) = timeout(WAIT, accepted.recv()).await.unwrap().unwrap();
    relay.all().blackhole(Direction::Down);
    s.write_all(b"last words").await.unwrap();
    s.shutdown().await.unwrap();
    let mut b = [0u8; 16];
    assert!(timeout(Duration::from_millis(200), c.read(&mut b))
        .await
        .is_err());
    relay.all().heal();
    let mut got = Vec::new();
    timeout(WAIT, c.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"last words");
}

#[tokio::test]
async fn refuse_closes_the_listener_until_heal() {
    let (up, _) = upstream_echo().await;
    let (relay, listen) = relay_to(up).await;
    relay.all().refuse();
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(listen).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "connects still accepted");
    relay.all().heal();
    let mut c = None;
    for _ in 0..100 {
        if let Ok(s) = TcpStream::connect(listen).await {
            c = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut c = c.expect("listener not back");
    c.write_all(b"ok").await.unwrap();
    let mut b = [0u8; 2];
    timeout(WAIT, c.read_exact(&mut b)).await.unwrap().unwrap();
}

#[tokio::test]
async fn kill_selects_by_network() {
    let (up, mut accepted) = upstream_tcp().await;
    let relay = Relay::start([
        LinkSpec::new(0, any_port(ip(1, 100)), up),
        LinkSpec::new(1, any_port(ip(2, 100)), up),
    ])
    .await
    .unwrap();
    let addrs: Vec<_> = relay.infos().iter().map(|i| i.listen).collect();
    let mut c0 = TcpStream::connect(addrs[0]).await.unwrap();
    let mut c1 = TcpStream::connect(addrs[1]).await.unwrap();
    let _s0 = accepted.recv().await.unwrap();
    let _s1 = accepted.recv().await.unwrap();
    assert_eq!(relay.network(1).kill(), 1);
    assert!(ends(&mut c1).await);
    c0.write_all(b"still here").await.unwrap();
    let mut b = [0u8; 1];
    assert!(timeout(Duration::from_millis(100), c0.read(&mut b))
        .await
        .is_err());
    assert_eq!(relay.network(0).len(), 1);
    assert!(relay.network(2).is_empty());
}

#[tokio::test]
async fn udp_two_clients_each_get_their_own_replies() {
    let (up, mut sources) = upstream_echo().await;
    let (relay, listen) = relay_to(up).await;
    const N: u8 = 50;
    let client = |tag: u8| async move {
        let s = UdpSocket::bind(any_port(ip(1, 2))).await.unwrap();
        s.connect(listen).await.unwrap();
        let mut buf = [0u8; 16];
        for i in 0..N {
            s.send(&[tag, i]).await.unwrap();
            let n = timeout(WAIT, s.recv(&mut buf)).await.unwrap().unwrap();
            assert_eq!(&buf[..n], &[tag, i], "a reply for someone else");
        }
    };
    tokio::join!(client(b'a'), client(b'b'));
    let mut seen = std::collections::HashSet::new();
    while let Ok(from) = sources.try_recv() {
        assert_eq!(from.ip(), ip(1, 101), "datagram not from the source IP");
        seen.insert(from);
    }
    assert_eq!(seen.len(), 2, "one upstream socket per client");
    let c = &relay.status()[0].counters;
    assert_eq!(
        (c.udp_datagrams_up, c.udp_datagrams_down),
        (2 * u64::from(N), 2 * u64::from(N))
    );
    assert_eq!(
        (c.udp_dropped_up, c.udp_dropped_down, c.udp_clients),
        (0, 0, 2)
    );
}

#[tokio::test]
async fn udp_blackhole_drops_one_way_only() {
    let (up, mut sources) = upstream_echo().await;
    let (relay, listen) = relay_to(up).await;
    let s = UdpSocket::bind(any_port(ip(1, 2))).await.unwrap();
    s.connect(listen).await.unwrap();
    let mut buf = [0u8; 16];
    let quiet = Duration::from_millis(200);

    // Down blackholed: the upstream hears us, we hear nothing.
    relay.all().blackhole(Direction::Down);
    for _ in 0..3 {
        s.send(b"ping").await.unwrap();
    }
    for _ in 0..3 {
        timeout(WAIT, sources.recv()).await.unwrap().unwrap();
    }
    assert!(timeout(quiet, s.recv(&mut buf)).await.is_err());

    // Up blackholed: the upstream hears nothing.
    relay.all().heal();
    relay.all().blackhole(Direction::Up);
    for _ in 0..3 {
        s.send(b"ping").await.unwrap();
    }
    assert!(timeout(quiet, sources.recv()).await.is_err());
    assert!(timeout(Duration::from_millis(10), s.recv(&mut buf))
        .await
        .is_err());

    relay.all().heal();
    s.send(b"ping").await.unwrap();
    let n = timeout(WAIT, s.recv(&mut buf)).await.unwrap().unwrap();
    assert_eq!(&buf[..n], b"ping");
    let c = &relay.status()[0].counters;
    assert_eq!((c.udp_datagrams_up, c.udp_dropped_up), (4, 3), "{c:?}");
    assert_eq!((c.udp_datagrams_down, c.udp_dropped_down), (1, 3), "{c:?}");
}

#[tokio::test]
async fn udp_clients_are_bounded_and_expire() {
    let (up, _) = upstream_echo().await;
    let mut limits = Limits::default();
    limits.max_udp_clients = 2;
    limits.udp_idle = Duration::from_millis(200);
    let relay = Relay::with_limits(limits).unwrap();
    let listen = relay
        .add_link(LinkSpec::new(0, any_port(ip(1, 100)), up))
        .await
        .unwrap()
        .listen;
    let mut socks = Vec::new();
    for _ in 0..3 {
        let s = UdpSocket::bind(any_port(ip(1, 2))).await.unwrap();
        s.connect(listen).await.unwrap();
        s.send(b"hi").await.unwrap();
        let mut b = [0u8; 4];
        timeout(WAIT, s.recv(&mut b)).await.unwrap().unwrap();
        socks.push(s);
    }
    let c = relay.status()[0].counters;
    assert_eq!((c.udp_clients, c.udp_clients_evicted), (2, 1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(relay.status()[0].counters.udp_clients, 0);
}

#[tokio::test]
async fn drop_udp_drops_about_that_share() {
    let (up, _) = upstream_echo().await;
    let (relay, listen) = relay_to(up).await;
    relay.all().drop_udp(50);
    let s = UdpSocket::bind(any_port(ip(1, 2))).await.unwrap();
    s.connect(listen).await.unwrap();
    for i in 0..400 {
        s.send(b"x").await.unwrap();
        // Paced: a burst would overflow the relay's socket in the kernel.
        if i % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let c = relay.status()[0].counters;
    assert_eq!(c.udp_datagrams_up + c.udp_dropped_up, 400);
    assert!((100..300).contains(&c.udp_dropped_up), "{c:?}");
}

#[tokio::test]
async fn shutdown_closes_listeners_and_connections() {
    let (up, mut accepted) = upstream_tcp().await;
    let (relay, listen) = relay_to(up).await;
    let mut c = TcpStream::connect(listen).await.unwrap();
    let (mut s, _) = timeout(WAIT, accepted.recv()).await.unwrap().unwrap();
    relay.shutdown().await;
    assert!(ends(&mut c).await);
    assert!(ends(&mut s).await);
    assert!(TcpStream::connect(listen).await.is_err());
}

#[tokio::test]
async fn setup_errors_are_typed() {
    let up: SocketAddr = "127.0.1.1:9".parse().unwrap();
    let mut limits = Limits::default();
    limits.tcp_chunk = 0;
    assert!(matches!(
        Relay::with_limits(limits),
        Err(RelayError::Limit { field: "tcp_chunk" })
    ));
    let relay = Relay::new();
    let bad = LinkSpec::new(0, any_port(ip(1, 100)), any_port(ip(1, 1)));
    assert!(matches!(
        relay.add_link(bad).await,
        Err(RelayError::Config { .. })
    ));
    let v6 = LinkSpec::new(0, any_port(ip(1, 100)), up).from_ip("::1".parse().unwrap());
    assert!(matches!(
        relay.add_link(v6).await,
        Err(RelayError::Config { .. })
    ));
    let taken = relay
        .add_link(LinkSpec::new(0, any_port(ip(1, 100)), up))
        .await
        .unwrap()
        .listen;
    assert!(matches!(
        relay.add_link(LinkSpec::new(0, taken, up)).await,
        Err(RelayError::Bind { .. })
    ));
    println!("{}", relay.status()[0]);
}

#[tokio::test]
async fn an_upstream_that_restarts_is_reached_again() {
    // A free port with nobody on it (a node that is down).
    let up = {
        let l = TcpListener::bind(any_port(ip(1, 1))).await.unwrap();
        l.local_addr().unwrap()
    };
    let (relay, listen) = relay_to(up).await;
    let mut c = TcpStream::connect(listen).await.unwrap();
    assert!(
        ends(&mut c).await,
        "a refused upstream connect must end the client's"
    );
    let u = UdpSocket::bind(any_port(ip(1, 2))).await.unwrap();
    u.connect(listen).await.unwrap();
    for _ in 0..3 {
        u.send(b"anyone?").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(relay.status()[0].counters.tcp_connect_failed, 1);

    // The node comes back on the same port: TCP and the same UDP client's
    // socket (which saw ICMP refusals meanwhile) work again.
    let l = TcpListener::bind(up).await.unwrap();
    let echo = UdpSocket::bind(up).await.unwrap();
    tokio::spawn(async move {
        let mut b = [0u8; 64];
        while let Ok((n, from)) = echo.recv_from(&mut b).await {
            let _ = echo.send_to(&b[..n], from).await;
        }
    });
    let _c = TcpStream::connect(listen).await.unwrap();
    timeout(WAIT, l.accept()).await.unwrap().unwrap();
    let mut b = [0u8; 16];
    let mut answered = false;
    for _ in 0..10 {
        u.send(b"back?").await.unwrap();
        if let Ok(Ok(n)) = timeout(Duration::from_millis(100), u.recv(&mut b)).await {
            assert_eq!(&b[..n], b"back?");
            answered = true;
            break;
        }
    }
    assert!(answered, "UDP did not pass after the upstream came back");
}
