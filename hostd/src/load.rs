//! Loading a model: the options of the subcommands that load one (`run`, `eval`, `profile`,
//! `serve`; the CLI flattens them into its flags, tests build them directly), and
//! [`load_model`], which validates and maps the checkpoint, connects the expert backend
//! (in-process, or expertd: a running daemon with `--expertd URI`, several daemons each serving
//! a range of layers with repeated `--expertd URI=FIRST-LAST`, or a private child with
//! `--experts expertd`) and builds the model. No process-wide state: the caller sizes the
//! rayon pool and names the client. Errors are [`LoadError`], worded after the flags.

use crate::expert_client::shards::ShardError;
use crate::expert_client::{
    CaCertificate, ClientOptions, Endpoint, ExpertClientError, ExpertdClient, Prefetch,
    PrivateDaemon, PrivateOptions, ShardSpec, ShardedExperts,
};
use crate::experts::int8::Int8LoadError;
use crate::experts::{ExpertBackend, bf16::Bf16Experts, int8::Int8Experts};
use crate::model::Model;
use crate::model::ModelError;
use crate::model::keep_awake::Awake;
use crate::model::linear::DenseFormat;
use crate::model::weights::MappedCheckpoint;
use crate::model::weights::WeightsError;
use crate::tokenizer::{Tokenizer, TokenizerError};
use shared::container::ContainerError;
use shared::kernels::Isa;
use shared::kernels::int8::Int8Isa;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Which backend computes routed experts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertsKind {
    /// Straight from the checkpoint's BF16 weights, in-process (the reference).
    Bf16,
    /// The container's kernels (W8A8 for an INT8 container, Q4_K/Q6_K for a 4-bit one) on the
    /// container at `--container DIR` (made by `expertd prepare [--format F]`),
    /// in-process with plain reads.
    Int8,
    /// The same W8A8 experts computed by expertd: the daemon at `--expertd URI`, or without it
    /// a private expertd that hostd starts on `--container DIR` (preparing it if missing).
    Expertd,
}

/// Storage of the large dense projections (attention, DeltaNet, shared expert, lm_head).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DenseKind {
    /// BF16 weights as stored in the checkpoint, f32 activations (the exact mode).
    #[default]
    Bf16,
    /// W8A8: weights quantised to INT8 per output row at load, activations per row; about half
    /// the bytes per token. Router and small gates stay BF16.
    Int8,
    /// A GGUF only: projections the file stores as Q4_K or Q6_K run from those blocks (W4A8 /
    /// W6A8, llama.cpp's own bytes; no conversion at load), the others as int8. Router and
    /// small gates stay BF16.
    Gguf,
}

impl From<DenseKind> for DenseFormat {
    fn from(k: DenseKind) -> DenseFormat {
        match k {
            DenseKind::Bf16 => DenseFormat::Bf16,
            DenseKind::Int8 => DenseFormat::Int8,
            DenseKind::Gguf => DenseFormat::Gguf,
        }
    }
}

/// Options of the expertd backend (its flags).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ExpertdOptions {
    /// A running expertd: `unix:///PATH` (shared-memory activations), `https://HOST:PORT`
    /// (TLS; needs --expertd-ca-file and --expertd-token-file) or `http://HOST:PORT` (plain TCP;
    /// also needs --expertd-insecure). Selects `--experts expertd`. Repeat it with layer ranges
    /// to shard the experts over several daemons, e.g. `--expertd unix:///run/sluice/a.sock=0-19
    /// --expertd https://node2:7443=20-39`: the ranges must cover every MoE layer exactly once.
    #[arg(long = "expertd", env = "SLUICE_EXPERTD", value_delimiter = ',')]
    pub expertd_uri: Vec<String>,
    /// File holding the bearer token of a TCP expertd (every TCP shard presents it).
    #[arg(long = "expertd-token-file", env = "SLUICE_EXPERTD_TOKEN_FILE")]
    pub expertd_token_file: Option<PathBuf>,
    /// PEM file of the CA certificate(s) that signed the `https://` daemons' certificates.
    #[arg(long = "expertd-ca-file", env = "SLUICE_EXPERTD_CA_FILE")]
    pub expertd_ca_file: Option<PathBuf>,
    /// Allow `http://` (plain TCP, unencrypted) expertd endpoints: the token and activations
    /// cross the network in clear text. Only on a network you trust.
    #[arg(long = "expertd-insecure", env = "SLUICE_EXPERTD_INSECURE")]
    pub expertd_insecure: bool,
    /// Container fingerprint the daemon must serve (hex, as `expertd verify` prints it;
    /// default: the header of `--container DIR` when given).
    #[arg(long = "expertd-fingerprint", env = "SLUICE_EXPERTD_FINGERPRINT")]
    pub expertd_fingerprint: Option<String>,
    /// Cache budget of the private expertd, in bytes or as 16GiB / 16G (default: the whole
    /// container if it fits in free memory beside the dense weights and 1 GiB headroom, else what
    /// is left; printed at start).
    #[arg(
        long = "expertd-cache-bytes",
        env = "SLUICE_EXPERTD_CACHE_BYTES",
        value_parser = shared::byte_size::parse_bytes,
    )]
    pub expertd_cache_bytes: Option<u64>,
    /// Send activations inline even over a unix socket (no shared memory).
    #[arg(long = "expertd-no-shm", env = "SLUICE_EXPERTD_NO_SHM")]
    pub expertd_no_shm: bool,
    /// Send MoE calls as `MoeLayer` RPCs instead of through the shared-memory call ring (the
    /// ring is the default on a unix socket with shared memory; results are identical).
    #[arg(long = "expertd-no-ring", env = "SLUICE_EXPERTD_NO_RING")]
    pub expertd_no_ring: bool,
    /// Predict each next layer's experts (its router on the current hidden state) and send
    /// them to expertd as prefetch hints, so their reads overlap this layer's compute (call
    /// ring only; results are unchanged). `auto` (the default): only when the daemon streams
    /// (its cache budget is below the container's expert bytes); `on` (or the bare flag):
    /// always; `off`: never.
    #[arg(long = "expertd-prefetch", env = "SLUICE_EXPERTD_PREFETCH", value_name = "WHEN", num_args = 0..=1, default_value = "auto", default_missing_value = "on")]
    pub expertd_prefetch: Prefetch,
    /// One more `expertd serve` flag for the private daemon (repeatable), e.g.
    /// `--expertd-daemon-arg=--no-overlap`.
    #[arg(long = "expertd-daemon-arg", allow_hyphen_values = true)]
    pub expertd_daemon_args: Vec<String>,
    /// Deadline of one expert call in seconds, reconnection included: a daemon that does not
    /// answer within it (stopped, hung) fails the call — HTTP 503 with Retry-After in `serve`
    /// — instead of holding the batch. Default 30: far above the slowest legitimate call (a
    /// cold 1024-row block, ~1 s), bounded so a stuck daemon is noticed.
    #[arg(long = "expertd-call-timeout", env = "SLUICE_EXPERTD_CALL_TIMEOUT", value_parser = positive_seconds)]
    pub expertd_call_timeout: Option<f64>,
    /// Seconds between health probes of the daemon (one Stats RPC each, on its own
    /// connection; `/health` reports the result); 0 disables the probe. Default 1.
    #[arg(long = "expertd-health-interval", env = "SLUICE_EXPERTD_HEALTH_INTERVAL", value_parser = seconds)]
    pub expertd_health_interval: Option<f64>,
    /// Microseconds a call-ring call polls for the daemon's answer (yielding the core to any
    /// other runnable thread, the daemon's included) before it sleeps on the futex.
    #[arg(long = "expertd-ring-spin-us", env = "SLUICE_EXPERTD_RING_SPIN_US")]
    pub expertd_ring_spin_us: Option<u64>,
}

/// A duration in seconds: finite, ≥ 0, at most a day.
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&v) {
        return Err(format!("{v} s is outside 0..=86400"));
    }
    Ok(v)
}

/// A duration in seconds, > 0 (at least 1 ms).
fn positive_seconds(s: &str) -> Result<f64, String> {
    let v = seconds(s)?;
    if v < 0.001 {
        return Err(format!("{v} s: the deadline must be at least 0.001 s"));
    }
    Ok(v)
}

/// `--keep-awake`: what the compute pool's idle threads do during a forward pass (see
/// [`crate::model::keep_awake`]).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeepAwake {
    /// `spin` with in-process experts, `yield` with expertd.
    #[default]
    Auto,
    /// Spin: the pool holds every core for the whole pass. With expertd on the same machine
    /// the daemon then competes with spinning threads for the cores.
    #[value(alias = "on")]
    Spin,
    /// Stay awake, but yield the core to any other runnable thread between checks for work.
    Yield,
    /// Never: idle compute threads sleep between parallel regions.
    Off,
}

/// Model-loading options (the flags of the subcommands that load a model).
#[derive(clap::Args, Debug, Clone)]
pub struct LoadOptions {
    /// Model directory (config.json, safetensors index and shards, tokenizer.json), or a
    /// qwen35moe GGUF file (dense weights, config and tokenizer from it; routed experts from a
    /// container prepared from it).
    #[arg(long, env = "SLUICE_MODEL")]
    pub model: PathBuf,
    /// Routed-expert backend.
    #[arg(long, value_enum, default_value_t = ExpertsKind::Bf16)]
    pub experts: ExpertsKind,
    /// Dense-weight format.
    #[arg(long, value_enum, default_value_t = DenseKind::Bf16, env = "SLUICE_DENSE")]
    pub dense: DenseKind,
    /// INT8 expert container directory (with `--experts int8`).
    #[arg(long, env = "SLUICE_CONTAINER")]
    pub container: Option<PathBuf>,
    /// Compute threads (default: every core).
    #[arg(long, env = "SLUICE_THREADS")]
    pub threads: Option<usize>,
    /// Keep the compute threads awake through each forward pass instead of letting them sleep
    /// between its parallel regions (faster on a virtual machine, where waking a sleeping
    /// thread is slow). `spin` holds every compute core for the whole pass; `yield` gives a
    /// core to any other runnable thread between checks for work. `auto`: `spin` when the
    /// experts are computed in this process, `yield` with expertd (whose threads may need the
    /// cores while hostd waits for it).
    #[arg(long, value_enum, default_value_t = KeepAwake::Auto, env = "SLUICE_KEEP_AWAKE")]
    pub keep_awake: KeepAwake,
    /// The expertd backend's flags.
    #[command(flatten)]
    pub expertd: ExpertdOptions,
    /// Bytes this process will hold beyond its dense weights (set by `hostd serve`: its prefix
    /// cache of conversation states), kept out of a private daemon's default cache budget.
    #[arg(skip)]
    pub host_extra_bytes: u64,
    /// Compute the checkpoint's digest at load ([`Model::state_identity`]; set by `hostd
    /// serve` when it keeps sequence states on disk).
    #[arg(skip)]
    pub weights_digest: bool,
}

/// Why a model did not load. Each message names the flag or file at fault; a wrapped error's
/// own text follows as its cause.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// `threads: Some(0)`.
    #[error("--threads must be at least 1")]
    Threads,
    /// The model directory itself is missing or not a directory (reported as such, not as a
    /// tokenizer problem).
    #[error(transparent)]
    ModelDir(TokenizerError),
    /// The directory's `tokenizer.json` is missing or unreadable.
    #[error("loading the tokenizer of {}", dir.display())]
    Tokenizer {
        /// The model directory.
        dir: PathBuf,
        /// What the tokenizer reported.
        source: TokenizerError,
    },
    /// The checkpoint failed validation or mapping.
    #[error("model {} failed validation", dir.display())]
    Checkpoint {
        /// The model directory.
        dir: PathBuf,
        /// What validation reported (boxed: it is the largest cause).
        source: Box<WeightsError>,
    },
    /// Opening or reading a file named by a flag (container header, token file).
    #[error("{what} {}", path.display())]
    File {
        /// What was being done (`opening`, `reading`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `--expertd-ca-file` could not be read.
    #[error("--expertd-ca-file {}", path.display())]
    CaFile {
        /// The file given.
        path: PathBuf,
        /// Why it could not be read as PEM certificates.
        source: std::io::Error,
    },
    /// `--expertd-fingerprint` is not hexadecimal.
    #[error("--expertd-fingerprint {hex:?} is not hex")]
    Fingerprint {
        /// The value given.
        hex: String,
        /// The parse error.
        source: std::num::ParseIntError,
    },
    /// A combination of flags that cannot work; the message says which and why.
    #[error("{0}")]
    Flags(String),
    /// The container's header or the model's identity.
    #[error(transparent)]
    Container(#[from] ContainerError),
    /// The BF16 experts could not be mapped.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// The INT8 container could not be opened for this checkpoint.
    #[error(transparent)]
    Int8(#[from] Int8LoadError),
    /// A private expertd did not start, or a daemon did not connect.
    #[error(transparent)]
    Expertd(#[from] ExpertClientError),
    /// The shard plan, or one shard's connection.
    #[error(transparent)]
    Shards(#[from] ShardError),
    /// The dense weights.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A [`LoadError::Flags`] with this message.
fn flags(message: impl Into<String>) -> LoadError {
    LoadError::Flags(message.into())
}

/// The model directory's tokenizer; a missing or wrong directory is reported as such (not as a
/// tokenizer problem).
pub fn load_tokenizer(model: &Path) -> Result<Tokenizer, LoadError> {
    if shared::gguf::is_gguf_path(model) {
        return Tokenizer::from_gguf(model).map_err(|source| LoadError::Tokenizer {
            dir: model.to_path_buf(),
            source,
        });
    }
    Tokenizer::from_model_dir(model).map_err(|e| match e {
        e @ TokenizerError::ModelDir { .. } => LoadError::ModelDir(e),
        source => LoadError::Tokenizer {
            dir: model.to_path_buf(),
            source,
        },
    })
}

/// The container fingerprint recorded in `dir/experts.sluice`'s header (the header only; the
/// experts themselves are read by expertd).
fn container_fingerprint(dir: &Path) -> Result<u64, LoadError> {
    let path = dir.join(shared::container::CONTAINER_FILE);
    let file = std::fs::File::open(&path).map_err(|source| LoadError::File {
        what: "opening",
        path: path.clone(),
        source,
    })?;
    let (header, _) = shared::container::read_header(&file, &path)?;
    Ok(header.fingerprint())
}

/// The `--expertd` arguments, parsed, each TCP endpoint checked against the TLS flags.
fn shard_specs(e: &ExpertdOptions) -> Result<Vec<ShardSpec>, LoadError> {
    let ca = match &e.expertd_ca_file {
        Some(p) => Some(CaCertificate::read(p).map_err(|source| LoadError::CaFile {
            path: p.clone(),
            source,
        })?),
        None => None,
    };
    let mut specs = Vec::with_capacity(e.expertd_uri.len());
    for arg in &e.expertd_uri {
        let mut spec = ShardSpec::parse(arg).map_err(|m| flags(format!("--expertd {m}")))?;
        match &spec.endpoint {
            Endpoint::Tcp { tls: true, .. } if ca.is_none() => {
                return Err(flags(format!(
                    "--expertd {arg} is TLS (https://) and needs --expertd-ca-file: the CA that signed the daemon's certificate"
                )));
            }
            Endpoint::Tcp { tls: false, .. } if !e.expertd_insecure => {
                return Err(flags(format!(
                    "--expertd {arg} is plain TCP (http://): the token and activations would cross the network unencrypted; use https:// (expertd serve --tls-cert/--tls-key) or pass --expertd-insecure on a network you trust"
                )));
            }
            _ => {}
        }
        spec.endpoint = spec.endpoint.with_ca(ca.clone());
        specs.push(spec);
    }
    Ok(specs)
}

/// The embedding table's bytes when hostd holds it in memory (converted from a GGUF) rather
/// than mapped from a checkpoint directory, which `host_weight_bytes` leaves out.
fn held_embedding_bytes(mapped: &MappedCheckpoint) -> u64 {
    match mapped.checkpoint() {
        Some(_) => 0,
        None => shared::sizes::ModelSizes::from_config(&mapped.config().text).embedding_bytes_bf16,
    }
}

/// Connects the expertd backend: one daemon, several daemons each serving its layers, or a
/// private daemon when no `--expertd` is given.
fn expertd_backend(
    args: &LoadOptions,
    mapped: &MappedCheckpoint,
    client_name: &str,
) -> Result<Arc<dyn ExpertBackend>, LoadError> {
    let e = &args.expertd;
    let cfg = &mapped.config().text;
    let identity = mapped.identity()?;
    let specs = shard_specs(e)?;
    let sharded = specs.len() > 1 || specs.first().is_some_and(|s| s.layers.is_some());
    let (endpoint, daemon) = match specs.first() {
        Some(spec) => (spec.endpoint.clone(), None),
        None => {
            let dir = args.container.as_ref().ok_or_else(|| {
                flags("--experts expertd without --expertd URI starts a private expertd and needs --container DIR (prepared if missing)")
            })?;
            let opts = PrivateOptions {
                model: args.model.clone(),
                container: dir.clone(),
                cache_bytes: e.expertd_cache_bytes,
                host_bytes: crate::plan::host_weight_bytes(cfg, args.dense.into())
                    + held_embedding_bytes(mapped)
                    + args.host_extra_bytes,
                threads: args.threads,
                extra_args: e.expertd_daemon_args.clone(),
            };
            let daemon = PrivateDaemon::start(&opts)?;
            (daemon.endpoint(), Some(daemon))
        }
    };
    let expected_fingerprint = match (&e.expertd_fingerprint, &args.container) {
        (Some(hex), _) => {
            let v = u64::from_str_radix(hex.trim_start_matches("0x"), 16).map_err(|source| {
                LoadError::Fingerprint {
                    hex: hex.clone(),
                    source,
                }
            })?;
            Some((v, "from --expertd-fingerprint".to_string()))
        }
        (None, Some(dir)) => Some((
            container_fingerprint(dir)?,
            format!(
                "the header of {}",
                dir.join(shared::container::CONTAINER_FILE).display()
            ),
        )),
        (None, None) => None,
    };
    let token = match &e.expertd_token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|source| LoadError::File {
                    what: "reading",
                    path: p.clone(),
                    source,
                })?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    if let Some(tcp) = specs
        .iter()
        .find(|s| matches!(s.endpoint, Endpoint::Tcp { .. }))
        && token.is_none()
    {
        return Err(flags(format!(
            "--expertd {} is TCP and needs --expertd-token-file",
            tcp.endpoint
        )));
    }
    let mut opts = ClientOptions::new(endpoint, cfg.num_layers, cfg.num_experts, cfg.hidden_size);
    opts.token = token;
    opts.client_name = client_name.to_string();
    opts.model_identity = Some(identity);
    opts.expected_fingerprint = expected_fingerprint;
    opts.shm = !e.expertd_no_shm;
    opts.ring = !e.expertd_no_ring;
    opts.prefetch = e.expertd_prefetch;
    opts.ring_top_k = cfg.experts_per_token;
    if daemon.is_some() {
        // The first connection may wait for a container still being opened; a reconnection
        // waits for the supervisor's restart, within the call's deadline.
        opts.connect_timeout = Duration::from_secs(60);
        opts.reconnect_timeout = Duration::from_secs(60);
    }
    if let Some(t) = e.expertd_call_timeout {
        opts.call_timeout = Duration::from_secs_f64(t);
    }
    if let Some(us) = e.expertd_ring_spin_us {
        opts.ring_spin = Duration::from_micros(us);
    }
    if let Some(every) = e.expertd_health_interval {
        opts.health_interval = (every > 0.0).then(|| Duration::from_secs_f64(every));
    }
    if sharded {
        return Ok(Arc::new(ShardedExperts::connect(&opts, specs)?));
    }
    Ok(Arc::new(ExpertdClient::connect(opts, daemon)?))
}

/// Validates and maps the checkpoint, connects the expert backend and builds the model, with
/// the global rayon pool as the caller left it. `client_name` is how an expertd names this
/// client in its logs and stats (the CLI: `hostd SUBCOMMAND`).
pub fn load_model(args: &LoadOptions, client_name: &str) -> Result<Model, LoadError> {
    if args.threads == Some(0) {
        return Err(LoadError::Threads);
    }
    if args.dense == DenseKind::Gguf && !shared::gguf::is_gguf_path(&args.model) {
        return Err(flags(format!(
            "--dense gguf keeps a GGUF's k-quant projections as they are; {} is not a GGUF file (use --dense int8 or bf16)",
            args.model.display()
        )));
    }
    let selection = Isa::selection();
    if let Some(warning) = selection.warning() {
        tracing::warn!("{warning}");
    }
    let isa = selection.active;
    tracing::info!(
        isa = isa.name(),
        threads = rayon::current_num_threads(),
        "kernels"
    );
    let mapped = MappedCheckpoint::open(&args.model).map_err(|source| LoadError::Checkpoint {
        dir: args.model.clone(),
        source: Box::new(source),
    })?;
    let kind = match (args.experts, args.expertd.expertd_uri.is_empty()) {
        (ExpertsKind::Int8, false) => {
            return Err(flags(
                "--expertd URI selects the expertd backend; it conflicts with --experts int8",
            ));
        }
        (_, false) => ExpertsKind::Expertd,
        (k, true) => k,
    };
    let experts: Arc<dyn ExpertBackend> = match kind {
        ExpertsKind::Bf16 => Arc::new(Bf16Experts::new(&mapped, isa)?),
        ExpertsKind::Int8 => {
            let dir = args.container.as_ref().ok_or_else(|| flags("--experts int8 needs --container DIR (make one with `expertd prepare MODEL --out DIR`)"))?;
            let selection = Int8Isa::selection();
            if let Some(warning) = selection.warning() {
                tracing::warn!("{warning}");
            }
            tracing::info!(isa = selection.active.name(), container = %dir.display(), "container experts");
            Arc::new(Int8Experts::open(dir, &mapped, selection.active)?)
        }
        ExpertsKind::Expertd => expertd_backend(args, &mapped, client_name)?,
    };
    let dense: DenseFormat = args.dense.into();
    let t = std::time::Instant::now();
    // A bar on a terminal only: logs and pipes get the "model loaded" line as before.
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(mapped.config().text.num_layers as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "loading layers {bar:40} {pos}/{len} {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let loaded = Model::load_with_progress(&mapped, experts, isa, dense, &mut |_| bar.inc(1));
    bar.finish_and_clear();
    let mut model = loaded?;
    if args.weights_digest {
        model.set_weights_digest(mapped.digest()?);
    }
    match args.keep_awake {
        KeepAwake::Auto => {}
        KeepAwake::Spin => model.set_keep_awake(Awake::Spin),
        KeepAwake::Yield => model.set_keep_awake(Awake::Yield),
        KeepAwake::Off => model.set_keep_awake(Awake::Off),
    }
    tracing::info!(
        dense = dense.name(),
        load_s = t.elapsed().as_secs_f64(),
        "dense weights loaded"
    );
    Ok(model)
}
