//! `expertd` binary: parses the command line and hands each subcommand to `expertd::cli`.

use clap::{Parser, Subcommand};

/// sluice expert daemon: builds, checks and serves the expert container (INT8 or 4-bit).
#[derive(Parser)]
#[command(name = "expertd", version)]
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
    /// Replay a route trace through the cache policy for one or more policies and budgets.
    Replay(expertd::cli::ReplayArgs),
    /// Serve the container's experts over gRPC (unix socket with shared memory, or TCP).
    Serve(Box<expertd::cli::ServeArgs>),
    /// Print a running daemon's counters (per session, per peer, totals) as Prometheus text.
    Stats(expertd::stats_client::StatsArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    expertd::cli::init_tracing_with_default(if matches!(cli.command, Command::Serve(_)) {
        "info"
    } else {
        "warn"
    });
    if cfg!(debug_assertions) && matches!(cli.command, Command::Serve(_) | Command::Prepare(_)) {
        tracing::warn!(
            "this expertd is a debug build: its kernels run several times slower than in the release build (scripts/build, then target/release/expertd)"
        );
    }
    let result = match cli.command {
        Command::Prepare(args) => expertd::cli::prepare(&args).map(|()| true),
        Command::Verify(args) => expertd::cli::verify(&args),
        Command::Replay(args) => expertd::cli::replay(&args),
        Command::Serve(args) => expertd::cli::serve(&args).map(|()| true),
        Command::Stats(args) => expertd::stats_client::stats(&args).map(|()| true),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            // The whole context chain on one line (what failed, then why), each cause once.
            eprintln!("error: {}", shared::error_text::chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
