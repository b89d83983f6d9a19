//! Sequence states saved in a directory, so a restarted `hostd serve` (or another one sharing
//! the directory) resumes a conversation or a shared system prompt without prefilling it.
//!
//! - **Saving** never blocks a request: the scheduler queues a copy of the state for one
//!   writer thread while the copies waiting stay within `max_pending_bytes` (one state is
//!   always taken when none waits); past that the save is skipped and counted. The writer takes an exclusive `flock` on `DIR/.lock`, deletes the
//!   least recently used files until the new one fits `--prefix-cache-disk-bytes`, writes a
//!   temporary file and renames it into place: readers never see half a file, and writers of
//!   several processes take turns, so the directory never holds more than its cap.
//! - **Finding** a state reads the directory's names; a file not seen before has its head (the
//!   identity and the tokens) read once. Files saved under another identity (another model,
//!   weights, container, dense format, ISA or build) are logged once and never used.
//! - **Loading** maps the file and checks its checksum, format, identity and layer layout
//!   (`file.rs`) before a byte of it is used; a corrupt or truncated file is logged, deleted and
//!   skipped, and the request prefills in full. A loaded file's modification time is set to
//!   now, so eviction is least recently *used*.
//!
//! Names are `{identity prefix}-{hash of the tokens}.state`, so the same state saved twice (by
//! two processes) is one file.

pub mod file;

use crate::engine::metrics::Gauge;
use crate::model::snapshot::{KvRows, RecurrentSnapshot};
use file::{FileError, Layout, Saved};
use prometheus_client::metrics::counter::Counter;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::Sender;
use std::time::SystemTime;

/// Counters of the store, shared with the writer thread; `/metrics` shows them (the same
/// counters, cloned from `Metrics::store_stats`).
#[derive(Debug, Default, Clone)]
pub struct StoreStats {
    /// States written.
    pub saved: Counter,
    /// States loaded and resumed from.
    pub loaded: Counter,
    /// Files refused (corrupt, truncated, another layout; another identity counts once).
    pub refused: Counter,
    /// Saves skipped because the writer was busy or the state was larger than the cap.
    pub skipped: Counter,
    /// Files deleted to stay within the cap.
    pub evicted: Counter,
    /// Bytes of state files in the directory after the last write or scan.
    pub disk_bytes: Gauge,
}

/// One state to write.
struct Job {
    name: String,
    tokens: Vec<u32>,
    kv: KvRows,
    recurrent: RecurrentSnapshot,
    /// Bytes of `kv` and `recurrent`, counted in the store's pending bytes.
    bytes: usize,
}

/// The directory of saved states, as the scheduler thread sees it.
pub struct PrefixStore {
    dir: PathBuf,
    identity: [u8; 32],
    layout: Layout,
    max_tokens: usize,
    /// Our files by name: the tokens each one consumed.
    index: HashMap<String, Vec<u32>>,
    /// Names already looked at and not ours (logged once).
    foreign: HashSet<String>,
    writer: Sender<Job>,
    /// Bytes of the states queued for the writer or being written.
    pending: Arc<AtomicUsize>,
    max_pending_bytes: usize,
    stats: StoreStats,
    /// The directory's modification time at the last full scan, and when that scan was: a
    /// file renamed in or deleted (by this process's writer or another hostd) changes the
    /// time, so an admission rescans only then, not with a readdir and a stat per file every
    /// time; and at least every [`RESCAN_AFTER`], since a directory's time is coarse (a jiffy)
    /// and two changes within one tick look like one.
    scanned_at: Option<(SystemTime, std::time::Instant)>,
    /// Full scans so far (tests check that an unchanged directory is not read again).
    scans: usize,
}

const SUFFIX: &str = ".state";
/// The longest an unchanged-looking directory goes without a full scan.
const RESCAN_AFTER: std::time::Duration = std::time::Duration::from_secs(2);
const LOCK: &str = ".lock";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl PrefixStore {
    /// Opens (creating it if needed) `dir`, holding at most `cap_bytes` of state files, for
    /// states of `identity` with `layout`; `max_tokens` bounds a file's token count (the
    /// context); saves wait in memory up to `max_pending_bytes`. Starts the writer thread.
    pub fn open(
        dir: &Path,
        cap_bytes: u64,
        identity: [u8; 32],
        layout: Layout,
        max_tokens: usize,
        max_pending_bytes: usize,
        stats: StoreStats,
    ) -> std::io::Result<PrefixStore> {
        std::fs::create_dir_all(dir)?;
        File::create(dir.join(LOCK))?;
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let pending = Arc::new(AtomicUsize::new(0));
        let (w_dir, w_pending, w_stats) = (dir.to_path_buf(), Arc::clone(&pending), stats.clone());
        std::thread::Builder::new()
            .name("prefix-store-writer".into())
            .spawn(move || {
                for job in rx {
                    if let Err(e) = write_job(&w_dir, cap_bytes, &identity, &job, &w_stats) {
                        tracing::warn!(dir = %w_dir.display(), file = %job.name, error = %e, "could not save a sequence state");
                    }
                    w_pending.fetch_sub(job.bytes, Relaxed);
                }
            })?;
        let mut store = PrefixStore {
            dir: dir.to_path_buf(),
            identity,
            layout,
            max_tokens,
            index: HashMap::new(),
            foreign: HashSet::new(),
            writer: tx,
            pending,
            max_pending_bytes,
            stats,
            scanned_at: None,
            scans: 0,
        };
        store.rescan();
        tracing::info!(
            dir = %dir.display(),
            cap_bytes,
            states = store.index.len(),
            "prefix store opened"
        );
        Ok(store)
    }

    /// The counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Whether a state of `bytes` would be queued now and is not saved yet, so the caller
    /// copies a state only when it will be written; a state that would not is counted as
    /// skipped.
    pub fn wants(&mut self, tokens: &[u32], bytes: usize) -> bool {
        let name = self.name_of(tokens);
        if self.index.contains_key(&name) && self.dir.join(&name).exists() {
            return false;
        }
        let pending = self.pending.load(Relaxed);
        if pending > 0 && pending + bytes > self.max_pending_bytes {
            self.stats.skipped.inc();
            return false;
        }
        true
    }

    /// Whether nothing waits for the writer or is being written.
    pub fn idle(&self) -> bool {
        self.pending.load(Relaxed) == 0
    }

    /// Queues the state that consumed `tokens` for the writer (after [`Self::wants`]).
    pub fn save(&mut self, tokens: &[u32], kv: KvRows, recurrent: RecurrentSnapshot) {
        let name = self.name_of(tokens);
        let bytes = kv.bytes() + recurrent.bytes();
        self.pending.fetch_add(bytes, Relaxed);
        let job = Job {
            name: name.clone(),
            tokens: tokens.to_vec(),
            kv,
            recurrent,
            bytes,
        };
        if self.writer.send(job).is_ok() {
            self.index.insert(name, tokens.to_vec());
        } else {
            self.pending.fetch_sub(bytes, Relaxed);
            self.stats.skipped.inc();
        }
    }

    fn name_of(&self, tokens: &[u32]) -> String {
        let h = xxhash_rust::xxh3::xxh3_128(bytemuck::cast_slice(tokens));
        format!("{}-{h:032x}{SUFFIX}", hex(&self.identity[..8]))
    }

    /// Reads the directory: indexes files not seen before (their heads), forgets vanished ones.
    fn rescan(&mut self) {
        // Taken before reading: a change during the scan makes the next call scan again.
        let mtime = std::fs::metadata(&self.dir).and_then(|m| m.modified()).ok();
        if let (Some(now), Some((then, at))) = (mtime, self.scanned_at)
            && now == then
            && at.elapsed() < RESCAN_AFTER
        {
            return;
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        self.scans += 1;
        self.scanned_at = mtime.map(|m| (m, std::time::Instant::now()));
        let mut present = HashSet::new();
        let mut bytes = 0;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(SUFFIX) || name.starts_with('.') {
                continue;
            }
            bytes += e.metadata().map_or(0, |m| m.len());
            present.insert(name.clone());
            if self.index.contains_key(&name) || self.foreign.contains(&name) {
                continue;
            }
            let head = File::open(e.path())
                .map_err(|e| FileError::Io(e.to_string()))
                .and_then(|f| file::read_head(std::io::BufReader::new(f), self.max_tokens));
            match head {
                Ok((identity, tokens)) if identity == self.identity => {
                    self.index.insert(name, tokens);
                }
                Ok((identity, _)) => {
                    tracing::warn!(
                        file = %e.path().display(),
                        theirs = %hex(&identity[..8]),
                        ours = %hex(&self.identity[..8]),
                        "skipping a saved sequence state of another model, weights, container or build"
                    );
                    self.stats.refused.inc();
                    self.foreign.insert(name);
                }
                Err(err) => {
                    tracing::warn!(file = %e.path().display(), error = %err, "skipping an unreadable saved sequence state");
                    self.stats.refused.inc();
                    self.foreign.insert(name);
                }
            }
        }
        self.index.retain(|n, _| present.contains(n));
        self.foreign.retain(|n| present.contains(n));
        self.stats.disk_bytes.set(bytes);
    }

    /// The longest saved state whose tokens are a proper prefix of `prompt` and longer than
    /// `longer_than`, loaded and verified. Files that fail verification are logged, deleted
    /// and passed over.
    pub fn find(&mut self, prompt: &[u32], longer_than: usize) -> Option<Saved> {
        self.rescan();
        loop {
            let name = self
                .index
                .iter()
                .filter(|(_, t)| {
                    t.len() > longer_than && t.len() < prompt.len() && prompt.starts_with(t)
                })
                .max_by_key(|(_, t)| t.len())
                .map(|(n, _)| n.clone())?;
            let path = self.dir.join(&name);
            match self.load(&path) {
                Ok(saved) if prompt.starts_with(&saved.tokens) => {
                    self.stats.loaded.inc();
                    if let Ok(f) = File::options().write(true).open(&path) {
                        let _ = f.set_modified(SystemTime::now());
                    }
                    return Some(saved);
                }
                Ok(_) => {
                    tracing::warn!(file = %path.display(), "a saved sequence state's tokens differ from its head; skipped");
                    self.stats.refused.inc();
                    self.index.remove(&name);
                    self.foreign.insert(name);
                }
                Err(FileError::Io(e)) => {
                    // Gone (another process evicted it) or unreadable: forget it.
                    tracing::debug!(file = %path.display(), error = %e, "saved state not readable");
                    self.index.remove(&name);
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "refusing a saved sequence state; it is deleted and the prompt is prefilled");
                    self.stats.refused.inc();
                    self.index.remove(&name);
                    if !matches!(e, FileError::Identity { .. }) {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
    }

    fn load(&self, path: &Path) -> Result<Saved, FileError> {
        let f = File::open(path).map_err(|e| FileError::Io(e.to_string()))?;
        // SAFETY: the mapping is read-only and private. A file is only ever renamed into place
        // whole and deleted, never rewritten, so its bytes do not change under the map (an
        // unlinked file stays mapped until unmapped).
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| FileError::Io(e.to_string()))?;
        file::read(&map, &self.identity, &self.layout)
    }
}

/// Bytes `write_job` will write for `job`.
fn file_len(job: &Job) -> u64 {
    let floats: usize = job
        .kv
        .layers()
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum::<usize>()
        + job
            .recurrent
            .layers()
            .iter()
            .flatten()
            .map(|s| s.parts().0.len() + s.parts().1.len())
            .sum::<usize>();
    let per_layer: usize = job
        .recurrent
        .layers()
        .iter()
        .map(|l| if l.is_some() { 1 + 8 + 8 } else { 1 + 4 })
        .sum();
    (8 + 4 + 32 + 8 + job.tokens.len() * 4 + 4 + per_layer + floats * 4 + 8) as u64
}

/// Writes one state under the directory lock, evicting least recently used files first.
fn write_job(
    dir: &Path,
    cap: u64,
    identity: &[u8; 32],
    job: &Job,
    stats: &StoreStats,
) -> std::io::Result<()> {
    let size = file_len(job);
    if size > cap {
        stats.skipped.inc();
        return Ok(());
    }
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(LOCK))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
    let path = dir.join(&job.name);
    if path.exists() {
        return Ok(());
    }
    let mut files: Vec<(SystemTime, u64, PathBuf)> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(SUFFIX))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    for (_, len, old) in &files {
        if total + size <= cap {
            break;
        }
        if std::fs::remove_file(old).is_ok() {
            stats.evicted.inc();
            total -= len;
        }
    }
    let tmp = dir.join(format!(".{}.{}.tmp", job.name, std::process::id()));
    let result = (|| {
        let f = File::create(&tmp)?;
        file::write(
            BufWriter::with_capacity(1 << 20, &f),
            identity,
            &job.tokens,
            &job.kv,
            &job.recurrent,
        )?;
        f.sync_data()?;
        std::fs::rename(&tmp, &path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    } else {
        stats.saved.inc();
        stats.disk_bytes.set(total + size);
    }
    result
}

#[cfg(test)]
mod tests;
