//! The synchronisation primitives the cache's lease code uses, routed through one module so
//! that a later loom model check can swap them (`#[cfg(loom)] pub(crate) use loom::sync::…`,
//! as `tokio/src/loom/mod.rs` does) without touching the lease code. Today it re-exports
//! `std::sync`; it owns no logic.

pub(crate) use std::sync::atomic::{AtomicU8, Ordering};
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
