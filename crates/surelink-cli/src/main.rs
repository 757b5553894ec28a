//! `surelink`: the command-line tool.
//!
//! `surelink demo` runs two endpoints over two paths, fails one path in the
//! middle of a message stream, brings it back, and reports what arrived.

mod demo;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "surelink",
    version,
    about = "Message passing for cluster services that keeps working through failures"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Two endpoints, two paths, one path fails mid-stream: what arrived?
    Demo(demo::DemoArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Demo(args) => demo::run(&args),
    }
}
