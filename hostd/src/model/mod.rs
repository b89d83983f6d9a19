//! The Qwen3.5/3.6-MoE text model in Rust (docs/model.md §4): loading from a memory-mapped checkpoint,
//! per-sequence state, and the forward pass over a block of new tokens.
//!
//! A forward call takes any number of new tokens for one sequence: several tokens run as one
//! block (GEMMs, chunked DeltaNet), one token runs the decode path. State carries across calls,
//! so a prompt may be fed in one call or in pieces.

pub mod attention;
pub mod batch;
pub mod causal;
pub mod gdn;
pub mod gguf_weights;
pub mod heat;
pub use shared::keep_awake;
pub mod linear;
pub mod moe;
pub mod ops;
pub mod snapshot;
pub mod weights;

use crate::experts::{ExpertBackend, ExpertError};
use crate::profile::{self, Profiler};
use attention::{Attention, KvCache};
use gdn::{DeltaNet, DeltaNetState};
use linear::{DenseFormat, Linear};
use moe::{Moe, Routes};
use shared::config::{LayerType, TextConfig};
use shared::ids::LayerId;
use shared::kernels::Isa;
use std::sync::Arc;
use weights::{LayerTensors, MappedCheckpoint, Matrix, WeightsError};

/// Why a forward pass or a load failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Loading weights failed.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// The expert backend failed.
    #[error(transparent)]
    Experts(#[from] ExpertError),
    /// A token id is outside the embedding table.
    #[error("token id {id} at input position {index} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// Its index in the input.
        index: usize,
        /// Embedding rows.
        vocab: usize,
    },
    /// The sequence would exceed the configured context.
    #[error(
        "sequence of {needed} tokens exceeds the model's context of {max} tokens (max_position_embeddings)"
    )]
    ContextExceeded {
        /// Tokens the sequence would hold.
        needed: usize,
        /// The limit.
        max: usize,
    },
    /// A forward call with no tokens.
    #[error("empty input: at least one token is required")]
    Empty,
    /// An earlier forward call on this sequence failed midway; its state is unusable.
    #[error(
        "sequence state is unusable after an earlier failed forward call; start a new sequence"
    )]
    Poisoned,
}

/// The token mixer of one layer.
pub enum Mixer {
    /// Gated full attention.
    Attention(Attention),
    /// Gated DeltaNet.
    DeltaNet(DeltaNet),
}

/// One decoder layer.
pub struct Layer {
    input_scale: Vec<f32>,
    post_scale: Vec<f32>,
    mixer: Mixer,
    moe: Moe,
}

/// Per-layer state of one sequence.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// KV cache of a full-attention layer.
    Kv(KvCache),
    /// Conv and recurrent state of a DeltaNet layer.
    DeltaNet(DeltaNetState),
}

/// Everything one sequence carries between forward calls.
#[derive(Debug, Clone)]
pub struct SequenceState {
    layers: Vec<LayerState>,
    pos: usize,
    /// Set when a forward call failed after some layers advanced.
    poisoned: bool,
}

impl SequenceState {
    /// Tokens consumed so far (the next token's position).
    pub fn len(&self) -> usize {
        self.pos
    }
    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
    /// Bytes of KV cache and DeltaNet state held.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kv(c) => c.bytes(),
                LayerState::DeltaNet(s) => s.bytes(),
            })
            .sum()
    }
}

/// Which rows of logits a forward call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Every input position (`n × vocab`).
    All,
    /// Only the last input position (`vocab`).
    Last,
}

/// The loaded model: dense weights resident (mapped), routed experts behind a backend.
pub struct Model {
    cfg: TextConfig,
    isa: Isa,
    embed: Matrix,
    layers: Vec<Layer>,
    final_scale: Vec<f32>,
    lm_head: Linear,
    dense: DenseFormat,
    experts: Arc<dyn ExpertBackend>,
    /// Op timing for `hostd profile`; `None` (the default) costs the forward pass one branch
    /// per op.
    profiler: Option<Profiler>,
    /// What the compute pool's other threads do during a forward pass ([`keep_awake`]): spin
    /// when the experts are computed in this process, yield their cores between checks when a
    /// daemon computes them (its threads may need the cores while we wait for it).
    keep_awake: keep_awake::Awake,
    /// The checkpoint's digest, when the loader computed it.
    weights_digest: Option<[u8; 32]>,
    /// How often each layer routed to each expert (the live panel's heat map).
    heat: Arc<heat::RoutingHeat>,
}

impl Model {
    /// Loads the dense weights from a mapped checkpoint (the large projections converted to
    /// `dense`); routed experts go through `experts`.
    pub fn load(
        w: &MappedCheckpoint,
        experts: Arc<dyn ExpertBackend>,
        isa: Isa,
        dense: DenseFormat,
    ) -> Result<Model, ModelError> {
        Model::load_with_progress(w, experts, isa, dense, &mut |_| {})
    }

    /// [`Self::load`], calling `layer_done(i)` after layer `i` is loaded (a progress bar).
    pub fn load_with_progress(
        w: &MappedCheckpoint,
        experts: Arc<dyn ExpertBackend>,
        isa: Isa,
        dense: DenseFormat,
        layer_done: &mut dyn FnMut(usize),
    ) -> Result<Model, ModelError> {
        let cfg = w.config().text.clone();
        let prefix = w.prefix();
        let d = cfg.hidden_size;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, ty) in cfg.layer_types.iter().enumerate() {
            let t = LayerTensors::layer(w, i, dense);
            let mixer = match ty {
                LayerType::FullAttention => {
                    Mixer::Attention(Attention::load(&t.module("self_attn"), &cfg)?)
                }
                LayerType::LinearAttention => {
                    Mixer::DeltaNet(DeltaNet::load(&t.module("linear_attn"), &cfg)?)
                }
            };
            layers.push(Layer {
                input_scale: ops::zero_centred_scale(&t.vector("input_layernorm.weight")?),
                post_scale: ops::zero_centred_scale(&t.vector("post_attention_layernorm.weight")?),
                mixer,
                moe: Moe::load(&t.module("mlp"), &cfg)?,
            });
            layer_done(i);
        }
        let embed = w.matrix(&format!("{prefix}embed_tokens.weight"), cfg.vocab_size, d)?;
        embed.advise_random_rows();
        let (layers_n, experts_n) = (layers.len(), cfg.num_experts);
        Ok(Model {
            embed,
            final_scale: ops::zero_centred_scale(&w.vector_f32(&format!("{prefix}norm.weight"))?),
            lm_head: w.linear(shared::tensor_spec::LM_HEAD, cfg.vocab_size, d, dense)?,
            dense,
            layers,
            cfg,
            isa,
            keep_awake: if experts.transport().is_none() {
                keep_awake::Awake::Spin
            } else {
                keep_awake::Awake::Yield
            },
            experts,
            profiler: None,
            weights_digest: None,
            heat: Arc::new(heat::RoutingHeat::new(layers_n, experts_n)),
        })
    }

    /// Records the checkpoint's digest ([`MappedCheckpoint::digest`]) for
    /// [`Self::state_identity`].
    pub fn set_weights_digest(&mut self, digest: [u8; 32]) {
        self.weights_digest = Some(digest);
    }

    /// What a sequence state's numbers depend on besides its tokens: the checkpoint's digest,
    /// the dense format, the expert backend's results (its container, or BF16 in process),
    /// the kernel ISA and this build's version. A state saved under another identity is never
    /// resumed. `None` without a digest or when the backend cannot say what computes its
    /// results (a daemon not connected).
    pub fn state_identity(&self) -> Option<[u8; 32]> {
        use sha2::{Digest, Sha256};
        let experts = self.experts.results_identity()?;
        let mut h = Sha256::new();
        for part in [
            "sluice sequence state v1",
            env!("CARGO_PKG_VERSION"),
            self.isa.name(),
            self.dense.name(),
            &experts,
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.update(self.weights_digest?);
        Some(h.finalize().into())
    }

    /// What forward passes do with the compute pool's idle threads ([`keep_awake`]); the
    /// default spins with in-process experts and yields with a daemon.
    pub fn set_keep_awake(&mut self, awake: keep_awake::Awake) {
        self.keep_awake = awake;
    }

    /// Starts recording this model's forward passes into `profiler` (`Some`), or stops
    /// (`None`); returns the profiler it held.
    pub fn set_profiler(&mut self, profiler: Option<Profiler>) -> Option<Profiler> {
        std::mem::replace(&mut self.profiler, profiler)
    }

    /// The profiler recording this model's forward passes, if any.
    pub fn profiler(&self) -> Option<&Profiler> {
        self.profiler.as_ref()
    }

    /// The text configuration.
    pub fn config(&self) -> &TextConfig {
        &self.cfg
    }

    /// The kernel ISA in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The format of the large dense projections.
    pub fn dense_format(&self) -> DenseFormat {
        self.dense
    }

    /// The expert backend's name.
    pub fn experts_name(&self) -> &'static str {
        self.experts.name()
    }

    /// The expert backend (shared), e.g. for its readiness in `/health`.
    pub fn experts_backend(&self) -> Arc<dyn ExpertBackend> {
        Arc::clone(&self.experts)
    }

    /// Hints the expert backend with the experts layer `i + 1` will probably use: that
    /// layer's router applied to its post-attention norm of `h`, the residual after layer
    /// `i`'s mixer, before layer `i`'s MoE call — early, so the hint can ride with that call
    /// and its reads follow the call's own on the disk with no gap (the residual after the MoE
    /// would predict from one more term, but only once the call is over). Only for
    /// decode-sized blocks (a prefill block's union covers most experts anyway) and only when
    /// the backend takes hints.
    pub(crate) fn prefetch_next(&self, i: usize, h: &[f32], n: usize) {
        const MAX_ROWS: usize = 8;
        let Some(next) = self.layers.get(i + 1) else {
            return;
        };
        if n > MAX_ROWS || !self.experts.wants_prefetch() {
            return;
        }
        let prof = self.profiler();
        let _scope = profile::scope(prof, "moe.prefetch_router", 0);
        let mut b = h.to_vec();
        ops::rms_norm_rows(&mut b, &next.post_scale, self.cfg.rms_norm_eps as f32);
        let routes = next.moe.route(self.isa, &b, n);
        // Most probable first (each row's experts are in descending probability; rank by rank
        // across rows), each once: the daemon reads them in this order and drops the rest once
        // the layer's own call has started.
        let k = routes.top_k;
        let mut ids = Vec::with_capacity(routes.ids.len());
        for rank in 0..k {
            for row in 0..n {
                let e = routes.ids[row * k + rank];
                if !ids.contains(&e) {
                    ids.push(e);
                }
            }
        }
        self.experts
            .prefetch(LayerId::from_index(i + 1), &ids, prof);
    }

    /// Routing counts per layer and expert since load (shared; the live panel reads them).
    pub fn routing_heat(&self) -> Arc<heat::RoutingHeat> {
        Arc::clone(&self.heat)
    }

    /// The expert backend's speculative-read counters, when it has them.
    pub fn speculative_counters(&self) -> Option<crate::experts::SpeculativeCounters> {
        self.experts.speculative_counters()
    }

    /// Bytes the expert backend streams per expert, if known.
    pub fn expert_bytes(&self) -> Option<usize> {
        self.experts.expert_bytes()
    }

    /// How the expert backend reaches its experts (`ring`, `rpc+shm`, … for expertd).
    pub fn experts_transport(&self) -> Option<String> {
        self.experts.transport()
    }

    /// A fresh sequence state (empty caches, zero DeltaNet state).
    pub fn new_state(&self) -> SequenceState {
        let layers = self
            .cfg
            .layer_types
            .iter()
            .map(|t| match t {
                LayerType::FullAttention => LayerState::Kv(KvCache::default()),
                LayerType::LinearAttention => {
                    LayerState::DeltaNet(DeltaNetState::new(&self.cfg.delta_net))
                }
            })
            .collect();
        SequenceState {
            layers,
            pos: 0,
            poisoned: false,
        }
    }

    /// Runs `tokens` (one block) through the model, advancing `state`. Returns the requested
    /// logits; when `routes` is given, appends each layer's routing (indexed by layer).
    pub fn forward(
        &self,
        state: &mut SequenceState,
        tokens: &[u32],
        want: Logits,
        routes: Option<&mut Vec<Routes>>,
    ) -> Result<Vec<f32>, ModelError> {
        keep_awake::run(self.keep_awake, || {
            self.forward_pass(state, tokens, want, routes)
        })
    }

    /// [`forward`](Self::forward) on whichever thread runs it.
    fn forward_pass(
        &self,
        state: &mut SequenceState,
        tokens: &[u32],
        want: Logits,
        mut routes: Option<&mut Vec<Routes>>,
    ) -> Result<Vec<f32>, ModelError> {
        let n = tokens.len();
        if state.poisoned {
            return Err(ModelError::Poisoned);
        }
        if n == 0 {
            return Err(ModelError::Empty);
        }
        let (d, vocab) = (self.cfg.hidden_size, self.cfg.vocab_size);
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= vocab)
        {
            return Err(ModelError::TokenOutOfRange { id, index, vocab });
        }
        let needed = state.pos + n;
        if needed > self.cfg.max_position_embeddings {
            return Err(ModelError::ContextExceeded {
                needed,
                max: self.cfg.max_position_embeddings,
            });
        }
        let eps = self.cfg.rms_norm_eps as f32;
        let prof = self.profiler();
        let scope = profile::scope(prof, "embed", n * d * 2);
        let mut h = Vec::with_capacity(n * d);
        for &id in tokens {
            h.extend(self.embed.row(id as usize).iter().map(|v| v.to_f32()));
        }
        drop(scope);
        // Layers advance their state in place; if a later layer fails, the state is marked
        // poisoned rather than copied up front (a copy would cost ~60 MiB per token at real size).
        state.poisoned = true;
        for (i, (layer, ls)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
            let _layer_scope = profile::scope(
                prof,
                match layer.mixer {
                    Mixer::Attention(_) => "layer.attention",
                    Mixer::DeltaNet(_) => "layer.deltanet",
                },
                0,
            );
            let mut a = h.clone();
            ops::rms_norm_rows(&mut a, &layer.input_scale, eps);
            let mixed = match (&layer.mixer, ls) {
                (Mixer::Attention(att), LayerState::Kv(cache)) => {
                    att.forward(self.isa, &a, n, cache, prof)
                }
                (Mixer::DeltaNet(dn), LayerState::DeltaNet(s)) => {
                    dn.forward(self.isa, &a, n, s, prof)
                }
                _ => unreachable!(
                    "layer {i}: state kind always matches the mixer (built by new_state)"
                ),
            };
            for (hv, mv) in h.iter_mut().zip(&mixed) {
                *hv += mv;
            }
            let mut b = h.clone();
            ops::rms_norm_rows(&mut b, &layer.post_scale, eps);
            self.prefetch_next(i, &h, n);
            let (moe_out, r) = layer
                .moe
                .forward(self.isa, self.experts.as_ref(), &b, n, prof)?;
            self.heat.record(i, &r.ids);
            for (hv, mv) in h.iter_mut().zip(&moe_out) {
                *hv += mv;
            }
            if let Some(out) = routes.as_deref_mut() {
                out.push(r);
            }
        }
        state.poisoned = false;
        state.pos += n;

        let rows: &mut [f32] = match want {
            Logits::All => &mut h,
            Logits::Last => &mut h[(n - 1) * d..],
        };
        let _scope = profile::scope(prof, "lm_head", self.lm_head.bytes());
        ops::rms_norm_rows(rows, &self.final_scale, eps);
        let m = rows.len() / d;
        Ok(linear::project_new(self.isa, &self.lm_head, rows, m))
    }
}

/// A model from `tests/fixtures/models/{preset}` with BF16 experts in process, for unit tests.
#[cfg(test)]
pub(crate) fn fixture_model(preset: &str, dense: DenseFormat) -> Model {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(preset);
    let mapped = MappedCheckpoint::open(&dir).expect("fixture opens");
    let isa = Isa::selection().active;
    let experts = Arc::new(crate::experts::bf16::Bf16Experts::new(&mapped, isa).expect("experts"));
    Model::load(&mapped, experts, isa, dense).expect("model loads")
}
