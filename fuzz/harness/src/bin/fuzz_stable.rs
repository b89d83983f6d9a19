//! `fuzz-stable`: the fuzz runner CI uses, on the stable toolchain. For each target it replays
//! the committed corpus (`fuzz/corpus/<target>/`, which also holds every past finding), then
//! mutates for a bounded time: byte and integer mutations, dictionary tokens, splices, with
//! outcome feedback (an input that takes a path no earlier input took joins the pool). It is
//! weaker than coverage-guided libFuzzer (`fuzz/README.md`), and honest about it: the report
//! counts executions and distinct outcomes, not coverage.
//!
//! Allocation is capped (one request over `SINGLE_CAP`, or more than `LIVE_CAP` live, aborts
//! after saving the input), so a length field that drives an allocation is a finding. A panic
//! is a finding too: the input is saved under `--crashes` and the run fails.
//!
//! ```text
//! fuzz-stable [--seconds N] [--target NAME]... [--seed S] [--max-len N] [--corpus DIR]
//!             [--crashes DIR] [--write-seeds] [FILE...]
//! ```
//! With FILEs (and one `--target`), runs only those inputs (reproduce a finding).

use rustix::fs::{Mode, OFlags};
use shared::splitmix::SplitMix64;
use sluice_fuzz::seeds::{dictionary, seeds};
use sluice_fuzz::{Target, targets};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Largest single allocation a target may make.
const SINGLE_CAP: usize = 256 << 20;
/// Most bytes a target may hold at once.
const LIVE_CAP: usize = 1 << 30;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static CURRENT: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static CURRENT_LEN: AtomicUsize = AtomicUsize::new(0);
static CRASH_FILE: Mutex<Option<std::ffi::CString>> = Mutex::new(None);

/// The system allocator with the caps above.
struct Capped;

// SAFETY: every call forwards to `System` with the caller's layout; the bookkeeping is atomics.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grow(layout.size(), layout.size());
        // SAFETY: forwarded with the caller's (valid, non-zero-size) layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grow(layout.size(), layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator (hence `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            grow(new_size - layout.size(), new_size);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Capped = Capped;

/// Counts `extra` new bytes for an allocation of `size`; over a cap, saves the current input
/// and aborts (without allocating).
fn grow(extra: usize, size: usize) {
    let live = LIVE.fetch_add(extra, Ordering::Relaxed) + extra;
    if size > SINGLE_CAP || live > LIVE_CAP {
        let msg: &[u8] = if size > SINGLE_CAP {
            b"\nfuzz-stable: FINDING: one allocation over 256 MiB\n"
        } else {
            b"\nfuzz-stable: FINDING: over 1 GiB live\n"
        };
        // Plain system calls from here on (rustix passes the path and buffers as they are):
        // nothing may allocate.
        let _ = rustix::io::write(std::io::stderr(), msg);
        if let Ok(guard) = CRASH_FILE.try_lock()
            && let Some(path) = guard.as_ref()
            && let Ok(fd) = rustix::fs::open(
                path.as_c_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
                Mode::from_raw_mode(0o644),
            )
        {
            let len = CURRENT_LEN.load(Ordering::Relaxed);
            let input: &[u8] = if len == 0 {
                &[]
            } else {
                // SAFETY: a non-zero length is published by `execute` together with the pointer
                // of the input it is running, which stays borrowed until it resets the length.
                unsafe { std::slice::from_raw_parts(CURRENT.load(Ordering::Relaxed), len) }
            };
            let _ = rustix::io::write(&fd, input);
        }
        std::process::abort();
    }
}

const INTERESTING: [u64; 14] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    4096,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    i64::MAX as u64,
    u64::MAX,
];

/// One random edit of `v` (`pool` for splices, `dict` for tokens).
fn mutate_once(
    rng: &mut SplitMix64,
    v: &mut Vec<u8>,
    pool: &[Vec<u8>],
    dict: &[&str],
    max_len: usize,
) {
    let len = v.len();
    match rng.below(12) {
        0 if len > 0 => {
            let i = rng.below(len);
            v[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            v[i] = rng.next_u64() as u8;
        }
        2 if len > 0 => {
            let i = rng.below(len);
            v[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
        }
        3 | 4 if len > 0 => {
            // An interesting integer (or the input's own length, ± 1) at a random position.
            let w = [1usize, 2, 4, 8][rng.below(4)];
            let value = match rng.below(4) {
                0 => (len as u64)
                    .wrapping_add(rng.below(3) as u64)
                    .wrapping_sub(1),
                _ => INTERESTING[rng.below(INTERESTING.len())],
            };
            let i = rng.below(len);
            let bytes = value.to_le_bytes();
            let n = w.min(len - i);
            v[i..i + n].copy_from_slice(&bytes[..n]);
        }
        5 if len >= 4 => {
            // Add a small delta to a u32 (length and offset fields).
            let i = rng.below(len - 3);
            let x = u32::from_le_bytes(v[i..i + 4].try_into().expect("4 bytes"));
            let d = rng.below(33) as u32;
            let x = if rng.below(2) == 0 {
                x.wrapping_add(d)
            } else {
                x.wrapping_sub(d)
            };
            v[i..i + 4].copy_from_slice(&x.to_le_bytes());
        }
        6 if len > 0 => {
            let i = rng.below(len);
            let n = 1 + rng.below(16.min(len - i));
            v.drain(i..i + n);
        }
        7 => {
            let i = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            v.splice(i..i, bytes);
        }
        8 if len > 1 => {
            // Copy a chunk elsewhere (repeats structure: entries, array elements).
            let a = rng.below(len);
            let n = 1 + rng.below(64.min(len - a));
            let chunk = v[a..a + n].to_vec();
            let b = rng.below(len + 1);
            if rng.below(2) == 0 {
                v.splice(b..b, chunk);
            } else {
                let m = n.min(len - b.min(len));
                v[b.min(len)..b.min(len) + m].copy_from_slice(&chunk[..m]);
            }
        }
        9 if !pool.is_empty() => {
            // Splice: our prefix, another input's suffix.
            let other = &pool[rng.below(pool.len())];
            let cut = rng.below(len + 1);
            let from = rng.below(other.len() + 1);
            v.truncate(cut);
            v.extend_from_slice(&other[from..]);
        }
        10 if !dict.is_empty() => {
            let token = dict[rng.below(dict.len())].as_bytes();
            let i = rng.below(len + 1);
            if rng.below(2) == 0 || len == 0 {
                v.splice(i..i, token.iter().copied());
            } else {
                let end = (i + token.len()).min(len);
                v.splice(i..end, token.iter().copied());
            }
        }
        _ if len > 0 => {
            let n = rng.below(len);
            if rng.below(2) == 0 {
                v.truncate(n);
            } else {
                v.resize(len + 1 + rng.below(64), 0);
            }
        }
        _ => v.push(rng.next_u64() as u8),
    }
    v.truncate(max_len);
}

/// What a run of one target found.
#[derive(Default)]
struct Report {
    execs: u64,
    outcomes: HashSet<String>,
    crash: Option<(PathBuf, String)>,
}

thread_local! {
    static PANIC_MESSAGE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Runs `target` on `input` with the input published for the allocation cap; a panic returns
/// its message.
fn execute(target: Target, input: &[u8]) -> Result<String, String> {
    CURRENT.store(input.as_ptr().cast_mut(), Ordering::Relaxed);
    CURRENT_LEN.store(input.len(), Ordering::Relaxed);
    let r = std::panic::catch_unwind(|| target(input));
    CURRENT_LEN.store(0, Ordering::Relaxed);
    r.map_err(|_| PANIC_MESSAGE.with(|m| m.borrow().clone()))
}

fn save_crash(dir: &Path, name: &str, input: &[u8]) -> PathBuf {
    let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{name}-crash-{hash:016x}"));
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(&path, input);
    path
}

fn load_dir(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter(|p| p.is_file())
        .filter_map(|p| std::fs::read(p).ok())
        .collect()
}

struct Options {
    seconds: f64,
    targets: Vec<String>,
    seed: u64,
    max_len: usize,
    corpus: PathBuf,
    crashes: PathBuf,
    write_seeds: bool,
    files: Vec<PathBuf>,
}

fn fuzz(name: &str, target: Target, o: &Options, rng: &mut SplitMix64) -> Report {
    let mut r = Report::default();
    *CRASH_FILE.lock().expect("crash path") = std::ffi::CString::new(
        o.crashes
            .join(format!("{name}-alloc"))
            .as_os_str()
            .as_encoded_bytes(),
    )
    .ok();
    let _ = std::fs::create_dir_all(&o.crashes);
    let mut pool: Vec<Vec<u8>> = seeds(name).into_iter().map(|(_, b)| b).collect();
    pool.extend(load_dir(&o.corpus.join(name)));
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    // Replay everything first: the corpus holds every past finding.
    for input in pool.clone() {
        r.execs += 1;
        match execute(target, &input) {
            Ok(outcome) => {
                r.outcomes.insert(outcome);
            }
            Err(msg) => {
                r.crash = Some((save_crash(&o.crashes, name, &input), msg));
                return r;
            }
        }
    }
    let dict = dictionary(name);
    let deadline = Instant::now() + Duration::from_secs_f64(o.seconds);
    while Instant::now() < deadline {
        for _ in 0..64 {
            let mut v = pool[rng.below(pool.len())].clone();
            for _ in 0..1 + rng.below(4) {
                mutate_once(rng, &mut v, &pool, dict, o.max_len);
            }
            r.execs += 1;
            match execute(target, &v) {
                Ok(outcome) => {
                    if r.outcomes.insert(outcome) && pool.len() < 4096 {
                        pool.push(v);
                    }
                }
                Err(msg) => {
                    r.crash = Some((save_crash(&o.crashes, name, &v), msg));
                    return r;
                }
            }
        }
    }
    r
}

fn parse_args() -> Result<Options, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut o = Options {
        seconds: 10.0,
        targets: Vec::new(),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1,
        max_len: 16384,
        corpus: root.join("corpus"),
        crashes: root.join("..").join("target").join("fuzz-crashes"),
        write_seeds: false,
        files: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{a} needs {what}"));
        match a.as_str() {
            "--seconds" => {
                o.seconds = value("a number")?
                    .parse()
                    .map_err(|e| format!("--seconds: {e}"))?;
            }
            "--target" => o.targets.push(value("a target name")?),
            "--seed" => {
                o.seed = value("a number")?
                    .parse::<u64>()
                    .map_err(|e| format!("--seed: {e}"))?
                    | 1;
            }
            "--max-len" => {
                o.max_len = value("a number")?
                    .parse()
                    .map_err(|e| format!("--max-len: {e}"))?;
            }
            "--corpus" => o.corpus = value("a folder")?.into(),
            "--crashes" => o.crashes = value("a folder")?.into(),
            "--write-seeds" => o.write_seeds = true,
            s if s.starts_with("--") => return Err(format!("unknown option {s}")),
            f => o.files.push(f.into()),
        }
    }
    for t in &o.targets {
        if !targets().iter().any(|(n, _)| n == t) {
            return Err(format!(
                "unknown target {t} (targets: {})",
                targets().iter().map(|t| t.0).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    Ok(o)
}

fn main() {
    let o = parse_args().unwrap_or_else(|e| {
        eprintln!("fuzz-stable: {e}");
        std::process::exit(2);
    });
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let loc = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| {
                info.payload()
                    .downcast_ref::<&str>()
                    .map(ToString::to_string)
            });
        PANIC_MESSAGE
            .with(|m| *m.borrow_mut() = format!("{}{loc}", msg.unwrap_or_else(|| "panic".into())));
        if std::env::var_os("FUZZ_STABLE_BACKTRACE").is_some() {
            default_hook(info);
        }
    }));
    let chosen: Vec<(&str, Target)> = targets()
        .into_iter()
        .filter(|(n, _)| o.targets.is_empty() || o.targets.iter().any(|t| t == n))
        .collect();
    if o.write_seeds {
        for (name, _) in &chosen {
            let dir = o.corpus.join(name);
            std::fs::create_dir_all(&dir).expect("corpus folder");
            for (file, bytes) in seeds(name) {
                std::fs::write(dir.join(file), bytes).expect("write seed");
            }
            let dict = dictionary(name);
            if !dict.is_empty() {
                let dicts = o.corpus.join("..").join("dicts");
                std::fs::create_dir_all(&dicts).expect("dict folder");
                let text: String = dict
                    .iter()
                    .map(|t| format!("\"{}\"\n", t.replace('\\', "\\\\").replace('"', "\\\"")))
                    .collect();
                std::fs::write(dicts.join(format!("{name}.dict")), text).expect("write dict");
            }
        }
        println!(
            "fuzz-stable: wrote the seeds of {} targets under {}",
            chosen.len(),
            o.corpus.display()
        );
        return;
    }
    if !o.files.is_empty() {
        let [(name, target)] = chosen.as_slice() else {
            eprintln!("fuzz-stable: replaying files needs exactly one --target");
            std::process::exit(2);
        };
        let mut failed = false;
        for f in &o.files {
            let input = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            match execute(*target, &input) {
                Ok(outcome) => println!("{name} {}: {outcome}", f.display()),
                Err(msg) => {
                    println!("{name} {}: PANIC {msg}", f.display());
                    failed = true;
                }
            }
        }
        std::process::exit(i32::from(failed));
    }
    println!(
        "fuzz-stable: seed {}, {} s per target, max input {} bytes",
        o.seed, o.seconds, o.max_len
    );
    let mut rng = SplitMix64::new(o.seed);
    let mut failed = false;
    for (name, target) in chosen {
        let start = Instant::now();
        let r = fuzz(name, target, &o, &mut rng);
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{name:<20} {:>10} execs {:>9.0} exec/s {:>5} outcomes {:>6.1} s  {}",
            r.execs,
            r.execs as f64 / secs,
            r.outcomes.len(),
            secs,
            if r.crash.is_some() { "FINDING" } else { "ok" }
        );
        if let Some((path, msg)) = r.crash {
            println!(
                "  panic: {msg}\n  input saved to {}\n  reproduce: fuzz-stable --target {name} {}",
                path.display(),
                path.display()
            );
            failed = true;
        }
    }
    std::process::exit(i32::from(failed));
}
