//! `surelink certs`: a throwaway certificate authority and one certificate
//! per node, for trying mutual TLS (`[tls]` in a node's configuration) or
//! for tests. A site with a PKI issues its own: each node's certificate
//! must carry the DNS name `node-<id>.cluster-<cluster>.surelink`, with
//! client and server authentication allowed.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use surelink::proto::secure::{node_name, TestCa};
use surelink::proto::{ClusterId, NodeId};

/// `surelink certs`.
#[derive(Args, Debug)]
pub(crate) struct CertsArgs {
    /// Directory to write into (created; existing files are not replaced).
    #[arg(long)]
    out: PathBuf,
    /// The cluster id the certificates name.
    #[arg(long)]
    cluster: u64,
    /// Node ids, comma separated (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<u64>,
}

pub(crate) fn certs(a: &CertsArgs) -> Result<()> {
    if a.nodes.contains(&0) {
        bail!("node id 0 is reserved");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let cluster = ClusterId(a.cluster);
    let ca = TestCa::new(cluster).context("generating the CA")?;
    write_new(&a.out.join("ca.crt"), &ca.cert_pem(), false)?;
    write_new(&a.out.join("ca.key"), &ca.key_pem(), true)?;
    for &n in &a.nodes {
        let i = ca
            .issue(cluster, NodeId(n))
            .context("issuing a node certificate")?;
        write_new(&a.out.join(format!("node-{n}.crt")), &i.cert_pem, false)?;
        write_new(&a.out.join(format!("node-{n}.key.pem")), &i.key_pem, true)?;
        println!("node {n}: {}", node_name(cluster, NodeId(n)));
    }
    println!(
        "wrote ca.crt, ca.key and node-<id>.crt / node-<id>.key.pem to {} — in each node's TOML:\n[tls]\ncert = \"node-<id>.crt\"\nkey = \"node-<id>.key.pem\"\nca = \"ca.crt\"",
        a.out.display()
    );
    Ok(())
}

/// Writes a new file (never replaces one); `secret`: owner-only.
fn write_new(path: &Path, text: &str, secret: bool) -> Result<()> {
    use std::io::Write as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {} (it must not exist yet)", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_load_as_a_tls_setup_and_in_toml() {
        let dir = std::env::temp_dir().join(format!("surelink-certs-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        certs(&CertsArgs {
            out: dir.clone(),
            cluster: 7,
            nodes: vec![1, 2],
        })
        .unwrap();
        let text = "node = 1\ncluster = 7\nlisten = [\"127.0.1.1:7100\"]\n\
                    [tls]\ncert = \"node-1.crt\"\nkey = \"node-1.key.pem\"\nca = \"ca.crt\"\n\
                    [[peers]]\nnode = 2\naddrs = [\"127.0.1.2:7100\"]\n";
        let l = crate::config_file::parse(text, &dir).unwrap();
        assert!(l.config.tls.is_some());
        assert!(l.config.identity.is_none());
        l.config.validate().unwrap();
        // Node 2's certificate used as node 1's: refused, naming the name.
        let text = text
            .replace("node-1.crt", "node-2.crt")
            .replace("node-1.key", "node-2.key");
        let err = crate::config_file::parse(&text, &dir).unwrap_err();
        assert!(
            format!("{err:#}").contains("node-1.cluster-7.surelink"),
            "{err:#}"
        );
        // No overwriting.
        assert!(certs(&CertsArgs {
            out: dir.clone(),
            cluster: 7,
            nodes: vec![1],
        })
        .is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
