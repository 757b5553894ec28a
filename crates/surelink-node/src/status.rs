//! `surelink status`: the role service's view from every node — the
//! routing table each holds and, on the serving role server, the
//! path-status matrix — read from the nodes' metrics ports (`GET /role`).
//! Every node is asked at once; one that does not answer is printed as
//! unreachable, and only when none answers is it an error.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use surelink::proto::NodeId;

use crate::cluster_file::{Cluster, ClusterFileError};

/// Why `status` showed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// Neither a cluster file nor an address was given.
    #[error("give --cluster FILE (asks every node with a metrics address) or --addr HOST:PORT")]
    NoTarget,
    /// The cluster file cannot be used.
    #[error("{}", path.display())]
    ClusterFile {
        /// The cluster file.
        path: PathBuf,
        /// What is wrong with it.
        source: ClusterFileError,
    },
    /// No node of the cluster file (or not the one asked for) has a
    /// `metrics` address.
    #[error("no node of {} has a `metrics` address to ask", path.display())]
    NoMetrics {
        /// The cluster file.
        path: PathBuf,
    },
    /// Every node asked was unreachable (each is printed).
    #[error("no node answered")]
    NoneAnswered,
}

/// Why one node's metrics port gave no answer (printed, not returned).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AskError {
    /// No connection.
    #[error("connecting to {addr}")]
    Connect {
        /// The metrics address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The request could not be sent.
    #[error(transparent)]
    Send(std::io::Error),
    /// No complete answer within the read timeout (a frozen process
    /// accepts, as the kernel does, but never answers).
    #[error("reading from {addr}")]
    Read {
        /// The metrics address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The answer is not HTTP.
    #[error("{addr}: not an HTTP answer")]
    NotHttp {
        /// The metrics address.
        addr: SocketAddr,
    },
    /// An HTTP status other than 200.
    #[error("{addr}{path}: {status}: {body}")]
    Status {
        /// The metrics address.
        addr: SocketAddr,
        /// The path asked for.
        path: String,
        /// The status line.
        status: String,
        /// The body.
        body: String,
    },
    /// The thread asking panicked.
    #[error("the request panicked")]
    Panicked,
}

/// How long a node may take to accept, and then to answer.
const TIMEOUT: Duration = Duration::from_secs(2);

/// `GET path` from a metrics port (HTTP/1.1, one request).
fn get(addr: SocketAddr, path: &str) -> Result<String, AskError> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)
        .map_err(|source| AskError::Connect { addr, source })?;
    // A frozen process accepts (the kernel does) but never answers.
    s.set_read_timeout(Some(TIMEOUT)).map_err(AskError::Send)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(AskError::Send)?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .map_err(|source| AskError::Read { addr, source })?;
    let Some((head, rest)) = body.split_once("\r\n\r\n") else {
        return Err(AskError::NotHttp { addr });
    };
    if !head.starts_with("HTTP/1.1 200") {
        return Err(AskError::Status {
            addr,
            path: path.to_string(),
            status: head.lines().next().unwrap_or("").to_string(),
            body: rest.trim().to_string(),
        });
    }
    Ok(rest.to_string())
}

/// Asks `addr` alone, or every node of the cluster file `cluster` with a
/// metrics address (only `node`, if given), for its `/role` view, and
/// prints each answer under a `== <name> (<addr>)` line.
pub fn status(
    cluster: Option<&Path>,
    addr: Option<SocketAddr>,
    node: Option<u64>,
) -> Result<(), StatusError> {
    let targets: Vec<(String, SocketAddr)> = match (addr, cluster) {
        (Some(a), _) => vec![(a.to_string(), a)],
        (None, Some(path)) => {
            let c = Cluster::load(path).map_err(|source| StatusError::ClusterFile {
                path: path.to_path_buf(),
                source,
            })?;
            let v: Vec<(String, SocketAddr)> = c
                .nodes
                .iter()
                .filter(|n| node.is_none_or(|want| n.node == NodeId(want)))
                .filter_map(|n| n.metrics.map(|m| (format!("node {}", n.node), m)))
                .collect();
            if v.is_empty() {
                return Err(StatusError::NoMetrics {
                    path: path.to_path_buf(),
                });
            }
            v
        }
        (None, None) => return Err(StatusError::NoTarget),
    };
    // Every node at once: a frozen node costs its timeout once, not once
    // per node after it.
    let answers: Vec<Result<String, AskError>> = std::thread::scope(|s| {
        let asks: Vec<_> = targets
            .iter()
            .map(|(_, addr)| s.spawn(move || get(*addr, "/role")))
            .collect();
        asks.into_iter()
            .map(|h| h.join().unwrap_or(Err(AskError::Panicked)))
            .collect()
    });
    let mut failed = 0;
    for ((name, addr), answer) in targets.iter().zip(answers) {
        println!("== {name} ({addr})");
        match answer {
            Ok(body) => print!("{body}"),
            Err(e) => {
                failed += 1;
                println!("unreachable: {}", crate::error_chain(&e));
            }
        }
    }
    if failed == targets.len() {
        return Err(StatusError::NoneAnswered);
    }
    Ok(())
}
