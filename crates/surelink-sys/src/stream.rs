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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

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
