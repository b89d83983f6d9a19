//! HTTP request bodies → validated parameters (`hostd/src/http/openai.rs` + `params.rs`): the
//! body bytes go through `serde_json` into `ChatCompletionRequest` or `CompletionRequest`, then
//! through the same validation steps, in the same order, as the chat and completions handlers
//! (model, unsupported features, `n`, messages or prompt, sampling, stop, token budget), the
//! chat template, and the tokenizer (the synthetic checkpoint's truncated Qwen3.6 vocabulary).
//!
//! Contract: no panic; every refusal is a client error (4xx, never 5xx) whose JSON body has a
//! message; every accepted request yields parameters inside their documented ranges.

use crate::Outcome;
use hostd::chat_template::{self, ChatOptions};
use hostd::http::error::ApiError;
use hostd::http::openai::{ChatCompletionRequest, CompletionRequest};
use hostd::http::params;
use hostd::sampling::MAX_STOP_STRINGS;
use hostd::tokenizer::Tokenizer;
use std::sync::OnceLock;

/// The model name the fuzzed server serves (also in the seed bodies).
const SERVED: &str = "sluice";
/// The context window the budget is checked against.
const MAX_CONTEXT: usize = 4096;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("sluice-fuzz-tokenizer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, sluice_tools::synth::tokenizer::ASSET).expect("write tokenizer");
        let t = Tokenizer::from_file(&path).expect("the synthetic tokenizer loads");
        let _ = std::fs::remove_dir_all(&dir);
        t
    })
}

/// First byte: even → chat completions, odd → completions; the rest is the body.
pub fn run(data: &[u8]) -> Outcome {
    let Some((&which, body)) = data.split_first() else {
        return "empty".into();
    };
    let result = if which % 2 == 0 {
        chat(body)
    } else {
        completion(body)
    };
    match result {
        Ok(what) => format!("ok:{what}"),
        Err(e) => {
            let status = e.status().as_u16();
            assert!(
                (400..500).contains(&status),
                "a request body caused a {status}: {e:?}"
            );
            let body = e.body();
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "error without a message: {body}");
            // The parameter's name without indices (and not at all for unknown ones, which the
            // fuzzer invents without end), so that the outcome counts kinds of refusal.
            let param = match e.code() {
                "unsupported_parameter" => "-",
                _ => body["error"]["param"]
                    .as_str()
                    .map_or("-", |p| p.split('[').next().unwrap_or(p)),
            };
            format!("{status}:{}:{param}", e.code())
        }
    }
}

fn chat(body: &[u8]) -> Result<&'static str, ApiError> {
    let req: ChatCompletionRequest = serde_json::from_slice(body)?;
    params::check_model(req.model.as_deref(), SERVED)?;
    params::reject_unsupported_chat(&req)?;
    params::check_n(req.n)?;
    let messages = params::chat_messages(
        req.messages
            .as_deref()
            .ok_or_else(|| ApiError::missing("messages"))?,
    )?;
    let logprobs = req.logprobs.unwrap_or(false);
    let sampling = params::sampling_params(&req.sampling(), logprobs, req.top_logprobs)?;
    assert!(sampling.validate().is_ok());
    let stop = params::stop_strings(req.stop.as_ref())?;
    assert!(stop.len() <= MAX_STOP_STRINGS && stop.iter().all(|s| !s.is_empty()));
    let requested = match req.max_completion_tokens {
        Some(_) => params::max_tokens(req.max_completion_tokens, "max_completion_tokens")?,
        None => params::max_tokens(req.max_tokens, "max_tokens")?,
    };
    assert!(requested.is_none_or(|n| n >= 1));
    let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    let opts = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: kwargs.enable_thinking.unwrap_or(true),
        preserve_thinking: kwargs.preserve_thinking.unwrap_or(false),
    };
    let text = chat_template::render(&messages, &opts)?;
    let prompt = tokenizer()
        .encode(&text)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let budget = params::budget(prompt.len(), requested, 1024, MAX_CONTEXT, "messages")?;
    assert!(
        budget >= 1 && prompt.len() + budget <= MAX_CONTEXT,
        "budget {budget} for {} prompt tokens",
        prompt.len()
    );
    Ok("chat")
}

fn completion(body: &[u8]) -> Result<&'static str, ApiError> {
    let req: CompletionRequest = serde_json::from_slice(body)?;
    params::check_model(req.model.as_deref(), SERVED)?;
    params::reject_unsupported_completion(&req)?;
    params::check_n(req.n)?;
    // The legacy `logprobs` range, as `completions.rs` checks it.
    let top = match req.logprobs {
        None => None,
        Some(n) if (0..=5).contains(&n) => Some(n),
        Some(n) => {
            return Err(ApiError::invalid(
                format!("logprobs must be between 0 and 5 (got {n})."),
                "logprobs",
            ));
        }
    };
    let sampling = params::sampling_params(&req.sampling(), top.is_some(), top)?;
    assert!(sampling.validate().is_ok());
    let stop = params::stop_strings(req.stop.as_ref())?;
    assert!(stop.len() <= MAX_STOP_STRINGS);
    let requested = params::max_tokens(req.max_tokens, "max_tokens")?;
    let t = tokenizer();
    // The server tokenises text prompts in its admission pool; here inline, with the same
    // refusal of text that tokenises to nothing.
    let prompt = match params::completion_prompt(req.prompt.as_ref(), t)? {
        params::PromptInput::Ids(ids) => ids,
        params::PromptInput::Text(text) => t
            .encode(&text)
            .map_err(|e| ApiError::invalid(e.to_string(), "prompt"))?,
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt tokenises to nothing.", "prompt"));
    }
    assert!(!prompt.is_empty() && prompt.iter().all(|&id| (id as usize) < t.vocab_size()));
    let budget = params::budget(prompt.len(), requested, 16, MAX_CONTEXT, "prompt")?;
    assert!(budget >= 1 && prompt.len() + budget <= MAX_CONTEXT);
    Ok("completion")
}
