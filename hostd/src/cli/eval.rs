//! `hostd eval`: the machine interface for parity checks (kept stable). For each prompt: one
//! prefill (in row blocks), then N greedy steps (argmax, lowest id on ties, no EOS stop);
//! writes logits, greedy ids and router choices in the oracle's reference schema.

use super::load::load_model;
use crate::eval::eval_prompt;
use crate::load::LoadOptions;
use crate::model::moe::Routes;
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Activation precision of `hostd eval`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalDtype {
    /// f32 activations from the bf16 weights (compare with transformers' float32 run).
    F32,
}

/// Flags of `hostd eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    pub load: LoadOptions,
    /// JSON file `{"prompts": [{"name": …, "input_ids": [...]}, …]}` (other keys ignored).
    #[arg(long)]
    pub prompts: PathBuf,
    /// Greedy steps per prompt.
    #[arg(long, default_value_t = 16)]
    pub new_tokens: usize,
    /// Activation precision.
    #[arg(long, value_enum, default_value_t = EvalDtype::F32)]
    pub dtype: EvalDtype,
    /// Output JSON; logits go to `<OUT stem>.logits.f32` beside it.
    #[arg(long)]
    pub out: PathBuf,
    /// Feed each prompt in blocks of at most this many tokens (state carried across blocks).
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
}

/// Runs `hostd eval`.
pub fn run(args: &EvalArgs) -> anyhow::Result<()> {
    if args.prefill_chunk == 0 {
        bail!("--prefill-chunk must be at least 1");
    }
    let model = load_model(&args.load)?;
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading {}", args.prompts.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", args.prompts.display()))?;
    let prompts = doc["prompts"]
        .as_array()
        .with_context(|| format!("{}: missing array \"prompts\"", args.prompts.display()))?;

    let stem = args
        .out
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("eval");
    let logits_name = format!("{stem}.logits.f32");
    let logits_path = args.out.with_file_name(&logits_name);
    let mut logits_file = std::io::BufWriter::new(
        std::fs::File::create(&logits_path)
            .with_context(|| format!("creating {}", logits_path.display()))?,
    );
    let mut offset = 0u64;
    let mut out_prompts = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let name = p["name"]
            .as_str()
            .map_or_else(|| format!("prompt{i}"), str::to_string);
        let ids: Vec<u32> = serde_json::from_value(p["input_ids"].clone())
            .with_context(|| format!("prompt {name:?}: input_ids must be a list of token ids"))?;
        let r = eval_prompt(&model, &ids, args.new_tokens, args.prefill_chunk)
            .with_context(|| format!("prompt {name:?}"))?;
        let vocab = model.config().vocab_size;
        let mut write_block = |rows: &[f32]| -> anyhow::Result<Value> {
            let at = offset;
            for v in rows {
                logits_file.write_all(&v.to_le_bytes())?;
            }
            offset += (rows.len() * 4) as u64;
            Ok(json!({"path": logits_name, "offset": at, "shape": [rows.len() / vocab, vocab]}))
        };
        let prompt_logits_file = write_block(&r.prompt_logits)?;
        let greedy_logits_file = write_block(&r.greedy_logits)?;
        out_prompts.push(json!({
            "name": name,
            "input_ids": ids,
            "prompt_logits_file": prompt_logits_file,
            "greedy_ids": r.greedy_ids,
            "greedy_logits_file": greedy_logits_file,
            "router": routes_json(&r.prompt_routes),
            "greedy_router": routes_json(&r.greedy_routes),
        }));
    }
    logits_file.flush()?;
    let doc = json!({
        "dtype": "float32",
        "implementation": format!("sluice {}", env!("CARGO_PKG_VERSION")),
        "experts": model.experts_name(),
        "kernel_isa": model.isa().name(),
        "prompts": out_prompts,
    });
    write_json(&args.out, &doc)
}

fn write_json(path: &Path, v: &Value) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string(v)?)
        .with_context(|| format!("writing {}", path.display()))
}

fn routes_json(routes: &[Routes]) -> Value {
    Value::Array(
        routes
            .iter()
            .map(|r| {
                let ids: Vec<&[u32]> = r.ids.chunks(r.top_k).collect();
                let weights: Vec<&[f32]> = r.weights.chunks(r.top_k).collect();
                json!({"ids": ids, "weights": weights})
            })
            .collect(),
    )
}
