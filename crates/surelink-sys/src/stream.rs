//! A connection's receive queue, for the detector's barrier: data a peer
//! sent that waits unread behind our own stalled reader is a sign of life
//! the barrier must see (busy pairs let data stand in for heartbeats).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Bytes waiting in a connected stream socket's receive queue, not yet
/// read (`FIONREAD`; for TCP, in-order bytes only).
pub fn unread_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is open for the borrow; `n` is valid for writing an int.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(n).unwrap_or(0))
}

/// How many times a TCP connection's retransmission timer has backed off
/// since it last heard an acknowledgement (`TCP_INFO`'s `tcpi_backoff`):
/// 0 while the peer's kernel acknowledges what we send. Above 0 the next
/// retransmission is at least twice the timeout away, and with each
/// timeout it doubles again — after an outage of some hundreds of
/// milliseconds, a second or more, however soon the network came back.
pub fn retransmit_backoff(fd: BorrowedFd<'_>) -> io::Result<u8> {
    // SAFETY: zeroed is a valid `tcp_info` (plain integers).
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>())
        .map_err(|_| io::Error::other("tcp_info size"))?;
    // SAFETY: `fd` is open for the borrow; `info` and `len` are valid for
    // writing and `len` holds `info`'s size.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::addr_of_mut!(info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.tcpi_backoff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    #[test]
    fn a_connection_whose_peer_acknowledges_has_not_backed_off() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (_b, _) = l.accept().expect("accept");
        a.write_all(b"hello").expect("write");
        assert_eq!(retransmit_backoff(a.as_fd()).expect("TCP_INFO"), 0);
        // Not a TCP socket: a typed error, not a made-up figure.
        let u = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        assert!(retransmit_backoff(u.as_fd()).is_err());
    }

    #[test]
    fn counts_what_was_sent_and_not_read() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (mut b, _) = l.accept().expect("accept");
        assert_eq!(unread_bytes(b.as_fd()).expect("ioctl"), 0);
        a.write_all(b"hello").expect("write");
        let deadline = Instant::now() + Duration::from_secs(5);
        while unread_bytes(b.as_fd()).expect("ioctl") < 5 {
            assert!(Instant::now() < deadline, "bytes never showed up");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut buf = [0u8; 3];
        b.read_exact(&mut buf).expect("read");
        assert_eq!(unread_bytes(b.as_fd()).expect("ioctl"), 2);
    }
}
