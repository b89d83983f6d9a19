//! `expertd` binary: parses the command line and hands each subcommand to `expertd::cli`.

use clap::{Parser, Subcommand};

/// sluice expert daemon: builds and checks the INT8 expert container (and, later, serves it).
#[derive(Parser)]
#[command(name = "expertd", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a BF16 checkpoint's routed experts into DIR/experts.sluice (resumable).
    Prepare(expertd::cli::PrepareArgs),
    /// Check a container's header, index and every blob; non-zero exit on any problem.
    Verify(expertd::cli::VerifyArgs),
}

fn main() -> std::process::ExitCode {
    expertd::cli::init_tracing();
    let result = match Cli::parse().command {
        Command::Prepare(args) => expertd::cli::prepare(&args).map(|()| true),
        Command::Verify(args) => expertd::cli::verify(&args),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            // `{:#}` prints the whole context chain on one line: what failed, then why.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
