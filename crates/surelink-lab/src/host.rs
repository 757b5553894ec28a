//! What this machine offers the harness: root, programs on `PATH` (or in
//! an sbin directory), and free ports.

use std::net::{IpAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Whether this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
    })
}

/// An executable `name` on `PATH` or in one of `extra` directories.
pub fn find_program(name: &str, extra: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Why the network-namespace testbed cannot be built here (not root, or
/// `ip`, `ss` or `nft` missing), or `None` when it can.
pub fn netns_unavailable() -> Option<String> {
    if !is_root() {
        return Some("the testbed needs root (network namespaces, veth, nftables)".into());
    }
    for tool in ["ip", "ss", "nft"] {
        if find_program(tool, &["/usr/sbin", "/sbin"]).is_none() {
            return Some(format!(
                "`{tool}` is missing (apt-get install iproute2 nftables)"
            ));
        }
    }
    None
}

/// A port on `ip` that is free for TCP and for UDP alike (a surelink
/// listener's heartbeat socket shares its port). Another process may
/// still take it before the caller binds it; tests accept that small
/// window, as every free-port scheme does.
pub fn free_port(ip: IpAddr) -> Result<u16> {
    for _ in 0..64 {
        let l = TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}:0"))?;
        let port = l.local_addr()?.port();
        if UdpSocket::bind((ip, port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no port on {ip} is free for both TCP and UDP")
}

/// A cgroup (v1 `cpu` controller) capping the processes added to it at
/// `pct` % of one core per `period`; removed when dropped (after its
/// processes are gone). Needs root.
#[derive(Debug)]
pub struct CpuCap {
    dir: PathBuf,
}

impl CpuCap {
    /// Creates `/sys/fs/cgroup/cpu/surelink-<tag>-<pid>`.
    ///
    /// A short `period` makes a slower core (stopped at most a fraction
    /// of it at a time), not one frozen for most of each 100 ms (the
    /// kernel's default), which would measure how peers' failure
    /// detectors take 75 ms stalls instead.
    pub fn new(tag: &str, pct: u32, period: std::time::Duration) -> Result<CpuCap> {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/cpu/surelink-{tag}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).with_context(|| {
            format!("creating {} (needs root and cgroup v1 cpu)", dir.display())
        })?;
        let period_us = u64::try_from(period.as_micros())
            .unwrap_or(100_000)
            .clamp(1000, 1_000_000);
        std::fs::write(dir.join("cpu.cfs_period_us"), period_us.to_string())?;
        std::fs::write(
            dir.join("cpu.cfs_quota_us"),
            (period_us * u64::from(pct) / 100).max(1000).to_string(),
        )?;
        // A real-time budget (5 %), so a process whose detector sender
        // runs under SCHED_RR may join: with RT group scheduling, a cgroup
        // without one refuses real-time threads. Absent without it.
        let rt = dir.join("cpu.rt_runtime_us");
        if rt.exists() {
            std::fs::write(&rt, "50000")
                .with_context(|| format!("giving {} a real-time budget", dir.display()))?;
        }
        Ok(CpuCap { dir })
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) -> Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .context("moving a process into its cgroup")
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// How the harness starts a memcached (the contender and the backend the
/// lab's benches, demos and attacks run beside surelink).
#[derive(Clone, Debug)]
pub struct Memcached {
    /// Listen address (`-l`).
    pub listen: IpAddr,
    /// Its TCP port (`-p`; UDP is off, `-U 0`).
    pub port: u16,
    /// Pin it to this core (`taskset -c`).
    pub core: Option<usize>,
    /// Worker threads (`-t`; memcached's default 4 when `None`).
    pub threads: Option<u32>,
    /// Item memory, MiB (`-m`; memcached's default 64 when `None`).
    pub memory_mb: Option<u32>,
}

impl Memcached {
    /// On `listen:port`, otherwise memcached's defaults.
    pub fn new(listen: IpAddr, port: u16) -> Memcached {
        Memcached {
            listen,
            port,
            core: None,
            threads: None,
            memory_mb: None,
        }
    }

    /// The command (`-u root` when root, which memcached requires),
    /// named `name`, not yet spawned: the caller adds its output, its
    /// namespace or `die_with_parent`.
    pub fn command(&self, name: &str) -> Result<crate::child::Command> {
        let bin = find_program("memcached", &["/usr/bin", "/usr/local/bin"])
            .context("memcached not installed (apt-get install memcached)")?;
        let mut c = match self.core {
            Some(core) => crate::child::Command::new(name, "taskset")
                .args(["-c", &core.to_string()])
                .arg(bin),
            None => crate::child::Command::new(name, bin),
        };
        c = c.args([
            "-l",
            &self.listen.to_string(),
            "-p",
            &self.port.to_string(),
            "-U",
            "0",
        ]);
        if let Some(t) = self.threads {
            c = c.args(["-t", &t.to_string()]);
        }
        if let Some(m) = self.memory_mb {
            c = c.args(["-m", &m.to_string()]);
        }
        if is_root() {
            c = c.args(["-u", "root"]);
        }
        Ok(c)
    }

    /// Its address.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.listen, self.port)
    }
}
