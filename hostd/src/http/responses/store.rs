//! The in-memory store of the Responses API: responses created with `store` (the default) are
//! kept so that `GET /v1/responses/{id}` can return them and `previous_response_id` can continue
//! their conversation. Nothing is written to disk; a restart forgets everything.
//!
//! Each entry belongs to the principal (API key) that created it: another key's `get` or `delete`
//! of its id finds nothing, exactly as for an id never stored. Ids are never reused: an insert
//! under an existing id is refused (ids are 128 random bits, [`new_response_id`]).
//!
//! Bounded three ways, oldest evicted first: an entry lives at most [`MAX_AGE`], at most
//! [`MAX_ENTRIES`] are kept, and their conversations hold at most [`MAX_BYTES`] of text together.

use crate::chat_template::ChatMessage;
use crate::http::Principal;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a stored response can be read back or continued.
pub const MAX_AGE: Duration = Duration::from_secs(3600);
/// Most responses kept.
pub const MAX_ENTRIES: usize = 1024;
/// Most conversation text (bytes) kept over all entries.
pub const MAX_BYTES: usize = 256 << 20;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object as `GET` returns it.
    pub response: Value,
    /// The conversation up to and including this response's output, without `instructions`
    /// (a follow-up's own `instructions` replace them, as OpenAI does).
    pub conversation: Vec<ChatMessage>,
    /// The `call_id`s of every function call in the conversation (a `function_call_output`
    /// must answer one of them).
    pub call_ids: Vec<String>,
}

struct Entry {
    stored: Stored,
    owner: Principal,
    at: Instant,
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Entry>,
    /// Ids in insertion order (the oldest first).
    order: VecDeque<String>,
    bytes: usize,
}

/// The store (shared by all handlers).
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

fn size(s: &Stored) -> usize {
    let texts: usize = s
        .conversation
        .iter()
        .map(|m| {
            m.content.len()
                + m.reasoning_content.as_ref().map_or(0, String::len)
                + m.tool_calls
                    .iter()
                    .map(|c| {
                        c.name.len()
                            + c.arguments
                                .as_ref()
                                .map_or(0, |a| Value::Object(a.clone()).to_string().len())
                    })
                    .sum::<usize>()
        })
        .sum();
    texts + s.response.to_string().len() + s.call_ids.iter().map(String::len).sum::<usize>()
}

impl Inner {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let e = self.by_id.remove(id)?;
        self.bytes -= e.bytes;
        self.order.retain(|o| o != id);
        Some(e)
    }

    /// Evicts expired entries, then the oldest ones while a limit is passed.
    fn evict(&mut self, now: Instant) {
        while let Some(id) = self.order.front().cloned() {
            let expired = self
                .by_id
                .get(&id)
                .is_none_or(|e| now.duration_since(e.at) >= MAX_AGE);
            if !(expired || self.by_id.len() > MAX_ENTRIES || self.bytes > MAX_BYTES) {
                break;
            }
            self.order.pop_front();
            if let Some(e) = self.by_id.remove(&id) {
                self.bytes -= e.bytes;
            }
        }
    }
}

/// A fresh response id: `resp_` and 128 bits from the operating system's generator, as 32 hex
/// digits. Nothing in it comes from the request, so no caller can choose or predict another's.
pub fn new_response_id() -> String {
    let mut bits = [0u8; 16];
    // The OS generator failing is not something a server can serve through (no entropy at all).
    getrandom::fill(&mut bits).expect("the operating system's random generator failed");
    let hex: String = bits.iter().map(|b| format!("{b:02x}")).collect();
    format!("resp_{hex}")
}

impl Store {
    /// Keeps `stored` under `id` for `owner`; false (and nothing changes) when `id` is held
    /// already: an id is never overwritten.
    pub fn insert(&self, id: String, owner: Principal, stored: Stored) -> bool {
        let bytes = size(&stored);
        let now = Instant::now();
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if inner.by_id.contains_key(&id) {
            return false;
        }
        inner.bytes += bytes;
        inner.order.push_back(id.clone());
        inner.by_id.insert(
            id,
            Entry {
                stored,
                owner,
                at: now,
                bytes,
            },
        );
        inner.evict(now);
        true
    }

    /// The response stored under `id` by `owner`, unless it expired or was evicted.
    pub fn get(&self, id: &str, owner: Principal) -> Option<Stored> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.evict(Instant::now());
        inner
            .by_id
            .get(id)
            .filter(|e| e.owner == owner)
            .map(|e| e.stored.clone())
    }

    /// Forgets `owner`'s `id`; false when `owner` has no such response.
    pub fn delete(&self, id: &str, owner: Principal) -> bool {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if inner.by_id.get(id).is_none_or(|e| e.owner != owner) {
            return false;
        }
        inner.remove(id).is_some()
    }

    /// How many responses are stored.
    pub fn count(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .by_id
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The one principal of a server without API keys.
    const ANY: Principal = Principal(None);

    fn stored(text: &str) -> Stored {
        Stored {
            response: json!({"object": "response"}),
            conversation: vec![ChatMessage::user(text)],
            call_ids: Vec::new(),
        }
    }

    #[test]
    fn keeps_the_newest_up_to_the_count_and_forgets_on_delete() {
        let s = Store::default();
        for i in 0..MAX_ENTRIES + 5 {
            assert!(s.insert(format!("resp_{i}"), ANY, stored(&format!("t{i}"))));
        }
        assert_eq!(s.count(), MAX_ENTRIES);
        assert!(s.get("resp_0", ANY).is_none() && s.get("resp_4", ANY).is_none());
        let last = format!("resp_{}", MAX_ENTRIES + 4);
        assert_eq!(
            s.get(&last, ANY).map(|e| e.conversation),
            Some(vec![ChatMessage::user(format!("t{}", MAX_ENTRIES + 4))])
        );
        assert!(s.delete(&last, ANY));
        assert!(!s.delete(&last, ANY));
        assert!(s.get(&last, ANY).is_none());
    }

    #[test]
    fn byte_limit_evicts_the_oldest() {
        let s = Store::default();
        let big = "x".repeat(MAX_BYTES / 4 - 100);
        for i in 0..4 {
            assert!(s.insert(format!("r{i}"), ANY, stored(&big)));
        }
        assert!(s.get("r0", ANY).is_some(), "four quarters fit");
        assert!(s.insert("r4".into(), ANY, stored(&big)));
        assert!(
            s.get("r0", ANY).is_none(),
            "a fifth quarter: the oldest goes"
        );
        assert!(s.get("r1", ANY).is_some() && s.get("r4", ANY).is_some());
    }

    #[test]
    fn expired_entries_are_gone() {
        let s = Store::default();
        assert!(s.insert("old".into(), ANY, stored("a")));
        let later = Instant::now() + MAX_AGE + Duration::from_secs(1);
        s.inner.lock().expect("lock").evict(later);
        assert!(s.get("old", ANY).is_none());
        assert!(s.insert("new".into(), ANY, stored("b")));
        assert!(s.get("new", ANY).is_some());
    }

    #[test]
    fn another_principals_id_is_not_found_and_ids_are_never_overwritten() {
        let s = Store::default();
        let (a, b) = (Principal(Some(0)), Principal(Some(1)));
        assert!(s.insert("resp_x".into(), a, stored("mine")));
        assert!(s.get("resp_x", b).is_none(), "another key reads nothing");
        assert!(!s.delete("resp_x", b), "another key deletes nothing");
        assert!(
            s.get("resp_x", ANY).is_none(),
            "nor does a keyless principal"
        );
        assert!(
            !s.insert("resp_x".into(), b, stored("theirs")),
            "the id is taken"
        );
        let kept = s.get("resp_x", a).expect("still a's");
        assert_eq!(kept.conversation, vec![ChatMessage::user("mine")]);
        assert!(s.delete("resp_x", a));
    }

    #[test]
    fn response_ids_are_128_random_bits() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_response_id()).collect();
        assert_eq!(ids.len(), 1000, "no repeats");
        for id in &ids {
            let hex = id.strip_prefix("resp_").expect("resp_ prefix");
            assert_eq!(hex.len(), 32, "{id}");
            assert!(hex.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
        }
        // Every bit position varies over the sample (a counter or a timestamp would not).
        let bits = |id: &String| u128::from_str_radix(&id[5..], 16).expect("hex");
        let (ones, zeros) = ids
            .iter()
            .fold((0u128, 0u128), |(o, z), id| (o | bits(id), z | !bits(id)));
        assert_eq!((ones, zeros), (u128::MAX, u128::MAX));
    }
}
