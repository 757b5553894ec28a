//! Key files: `surelink keygen`, and reading keys for configurations.
//!
//! A secret key file holds one line, the base64 secret (as WireGuard's
//! do), readable by its owner only; a public key is the same form,
//! printed by `keygen` and pasted into the cluster file (or every node's
//! `[[members]]`). A key directory (`node-<id>.key` and `node-<id>.pub`
//! per node) is what the lab's experiment nodes authenticate with.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use surelink::proto::secure::{KeyError, SecretKey};
use surelink::proto::NodeId;
use surelink::{Keypair, PublicKey};

/// A key file or key text that could not be made or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// The system could not generate a key pair.
    #[error("generating a key pair")]
    Generate(#[source] KeyError),
    /// A new file could not be created (it must not exist yet).
    #[error("creating {} (it must not exist yet)", path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A directory could not be created.
    #[error("creating {}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A secret key file could not be read.
    #[error("reading key file {}", path.display())]
    ReadSecret {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A public key file could not be read.
    #[error("reading {}", path.display())]
    ReadPublic {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A secret key file does not hold a key.
    #[error("key file {}", path.display())]
    Secret {
        /// The file.
        path: PathBuf,
        /// Why.
        source: KeyError,
    },
    /// A public key does not parse.
    #[error("{what}: bad public key {text:?}")]
    Public {
        /// Whose key (a member, a file).
        what: String,
        /// The text.
        text: String,
        /// Why.
        source: KeyError,
    },
    /// A key directory's public key is not its secret key's.
    #[error("{}: node-{node}.pub does not match node-{node}.key", dir.display())]
    Mismatch {
        /// The key directory.
        dir: PathBuf,
        /// The node.
        node: NodeId,
    },
}

/// `surelink keygen`: a new key pair; with `out`, the secret is written to
/// that new file (mode 0600; an existing file is never replaced) and only
/// the public key printed, otherwise both are printed.
pub fn keygen(out: Option<&Path>) -> Result<(), KeyFileError> {
    let keys = Keypair::generate().map_err(KeyFileError::Generate)?;
    match out {
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
                "public_key = \"{}\"   # goes into this node's [[nodes]] entry of the cluster file (or every node's [[members]])",
                keys.public()
            );
        }
    }
    Ok(())
}

/// Writes `keys`' secret to a new file readable by its owner only.
pub fn write_secret(path: &Path, keys: &Keypair) -> Result<(), KeyFileError> {
    let mut f = create_new(path, true)?;
    writeln!(f, "{}", keys.secret()).map_err(|source| KeyFileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Creates a file that must not exist yet; `secret`: readable by its
/// owner only.
pub(crate) fn create_new(path: &Path, secret: bool) -> Result<std::fs::File, KeyFileError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    opts.open(path).map_err(|source| KeyFileError::Create {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a secret key file (warning when others may read it).
pub fn read_secret(path: &Path) -> Result<Keypair, KeyFileError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(m) = std::fs::metadata(path) {
            if m.permissions().mode() & 0o077 != 0 {
                tracing::warn!(file = %path.display(), "secret key file is readable by others; chmod 600 it");
            }
        }
    }
    let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::ReadSecret {
        path: path.to_path_buf(),
        source,
    })?;
    let secret: SecretKey = text.trim().parse().map_err(|source| KeyFileError::Secret {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(Keypair::from_secret(secret))
}

/// Parses a public key from text; `what` names whose it is in the error.
pub fn parse_public(s: &str, what: &str) -> Result<PublicKey, KeyFileError> {
    s.parse().map_err(|source| KeyFileError::Public {
        what: what.to_string(),
        text: s.to_string(),
        source,
    })
}

/// Makes a key directory: `node-<id>.key` (secret) and `node-<id>.pub`
/// (public) for each node that has none yet.
pub fn make_key_dir(dir: &Path, nodes: &[NodeId]) -> Result<(), KeyFileError> {
    std::fs::create_dir_all(dir).map_err(|source| KeyFileError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    for n in nodes {
        let secret = dir.join(format!("node-{n}.key"));
        if secret.exists() {
            continue;
        }
        let keys = Keypair::generate().map_err(KeyFileError::Generate)?;
        write_secret(&secret, &keys)?;
        let public = dir.join(format!("node-{n}.pub"));
        std::fs::write(&public, format!("{}\n", keys.public())).map_err(|source| {
            KeyFileError::Write {
                path: public.clone(),
                source,
            }
        })?;
    }
    Ok(())
}

/// This node's key pair and every member's public key from a key
/// directory made by [`make_key_dir`].
pub fn load_key_dir(
    dir: &Path,
    me: NodeId,
    members: &[NodeId],
) -> Result<(Keypair, Vec<(NodeId, PublicKey)>), KeyFileError> {
    let keys = read_secret(&dir.join(format!("node-{me}.key")))?;
    let mut pubs = Vec::new();
    for &n in members {
        let path = dir.join(format!("node-{n}.pub"));
        let text = std::fs::read_to_string(&path).map_err(|source| KeyFileError::ReadPublic {
            path: path.clone(),
            source,
        })?;
        pubs.push((n, parse_public(text.trim(), &path.display().to_string())?));
    }
    if !pubs.iter().any(|&(n, k)| n == me && k == keys.public()) && members.contains(&me) {
        return Err(KeyFileError::Mismatch {
            dir: dir.to_path_buf(),
            node: me,
        });
    }
    Ok((keys, pubs))
}
