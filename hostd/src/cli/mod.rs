//! hostd subcommands: each module owns one command's flags (`clap::Args`) and its `run`.
//!
//! This is tool code: it may use `anyhow`; library modules outside `cli/` use typed errors.

pub mod bench;
pub mod eval;
pub mod inspect;
pub mod load;
pub mod plan;
pub mod plan_machine;
pub mod plan_report;
pub mod profile;
pub mod rtt;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;

/// Install the process-wide `tracing` subscriber, filtered by `RUST_LOG` (default `warn`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: redirected logs stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
