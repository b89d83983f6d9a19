//! Tests of constrained decoding on the tiny fixture tokenizer: masks, random walks that must
//! always yield conforming output, the reasoning prefix, forced tool calls.

use super::*;
use serde_json::json;

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    Arc::clone(TOK.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/tiny/tokenizer.json"
        );
        Arc::new(Tokenizer::from_file(path).expect("tiny tokenizer"))
    }))
}

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let t = tokenizer();
        let eos = vec![t.im_end_id().unwrap(), t.endoftext_id().unwrap()];
        Grammars::new(t, eos)
    })
}

/// The shared grammars and tokenizer, for the other test modules.
pub(super) fn grammar_set() -> (&'static Grammars, Arc<Tokenizer>) {
    (grammars(), tokenizer())
}

const NO_THINKING: StartOptions = StartOptions {
    reasoning: false,
    reasoning_budget: 0,
};

fn allowed_ids(a: &Allowed, vocab: usize) -> Vec<u32> {
    (0..vocab as u32).filter(|&id| a.contains(id)).collect()
}

/// A matcher-driven random walk: each step takes a random allowed token, or (one step in
/// four, and always after `patience` steps) tries the closing texts in order and commits the
/// first one's tokens for as long as the mask allows them. Every committed token is checked
/// against the mask first. Returns the ids (end id excluded) and whether the grammar ended.
pub(super) fn walk(
    c: &mut SequenceConstraint,
    seed: u64,
    closers: &[&str],
    patience: usize,
) -> (Vec<u32>, bool) {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let mut rng = shared::splitmix::SplitMix64::new(seed);
    let mut out = Vec::new();
    for step in 0..4000 {
        let allowed = c.allowed().expect("mask");
        let ids = allowed_ids(&allowed, vocab);
        assert!(
            !ids.is_empty(),
            "no token allowed after {:?}",
            tok.decode(&out)
        );
        let mut plan = vec![ids[rng.below(ids.len())]];
        if rng.below(4) == 0 || step > patience {
            // The first closer the grammar accepts whole, else the one it accepts most of.
            let mut best = (0, Vec::new());
            for t in closers.iter().map(|s| tok.encode(s).unwrap()) {
                let n = c.accepted_prefix(&t);
                if n == t.len() {
                    best = (n, t);
                    break;
                }
                if n > best.0 {
                    best = (n, t[..n].to_vec());
                }
            }
            if best.0 > 0 {
                plan = best.1;
            }
        }
        for (k, id) in plan.into_iter().enumerate() {
            if k > 0 && !c.allowed().unwrap().contains(id) {
                break;
            }
            match c.commit(id).expect("commit") {
                Commit::Continue => out.push(id),
                Commit::End => return (out, true),
                Commit::Complete => {
                    out.push(id);
                    return (out, true);
                }
            }
        }
    }
    (out, false)
}

/// A small JSON-schema check covering what the test schemas use.
pub(super) fn conforms(v: &Value, s: &Value) -> Result<(), String> {
    if let Some(e) = s.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        return Err(format!("{v} not in enum"));
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "null" => v.is_null(),
            _ => true,
        };
        if !ok {
            return Err(format!("{v} is not of type {t}"));
        }
    }
    if let Some(n) = v.as_f64()
        && (s
            .get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n < m)
            || s.get("maximum")
                .and_then(Value::as_f64)
                .is_some_and(|m| n > m))
    {
        return Err(format!("{v} out of range"));
    }
    if let Some(st) = v.as_str()
        && s.get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| st.chars().count() as u64 > m)
    {
        return Err(format!("{v} too long"));
    }
    if let Some(o) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !o.contains_key(r.as_str().unwrap_or_default()) {
                return Err(format!("missing {r}"));
            }
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => conforms(x, ps)?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("extra key {k}"));
                }
                None => {}
            }
        }
    }
    if let (Some(a), Some(items)) = (v.as_array(), s.get("items")) {
        for x in a {
            conforms(x, items)?;
        }
        if s.get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| a.len() as u64 > m)
        {
            return Err("too many items".into());
        }
    }
    Ok(())
}

const JSON_CLOSERS: &[&str] = &["<|im_end|>", "\"", "}", "]", "0", "true", ",", "\"a\":"];

fn schemas() -> Vec<Value> {
    vec![
        json!({"type": "object"}),
        json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150}, "ok": {"type": "boolean"}}, "required": ["name", "age", "ok"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y", "zz"]}, "maxItems": 4}, "score": {"type": "number"}}, "required": ["tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"inner": {"$ref": "#/$defs/Inner"}}, "required": ["inner"], "additionalProperties": false, "$defs": {"Inner": {"type": "object", "properties": {"k": {"type": "string", "enum": ["a", "b"]}}, "required": ["k"], "additionalProperties": false}}}),
    ]
}

fn resolve_defs(v: &Value, root: &Value) -> Value {
    match v {
        Value::Object(m) if m.contains_key("$ref") => {
            let name = m["$ref"].as_str().unwrap().trim_start_matches("#/$defs/");
            resolve_defs(&root["$defs"][name], root)
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), resolve_defs(x, root)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[test]
fn json_random_walks_always_conform() {
    let tok = tokenizer();
    for (i, schema) in schemas().into_iter().enumerate() {
        for seed in 0..12u64 {
            let mut c = grammars()
                .compile(&ConstraintSpec::JsonSchema(schema.clone()), NO_THINKING)
                .expect("compile");
            let (ids, ended) = walk(&mut c, seed * 7919 + i as u64, JSON_CLOSERS, 60);
            let text = tok.decode(&ids).unwrap();
            assert!(ended, "schema {i} seed {seed}: walk did not end: {text:?}");
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("schema {i} seed {seed}: {e}: {text:?}"));
            let expanded = resolve_defs(&schema, &schema);
            conforms(&v, &expanded)
                .unwrap_or_else(|e| panic!("schema {i} seed {seed}: {e}: {text}"));
        }
    }
}

#[test]
fn json_object_mask_allows_only_an_object_start_and_ends_with_it() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let mut c = grammars()
        .compile(&ConstraintSpec::JsonObject, NO_THINKING)
        .unwrap();
    let first = allowed_ids(&c.allowed().unwrap(), vocab);
    assert!(!first.is_empty());
    for id in &first {
        let b = tok.token_bytes(*id).unwrap();
        assert!(
            b[0] == b'{' || b[0] == b'\n',
            "token {:?} may not start a JSON object answer",
            String::from_utf8_lossy(b)
        );
    }
    assert!(
        !first.contains(&tok.im_end_id().unwrap()),
        "an empty answer is not an object"
    );
    assert!(
        !first.contains(&tok.think_end_id().unwrap()),
        "special tokens are not JSON"
    );
    for id in tok.encode("{\"a\": [1, 2]}").unwrap() {
        assert!(c.allowed().unwrap().contains(id));
        c.commit(id).unwrap();
    }
    assert!(c.is_accepting());
    // The object is complete: the mask must allow ending it.
    let allowed = c.allowed().unwrap();
    assert!(allowed.contains(tok.im_end_id().unwrap()));
    assert!(!allowed.contains(tok.encode("x").unwrap()[0]));
    assert_eq!(c.commit(tok.im_end_id().unwrap()).unwrap(), Commit::End);
}

#[test]
fn mask_logits_sets_disallowed_to_minus_infinity() {
    let tok = tokenizer();
    let vocab = tok.vocab_size();
    let mut c = grammars()
        .compile(&ConstraintSpec::JsonObject, NO_THINKING)
        .unwrap();
    let allowed = c.allowed().unwrap();
    let logits = vec![0.5f32; vocab + 15];
    let masked = c.mask_logits(&logits, vocab).unwrap().to_vec();
    assert_eq!(masked.len(), logits.len());
    for id in 0..vocab as u32 {
        assert_eq!(
            masked[id as usize].is_finite(),
            allowed.contains(id),
            "id {id}"
        );
    }
}

#[test]
fn reasoning_is_free_until_the_budget_then_think_end_is_forced() {
    let tok = tokenizer();
    let think_end = tok.think_end_id().unwrap();
    let im_end = tok.im_end_id().unwrap();
    let start = StartOptions {
        reasoning: true,
        reasoning_budget: 3,
    };
    let mut c = grammars()
        .compile(&ConstraintSpec::JsonObject, start)
        .unwrap();
    let a = c.allowed().unwrap();
    assert!(
        a.contains(tok.encode("x").unwrap()[0]) && a.contains(think_end) && !a.contains(im_end)
    );
    for t in ["a", "b", "c"].map(|s| tok.encode(s).unwrap()[0]) {
        assert!(c.in_reasoning());
        assert_eq!(c.commit(t).unwrap(), Commit::Continue);
    }
    assert_eq!(c.allowed().unwrap(), Allowed::Only(think_end));
    let logits = vec![0.0f32; tok.vocab_size()];
    let masked = c.mask_logits(&logits, tok.vocab_size()).unwrap();
    assert_eq!(masked.iter().filter(|l| l.is_finite()).count(), 1);
    c.commit(think_end).unwrap();
    assert!(!c.in_reasoning());
    // Now the grammar decides: the answer must open an object.
    assert!(!c.allowed().unwrap().contains(tok.encode("x").unwrap()[0]));
    assert!(c.allowed().unwrap().contains(tok.encode("{").unwrap()[0]));
    // The model may close the reasoning early too.
    let mut c = grammars()
        .compile(&ConstraintSpec::JsonObject, start)
        .unwrap();
    c.commit(think_end).unwrap();
    assert!(!c.in_reasoning());
}

#[test]
fn invalid_and_unsupported_schemas_are_grammar_errors() {
    for bad in [
        json!("nope"),
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}, "required": ["a"]}),
        json!({"type": "frobnicate"}),
    ] {
        match grammars().compile(&ConstraintSpec::JsonSchema(bad.clone()), NO_THINKING) {
            Err(ConstraintError::Grammar { message }) => assert!(!message.is_empty()),
            other => panic!("{bad}: expected a grammar error, got {other:?}"),
        }
    }
}
