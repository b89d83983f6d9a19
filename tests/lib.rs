//! Helpers for sluice's end-to-end tests: fixture paths, the oracle's reference files, the
//! `hostd` binary, safetensors rewriting used to build broken or re-laid-out checkpoints, the
//! one harness for daemons run as subprocesses ([`Spawned`], [`wait_for`]), expertd run in this
//! process on a temporary socket ([`InProcessDaemon`]), GGUF files rewritten with a change
//! ([`rewrite_gguf`]), and the Python that parses Prometheus
//! text ([`python`], [`parse_prometheus_text`]).

mod gguf_rewrite;
mod in_process;

pub use gguf_rewrite::{GgufEdit, llamacpp_tiny_gguf, rewrite_gguf};
pub use in_process::{InProcessDaemon, Transport};

use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The workspace root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Oracle presets with committed fixtures, sorted.
pub fn presets() -> Vec<String> {
    let dir = workspace_root().join("tests/fixtures/models");
    let mut out: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .filter(|e| e.path().join("config.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    assert!(
        out.len() >= 3,
        "expected at least three oracle presets in {}",
        dir.display()
    );
    out
}

/// Directory of one preset's checkpoint.
pub fn model_dir(preset: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/models").join(preset)
}

/// The oracle's reference JSON for one preset.
pub fn reference(preset: &str) -> serde_json::Value {
    let path = workspace_root()
        .join("tests/fixtures/reference")
        .join(format!("{preset}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `addr=HOST:PORT` field of the first log line that contains `marker`: a daemon told to
/// listen on port 0 logs the address it bound (expertd's "listening on TCP" and "metrics on
/// http://…" lines), which is how a test learns its port without racing other tests for one.
pub fn logged_addr(log: &str, marker: &str) -> Option<std::net::SocketAddr> {
    log.lines().filter(|l| l.contains(marker)).find_map(|l| {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix("addr="))
            .and_then(|a| a.parse().ok())
    })
}

/// Path of a workspace binary built alongside the test executable (`target/<profile>/NAME`).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/it-<hash> → target/<profile>/NAME
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} not built; run the tests through `cargo test --workspace`",
        bin.display()
    );
    bin
}

/// The Python with prometheus_client: `$SLUICE_VENV` or target/venv (scripts/pyenv), else
/// python3 on PATH.
pub fn python() -> PathBuf {
    let venv = std::env::var_os("SLUICE_VENV")
        .map_or_else(|| workspace_root().join("target/venv"), PathBuf::from);
    let p = venv.join("bin/python3");
    if p.is_file() {
        p
    } else {
        PathBuf::from("python3")
    }
}

/// Parses Prometheus text with prometheus_client's standard parser (`tests/deploy/parse_metrics.py`)
/// and returns its families (`[{"name", "type", "samples": [[name, labels, value], …]}, …]`);
/// panics, with the parser's error, on text it refuses.
pub fn parse_prometheus_text(text: &str) -> Vec<serde_json::Value> {
    use std::io::Write;
    let py = python();
    let mut child = Command::new(&py)
        .arg(workspace_root().join("tests/deploy/parse_metrics.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (scripts/pyenv makes target/venv with prometheus_client): {e}",
                py.display()
            )
        });
    // The script reads all of stdin before it writes; dropping the pipe ends its input.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write metrics to the parser");
    let out = child.wait_with_output().expect("wait for the parser");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("No module named 'prometheus_client'"),
        "{} lacks prometheus_client: run scripts/pyenv",
        py.display()
    );
    assert!(
        out.status.success(),
        "prometheus_client's parser refused the text: {err}\n{text}"
    );
    serde_json::from_slice(&out.stdout).expect("families as JSON")
}

/// Runs `hostd ARGS…` and returns its output.
pub fn hostd(args: &[&str]) -> Output {
    Command::new(workspace_bin("hostd"))
        .args(args)
        .output()
        .expect("spawn hostd")
}

/// Copies every file of `src` (flat directory) into a fresh temporary directory.
pub fn copy_model(src: &Path) -> tempfile::TempDir {
    let dst = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(src).expect("read fixture dir") {
        let entry = entry.expect("dir entry");
        if entry.path().is_file() {
            std::fs::copy(entry.path(), dst.path().join(entry.file_name()))
                .expect("copy fixture file");
        }
    }
    dst
}

/// An owned tensor for rewriting shards.
#[derive(Clone, Debug)]
pub struct OwnedTensor {
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Raw little-endian bytes.
    pub data: Vec<u8>,
}

impl safetensors::View for &OwnedTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Reads every tensor of a shard (test-sized files only).
pub fn read_shard(path: &Path) -> BTreeMap<String, OwnedTensor> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    st.iter()
        .map(|(name, view)| {
            (
                name.to_string(),
                OwnedTensor {
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    data: view.data().to_vec(),
                },
            )
        })
        .collect()
}

/// Writes tensors as one safetensors file.
pub fn write_shard(path: &Path, tensors: &BTreeMap<String, OwnedTensor>) {
    safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n.clone(), t)), None, path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Writes `model.safetensors.index.json` for `weight_map` (tensor → shard file name).
pub fn write_index(dir: &Path, weight_map: &BTreeMap<String, String>) {
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index).expect("json"),
    )
    .expect("write index");
}

/// Reads `model.safetensors.index.json`'s weight map.
pub fn read_index(dir: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(dir.join("model.safetensors.index.json")).expect("index");
    let v: serde_json::Value = serde_json::from_str(&text).expect("index json");
    serde_json::from_value(v["weight_map"].clone()).expect("weight_map")
}

/// Rewrites the shard holding `tensor` with `edit` applied to that tensor (`None` removes it),
/// keeping the index consistent. Returns the shard's file name.
pub fn edit_tensor(
    dir: &Path,
    tensor: &str,
    edit: impl FnOnce(OwnedTensor) -> Option<OwnedTensor>,
) -> String {
    let mut index = read_index(dir);
    let shard = index
        .get(tensor)
        .unwrap_or_else(|| panic!("{tensor} not in index"))
        .clone();
    let path = dir.join(&shard);
    let mut tensors = read_shard(&path);
    let t = tensors.remove(tensor).expect("tensor in shard");
    match edit(t) {
        Some(t) => {
            tensors.insert(tensor.to_string(), t);
        }
        None => {
            index.remove(tensor);
        }
    }
    write_shard(&path, &tensors);
    write_index(dir, &index);
    shard
}

/// Reads a `{"path", "offset", "shape"}` logits block written beside `base_dir`'s JSON.
pub fn read_logits(base_dir: &Path, block: &serde_json::Value) -> Vec<f32> {
    let path = base_dir.join(block["path"].as_str().expect("logits path"));
    let offset = block["offset"].as_u64().expect("offset") as usize;
    let count: usize = block["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .product();
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes[offset..offset + count * 4]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Directory of the oracle's reference files.
pub fn reference_dir() -> PathBuf {
    workspace_root().join("tests/fixtures/reference")
}

/// Largest absolute element-wise difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `expertd prepare MODEL --out OUT` (the built binary) and panics with its output on failure.
pub fn prepare_container(model: &Path, out: &Path) {
    prepare_container_as(model, out, "int8");
}

/// `expertd prepare MODEL --out OUT --format FORMAT` (`int8`, `q4k`, `q4k-q6k`), which must
/// succeed.
pub fn prepare_container_as(model: &Path, out: &Path, format: &str) {
    let o = Command::new(workspace_bin("expertd"))
        .args([
            "prepare",
            model.to_str().expect("utf-8 path"),
            "--out",
            out.to_str().expect("utf-8 path"),
            "--format",
            format,
        ])
        .output()
        .expect("spawn expertd");
    assert!(
        o.status.success(),
        "expertd prepare failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A fresh work directory with `preset`'s INT8 container prepared at `WORK/container`.
pub fn work_with_container(preset: &str) -> (tempfile::TempDir, PathBuf) {
    let work = tempfile::tempdir().expect("tempdir");
    let container = work.path().join("container");
    prepare_container(&model_dir(preset), &container);
    (work, container)
}

/// Flips one bit (`^= 0x40`) at `at` bytes into each of the container's blobs `blobs` (index
/// positions: layer × experts + expert) in `container`'s file, so that each fails its checksum.
pub fn corrupt_blobs(container: &Path, blobs: &[usize], at: u64) {
    let offsets: Vec<u64> = {
        let c = shared::container::ContainerFile::open(container).expect("container");
        blobs.iter().map(|&i| c.index()[i].offset).collect()
    };
    let file = container.join(shared::container::CONTAINER_FILE);
    let mut bytes = std::fs::read(&file).expect("read the container");
    for offset in offsets {
        bytes[(offset + at) as usize] ^= 0x40;
    }
    std::fs::write(&file, bytes).expect("write the container");
}

/// Polls `ok` every 10 ms until it holds; panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `kill -SIG` to `pid` and asserts that it was delivered. For `STOP`, also waits until
/// every thread of the process is stopped: kill(2) returns before a multi-threaded process has
/// stopped (one thread is woken to start the group stop; under load the others may run on for
/// a while, e.g. a daemon's ring worker serving one more call).
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{sig} failed");
    if sig == "STOP" {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !all_threads_stopped(pid) {
            assert!(
                Instant::now() < deadline,
                "process {pid} did not stop within 10 s of SIGSTOP"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Whether every thread of process `pid` is in the stopped state (`T` in /proc/PID/task/*/stat).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        // The state is the first field after the parenthesised command name.
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "T")
    })
}

/// A child process killed (SIGKILL) and reaped when dropped, also when a test panics; derefs
/// to the [`Child`].
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Killed {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// A daemon run as a subprocess (`expertd serve`, …), its stderr in a log file; killed
/// (SIGKILL) and reaped when dropped unless stopped first. Every test that spawns a daemon and
/// waits for it goes through this.
pub struct Spawned {
    child: Killed,
    log: PathBuf,
    _log_dir: Option<tempfile::TempDir>,
}

impl Spawned {
    /// Spawns `cmd` with stdin and stdout null and stderr written to `log`.
    pub fn spawn(cmd: &mut Command, log: &Path) -> Spawned {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        Spawned {
            child: Killed(child),
            log: log.to_path_buf(),
            _log_dir: None,
        }
    }

    /// [`Spawned::spawn`] with the log in a temporary directory of its own.
    pub fn spawn_logged(cmd: &mut Command) -> Spawned {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Spawned::spawn(cmd, &dir.path().join("daemon.log"));
        s._log_dir = Some(dir);
        s
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the log if the process has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("daemon exited ({status}): {}", self.log_text());
        }
    }

    /// Waits (at most `limit`) until `ready`, given the log so far, holds; panics with the log
    /// if the process exits first or the time runs out.
    pub fn wait_ready(&mut self, limit: Duration, mut ready: impl FnMut(&str) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            self.assert_running();
            if ready(&self.log_text()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "daemon not ready within {limit:?}: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `kill -SIG`.
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Waits (at most `limit`) for the process to exit and returns its status.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "process {} did not exit within {limit:?}: {}",
                self.child.id(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit status (at most 10 s: the daemon drains and exits on its own).
    pub fn stop(mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit(Duration::from_secs(10))
    }
}

/// Re-saves a fused checkpoint with per-expert tensors (what transformers v5 writes), each
/// expert's tensors in the shard that held its layer's fused tensor.
pub fn split_experts(dir: &Path) {
    let mut index = read_index(dir);
    let shards: Vec<String> = index
        .values()
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for shard in shards {
        let path = dir.join(&shard);
        let mut out = BTreeMap::new();
        for (name, t) in read_shard(&path) {
            let Some(stem) = name
                .strip_suffix(".mlp.experts.gate_up_proj")
                .or(name.strip_suffix(".mlp.experts.down_proj"))
            else {
                out.insert(name, t);
                continue;
            };
            index.remove(&name);
            let (n_experts, rows, cols) = (t.shape[0], t.shape[1], t.shape[2]);
            let per_expert = t.data.len() / n_experts;
            for e in 0..n_experts {
                let block = &t.data[e * per_expert..(e + 1) * per_expert];
                let mut put = |proj: &str, bytes: &[u8], r: usize| {
                    let n = format!("{stem}.mlp.experts.{e}.{proj}.weight");
                    index.insert(n.clone(), shard.clone());
                    out.insert(
                        n,
                        OwnedTensor {
                            dtype: t.dtype,
                            shape: vec![r, cols],
                            data: bytes.to_vec(),
                        },
                    );
                };
                if name.ends_with("gate_up_proj") {
                    let half = block.len() / 2;
                    put("gate_proj", &block[..half], rows / 2);
                    put("up_proj", &block[half..], rows / 2);
                } else {
                    put("down_proj", block, rows);
                }
            }
        }
        write_shard(&path, &out);
    }
    write_index(dir, &index);
}
