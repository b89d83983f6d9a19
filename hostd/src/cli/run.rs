//! `hostd run`: one prompt through the chat template, greedy generation streamed to stdout,
//! then TTFT, prefill and decode tokens/s and peak RSS.

use super::load::load_model;
use crate::chat_template::{self, ChatMessage, ChatOptions};
use crate::generate::{GenerateOptions, StopReason, generate_greedy};
use crate::load::LoadOptions;
use anyhow::Context;
use serde_json::json;
use std::io::Write;

/// Flags of `hostd run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub load: LoadOptions,
    /// The user message.
    #[arg(long)]
    pub prompt: String,
    /// An optional system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Turn thinking off (an empty think block is pre-filled).
    #[arg(long)]
    pub no_think: bool,
    /// Feed the prompt as raw text, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Prompt rows per forward block during prefill.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Print one JSON object (text and numbers) instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `hostd run`.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let tokenizer = crate::load::load_tokenizer(&args.load.model)?;
    let text = if args.raw {
        args.prompt.clone()
    } else {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(args.prompt.clone()));
        let opts = ChatOptions {
            enable_thinking: !args.no_think,
            ..ChatOptions::default()
        };
        chat_template::render(&messages, &opts)?
    };
    let prompt = tokenizer.encode(&text)?;
    anyhow::ensure!(
        !prompt.is_empty(),
        "the prompt is empty: nothing to generate from"
    );
    let model = load_model(&args.load)?;
    let max = model.config().max_position_embeddings;
    // Strictly below the limit: the context must have room for at least one new token.
    anyhow::ensure!(
        prompt.len() < max,
        "the prompt is {} tokens but the model's context is {max} tokens (max_position_embeddings)",
        prompt.len()
    );
    let mut stop_ids = vec![tokenizer.im_end_id()?, tokenizer.endoftext_id()?];
    stop_ids.extend(model.config().eos_token_ids.iter().copied());
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let opts = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        stop_ids,
        prefill_chunk: args.prefill_chunk,
        sample_vocab: tokenizer.vocab_size(),
        allowed: Some(tokenizer.defined_ids_mask().into()),
    };
    let mut decoder = tokenizer.incremental_decoder();
    let mut text_out = String::new();
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let (ids, stats) = generate_greedy(&model, &prompt, &opts, |id| {
        match decoder.push(id) {
            Ok(Some(piece)) => {
                text_out.push_str(&piece);
                if !args.json
                    && let Err(e) = stdout
                        .write_all(piece.as_bytes())
                        .and_then(|_| stdout.flush())
                {
                    write_err = Some(e);
                    return false;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "detokenisation failed");
            }
        }
        true
    })?;
    if let Some(e) = write_err {
        return Err(e).context("writing to stdout");
    }
    if let Some(rest) = decoder.finish() {
        text_out.push_str(&rest);
        if !args.json {
            stdout.write_all(rest.as_bytes())?;
        }
    }
    let stop = match stats.stop {
        StopReason::Stop(id) => format!("stop token {id}"),
        StopReason::Length => "max tokens".to_string(),
        StopReason::Cancelled => "cancelled".to_string(),
    };
    let rss = shared::procfs::vm_hwm_bytes(None);
    if args.json {
        let doc = json!({
            "text": text_out,
            "prompt_tokens": stats.prompt_tokens,
            "generated_ids": ids,
            "new_tokens": stats.new_tokens,
            "stop": stop,
            "ttft_s": stats.ttft.as_secs_f64(),
            "prefill_s": stats.prefill_time.as_secs_f64(),
            "prefill_tokens_per_s": stats.prefill_tokens_per_s(),
            "decode_tokens_per_s": stats.decode_tokens_per_s(),
            "decode_steps": stats.decode_steps,
            "decode_s": stats.decode_time.as_secs_f64(),
            "peak_rss_bytes": rss,
            "experts": model.experts_name(),
            "dense": model.dense_format().name(),
            "kernel_isa": model.isa().name(),
            "threads": rayon::current_num_threads(),
        });
        writeln!(stdout, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        writeln!(stdout)?;
        let decode = stats
            .decode_tokens_per_s()
            .map_or("n/a".to_string(), |v| format!("{v:.2}"));
        eprintln!(
            "\n[{} prompt tokens, {} new ({stop})] TTFT {:.3} s | prefill {:.1} tok/s | decode {decode} tok/s | peak RSS {} | experts {} | dense {} | isa {} | threads {}",
            stats.prompt_tokens,
            stats.new_tokens,
            stats.ttft.as_secs_f64(),
            stats.prefill_tokens_per_s(),
            rss.map_or("n/a".to_string(), |b| format!(
                "{:.1} MiB",
                b as f64 / 1048576.0
            )),
            model.experts_name(),
            model.dense_format().name(),
            model.isa().name(),
            rayon::current_num_threads()
        );
    }
    Ok(())
}
