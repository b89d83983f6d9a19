//! `hostd` binary: parses the command line and hands each subcommand to `hostd::cli`.

use clap::{Parser, Subcommand};

/// sluice host process: runs Qwen3.6 MoE checkpoints (generate, serve the OpenAI API, benchmark),
/// with routed experts in process or from an expertd.
#[derive(Parser)]
#[command(name = "hostd", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a model directory and report its layers, tensors and memory arithmetic.
    Inspect(hostd::cli::inspect::InspectArgs),
    /// Size this machine for a checkpoint: resident or streaming per expert format, the cache
    /// budget, the expected decode tok/s and the commands to run (measures for a few seconds).
    Plan(hostd::cli::plan::PlanArgs),
    /// Read UTF-8 text on stdin and print its token ids.
    Tokenize(hostd::cli::tokenize::TokenizeArgs),
    /// Generate a reply to one prompt (greedy), streaming text, then report speed and memory.
    Run(hostd::cli::run::RunArgs),
    /// Parity interface: prefill + greedy steps per prompt, logits and routes to a file.
    Eval(hostd::cli::eval::EvalArgs),
    /// Write a deterministic random-weight checkpoint in the release layout (tiny, small, realdim).
    Synth(hostd::cli::synth::SynthArgs),
    /// OpenAI-compatible HTTP server (chat and text completions, SSE, continuous batching).
    Serve(Box<hostd::cli::serve::ServeArgs>),
    /// Benchmark: per-op prefill and decode time, bytes streamed and GB/s vs DRAM bandwidth.
    Profile(hostd::cli::profile::ProfileArgs),
    /// Benchmark configurations end to end: one fresh process per run, TTFT, decode speed and
    /// its phases, memory, disk reads, and the fraction of DRAM and disk bandwidth achieved.
    Bench(hostd::cli::bench::BenchArgs),
    /// Per-call round trip to a running expertd (call ring, MoeLayer RPC, inline), each call timed.
    Rtt(hostd::cli::rtt::RttArgs),
}

fn main() -> std::process::ExitCode {
    hostd::cli::init_tracing();
    let command = Cli::parse().command;
    if cfg!(debug_assertions)
        && matches!(
            command,
            Command::Run(_) | Command::Serve(_) | Command::Bench(_) | Command::Profile(_)
        )
    {
        tracing::warn!(
            "this hostd is a debug build: the model runs several times slower than in the release build (scripts/build, then target/release/hostd)"
        );
    }
    let result = match command {
        Command::Inspect(args) => hostd::cli::inspect::run(&args),
        Command::Plan(args) => hostd::cli::plan::run(&args),
        Command::Tokenize(args) => hostd::cli::tokenize::run(&args),
        Command::Run(args) => hostd::cli::run::run(&args),
        Command::Eval(args) => hostd::cli::eval::run(&args),
        Command::Synth(args) => hostd::cli::synth::run(&args),
        Command::Profile(args) => hostd::cli::profile::run(&args),
        Command::Serve(args) => hostd::cli::serve::run(&args),
        Command::Bench(args) => hostd::cli::bench::run(&args),
        Command::Rtt(args) => hostd::cli::rtt::run(&args),
    };
    // A private expertd may belong to a model on a detached thread (serve): stop it and
    // remove its directory on every return.
    hostd::expert_client::private::stop_all();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The whole context chain on one line (what failed, then why), each cause once.
            eprintln!("error: {}", shared::error_text::chain(e.as_ref()));
            if e.downcast_ref::<hostd::engine::EngineFatal>().is_some() {
                // EX_SOFTWARE: a supervisor restarts hostd.
                std::process::ExitCode::from(hostd::engine::EngineFatal::EXIT_CODE)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}
