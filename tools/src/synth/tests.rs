//! Unit tests of `synth`: plans against the tensor inventory and the safetensors header parser,
//! shard rules, and the renumbered tokenizer asset.

use super::*;
use shared::safetensors_header::{LEN_PREFIX_BYTES, parse_header};
use shared::tensor_spec::{self, ExpertLayout, PREFIX_RELEASE};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A scratch directory removed on drop (sluice-tools has no tempfile dependency).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("sluice-synth-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn expected(p: &Plan) -> BTreeMap<String, (Vec<usize>, safetensors::Dtype)> {
    let cfg = &p.config;
    let mut all = tensor_spec::dense_tensors(cfg, PREFIX_RELEASE);
    for l in 0..cfg.num_layers {
        all.extend(tensor_spec::expert_tensors(
            cfg,
            PREFIX_RELEASE,
            l,
            ExpertLayout::Fused,
        ));
    }
    all.into_iter()
        .map(|t| (t.name, (t.shape, t.canonical)))
        .collect()
}

#[test]
fn plans_hold_exactly_the_inventory() {
    for (preset, layers) in [
        (Preset::Tiny, None),
        (Preset::Small, Some(5)),
        (Preset::Realdim, Some(8)),
    ] {
        let p = plan(preset, layers, None).expect("plan");
        let got: BTreeMap<_, _> = p
            .shards
            .iter()
            .flat_map(|s| &s.tensors)
            .map(|t| (t.name.clone(), (t.shape.clone(), t.dtype)))
            .collect();
        let n: usize = p.shards.iter().map(|s| s.tensors.len()).sum();
        assert_eq!(n, got.len(), "{preset}: no duplicates");
        assert_eq!(got, expected(&p), "{preset}");
    }
}

#[test]
fn headers_parse_and_tile_the_data() {
    let p = plan(Preset::Small, None, None).expect("plan");
    for s in &p.shards {
        assert_eq!(
            s.header.len() % 8,
            0,
            "{}: 8-byte prefix + padded JSON",
            s.file_name
        );
        let n = u64::from_le_bytes(s.header[..8].try_into().expect("8 bytes"));
        assert_eq!(n as usize + 8, s.header.len());
        let parsed = parse_header(&s.header[8..], s.file_len()).expect("header parses");
        assert_eq!(parsed.len(), s.tensors.len());
        for ((name, loc), t) in parsed.iter().zip(&s.tensors) {
            assert_eq!(name, &t.name);
            assert_eq!(loc.offset, s.header.len() as u64 + t.data_offsets.0);
            assert_eq!(
                loc.offset % values::elem_bytes(t.dtype) as u64,
                0,
                "{name} aligned"
            );
            assert_eq!(loc.shape, t.shape);
        }
        assert!(LEN_PREFIX_BYTES + n <= s.file_len());
    }
}

#[test]
fn fused_pairs_are_split_and_shards_capped() {
    for preset in [Preset::Tiny, Preset::Realdim] {
        let p = plan(preset, Some(12), None).expect("plan");
        assert!(p.shards.len() >= 2);
        for l in 0..12 {
            let gu = p
                .shard_of(&tensor_spec::fused_gate_up_name(PREFIX_RELEASE, l))
                .expect("gate_up");
            let dn = p
                .shard_of(&tensor_spec::fused_down_name(PREFIX_RELEASE, l))
                .expect("down");
            assert_ne!(gu, dn, "{preset} layer {l}");
        }
        for s in &p.shards {
            assert!(s.data_bytes() <= SHARD_CAP_BYTES, "{}", s.file_name);
        }
        let n = p.shards.len();
        assert_eq!(
            p.shards[n - 1].file_name,
            format!("model-{n:05}-of-{n:05}.safetensors")
        );
    }
}

#[test]
fn layer_count_is_checked() {
    assert!(matches!(
        plan(Preset::Tiny, Some(3), None),
        Err(SynthError::Layers { layers: 3, .. })
    ));
    assert!(matches!(
        plan(Preset::Tiny, Some(0), None),
        Err(SynthError::Layers { .. })
    ));
    assert_eq!(plan(Preset::Realdim, None, None).expect("plan").layers, 4);
}

#[test]
fn experts_option_sets_the_expert_count_and_keeps_top_k() {
    let p = plan(Preset::Small, Some(4), Some(8)).expect("plan");
    assert_eq!((p.config.num_experts, p.config.experts_per_token), (8, 4));
    assert_eq!(p.dims.experts, 8);
    assert_eq!(p.config_json["text_config"]["num_experts"], 8);
    assert_eq!(p.config_json["text_config"]["num_experts_per_tok"], 4);
    let all: BTreeMap<_, _> = p
        .shards
        .iter()
        .flat_map(|s| &s.tensors)
        .map(|t| (t.name.clone(), t.shape.clone()))
        .collect();
    assert_eq!(
        all[&tensor_spec::fused_gate_up_name(PREFIX_RELEASE, 0)],
        vec![8, 128, 128]
    );
    assert_eq!(
        all[&format!("{PREFIX_RELEASE}layers.0.mlp.gate.weight")],
        vec![8, 128]
    );
    assert_eq!(all.len(), expected(&p).len());
    // Fewer experts than top-k, or more than the config accepts: refused, naming both numbers.
    let err = plan(Preset::Realdim, Some(40), Some(7)).expect_err("7 < top-8");
    assert!(
        matches!(
            err,
            SynthError::Experts {
                experts: 7,
                top_k: 8,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("--experts 7") && msg.contains("top 8"),
        "{msg}"
    );
    assert!(plan(Preset::Tiny, None, Some(MAX_EXPERTS + 1)).is_err());
    assert_eq!(
        plan(Preset::Tiny, None, Some(2))
            .expect("top-k experts suffice")
            .config
            .num_experts,
        2
    );
}

#[test]
fn realdim_sizes_follow_the_expert_count() {
    let six_mib = 6u64 << 20;
    let mut dense = None;
    for experts in [16usize, 32, 256] {
        let p = plan(Preset::Realdim, Some(40), Some(experts)).expect("plan");
        let sizes = shared::sizes::ModelSizes::from_config(&p.config);
        assert_eq!(
            sizes.routed_expert_bytes_bf16,
            40 * experts as u64 * six_mib
        );
        assert_eq!(
            p.total_data_bytes(),
            sizes.dense_bytes_bf16 + sizes.routed_expert_bytes_bf16
        );
        // The router is the only dense tensor that depends on the expert count.
        let router_bytes = 40 * experts as u64 * 2048 * 2;
        let d = *dense.get_or_insert(sizes.dense_bytes_bf16 - router_bytes);
        assert_eq!(
            sizes.dense_bytes_bf16 - router_bytes,
            d,
            "{experts} experts"
        );
        // One 4 KiB-aligned INT8 blob per expert after a 4 KiB header and the index.
        let layout = shared::container::BlobLayout::new(2048, 512).expect("blob layout");
        let blobs = 40 * experts as u64;
        let index_end = 4096 + blobs * 24;
        let want = index_end.div_ceil(4096) * 4096 + blobs * layout.stride as u64;
        assert_eq!(
            p.int8_container_bytes().expect("container size"),
            want,
            "{experts} experts"
        );
    }
}

#[test]
fn realdim_tokenizer_has_the_real_special_ids() {
    // Loading it with the runtime tokenizer is hostd's test (`cli::synth`); here the JSON.
    let dims = Preset::Realdim.dims();
    let dir = TempDir::new("tok");
    let path = dir.0.join("tokenizer.json");
    std::fs::write(&path, tokenizer::asset_for(&dims).expect("renumbered")).expect("write");
    // An external file must carry the specials at the real ids.
    tokenizer::read_external(&path, &dims).expect("renumbered asset passes as a real tokenizer");
    let small = dir.0.join("small.json");
    std::fs::write(&small, tokenizer::ASSET).expect("write");
    assert!(matches!(
        tokenizer::read_external(&small, &dims),
        Err(SynthError::Tokenizer(_))
    ));
}

/// A runtime tokenizer that encodes every text to one id.
struct OneId(u32, usize);

impl RuntimeTokenizer for OneId {
    fn encode(&self, _text: &str) -> Result<Vec<u32>, String> {
        Ok(vec![self.0])
    }
    fn vocab_size(&self) -> usize {
        self.1
    }
}

#[test]
fn verify_uses_the_callers_tokenizer() {
    let dims = Preset::Tiny.dims();
    let failing: LoadTokenizer = |_| Err("no such tokenizer".to_string());
    let err =
        tokenizer::verify(std::path::Path::new("t.json"), &dims, failing).expect_err("load fails");
    assert_eq!(err.to_string(), "tokenizer: no such tokenizer");
    let wrong: LoadTokenizer = |_| Ok(Box::new(OneId(7, 10)));
    let err =
        tokenizer::verify(std::path::Path::new("t.json"), &dims, wrong).expect_err("wrong ids");
    assert!(
        err.to_string()
            .contains("<|im_start|> encodes to [7], expected [1001]"),
        "{err}"
    );
}

#[test]
fn tiny_tokenizer_is_the_asset() {
    let dims = Preset::Tiny.dims();
    assert_eq!(
        tokenizer::asset_for(&dims).expect("asset"),
        tokenizer::ASSET
    );
    assert_eq!(
        tokenizer::special_tokens().expect("specials")[2],
        "<|im_end|>"
    );
}
