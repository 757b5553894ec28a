//! Receive drop counters outside the socket: the interface's (device and
//! per-CPU backlog drops). The host's UDP counters are left out on purpose:
//! see `surelink`'s detector shell.

use std::io;
use std::path::Path;

/// The interface's `rx_dropped` counter.
pub fn interface_rx_dropped(interface: &str) -> io::Result<u64> {
    let path = Path::new("/sys/class/net")
        .join(interface)
        .join("statistics/rx_dropped");
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad rx_dropped"))
}

/// The name of the interface that holds `ip`, if any.
pub fn interface_of(ip: std::net::IpAddr) -> Option<String> {
    let std::net::IpAddr::V4(v4) = ip else {
        return None;
    };
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: the address is valid while the list lives.
            let family = unsafe { (*ifa.ifa_addr).sa_family };
            if i32::from(family) == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let addr = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if addr == v4 || (v4.is_loopback() && addr.is_loopback()) {
                    // SAFETY: ifa_name is a NUL-terminated string.
                    let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                    found = Some(name.to_string_lossy().into_owned());
                    break;
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_machine() {
        let lo = interface_of("127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(lo, "lo");
        interface_rx_dropped(&lo).unwrap();
    }
}
