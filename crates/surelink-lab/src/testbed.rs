//! `surelink-lab testbed up|down|fault|undo|pause|resume`: hosts as network
//! namespaces joined by two independent veth links, the network faults of
//! the failover experiments (on either link), and SIGSTOP/SIGCONT of every
//! process on a host. Needs root and iproute2 (`ip`, `ss`); nftables (`nft`) for
//! drop and loss faults.
//!
//! ```text
//!   sl-a  10.77.1.1 ── veth sl-a1 ═══ sl-b1 ── 10.77.1.2  sl-b     (network 1)
//!         10.77.2.1 ── veth sl-a2 ═══ sl-b2 ── 10.77.2.2           (network 2)
//! ```
//!
//! Everything it makes carries the `sl-` prefix, and `down` removes all of
//! it, whatever state an earlier run (even a crashed one) left: it is
//! idempotent, and `up` starts with a `down`.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};

/// The namespaces (hosts).
pub(crate) const HOSTS: [&str; 2] = ["sl-a", "sl-b"];
/// Addresses: `ADDRS[host][network]`.
pub(crate) const ADDRS: [[&str; 2]; 2] = [["10.77.1.1", "10.77.2.1"], ["10.77.1.2", "10.77.2.2"]];
/// The nftables table a fault on network `net` (0-based) lives in, inside
/// a namespace: one per network, so both can be faulted at once.
fn nft_table(net: usize) -> String {
    format!("sl_fault{}", net + 1)
}

/// `surelink-lab testbed …`.
#[derive(Args, Debug, Clone)]
pub(crate) struct TestbedArgs {
    #[command(subcommand)]
    command: TestbedCommand,
}

#[derive(Subcommand, Debug, Clone)]
enum TestbedCommand {
    /// Build the two hosts and both links (removing an old testbed first).
    Up,
    /// Remove everything the testbed made (idempotent).
    Down,
    /// Inject a fault on a network.
    Fault {
        /// Which fault.
        #[arg(value_enum)]
        fault: Fault,
        /// For `loss`: percent of packets dropped.
        #[arg(long, default_value_t = 10)]
        percent: u8,
        /// Which network (1 or 2).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        network: u8,
    },
    /// Undo a fault.
    Undo {
        /// Which fault.
        #[arg(value_enum)]
        fault: Fault,
        /// Which network (1 or 2).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
        network: u8,
    },
    /// Stop every process in a host's namespace (SIGSTOP), as a long GC
    /// pause or a frozen VM would.
    Pause {
        /// Which host: `a` or `b`.
        #[arg(value_parser = ["a", "b"])]
        host: String,
    },
    /// Continue the processes `pause` stopped (SIGCONT).
    Resume {
        /// Which host: `a` or `b`.
        #[arg(value_parser = ["a", "b"])]
        host: String,
    },
}

/// A fault on one network (network 1: link `sl-a1`/`sl-b1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub(crate) enum Fault {
    /// Both ends of the link down.
    LinkDown,
    /// Packets from host a to host b dropped (one way).
    OneWay,
    /// Packets dropped both ways.
    BothWays,
    /// A share of packets dropped both ways on network 1.
    Loss,
    /// Every TCP connection on the network killed (`ss -K`), once.
    Kill,
    /// A blackhole route to b's address on the network, on host a.
    Blackhole,
    /// TCP dropped both ways, UDP passing: a stateful firewall or
    /// middlebox that lost the connections' state (a gray failure the
    /// heartbeats do not see; only the sessions' retransmission timeouts
    /// can).
    TcpOnly,
}

/// Runs a command to completion; its stdout.
pub(crate) fn run(args: &[&str]) -> Result<String> {
    surelink_lab::child::run(args)
}

/// Feeds `script` to `nft -f -` inside namespace `ns`.
pub(crate) fn nft_in(ns: &str, script: &str) -> Result<()> {
    surelink_lab::child::run_with_input(
        &["ip", "netns", "exec", ns, "nft", "-f", "-"],
        Some(script),
    )
    .with_context(|| format!("nft in {ns}"))?;
    Ok(())
}

/// Whether this process can build the testbed, and why not.
pub(crate) fn unavailable() -> Option<String> {
    surelink_lab::host::netns_unavailable()
}

/// Removes every namespace and link the testbed made.
pub(crate) fn down() -> Result<()> {
    let list = run(&["ip", "netns", "list"]).unwrap_or_default();
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with("sl-") {
            // Deleting a namespace deletes the veth ends inside it, and
            // with them their peers.
            let _ = run(&["ip", "netns", "del", name]);
        }
    }
    // A crash between creating a veth pair and moving it leaves it here.
    let links = run(&["ip", "-o", "link", "show"]).unwrap_or_default();
    for line in links.lines() {
        if let Some(name) = line.split(':').nth(1).map(str::trim) {
            let name = name.split('@').next().unwrap_or(name);
            if name.starts_with("sl-") {
                let _ = run(&["ip", "link", "del", name]);
            }
        }
    }
    Ok(())
}

/// Builds both hosts and links.
pub(crate) fn up() -> Result<()> {
    if let Some(why) = unavailable() {
        bail!("{why}");
    }
    down()?;
    for h in HOSTS {
        run(&["ip", "netns", "add", h])?;
        run(&["ip", "-n", h, "link", "set", "lo", "up"])?;
    }
    for (net, (addr_a, addr_b)) in ADDRS[0].iter().zip(ADDRS[1].iter()).enumerate() {
        let (a, b) = (format!("sl-a{}", net + 1), format!("sl-b{}", net + 1));
        run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
        for (ns, dev, ip) in [(HOSTS[0], &a, addr_a), (HOSTS[1], &b, addr_b)] {
            run(&["ip", "link", "set", dev, "netns", ns])?;
            let addr = format!("{ip}/24");
            run(&["ip", "-n", ns, "addr", "add", &addr, "dev", dev])?;
            run(&["ip", "-n", ns, "link", "set", dev, "up"])?;
        }
    }
    Ok(())
}

/// Sets both ends of link `net` `up` or `down`.
fn link(net: usize, state: &str) -> Result<()> {
    run(&[
        "ip",
        "-n",
        "sl-a",
        "link",
        "set",
        &format!("sl-a{}", net + 1),
        state,
    ])?;
    run(&[
        "ip",
        "-n",
        "sl-b",
        "link",
        "set",
        &format!("sl-b{}", net + 1),
        state,
    ])?;
    Ok(())
}

/// Adds (`add`) or removes (`del`) the blackhole route to b's address on
/// network `net`, on host a.
fn blackhole(net: usize, op: &str) -> Result<()> {
    let to = format!("{}/32", ADDRS[1][net]);
    run(&["ip", "-n", "sl-a", "route", op, "blackhole", &to])?;
    Ok(())
}

/// Injects `fault` on network `net` (0-based).
pub(crate) fn inject(net: usize, fault: Fault, percent: u8) -> Result<()> {
    let (a, b) = (ADDRS[0][net], ADDRS[1][net]);
    let table = nft_table(net);
    match fault {
        Fault::LinkDown => link(net, "down")?,
        Fault::OneWay => nft_in(
            "sl-b",
            &format!(
                "add table inet {table}\n\
                 add chain inet {table} in {{ type filter hook input priority 0; }}\n\
                 add rule inet {table} in ip saddr {a} ip daddr {b} drop\n"
            ),
        )?,
        Fault::BothWays | Fault::Loss | Fault::TcpOnly => {
            let cond = match fault {
                Fault::Loss => format!("numgen random mod 100 < {percent} "),
                Fault::TcpOnly => "meta l4proto tcp ".to_string(),
                _ => String::new(),
            };
            for (ns, from, to) in [("sl-b", a, b), ("sl-a", b, a)] {
                nft_in(
                    ns,
                    &format!(
                        "add table inet {table}\n\
                         add chain inet {table} in {{ type filter hook input priority 0; }}\n\
                         add rule inet {table} in ip saddr {from} ip daddr {to} {cond}drop\n"
                    ),
                )?;
            }
        }
        Fault::Kill => {
            for (ns, local) in [("sl-a", a), ("sl-b", b)] {
                run(&["ip", "netns", "exec", ns, "ss", "-K", "src", local])?;
            }
        }
        Fault::Blackhole => blackhole(net, "add")?,
    }
    Ok(())
}

/// Undoes `fault` on network `net` (0-based).
pub(crate) fn undo(net: usize, fault: Fault) -> Result<()> {
    match fault {
        Fault::LinkDown => link(net, "up")?,
        Fault::OneWay | Fault::BothWays | Fault::Loss | Fault::TcpOnly => {
            for ns in HOSTS {
                let _ = nft_in(ns, &format!("delete table inet {}\n", nft_table(net)));
            }
        }
        Fault::Kill => {}
        Fault::Blackhole => blackhole(net, "del")?,
    }
    Ok(())
}

/// Applies `signal` to every process in host `host`'s namespace; returns
/// how many.
fn signal_host(host: &str, signal: fn(u32) -> std::io::Result<()>) -> Result<usize> {
    let ns = format!("sl-{host}");
    let pids = run(&["ip", "netns", "pids", &ns])?;
    let mut n = 0;
    for pid in pids.split_whitespace() {
        let pid: u32 = pid
            .parse()
            .with_context(|| format!("`ip netns pids {ns}` printed {pid:?}"))?;
        signal(pid).with_context(|| format!("signalling process {pid} in {ns}"))?;
        n += 1;
    }
    Ok(n)
}

/// Runs `surelink-lab testbed …`.
pub(crate) fn main(args: &TestbedArgs) -> Result<()> {
    match &args.command {
        TestbedCommand::Up => {
            up()?;
            println!(
                "testbed up: {} ({} / {}) and {} ({} / {})",
                HOSTS[0], ADDRS[0][0], ADDRS[0][1], HOSTS[1], ADDRS[1][0], ADDRS[1][1]
            );
        }
        TestbedCommand::Down => {
            down()?;
            println!("testbed down: every sl-* namespace and link removed");
        }
        TestbedCommand::Fault {
            fault,
            percent,
            network,
        } => {
            inject(usize::from(*network - 1), *fault, *percent)?;
            println!("fault {fault:?} on network {network}");
        }
        TestbedCommand::Undo { fault, network } => {
            undo(usize::from(*network - 1), *fault)?;
            println!("fault {fault:?} on network {network} undone");
        }
        TestbedCommand::Pause { host } => {
            let pids = signal_host(host, surelink_sys::process::stop)?;
            println!("host {host}: stopped {pids} process(es)");
        }
        TestbedCommand::Resume { host } => {
            let pids = signal_host(host, surelink_sys::process::resume)?;
            println!("host {host}: resumed {pids} process(es)");
        }
    }
    Ok(())
}
