//! `hostd rtt --expertd URI --container DIR [--op echo|moe] [--rows R] [--calls N]
//! [--no-ring] [--no-shm] [--json OUT]`: the per-call round trip of hostd's real expertd client
//! (the code `hostd run --expertd` uses) against a running daemon, each call timed on its own.
//!
//! `--op echo` sends the rows through the call ring and back with no expert compute: the
//! transport's fixed cost (needs the ring). `--op moe` is one real MoE call on layer 0 with
//! experts 0..top_k (a warm cache makes it compute-only), over the ring, the `MoeLayer` RPC
//! with shared memory (`--no-ring`) or inline (`--no-shm`). Warm-up calls are untimed.

use crate::expert_client::{ClientOptions, Endpoint, ExpertdClient};
use crate::experts::{ExpertBackend, MoeCall};
use anyhow::Context;
use std::path::PathBuf;
use std::time::Instant;

/// What one call does.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Rows through the ring and back, no compute (the transport alone).
    Echo,
    /// One MoE call on layer 0 (experts 0..top-k).
    Moe,
}

/// Flags of `hostd rtt`.
#[derive(clap::Args, Debug)]
pub struct RttArgs {
    /// The daemon: `unix:///PATH`, `https://HOST:PORT` (needs --ca-file) or `http://HOST:PORT`
    /// (plain TCP; needs --insecure).
    #[arg(long)]
    pub expertd: String,
    /// PEM file of the CA that signed a `https://` daemon's certificate.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Allow a plain-TCP (`http://`) daemon.
    #[arg(long)]
    pub insecure: bool,
    /// The container the daemon serves (for its dimensions).
    #[arg(long)]
    pub container: PathBuf,
    /// File holding the bearer token of a TCP daemon.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// What each call does.
    #[arg(long, value_enum, default_value = "echo")]
    pub op: Op,
    /// Rows per call.
    #[arg(long, default_value_t = 1)]
    pub rows: usize,
    /// Experts per row of a `moe` call.
    #[arg(long, default_value_t = 8)]
    pub top_k: usize,
    /// Timed calls.
    #[arg(long, default_value_t = 2000)]
    pub calls: usize,
    /// Untimed warm-up calls first.
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Use the `MoeLayer` RPC instead of the call ring.
    #[arg(long)]
    pub no_ring: bool,
    /// Send activations inline (no shared memory).
    #[arg(long)]
    pub no_shm: bool,
    /// Also write the result here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the benchmark and prints one JSON line.
pub fn run(args: &RttArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.rows >= 1 && args.calls >= 1,
        "--rows and --calls must be at least 1"
    );
    let container = shared::container::ContainerFile::open(&args.container)
        .with_context(|| format!("container {}", args.container.display()))?;
    let dims = container.header().layout.dims;
    let endpoint = Endpoint::parse(&args.expertd).map_err(|m| anyhow::anyhow!("--expertd {m}"))?;
    if let Endpoint::Tcp { tls: false, .. } = endpoint {
        anyhow::ensure!(
            args.insecure,
            "--expertd {endpoint} is plain TCP (http://); pass --insecure to measure it, or use https:// with --ca-file"
        );
    }
    let ca = match &args.ca_file {
        Some(p) => Some(
            crate::expert_client::CaCertificate::read(p)
                .with_context(|| format!("--ca-file {}", p.display()))?,
        ),
        None => None,
    };
    let endpoint = endpoint.with_ca(ca);
    let mut opts = ClientOptions::new(endpoint, dims.n_layers, dims.n_experts, dims.hidden);
    opts.client_name = "hostd rtt".into();
    opts.ring = !args.no_ring;
    opts.shm = !args.no_shm;
    opts.ring_top_k = args.top_k;
    opts.shm_max_rows = opts.shm_max_rows.max(args.rows);
    if let Some(p) = &args.token_file {
        opts.token = Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading {}", p.display()))?
                .trim()
                .to_string(),
        );
    }
    let client = ExpertdClient::connect(opts, None)?;
    let info = client.daemon_info().context("not connected")?;
    let d = dims.hidden;
    let x: Vec<f32> = (0..args.rows * d)
        .map(|i| ((i as f32) * 0.37).sin())
        .collect();
    let mut out = vec![0.0f32; x.len()];
    let top_k = args.top_k.min(dims.n_experts);
    let ids: Vec<u32> = (0..args.rows).flat_map(|_| 0..top_k as u32).collect();
    let weights = vec![1.0 / top_k as f32; ids.len()];
    let call = MoeCall {
        layer: shared::ids::LayerId::new(0),
        n_rows: args.rows,
        top_k,
        x: &x,
        ids: &ids,
        weights: &weights,
    };
    let one = |out: &mut [f32]| -> anyhow::Result<()> {
        match args.op {
            Op::Echo => client.echo(&x, out).map_err(anyhow::Error::from),
            Op::Moe => client.moe_layer(&call, out).map_err(anyhow::Error::from),
        }
    };
    for _ in 0..args.warmup {
        one(&mut out)?;
    }
    let mut us = Vec::with_capacity(args.calls);
    let t_all = Instant::now();
    for _ in 0..args.calls {
        let t = Instant::now();
        one(&mut out)?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total_s = t_all.elapsed().as_secs_f64();
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    us.sort_by(f64::total_cmp);
    let q = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
    let transport = client.transport();
    let doc = serde_json::json!({
        "what": "client wall time of one call, each timed alone (ExpertdClient::echo or ::moe_layer: copy in, submit, daemon work, wake, copy out)",
        "expertd": args.expertd,
        "transport": transport,
        "op": format!("{:?}", args.op).to_lowercase(),
        "rows": args.rows,
        "hidden": d,
        "top_k": if args.op == Op::Moe { top_k } else { 0 },
        "kernel_isa": info.kernel_isa,
        "warmup_calls": args.warmup,
        "calls": args.calls,
        "p50_us": q(0.5),
        "p90_us": q(0.9),
        "p99_us": q(0.99),
        "max_us": q(1.0),
        "mean_us": mean,
        "calls_per_s": args.calls as f64 / total_s,
    });
    println!("{doc}");
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
