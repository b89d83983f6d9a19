//! The synchronisation primitives the cache's lease code uses, routed through one module so
//! that the loom model check (`loom_model.rs`, run by `scripts/loom`) swaps them for loom's
//! without touching the lease code, as `tokio/src/loom/mod.rs` does: `std::sync` normally,
//! `loom::sync` when built with `--cfg sluice_loom`. It owns no logic.

pub(crate) use std::sync::{PoisonError, TryLockError};

#[cfg(not(sluice_loom))]
pub(crate) use std::sync::atomic::{AtomicU8, Ordering};
#[cfg(not(sluice_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(sluice_loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, Ordering};
#[cfg(sluice_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
