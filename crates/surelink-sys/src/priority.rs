//! Raising the calling thread's scheduling priority, so a thread whose
//! lateness costs a whole process (the detector's sender: late past its
//! slack, the process fences itself and every session ends) is not held
//! back by a machine full of ordinary threads.
//!
//! Why it matters even when the CPU is not saturated: a datagram sent on
//! loopback is delivered inside `sendmsg` and wakes its receiver, which
//! preempts the sender; a round of a thousand heartbeats was measured
//! taking 0.3–1.9 s of wall time on a busy 2-core host for ~20 ms of CPU.

use std::io;

/// The scheduling class a thread got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// `SCHED_RR` at this priority: no ordinary thread preempts it.
    Realtime(i32),
    /// `SCHED_OTHER` at this nice value (below 0: more CPU weight, and
    /// preempted less often by woken threads).
    Nice(i32),
}

impl std::fmt::Display for Priority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Priority::Realtime(p) => write!(f, "SCHED_RR priority {p}"),
            Priority::Nice(n) => write!(f, "nice {n}"),
        }
    }
}

/// Puts the calling thread (only it: Linux sets these per thread) in
/// `SCHED_RR` at `priority` (1–99).
///
/// Needs `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` at least `priority`; fails
/// with `EPERM` otherwise, and (cgroup v1 with RT group scheduling) when
/// the thread's cpu cgroup has no real-time budget.
pub fn set_realtime(priority: i32) -> io::Result<Priority> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Priority::Realtime(priority))
}

/// Sets the calling thread's nice value (−20 to 19). Lowering it needs
/// `CAP_SYS_NICE` or an `RLIMIT_NICE` that allows it (`EACCES`
/// otherwise).
pub fn set_nice(nice: i32) -> io::Result<Priority> {
    // SAFETY: no arguments.
    let tid = unsafe { libc::gettid() };
    let tid =
        libc::id_t::try_from(tid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: PRIO_PROCESS with a thread id sets that thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Priority::Nice(nice))
}

/// The calling thread's scheduling class now.
pub fn current() -> io::Result<Priority> {
    // SAFETY: pid 0 is the calling thread.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    if policy == libc::SCHED_RR || policy == libc::SCHED_FIFO {
        let mut param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid out-pointer.
        let rc = unsafe { libc::sched_getparam(0, &mut param) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(Priority::Realtime(param.sched_priority));
    }
    // SAFETY: no arguments.
    let tid = unsafe { libc::gettid() };
    let tid =
        libc::id_t::try_from(tid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // getpriority may return -1 legitimately: errno tells.
    // SAFETY: errno location is thread-local and valid.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: PRIO_PROCESS with a thread id reads that thread's nice.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    let err = io::Error::last_os_error();
    if nice == -1 && err.raw_os_error().unwrap_or(0) != 0 {
        return Err(err);
    }
    Ok(Priority::Nice(nice))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_reads_its_own_class_and_raising_it_does_not_touch_others() {
        let before = current().unwrap();
        let raised = std::thread::spawn(|| {
            // Privileged (CI runs as root): realtime; otherwise EPERM, and
            // the class is unchanged.
            match set_realtime(1) {
                Ok(p) => {
                    assert_eq!(current().unwrap(), p);
                    true
                }
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
                    false
                }
            }
        })
        .join()
        .unwrap();
        // Per thread: this one is as it was.
        assert_eq!(current().unwrap(), before);
        let _ = raised;
        std::thread::spawn(|| {
            // Raising nice (lowering priority) is always allowed.
            let p = set_nice(5).unwrap();
            assert_eq!(current().unwrap(), p);
        })
        .join()
        .unwrap();
        assert_eq!(current().unwrap(), before);
    }
}
