//! `surelink role-server` (a node whose only job is the role service) and
//! `surelink status` (the role service's view from the nodes' metrics
//! ports).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use surelink::proto::NodeId;
use surelink::NetEvent;

use crate::cluster_file::Cluster;
use crate::config_file;

#[derive(Args, Debug)]
pub(crate) struct RoleServerArgs {
    /// TOML configuration of this node; it must name a `cluster_file`
    /// that lists this node among the role-server candidates.
    #[arg(long)]
    pub(crate) config: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// The cluster file: every node with a `metrics` address is asked.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// Ask only this metrics address (`host:port`).
    #[arg(long)]
    addr: Option<SocketAddr>,
    /// Ask only this node of the cluster file.
    #[arg(long)]
    node: Option<u64>,
}

pub(crate) async fn role_server(args: &RoleServerArgs) -> Result<()> {
    let loaded = config_file::load(&args.config)?;
    let Some(cluster) = &loaded.cluster else {
        bail!(
            "{}: `surelink role-server` needs `cluster_file = \"…\"` (the nodes and the [role] candidates)",
            args.config.display()
        );
    };
    let me = loaded.config.node;
    if cluster.role.candidate_index(me).is_none() {
        bail!(
            "node {me} is not one of the role-server candidates {:?} in the cluster file",
            cluster.role.candidates
        );
    }
    let (ep, role) = crate::role_backend::bind(loaded.config, loaded.cluster.as_ref()).await?;
    if let Some(m) = loaded.metrics {
        let bound = ep
            .serve_metrics(m)
            .await
            .with_context(|| format!("metrics listener on {m}"))?;
        println!("metrics: http://{bound}/metrics, role: http://{bound}/role");
    }
    println!(
        "role-server candidate {} (epoch {}) on {:?}; candidates in order {:?}; Ctrl-C stops",
        ep.node(),
        ep.epoch(),
        ep.local_addrs(),
        cluster.role.candidates
    );
    let mut events = ep.events();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut last = (None, (0, 0));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            e = events.recv() => match e {
                Ok(NetEvent::PeerDead { peer }) => println!("peer {peer} dead"),
                Ok(NetEvent::PeerAlive { peer }) => println!("peer {peer} alive again"),
                _ => {}
            },
            _ = tick.tick() => {
                let Some(st) = ep.role_status() else { continue };
                let held = st.table.as_ref().map_or((0, 0), |t| (t.epoch, t.version));
                if (st.serving, held) != last {
                    match st.serving {
                        Some(e) => println!("serving role epoch {e}; table ({}, {})", held.0, held.1),
                        None => println!("standing by; holding table ({}, {})", held.0, held.1),
                    }
                    last = (st.serving, held);
                }
            }
        }
    }
    role.stop().await;
    ep.shutdown().await;
    Ok(())
}

/// `GET path` from a metrics port (HTTP/1.1, one request).
fn get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("connecting to {addr}"))?;
    // A frozen process accepts (the kernel does) but never answers.
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .with_context(|| format!("reading from {addr}"))?;
    let Some((head, rest)) = body.split_once("\r\n\r\n") else {
        bail!("{addr}: not an HTTP answer");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!(
            "{addr}{path}: {}: {}",
            head.lines().next().unwrap_or(""),
            rest.trim()
        );
    }
    Ok(rest.to_string())
}

pub(crate) fn status(args: &StatusArgs) -> Result<()> {
    let targets: Vec<(String, SocketAddr)> = match (&args.addr, &args.cluster) {
        (Some(a), _) => vec![(a.to_string(), *a)],
        (None, Some(path)) => {
            let c = Cluster::load(path).with_context(|| format!("{}", path.display()))?;
            let v: Vec<(String, SocketAddr)> = c
                .nodes
                .iter()
                .filter(|n| args.node.is_none_or(|want| n.node == NodeId(want)))
                .filter_map(|n| n.metrics.map(|m| (format!("node {}", n.node), m)))
                .collect();
            if v.is_empty() {
                bail!(
                    "no node of {} has a `metrics` address to ask",
                    path.display()
                );
            }
            v
        }
        (None, None) => bail!(
            "give --cluster FILE (asks every node with a metrics address) or --addr HOST:PORT"
        ),
    };
    // Every node at once: a frozen node costs its timeout once, not once
    // per node after it.
    let answers: Vec<Result<String>> = std::thread::scope(|s| {
        let asks: Vec<_> = targets
            .iter()
            .map(|(_, addr)| s.spawn(move || get(*addr, "/role")))
            .collect();
        asks.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("the request panicked")))
            })
            .collect()
    });
    let mut failed = 0;
    for ((name, addr), answer) in targets.iter().zip(answers) {
        println!("== {name} ({addr})");
        match answer {
            Ok(body) => print!("{body}"),
            Err(e) => {
                failed += 1;
                println!("unreachable: {e:#}");
            }
        }
    }
    if failed == targets.len() {
        bail!("no node answered");
    }
    Ok(())
}
