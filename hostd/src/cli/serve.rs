//! `hostd serve`: the OpenAI-compatible HTTP server. Parses flags, binds the socket (so
//! `/health` answers `loading` at once), loads the model on a background thread, starts the
//! engine, and serves until SIGINT/SIGTERM.
//!
//! Binding a non-loopback address requires an API key (`--api-key-file`); on loopback the key
//! is optional. The first line on stdout is `hostd serve: listening on http://ADDR`, which
//! scripts and tests read to learn the port when `--port 0` picks a free one; a `loading` line
//! follows at once and a `ready` line once the model can serve (or the process exits with the
//! load error).

use super::load::load_model;
use crate::engine::{self, EngineConfig, metrics::Metrics};
use crate::http::admission::{
    self, AdmissionConfig, MAX_BODY_BYTES_DEFAULT, MAX_PROMPT_BYTES_DEFAULT,
    TOKENIZE_THREADS_DEFAULT,
};
use crate::http::listener::{MAX_CONNECTIONS_DEFAULT, PeerLimits};
use crate::http::{self, AppState, Ready, ServerConfig};
use crate::load::LoadOptions;
use anyhow::Context;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

/// How long in-flight requests may run after SIGINT/SIGTERM before the process exits.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Default completion budget of a chat request without max_tokens: the output length the
/// Qwen3.6 model card recommends for most queries in thinking mode.
pub const DEFAULT_MAX_TOKENS: usize = 32_768;

/// The chat thinking default (`--default-thinking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Thinking {
    /// Think first (reasoning in `reasoning_content`), then answer.
    On,
    /// Answer at once.
    Off,
}

/// Flags of `hostd serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub load: LoadOptions,
    /// Address to bind. A non-loopback address requires --api-key-file.
    #[arg(long, env = "SLUICE_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to bind (0 picks a free one; the chosen port is printed).
    #[arg(long, env = "SLUICE_PORT", default_value_t = 8080)]
    pub port: u16,
    /// The model name clients send as `model` (default: the model directory's name, or a GGUF
    /// file's name without `.gguf`).
    #[arg(long, env = "SLUICE_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Requests that may wait for a free sequence slot; beyond it the server answers 429.
    #[arg(long, env = "SLUICE_MAX_QUEUE", default_value_t = 16)]
    pub max_queue: usize,
    /// Sequences generated concurrently (one batched forward pass per decode step).
    #[arg(long, env = "SLUICE_MAX_BATCH", default_value_t = 4)]
    pub max_batch: usize,
    /// Byte budget of the prefix cache of conversation states, in bytes or as 1GiB / 1G (0
    /// disables reuse).
    #[arg(
        long,
        env = "SLUICE_STATE_CACHE_BYTES",
        default_value_t = 1 << 30,
        value_parser = shared::byte_size::parse_bytes_usize,
    )]
    pub state_cache_bytes: usize,
    /// The prefix cache also keeps a checkpoint every this many prompt tokens, so an edited
    /// history re-prefills at most this many tokens before the edit (0: only at the chat
    /// template's marks: the end of the first message and the last assistant header). Each
    /// checkpoint ends a prefill block, so it may add a forward call. Default: the first
    /// multiple of --prefill-chunk from 2048 (docs/prefix-cache.md says why).
    #[arg(long, env = "SLUICE_PREFIX_CHECKPOINT_EVERY")]
    pub prefix_checkpoint_every: Option<usize>,
    /// Also save the states a restarted server resumes from (the end of a conversation's
    /// first message, its last assistant header, completions' final states) in this
    /// directory, written in the background; several hostd processes may share it. A state
    /// saved by another model, weights, container, dense format, ISA or build is never used.
    #[arg(long, env = "SLUICE_PREFIX_CACHE_DIR")]
    pub prefix_cache_dir: Option<PathBuf>,
    /// Bytes the --prefix-cache-dir directory may hold; the least recently used states are
    /// deleted to make room.
    #[arg(
        long,
        env = "SLUICE_PREFIX_CACHE_DISK_BYTES",
        default_value_t = 16 << 30,
        value_parser = shared::byte_size::parse_bytes,
    )]
    pub prefix_cache_disk_bytes: u64,
    /// Fault injection for tests: every generation step panics (the scheduler's supervision
    /// then fails the request, and past its panic budget hostd exits with status 70).
    #[arg(long, hide = true)]
    pub fault_panic_in_step: bool,
    /// Whether a chat request that does not say thinks first: `on` (Qwen3.6's own default) puts
    /// the reasoning in `reasoning_content` before the answer in `content`; `off` answers at
    /// once, for clients that show only `content`. A request overrides it with
    /// `chat_template_kwargs: {"enable_thinking": BOOL}`.
    #[arg(long, value_enum, env = "SLUICE_DEFAULT_THINKING", default_value_t = Thinking::On)]
    pub default_thinking: Thinking,
    /// Same as `--default-thinking off` (kept for existing scripts).
    #[arg(long, env = "SLUICE_NO_THINK", hide = true)]
    pub no_think: bool,
    /// File holding the API keys that /v1/* requests must send as `Authorization: Bearer KEY`:
    /// one key per line (blank lines and lines starting with `#` are skipped). Each key is its
    /// own principal: stored Responses API objects are visible only to the key that made them.
    #[arg(long, env = "SLUICE_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// A browser origin (`https://app.example`) allowed to call the API cross-origin; repeat for
    /// several, or `*` for any. Default: none (no CORS headers; preflights get 405).
    #[arg(long = "cors-allow-origin", value_name = "ORIGIN")]
    pub cors_allow_origin: Vec<String>,
    /// Do not serve the web page (chat and live expert-cache panel) at `/`; the API and
    /// `/v1/live` stay.
    #[arg(long, env = "SLUICE_NO_WEB_PAGE")]
    pub no_web_page: bool,
    /// Context limit in tokens (prompt + completion); default and maximum: the model's
    /// max_position_embeddings.
    #[arg(long, env = "SLUICE_MAX_CONTEXT")]
    pub max_context: Option<usize>,
    /// Prompt rows per prefill forward call (prefill can be cancelled between calls). It also
    /// bounds how long a long prompt delays other requests: about one block's compute.
    #[arg(long, env = "SLUICE_PREFILL_CHUNK", default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Prompt tokens prefilled per scheduler iteration, shared by the prompts being prefilled
    /// (shortest remaining first, at most one block each) before the next decode step; at least
    /// one block always runs. Default: --prefill-chunk.
    #[arg(long, env = "SLUICE_PREFILL_BUDGET")]
    pub prefill_budget: Option<usize>,
    /// Prompt tokens that may wait in the queue, all queued requests together; a request that
    /// would go past it gets 429 with Retry-After (a request into an empty queue is always
    /// taken, so any prompt that fits the context can be served).
    #[arg(long, env = "SLUICE_MAX_QUEUED_TOKENS", default_value_t = 262_144)]
    pub max_queued_tokens: usize,
    /// Completion budget of a chat request that sets no max_tokens, reasoning included
    /// (clipped to the context). The default is the output length Qwen recommends for thinking
    /// mode; a smaller one often ends a reply while it is still thinking, with empty `content`.
    #[arg(long, env = "SLUICE_DEFAULT_MAX_TOKENS", default_value_t = DEFAULT_MAX_TOKENS)]
    pub default_max_tokens: usize,
    /// Largest accepted request body in bytes (larger ones get 413, refused from
    /// Content-Length or as soon as the bytes received pass it).
    #[arg(
        long,
        env = "SLUICE_MAX_BODY_BYTES",
        default_value_t = MAX_BODY_BYTES_DEFAULT,
        value_parser = shared::byte_size::parse_bytes_usize,
    )]
    pub max_body_bytes: usize,
    /// Largest message content, and largest rendered prompt, in bytes; larger ones get 400
    /// (`prompt_too_large`) before any tokenisation. Tokenising costs roughly 100× the text in
    /// memory, so this and --tokenize-threads bound that cost.
    #[arg(
        long,
        env = "SLUICE_MAX_PROMPT_BYTES",
        default_value_t = MAX_PROMPT_BYTES_DEFAULT,
        value_parser = shared::byte_size::parse_bytes_usize,
    )]
    pub max_prompt_bytes: usize,
    /// Prompts tokenised at once, off the HTTP threads; a request waits up to --tokenize-wait
    /// for a slot, then gets 503 with Retry-After.
    #[arg(long, env = "SLUICE_TOKENIZE_THREADS", default_value_t = TOKENIZE_THREADS_DEFAULT)]
    pub tokenize_threads: usize,
    /// Bytes of prompt text tokenised at once over all --tokenize-threads (a larger prompt
    /// waits for the whole budget). Tokenising costs roughly 100-250× the text in transient
    /// memory, so this bounds that memory.
    #[arg(
        long,
        env = "SLUICE_TOKENIZE_BUDGET_BYTES",
        default_value_t = MAX_PROMPT_BYTES_DEFAULT,
        value_parser = shared::byte_size::parse_bytes_usize,
    )]
    pub tokenize_budget_bytes: usize,
    /// Seconds a request may wait for a tokeniser slot.
    #[arg(long, env = "SLUICE_TOKENIZE_WAIT", default_value_t = admission::TOKENIZE_WAIT_DEFAULT.as_secs_f64())]
    pub tokenize_wait: f64,
    /// Seconds a client has to send a request head, counted from connecting or from the end of
    /// the previous response on a keep-alive connection (so also the idle timeout); the
    /// connection is closed after it.
    #[arg(long, env = "SLUICE_HEADER_TIMEOUT", default_value_t = http::listener::HEADER_TIMEOUT_DEFAULT.as_secs_f64())]
    pub header_timeout: f64,
    /// Seconds a client has to send a whole request body (408 after it).
    #[arg(long, env = "SLUICE_BODY_TIMEOUT", default_value_t = admission::BODY_TIMEOUT_DEFAULT.as_secs_f64())]
    pub body_timeout: f64,
    /// Open connections served at once. Beyond it, a few more (32) may only ask GET /health,
    /// and further ones are closed at once.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = MAX_CONNECTIONS_DEFAULT)]
    pub max_connections: usize,
    /// Threads of the HTTP runtime (the model uses the compute pool, --threads).
    #[arg(long, env = "SLUICE_HTTP_THREADS", default_value_t = 2)]
    pub http_threads: usize,
}

/// The prefix cache's checkpoint interval in tokens before rounding up to a multiple of
/// `--prefill-chunk` (docs/prefix-cache.md: the measured cost of a checkpoint against the
/// prefill it saves).
const DEFAULT_CHECKPOINT_EVERY: usize = 2048;

/// Runs `hostd serve` until a signal (or a failed model load).
pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.max_queue >= 1, "--max-queue must be at least 1");
    anyhow::ensure!(args.max_batch >= 1, "--max-batch must be at least 1");
    anyhow::ensure!(
        args.prefill_chunk >= 1,
        "--prefill-chunk must be at least 1"
    );
    anyhow::ensure!(
        args.prefix_cache_dir.is_none() || args.state_cache_bytes > 0,
        "--prefix-cache-dir needs the prefix cache (--state-cache-bytes above 0)"
    );
    anyhow::ensure!(
        args.prefill_budget != Some(0),
        "--prefill-budget must be at least 1"
    );
    anyhow::ensure!(
        args.max_queued_tokens >= 1,
        "--max-queued-tokens must be at least 1"
    );
    anyhow::ensure!(
        args.default_max_tokens >= 1,
        "--default-max-tokens must be at least 1"
    );
    anyhow::ensure!(args.http_threads >= 1, "--http-threads must be at least 1");
    anyhow::ensure!(
        args.tokenize_threads >= 1,
        "--tokenize-threads must be at least 1"
    );
    anyhow::ensure!(
        args.max_connections >= 1,
        "--max-connections must be at least 1"
    );
    anyhow::ensure!(
        args.max_prompt_bytes >= 1,
        "--max-prompt-bytes must be at least 1"
    );
    let secs = |v: f64, flag: &str| -> anyhow::Result<std::time::Duration> {
        anyhow::ensure!(
            v.is_finite() && v > 0.0 && v <= 86_400.0,
            "{flag} must be between 0 and 86400 seconds (got {v})"
        );
        Ok(std::time::Duration::from_secs_f64(v))
    };
    let admission = AdmissionConfig {
        max_body_bytes: args.max_body_bytes,
        max_prompt_bytes: args.max_prompt_bytes,
        body_timeout: secs(args.body_timeout, "--body-timeout")?,
        tokenize_threads: args.tokenize_threads,
        tokenize_wait: secs(args.tokenize_wait, "--tokenize-wait")?,
        tokenize_budget_bytes: args.tokenize_budget_bytes.max(1),
    };
    let peer = PeerLimits {
        header_timeout: secs(args.header_timeout, "--header-timeout")?,
        max_connections: args.max_connections,
    };
    let api_keys = match &args.api_key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the API key file {}", path.display()))?;
            let keys = parse_api_keys(&text);
            anyhow::ensure!(
                !keys.is_empty(),
                "the API key file {} holds no key (one per line)",
                path.display()
            );
            keys
        }
        None => Vec::new(),
    };
    anyhow::ensure!(
        args.host.is_loopback() || !api_keys.is_empty(),
        "binding {} (not loopback) requires an API key: pass --api-key-file FILE, or bind 127.0.0.1",
        args.host
    );
    let served_model_name = match &args.served_model_name {
        Some(n) => n.clone(),
        None => args
            .load
            .model
            .canonicalize()
            .ok()
            .and_then(|p| {
                // A GGUF is named by its file as given (a cache's symlink, not the blob it points
                // to) without `.gguf`; a directory by its resolved name (`.` becomes a name).
                if shared::gguf::is_gguf_path(&p) {
                    args.load.model.file_stem()
                } else {
                    p.file_name()
                }
                .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "sluice".to_string()),
    };
    for origin in &args.cors_allow_origin {
        let well_formed = origin == "*"
            || (origin.starts_with("http://") || origin.starts_with("https://"))
                && !origin.ends_with('/')
                && origin
                    .split("://")
                    .nth(1)
                    .is_some_and(|rest| !rest.is_empty() && !rest.contains('/') && rest.is_ascii());
        anyhow::ensure!(
            well_formed,
            "--cors-allow-origin {origin:?}: expected an origin such as https://app.example (scheme://host[:port], no path) or *"
        );
    }
    let config = ServerConfig {
        served_model_name,
        api_keys,
        admission,
        peer,
        default_max_tokens: args.default_max_tokens,
        enable_thinking: args.default_thinking == Thinking::On && !args.no_think,
        cors_allow_origins: args.cors_allow_origin.clone(),
        web_page: !args.no_web_page,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.http_threads)
        .thread_name("hostd-http")
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(serve(args, config))
}

async fn serve(args: &ServeArgs, config: ServerConfig) -> anyhow::Result<()> {
    let addr = SocketAddr::new(args.host, args.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr().context("reading the bound address")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "hostd serve: listening on http://{local}")?;
        out.flush()?;
    }
    // The address comes first (scripts read it to learn the port); the model is not loaded yet,
    // so say what happens next. Later lines ignore write errors: a reader may have stopped
    // after the first line.
    say(&format!(
        "hostd serve: loading {} (/health answers 503 \"loading\" until the model is ready)",
        args.load.model.display()
    ));
    tracing::info!(%local, model = %config.served_model_name, auth_keys = config.api_keys.len(), "listening");
    if args.fault_panic_in_step {
        tracing::warn!(
            "--fault-panic-in-step: every generation step panics (fault injection for tests)"
        );
    }
    let metrics = Arc::new(Metrics::new());
    let state = AppState::new(config, Arc::clone(&metrics));

    // Load on a plain thread: mapping and validating a checkpoint blocks for a while.
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    // The engine stopping for good (its scheduler kept panicking) shuts the server down too.
    let (fatal_tx, fatal_rx) = tokio::sync::oneshot::channel::<engine::EngineFatal>();
    let loader_state = Arc::clone(&state);
    let mut load_args = args.load.clone();
    // The prefix cache, plus the states waiting to be saved (a quarter of it).
    load_args.host_extra_bytes = args.state_cache_bytes as u64
        + if args.prefix_cache_dir.is_some() {
            args.state_cache_bytes as u64 / 4
        } else {
            0
        };
    load_args.weights_digest = args.prefix_cache_dir.is_some();
    // `max_context` is resolved against the model once it is loaded.
    let engine_limits = (
        EngineConfig {
            max_queue: args.max_queue,
            max_queued_tokens: args.max_queued_tokens,
            max_batch: args.max_batch,
            state_cache_bytes: args.state_cache_bytes,
            state_dir: args
                .prefix_cache_dir
                .clone()
                .map(|d| (d, args.prefix_cache_disk_bytes)),
            checkpoint_every: args.prefix_checkpoint_every.unwrap_or(
                DEFAULT_CHECKPOINT_EVERY.div_ceil(args.prefill_chunk) * args.prefill_chunk,
            ),
            prefill_chunk: args.prefill_chunk,
            prefill_budget: args.prefill_budget.unwrap_or(args.prefill_chunk),
            max_context: 0,
            fault_panic_in_step: args.fault_panic_in_step,
        },
        args.max_context,
    );
    std::thread::Builder::new()
        .name("hostd-load".into())
        .spawn(
            move || match load(&load_args, engine_limits, &loader_state, fatal_tx) {
                Ok(()) => drop(failed_tx),
                Err(e) => {
                    let msg = shared::error_text::chain(e.as_ref());
                    tracing::error!(error = %msg, "model load failed");
                    loader_state.set_failed(msg.clone());
                    let _ = failed_tx.send(msg);
                }
            },
        )
        .context("starting the loader thread")?;

    let failed = Arc::new(std::sync::Mutex::new(None::<String>));
    let failed_w = Arc::clone(&failed);
    let fatal = Arc::new(std::sync::Mutex::new(None::<engine::EngineFatal>));
    let fatal_w = Arc::clone(&fatal);
    let stopping = Arc::new(tokio::sync::Notify::new());
    let stopping_w = Arc::clone(&stopping);
    let feeds = Arc::clone(&state);
    let shutdown = async move {
        let load_failed = async {
            match failed_rx.await {
                Ok(msg) => {
                    if let Ok(mut f) = failed_w.lock() {
                        *f = Some(msg);
                    }
                }
                // The loader succeeded: never resolve.
                Err(_) => std::future::pending::<()>().await,
            }
        };
        let engine_fatal = async {
            match fatal_rx.await {
                Ok(e) => {
                    tracing::error!(error = %e, grace_s = SHUTDOWN_GRACE.as_secs(), "shutting down: the generation engine stopped");
                    if let Ok(mut f) = fatal_w.lock() {
                        *f = Some(e);
                    }
                }
                // The engine never failed (or never started): never resolve.
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = signal() => tracing::info!(grace_s = SHUTDOWN_GRACE.as_secs(), "shutting down; in-flight requests may finish"),
            _ = load_failed => {}
            _ = engine_fatal => {}
        }
        stopping_w.notify_one();
        feeds.close_feeds();
    };
    // Graceful shutdown waits for open streams; a long generation must not hold the process.
    let grace = async move {
        stopping.notified().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
        tracing::warn!("in-flight requests did not finish within the grace period; exiting");
    };
    tokio::select! {
        r = http::serve(listener, state, shutdown) => r.context("serving HTTP")?,
        _ = grace => {}
    }
    if let Some(msg) = failed.lock().ok().and_then(|f| f.clone()) {
        anyhow::bail!("the model could not be loaded: {msg}");
    }
    if let Some(e) = fatal.lock().ok().and_then(|mut f| f.take()) {
        return Err(e.into());
    }
    Ok(())
}

/// Loads tokenizer and model, starts the engine and marks the server ready.
fn load(
    args: &LoadOptions,
    limits: (EngineConfig, Option<usize>),
    state: &AppState,
    on_fatal: tokio::sync::oneshot::Sender<engine::EngineFatal>,
) -> anyhow::Result<()> {
    let (mut config, max_context) = limits;
    let tokenizer = crate::load::load_tokenizer(&args.model)?;
    let model = load_model(args)?;
    let model_max = model.config().max_position_embeddings;
    let max_context = max_context.unwrap_or(model_max);
    anyhow::ensure!(
        (2..=model_max).contains(&max_context),
        "--max-context {max_context} must be between 2 and the model's max_position_embeddings ({model_max})"
    );
    let mut stop_ids = vec![tokenizer.im_end_id()?, tokenizer.endoftext_id()?];
    stop_ids.extend(model.config().eos_token_ids.iter().copied());
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let tokenizer = Arc::new(tokenizer);
    config.max_context = max_context;
    let EngineConfig {
        max_batch,
        max_queue,
        max_queued_tokens,
        state_cache_bytes,
        ..
    } = config;
    let store = match &config.state_dir {
        None => None,
        Some((dir, cap)) => {
            let identity = model.state_identity().context(
                "--prefix-cache-dir: cannot tell what computes this model's states (the expert daemon did not report its container)",
            )?;
            let layout = crate::prefix_store::file::Layout::of(&model);
            let stats = state.metrics().store_stats();
            // Saves wait in memory up to a quarter of the prefix cache's budget (one always).
            let max_pending = config.state_cache_bytes / 4;
            let store = crate::prefix_store::PrefixStore::open(
                dir,
                *cap,
                identity,
                layout,
                max_context,
                max_pending,
                stats,
            )
            .with_context(|| format!("--prefix-cache-dir {}", dir.display()))?;
            Some(store)
        }
    };
    let experts = Some(model.experts_backend());
    let heat = Some(model.routing_heat());
    let (engine, _thread) = engine::start(
        model,
        Arc::clone(&tokenizer),
        config,
        Arc::clone(state.metrics()),
        store,
        move |e| {
            let _ = on_fatal.send(e);
        },
    )
    .context("starting the scheduler")?;
    let created = http::unix_now();
    let max_token_bytes = admission::max_token_bytes(&tokenizer);
    let grammars = Arc::new(crate::constraint::Grammars::new(
        Arc::clone(&tokenizer),
        stop_ids.clone(),
    ));
    state.set_ready(Ready {
        engine,
        tokenizer,
        stop_ids,
        created,
        max_token_bytes,
        experts,
        grammars,
        heat,
    });
    tracing::info!(
        max_context,
        max_batch,
        max_queue,
        max_queued_tokens,
        state_cache_bytes,
        "model loaded; serving"
    );
    say(&format!(
        "hostd serve: ready (model {:?}, max context {max_context} tokens, batch {max_batch}, \
         queue {max_queue})",
        state.served_model_name()
    ));
    Ok(())
}

/// One status line on stdout, after the first; a closed stdout is not an error.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Resolves on SIGINT or SIGTERM.
async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// The keys of an API key file: one per line, trimmed; blank lines and `#` comments skipped.
fn parse_api_keys(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod key_file_tests {
    use super::parse_api_keys;

    #[test]
    fn one_key_per_line_comments_and_blanks_skipped() {
        assert_eq!(parse_api_keys("k1\n"), ["k1"]);
        assert_eq!(
            parse_api_keys("# team a\n  alpha  \n\n#beta\nbeta\r\n"),
            ["alpha", "beta"]
        );
        assert!(parse_api_keys("\n # none\n").is_empty());
    }
}
