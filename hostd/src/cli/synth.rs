//! `hostd synth --preset {tiny,small,realdim} [--layers N] [--experts N] [--seed S] --out DIR
//! [--tokenizer FILE] [--force] [--dry-run]`: writes a deterministic random-weight checkpoint in the
//! release's on-disk layout, after printing its size and the size of the INT8 expert container
//! `expertd prepare` would make from it.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use sluice_tools::synth::{self, Preset, RuntimeTokenizer, SynthOptions, TokenizerSource};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Flags of `hostd synth`.
#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Model size: `tiny`/`small` for tests, `realdim` for Qwen3.6-35B-A3B's per-layer dimensions.
    #[arg(long, value_enum)]
    pub preset: Preset,
    /// Decoder layers (≥ 4; layer i is full attention iff i % 4 == 3). Default: 4 (tiny,
    /// realdim), 8 (small).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Routed experts per layer (≥ the preset's top-k, which stays as it is: 2 tiny, 4 small,
    /// 8 realdim). Default: 8 (tiny), 32 (small), 256 (realdim).
    #[arg(long)]
    pub experts: Option<usize>,
    /// Seed of the weight values (same preset, layers, experts and seed → byte-identical files).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model directory to create (written as DIR.tmp-<pid>, renamed at the end).
    #[arg(long)]
    pub out: PathBuf,
    /// A real Qwen3.6 tokenizer.json to copy (realdim only; specials must be at 248044…).
    /// Default: the committed truncated vocabulary.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Replace DIR if it exists and is not empty.
    #[arg(long)]
    pub force: bool,
    /// Print the plan and the sizes only; write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `hostd synth`.
pub fn run(args: &SynthArgs) -> anyhow::Result<()> {
    let plan = synth::plan(args.preset, args.layers, args.experts)?;
    let total = plan.total_file_bytes();
    let sizes = shared::sizes::ModelSizes::from_config(&plan.config);
    let container = plan.int8_container_bytes()?;
    eprintln!(
        "synth {}: {} layers, hidden {}, {} experts top-{}, vocab {}; {} tensors in {} shards",
        plan.preset,
        plan.layers,
        plan.dims.hidden,
        plan.dims.experts,
        plan.dims.top_k,
        plan.dims.vocab_size,
        plan.shards.iter().map(|s| s.tensors.len()).sum::<usize>(),
        plan.shards.len(),
    );
    eprintln!(
        "  checkpoint (BF16 shards)      {:>9.2} GiB  {total} bytes (dense {}, routed experts {})",
        gib(total),
        sizes.dense_bytes_bf16,
        sizes.routed_expert_bytes_bf16
    );
    eprintln!(
        "  INT8 expert container         {:>9.2} GiB  {container} bytes (expertd prepare)",
        gib(container)
    );
    if args.dry_run {
        return Ok(());
    }
    let opts = SynthOptions {
        seed: args.seed,
        out: args.out.clone(),
        tokenizer: args
            .tokenizer
            .clone()
            .map_or(TokenizerSource::Asset, TokenizerSource::File),
        force: args.force,
        load_tokenizer: runtime_tokenizer,
        cancel: Arc::new(AtomicBool::new(false)),
    };
    // Ctrl-C (or a service stop) ends the write between chunks and removes `DIR.tmp-<pid>`;
    // a second one exits at once (the next synth removes what is left).
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&opts.cancel))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&opts.cancel)))
            .context("installing the interrupt handler")?;
    }
    let start = Instant::now();
    let mut reporter = Progress::new(args.preset == Preset::Realdim, total);
    let summary = match synth::synthesize(&plan, &opts, &mut |n| reporter.add(n)) {
        Err(e @ synth::SynthError::Interrupted(_)) => {
            reporter.finish();
            eprintln!("hostd synth: {e}");
            std::process::exit(130);
        }
        other => other.with_context(|| format!("writing {}", args.out.display()))?,
    };
    reporter.finish();
    eprintln!(
        "wrote {}: {} shards, {} tensors, {} bytes in {:.1} s",
        summary.dir.display(),
        summary.shards,
        summary.tensors,
        summary.shard_bytes,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The synthetic checkpoint's `tokenizer.json` is checked with the tokenizer that will load it.
impl RuntimeTokenizer for crate::tokenizer::Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        crate::tokenizer::Tokenizer::encode(self, text).map_err(|e| e.to_string())
    }

    fn vocab_size(&self) -> usize {
        crate::tokenizer::Tokenizer::vocab_size(self)
    }
}

/// Loads a written `tokenizer.json` with hostd's tokenizer ([`SynthOptions::load_tokenizer`]).
pub fn runtime_tokenizer(path: &Path) -> Result<Box<dyn RuntimeTokenizer>, String> {
    Ok(Box::new(
        crate::tokenizer::Tokenizer::from_file(path).map_err(|e| e.to_string())?,
    ))
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// Bytes-written reporting: a progress bar on a terminal, a line per 10% otherwise.
enum Progress {
    Off,
    Bar(ProgressBar),
    Lines {
        done: u64,
        total: u64,
        next_tenth: u64,
        start: Instant,
    },
}

impl Progress {
    fn new(enabled: bool, total: u64) -> Progress {
        if !enabled {
            Progress::Off
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                done: 0,
                total,
                next_tenth: 1,
                start: Instant::now(),
            }
        }
    }

    fn add(&mut self, n: u64) {
        match self {
            Progress::Off => {}
            Progress::Bar(bar) => bar.inc(n),
            Progress::Lines {
                done,
                total,
                next_tenth,
                start,
            } => {
                *done += n;
                while *next_tenth <= 10 && *done >= *total / 10 * *next_tenth {
                    eprintln!(
                        "  {:>3}%  {:.2} / {:.2} GiB  {:.0} s",
                        *next_tenth * 10,
                        *done as f64 / f64::from(1u32 << 30),
                        *total as f64 / f64::from(1u32 << 30),
                        start.elapsed().as_secs_f64()
                    );
                    *next_tenth += 1;
                }
            }
        }
    }

    fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_tools::synth::tokenizer;

    #[test]
    fn realdim_tokenizer_loads_with_the_real_special_ids() {
        let dims = Preset::Realdim.dims();
        let dir = tempfile::tempdir().expect("scratch dir");
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, tokenizer::asset_for(&dims).expect("renumbered")).expect("write");
        tokenizer::verify(&path, &dims, runtime_tokenizer).expect("loads with the real ids");
        let tok = crate::tokenizer::Tokenizer::from_file(&path).expect("loads");
        assert_eq!(
            tok.encode("<|im_start|>user\nhi<|im_end|>")
                .expect("encode")[0],
            248_045
        );
        assert_eq!(tok.token_id("</think>"), Some(248_069));
        assert_eq!(tok.vocab_size(), 248_077);
        // The BPE part is unchanged: "hi" is rank 5834 in the full vocabulary, so it splits here.
        let ids = tok.encode("hi").expect("encode");
        assert!(ids.iter().all(|&id| id < 1000), "{ids:?}");
    }

    #[test]
    fn tiny_tokenizer_loads() {
        let dims = Preset::Tiny.dims();
        let dir = tempfile::tempdir().expect("scratch dir");
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, tokenizer::ASSET).expect("write");
        tokenizer::verify(&path, &dims, runtime_tokenizer).expect("the asset loads");
        let missing = runtime_tokenizer(&dir.path().join("absent.json"))
            .err()
            .expect("no file");
        assert!(missing.contains("absent.json"), "{missing}");
    }
}
