//! Temporary copies of the repository's example files, every fixed port in
//! them moved to a free one: a test runs the example cache cluster without
//! touching the files in place and without clashing with a user who runs
//! that cluster (or the tests) on the same machine.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A fresh directory under the system's temporary one, unique to this
/// process and `name`; removed (with its contents) when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Makes it (an old one of the same name is removed first).
    pub fn new(name: &str) -> Result<TempDir> {
        let dir = std::env::temp_dir().join(format!("surelink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The repository's `examples/` directory.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// A copy of one example directory with its ports moved.
#[derive(Debug)]
pub struct ExampleCopy {
    dir: TempDir,
    moved: BTreeMap<SocketAddr, SocketAddr>,
}

impl ExampleCopy {
    /// Copies `examples/<which>` (e.g. `cache`) into a new temporary
    /// directory named after `name`, and moves every address with a
    /// non-zero port in its `.toml` files to a free port on the same IP
    /// (the same address in several files moves together). Key files are
    /// made owner-only, as a deployment keeps them.
    pub fn new(which: &str, name: &str) -> Result<ExampleCopy> {
        let from = examples_dir().join(which);
        let dir = TempDir::new(name)?;
        let mut texts = Vec::new();
        for e in std::fs::read_dir(&from).with_context(|| format!("reading {}", from.display()))? {
            let path = e?.path();
            let Some(file) = path.file_name() else {
                continue;
            };
            let dest = dir.path().join(file);
            if path.extension().is_some_and(|x| x == "toml") {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                texts.push((dest, text));
            } else if path.is_file() {
                std::fs::copy(&path, &dest)
                    .with_context(|| format!("copying {}", path.display()))?;
                if dest.extension().is_some_and(|x| x == "key") {
                    use std::os::unix::fs::PermissionsExt as _;
                    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600))?;
                }
            }
        }
        let mut moved = BTreeMap::new();
        for (_, text) in &texts {
            for addr in quoted_addrs(text) {
                if addr.port() != 0 && !moved.contains_key(&addr) {
                    let port = crate::host::free_port(addr.ip())?;
                    moved.insert(addr, SocketAddr::new(addr.ip(), port));
                }
            }
        }
        for (dest, text) in texts {
            let mut text = text;
            for (old, new) in &moved {
                text = text.replace(&format!("\"{old}\""), &format!("\"{new}\""));
            }
            std::fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
        }
        Ok(ExampleCopy { dir, moved })
    }

    /// The copy's directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the example's `addr` (as written in its files) moved to.
    pub fn moved(&self, addr: &str) -> Result<SocketAddr> {
        let a: SocketAddr = addr.parse().with_context(|| format!("{addr:?}"))?;
        self.moved
            .get(&a)
            .copied()
            .with_context(|| format!("the example files name no {addr}"))
    }
}

/// Every `"ip:port"` string in a TOML text.
fn quoted_addrs(text: &str) -> Vec<SocketAddr> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter_map(|s| s.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_port_of_the_cache_example_moves() -> Result<()> {
        let copy = ExampleCopy::new("cache", "examples-unit")?;
        let proxy = copy.moved("127.0.0.1:11311")?;
        assert_ne!(proxy.port(), 11311);
        let node1 = copy.moved("127.0.1.11:7201")?;
        for f in ["cluster.toml", "node1.toml", "proxy.toml"] {
            let text = std::fs::read_to_string(copy.path().join(f))?;
            assert!(!text.contains(":7201\""), "{f} still names port 7201");
            assert!(
                !text.contains(":921"),
                "{f} still names a 921x metrics port"
            );
        }
        // The nodes' addresses live in the cluster file alone; dial-from
        // ports stay 0.
        let cluster = std::fs::read_to_string(copy.path().join("cluster.toml"))?;
        let proxy_file = std::fs::read_to_string(copy.path().join("proxy.toml"))?;
        assert!(cluster.contains(&format!("\"{node1}\"")));
        assert!(proxy_file.contains(&format!("\"{proxy}\"")));
        assert!(cluster.contains("\"127.0.1.10:0\""));
        assert!(copy.path().join("node1.key").exists());
        Ok(())
    }
}
