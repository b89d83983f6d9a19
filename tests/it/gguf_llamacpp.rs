//! A GGUF written by llama.cpp's own converter (`tests/fixtures/gguf/tiny-llamacpp-bf16.gguf`,
//! the `tiny` fixture checkpoint through `convert_hf_to_gguf.py`, made by
//! `tests/oracle/make_llamacpp_gguf.sh`): its metadata gives the same validated configuration as
//! the checkpoint's `config.json`, a bad value is refused naming its key, its experts prepare into
//! blobs byte-identical to the checkpoint's, its tokenizer rebuilt from `tokenizer.ggml.*` encodes
//! and decodes as the checkpoint's `tokenizer.json`, and `hostd inspect` reports it. Also opening files:
//! a header past the first read, split files, files that are not GGUF.

use serde_json::Value as Json;
use shared::checkpoint::read_config;
use shared::container::{CONTAINER_FILE, ContainerFile};
use shared::gguf::{GgufExperts, GgufFile, Value, is_gguf_path, model_config};
use shared::ids::{ExpertId, LayerId};
use std::path::PathBuf;
use std::process::Command;
use tests::{GgufEdit, model_dir, prepare_container, rewrite_gguf, workspace_bin};

fn fixture() -> PathBuf {
    tests::llamacpp_tiny_gguf()
}

/// The fixture with metadata `key` set to `value`.
fn with_metadata(key: &str, value: Value) -> Vec<u8> {
    rewrite_gguf(
        &fixture(),
        GgufEdit {
            set: Some((key, value)),
            ..GgufEdit::default()
        },
    )
}

#[test]
fn llamacpps_metadata_gives_the_checkpoints_configuration_and_bad_values_are_named() {
    let f = GgufFile::open(&fixture()).expect("fixture opens");
    let ours = model_config(&f.gguf).expect("config from metadata");
    let theirs = read_config(&model_dir("tiny")).expect("config.json");
    // Every field but the end-of-sequence ids: a GGUF names the tokenizer's EOS
    // (`tokenizer.ggml.eos_token_id`, here `<|im_end|>`, 402), config.json its own (400); hostd
    // adds the tokenizer's stop tokens to either.
    let eos = f
        .gguf
        .get("tokenizer.ggml.eos_token_id")
        .and_then(Value::as_u64);
    assert_eq!(ours.text.eos_token_ids, vec![eos.expect("eos id") as u32]);
    let mut ours_but_eos = ours.text.clone();
    ours_but_eos.eos_token_ids = theirs.text.eos_token_ids.clone();
    assert_eq!(ours_but_eos, theirs.text);

    for (key, value, says) in [
        (
            "qwen35moe.attention.head_count_kv",
            Value::U32(3),
            "does not divide",
        ),
        ("qwen35moe.ssm.inner_size", Value::U32(63), "not a multiple"),
        (
            "qwen35moe.attention.value_length",
            Value::U32(16),
            "value head sizes",
        ),
        (
            "qwen35moe.expert_used_count",
            Value::U32(9),
            "exceeds num_experts",
        ),
        (
            "qwen35moe.attention.layer_norm_rms_epsilon",
            Value::F32(2.0),
            "must be in (0, 1)",
        ),
    ] {
        let mut g = f.gguf.clone();
        let slot = g
            .metadata
            .iter_mut()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("fixture has {key}"));
        slot.1 = value;
        let e = model_config(&g).expect_err("refused").to_string();
        assert!(e.contains(key) && e.contains(says), "{key}: {e}");
    }
    // Derived fields are reported under the key they came from.
    let mut g = f.gguf.clone();
    for (k, v) in &mut g.metadata {
        if k == "qwen35moe.rope.dimension_count" {
            *v = Value::U32(7);
        }
    }
    let e = model_config(&g).expect_err("refused").to_string();
    assert!(e.contains("qwen35moe.rope.dimension_count"), "{e}");
    // Without per-layer flags the interval decides, and 0 is refused. (llama.cpp 0c1e570 writes
    // the interval from the top level of a nested config.json, where the tiny fixture has none,
    // so its default 4, not text_config's 2: the per-layer flags are the ones to trust.)
    let mut g = f.gguf.clone();
    g.metadata
        .retain(|(k, _)| k != "qwen35moe.attention.recurrent_layers");
    let by_interval = model_config(&g).expect("interval 4").text.layer_types;
    use shared::config::LayerType::{FullAttention as A, LinearAttention as D};
    assert_eq!(by_interval, vec![D, D, D, A]);
    for (k, v) in &mut g.metadata {
        if k == "qwen35moe.full_attention_interval" {
            *v = Value::U32(0);
        }
    }
    let e = model_config(&g).expect_err("refused").to_string();
    assert!(e.contains("qwen35moe.full_attention_interval"), "{e}");
    let mut g = f.gguf.clone();
    g.metadata.retain(|(k, _)| k != "qwen35moe.ssm.state_size");
    let e = model_config(&g).expect_err("refused").to_string();
    assert!(
        e.contains("qwen35moe.ssm.state_size") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn llamacpps_bf16_experts_prepare_into_the_checkpoints_blobs() {
    let work = tempfile::tempdir().expect("tempdir");
    let from_gguf = work.path().join("gguf");
    let o = Command::new(workspace_bin("expertd"))
        .args(["prepare"])
        .arg(fixture())
        .arg("--out")
        .arg(&from_gguf)
        .output()
        .expect("spawn");
    let log = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{log}");
    // BF16 is above 5 bits: INT8, every tensor requantized (4 layers × gate, up, down).
    assert_eq!(
        log.matches("is BF16, not the container's INT8").count(),
        12,
        "{log}"
    );
    let from_ckpt = work.path().join("ckpt");
    prepare_container(&model_dir("tiny"), &from_ckpt);

    let (a, b) = (
        ContainerFile::open(&from_gguf).expect("gguf container"),
        ContainerFile::open(&from_ckpt).expect("checkpoint container"),
    );
    assert_eq!(a.header().layout, b.header().layout);
    assert_ne!(
        a.header().identity,
        b.header().identity,
        "identities name their sources"
    );
    let (bytes_a, bytes_b) = (
        std::fs::read(from_gguf.join(CONTAINER_FILE)).expect("read"),
        std::fs::read(from_ckpt.join(CONTAINER_FILE)).expect("read"),
    );
    let first = a
        .header()
        .layout
        .blob_offset(LayerId::new(0), ExpertId::new(0))
        .expect("in range") as usize;
    assert!(
        bytes_a[first..] == bytes_b[first..],
        "llama.cpp's BF16 experts gave other blobs than the checkpoint's"
    );
    let o = Command::new(workspace_bin("expertd"))
        .args(["verify", "--deep"])
        .arg(&from_gguf)
        .arg("--model")
        .arg(fixture())
        .output()
        .expect("spawn");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

#[test]
fn hostd_inspect_reports_a_gguf() {
    let o = Command::new(workspace_bin("hostd"))
        .args(["inspect", "--json"])
        .arg(fixture())
        .output()
        .expect("spawn");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Json = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(r["num_layers"], 4);
    assert_eq!(r["vocab_size"], 448);
    assert_eq!(r["gguf"]["tensors"], 73);
    assert_eq!(r["gguf"]["tokenizer_pre"], "qwen35");
    let types = r["gguf"]["expert_types"].as_array().expect("array");
    assert_eq!(types.len(), 4);
    assert!(
        types
            .iter()
            .all(|t| t == &serde_json::json!(["BF16", "BF16", "BF16"])),
        "{r}"
    );
    let o = Command::new(workspace_bin("hostd"))
        .arg("inspect")
        .arg(fixture())
        .output()
        .expect("spawn");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("experts        layers 0-3: gate/up/down BF16/BF16/BF16"),
        "{text}"
    );
}

#[test]
fn a_header_past_the_reading_limit_is_refused_as_too_large_not_truncated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.gguf");
    std::fs::write(
        &path,
        with_metadata("general.description", Value::String("x".repeat(2 << 20))),
    )
    .expect("write");
    // The same file opens with the default limit, and is refused with a 1 MiB one.
    GgufFile::open(&path).expect("opens with the default limit");
    let err = GgufFile::open_with_header_limit(&path, 1 << 20)
        .expect_err("a 2 MiB header past a 1 MiB limit")
        .to_string();
    assert!(
        err.contains("header")
            && err.contains("larger than the 1048576 bytes")
            && !err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn opening_reads_a_header_larger_than_the_first_read_and_refuses_split_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let original = GgufFile::open(&fixture()).expect("fixture opens");
    // A 20 MiB metadata string: the header does not fit the first 16 MiB read.
    let path = dir.path().join("big.gguf");
    std::fs::write(
        &path,
        with_metadata("general.description", Value::String("x".repeat(20 << 20))),
    )
    .expect("write");
    assert!(is_gguf_path(&path));
    let f = GgufFile::open(&path).expect("opens");
    assert_eq!(f.header_bytes.len() as u64, f.gguf.data_offset);
    assert!(f.header_bytes.len() > 20 << 20);
    assert_eq!(
        model_config(&f.gguf).expect("config").text,
        model_config(&original.gguf).expect("config").text
    );
    let (x, y) = (
        GgufExperts::locate(&f.gguf).expect("locates"),
        GgufExperts::locate(&original.gguf).expect("locates"),
    );
    let read = |f: &GgufFile, x: &GgufExperts| {
        let (offset, len) = x.layers[3].up.expert_range(5);
        f.read(offset, len, "up").expect("reads")
    };
    assert_eq!(read(&f, &x), read(&original, &y));

    let path = dir.path().join("model-00001-of-00003.gguf");
    std::fs::write(&path, with_metadata("split.count", Value::U16(3))).expect("write");
    let t = GgufFile::open(&path).expect_err("refused").to_string();
    assert!(
        t.contains("split.count") && t.contains("llama-gguf-split --merge"),
        "{t}"
    );

    // Not GGUF: a directory, a file of other bytes without the extension.
    assert!(!is_gguf_path(dir.path()));
    let other = dir.path().join("config.json");
    std::fs::write(&other, b"{\"a\": 12}").expect("write");
    assert!(!is_gguf_path(&other));
    let t = GgufFile::open(&other).expect_err("refused").to_string();
    assert!(t.contains("not a GGUF file"), "{t}");
}

#[test]
fn the_tokenizer_rebuilt_from_llamacpps_metadata_encodes_and_decodes_as_the_checkpoints() {
    use hostd::tokenizer::Tokenizer;
    let ours = Tokenizer::from_gguf(fixture()).expect("tokenizer from the GGUF");
    let theirs =
        Tokenizer::from_file(model_dir("tiny").join("tokenizer.json")).expect("tokenizer.json");
    assert_eq!(ours.vocab_size(), theirs.vocab_size());
    assert_eq!(ours.special_token_ids(), theirs.special_token_ids());
    for text in [
        "Hello, world!",
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
        "  leading spaces, trailing\t\ttabs \n\n\nand newlines\r\n",
        "I'm sure they'll say it's fine; we've DONE it, you'd SEE.",
        "numbers 1234567890 and 3.14159e-10",
        "unicode: naïve café 日本語 🦀 e\u{301} Ωmega",
        "<think>\nreasoning</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "",
    ] {
        let ids = theirs.encode(text).expect("encode");
        assert_eq!(ours.encode(text).expect("encode"), ids, "{text:?}");
        assert_eq!(
            ours.decode(&ids).expect("decode"),
            theirs.decode(&ids).expect("decode")
        );
    }
    for id in 0..theirs.vocab_size() as u32 {
        assert_eq!(
            ours.decode(&[id]).ok(),
            theirs.decode(&[id]).ok(),
            "id {id}"
        );
    }
}
