//! placeholder until the benchmark lands
#[derive(clap::Args, Debug)]
pub(crate) struct BenchArgs {}
pub(crate) async fn run(_args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
