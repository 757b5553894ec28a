//! The server processes of `bench cache`: memcached, nutcracker and the
//! surelink cache nodes and proxy (this binary's `cache node|proxy`, the
//! shipped binary's runners) as children killed with the bench, their CPU
//! time, and the TOML files and keys the surelink ones read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use surelink_lab::child::{Child, Command};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A server process, killed when dropped (the lab's one child-process
/// helper; its output goes to a log file).
pub(super) type Proc = Child;

/// Starts `program args` as `name`, in network namespace `netns` if given,
/// its output in `log`; it dies with the bench even if the bench is killed
/// outright.
pub(super) fn spawn(
    name: &str,
    program: &Path,
    args: &[String],
    netns: Option<&str>,
    log: &Path,
) -> Result<Proc> {
    Command::new(name, program)
        .args(args)
        .netns(netns)
        .log(log)
        .die_with_parent()
        .spawn()
}

/// Its CPU time so far (user + system, every thread), seconds.
pub(super) fn cpu_of(p: &Proc) -> f64 {
    cpu_seconds(p.pid())
}

/// Its context switches so far (voluntary and not, every live thread).
pub(super) fn switches_of(p: &Proc) -> u64 {
    switches(p.pid())
}

/// The command name and CPU ticks (user + system, fields 14 and 15, in
/// USER_HZ: 100 per second on Linux) of a `/proc/…/stat` text.
fn stat_ticks(stat: &str) -> Option<(&str, u64)> {
    // The command name may hold spaces: fields start after its ')'.
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // After ')': state is field 3, so utime (14) is index 11, stime index 12.
    Some((comm, tick(11) + tick(12)))
}

/// CPU seconds of process `pid` from /proc.
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat_ticks(&stat).map(|(_, t)| t))
        .map_or(0.0, |t| t as f64 / 100.0)
}

/// CPU seconds of the failure detector's threads of process `pid`
/// (surelink names them `surelink-hb-*`; 0 for other programs).
pub(super) fn detector_cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    let ticks: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
        .filter_map(|stat| {
            let (comm, ticks) = stat_ticks(&stat)?;
            comm.starts_with("surelink-hb").then_some(ticks)
        })
        .sum();
    ticks as f64 / 100.0
}

/// Context switches of process `pid`: the sum over its threads of
/// `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` in
/// /proc/PID/task/TID/status (a thread that exited takes its count along).
pub(super) fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// A free port on `ip`.
pub(super) fn free_port(ip: &str) -> Result<u16> {
    surelink_lab::host::free_port(ip.parse().with_context(|| format!("address {ip:?}"))?)
}

/// Waits until a `set` through `addr` is stored (the server and whatever
/// it fronts are up). `netns`: connect from inside that namespace (via
/// `ip netns exec … bash` is not needed: callers in another namespace use
/// their own check).
pub(super) async fn wait_ready(addr: SocketAddr, procs: &[Proc], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        for p in procs {
            p.check()?;
        }
        if try_set(addr).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{addr} did not store a value within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until a `set` through `addr` is stored again: a contender that
/// shed the last overload (nutcracker ejects every server that timed out
/// for its `server_retry_timeout`) is measured once it serves, not while
/// it still refuses.
pub(super) async fn wait_serving(addr: SocketAddr, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !try_set(addr).await {
        if Instant::now() > deadline {
            bail!("{addr} stored nothing for {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn try_set(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"set bench:ready 0 0 1\r\nx\r\n").await.ok()?;
        let mut b = [0u8; 64];
        let n = s.read(&mut b).await.ok()?;
        (b[..n] == *b"STORED\r\n").then_some(())
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .is_some()
}

/// `memcached` (`-u root` when root), `-m 256`, otherwise its defaults.
pub(super) fn memcached(
    bin: &Path,
    listen: &str,
    port: u16,
    netns: Option<&str>,
    log: &Path,
) -> Result<Proc> {
    let mut args: Vec<String> = [
        "-l",
        listen,
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-m",
        "256",
    ]
    .map(String::from)
    .to_vec();
    if surelink_lab::host::is_root() {
        args.extend(["-u", "root"].map(String::from));
    }
    spawn(&format!("memcached :{port}"), bin, &args, netns, log)
}

/// nutcracker (twemproxy) in front of `servers`, configured as its README
/// recommends for a cache that ejects failed servers: ketama over
/// fnv1a_64, `auto_eject_hosts`, `timeout: 400`, `server_retry_timeout:
/// 2000`, `server_failure_limit: 1`.
pub(super) fn nutcracker(
    bin: &Path,
    dir: &Path,
    listen: SocketAddr,
    servers: &[SocketAddr],
    netns: Option<&str>,
) -> Result<Proc> {
    let mut yaml = format!(
        "bench:\n  listen: {listen}\n  hash: fnv1a_64\n  distribution: ketama\n  auto_eject_hosts: true\n  timeout: 400\n  server_retry_timeout: 2000\n  server_failure_limit: 1\n  servers:\n"
    );
    for s in servers {
        yaml.push_str(&format!("   - {s}:1\n"));
    }
    let conf = dir.join("nutcracker.yml");
    std::fs::write(&conf, yaml).with_context(|| format!("writing {}", conf.display()))?;
    let stats = free_port("127.0.0.1")?;
    let args = vec![
        "-c".to_string(),
        conf.display().to_string(),
        "-s".into(),
        stats.to_string(),
    ];
    spawn("nutcracker", bin, &args, netns, &dir.join("nutcracker.log"))
}

/// One node of a surelink cache cluster as the bench starts it.
pub(super) struct NodeSpec {
    pub(super) id: u64,
    pub(super) listen: [SocketAddr; 2],
    /// Front this memcached instead of the embedded store.
    pub(super) backend: Option<SocketAddr>,
}

/// Writes keys and TOML files for `nodes` and a proxy (node 100)
/// listening on `listen` and dialling from `dial_from`; returns the
/// nodes' files and the proxy's. Everything else is the product's
/// default configuration, but for `tuned` (TOML appended to every file;
/// empty: nothing).
pub(super) fn surelink_configs(
    dir: &Path,
    nodes: &[NodeSpec],
    listen: SocketAddr,
    dial_from: [&str; 2],
    replicas: usize,
    tuned: &str,
) -> Result<(Vec<PathBuf>, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let key = |name: &str| -> Result<(PathBuf, String)> {
        let k = surelink::Keypair::generate().map_err(|e| anyhow::anyhow!("key pair: {e}"))?;
        let file = format!("{name}.key");
        let path = dir.join(&file);
        std::fs::write(&path, format!("{}\n", k.secret()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        // Relative to the TOML file, which sits next to it.
        Ok((PathBuf::from(file), k.public().to_string()))
    };
    let (proxy_key, proxy_pub) = key("proxy")?;
    let mut files = Vec::new();
    let mut members = String::new();
    let mut peers = String::new();
    for n in nodes {
        let (k, public) = key(&format!("node{}", n.id))?;
        let backend = n
            .backend
            .map(|b| format!("backend = \"memcached://{b}\"\n"))
            .unwrap_or_default();
        let text = format!(
            "node = {}\ncluster = 21\nkey_file = {:?}\nlisten = [\"{}\", \"{}\"]\n\n[cache]\nmemory_mb = 256\n{backend}\n[[members]]\nnode = 100\npublic_key = \"{proxy_pub}\"\n",
            n.id,
            k.display().to_string(),
            n.listen[0],
            n.listen[1]
        );
        let f = dir.join(format!("node{}.toml", n.id));
        std::fs::write(&f, format!("{text}\n{tuned}\n"))?;
        files.push(f);
        members.push_str(&format!(
            "\n[[members]]\nnode = {}\npublic_key = \"{public}\"\n",
            n.id
        ));
        peers.push_str(&format!(
            "\n[[peers]]\nnode = {}\naddrs = [\"{}\", \"{}\"]\n",
            n.id, n.listen[0], n.listen[1]
        ));
    }
    let proxy = format!(
        "node = 100\ncluster = 21\nkey_file = {:?}\ndial_from = [\"{}:0\", \"{}:0\"]\n\n[proxy]\nlisten = \"{listen}\"\nreplicas = {replicas}\n{members}{peers}",
        proxy_key.display().to_string(),
        dial_from[0],
        dial_from[1]
    );
    let pf = dir.join("proxy.toml");
    std::fs::write(&pf, format!("{proxy}\n{tuned}\n"))?;
    Ok((files, pf))
}

/// Starts a cache node for each of `nodes` (in `node_ns`) and the proxy
/// (in `proxy_ns`), logs in `dir`: this binary's hidden `cache node|proxy`,
/// the same runners as `surelink cache node|proxy` — or, with
/// `SURELINK_BIN=path/to/surelink`, that binary itself (the shipped build,
/// without the lab's `test-util`).
pub(super) fn spawn_surelink(
    dir: &Path,
    nodes: &[PathBuf],
    proxy: &Path,
    node_ns: Option<&str>,
    proxy_ns: Option<&str>,
) -> Result<Vec<Proc>> {
    let me = match std::env::var_os("SURELINK_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => std::env::current_exe().context("finding the surelink-lab binary")?,
    };
    let args = |kind: &str, f: &Path| {
        vec![
            "cache".to_string(),
            kind.to_string(),
            "--config".into(),
            f.display().to_string(),
        ]
    };
    let mut procs = Vec::new();
    for (i, f) in nodes.iter().enumerate() {
        let name = format!("surelink node {}", i + 1);
        let log = dir.join(format!("node{}.log", i + 1));
        procs.push(spawn(&name, &me, &args("node", f), node_ns, &log)?);
    }
    let log = dir.join("proxy.log");
    procs.push(spawn(
        "surelink proxy",
        &me,
        &args("proxy", proxy),
        proxy_ns,
        &log,
    )?);
    Ok(procs)
}
