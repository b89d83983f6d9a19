//! The expert locator's byte ranges, read back from disk, equal the same expert sliced by the
//! `safetensors` crate — in the fused release layout and in the per-expert layout.

use shared::checkpoint::Checkpoint;
use shared::ids::{ExpertId, LayerId};
use shared::safetensors_locator::{ByteRange, ExpertLocator};
use shared::splitmix::SplitMix64;
use shared::tensor_spec::{self, ExpertLayout};
use std::os::unix::fs::FileExt;
use std::path::Path;
use tests::{copy_model, model_dir, presets, read_index, read_shard, split_experts};

fn read_range(r: &ByteRange) -> Vec<u8> {
    let f = std::fs::File::open(&r.file).expect("open shard");
    let mut buf = vec![0u8; r.len as usize];
    f.read_exact_at(&mut buf, r.offset).expect("read range");
    buf
}

/// (gate, up, down) bytes of one expert, sliced with the `safetensors` crate from the fused tensors.
fn expert_bytes_via_safetensors(dir: &Path, layer: usize, expert: usize) -> [Vec<u8>; 3] {
    let index = read_index(dir);
    let slice = |name: &str, parts: usize, part: usize| {
        let tensors = read_shard(&dir.join(&index[name]));
        let t = &tensors[name];
        let per_expert = t.data.len() / t.shape[0];
        let block = &t.data[expert * per_expert..(expert + 1) * per_expert];
        let part_len = block.len() / parts;
        block[part * part_len..(part + 1) * part_len].to_vec()
    };
    let gate_up = tensor_spec::fused_gate_up_name(tensor_spec::PREFIX_RELEASE, layer);
    let down = tensor_spec::fused_down_name(tensor_spec::PREFIX_RELEASE, layer);
    [
        slice(&gate_up, 2, 0),
        slice(&gate_up, 2, 1),
        slice(&down, 1, 0),
    ]
}

fn check_locator(ckpt: &Checkpoint, reference_dir: &Path, seed: u64) {
    let cfg = &ckpt.config.text;
    let loc = ExpertLocator::new(ckpt);
    let mut rng = SplitMix64::new(seed);
    let (f, d) = (cfg.moe_intermediate_size, cfg.hidden_size);
    let mut pairs: Vec<(usize, usize)> = (0..6)
        .map(|_| (rng.below(cfg.num_layers), rng.below(cfg.num_experts)))
        .collect();
    pairs.push((cfg.num_layers - 1, cfg.num_experts - 1));
    pairs.push((0, 0));
    for (layer, expert) in pairs {
        let r = loc
            .expert(LayerId::from_index(layer), ExpertId::from_index(expert))
            .expect("locate");
        assert_eq!(
            (r.gate.shape, r.up.shape, r.down.shape),
            ([f, d], [f, d], [d, f])
        );
        assert_eq!(r.total_bytes(), 3 * (f * d) as u64 * 2, "bf16 expert size");
        let want = expert_bytes_via_safetensors(reference_dir, layer, expert);
        assert_eq!(
            read_range(&r.gate),
            want[0],
            "layer {layer} expert {expert} gate"
        );
        assert_eq!(
            read_range(&r.up),
            want[1],
            "layer {layer} expert {expert} up"
        );
        assert_eq!(
            read_range(&r.down),
            want[2],
            "layer {layer} expert {expert} down"
        );
    }
    assert!(
        loc.expert(LayerId::from_index(cfg.num_layers), ExpertId::new(0))
            .is_err(),
        "layer out of range"
    );
    assert!(
        loc.expert(LayerId::new(0), ExpertId::from_index(cfg.num_experts))
            .is_err(),
        "expert out of range"
    );
}

#[test]
fn fused_layout_ranges_equal_safetensors_slices() {
    for (i, preset) in presets().iter().enumerate() {
        let dir = model_dir(preset);
        let ckpt = Checkpoint::open(&dir).expect("fixture opens");
        assert!(
            ckpt.expert_layouts
                .iter()
                .all(|l| *l == ExpertLayout::Fused)
        );
        check_locator(&ckpt, &dir, 17 + i as u64);
    }
}

#[test]
fn per_expert_layout_ranges_equal_the_fused_original() {
    for (i, preset) in presets().iter().enumerate() {
        let original = model_dir(preset);
        let copy = copy_model(&original);
        split_experts(copy.path());
        let ckpt = Checkpoint::open(copy.path()).expect("per-expert checkpoint opens");
        assert!(
            ckpt.expert_layouts
                .iter()
                .all(|l| *l == ExpertLayout::PerExpert),
            "{preset}"
        );
        check_locator(&ckpt, &original, 101 + i as u64);
    }
}
