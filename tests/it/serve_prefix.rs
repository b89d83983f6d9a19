//! The prefix cache through `hostd serve`: a second conversation with the same system prompt
//! resumes after it, an edited history resumes from the last checkpoint before the edit, a
//! conversation's turns resume from the previous turn's, and every resumed request's greedy
//! tokens and log-probabilities equal, bit for bit, those of a fresh server that prefilled the
//! whole prompt (issue 39). With `--prefix-cache-dir`, a restarted server resumes from the
//! saved states, and corrupt states or states of another model, dense format or expert
//! container are refused while the request is answered in full.

use crate::serve::Server;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tests::{model_dir, prepare_container_as, wait_for};

/// Tokens of `text` as the server tokenises a raw completion prompt.
fn token_count(s: &Server, text: &str) -> u64 {
    let r = s.post(
        "/v1/completions",
        &json!({ "model": s.name, "prompt": text, "max_tokens": 1 }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens")
}

/// A greedy chat reply: its tokens with their log-probabilities, and its usage.
fn greedy(s: &Server, messages: &Value) -> (Value, Value) {
    let reply = s.chat(
        json!({ "model": s.name, "messages": messages, "max_tokens": 6,
                               "temperature": 0, "ignore_eos": true, "logprobs": true }),
    );
    (
        reply["choices"][0]["logprobs"]["content"].clone(),
        reply["usage"].clone(),
    )
}

fn cached(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

const SYSTEM: &str = "You are a careful assistant. Use the tools when they help. ";

#[test]
fn a_second_conversation_resumes_after_the_shared_system_prompt_bit_for_bit() {
    let s = Server::start("small", &[]);
    let system = SYSTEM.repeat(12);
    let conv = |question: &str| json!([{ "role": "system", "content": system }, { "role": "user", "content": question }]);
    let (_, first) = greedy(&s, &conv("Where is the lighthouse?"));
    assert_eq!(cached(&first), 0);
    let (warm, second) = greedy(&s, &conv("Which way does the wind blow today?"));
    // The template trims message content.
    let system_tokens = token_count(
        &s,
        &format!("<|im_start|>system\n{}<|im_end|>\n", system.trim()),
    );
    assert_eq!(
        cached(&second),
        system_tokens,
        "the second conversation resumes exactly at the end of the system message"
    );
    let fresh = Server::start("small", &[]);
    let (cold, cold_usage) = greedy(&fresh, &conv("Which way does the wind blow today?"));
    assert_eq!(cached(&cold_usage), 0);
    assert_eq!(warm, cold, "resumed and full prefill differ");
}

#[test]
fn an_edited_history_resumes_from_the_last_checkpoint_before_the_edit() {
    let flags = ["--prefill-chunk", "16", "--prefix-checkpoint-every", "32"];
    let s = Server::start("small", &flags);
    let story = "The keeper climbed the stairs and lit the lamp again. ".repeat(8);
    let conv = |story: &str| json!([{ "role": "user", "content": story }]);
    greedy(&s, &conv(&story));
    // Change one word near the end of the message.
    let at = story.len() - 40;
    let edited = format!("{}candle{}", &story[..at], &story[at + 4..]);
    let (warm, usage) = greedy(&s, &conv(&edited));
    let before_edit = token_count(&s, &format!("<|im_start|>user\n{}", &story[..at]));
    let got = cached(&usage);
    assert!(
        got + 32 > before_edit && got <= before_edit && got.is_multiple_of(32),
        "edit after token ~{before_edit}: resumed at {got}, not the last multiple of 32 before it"
    );
    eprintln!(
        "edited history: {} prompt tokens, resumed at {got}, re-prefilled {}",
        usage["prompt_tokens"],
        usage["prompt_tokens"].as_u64().unwrap_or(0) - got
    );
    let fresh = Server::start("small", &flags);
    let (cold, _) = greedy(&fresh, &conv(&edited));
    assert_eq!(warm, cold, "resumed and full prefill differ");
}

#[test]
fn each_turn_resumes_from_the_previous_turn_bit_for_bit() {
    let s = Server::start("small", &[]);
    let mut messages = vec![
        json!({ "role": "system", "content": SYSTEM.repeat(4) }),
        json!({ "role": "user", "content": "Name three tools." }),
    ];
    let mut last_prompt = 0;
    for turn in 0..3 {
        let reply = s.chat(
            json!({ "model": s.name, "messages": messages, "max_tokens": 5,
                                   "temperature": 0, "ignore_eos": true, "logprobs": true }),
        );
        let usage = &reply["usage"];
        let got = cached(usage);
        if turn > 0 {
            // The previous prompt ended `<|im_start|>assistant\n<think>\n`; the state kept at
            // its assistant header serves this turn.
            assert!(
                got + 8 >= last_prompt && got < last_prompt,
                "turn {turn}: resumed at {got}, previous prompt {last_prompt} tokens"
            );
            let fresh = Server::start("small", &[]);
            let cold = fresh.chat(
                json!({ "model": s.name, "messages": messages, "max_tokens": 5,
                                          "temperature": 0, "ignore_eos": true, "logprobs": true }),
            );
            assert_eq!(
                reply["choices"][0]["logprobs"], cold["choices"][0]["logprobs"],
                "turn {turn}: resumed and full prefill differ"
            );
        }
        last_prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
        let msg = &reply["choices"][0]["message"];
        messages.push(json!({ "role": "assistant", "content": msg["content"] }));
        messages.push(json!({ "role": "user", "content": format!("And tool {turn}?") }));
    }
}

/// The state files in `dir`.
fn state_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "state"))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs one conversation on a server saving to `dir` with `flags`, and waits until the two
/// states a restart resumes from (the system message's end, the assistant header) are saved.
fn save_states(preset: &str, dir: &Path, flags: &[&str]) {
    let mut all = vec!["--prefix-cache-dir", dir.to_str().expect("utf-8")];
    all.extend_from_slice(flags);
    let s = Server::start(preset, &all);
    greedy(&s, &conversation("Where is the lighthouse?"));
    wait_for("two saved states", Duration::from_secs(60), || {
        state_files(dir).len() == 2
    });
}

fn conversation(question: &str) -> Value {
    json!([{ "role": "system", "content": SYSTEM.repeat(12) }, { "role": "user", "content": question }])
}

#[test]
fn a_restarted_server_resumes_from_its_state_directory_bit_for_bit() {
    let dir = tempfile::tempdir().expect("tmp");
    save_states("small", dir.path(), &[]);
    // The first server is gone; a new one on the same directory resumes after the system
    // message of another conversation, and where the first conversation's turn ended.
    let s = Server::start(
        "small",
        &["--prefix-cache-dir", dir.path().to_str().expect("utf-8")],
    );
    let other = conversation("Which way does the wind blow today?");
    let (warm, usage) = greedy(&s, &other);
    let system_tokens = token_count(
        &s,
        &format!(
            "<|im_start|>system\n{}<|im_end|>\n",
            SYSTEM.repeat(12).trim()
        ),
    );
    assert_eq!(cached(&usage), system_tokens);
    assert_eq!(s.metric("hostd_state_disk_loaded_total"), 1.0);
    let fresh = Server::start("small", &[]);
    let (cold, _) = greedy(&fresh, &other);
    assert_eq!(warm, cold, "resumed from disk and full prefill differ");
    let first = conversation("Where is the lighthouse?");
    let (_, usage) = greedy(&s, &first);
    assert_eq!(
        cached(&usage) + 2,
        usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
        "the same conversation resumes at its assistant header (before `<think>\\n`)"
    );
}

/// Starts `preset` with `flags` on `dir`, checks a conversation is answered in full (no
/// cached tokens) and that `refused` state files were refused.
fn check_refused(preset: &str, dir: &Path, flags: &[&str], refused: f64) {
    let mut all = vec!["--prefix-cache-dir", dir.to_str().expect("utf-8")];
    all.extend_from_slice(flags);
    let s = Server::start(preset, &all);
    let (_, usage) = greedy(&s, &conversation("Which way does the wind blow today?"));
    assert_eq!(cached(&usage), 0, "{preset} {flags:?}: nothing is resumed");
    assert_eq!(
        s.metric("hostd_state_disk_refused_total"),
        refused,
        "{preset} {flags:?}"
    );
    assert_eq!(s.metric("hostd_state_disk_loaded_total"), 0.0);
}

/// A copy of the state directory `from`, in a new temporary directory.
fn copy_states(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("tmp");
    for f in state_files(from) {
        std::fs::copy(&f, to.path().join(f.file_name().expect("name"))).expect("copy");
    }
    to
}

#[test]
fn corrupt_and_foreign_state_files_are_refused_and_the_request_still_succeeds() {
    let base = tempfile::tempdir().expect("tmp");
    save_states("small", base.path(), &[]);
    // Saved under another dense format, another model: refused (each server then saves its
    // own states beside them).
    let dir = copy_states(base.path());
    check_refused("small", dir.path(), &["--dense", "int8"], 2.0);
    let dir = copy_states(base.path());
    check_refused("tiny", dir.path(), &[], 2.0);
    // Corrupt (one bit in the data of each file): the system message's state, the one this
    // prompt could resume from, is refused when loaded (the other is never read).
    let dir = copy_states(base.path());
    for f in state_files(dir.path()) {
        let mut bytes = std::fs::read(&f).expect("read");
        let at = bytes.len() - 1000;
        bytes[at] ^= 1;
        std::fs::write(&f, bytes).expect("write");
    }
    check_refused("small", dir.path(), &[], 1.0);
}

#[test]
fn states_from_another_expert_container_are_refused() {
    let work = tempfile::tempdir().expect("tmp");
    let (int8, q4) = (work.path().join("int8"), work.path().join("q4k"));
    prepare_container_as(&model_dir("small"), &int8, "int8");
    prepare_container_as(&model_dir("small"), &q4, "q4k");
    let dir = work.path().join("states");
    let with = |c: &Path| {
        [
            "--experts",
            "int8",
            "--container",
            c.to_str().expect("utf-8"),
        ]
        .map(String::from)
    };
    let a = with(&int8);
    save_states("small", &dir, &a.each_ref().map(String::as_str));
    let b = with(&q4);
    check_refused("small", &dir, &b.each_ref().map(String::as_str), 2.0);
}
