//! `shared::gguf`: the input is a whole GGUF file. Contract for an accepted file: keys and
//! tensor names unique, names at most 63 bytes, every tensor's bytes inside the file, aligned
//! from the data section's start, apart from every other tensor's and exactly its dimensions'
//! size in its type; and our writer, given what was read, writes a file that reads back the
//! same. For a file that [`GgufExperts::locate`] accepts: every expert's range lies inside
//! its tensor, and the experts tile the tensor exactly. For a file whose metadata makes a model
//! config that [`GgufDense::locate`] accepts: every dense tensor reads back row by row without a
//! panic, each transformers row exactly once (or is refused with an error).

use crate::{Outcome, class};
use shared::gguf::{GgufDense, GgufExperts, GgufWriter, MAX_NAME_BYTES, WriteTensor, parse};

/// Parses `data` as a GGUF file of `data.len()` bytes and checks what it returns.
pub fn run(data: &[u8]) -> Outcome {
    let file_len = data.len() as u64;
    let g = match parse(data, file_len) {
        Ok(g) => g,
        // The variant alone: its fields hold the file's own key and tensor names, which would
        // make every random name a new outcome.
        Err(e) => {
            let text = format!("{e:?}");
            let kind = text.split(['(', ' ', '{']).next().unwrap_or("");
            return class("parse", &kind);
        }
    };
    let mut spans = Vec::new();
    for (i, t) in g.tensors.iter().enumerate() {
        assert!(t.name.len() <= MAX_NAME_BYTES, "name {:?}", t.name);
        assert!(
            g.tensors[..i].iter().all(|o| o.name != t.name),
            "duplicate {:?}",
            t.name
        );
        let end = t.offset.checked_add(t.len).expect("end overflows");
        assert!(
            t.offset >= g.data_offset && end <= file_len,
            "{t:?} outside the file"
        );
        assert_eq!(
            (t.offset - g.data_offset) % g.alignment,
            0,
            "{t:?} misaligned"
        );
        let inner = t.dims.first().copied().unwrap_or(1);
        let elements = t
            .dims
            .iter()
            .try_fold(1u128, |a, &d| a.checked_mul(u128::from(d)));
        assert_eq!(inner % t.ty.block, 0, "{t:?}");
        assert_eq!(
            elements.map(|e| e / u128::from(t.ty.block) * u128::from(t.ty.block_bytes)),
            Some(u128::from(t.len)),
            "{t:?} size"
        );
        spans.push((t.offset, end));
    }
    spans.sort_unstable();
    assert!(
        spans.windows(2).all(|w| w[0].1 <= w[1].0),
        "tensors overlap"
    );
    for (i, (k, _)) in g.metadata.iter().enumerate() {
        assert!(
            g.metadata[..i].iter().all(|(o, _)| o != k),
            "duplicate key {k:?}"
        );
    }
    let experts = match GgufExperts::locate(&g) {
        Ok(x) => {
            // Every view's experts lie inside its tensor, and the views of one tensor (two for
            // a fused gate/up) cover exactly its bytes.
            let mut covered = std::collections::HashMap::<&str, u64>::new();
            for t in x.tensors() {
                let info = g.tensor(&t.name).expect("located tensors exist");
                for e in [0, x.n_experts - 1] {
                    let (at, len) = t.expert_range(e);
                    assert!(
                        at >= info.offset && at + len <= info.offset + info.len,
                        "{t:?} expert {e}"
                    );
                }
                *covered.entry(&t.name).or_default() += t.expert_bytes * x.n_experts as u64;
            }
            for (name, bytes) in covered {
                assert_eq!(Some(bytes), g.tensor(name).map(|t| t.len), "{name}");
            }
            // Within one expert, gate's and up's bytes are apart (a fused tensor's halves).
            for l in &x.layers {
                for e in [0, x.n_experts - 1] {
                    let (g0, gl) = l.gate.expert_range(e);
                    let (u0, ul) = l.up.expert_range(e);
                    assert!(g0 + gl <= u0 || u0 + ul <= g0, "gate and up overlap: {l:?}");
                }
            }
            "experts"
        }
        Err(_) => "no-experts",
    };
    if let Ok(cfg) = shared::gguf::model_config(&g)
        && let Ok(dense) = GgufDense::locate(&g, &cfg.text, shared::tensor_spec::PREFIX_RELEASE)
    {
        for (name, t) in dense.iter() {
            let info = t.gguf();
            let bytes = &data[info.offset as usize..(info.offset + info.len) as usize];
            let mut seen = vec![false; t.rows()];
            if t.for_each_row(bytes, |r, v| {
                assert_eq!(v.len(), t.cols(), "{name}");
                assert!(
                    !std::mem::replace(&mut seen[r], true),
                    "{name}: row {r} twice"
                );
            })
            .is_ok()
            {
                assert!(seen.iter().all(|&s| s), "{name}: a row never came");
            }
        }
    }
    // Our writer, given what was read, writes a file that reads back the same: written again,
    // it gives the same bytes (so NaN payloads count too), and its tensors hold the same data.
    // (Not for files whose rewrite would be large: tensors past 64 MiB, or an alignment that
    // pads past it.)
    let total: u64 = g.tensors.iter().map(|t| t.len).sum();
    if total > 64 << 20 || g.alignment > 1 << 16 {
        return "ok:large".into();
    }
    let bytes = rewrite(&g, data);
    let again = parse(&bytes, bytes.len() as u64).expect("what was written reads");
    assert_eq!(
        rewrite(&again, &bytes),
        bytes,
        "written twice, the bytes differ"
    );
    for (a, b) in again.tensors.iter().zip(&g.tensors) {
        assert_eq!(
            (&a.name, &a.dims, a.ty, a.len),
            (&b.name, &b.dims, b.ty, b.len)
        );
        assert_eq!(
            bytes[a.offset as usize..(a.offset + a.len) as usize],
            data[b.offset as usize..(b.offset + b.len) as usize]
        );
    }
    format!(
        "ok:{}:{}:{experts}",
        g.metadata.len().min(4),
        g.tensors.len().min(4)
    )
}

/// `g` (read from `data`) written by our writer.
fn rewrite(g: &shared::gguf::Gguf, data: &[u8]) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        w = w.kv(k, v.clone());
    }
    let tensors: Vec<WriteTensor<'_>> = g
        .tensors
        .iter()
        .map(|t| WriteTensor {
            name: &t.name,
            dims: &t.dims,
            ty: t.ty,
            data: &data[t.offset as usize..(t.offset + t.len) as usize],
        })
        .collect();
    w.to_bytes(&tensors).expect("what was read writes")
}
