//! The heartbeat socket: UDP with receive-drop counts and TX timestamps.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::steer::{self, QueueState, StraySocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One datagram received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Bytes in the datagram (written to the caller's buffer).
    pub len: usize,
    /// Who sent it.
    pub from: SocketAddr,
    /// The socket's count of datagrams dropped for a full receive queue
    /// since it was opened (`SO_RXQ_OVFL`), as of this datagram. The kernel
    /// leaves it out until the first drop; `None` then means zero.
    pub drops: Option<u32>,
}

/// When a sent datagram reached the network device (software TX timestamp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxTimestamp {
    /// The datagram's number: the value [`HeartbeatSocket::send_to`]
    /// returned for it.
    pub id: u32,
    /// The kernel's timestamp (`CLOCK_REALTIME`).
    pub at: SystemTime,
}

/// A UDP socket for heartbeats and barriers.
///
/// Where the kernel allows it, two sockets on one address and port: one
/// receives, the other sends and collects the TX timestamps. Both are in
/// one `SO_REUSEPORT` group whose classic-BPF program steers every
/// incoming datagram to the receiving one, so peers still answer to the
/// port our heartbeats come from and everything arrives on one queue (the
/// queue the barriers prove clear). The point: a TX timestamp lands on its
/// socket's error queue and wakes whoever waits on that socket — on one
/// shared socket, the blocked reader, once per heartbeat sent, for nothing
/// (a context switch each; on a busy two-core host they are latency).
/// Without reuseport or the filter, one socket does both, as before.
/// (A reuseport group only admits sockets of the same user, and the filter
/// always picks the first socket, ours.)
#[derive(Debug)]
pub struct HeartbeatSocket {
    /// Receives; also sends when there is no `tx`.
    sock: UdpSocket,
    /// Sends and holds the TX timestamps.
    tx: Option<UdpSocket>,
    /// Datagrams sent so far (the kernel numbers TX timestamps the same way).
    sent: AtomicU32,
    timestamps: bool,
    /// Whether the strays' socket joined the group (steering may pick it).
    strays: AtomicBool,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` outlives the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<i32>()).unwrap_or(4),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An IPv4 address as the kernel takes it (a non-IPv4 one becomes
/// 0.0.0.0:0, which the kernel refuses: heartbeat sockets are IPv4 only).
fn sockaddr_in_of(a: SocketAddr) -> libc::sockaddr_in {
    let (ip, port) = match a {
        SocketAddr::V4(v4) => (u32::from(*v4.ip()), v4.port()),
        SocketAddr::V6(_) => (0, 0),
    };
    libc::sockaddr_in {
        sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2),
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: ip.to_be() },
        sin_zero: [0; 8],
    }
}

pub(crate) fn to_socket_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    if i32::from(ss.ss_family) != libc::AF_INET {
        return None;
    }
    // SAFETY: the family says this is a sockaddr_in.
    let sin = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
    Some(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    )))
}

/// Room for the control messages we ask for (aligned like cmsghdr).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; 256]);

/// A UDP socket in `addr`'s `SO_REUSEPORT` group (created if new).
fn reuseport_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    Ok(s.into())
}

/// Makes the reuseport group of `sock` hand every datagram to its first
/// socket (`sock`, when it is the first bound): a one-instruction classic
/// BPF program, `ret #0`.
fn steer_to_first(sock: &UdpSocket) -> io::Result<()> {
    let mut code = [libc::sock_filter {
        code: u16::try_from(libc::BPF_RET | libc::BPF_K).unwrap_or(0x06),
        jt: 0,
        jf: 0,
        k: 0,
    }];
    steer::attach_reuseport_program(sock, &mut code)
}

/// The receiving socket and, where the kernel allows, the sending one
/// (see [`HeartbeatSocket`]).
fn bind_pair(addr: SocketAddr) -> io::Result<(UdpSocket, Option<UdpSocket>)> {
    let Ok(rx) = reuseport_socket(addr) else {
        return Ok((UdpSocket::bind(addr)?, None));
    };
    let tx = steer_to_first(&rx)
        .and_then(|()| reuseport_socket(rx.local_addr()?))
        .ok();
    Ok((rx, tx))
}

impl HeartbeatSocket {
    /// Binds to `addr` (IPv4), asks for drop counts and, where the kernel
    /// offers them, software TX timestamps.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        if !addr.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "heartbeat sockets are IPv4 only",
            ));
        }
        let (sock, tx) = bind_pair(addr)?;
        setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)?;
        let flags = libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        let send_fd = tx.as_ref().unwrap_or(&sock).as_raw_fd();
        let timestamps = i32::try_from(flags).ok().is_some_and(|f| {
            setsockopt_int(send_fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPING, f).is_ok()
        });
        Ok(HeartbeatSocket {
            sock,
            tx,
            sent: AtomicU32::new(0),
            timestamps,
            strays: AtomicBool::new(false),
        })
    }

    /// Adds the strays' socket to the group (see [`crate::steer`]); until
    /// [`HeartbeatSocket::steer`] is called every datagram still goes to
    /// the receiving socket. Needs the split (reuseport) form; call once.
    pub fn open_strays(&self) -> io::Result<StraySocket> {
        if self.tx.is_none() || self.strays.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no reuseport group, or strays' socket already open",
            ));
        }
        let sock = reuseport_socket(self.sock.local_addr()?)?;
        self.strays.store(true, Ordering::Relaxed);
        Ok(StraySocket { sock })
    }

    /// Datagrams from `listed` source addresses (and, until then, every
    /// datagram) come to this socket; from any other, to the strays'
    /// socket. Replaces the previous list.
    pub fn steer(&self, listed: &[Ipv4Addr]) -> io::Result<()> {
        if !self.strays.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no strays' socket to steer to",
            ));
        }
        steer::steer(&self.sock, listed)
    }

    /// Waits up to `timeout` for a datagram to read; whether one is there
    /// (so a reader can count it in hand before it leaves the queue).
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        steer::wait_readable(&self.sock, timeout)
    }

    /// The receive queue's occupancy and drop count, without a datagram.
    pub fn queue_state(&self) -> io::Result<QueueState> {
        steer::queue_state(&self.sock)
    }

    /// The socket that sends (and holds the TX timestamps).
    fn sender(&self) -> &UdpSocket {
        self.tx.as_ref().unwrap_or(&self.sock)
    }

    /// Whether sending and receiving are split over two sockets (see
    /// [`HeartbeatSocket`]); `false` where the kernel refused it.
    pub fn split(&self) -> bool {
        self.tx.is_some()
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Whether sends get TX timestamps.
    pub fn timestamps_enabled(&self) -> bool {
        self.timestamps
    }

    /// How long [`HeartbeatSocket::recv`] blocks (`None`: for ever).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.sock.set_read_timeout(timeout)
    }

    /// Sets the receive buffer size (bytes; the kernel doubles it).
    pub fn set_recv_buffer(&self, bytes: usize) -> io::Result<()> {
        setsockopt_int(
            self.sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            i32::try_from(bytes).unwrap_or(i32::MAX),
        )
    }

    /// Shuts the socket down both ways: a thread blocked in
    /// [`HeartbeatSocket::recv`] returns at once.
    pub fn shutdown(&self) {
        for s in std::iter::once(&self.sock).chain(&self.tx) {
            // SAFETY: plain system call on our own descriptor.
            unsafe { libc::shutdown(s.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }

    /// Sends one datagram; returns its number for matching TX timestamps.
    pub fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<u32> {
        self.sender().send_to(buf, to)?;
        Ok(self.sent.fetch_add(1, Ordering::Relaxed))
    }

    /// Sends many datagrams, each to its own address, in as few system
    /// calls as the kernel allows (`sendmmsg`; IPv4 only). `result[i]` is
    /// datagram `i`'s number for matching TX timestamps, or the error it
    /// met; a failed send leaves later numbers untrustworthy (as for
    /// [`HeartbeatSocket::send_to`]).
    pub fn send_batch(&self, msgs: &[(&[u8], SocketAddr)]) -> Vec<io::Result<u32>> {
        const CHUNK: usize = 64;
        let mut out = Vec::with_capacity(msgs.len());
        let fd = self.sender().as_raw_fd();
        let mut i = 0;
        while i < msgs.len() {
            let chunk = &msgs[i..(i + CHUNK).min(msgs.len())];
            let mut names: Vec<libc::sockaddr_in> =
                chunk.iter().map(|(_, a)| sockaddr_in_of(*a)).collect();
            let mut iov: Vec<libc::iovec> = chunk
                .iter()
                .map(|(b, _)| libc::iovec {
                    iov_base: b.as_ptr().cast_mut().cast(),
                    iov_len: b.len(),
                })
                .collect();
            let name_len =
                libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_in>()).unwrap_or(16);
            let mut hdrs: Vec<libc::mmsghdr> = (0..chunk.len())
                .map(|k| {
                    // SAFETY: a zeroed msghdr is a valid input.
                    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                    h.msg_name = (&mut names[k] as *mut libc::sockaddr_in).cast();
                    h.msg_namelen = name_len;
                    h.msg_iov = &mut iov[k];
                    h.msg_iovlen = 1;
                    libc::mmsghdr {
                        msg_hdr: h,
                        msg_len: 0,
                    }
                })
                .collect();
            // SAFETY: every pointer in `hdrs` is valid for the sizes given
            // and outlives the call (`names`, `iov`, the caller's bytes).
            let n = unsafe {
                libc::sendmmsg(
                    fd,
                    hdrs.as_mut_ptr(),
                    u32::try_from(hdrs.len()).unwrap_or(1),
                    0,
                )
            };
            match usize::try_from(n) {
                Ok(n) if n > 0 => {
                    for _ in 0..n {
                        out.push(Ok(self.sent.fetch_add(1, Ordering::Relaxed)));
                    }
                    i += n;
                }
                _ => {
                    // The first datagram of the chunk failed: record it and
                    // go on with the next.
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    out.push(Err(e));
                    i += 1;
                }
            }
        }
        out
    }

    /// Receives one datagram into `buf` (blocking up to the read timeout).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Received> {
        // SAFETY: zeroed structs are valid inputs to recvmsg.
        let mut from: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut cbuf = CmsgBuf([0; 256]);
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen =
            libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_storage>()).unwrap_or(128);
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cbuf.0.len();
        // SAFETY: every pointer in `msg` is valid for the sizes given.
        let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut msg, 0) };
        let len = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        let mut drops = None;
        // SAFETY: walking the control messages recvmsg wrote.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_RXQ_OVFL {
                    drops = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<u32>()));
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        let from = to_socket_addr(&from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "non-IPv4 sender"))?;
        Ok(Received { len, from, drops })
    }

    /// Moves every TX timestamp waiting in the socket's error queue to `out`
    /// (never blocks).
    pub fn take_tx_timestamps(&self, out: &mut Vec<TxTimestamp>) -> io::Result<()> {
        /// Stamps taken per system call.
        const AT_ONCE: usize = 32;
        let mut data = [[0u8; 64]; AT_ONCE];
        let mut cbufs = [CmsgBuf([0; 256]); AT_ONCE];
        loop {
            let mut iov: [libc::iovec; AT_ONCE] = std::array::from_fn(|i| libc::iovec {
                iov_base: data[i].as_mut_ptr().cast(),
                iov_len: data[i].len(),
            });
            let cb = cbufs.as_mut_ptr();
            let mut msgs: [libc::mmsghdr; AT_ONCE] = std::array::from_fn(|i| {
                // SAFETY: a zeroed msghdr is a valid input.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = &mut iov[i];
                h.msg_iovlen = 1;
                // SAFETY: `i < AT_ONCE`, inside the array.
                h.msg_control = unsafe { cb.add(i) }.cast();
                h.msg_controllen = 256;
                libc::mmsghdr {
                    msg_hdr: h,
                    msg_len: 0,
                }
            });
            // SAFETY: every pointer in `msgs` is valid for the sizes given.
            let n = unsafe {
                libc::recvmmsg(
                    self.sender().as_raw_fd(),
                    msgs.as_mut_ptr(),
                    u32::try_from(AT_ONCE).unwrap_or(1),
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            let Ok(n) = usize::try_from(n) else {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(()),
                    _ => Err(e),
                };
            };
            for m in msgs.iter().take(n) {
                if let Some(ts) = tx_timestamp_of(&m.msg_hdr) {
                    out.push(ts);
                }
            }
            if n < AT_ONCE {
                return Ok(());
            }
        }
    }
}

/// Whether a failed send ran out of something on this host (buffers,
/// memory, a full queue): the sender's own shortfall, as opposed to the
/// path refusing the datagram (an ICMP error, no route, a filter).
pub fn is_local_shortage(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOBUFS | libc::ENOMEM | libc::EAGAIN | libc::EINTR)
    )
}

/// The TX timestamp and datagram id of one message of the error queue.
fn tx_timestamp_of(msg: &libc::msghdr) -> Option<TxTimestamp> {
    let mut at = None;
    let mut id = None;
    // SAFETY: walking the control messages the kernel wrote into `msg`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            let (level, ty) = ((*c).cmsg_level, (*c).cmsg_type);
            if level == libc::SOL_SOCKET && ty == libc::SO_TIMESTAMPING {
                // struct scm_timestamping: ts[0] is the software stamp.
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::timespec>());
                if let (Ok(s), Ok(ns)) = (u64::try_from(ts.tv_sec), u32::try_from(ts.tv_nsec)) {
                    at = Some(UNIX_EPOCH + Duration::new(s, ns));
                }
            } else if (level == libc::SOL_IP && ty == libc::IP_RECVERR)
                || (level == libc::SOL_IPV6 && ty == libc::IPV6_RECVERR)
            {
                let ee =
                    std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::sock_extended_err>());
                if ee.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING {
                    id = Some(ee.ee_data);
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    Some(TxTimestamp { id: id?, at: at? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (HeartbeatSocket, HeartbeatSocket) {
        let a = HeartbeatSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = HeartbeatSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (a, b)
    }

    #[test]
    fn send_receive_and_tx_timestamps() {
        let (a, b) = pair();
        let before = SystemTime::now();
        for i in 0..3u32 {
            assert_eq!(a.send_to(b"hb", b.local_addr().unwrap()).unwrap(), i);
        }
        let mut buf = [0u8; 16];
        for _ in 0..3 {
            let r = b.recv(&mut buf).unwrap();
            assert_eq!(&buf[..r.len], b"hb");
            assert_eq!(r.from, a.local_addr().unwrap());
            assert_eq!(r.drops.unwrap_or(0), 0);
        }
        assert!(a.timestamps_enabled(), "software TX timestamps on loopback");
        let mut ts = Vec::new();
        for _ in 0..100 {
            a.take_tx_timestamps(&mut ts).unwrap();
            if ts.len() == 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let ids: Vec<u32> = ts.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        let after = SystemTime::now();
        assert!(ts.iter().all(|t| t.at >= before && t.at <= after));
    }

    /// More stamps than one batched read takes: every one comes back, in
    /// order, none twice.
    #[test]
    fn a_batch_of_sends_gets_every_tx_timestamp() {
        const N: u32 = 100;
        let (a, b) = pair();
        let to = b.local_addr().unwrap();
        let msgs: Vec<(&[u8], SocketAddr)> = (0..N).map(|_| (&b"hb"[..], to)).collect();
        let ids: Vec<u32> = a
            .send_batch(&msgs)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(ids, (0..N).collect::<Vec<u32>>());
        let mut ts = Vec::new();
        for _ in 0..1000 {
            a.take_tx_timestamps(&mut ts).unwrap();
            if ts.len() >= N as usize {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let got: Vec<u32> = ts.iter().map(|t| t.id).collect();
        assert_eq!(got, ids);
    }

    /// Without the filter, reuseport would hash some sources to the
    /// sending socket, whose datagrams nobody reads: every source must
    /// reach the receiving socket.
    #[test]
    fn every_datagram_reaches_the_receiving_socket() {
        let b = HeartbeatSocket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(b.split(), "reuseport steering refused by this kernel");
        b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let to = b.local_addr().unwrap();
        let senders: Vec<UdpSocket> = (0..64)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        for (i, s) in senders.iter().enumerate() {
            s.send_to(&[u8::try_from(i).unwrap()], to).unwrap();
        }
        let mut seen = [false; 64];
        let mut buf = [0u8; 4];
        for _ in 0..64 {
            let r = b.recv(&mut buf).expect("a datagram went astray");
            assert_eq!(r.len, 1);
            let i = usize::from(buf[0]);
            assert_eq!(r.from, senders[i].local_addr().unwrap());
            seen[i] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    /// The TX timestamps of what we send wait on the sending socket: the
    /// receiving one has nothing to report (a reader blocked on it is not
    /// woken), and the timestamps are all there.
    #[test]
    fn tx_timestamps_do_not_wake_the_receiving_socket() {
        let (a, b) = pair();
        assert!(a.split() && a.timestamps_enabled());
        for _ in 0..3 {
            a.send_to(b"hb", b.local_addr().unwrap()).unwrap();
        }
        let mut ts = Vec::new();
        for _ in 0..100 {
            a.take_tx_timestamps(&mut ts).unwrap();
            if ts.len() == 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(ts.len(), 3);
        // Sent again, then looked at before the timestamps are taken.
        a.send_to(b"hb", b.local_addr().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let mut p = libc::pollfd {
            fd: a.sock.as_raw_fd(),
            events: libc::POLLIN | libc::POLLERR,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        assert_eq!(n, 0, "the receiving socket reports {:#x}", p.revents);
        ts.clear();
        a.take_tx_timestamps(&mut ts).unwrap();
        assert_eq!(ts.len(), 1, "the timestamp is on the sending socket");
    }

    #[test]
    fn overflow_is_counted_by_rxq_ovfl() {
        let (a, b) = pair();
        b.set_recv_buffer(1).unwrap(); // the kernel's minimum
        let to = b.local_addr().unwrap();
        for _ in 0..2000 {
            a.send_to(&[0u8; 512], to).unwrap();
        }
        let mut buf = [0u8; 1024];
        let r = b.recv(&mut buf).unwrap();
        // Drain what fitted; the last datagram read carries the count.
        b.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut drops = r.drops;
        while let Ok(r) = b.recv(&mut buf) {
            drops = r.drops.or(drops);
        }
        a.send_to(b"x", to).unwrap();
        if let Ok(r) = b.recv(&mut buf) {
            drops = r.drops.or(drops);
        }
        assert!(
            drops.unwrap_or(0) > 0,
            "a full queue must be counted: {drops:?}"
        );
    }
}
