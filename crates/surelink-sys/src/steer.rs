//! Telling members' datagrams from everyone else's at the heartbeat port.
//!
//! The heartbeat socket's `SO_REUSEPORT` group gets a third socket, the
//! *strays'* one, and a classic-BPF program that picks the receiving
//! socket by the datagram's IPv4 source address: an address on the list
//! (members' and our own) goes to the receiving socket, every other to the
//! strays'. Each socket has its own queue and its own drop counter, so a
//! flood from other addresses fills and overflows only the strays' queue:
//! a drop counted on the receiving socket is one of a listed source's.
//!
//! Also here: the socket's drop count and queue occupancy without a
//! datagram (`SO_MEMINFO`), and a batch receive (`recvmmsg`) so reading
//! junk costs one system call per batch.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::socket::to_socket_addr;

/// The most source addresses a steering program lists (two instructions
/// each; classic BPF allows 4096).
pub const MAX_STEERED: usize = 1024;

/// `SO_MEMINFO` (asm-generic/socket.h; not in every libc).
const SO_MEMINFO: i32 = 55;
/// Entries of `SO_MEMINFO`'s answer.
const SK_MEMINFO_VARS: usize = 9;

/// Index in the reuseport group of the receiving socket (bound first).
pub(crate) const RECEIVER_INDEX: u32 = 0;
/// Index of the strays' socket (bound third, after the sending one).
pub(crate) const STRAYS_INDEX: u32 = 2;

/// Occupancy and drops of a socket's receive queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueState {
    /// Bytes held in the receive queue (0: empty).
    pub queued: u32,
    /// Datagrams dropped for a full queue since the socket was opened.
    pub drops: u32,
}

/// Reads a socket's `SO_MEMINFO`.
pub(crate) fn queue_state(sock: &UdpSocket) -> io::Result<QueueState> {
    let mut info = [0u32; SK_MEMINFO_VARS];
    let mut len = libc::socklen_t::try_from(std::mem::size_of_val(&info)).unwrap_or(36);
    // SAFETY: `info` and `len` are valid for writing; the kernel writes at
    // most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let at = |i: i32| usize::try_from(i).ok().and_then(|i| info.get(i).copied());
    Ok(QueueState {
        queued: at(libc::SK_MEMINFO_RMEM_ALLOC).unwrap_or(0),
        drops: at(libc::SK_MEMINFO_DROPS).unwrap_or(0),
    })
}

/// The steering program: `ld [src]; (jeq #ip; ret #receiver)*; ret #strays`.
fn program(listed: &[Ipv4Addr]) -> Vec<libc::sock_filter> {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: u16::try_from(code).unwrap_or(0),
        jt,
        jf,
        k,
    };
    // The IPv4 source address, 12 bytes into the network header (the
    // program runs with the data pointing past the UDP header, so the
    // header is reached through the kernel's network-header offset).
    let src = u32::from_ne_bytes((libc::SKF_NET_OFF + 12).to_ne_bytes());
    let mut code = vec![op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, src)];
    for ip in listed {
        // Equal: the next instruction (return the receiver); else skip it.
        code.push(op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            0,
            1,
            u32::from(*ip),
        ));
        code.push(op(libc::BPF_RET | libc::BPF_K, 0, 0, RECEIVER_INDEX));
    }
    code.push(op(libc::BPF_RET | libc::BPF_K, 0, 0, STRAYS_INDEX));
    code
}

/// Installs the steering program on `sock`'s reuseport group (replacing
/// the one there). At most [`MAX_STEERED`] addresses.
pub(crate) fn steer(sock: &UdpSocket, listed: &[Ipv4Addr]) -> io::Result<()> {
    if listed.len() > MAX_STEERED {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many addresses to steer",
        ));
    }
    attach_reuseport_program(sock, &mut program(listed))
}

/// Attaches the classic BPF program `code` to `sock`'s reuseport group
/// (replacing the one there): it picks the group's socket per datagram.
pub(crate) fn attach_reuseport_program(
    sock: &UdpSocket,
    code: &mut [libc::sock_filter],
) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: u16::try_from(code.len()).map_err(|_| io::ErrorKind::InvalidInput)?,
        filter: code.as_mut_ptr(),
    };
    // SAFETY: `prog` and the code it points to outlive the call (the
    // kernel copies the program); its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&prog as *const libc::sock_fprog).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::sock_fprog>()).unwrap_or(16),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Datagrams a batch receive takes at most.
pub const BATCH: usize = 32;
/// Bytes kept of each datagram in a batch (longer ones are truncated; the
/// length reported is what was kept).
pub const BATCH_SLOT: usize = 128;

/// Buffers for [`StraySocket::recv_batch`], reused across calls.
pub struct Batch {
    data: Box<[[u8; BATCH_SLOT]; BATCH]>,
    from: Box<[libc::sockaddr_storage; BATCH]>,
    len: [usize; BATCH],
    n: usize,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            data: Box::new([[0; BATCH_SLOT]; BATCH]),
            // SAFETY: an all-zero sockaddr_storage is valid.
            from: Box::new(unsafe { std::mem::zeroed() }),
            len: [0; BATCH],
            n: 0,
        }
    }
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("n", &self.n).finish()
    }
}

impl Batch {
    /// The datagrams of the last receive: bytes and sender (`None`: not
    /// IPv4).
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<SocketAddr>)> + '_ {
        (0..self.n).map(|i| (&self.data[i][..self.len[i]], to_socket_addr(&self.from[i])))
    }
}

/// The strays' socket: datagrams from sources not on the steering list.
#[derive(Debug)]
pub struct StraySocket {
    pub(crate) sock: UdpSocket,
}

impl StraySocket {
    /// Waits up to `timeout` for a datagram to read; whether one is there.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        wait_readable(&self.sock, timeout)
    }

    /// Takes up to [`BATCH`] waiting datagrams in one call, without
    /// blocking. Returns how many (0: none there).
    pub fn recv_batch(&self, batch: &mut Batch) -> io::Result<usize> {
        recv_batch(&self.sock, batch)
    }

    /// Its queue's occupancy and drop count.
    pub fn queue_state(&self) -> io::Result<QueueState> {
        queue_state(&self.sock)
    }

    /// Shuts it down: a thread blocked in [`StraySocket::recv_batch`]
    /// returns.
    pub fn shutdown(&self) {
        // SAFETY: plain system call on our own descriptor.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

/// Waits up to `timeout` for `sock` to have a datagram to read; whether
/// one is there.
pub(crate) fn wait_readable(sock: &UdpSocket, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut p, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(false),
            _ => Err(e),
        };
    }
    Ok(rc > 0)
}

/// Takes up to [`BATCH`] waiting datagrams from `sock` in one call,
/// without blocking. Returns how many (0: none there).
pub(crate) fn recv_batch(sock: &UdpSocket, batch: &mut Batch) -> io::Result<usize> {
    {
        batch.n = 0;
        let mut iov: [libc::iovec; BATCH] = std::array::from_fn(|i| libc::iovec {
            iov_base: batch.data[i].as_mut_ptr().cast(),
            iov_len: BATCH_SLOT,
        });
        let name_len =
            libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_storage>()).unwrap_or(128);
        let from = batch.from.as_mut_ptr();
        let mut msgs: [libc::mmsghdr; BATCH] = std::array::from_fn(|i| {
            // SAFETY: a zeroed msghdr is a valid input.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            // SAFETY: `i < BATCH`, inside the array.
            h.msg_name = unsafe { from.add(i) }.cast();
            h.msg_namelen = name_len;
            h.msg_iov = &mut iov[i];
            h.msg_iovlen = 1;
            libc::mmsghdr {
                msg_hdr: h,
                msg_len: 0,
            }
        });
        // SAFETY: every pointer in `msgs` is valid for the sizes given.
        let n = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                u32::try_from(BATCH).unwrap_or(1),
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let Ok(n) = usize::try_from(n) else {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        };
        for (i, m) in msgs.iter().enumerate().take(n) {
            batch.len[i] = usize::try_from(m.msg_len).unwrap_or(0).min(BATCH_SLOT);
        }
        batch.n = n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeartbeatSocket;

    /// A listed source reaches the receiving socket, any other the strays'
    /// one; a flood from elsewhere overflows only the strays' queue.
    #[test]
    fn steering_by_source_keeps_a_flood_out_of_the_members_queue() {
        let hb = HeartbeatSocket::bind("127.0.1.1:0".parse().unwrap()).unwrap();
        assert!(hb.split(), "reuseport refused by this kernel");
        hb.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let strays = hb.open_strays().unwrap();
        let member = UdpSocket::bind("127.0.1.2:0").unwrap();
        let junk = UdpSocket::bind("127.0.0.1:0").unwrap();
        hb.steer(&["127.0.1.2".parse().unwrap()]).unwrap();
        let to = hb.local_addr().unwrap();
        // Far more than any receive queue holds.
        for _ in 0..20_000 {
            junk.send_to(&[0u8; 64], to).unwrap();
        }
        member.send_to(b"member", to).unwrap();
        let mut buf = [0u8; 64];
        let r = hb.recv(&mut buf).unwrap();
        assert_eq!(&buf[..r.len], b"member");
        assert_eq!(r.from, member.local_addr().unwrap());
        assert_eq!(hb.queue_state().unwrap().drops, 0);
        let s = strays.queue_state().unwrap();
        assert!(s.drops > 0 && s.queued > 0, "{s:?}");
        let mut batch = Batch::default();
        assert!(strays.wait(Duration::from_secs(1)).unwrap());
        let n = strays.recv_batch(&mut batch).unwrap();
        assert_eq!(n, BATCH);
        assert!(batch
            .iter()
            .all(|(b, from)| b.len() == 64 && from == Some(junk.local_addr().unwrap())));
    }

    #[test]
    fn too_many_addresses_are_refused() {
        let hb = HeartbeatSocket::bind("127.0.1.1:0".parse().unwrap()).unwrap();
        let _strays = hb.open_strays().unwrap();
        let many: Vec<Ipv4Addr> = (0..=u32::try_from(MAX_STEERED).unwrap())
            .map(Ipv4Addr::from)
            .collect();
        assert!(hb.steer(&many).is_err());
        hb.steer(&many[..MAX_STEERED]).unwrap();
    }
}
