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
