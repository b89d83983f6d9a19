//! `hostd eval`: the machine interface for parity checks (kept stable). For each prompt: one
//! prefill (in row blocks), then N greedy steps (argmax, lowest id on ties, no EOS stop);
//! writes logits, greedy ids and router choices in the oracle's reference schema.

use super::load::{LoadArgs, load_model};
use crate::model::moe::Routes;
use crate::model::{Logits, Model};
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
    pub load: LoadArgs,
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
            .map(str::to_string)
            .unwrap_or_else(|| format!("prompt{i}"));
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

/// Logits, greedy ids and routes of one prompt.
pub struct PromptEval {
    /// `T × V`.
    pub prompt_logits: Vec<f32>,
    /// Greedy continuation.
    pub greedy_ids: Vec<u32>,
    /// `N × V`; row i is the vector whose argmax gave `greedy_ids[i]`.
    pub greedy_logits: Vec<f32>,
    /// Per layer, the routes of every prompt position.
    pub prompt_routes: Vec<Routes>,
    /// Per layer, the routes of every token fed during decode (`N − 1` rows).
    pub greedy_routes: Vec<Routes>,
}

/// Prefill in blocks of `chunk` rows, then `n_new` greedy steps.
pub fn eval_prompt(
    model: &Model,
    ids: &[u32],
    n_new: usize,
    chunk: usize,
) -> anyhow::Result<PromptEval> {
    let n_layers = model.config().num_layers;
    let vocab = model.config().vocab_size;
    let mut state = model.new_state();
    let mut prompt_logits = Vec::with_capacity(ids.len() * vocab);
    let mut prompt_routes: Vec<Routes> = Vec::new();
    if ids.is_empty() {
        bail!("empty prompt: at least one token is required");
    }
    for block in ids.chunks(chunk) {
        let mut r = Vec::with_capacity(n_layers);
        prompt_logits.extend(model.forward(&mut state, block, Logits::All, Some(&mut r))?);
        merge_routes(&mut prompt_routes, r);
    }
    let mut greedy_ids = Vec::with_capacity(n_new);
    let mut greedy_logits = Vec::with_capacity(n_new * vocab);
    let mut greedy_routes: Vec<Routes> = Vec::new();
    let mut last = prompt_logits[prompt_logits.len() - vocab..].to_vec();
    for step in 0..n_new {
        if step > 0 {
            let mut r = Vec::with_capacity(n_layers);
            last = model.forward(
                &mut state,
                &[greedy_ids[step - 1]],
                Logits::Last,
                Some(&mut r),
            )?;
            merge_routes(&mut greedy_routes, r);
        }
        greedy_ids.push(argmax(&last));
        greedy_logits.extend_from_slice(&last);
    }
    Ok(PromptEval {
        prompt_logits,
        greedy_ids,
        greedy_logits,
        prompt_routes,
        greedy_routes,
    })
}

/// Index of the largest value; the lowest index wins ties.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Appends one call's per-layer routes to the running per-layer lists.
fn merge_routes(acc: &mut Vec<Routes>, call: Vec<Routes>) {
    if acc.is_empty() {
        *acc = call;
        return;
    }
    for (a, c) in acc.iter_mut().zip(call) {
        a.ids.extend(c.ids);
        a.weights.extend(c.weights);
    }
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
