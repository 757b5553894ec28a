//! `surelink certs`: a throwaway certificate authority and one certificate
//! per node, for trying mutual TLS (`[tls]` in a node's configuration) or
//! for tests. A site with a PKI issues its own: each node's certificate
//! must carry the DNS name `node-<id>.cluster-<cluster>.surelink`, with
//! client and server authentication allowed.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use surelink::proto::secure::{node_name, TestCa};
use surelink::proto::{ClusterId, NodeId};

use crate::keys::{create_new, KeyFileError};

/// Why `certs` wrote no (or not every) certificate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertsError {
    /// Node id 0 was asked for.
    #[error("node id 0 is reserved")]
    ReservedNode,
    /// The output directory could not be created.
    #[error("creating {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The CA could not be generated.
    #[error("generating the CA")]
    Ca(#[source] rcgen::Error),
    /// A node's certificate could not be issued.
    #[error("issuing a node certificate")]
    Issue(#[source] rcgen::Error),
    /// A file could not be created (it must not exist yet) or written.
    #[error(transparent)]
    File(#[from] KeyFileError),
}

/// Writes `ca.crt`, `ca.key` and `node-<id>.crt` / `node-<id>.key.pem` for
/// each of `nodes` of `cluster` into `out` (created; existing files are
/// never replaced), and prints the names and the `[tls]` lines to use.
pub fn certs(out: &Path, cluster: u64, nodes: &[u64]) -> Result<(), CertsError> {
    if nodes.contains(&0) {
        return Err(CertsError::ReservedNode);
    }
    std::fs::create_dir_all(out).map_err(|source| CertsError::CreateDir {
        path: out.to_path_buf(),
        source,
    })?;
    let cluster = ClusterId(cluster);
    let ca = TestCa::new(cluster).map_err(CertsError::Ca)?;
    write_new(&out.join("ca.crt"), &ca.cert_pem(), false)?;
    write_new(&out.join("ca.key"), &ca.key_pem(), true)?;
    for &n in nodes {
        let i = ca.issue(cluster, NodeId(n)).map_err(CertsError::Issue)?;
        write_new(&out.join(format!("node-{n}.crt")), &i.cert_pem, false)?;
        write_new(&out.join(format!("node-{n}.key.pem")), &i.key_pem, true)?;
        println!("node {n}: {}", node_name(cluster, NodeId(n)));
    }
    println!(
        "wrote ca.crt, ca.key and node-<id>.crt / node-<id>.key.pem to {} — in each node's TOML:\n[tls]\ncert = \"node-<id>.crt\"\nkey = \"node-<id>.key.pem\"\nca = \"ca.crt\"",
        out.display()
    );
    Ok(())
}

/// Writes a new file (never replaces one); `secret`: owner-only.
fn write_new(path: &Path, text: &str, secret: bool) -> Result<(), KeyFileError> {
    let mut f = create_new(path, secret)?;
    f.write_all(text.as_bytes())
        .map_err(|source| KeyFileError::Write {
            path: path.to_path_buf(),
            source,
        })
}
