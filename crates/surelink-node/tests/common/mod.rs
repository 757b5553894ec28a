//! What the library tests share: a temporary directory removed when
//! dropped, and a copy of the repository's example files in one (tests
//! never read or write the examples in place).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A fresh directory under the system's temporary one, unique to this
/// process and `name`; removed (with its contents) when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("surelink-node-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a temporary directory");
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the repository's `examples/` into `to` (key files owner-only,
/// as a real deployment keeps them).
pub(crate) fn copy_examples(to: &Path) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    copy_dir(&from, to);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating the copy");
    for e in std::fs::read_dir(from).expect("reading the examples") {
        let e = e.expect("an example entry");
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).expect("copying an example file");
            if dest.extension().is_some_and(|x| x == "key") {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600))
                    .expect("chmod 600");
            }
        }
    }
}
