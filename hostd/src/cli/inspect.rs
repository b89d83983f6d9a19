//! `hostd inspect MODEL [--json] [--config-only]`: validates a model directory (or a
//! `qwen35moe` GGUF file) and reports its layers, experts, memory arithmetic and shards (or the
//! GGUF's tensor types).
//!
//! The `--json` form is a stable interface: keys are only ever added. Every byte figure comes
//! from `shared::sizes` (config arithmetic) or the checkpoint inventory (bytes on disk).

use anyhow::Context;
use serde_json::{Value, json};
use shared::checkpoint::{self, Checkpoint};
use shared::config::{ConfigForm, ModelConfig};
use shared::sizes::ModelSizes;
use std::path::PathBuf;

/// Flags of `hostd inspect`.
#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Model directory (config.json, model.safetensors.index.json and shards), or a GGUF file;
    /// with `--config-only`, a directory or the config.json file itself.
    pub model: PathBuf,
    /// Print the report as JSON (a stable interface).
    #[arg(long)]
    pub json: bool,
    /// Read only config.json: report the arithmetic for a model whose weights are not here.
    #[arg(long)]
    pub config_only: bool,
}

/// Runs `hostd inspect`.
pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    let report = if !args.config_only && shared::gguf::is_gguf_path(&args.model) {
        gguf_report(&args.model)?
    } else if args.config_only {
        let config = if shared::gguf::is_gguf_path(&args.model) {
            let f = shared::gguf::GgufFile::open(&args.model)?;
            shared::gguf::model_config(&f.gguf)
                .with_context(|| format!("{}", args.model.display()))?
        } else if args.model.is_file() {
            let text = std::fs::read_to_string(&args.model)
                .with_context(|| format!("reading {}", args.model.display()))?;
            shared::config::parse_config(&text)
                .with_context(|| format!("{}", args.model.display()))?
        } else {
            checkpoint::read_config(&args.model)?
        };
        config_report(&config)
    } else {
        let ckpt = Checkpoint::open(&args.model).with_context(|| {
            format!("model directory {} failed validation", args.model.display())
        })?;
        checkpoint_report(&ckpt)
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", human(&report));
    }
    Ok(())
}

/// The report for a configuration alone (no weights read).
pub fn config_report(config: &ModelConfig) -> Value {
    let t = &config.text;
    let s = ModelSizes::from_config(t);
    let at = t.attention;
    let dn = t.delta_net;
    json!({
        "config_form": match config.form { ConfigForm::Nested => "nested", ConfigForm::Text => "text" },
        "num_layers": t.num_layers,
        "layer_types": t.layer_types.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
        "n_full_attention_layers": t.n_full_attention_layers(),
        "n_linear_attention_layers": t.n_linear_attention_layers(),
        "hidden_size": t.hidden_size,
        "vocab_size": t.vocab_size,
        "max_position_embeddings": t.max_position_embeddings,
        "attention": {
            "n_q_heads": at.n_q_heads, "n_kv_heads": at.n_kv_heads, "head_dim": at.head_dim,
            "q_per_kv": at.q_per_kv, "rotary_dims": at.rotary_dims, "rope_theta": t.rope_theta,
        },
        "linear_attention": {
            "n_k_heads": dn.n_k_heads, "n_v_heads": dn.n_v_heads, "key_head_dim": dn.key_head_dim,
            "value_head_dim": dn.value_head_dim, "v_per_k": dn.v_per_k, "conv_kernel": dn.conv_kernel,
            "conv_dim": dn.conv_dim(),
        },
        "num_experts": t.num_experts,
        "experts_per_token": t.experts_per_token,
        "moe_intermediate_size": t.moe_intermediate_size,
        "shared_expert_intermediate_size": t.shared_expert_intermediate_size,
        "expert_bytes_bf16": s.expert_bytes_bf16,
        "routed_expert_bytes_bf16": s.routed_expert_bytes_bf16,
        "dense_bytes_bf16": s.dense_bytes_bf16,
        "embedding_bytes_bf16": s.embedding_bytes_bf16,
        "decode_bytes_per_token": s.decode_bytes_per_token,
        "kv_bytes_per_token": s.kv_bytes_per_token,
        "linear_state_bytes_per_sequence": s.linear_state_bytes_per_sequence,
        "linear_recurrent_bytes_per_sequence": s.linear_recurrent_bytes_per_sequence,
        "linear_conv_bytes_per_sequence": s.linear_conv_bytes_per_sequence,
        "runtime_kv_bytes_per_token": s.runtime_kv_bytes_per_token,
        "runtime_linear_state_bytes_per_sequence": s.runtime_linear_state_bytes_per_sequence,
        "routed_expert_params": s.routed_expert_params,
        "dense_params": s.dense_params,
    })
}

/// The report for a validated checkpoint: the config report plus what is on disk.
pub fn checkpoint_report(ckpt: &Checkpoint) -> Value {
    let mut report = config_report(&ckpt.config);
    let (dense_on_disk, routed_on_disk) = ckpt.text_bytes_on_disk();
    let extra = json!({
        "model_dir": ckpt.dir.display().to_string(),
        "tensor_prefix": ckpt.prefix,
        "expert_layouts": ckpt.expert_layouts.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
        "text_tensor_count": ckpt.text_tensor_count(),
        "dense_bytes_on_disk": dense_on_disk,
        "routed_expert_bytes_on_disk": routed_on_disk,
        "skipped_tensors": ckpt.skipped,
        "unexpected_tensors": ckpt.unexpected,
        "shards": ckpt.shards.iter().map(|s| json!({
            "file": s.file_name, "bytes": s.file_len, "tensors": s.n_tensors,
        })).collect::<Vec<_>>(),
    });
    if let (Value::Object(r), Value::Object(e)) = (&mut report, extra) {
        r.extend(e);
    }
    report
}

/// The report for a GGUF file: the config report of its metadata plus its tensors' types.
pub fn gguf_report(path: &std::path::Path) -> anyhow::Result<Value> {
    let f = shared::gguf::GgufFile::open(path)?;
    let g = &f.gguf;
    let config = shared::gguf::model_config(g)
        .with_context(|| format!("{}: not a usable qwen35moe model", path.display()))?;
    let experts = shared::gguf::GgufExperts::locate(g)?;
    let mut report = config_report(&config);
    let mut dense: std::collections::BTreeMap<&str, u64> = Default::default();
    let expert_names: std::collections::HashSet<&str> =
        experts.tensors().map(|t| t.name.as_str()).collect();
    let mut dense_bytes = 0;
    for t in &g.tensors {
        if !expert_names.contains(t.name.as_str()) {
            *dense.entry(t.ty.name).or_default() += 1;
            dense_bytes += t.len;
        }
    }
    let routed: u64 = experts
        .tensors()
        .map(|t| t.expert_bytes * experts.n_experts as u64)
        .sum();
    let text = |k: &str| g.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let extra = json!({
        "gguf": {
            "file": path.display().to_string(),
            "bytes": f.len,
            "version": g.version,
            "tensors": g.tensors.len(),
            "name": text("general.name"),
            "tokenizer_model": text("tokenizer.ggml.model"),
            "tokenizer_pre": text("tokenizer.ggml.pre"),
            "has_chat_template": g.get("tokenizer.chat_template").is_some(),
            "expert_types": experts.layers.iter().map(|l| [l.gate.ty.name, l.up.ty.name, l.down.ty.name]).collect::<Vec<_>>(),
            "routed_expert_bytes": routed,
            "other_tensor_types": dense,
            "other_tensor_bytes": dense_bytes,
        }
    });
    if let (Value::Object(r), Value::Object(e)) = (&mut report, extra) {
        r.extend(e);
    }
    Ok(report)
}

fn human(r: &Value) -> String {
    let n = |k: &str| r[k].as_u64().unwrap_or(0);
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    if let Some(dir) = r["model_dir"].as_str() {
        line(format!("model          {dir}"));
    }
    let types: Vec<&str> = r["layer_types"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| if t == "full_attention" { "A" } else { "D" })
                .collect()
        })
        .unwrap_or_default();
    line(format!(
        "layers         {} ({} Gated DeltaNet, {} full attention): {}",
        n("num_layers"),
        n("n_linear_attention_layers"),
        n("n_full_attention_layers"),
        types.concat()
    ));
    line(format!(
        "hidden         {}   vocab {}",
        n("hidden_size"),
        n("vocab_size")
    ));
    let at = &r["attention"];
    line(format!(
        "attention      {} q heads, {} kv heads, head_dim {}, rotary dims {}",
        at["n_q_heads"], at["n_kv_heads"], at["head_dim"], at["rotary_dims"]
    ));
    let dn = &r["linear_attention"];
    line(format!(
        "delta net      {} qk heads × {}, {} v heads × {}, conv {}",
        dn["n_k_heads"],
        dn["key_head_dim"],
        dn["n_v_heads"],
        dn["value_head_dim"],
        dn["conv_kernel"]
    ));
    line(format!(
        "experts        {} per layer, top-{}, inner {}; one expert {} (BF16)",
        n("num_experts"),
        n("experts_per_token"),
        n("moe_intermediate_size"),
        bytes(n("expert_bytes_bf16"))
    ));
    line(format!(
        "routed experts {} (BF16, all layers)",
        bytes(n("routed_expert_bytes_bf16"))
    ));
    line(format!(
        "dense          {} (as released; embeddings {})",
        bytes(n("dense_bytes_bf16")),
        bytes(n("embedding_bytes_bf16"))
    ));
    line(format!(
        "decode/token   {} of weights touched (BF16, dense + top-k experts)",
        bytes(n("decode_bytes_per_token"))
    ));
    line(format!(
        "KV/token       {} (BF16, as transformers stores it; sluice's f32 cache: {})",
        bytes(n("kv_bytes_per_token")),
        bytes(n("runtime_kv_bytes_per_token"))
    ));
    line(format!(
        "state/sequence {} (DeltaNet recurrent F32 + conv BF16; sluice's all-f32 state: {})",
        bytes(n("linear_state_bytes_per_sequence")),
        bytes(n("runtime_linear_state_bytes_per_sequence"))
    ));
    if let Some(gg) = r["gguf"].as_object() {
        line(format!(
            "gguf           {} (v{}, {} tensors, {})",
            gg["file"].as_str().unwrap_or("?"),
            gg["version"],
            gg["tensors"],
            bytes(gg["bytes"].as_u64().unwrap_or(0))
        ));
        // Runs of layers with the same (gate, up, down) types.
        let types: Vec<String> = gg["expert_types"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let t: Vec<&str> = t
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                t.join("/")
            })
            .collect();
        let mut start = 0;
        for i in 1..=types.len() {
            if i == types.len() || types[i] != types[start] {
                line(format!(
                    "experts        layers {start}-{}: gate/up/down {}",
                    i - 1,
                    types[start]
                ));
                start = i;
            }
        }
        let other: Vec<String> = gg["other_tensor_types"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        line(format!(
            "on disk        {} routed experts + {} other tensors ({})",
            bytes(gg["routed_expert_bytes"].as_u64().unwrap_or(0)),
            bytes(gg["other_tensor_bytes"].as_u64().unwrap_or(0)),
            other.join(", ")
        ));
        line(format!(
            "tokenizer      {} / {}; chat template {}",
            gg["tokenizer_model"].as_str().unwrap_or("(none)"),
            gg["tokenizer_pre"].as_str().unwrap_or("(none)"),
            if gg["has_chat_template"] == true {
                "present"
            } else {
                "absent"
            }
        ));
    }
    if let Some(layouts) = r["expert_layouts"].as_array() {
        let fused = layouts.iter().filter(|l| *l == "fused").count();
        line(format!(
            "on disk        {} dense + {} routed; {} tensors; experts {} fused / {} per-expert layers",
            bytes(n("dense_bytes_on_disk")),
            bytes(n("routed_expert_bytes_on_disk")),
            n("text_tensor_count"),
            fused,
            layouts.len() - fused
        ));
        if let Some(skipped) = r["skipped_tensors"].as_object().filter(|m| !m.is_empty()) {
            let parts: Vec<String> = skipped.iter().map(|(k, v)| format!("{v} {k}")).collect();
            line(format!("skipped        {}", parts.join(", ")));
        }
        if let Some(u) = r["unexpected_tensors"].as_array().filter(|a| !a.is_empty()) {
            line(format!(
                "unexpected     {} tensors not used by the runtime (first: {})",
                u.len(),
                u[0]
            ));
        }
        for s in r["shards"].as_array().into_iter().flatten() {
            line(format!(
                "shard          {}  {}  {} tensors",
                s["file"].as_str().unwrap_or("?"),
                bytes(s["bytes"].as_u64().unwrap_or(0)),
                s["tensors"]
            ));
        }
    }
    out
}

/// Formats a byte count with a binary unit and the exact figure.
fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {} ({b} B)", UNITS[unit])
    }
}
