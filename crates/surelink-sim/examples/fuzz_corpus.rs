//! Writes the fuzz targets' seeds (`surelink_sim::fuzz::seeds`) as a
//! cargo-fuzz corpus: `cargo run -p surelink-sim --example fuzz_corpus --
//! fuzz/corpus` makes `fuzz/corpus/<target>/seed-<n>`.

use surelink_sim::fuzz::{seeds, TARGETS};

fn main() -> std::io::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fuzz/corpus".into());
    for (name, _) in TARGETS {
        let d = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&d)?;
        for (i, s) in seeds(name).iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i}")), s)?;
        }
    }
    println!("wrote the seeds of {} targets under {dir}", TARGETS.len());
    Ok(())
}
