//! The synthetic presets' dimensions and the JSON files written beside the weights
//! (`config.json`, `generation_config.json`, `tokenizer_config.json`), shaped like the release's.

use super::SynthError;
use serde_json::{Value, json};

/// Number of added (special) tokens after the BPE ranks (docs/model.md §7.1).
pub const N_SPECIALS: u32 = 33;
/// BPE ranks of the real Qwen3.6 vocabulary; the specials start here.
pub const REAL_RANKS: u32 = 248_044;
/// BPE ranks of the committed truncated tokenizer asset.
pub const ASSET_RANKS: u32 = 1000;
/// Most layers a preset accepts.
pub const MAX_LAYERS: usize = 512;
/// Most experts per layer `--experts` accepts (what `shared::config` accepts).
pub const MAX_EXPERTS: usize = u16::MAX as usize;

/// A synthetic model size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Preset {
    /// Test-sized: hidden 64, 8 experts top-2, vocabulary 1040 (4 layers, about 1 MB).
    Tiny,
    /// A bit bigger: hidden 128, 32 experts top-4, vocabulary 1056 (8 layers, about 16 MB).
    Small,
    /// Qwen3.6-35B-A3B's exact per-layer dimensions and vocabulary (248320); 4 layers by default.
    Realdim,
}

impl Preset {
    /// The lowercase name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Small => "small",
            Preset::Realdim => "realdim",
        }
    }

    /// The preset's dimensions.
    pub fn dims(self) -> Dims {
        match self {
            Preset::Tiny => Dims {
                hidden: 64,
                default_layers: 4,
                n_q_heads: 4,
                n_kv_heads: 2,
                head_dim: 32,
                mrope_section: [2, 1, 1],
                lin_k_heads: 2,
                lin_v_heads: 4,
                lin_k_dim: 16,
                lin_v_dim: 16,
                experts: 8,
                top_k: 2,
                moe_inter: 32,
                shared_inter: 32,
                vocab_size: 1040,
                bpe_ranks: ASSET_RANKS,
                max_position: 32_768,
            },
            Preset::Small => Dims {
                hidden: 128,
                default_layers: 8,
                n_q_heads: 8,
                n_kv_heads: 2,
                head_dim: 64,
                mrope_section: [3, 3, 2],
                lin_k_heads: 4,
                lin_v_heads: 8,
                lin_k_dim: 32,
                lin_v_dim: 32,
                experts: 32,
                top_k: 4,
                moe_inter: 64,
                shared_inter: 64,
                vocab_size: 1056,
                bpe_ranks: ASSET_RANKS,
                max_position: 32_768,
            },
            Preset::Realdim => Dims {
                hidden: 2048,
                default_layers: 4,
                n_q_heads: 16,
                n_kv_heads: 2,
                head_dim: 256,
                mrope_section: [11, 11, 10],
                lin_k_heads: 16,
                lin_v_heads: 32,
                lin_k_dim: 128,
                lin_v_dim: 128,
                experts: 256,
                top_k: 8,
                moe_inter: 512,
                shared_inter: 512,
                vocab_size: 248_320,
                bpe_ranks: REAL_RANKS,
                max_position: 262_144,
            },
        }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Dimensions of one preset (docs/model.md §2 field meanings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// `hidden_size`.
    pub hidden: usize,
    /// Layers when `--layers` is not given.
    pub default_layers: usize,
    /// `num_attention_heads`.
    pub n_q_heads: usize,
    /// `num_key_value_heads`.
    pub n_kv_heads: usize,
    /// `head_dim`.
    pub head_dim: usize,
    /// `rope_parameters.mrope_section` (sums to rotary dims / 2).
    pub mrope_section: [usize; 3],
    /// `linear_num_key_heads`.
    pub lin_k_heads: usize,
    /// `linear_num_value_heads`.
    pub lin_v_heads: usize,
    /// `linear_key_head_dim`.
    pub lin_k_dim: usize,
    /// `linear_value_head_dim`.
    pub lin_v_dim: usize,
    /// `num_experts`.
    pub experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `moe_intermediate_size`.
    pub moe_inter: usize,
    /// `shared_expert_intermediate_size`.
    pub shared_inter: usize,
    /// `vocab_size` (embedding rows, padding included).
    pub vocab_size: usize,
    /// BPE ranks of the tokenizer; the 33 specials take ids `bpe_ranks..bpe_ranks + 33`.
    pub bpe_ranks: u32,
    /// `max_position_embeddings`.
    pub max_position: usize,
}

impl Dims {
    /// Token ids the tokenizer defines (BPE ranks + specials); embedding rows past it are padding.
    pub fn defined_tokens(&self) -> usize {
        (self.bpe_ranks + N_SPECIALS) as usize
    }
    /// Id of the `k`-th special token (0 = `<|endoftext|>`, 1 = `<|im_start|>`, 2 = `<|im_end|>`).
    pub fn special_id(&self, k: u32) -> u32 {
        self.bpe_ranks + k
    }
}

/// Index of `<|endoftext|>` among the specials.
pub const ENDOFTEXT: u32 = 0;
/// Index of `<|im_start|>` among the specials.
pub const IM_START: u32 = 1;
/// Index of `<|im_end|>` among the specials.
pub const IM_END: u32 = 2;
const VISION_START: u32 = 9;
const VISION_END: u32 = 10;
const IMAGE_PAD: u32 = 12;
const VIDEO_PAD: u32 = 13;

/// The layer types: layer i is full attention iff i % 4 == 3 (the release's pattern).
pub fn layer_types(layers: usize) -> Vec<&'static str> {
    (0..layers)
        .map(|i| {
            if i % 4 == 3 {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect()
}

/// Checks a layer count: at least one full-attention layer (so at least 4), at most `MAX_LAYERS`.
pub fn check_layers(layers: usize) -> Result<(), SynthError> {
    if !(4..=MAX_LAYERS).contains(&layers) {
        return Err(SynthError::Layers {
            layers,
            max: MAX_LAYERS,
        });
    }
    Ok(())
}

/// Checks an expert count for a preset routing to `dims.top_k` experts per token: at least
/// top-k (so every token finds its k experts), at most [`MAX_EXPERTS`].
pub fn check_experts(preset: Preset, dims: &Dims, experts: usize) -> Result<(), SynthError> {
    if experts < dims.top_k || experts > MAX_EXPERTS {
        return Err(SynthError::Experts {
            experts,
            preset,
            top_k: dims.top_k,
            max: MAX_EXPERTS,
        });
    }
    Ok(())
}

/// The nested `config.json` (release structure: `text_config` plus a `vision_config` stub).
pub fn config_json(d: &Dims, layers: usize) -> Value {
    json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "hidden_size": d.hidden,
            "num_hidden_layers": layers,
            "layer_types": layer_types(layers),
            "full_attention_interval": 4,
            "num_attention_heads": d.n_q_heads,
            "num_key_value_heads": d.n_kv_heads,
            "head_dim": d.head_dim,
            "attention_bias": false,
            "attention_dropout": 0.0,
            "attn_output_gate": true,
            "partial_rotary_factor": 0.25,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000_000,
                "partial_rotary_factor": 0.25,
                "mrope_section": d.mrope_section,
                "mrope_interleaved": true,
            },
            "max_position_embeddings": d.max_position,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "linear_num_key_heads": d.lin_k_heads,
            "linear_num_value_heads": d.lin_v_heads,
            "linear_key_head_dim": d.lin_k_dim,
            "linear_value_head_dim": d.lin_v_dim,
            "linear_conv_kernel_dim": 4,
            "num_experts": d.experts,
            "num_experts_per_tok": d.top_k,
            "moe_intermediate_size": d.moe_inter,
            "shared_expert_intermediate_size": d.shared_inter,
            "router_aux_loss_coef": 0.001,
            "output_router_logits": false,
            "vocab_size": d.vocab_size,
            "tie_word_embeddings": false,
            "mamba_ssm_dtype": "float32",
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": false,
            "eos_token_id": d.special_id(ENDOFTEXT),
            "dtype": "bfloat16",
            "use_cache": true,
            "initializer_range": 0.02,
        },
        "vision_config": {
            "model_type": "qwen3_5_moe",
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_heads": 16,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": d.hidden,
            "num_position_embeddings": 2304,
            "hidden_act": "gelu_pytorch_tanh",
            "deepstack_visual_indexes": [],
        },
        "tie_word_embeddings": false,
        "image_token_id": d.special_id(IMAGE_PAD),
        "video_token_id": d.special_id(VIDEO_PAD),
        "vision_start_token_id": d.special_id(VISION_START),
        "vision_end_token_id": d.special_id(VISION_END),
    })
}

/// `generation_config.json` (family pattern, docs/model.md §2.1).
pub fn generation_config_json(d: &Dims) -> Value {
    let eot = d.special_id(ENDOFTEXT);
    json!({
        "bos_token_id": eot,
        "do_sample": true,
        "eos_token_id": [d.special_id(IM_END), eot],
        "pad_token_id": eot,
        "temperature": 1.0,
        "top_k": 20,
        "top_p": 0.95,
    })
}

/// `tokenizer_config.json`: `eos_token` `<|im_end|>`, `pad_token` `<|endoftext|>`, no BOS, and
/// every special token at its id.
pub fn tokenizer_config_json(d: &Dims, specials: &[String]) -> Value {
    let decoder: serde_json::Map<String, Value> = specials
        .iter()
        .zip(0u32..)
        .map(|(s, k)| {
            let entry = json!({
                "content": s, "lstrip": false, "normalized": false, "rstrip": false,
                "single_word": false, "special": true,
            });
            (d.special_id(k).to_string(), entry)
        })
        .collect();
    json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": null,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": d.max_position,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for p in [Preset::Tiny, Preset::Small, Preset::Realdim] {
            let d = p.dims();
            assert!(d.vocab_size >= d.defined_tokens(), "{p}");
            assert_eq!(
                d.mrope_section.iter().sum::<usize>() * 2,
                d.head_dim / 4,
                "{p}: mrope covers the rotary dims"
            );
            assert_eq!(d.n_q_heads % d.n_kv_heads, 0, "{p}");
            assert_eq!(d.lin_v_heads % d.lin_k_heads, 0, "{p}");
            assert!(d.top_k <= d.experts, "{p}");
            check_layers(d.default_layers).expect("default layer count is valid");
        }
    }

    #[test]
    fn layer_counts_need_a_full_attention_layer() {
        assert!(check_layers(3).is_err());
        assert!(check_layers(4).is_ok());
        assert!(check_layers(MAX_LAYERS + 1).is_err());
        let d = Preset::Realdim.dims();
        assert!(check_experts(Preset::Realdim, &d, 8).is_ok());
        assert!(check_experts(Preset::Realdim, &d, MAX_EXPERTS).is_ok());
        assert!(matches!(
            check_experts(Preset::Realdim, &d, 7),
            Err(SynthError::Experts {
                experts: 7,
                top_k: 8,
                ..
            })
        ));
        assert!(check_experts(Preset::Realdim, &d, MAX_EXPERTS + 1).is_err());
        assert_eq!(layer_types(8)[3], "full_attention");
        assert_eq!(layer_types(8)[4], "linear_attention");
    }
}
