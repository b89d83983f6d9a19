//! expertd subcommands' flags and their terminal output: `prepare` (progress bar, resume
//! messages, the dequantisation table) and `verify` (the report).
//!
//! This is tool code: it may use `anyhow`; `prepare`, `verify` and `stats` use typed errors.

use crate::prepare::{self, PrepareEvent, PrepareOptions, PrepareOutcome, REPORT_FILE};
use crate::verify::{self, VerifyOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Install the process-wide `tracing` subscriber, filtered by `RUST_LOG` (default `warn`).
pub fn init_tracing() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Flags of `expertd prepare`.
#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// The BF16 checkpoint directory (config.json + safetensors).
    #[arg(env = "EXPERTD_MODEL_DIR")]
    pub model: PathBuf,
    /// Directory to write `experts.sluice` (and `prepare-report.json`) into; created if missing.
    #[arg(long, env = "EXPERTD_CONTAINER_DIR")]
    pub out: PathBuf,
    /// Milliseconds to sleep after each blob written (tests use it to interrupt a run midway).
    #[arg(long, env = "EXPERTD_PREPARE_THROTTLE_MS", default_value_t = 0, hide = true)]
    pub throttle_ms: u64,
}

/// Flags of `expertd verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// The container directory (holding `experts.sluice`).
    #[arg(env = "EXPERTD_CONTAINER_DIR")]
    pub dir: PathBuf,
    /// Also check that the container was made from this checkpoint (identity and dimensions).
    #[arg(long, env = "EXPERTD_MODEL_DIR")]
    pub model: Option<PathBuf>,
    /// Also check every matrix's zero padding and row sums (reads every value; slower).
    #[arg(long, env = "EXPERTD_VERIFY_DEEP")]
    pub deep: bool,
}

/// Progress on stderr: a bar with bytes and ETA on a terminal, one line per layer otherwise.
struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new() -> Progress {
        Progress { bar: None }
    }

    fn start(&mut self, total: u64) {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            self.bar = Some(bar);
        }
    }

    fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// Runs `expertd prepare`.
pub fn prepare(args: &PrepareArgs) -> anyhow::Result<()> {
    let opts = PrepareOptions { model: args.model.clone(), out: args.out.clone(), throttle: Duration::from_millis(args.throttle_ms) };
    let mut progress = Progress::new();
    let start = Instant::now();
    let outcome = prepare::prepare(&opts, &mut |event| match event {
        PrepareEvent::Resuming { n_layers } => {
            progress.line(&format!("resuming {}: checking the blobs of {n_layers} layers", opts.out.join(shared::container::PARTIAL_FILE).display()))
        }
        PrepareEvent::LayerChecked { layer, kept } => {
            let verdict = if kept { "all blobs valid, kept" } else { "incomplete, will be converted again" };
            progress.line(&format!("  layer {layer}: {verdict}"));
        }
        PrepareEvent::Converting { n_layers, n_kept, source_bytes } => {
            progress.line(&format!(
                "converting {n_layers} layers ({:.2} GiB of BF16){}",
                source_bytes as f64 / f64::from(1u32 << 30),
                if n_kept > 0 { format!("; {n_kept} layers kept from the interrupted run") } else { String::new() }
            ));
            progress.start(source_bytes);
        }
        PrepareEvent::ExpertWritten { source_bytes, .. } => progress.inc(source_bytes),
        PrepareEvent::LayerWritten { layer } => {
            progress.line(&format!("layer {layer} written ({:.1} s)", start.elapsed().as_secs_f64()));
        }
        PrepareEvent::Finishing => {
            progress.finish();
            progress.line("writing index and header, syncing, renaming");
        }
    })?;
    progress.finish();
    match outcome {
        PrepareOutcome::UpToDate { path, header } => {
            println!("{} is up to date (identity {}, fingerprint {:#018x})", path.display(), header.identity, header.fingerprint());
            println!("(header and index checked; `expertd verify` checks every blob)");
        }
        PrepareOutcome::Written(s) => {
            let l = &s.header.layout;
            println!(
                "wrote {}: {} layers × {} experts, {} bytes ({:.2} GiB), {} converted, {} kept, in {:.1} s",
                s.path.display(),
                l.dims.n_layers,
                l.dims.n_experts,
                l.file_bytes,
                l.file_bytes as f64 / f64::from(1u32 << 30),
                s.layers_converted,
                s.layers_kept,
                s.elapsed.as_secs_f64()
            );
            println!("identity {}, fingerprint {:#018x}", s.header.identity, s.header.fingerprint());
            println!("dequantisation error (max over all experts):");
            println!("  {:<5} {:>12} {:>12} {:>14} {:>14}  worst (layer, expert)", "kind", "max|w-deq|", "max|w|", "rel to max|w|", "max row rel");
            for (name, k) in s.stats.kinds() {
                println!(
                    "  {:<5} {:>12.4e} {:>12.4e} {:>14.4e} {:>14.4e}  ({}, {})",
                    name,
                    k.max_abs_err,
                    k.max_abs_weight,
                    k.rel_to_max_abs_weight(),
                    k.max_row_rel_err,
                    k.worst_layer,
                    k.worst_expert
                );
            }
            println!("report: {}", opts.out.join(REPORT_FILE).display());
        }
    }
    Ok(())
}

/// Runs `expertd verify`; returns whether the container is sound.
pub fn verify(args: &VerifyArgs) -> anyhow::Result<bool> {
    let opts = VerifyOptions { dir: args.dir.clone(), model: args.model.clone(), deep: args.deep };
    let mut progress = Progress::new();
    // The blob region's size is only known after the header; a bar over the file length is close.
    let file_len = std::fs::metadata(args.dir.join(shared::container::CONTAINER_FILE)).map(|m| m.len()).unwrap_or(0);
    progress.start(file_len);
    let report = verify::verify(&opts, &|n| progress.inc(n))?;
    progress.finish();
    println!("container: {} ({} bytes)", report.path.display(), report.file_len);
    if let Some(h) = &report.header {
        let l = &h.layout;
        println!(
            "  format v1{}, {}, {} layers × {} experts, d {}, f {}, blob stride {} bytes",
            if h.magic == shared::container::VersionedMagic::UnfinishedV1 { " (unfinished)" } else { "" },
            shared::container::header::QUANT_SCHEME,
            l.dims.n_layers,
            l.dims.n_experts,
            l.dims.hidden,
            l.dims.inner,
            l.blob.stride
        );
        println!("  identity: {}", h.identity);
        println!("  fingerprint: {:#018x}", h.fingerprint());
        let secs = report.elapsed.as_secs_f64();
        println!(
            "  checked header, index ({} entries), {} blobs ({} bytes{}) in {:.2} s ({:.2} GB/s)",
            l.dims.n_blobs(),
            report.blobs_checked,
            report.blob_bytes,
            if args.deep { ", deep" } else { "" },
            secs,
            report.blob_bytes as f64 / secs.max(1e-9) / 1e9
        );
    }
    if let (Some(true), Some(model)) = (report.identity_checked, &args.model) {
        println!("  identity matches {}", model.display());
    }
    if report.ok() {
        println!("OK");
        return Ok(true);
    }
    println!("PROBLEMS ({}):", report.problems.len());
    const SHOWN: usize = 50;
    for p in report.problems.iter().take(SHOWN) {
        println!("  - {p}");
    }
    if report.problems.len() > SHOWN {
        println!("  … and {} more", report.problems.len() - SHOWN);
    }
    println!("FAILED: {} problem(s)", report.problems.len());
    Ok(false)
}
