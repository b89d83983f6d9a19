//! The in-memory store of the Responses API: responses created with `store` (the default) are
//! kept so that `GET /v1/responses/{id}` can return them and `previous_response_id` can continue
//! their conversation. Nothing is written to disk; a restart forgets everything.
//!
//! Bounded three ways, oldest evicted first: an entry lives at most [`MAX_AGE`], at most
//! [`MAX_ENTRIES`] are kept, and their conversations hold at most [`MAX_BYTES`] of text together.

use crate::chat_template::ChatMessage;
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

impl Store {
    /// Keeps `stored` under `id` (replacing an entry of the same id).
    pub fn insert(&self, id: String, stored: Stored) {
        let bytes = size(&stored);
        let now = Instant::now();
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.remove(&id);
        inner.bytes += bytes;
        inner.order.push_back(id.clone());
        inner.by_id.insert(
            id,
            Entry {
                stored,
                at: now,
                bytes,
            },
        );
        inner.evict(now);
    }

    /// The response stored under `id`, unless it expired or was evicted.
    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.evict(Instant::now());
        inner.by_id.get(id).map(|e| e.stored.clone())
    }

    /// Forgets `id`; false when it was not stored.
    pub fn delete(&self, id: &str) -> bool {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
            s.insert(format!("resp_{i}"), stored(&format!("t{i}")));
        }
        assert_eq!(s.count(), MAX_ENTRIES);
        assert!(s.get("resp_0").is_none() && s.get("resp_4").is_none());
        let last = format!("resp_{}", MAX_ENTRIES + 4);
        assert_eq!(
            s.get(&last).map(|e| e.conversation),
            Some(vec![ChatMessage::user(format!("t{}", MAX_ENTRIES + 4))])
        );
        assert!(s.delete(&last));
        assert!(!s.delete(&last));
        assert!(s.get(&last).is_none());
    }

    #[test]
    fn byte_limit_evicts_the_oldest() {
        let s = Store::default();
        let big = "x".repeat(MAX_BYTES / 4 - 100);
        for i in 0..4 {
            s.insert(format!("r{i}"), stored(&big));
        }
        assert!(s.get("r0").is_some(), "four quarters fit");
        s.insert("r4".into(), stored(&big));
        assert!(s.get("r0").is_none(), "a fifth quarter: the oldest goes");
        assert!(s.get("r1").is_some() && s.get("r4").is_some());
    }

    #[test]
    fn expired_entries_are_gone() {
        let s = Store::default();
        s.insert("old".into(), stored("a"));
        let later = Instant::now() + MAX_AGE + Duration::from_secs(1);
        s.inner.lock().expect("lock").evict(later);
        assert!(s.get("old").is_none());
        s.insert("new".into(), stored("b"));
        assert!(s.get("new").is_some());
    }
}
