//! Key files: `surelink keygen`, and reading keys for configurations.
//!
//! A secret key file holds one line, the base64 secret (as WireGuard's
//! do), readable by its owner only; a public key is the same form,
//! printed by `keygen` and pasted into every node's `[[members]]`.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use surelink::proto::secure::SecretKey;
use surelink::proto::NodeId;
use surelink::{Keypair, PublicKey};

/// `surelink keygen`.
#[derive(Args, Debug)]
pub(crate) struct KeygenArgs {
    /// Write the secret key to this file (mode 0600; refuses to overwrite)
    /// and print only the public key. Without it, both are printed.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub(crate) fn keygen(args: &KeygenArgs) -> Result<()> {
    let keys = Keypair::generate().context("generating a key pair")?;
    match &args.out {
        Some(path) => {
            write_secret(path, &keys)?;
            println!(
                "# secret key written to {} (keep it private)",
                path.display()
            );
            println!("public_key = \"{}\"", keys.public());
        }
        None => {
            println!(
                "secret_key = \"{}\"   # keep private: key_file or secret_key",
                keys.secret()
            );
            println!(
                "public_key = \"{}\"   # goes into every node's [[members]]",
                keys.public()
            );
        }
    }
    Ok(())
}

/// Writes `keys`' secret to a new file readable by its owner only.
pub(crate) fn write_secret(path: &Path, keys: &Keypair) -> Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {} (it must not exist yet)", path.display()))?;
    writeln!(f, "{}", keys.secret()).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads a secret key file.
pub(crate) fn read_secret(path: &Path) -> Result<Keypair> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(m) = std::fs::metadata(path) {
            if m.permissions().mode() & 0o077 != 0 {
                tracing::warn!(file = %path.display(), "secret key file is readable by others; chmod 600 it");
            }
        }
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading key file {}", path.display()))?;
    let secret: SecretKey = text
        .trim()
        .parse()
        .with_context(|| format!("key file {}", path.display()))?;
    Ok(Keypair::from_secret(secret))
}

/// Parses a public key from text.
pub(crate) fn parse_public(s: &str, what: &str) -> Result<PublicKey> {
    s.parse()
        .with_context(|| format!("{what}: bad public key {s:?}"))
}

/// A directory of key files for experiment nodes: `node-<id>.key` (secret)
/// and `node-<id>.pub` (public) for each node, made by [`make_key_dir`].
pub(crate) fn make_key_dir(dir: &Path, nodes: &[NodeId]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for n in nodes {
        let secret = dir.join(format!("node-{n}.key"));
        if secret.exists() {
            continue;
        }
        let keys = Keypair::generate().context("generating a key pair")?;
        write_secret(&secret, &keys)?;
        std::fs::write(
            dir.join(format!("node-{n}.pub")),
            format!("{}\n", keys.public()),
        )
        .with_context(|| format!("writing {}", dir.display()))?;
    }
    Ok(())
}

/// This node's key pair and every member's public key from a key directory.
pub(crate) fn load_key_dir(
    dir: &Path,
    me: NodeId,
    members: &[NodeId],
) -> Result<(Keypair, Vec<(NodeId, PublicKey)>)> {
    let keys = read_secret(&dir.join(format!("node-{me}.key")))?;
    let mut pubs = Vec::new();
    for &n in members {
        let path = dir.join(format!("node-{n}.pub"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        pubs.push((n, parse_public(text.trim(), &path.display().to_string())?));
    }
    if !pubs.iter().any(|&(n, k)| n == me && k == keys.public()) && members.contains(&me) {
        bail!(
            "{}: node-{me}.pub does not match node-{me}.key",
            dir.display()
        );
    }
    Ok((keys, pubs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_dirs_round_trip_and_secrets_are_private() {
        let dir = std::env::temp_dir().join(format!("surelink-keys-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        make_key_dir(&dir, &[NodeId(1), NodeId(2)]).unwrap();
        let (k1, pubs) = load_key_dir(&dir, NodeId(1), &[NodeId(1), NodeId(2)]).unwrap();
        assert_eq!(pubs[0], (NodeId(1), k1.public()));
        let (k2, _) = load_key_dir(&dir, NodeId(2), &[NodeId(1)]).unwrap();
        assert_eq!(pubs[1].1, k2.public());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let m = std::fs::metadata(dir.join("node-1.key")).unwrap();
            assert_eq!(m.permissions().mode() & 0o777, 0o600);
        }
        // Never overwrites a secret.
        assert!(write_secret(&dir.join("node-1.key"), &k2).is_err());
        std::fs::write(dir.join("bad.key"), "garbage").unwrap();
        let err = read_secret(&dir.join("bad.key")).unwrap_err();
        assert!(format!("{err:#}").contains("base64"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
