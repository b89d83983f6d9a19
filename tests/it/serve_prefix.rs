//! The prefix cache through `hostd serve`: a second conversation with the same system prompt
//! resumes after it, an edited history resumes from the last checkpoint before the edit, a
//! conversation's turns resume from the previous turn's, and every resumed request's greedy
//! tokens and log-probabilities equal, bit for bit, those of a fresh server that prefilled the
//! whole prompt (issue 39).

use crate::serve::Server;
use serde_json::{Value, json};

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
