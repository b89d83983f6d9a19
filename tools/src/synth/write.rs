//! Writes a planned checkpoint: the JSON files, then each shard's precomputed header followed by
//! its tensor data, generated in fixed-size chunks on one thread pool while a writer thread
//! drains the previous chunk (two buffers in flight, 16 MiB in all), into `DIR.tmp-<pid>`,
//! validated with `Checkpoint::open` and renamed to `DIR` at the end.

use super::SynthError;
use super::plan::{Plan, ShardPlan};
use super::preset::{generation_config_json, tokenizer_config_json};
use super::tokenizer::{self, LoadTokenizer, TokenizerSource};
use super::values::{elem_bytes, fill, tensor_key};
use shared::checkpoint::{CONFIG_FILE, Checkpoint, INDEX_FILE};
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;

/// The lock file a writer holds inside its partial directory (`DIR.tmp-<pid>/`).
const LOCK_FILE: &str = ".synth-lock";

/// Bytes generated per chunk (one of two buffers).
const CHUNK_BYTES: usize = 8 << 20;

/// What `synthesize` is asked to do besides the plan.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Seed of every tensor's value stream.
    pub seed: u64,
    /// The model directory to create.
    pub out: PathBuf,
    /// Where `tokenizer.json` comes from.
    pub tokenizer: TokenizerSource,
    /// Replace an existing non-empty `out`.
    pub force: bool,
    /// Loads the written `tokenizer.json` with the runtime's tokenizer, to check it before any
    /// shard is written.
    pub load_tokenizer: LoadTokenizer,
    /// Set (by a signal handler) to stop between chunks: the partial `DIR.tmp-<pid>` is then
    /// removed and the write fails with [`SynthError::Interrupted`].
    pub cancel: Arc<AtomicBool>,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The model directory.
    pub dir: PathBuf,
    /// Shard files.
    pub shards: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of all shard files.
    pub shard_bytes: u64,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
    move |e| SynthError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Writes the checkpoint `plan` describes into `opts.out`. `progress` receives the number of
/// shard bytes written since its previous call.
pub fn synthesize(
    plan: &Plan,
    opts: &SynthOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<Summary, SynthError> {
    let out = &opts.out;
    let existing = match fs::metadata(out) {
        Ok(m) if !m.is_dir() => return Err(SynthError::OutNotDir(out.clone())),
        Ok(_) => {
            let non_empty = fs::read_dir(out).map_err(io_err(out))?.next().is_some();
            if non_empty && !opts.force {
                return Err(SynthError::OutExists(out.clone()));
            }
            true
        }
        Err(_) => false,
    };
    let tokenizer_text = match &opts.tokenizer {
        TokenizerSource::Asset => tokenizer::asset_for(&plan.dims)?,
        TokenizerSource::File(path) => {
            if plan.dims.bpe_ranks != super::preset::REAL_RANKS {
                return Err(SynthError::Tokenizer(format!(
                    "--tokenizer needs the real vocabulary; preset {} has vocab_size {}",
                    plan.preset, plan.dims.vocab_size
                )));
            }
            tokenizer::read_external(path, &plan.dims)?
        }
    };
    let name = out
        .file_name()
        .ok_or_else(|| SynthError::OutNotDir(out.clone()))?;
    let tmp = out.with_file_name(format!(
        "{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    for stale in stale_partials(out) {
        if fs::remove_dir_all(&stale).is_ok() {
            eprintln!("removed {}, left by an interrupted synth", stale.display());
        }
    }
    fs::create_dir(&tmp).map_err(io_err(&tmp))?;
    // Held until the rename: a later synth removes a partial directory only if it can take
    // this lock, i.e. only once its writer is gone (however it ended).
    let lock_path = tmp.join(LOCK_FILE);
    let lock = File::create(&lock_path).map_err(io_err(&lock_path))?;
    lock.try_lock().map_err(|e| SynthError::Io {
        path: lock_path.clone(),
        message: e.to_string(),
    })?;
    let written = write_all(plan, opts, &tokenizer_text, &tmp, progress).map_err(|e| match e {
        SynthError::Interrupted(_) => SynthError::Interrupted(tmp.clone()),
        other => other,
    });
    let result = written.and_then(|summary| {
        if existing {
            if opts.force {
                fs::remove_dir_all(out)
            } else {
                fs::remove_dir(out)
            }
            .map_err(io_err(out))?;
        }
        fs::remove_file(&lock_path).map_err(io_err(&lock_path))?;
        fs::rename(&tmp, out).map_err(io_err(out))?;
        Ok(Summary {
            dir: out.clone(),
            ..summary
        })
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    drop(lock);
    result
}

/// `DIR.tmp-<pid>` directories next to `out` whose writer is gone: their lock file can be
/// locked (a synth killed before it could clean up). A directory without the lock file is not
/// a synth's, or is one just starting: it is left alone.
fn stale_partials(out: &Path) -> Vec<PathBuf> {
    let (Some(name), parent) = (out.file_name(), out.parent()) else {
        return Vec::new();
    };
    let parent = parent
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let prefix = format!("{}.tmp-", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(parent) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            let file_name = e.file_name();
            let ours = file_name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
            ours && File::open(e.path().join(LOCK_FILE)).is_ok_and(|f| f.try_lock().is_ok())
        })
        .map(|e| e.path())
        .collect()
}

fn write_json(dir: &Path, file: &str, value: &serde_json::Value) -> Result<(), SynthError> {
    let path = dir.join(file);
    let mut text =
        serde_json::to_string_pretty(value).map_err(|e| SynthError::Internal(e.to_string()))?;
    text.push('\n');
    fs::write(&path, text).map_err(io_err(&path))
}

fn write_all(
    plan: &Plan,
    opts: &SynthOptions,
    tokenizer_text: &str,
    dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<Summary, SynthError> {
    write_json(dir, CONFIG_FILE, &plan.config_json)?;
    write_json(
        dir,
        "generation_config.json",
        &generation_config_json(&plan.dims),
    )?;
    let specials = tokenizer::special_tokens()?;
    write_json(
        dir,
        "tokenizer_config.json",
        &tokenizer_config_json(&plan.dims, &specials),
    )?;
    let tok_path = dir.join("tokenizer.json");
    fs::write(&tok_path, tokenizer_text).map_err(io_err(&tok_path))?;
    tokenizer::verify(&tok_path, &plan.dims, opts.load_tokenizer)?;
    write_json(dir, INDEX_FILE, &plan.index_json())?;
    for shard in &plan.shards {
        write_shard(&dir.join(&shard.file_name), shard, opts, progress)?;
    }
    // Header-only validation: exactly what every loader runs first.
    Checkpoint::open(dir)
        .map_err(|e| SynthError::Internal(format!("written checkpoint fails validation: {e}")))?;
    Ok(Summary {
        dir: dir.to_path_buf(),
        shards: plan.shards.len(),
        tensors: plan.shards.iter().map(|s| s.tensors.len()).sum(),
        shard_bytes: plan.total_file_bytes(),
    })
}

/// Streams one shard: header, then every tensor's values chunk by chunk.
fn write_shard(
    path: &Path,
    shard: &ShardPlan,
    opts: &SynthOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<(), SynthError> {
    let seed = opts.seed;
    let mut interrupted = false;
    let file = File::create(path).map_err(io_err(path))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&shard.header).map_err(io_err(path))?;
    progress(shard.header.len() as u64);
    let (full_tx, full_rx) = sync_channel::<(Vec<u8>, usize)>(2);
    let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(2);
    for _ in 0..2 {
        empty_tx
            .send(vec![0u8; CHUNK_BYTES])
            .map_err(|e| SynthError::Internal(e.to_string()))?;
    }
    std::thread::scope(|scope| {
        let writer = scope.spawn(move || -> std::io::Result<File> {
            for (buf, len) in full_rx {
                w.write_all(&buf[..len])?;
                if empty_tx.send(buf).is_err() {
                    break;
                }
            }
            w.into_inner().map_err(std::io::IntoInnerError::into_error)
        });
        'tensors: for t in &shard.tensors {
            let key = tensor_key(seed, &t.name);
            let size = elem_bytes(t.dtype);
            let numel = t.numel();
            let mut first = 0u64;
            while first < numel {
                if opts.cancel.load(Ordering::Relaxed) {
                    interrupted = true;
                    break 'tensors;
                }
                let n = (numel - first).min((CHUNK_BYTES / size) as u64);
                // A closed channel means the writer stopped on an error; join reports it.
                let Ok(mut buf) = empty_rx.recv() else {
                    break 'tensors;
                };
                let len = n as usize * size;
                fill(&t.init, key, t.dtype, first, &mut buf[..len]);
                if full_tx.send((buf, len)).is_err() {
                    break 'tensors;
                }
                progress(len as u64);
                first += n;
            }
        }
        drop(full_tx);
        let file = writer
            .join()
            .map_err(|_| SynthError::Internal("shard writer thread panicked".into()))?
            .map_err(io_err(path))?;
        if interrupted {
            return Err(SynthError::Interrupted(path.to_path_buf()));
        }
        let len = file.metadata().map_err(io_err(path))?.len();
        if len != shard.file_len() {
            return Err(SynthError::Internal(format!(
                "{}: wrote {len} bytes, planned {}",
                path.display(),
                shard.file_len()
            )));
        }
        Ok(())
    })
}
