//! What the netns tests share.

use std::process::Command;

/// Why the network-namespace tests cannot run here (not root, or `ip`,
/// `ss` or `nft` missing), or `None` when they can.
pub(crate) fn missing_requirements() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    for tool in ["ip", "ss", "nft"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(format!("`{tool}` missing"));
        }
    }
    None
}
