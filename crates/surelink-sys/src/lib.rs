//! The Linux parts of surelink's failure detector (SafeTimer), kept apart
//! so the rest of the workspace has no `unsafe` and no platform code.
//!
//! - [`HeartbeatSocket`]: a UDP socket that reports its receive-queue drop
//!   count with every datagram (`SO_RXQ_OVFL`) and the software TX
//!   timestamp of every datagram it sends (`SO_TIMESTAMPING`, read from the
//!   socket's error queue).
//! - [`counters`]: an interface's `rx_dropped` (the device's and the per-CPU
//!   backlogs' drops).
//! - [`steer`]: a third socket in the heartbeat port's group for datagrams
//!   from sources not on a list (members' addresses), so a flood from
//!   elsewhere overflows only its queue; `SO_MEMINFO` queue state; batch
//!   receive.
//! - [`stream`]: bytes waiting unread in a connection's receive queue.
//! - [`priority`]: raising the calling thread's scheduling class
//!   (`SCHED_RR` or a lower nice value) for the detector's sender.
//! - [`cpu`]: pinning the calling thread to one CPU, so a barrier can be sent
//!   through each CPU's receive backlog in turn.
//!
//! What the checks cover: a barrier sent from a second socket on this host
//! enters the same per-CPU backlog and the same socket queue as the
//! heartbeats that arrived before it on that CPU; when every CPU's barrier
//! has come out of the heartbeat socket, every heartbeat the kernel accepted
//! before the barriers were sent has been read or counted as dropped. It
//! does **not** cover the NIC's own rings and drop counters (drivers read
//! them lazily; the paper patches the driver for that) — on loopback and
//! veth there is no NIC ring.
//!
//! Nothing here works on other platforms; the crate does not build there.

#![allow(unsafe_code)]

pub mod counters;
pub mod cpu;
pub mod priority;
pub mod private;
mod socket;
pub mod steer;
pub mod stream;

pub use private::{PollRegistry, Poller, PrivateSocket};
pub use socket::{is_local_shortage, HeartbeatSocket, Received, TxTimestamp};
pub use steer::{QueueState, StraySocket};

/// Signals for experiments that stop and resume a process.
pub mod process {
    use std::io;

    fn signal(pid: u32, sig: i32) -> io::Result<()> {
        let pid = i32::try_from(pid)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
        // SAFETY: plain system call; a wrong pid is an error, not UB.
        if unsafe { libc::kill(pid, sig) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Stops every thread of `pid` (SIGSTOP), as a long pause would.
    pub fn stop(pid: u32) -> io::Result<()> {
        signal(pid, libc::SIGSTOP)
    }

    /// Resumes a stopped process (SIGCONT).
    pub fn resume(pid: u32) -> io::Result<()> {
        signal(pid, libc::SIGCONT)
    }
}

/// `CLOCK_BOOTTIME`: monotonic, and unlike `CLOCK_MONOTONIC` (what
/// `std::time::Instant` reads) it keeps counting while the machine is
/// suspended — so a sender fence built on it closes across a suspend.
pub fn boottime() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec; CLOCK_BOOTTIME exists on Linux ≥ 2.6.39.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Raises this process's soft limit on open files to its hard limit (what
/// an unprivileged process may do) and returns the soft limit now in
/// force. Each connection is a file descriptor: an endpoint sizes its
/// connection limits below this.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let want = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: plain system call with a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    Ok(lim.rlim_cur)
}

/// Raises the limit on open files to at least `want` if this process may
/// (root may raise the hard limit, up to the kernel's `nr_open`), else as
/// far as the hard limit; returns the soft limit now in force.
pub fn raise_fd_limit_to(want: u64) -> std::io::Result<u64> {
    let now = raise_fd_limit()?;
    if now >= want {
        return Ok(now);
    }
    let lim = libc::rlimit {
        rlim_cur: want,
        rlim_max: want,
    };
    // SAFETY: plain system call with a valid rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
        return Ok(want);
    }
    Ok(now)
}
