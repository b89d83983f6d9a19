//! Memory arithmetic from the configuration alone: bytes per expert, routed vs dense bytes,
//! bytes touched per decoded token, KV bytes per token and DeltaNet state per sequence.
//!
//! Every figure is in bytes and says which dtype it assumes. Sizes come from `tensor_spec`'s
//! canonical dtypes (BF16, with `A_log` and the DeltaNet norm weight in F32 as the release
//! stores them), so they hold for a config without weights.

use crate::config::TextConfig;
use crate::tensor_spec::{self, PREFIX_RELEASE};

/// Bytes of one bf16 value.
pub const BF16_BYTES: u64 = 2;
/// Bytes of one f32 value.
pub const F32_BYTES: u64 = 4;

/// The size arithmetic of one model configuration, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ModelSizes {
    /// One routed expert's gate + up + down weights in BF16: `3 · f · d · 2`.
    pub expert_bytes_bf16: u64,
    /// All routed experts of all layers in BF16.
    pub routed_expert_bytes_bf16: u64,
    /// Every text tensor that is not a routed expert, as the release stores it (BF16, with
    /// `A_log` and the DeltaNet norm weight in F32); includes embeddings and `lm_head`.
    pub dense_bytes_bf16: u64,
    /// The embedding table alone (BF16).
    pub embedding_bytes_bf16: u64,
    /// Weight bytes one decoded token reads with BF16 weights: every dense tensor except the
    /// embedding table, one embedding row, and `experts_per_token` experts in every layer.
    pub decode_bytes_per_token: u64,
    /// K and V of one token across all full-attention layers, stored in BF16:
    /// `n_full · 2 · n_kv_heads · head_dim · 2`.
    pub kv_bytes_per_token: u64,
    /// Fixed per-sequence DeltaNet state: `linear_recurrent_bytes_per_sequence +
    /// linear_conv_bytes_per_sequence`.
    pub linear_state_bytes_per_sequence: u64,
    /// F32 recurrent state `n_linear · n_v_heads · key_head_dim · value_head_dim · 4`.
    pub linear_recurrent_bytes_per_sequence: u64,
    /// BF16 conv history `n_linear · conv_dim · (conv_kernel − 1) · 2`.
    pub linear_conv_bytes_per_sequence: u64,
    /// What sluice's own f32 caches hold per token (K and V in f32): 2 × `kv_bytes_per_token`.
    pub runtime_kv_bytes_per_token: u64,
    /// What sluice's own DeltaNet state holds per sequence (recurrent and conv history in f32).
    pub runtime_linear_state_bytes_per_sequence: u64,
    /// Parameters in routed experts.
    pub routed_expert_params: u64,
    /// Parameters in dense tensors.
    pub dense_params: u64,
}

impl ModelSizes {
    /// Computes every size from the configuration.
    pub fn from_config(cfg: &TextConfig) -> ModelSizes {
        let (d, f) = (cfg.hidden_size as u64, cfg.moe_intermediate_size as u64);
        let expert_params = 3 * f * d;
        let n_layers = cfg.num_layers as u64;
        let routed_expert_params = expert_params * cfg.num_experts as u64 * n_layers;
        let dense = tensor_spec::dense_tensors(cfg, PREFIX_RELEASE);
        let dense_bytes_bf16: u64 = dense
            .iter()
            .map(tensor_spec::ExpectedTensor::canonical_bytes)
            .sum();
        let dense_params: u64 = dense.iter().map(tensor_spec::ExpectedTensor::numel).sum();
        let embedding_bytes_bf16 = cfg.vocab_size as u64 * d * BF16_BYTES;
        let expert_bytes_bf16 = expert_params * BF16_BYTES;
        let decode_bytes_per_token = dense_bytes_bf16 - embedding_bytes_bf16
            + d * BF16_BYTES
            + n_layers * cfg.experts_per_token as u64 * expert_bytes_bf16;
        let at = cfg.attention;
        let kv_bytes_per_token = cfg.n_full_attention_layers() as u64
            * 2
            * at.n_kv_heads as u64
            * at.head_dim as u64
            * BF16_BYTES;
        let dn = cfg.delta_net;
        let n_linear = cfg.n_linear_attention_layers() as u64;
        let linear_recurrent_bytes_per_sequence = n_linear
            * dn.n_v_heads as u64
            * dn.key_head_dim as u64
            * dn.value_head_dim as u64
            * F32_BYTES;
        let linear_conv_bytes_per_sequence =
            n_linear * dn.conv_dim() as u64 * (dn.conv_kernel as u64 - 1) * BF16_BYTES;
        ModelSizes {
            expert_bytes_bf16,
            routed_expert_bytes_bf16: routed_expert_params * BF16_BYTES,
            dense_bytes_bf16,
            embedding_bytes_bf16,
            decode_bytes_per_token,
            kv_bytes_per_token,
            linear_state_bytes_per_sequence: linear_recurrent_bytes_per_sequence
                + linear_conv_bytes_per_sequence,
            linear_recurrent_bytes_per_sequence,
            linear_conv_bytes_per_sequence,
            runtime_kv_bytes_per_token: kv_bytes_per_token / BF16_BYTES * F32_BYTES,
            runtime_linear_state_bytes_per_sequence: linear_recurrent_bytes_per_sequence
                + linear_conv_bytes_per_sequence / BF16_BYTES * F32_BYTES,
            routed_expert_params,
            dense_params,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers docs/model.md §5–§6 derives for Qwen3.6-35B-A3B, from its config without any weights.
    #[test]
    fn real_config_matches_the_spec() {
        let json = include_str!("../../tests/fixtures/configs/qwen3.6-35b-a3b.config.json");
        let cfg = crate::config::parse_config(json).expect("real config").text;
        let s = ModelSizes::from_config(&cfg);
        assert_eq!(s.expert_bytes_bf16, 6 << 20, "6 MiB per BF16 expert");
        assert_eq!(
            s.routed_expert_bytes_bf16,
            60 << 30,
            "60 GiB of routed experts"
        );
        assert_eq!(s.routed_expert_bytes_bf16, 64_424_509_440);
        assert_eq!(s.dense_bytes_bf16, 4_896_721_536);
        assert_eq!(s.dense_params, 2_448_355_968);
        assert_eq!(
            s.routed_expert_params + s.dense_params,
            34_660_610_688,
            "text parameter count"
        );
        assert_eq!(s.kv_bytes_per_token, 20_480);
        assert_eq!(s.linear_recurrent_bytes_per_sequence, 62_914_560);
        assert_eq!(s.linear_conv_bytes_per_sequence, 1_474_560);
        assert_eq!(s.runtime_kv_bytes_per_token, 40_960);
        assert_eq!(
            s.runtime_linear_state_bytes_per_sequence,
            62_914_560 + 2 * 1_474_560
        );
        // dense minus one embedding table plus one row, plus 40 layers × 8 experts × 6 MiB.
        assert_eq!(
            s.decode_bytes_per_token,
            4_896_721_536 - 1_017_118_720 + 4096 + 320 * (6 << 20)
        );
    }
}

/// What an expert-cache budget means for a container of `container_bytes`, in words: every
/// expert resident, or streaming with a share of them cached. expertd logs it at start and
/// hostd prints it for its private daemon.
pub fn cache_budget_summary(budget_bytes: u64, container_bytes: u64) -> String {
    if budget_bytes >= container_bytes {
        format!(
            "resident: the {} cache holds the whole {} container (each expert is read from disk once)",
            human_bytes(budget_bytes),
            human_bytes(container_bytes)
        )
    } else {
        format!(
            "streaming: the {} cache holds {:.0}% of the {} container; the other experts are read from disk when routed",
            human_bytes(budget_bytes),
            100.0 * budget_bytes as f64 / container_bytes.max(1) as f64,
            human_bytes(container_bytes)
        )
    }
}

/// `bytes` in the largest binary unit that keeps a leading digit: `512 B`, `8.0 KiB`, `3.81 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            return if v < 10.0 {
                format!("{v:.2} {name}")
            } else {
                format!("{v:.1} {name}")
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod budget_tests {
    use super::cache_budget_summary;

    #[test]
    fn a_budget_says_whether_the_container_fits() {
        let s = cache_budget_summary(10 << 30, 4 << 30);
        assert!(
            s.starts_with("resident: the 10.0 GiB cache holds the whole 4.00 GiB container"),
            "{s}"
        );
        let s = cache_budget_summary(100_000, 262_144);
        assert!(
            s.starts_with("streaming: the 97.7 KiB cache holds 38% of the 256.0 KiB container"),
            "{s}"
        );
    }

    #[test]
    fn byte_counts_read_in_the_largest_unit() {
        assert_eq!(super::human_bytes(512), "512 B");
        assert_eq!(super::human_bytes(8192), "8.00 KiB");
        assert_eq!(super::human_bytes(3 << 30), "3.00 GiB");
    }
}
