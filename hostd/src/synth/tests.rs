//! Unit tests of `synth`: plans against the tensor inventory and the safetensors header parser,
//! shard rules, and the renumbered tokenizer asset.

use super::*;
use shared::safetensors_header::{LEN_PREFIX_BYTES, parse_header};
use shared::tensor_spec::{self, ExpertLayout, PREFIX_RELEASE};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A scratch directory removed on drop (hostd has no tempfile dev-dependency).
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
        all.extend(tensor_spec::expert_tensors(cfg, PREFIX_RELEASE, l, ExpertLayout::Fused));
    }
    all.into_iter().map(|t| (t.name, (t.shape, t.canonical))).collect()
}

#[test]
fn plans_hold_exactly_the_inventory() {
    for (preset, layers) in [(Preset::Tiny, None), (Preset::Small, Some(5)), (Preset::Realdim, Some(8))] {
        let p = plan(preset, layers).expect("plan");
        let got: BTreeMap<_, _> =
            p.shards.iter().flat_map(|s| &s.tensors).map(|t| (t.name.clone(), (t.shape.clone(), t.dtype))).collect();
        let n: usize = p.shards.iter().map(|s| s.tensors.len()).sum();
        assert_eq!(n, got.len(), "{preset}: no duplicates");
        assert_eq!(got, expected(&p), "{preset}");
    }
}

#[test]
fn headers_parse_and_tile_the_data() {
    let p = plan(Preset::Small, None).expect("plan");
    for s in &p.shards {
        assert_eq!(s.header.len() % 8, 0, "{}: 8-byte prefix + padded JSON", s.file_name);
        let n = u64::from_le_bytes(s.header[..8].try_into().expect("8 bytes"));
        assert_eq!(n as usize + 8, s.header.len());
        let parsed = parse_header(&s.header[8..], s.file_len()).expect("header parses");
        assert_eq!(parsed.len(), s.tensors.len());
        for ((name, loc), t) in parsed.iter().zip(&s.tensors) {
            assert_eq!(name, &t.name);
            assert_eq!(loc.offset, s.header.len() as u64 + t.data_offsets.0);
            assert_eq!(loc.offset % crate::synth::values::elem_bytes(t.dtype) as u64, 0, "{name} aligned");
            assert_eq!(loc.shape, t.shape);
        }
        assert!(LEN_PREFIX_BYTES + n <= s.file_len());
    }
}

#[test]
fn fused_pairs_are_split_and_shards_capped() {
    for preset in [Preset::Tiny, Preset::Realdim] {
        let p = plan(preset, Some(12)).expect("plan");
        assert!(p.shards.len() >= 2);
        for l in 0..12 {
            let gu = p.shard_of(&tensor_spec::fused_gate_up_name(PREFIX_RELEASE, l)).expect("gate_up");
            let dn = p.shard_of(&tensor_spec::fused_down_name(PREFIX_RELEASE, l)).expect("down");
            assert_ne!(gu, dn, "{preset} layer {l}");
        }
        for s in &p.shards {
            assert!(s.data_bytes() <= SHARD_CAP_BYTES, "{}", s.file_name);
        }
        let n = p.shards.len();
        assert_eq!(p.shards[n - 1].file_name, format!("model-{n:05}-of-{n:05}.safetensors"));
    }
}

#[test]
fn layer_count_is_checked() {
    assert!(matches!(plan(Preset::Tiny, Some(3)), Err(SynthError::Layers { layers: 3, .. })));
    assert!(matches!(plan(Preset::Tiny, Some(0)), Err(SynthError::Layers { .. })));
    assert_eq!(plan(Preset::Realdim, None).expect("plan").layers, 4);
}

#[test]
fn realdim_tokenizer_has_the_real_special_ids() {
    let dims = Preset::Realdim.dims();
    let dir = TempDir::new("tok");
    let path = dir.0.join("tokenizer.json");
    std::fs::write(&path, tokenizer::asset_for(&dims).expect("renumbered")).expect("write");
    tokenizer::verify(&path, &dims).expect("loads with the real ids");
    let tok = crate::tokenizer::Tokenizer::from_file(&path).expect("loads");
    assert_eq!(tok.encode("<|im_start|>user\nhi<|im_end|>").expect("encode")[0], 248_045);
    assert_eq!(tok.token_id("</think>"), Some(248_069));
    assert_eq!(tok.vocab_size(), 248_077);
    // The BPE part is unchanged: "hi" is rank 5834 in the full vocabulary, so it splits here.
    let ids = tok.encode("hi").expect("encode");
    assert!(ids.iter().all(|&id| id < 1000), "{ids:?}");
    // An external file must carry the specials at the real ids.
    tokenizer::read_external(&path, &dims).expect("renumbered asset passes as a real tokenizer");
    let small = dir.0.join("small.json");
    std::fs::write(&small, tokenizer::ASSET).expect("write");
    assert!(matches!(tokenizer::read_external(&small, &dims), Err(SynthError::Tokenizer(_))));
}

#[test]
fn tiny_tokenizer_is_the_asset() {
    let dims = Preset::Tiny.dims();
    assert_eq!(tokenizer::asset_for(&dims).expect("asset"), tokenizer::ASSET);
    assert_eq!(tokenizer::special_tokens().expect("specials")[2], "<|im_end|>");
}
