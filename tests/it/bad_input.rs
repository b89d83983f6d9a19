//! Each way a model directory can be broken gives its own clear error naming the field or
//! tensor and the file (issue: model directory reader, bad input).

use safetensors::Dtype;
use shared::checkpoint::{Checkpoint, CheckpointError};
use shared::config::ConfigError;
use shared::safetensors_header::HeaderError;
use std::path::Path;
use tests::{copy_model, edit_tensor, hostd, model_dir, read_index};

const Q_NORM: &str = "model.language_model.layers.1.self_attn.q_norm.weight";
const A_LOG: &str = "model.language_model.layers.0.linear_attn.A_log";

/// Opens a copy of the tiny fixture after `breakage`, expecting an error.
fn broken(breakage: impl FnOnce(&Path)) -> (tempfile::TempDir, CheckpointError) {
    let dir = copy_model(&model_dir("tiny"));
    breakage(dir.path());
    let err = Checkpoint::open(dir.path()).expect_err("broken checkpoint must be rejected");
    (dir, err)
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
    edit(&mut v);
    std::fs::write(&path, v.to_string()).expect("write config");
}

fn shard_of(dir: &Path, tensor: &str) -> std::path::PathBuf {
    dir.join(&read_index(dir)[tensor])
}

#[test]
fn pristine_copy_opens() {
    let dir = copy_model(&model_dir("tiny"));
    Checkpoint::open(dir.path()).expect("unmodified copy opens");
}

#[test]
fn unsupported_model_type() {
    let (dir, err) = broken(|d| edit_config(d, |v| v["model_type"] = "qwen3_next".into()));
    match &err {
        CheckpointError::Config {
            path,
            source: ConfigError::UnsupportedModelType { field, found },
        } => {
            assert_eq!(path, &dir.path().join("config.json"));
            assert_eq!(
                (field.as_str(), found.as_str()),
                ("model_type", "qwen3_next")
            );
        }
        other => panic!("expected UnsupportedModelType, got {other:?}"),
    }
    assert!(
        err.to_string().contains("config.json") && err.to_string().contains("qwen3_next"),
        "{err}"
    );
}

#[test]
fn invalid_config_field() {
    let (_dir, err) =
        broken(|d| edit_config(d, |v| v["text_config"]["num_experts_per_tok"] = 9999.into()));
    assert!(
        matches!(&err, CheckpointError::Config { source: ConfigError::Invalid { field, .. }, .. } if field == "text_config.num_experts_per_tok"),
        "{err:?}"
    );
}

#[test]
fn missing_tensor() {
    let (dir, err) = broken(|d| drop(edit_tensor(d, Q_NORM, |_| None)));
    match &err {
        CheckpointError::MissingTensor { tensor, looked_in } => {
            assert_eq!(tensor, Q_NORM);
            assert_eq!(looked_in, &dir.path().join("model.safetensors.index.json"));
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
}

#[test]
fn missing_experts_names_both_layouts() {
    let name = "model.language_model.layers.2.mlp.experts.gate_up_proj";
    let (_dir, err) = broken(|d| drop(edit_tensor(d, name, |_| None)));
    match &err {
        CheckpointError::MissingTensor { tensor, .. } => {
            assert!(
                tensor.starts_with(name) && tensor.contains("experts.0.gate_proj.weight"),
                "{tensor}"
            );
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
}

#[test]
fn wrong_shape() {
    let mut shard = String::new();
    let (dir, err) = broken(|d| {
        shard = edit_tensor(d, Q_NORM, |mut t| {
            let n = t.shape[0];
            t.shape = vec![2, n / 2];
            Some(t)
        });
    });
    match &err {
        CheckpointError::WrongShape {
            file,
            tensor,
            expected,
            found,
        } => {
            assert_eq!(file, &dir.path().join(&shard));
            assert_eq!(tensor, Q_NORM);
            assert_eq!(expected.len(), 1);
            assert_eq!(found, &vec![2, expected[0] / 2]);
        }
        other => panic!("expected WrongShape, got {other:?}"),
    }
}

#[test]
fn wrong_dtype() {
    let (_dir, err) = broken(|d| {
        edit_tensor(d, Q_NORM, |mut t| {
            t.dtype = Dtype::F16; // same width, wrong meaning
            Some(t)
        });
    });
    assert!(
        matches!(&err, CheckpointError::WrongDtype { tensor, found: Dtype::F16, expected, .. } if tensor == Q_NORM && expected == &vec![Dtype::BF16]),
        "{err:?}"
    );
    assert!(err.to_string().contains("expected BF16"), "{err}");
}

#[test]
fn a_log_accepts_bf16_but_not_f16() {
    let dir = copy_model(&model_dir("tiny"));
    edit_tensor(dir.path(), A_LOG, |t| {
        assert_eq!(
            t.dtype,
            Dtype::F32,
            "the oracle stores A_log in F32 like the release"
        );
        let data = t.data.chunks(4).flat_map(|c| {
            let x = f32::from_le_bytes(c.try_into().expect("4 bytes"));
            half::bf16::from_f32(x).to_le_bytes()
        });
        Some(tests::OwnedTensor {
            dtype: Dtype::BF16,
            shape: t.shape.clone(),
            data: data.collect(),
        })
    });
    Checkpoint::open(dir.path()).expect("BF16 A_log is accepted");
    edit_tensor(dir.path(), A_LOG, |mut t| {
        t.dtype = Dtype::F16;
        Some(t)
    });
    let err = Checkpoint::open(dir.path()).expect_err("F16 A_log is rejected");
    assert!(
        matches!(&err, CheckpointError::WrongDtype { tensor, .. } if tensor == A_LOG),
        "{err:?}"
    );
}

#[test]
fn truncated_shard_header() {
    let (dir, err) = broken(|d| {
        let path = shard_of(d, Q_NORM);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(100).expect("truncate into the header");
    });
    match &err {
        CheckpointError::ShardHeader {
            path,
            source:
                HeaderError::Truncated {
                    file_len: 100,
                    needed,
                },
        } => {
            assert_eq!(path, &shard_of(dir.path(), Q_NORM));
            assert!(*needed > 100);
        }
        other => panic!("expected a truncated header, got {other:?}"),
    }
}

#[test]
fn corrupt_shard_header() {
    let (_dir, err) = broken(|d| {
        let path = shard_of(d, Q_NORM);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[8..16].copy_from_slice(b"#garbage"); // the JSON starts at byte 8
        std::fs::write(&path, bytes).expect("write");
    });
    assert!(
        matches!(
            &err,
            CheckpointError::ShardHeader {
                source: HeaderError::Corrupt(_),
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn absurd_header_length() {
    let (_dir, err) = broken(|d| {
        let path = shard_of(d, Q_NORM);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&path, bytes).expect("write");
    });
    assert!(
        matches!(
            &err,
            CheckpointError::ShardHeader {
                source: HeaderError::TooLarge { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn tensor_offsets_beyond_end_of_file() {
    let (_dir, err) = broken(|d| {
        let path = shard_of(d, Q_NORM);
        let len = std::fs::metadata(&path).expect("meta").len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(len - 10).expect("truncate the payload");
    });
    match &err {
        CheckpointError::ShardHeader {
            source:
                HeaderError::OutOfBounds {
                    tensor,
                    end,
                    file_len,
                    ..
                },
            ..
        } => {
            assert!(end > file_len);
            assert!(!tensor.is_empty());
        }
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
}

#[test]
fn index_points_to_missing_shard() {
    let mut gone = String::new();
    let (dir, err) = broken(|d| {
        gone = read_index(d)[Q_NORM].clone();
        std::fs::remove_file(d.join(&gone)).expect("remove shard");
    });
    match &err {
        CheckpointError::MissingShard {
            shard, path, index, ..
        } => {
            assert_eq!(shard, &gone);
            assert_eq!(path, &dir.path().join(&gone));
            assert_eq!(index, &dir.path().join("model.safetensors.index.json"));
        }
        other => panic!("expected MissingShard, got {other:?}"),
    }
}

#[test]
fn index_names_a_tensor_its_shard_lacks() {
    let (_dir, err) = broken(|d| {
        let mut index = read_index(d);
        let other = index
            .values()
            .find(|f| **f != index[Q_NORM])
            .expect("two shards")
            .clone();
        index.insert(Q_NORM.into(), other);
        tests::write_index(d, &index);
    });
    assert!(
        matches!(&err, CheckpointError::IndexMismatch { tensor, .. } if tensor == Q_NORM),
        "{err:?}"
    );
}

#[test]
fn index_cannot_escape_the_model_directory() {
    let (_dir, err) = broken(|d| {
        let mut index = read_index(d);
        index.insert(Q_NORM.into(), "../elsewhere.safetensors".into());
        tests::write_index(d, &index);
    });
    assert!(
        matches!(&err, CheckpointError::Index { reason, .. } if reason.contains("not a file name")),
        "{err:?}"
    );
}

#[test]
fn cli_reports_the_error_and_exits_nonzero() {
    let dir = copy_model(&model_dir("tiny"));
    edit_tensor(dir.path(), Q_NORM, |_| None);
    let out = hostd(&["inspect", dir.path().to_str().expect("utf-8")]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(Q_NORM) && stderr.contains("model.safetensors.index.json"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
