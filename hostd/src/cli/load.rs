//! Flags and code shared by the subcommands that load a model (`run`, `eval`, `bench`): model
//! directory, expert backend, thread count.

use crate::experts::{ExpertBackend, bf16::Bf16Experts, int8::Int8Experts};
use shared::kernels::int8::Int8Isa;
use crate::model::Model;
use crate::model::weights::MappedCheckpoint;
use anyhow::Context;
use shared::kernels::Isa;
use std::path::PathBuf;
use std::sync::Arc;

/// Which backend computes routed experts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertsKind {
    /// Straight from the checkpoint's BF16 weights, in-process (the reference).
    Bf16,
    /// W8A8 kernels on the INT8 container (`--container DIR`, made by `expertd prepare`),
    /// in-process with plain reads.
    Int8,
}

/// Model-loading flags.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Model directory (config.json, safetensors index and shards, tokenizer.json).
    #[arg(long, env = "SLUICE_MODEL")]
    pub model: PathBuf,
    /// Routed-expert backend.
    #[arg(long, value_enum, default_value_t = ExpertsKind::Bf16)]
    pub experts: ExpertsKind,
    /// INT8 expert container directory (with `--experts int8`).
    #[arg(long, env = "SLUICE_CONTAINER")]
    pub container: Option<PathBuf>,
    /// Compute threads (default: every core).
    #[arg(long, env = "SLUICE_THREADS")]
    pub threads: Option<usize>,
}

/// Sets up the thread pool, validates and maps the checkpoint, and builds the model.
pub fn load_model(args: &LoadArgs) -> anyhow::Result<Model> {
    if let Some(n) = args.threads {
        anyhow::ensure!(n >= 1, "--threads must be at least 1");
        // Fails only if a pool already exists (tests calling twice); the first setting stands.
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    }
    let selection = Isa::selection();
    if let Some(warning) = selection.warning() {
        tracing::warn!("{warning}");
    }
    let isa = selection.active;
    tracing::info!(isa = isa.name(), threads = rayon::current_num_threads(), "kernels");
    let mapped = MappedCheckpoint::open(&args.model)
        .with_context(|| format!("model directory {} failed validation", args.model.display()))?;
    let experts: Arc<dyn ExpertBackend> = match args.experts {
        ExpertsKind::Bf16 => Arc::new(Bf16Experts::new(&mapped, isa)?),
        ExpertsKind::Int8 => {
            let dir = args.container.as_ref().context("--experts int8 needs --container DIR (make one with `expertd prepare MODEL --out DIR`)")?;
            let selection = Int8Isa::selection();
            if let Some(warning) = selection.warning() {
                tracing::warn!("{warning}");
            }
            tracing::info!(isa = selection.active.name(), container = %dir.display(), "int8 experts");
            Arc::new(Int8Experts::open(dir, &mapped.ckpt, selection.active)?)
        }
    };
    Ok(Model::load(&mapped, experts, isa)?)
}
