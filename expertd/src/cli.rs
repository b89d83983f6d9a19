//! expertd subcommands' flags and their terminal output: `prepare` (progress bar, resume
//! messages, the dequantisation table), `verify` (the report), `replay` (the table) and
//! `serve` (flags, socket binding, signals; the server itself is `crate::server`).
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
    init_tracing_with_default("warn");
}

/// Install the process-wide `tracing` subscriber, filtered by `RUST_LOG` (default `default`;
/// `serve` uses `info` so its startup facts are logged).
pub fn init_tracing_with_default(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only on a terminal: redirected logs stay plain text.
    let ansi = IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

/// Flags of `expertd prepare`.
#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// The BF16 checkpoint directory (config.json + safetensors), or a `qwen35moe` GGUF file
    /// (its routed experts' blocks are copied where the format allows, docs/gguf.md).
    #[arg(env = "EXPERTD_MODEL_DIR")]
    pub model: PathBuf,
    /// Directory to write `experts.sluice` (and `prepare-report.json`) into; created if missing.
    #[arg(long, env = "EXPERTD_CONTAINER_DIR")]
    pub out: PathBuf,
    /// Milliseconds to sleep after each blob written (tests use it to interrupt a run midway).
    #[arg(
        long,
        env = "EXPERTD_PREPARE_THROTTLE_MS",
        default_value_t = 0,
        hide = true
    )]
    pub throttle_ms: u64,
    /// How to quantise the routed experts (docs/container-format.md). Default: `int8` for a
    /// checkpoint; for a GGUF, the format nearest its experts' types (Q4_K gate/up → `q4k`,
    /// or `q4k-q6k` when any down tensor has more than 5 bits; gate/up above 5 bits → `int8`).
    #[arg(long, value_enum, env = "EXPERTD_PREPARE_FORMAT")]
    pub format: Option<FormatArg>,
}

/// The values of `expertd prepare --format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatArg {
    /// Symmetric per-row INT8 (8 bits per weight; container format v1). 3.03 MiB per expert at
    /// the real dimensions.
    Int8,
    /// ggml Q4_K blocks for gate, up and down (4.5 bits per weight; v2). 1.69 MiB per expert.
    Q4k,
    /// Q4_K gate/up, Q6_K down (5.19 bits per weight on average; v2). 1.95 MiB per expert.
    #[value(name = "q4k-q6k")]
    Q4kQ6k,
}

impl From<FormatArg> for shared::container::ExpertFormat {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Int8 => shared::container::ExpertFormat::Int8,
            FormatArg::Q4k => shared::container::ExpertFormat::Q4K,
            FormatArg::Q4kQ6k => shared::container::ExpertFormat::Q4KQ6K,
        }
    }
}

/// Flags of `expertd verify`.
#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// The container directory (holding `experts.sluice`).
    #[arg(env = "EXPERTD_CONTAINER_DIR")]
    pub dir: PathBuf,
    /// Also check that the container was made from this checkpoint or GGUF file (identity and
    /// dimensions).
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
            let style = ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
            )
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
    let opts = PrepareOptions {
        model: args.model.clone(),
        out: args.out.clone(),
        throttle: Duration::from_millis(args.throttle_ms),
        format: args.format.map(Into::into),
    };
    let mut progress = Progress::new();
    let start = Instant::now();
    let outcome = prepare::prepare(&opts, &mut |event| match event {
        PrepareEvent::Resuming { n_layers } => progress.line(&format!(
            "resuming {}: checking the blobs of {n_layers} layers",
            opts.out.join(shared::container::PARTIAL_FILE).display()
        )),
        PrepareEvent::LayerChecked { layer, kept } => {
            let verdict = if kept {
                "all blobs valid, kept"
            } else {
                "incomplete, will be converted again"
            };
            progress.line(&format!("  layer {layer}: {verdict}"));
        }
        PrepareEvent::Requantizing(r) => progress.line(&format!(
            "warning: {} is {}, not the container's {} for its matrix: requantizing it \
             (dequantized, then quantized to {}; the loss is in prepare-report.json)",
            r.tensor(),
            r.from,
            r.to,
            r.to
        )),
        PrepareEvent::Converting {
            n_layers,
            n_kept,
            source_bytes,
        } => {
            progress.line(&format!(
                "converting {n_layers} layers ({:.2} GiB of source weights){}",
                source_bytes as f64 / f64::from(1u32 << 30),
                if n_kept > 0 {
                    format!("; {n_kept} layers kept from the interrupted run")
                } else {
                    String::new()
                }
            ));
            progress.start(source_bytes);
        }
        PrepareEvent::ExpertWritten { source_bytes, .. } => progress.inc(source_bytes),
        PrepareEvent::LayerWritten { layer } => {
            progress.line(&format!(
                "layer {layer} written ({:.1} s)",
                start.elapsed().as_secs_f64()
            ));
        }
        PrepareEvent::Finishing => {
            progress.finish();
            progress.line("writing index and header, syncing, renaming");
        }
    })?;
    progress.finish();
    match outcome {
        PrepareOutcome::UpToDate { path, header } => {
            println!(
                "{} is up to date (identity {}, fingerprint {:#018x})",
                path.display(),
                header.identity,
                header.fingerprint()
            );
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
            println!(
                "identity {}, fingerprint {:#018x}",
                s.header.identity,
                s.header.fingerprint()
            );
            println!("dequantisation error (max over all experts):");
            println!(
                "  {:<5} {:>12} {:>12} {:>14} {:>14}  worst (layer, expert)",
                "kind", "max|w-deq|", "max|w|", "rel to max|w|", "max row rel"
            );
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
    let opts = VerifyOptions {
        dir: args.dir.clone(),
        model: args.model.clone(),
        deep: args.deep,
    };
    let mut progress = Progress::new();
    // The blob region's size is only known after the header; a bar over the file length is close.
    let file_len =
        std::fs::metadata(args.dir.join(shared::container::CONTAINER_FILE)).map_or(0, |m| m.len());
    progress.start(file_len);
    let report = verify::verify(&opts, &|n| progress.inc(n))?;
    progress.finish();
    println!(
        "container: {} ({} bytes)",
        report.path.display(),
        report.file_len
    );
    if let Some(h) = &report.header {
        let l = &h.layout;
        println!(
            "  format v{}{}, {} ({}), {} layers × {} experts, d {}, f {}, blob stride {} bytes",
            h.magic.version(),
            if h.magic.is_unfinished() {
                " (unfinished)"
            } else {
                ""
            },
            l.dims.format,
            l.dims.format.scheme(),
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

/// Flags of `expertd replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The route trace (JSON lines) recorded by expertd.
    #[arg(env = "EXPERTD_REPLAY_TRACE")]
    pub trace: PathBuf,
    /// Eviction policies to replay (repeat or comma-separate for a table); default: the trace's.
    #[arg(long, value_enum, value_delimiter = ',', env = "EXPERTD_REPLAY_POLICY")]
    pub policy: Vec<crate::cache::PolicyKind>,
    /// Cache budgets in bytes (repeat or comma-separate for a table); default: the trace's.
    #[arg(
        value_parser = shared::byte_size::parse_bytes,
        long = "cache-bytes",
        value_delimiter = ',',
        env = "EXPERTD_REPLAY_CACHE_BYTES"
    )]
    pub cache_bytes: Vec<u64>,
    /// `lfu-aging` halving period in calls per layer; default: the trace's, else 32.
    #[arg(long, env = "EXPERTD_REPLAY_HALVING_PERIOD")]
    pub halving_period: Option<u64>,
    /// Bytes of one cache slot (the blob stride); default: the trace's.
    #[arg(long, env = "EXPERTD_REPLAY_SLOT_BYTES", value_parser = shared::byte_size::parse_bytes)]
    pub slot_bytes: Option<u64>,
    /// Transient buffers; default: the trace's.
    #[arg(long, env = "EXPERTD_REPLAY_TRANSIENT_SLOTS")]
    pub transient_slots: Option<u32>,
    /// Print the results as JSON instead of a table.
    #[arg(long, env = "EXPERTD_REPLAY_JSON")]
    pub json: bool,
}

/// Runs `expertd replay`; returns false if a replay under the recorded configuration did not
/// reproduce the recorded hits and misses exactly.
pub fn replay(args: &ReplayArgs) -> anyhow::Result<bool> {
    use crate::cache::Policy;
    use crate::replay::{ReplayConfig, format_table, replay};
    use anyhow::Context as _;
    use rayon::prelude::*;
    let trace = crate::trace::Trace::open(&args.trace)
        .with_context(|| format!("reading {}", args.trace.display()))?;
    let h = &trace.header;
    let kinds = if args.policy.is_empty() {
        vec![h.policy]
    } else {
        args.policy.clone()
    };
    let budgets = if args.cache_bytes.is_empty() {
        vec![h.budget_bytes]
    } else {
        args.cache_bytes.clone()
    };
    let configs: Vec<ReplayConfig> = kinds
        .iter()
        .flat_map(|&kind| {
            let policy = Policy::from_kind(kind, args.halving_period.or(h.halving_period));
            budgets.iter().map(move |&budget_bytes| ReplayConfig {
                policy,
                budget_bytes,
                slot_bytes: args.slot_bytes.unwrap_or(h.slot_bytes),
                transient_slots: args.transient_slots.unwrap_or(h.transient_slots),
            })
        })
        .collect();
    let results = configs
        .par_iter()
        .map(|c| replay(&trace, c))
        .collect::<Result<Vec<_>, _>>()?;
    if args.json {
        let doc = serde_json::json!({ "trace": args.trace, "recorded": h, "results": results });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "trace {}: {} events, recorded with {} over {} bytes ({} slots of {} bytes, {} transient)",
            args.trace.display(),
            trace.events.len(),
            h.policy(),
            h.budget_bytes,
            h.slots,
            h.slot_bytes,
            h.transient_slots
        );
        print!("{}", format_table(&results));
    }
    Ok(results
        .iter()
        .all(|r| r.check.as_ref().is_none_or(|c| c.matches)))
}

/// Flags of `expertd serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The container directory (holding `experts.sluice`).
    #[arg(long, env = "EXPERTD_CONTAINER_DIR")]
    pub container: PathBuf,
    /// Serve on this unix socket (shared-memory activations, peer credentials checked).
    #[arg(
        long,
        env = "EXPERTD_SOCKET",
        conflicts_with = "listen",
        required_unless_present = "listen"
    )]
    pub socket: Option<PathBuf>,
    /// Permissions of the socket file, in octal.
    #[arg(long, env = "EXPERTD_SOCKET_MODE", default_value = "660")]
    pub socket_mode: String,
    /// Serve on TCP HOST:PORT instead (inline activations; needs --auth-token-file, and
    /// --tls-cert/--tls-key or --insecure).
    #[arg(long, env = "EXPERTD_LISTEN")]
    pub listen: Option<String>,
    /// File holding the bearer token TCP clients must present (surrounding whitespace ignored).
    #[arg(long, env = "EXPERTD_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// PEM certificate chain (leaf first) of the TCP listener: clients connect with
    /// `https://HOST:PORT` and check it against their CA file.
    #[arg(
        long,
        env = "EXPERTD_TLS_CERT",
        requires = "tls_key",
        requires = "listen"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "EXPERTD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve plain TCP without TLS (token and activations in clear text): only on a network
    /// you trust; clients must say `--expertd-insecure` too.
    #[arg(
        long,
        env = "EXPERTD_INSECURE",
        conflicts_with = "tls_cert",
        requires = "listen"
    )]
    pub insecure: bool,
    /// Byte budget of the expert cache (resident experts), in bytes or as 16GiB / 16G. Checked at start against this
    /// process's cgroup memory limit (MemoryMax=) plus the daemon's overhead; when left out, a
    /// budget that fits the limit is derived.
    #[arg(long, env = "EXPERTD_CACHE_BYTES", value_parser = shared::byte_size::parse_bytes)]
    pub cache_bytes: Option<u64>,
    /// Serve Prometheus metrics (`GET /metrics`) on HOST:PORT or on a unix socket path.
    #[arg(long, env = "EXPERTD_METRICS_LISTEN")]
    pub metrics_listen: Option<crate::metrics::MetricsListen>,
    /// Eviction policy.
    #[arg(long, value_enum, env = "EXPERTD_POLICY", default_value_t = crate::cache::PolicyKind::Lru)]
    pub policy: crate::cache::PolicyKind,
    /// `lfu-aging` halving period, in calls per layer (default 32).
    #[arg(long, env = "EXPERTD_HALVING_PERIOD")]
    pub halving_period: Option<u64>,
    /// How experts are read.
    #[arg(long, value_enum, env = "EXPERTD_IO", default_value_t = crate::io::IoKind::Uring)]
    pub io: crate::io::IoKind,
    /// Extra buffers for misses when every cached expert is leased (default: min(experts per
    /// layer, 32) per compute lane).
    #[arg(long, env = "EXPERTD_TRANSIENT_SLOTS")]
    pub transient_slots: Option<u32>,
    /// Record every cache decision to this file (JSON lines) for `expertd replay`.
    #[arg(long, env = "EXPERTD_ROUTE_TRACE")]
    pub route_trace: Option<PathBuf>,
    /// Allow unix peers with this uid (repeatable); with no --allow-uid/--allow-gid, any peer
    /// the socket's mode admits may call.
    #[arg(long = "allow-uid", env = "EXPERTD_ALLOW_UID", value_delimiter = ',')]
    pub allow_uid: Vec<u32>,
    /// Allow unix peers with this primary gid (repeatable).
    #[arg(long = "allow-gid", env = "EXPERTD_ALLOW_GID", value_delimiter = ',')]
    pub allow_gid: Vec<u32>,
    /// Calls one session may have queued or running; more get RESOURCE_EXHAUSTED.
    #[arg(long, env = "EXPERTD_MAX_QUEUED_CALLS", default_value_t = crate::server::DEFAULT_MAX_QUEUED_CALLS)]
    pub max_queued_calls: u32,
    /// Sessions one connection may hold open; a handshake past it gets RESOURCE_EXHAUSTED.
    #[arg(long, env = "EXPERTD_MAX_SESSIONS_PER_CONNECTION", default_value_t = crate::server::DEFAULT_MAX_SESSIONS_PER_CONNECTION)]
    pub max_sessions_per_connection: u32,
    /// Sessions one unix uid (over all its connections; for TCP, one client address) may hold
    /// open; a handshake past it gets RESOURCE_EXHAUSTED.
    #[arg(long, env = "EXPERTD_MAX_SESSIONS_PER_UID", default_value_t = crate::server::DEFAULT_MAX_SESSIONS_PER_UID)]
    pub max_sessions_per_uid: u32,
    /// Connections one unix uid (for TCP, one client address) may hold open at once; more are
    /// closed as they are accepted, before anything they send is read.
    #[arg(long, env = "EXPERTD_MAX_CONNECTIONS_PER_UID", default_value_t = crate::server::DEFAULT_MAX_CONNECTIONS_PER_UID)]
    pub max_connections_per_uid: u32,
    /// Largest shared-memory segment a connection may pass, in bytes; larger ones are refused
    /// (the connection then carries activations inline). Default: room for 4 slots of 2048 rows
    /// of the container's hidden size and a ring of 16 experts per row (hostd's defaults twice
    /// over).
    #[arg(long, env = "EXPERTD_MAX_SEGMENT_BYTES", value_parser = shared::byte_size::parse_bytes)]
    pub max_segment_bytes: Option<u64>,
    /// Most bytes of gRPC requests arriving (counted from each message's length prefix as its
    /// wire bytes plus twice that for what it may decode to) or decoded and waiting for a
    /// compute lane, over every connection; a request past it is refused (RESOURCE_EXHAUSTED)
    /// instead of buffered or queued. Counted in the memory overhead. Default: one of the
    /// largest admissible requests per compute lane plus one arriving. (Calls on the
    /// shared-memory ring hold no request.)
    #[arg(long, env = "EXPERTD_MAX_QUEUED_BYTES", value_parser = shared::byte_size::parse_bytes)]
    pub max_queued_bytes: Option<u64>,
    /// Seconds a gRPC request's body may take to arrive; a slower one is refused
    /// (DEADLINE_EXCEEDED) and what it held released.
    #[arg(long, env = "EXPERTD_REQUEST_ARRIVAL_TIMEOUT_SECS", default_value_t = crate::server::DEFAULT_REQUEST_ARRIVAL_LIMIT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub request_arrival_timeout_secs: u64,
    /// Largest n_tokens of one call.
    #[arg(long, env = "EXPERTD_MAX_ROWS_PER_CALL", default_value_t = crate::server::DEFAULT_MAX_ROWS)]
    pub max_rows_per_call: u32,
    /// Calls computing at once (each uses every compute thread).
    #[arg(long, env = "EXPERTD_COMPUTE_LANES", default_value_t = crate::server::DEFAULT_COMPUTE_LANES)]
    pub compute_lanes: usize,
    /// Compute threads (0: one per core).
    #[arg(long, env = "EXPERTD_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// Speculative bytes one client session may read on prefetch hints ahead of its demand
    /// calls: a bucket of this size that each demand call of the session refills by 1/layers of
    /// it (so one token's calls refill it whole, and hints alone cannot read more); 0: eight
    /// blobs per layer (8 × layers × blob size: one top-8 token's worth). Clients send hints when this daemon streams (hostd `--expertd-prefetch auto`, the
    /// default) or with `--expertd-prefetch on`.
    #[arg(
        long,
        env = "EXPERTD_PREFETCH_CAP_BYTES",
        default_value_t = 0,
        value_parser = shared::byte_size::parse_bytes,
    )]
    pub prefetch_cap_bytes: u64,
    /// Ignore prefetch hints (no speculative reads).
    #[arg(long, env = "EXPERTD_NO_PREFETCH")]
    pub no_prefetch: bool,
    /// Read a call's misses before computing any of its experts (the design before the call
    /// ring; for A/B measurements). By default resident experts compute while misses are read.
    #[arg(long, env = "EXPERTD_NO_OVERLAP")]
    pub no_overlap: bool,
    /// Microseconds a call ring's worker keeps polling for its client's next call after one
    /// ends, before it sleeps on the futex (the poll yields the core to any other runnable
    /// thread, so a client sharing the cores loses little to it). Waking a sleeping worker costs
    /// tens of µs on a virtual machine, more than the poll; 0 sleeps at once.
    #[arg(long, env = "EXPERTD_RING_SPIN_US", default_value_t = crate::call::ring_worker::DEFAULT_WORKER_SPIN.as_micros() as u64)]
    pub ring_spin_us: u64,
    /// Let the compute threads sleep between a session's calls instead of keeping them awake
    /// (yielding their cores to any other runnable thread) while its ring worker polls for the
    /// next call. Waking sleeping threads costs tens of µs per call on a virtual machine.
    #[arg(long, env = "EXPERTD_NO_KEEP_AWAKE")]
    pub no_keep_awake: bool,
    /// Exit (draining) when standard input reaches end of file: hostd's private daemon uses it
    /// so that it never outlives hostd, however hostd ends.
    #[arg(long, env = "EXPERTD_EXIT_ON_STDIN_EOF", hide = true)]
    pub exit_on_stdin_eof: bool,
}

/// Resolves when the daemon should drain: SIGTERM, SIGINT, or (when asked) end of stdin.
async fn shutdown_signal(watch_stdin: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    let stdin_eof = async move {
        if !watch_stdin {
            return std::future::pending::<()>().await;
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let mut sink = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            while let Ok(n) = std::io::Read::read(&mut stdin, &mut sink) {
                if n == 0 {
                    break;
                }
            }
            let _ = tx.send(());
        });
        let _ = rx.await;
    };
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
        _ = stdin_eof => tracing::info!("standard input closed (parent gone)"),
    }
    crate::systemd::stopping();
}

/// Runs `expertd serve` until SIGTERM/SIGINT, then drains.
pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    use crate::server::{Listener, ServeConfig};
    use anyhow::Context as _;
    let token = match &args.auth_token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    anyhow::ensure!(
        args.listen.is_none() || token.is_some(),
        "--listen (TCP) needs --auth-token-file: TCP clients must present a bearer token"
    );
    if args.listen.is_some() && args.tls_cert.is_none() && !args.insecure {
        return Err(crate::server::ServeError::TcpWithoutTls.into());
    }
    anyhow::ensure!(
        args.socket.is_some() || args.listen.is_some(),
        "give --socket PATH or --listen HOST:PORT"
    );
    let mode = u32::from_str_radix(&args.socket_mode, 8)
        .with_context(|| format!("--socket-mode {:?} is not octal", args.socket_mode))?;
    // Socket activation: systemd's listener replaces binding our own (same path, same mode rule).
    let inherited = crate::systemd::inherited_listener(args.socket.as_deref(), mode)?;
    anyhow::ensure!(
        inherited.is_none() || args.socket.is_some(),
        "socket activation passes a unix socket: give --socket with its path (EXPERTD_SOCKET), not --listen"
    );
    crate::systemd::status("checking the memory budget");
    let cache_bytes = memory_budget(args)?;
    let config = ServeConfig {
        policy: crate::cache::Policy::from_kind(args.policy, args.halving_period),
        transient_slots: args.transient_slots,
        io: args.io,
        route_trace: args.route_trace.clone(),
        allow_uids: args.allow_uid.clone(),
        allow_gids: args.allow_gid.clone(),
        auth_token: token,
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(crate::server::TlsIdentity::read(cert, key)?),
            _ => None,
        },
        insecure_tcp: args.insecure,
        max_queued_calls_per_session: args.max_queued_calls,
        max_sessions_per_connection: args.max_sessions_per_connection,
        max_sessions_per_uid: args.max_sessions_per_uid,
        max_connections_per_uid: args.max_connections_per_uid,
        max_segment_bytes: args.max_segment_bytes,
        max_queued_bytes: args.max_queued_bytes,
        request_arrival_limit: Duration::from_secs(args.request_arrival_timeout_secs),
        max_rows_per_call: args.max_rows_per_call,
        compute_lanes: args.compute_lanes,
        threads: args.threads,
        prefetch_cap_bytes: args.prefetch_cap_bytes,
        no_prefetch: args.no_prefetch,
        overlap: !args.no_overlap,
        ring_spin: Duration::from_micros(args.ring_spin_us),
        pool_awake: !args.no_keep_awake,
        ..ServeConfig::new(args.container.clone(), cache_bytes)
    };
    config.validate()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("expertd-rt")
        .enable_all()
        .build()?;
    rt.block_on(async {
        // Everything that can fail or take time happens before the socket exists: a client that
        // sees the socket file (or can connect to the port) is served at once.
        crate::systemd::status("opening the container and building the cache");
        let prepared = crate::server::Prepared::new(config)?;
        let (listener, socket) = match (inherited, &args.socket, &args.listen) {
            (Some(i), _, _) => {
                tracing::info!(socket = %i.path.display(), "listening on the socket systemd passed (socket activation)");
                // systemd owns the file: it is not removed on exit.
                (Listener::Unix(tokio::net::UnixListener::from_std(i.listener).context("registering the inherited socket with tokio")?), None)
            }
            (None, Some(path), _) => (Listener::Unix(crate::server::bind_unix(path, mode)?), Some(path.clone())),
            (None, None, Some(addr)) => {
                let l = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
                tracing::info!(addr = %l.local_addr()?, tls = args.tls_cert.is_some(), "listening on TCP");
                (Listener::Tcp(l), None)
            }
            (None, None, None) => anyhow::bail!("give --socket PATH or --listen HOST:PORT"),
        };
        let metrics = match &args.metrics_listen {
            Some(at) => Some(crate::metrics::serve(at, std::sync::Arc::clone(prepared.state())).await.with_context(|| format!("metrics endpoint {at:?}"))?),
            None => None,
        };
        let budget = prepared.executor().cache().stats().budget_bytes;
        crate::systemd::ready(&format!("serving {} (cache budget {budget} B)", args.container.display()));
        let result = prepared.serve(listener, shutdown_signal(args.exit_on_stdin_eof)).await;
        if let Some(task) = metrics {
            task.abort();
        }
        if let Some(crate::metrics::MetricsListen::Unix(path)) = &args.metrics_listen {
            let _ = std::fs::remove_file(path);
        }
        if let Some(path) = socket {
            let _ = std::fs::remove_file(path);
        }
        result.map_err(anyhow::Error::from)
    })
}

/// The cache budget `serve` runs with: `--cache-bytes` checked against this process's cgroup
/// memory limit plus the daemon's overhead, or (without `--cache-bytes`) derived from the
/// limit; a clear error naming the numbers when no budget fits. See `crate::memlimit`.
fn memory_budget(args: &ServeArgs) -> anyhow::Result<u64> {
    use crate::memlimit::{Budget, Overhead, own_limit, plan};
    let container = shared::container::ContainerFile::open(&args.container).map_err(|source| {
        crate::server::ServeError::Container {
            dir: args.container.display().to_string(),
            source,
        }
    })?;
    let layout = container.header().layout;
    let (dims, blob) = (layout.dims, layout.blob.stride as u64);
    let lanes = args.compute_lanes.max(1) as u64;
    let transient = args
        .transient_slots
        .map_or((dims.n_experts.min(32) as u64) * lanes, u64::from);
    let calls = crate::call_memory::CallMemory::new(
        dims.hidden,
        dims.inner,
        args.threads,
        args.max_rows_per_call as usize,
        dims.n_experts,
    );
    let queued = args
        .max_queued_bytes
        .unwrap_or_else(|| calls.default_queued_bytes(lanes as usize));
    let overhead = Overhead::estimate(blob, transient, lanes, calls.max_call_bytes(), queued);
    let requested = args
        .cache_bytes
        .map(|b| crate::server::clamp_budget(b, dims.n_blobs() as u64, blob));
    let limit = own_limit();
    let budget = plan(requested, limit.as_ref(), overhead, blob)?;
    match (&budget, &limit) {
        (Budget::Derived(b), Some(l)) => tracing::info!(
            cache_bytes = b,
            limit_bytes = l.bytes,
            limit_file = %l.file.display(),
            overhead_bytes = overhead.total(),
            "no --cache-bytes: budget derived from the memory limit (limit - limit/16 - overhead {overhead})"
        ),
        (Budget::Fits(b), Some(l)) => {
            tracing::info!(cache_bytes = b, limit_bytes = l.bytes, limit_file = %l.file.display(), overhead_bytes = overhead.total(), "cache budget fits the memory limit");
        }
        _ => {}
    }
    // A derived budget is already within the container's size; --cache-bytes is passed as given
    // (the server clamps and logs it).
    Ok(match budget {
        Budget::Derived(b) => crate::server::clamp_budget(b, dims.n_blobs() as u64, blob),
        Budget::Fits(_) | Budget::Unchecked(_) => args.cache_bytes.unwrap_or(0),
    })
}
