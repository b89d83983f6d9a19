//! `hostd plan` with the real binaries: a plan for every expert format with the commands to
//! run, the streaming rows' hit rates from expertd's planner, and the clear refusals: a wrong or
//! missing model path, too little memory (given, and a real cgroup smaller than hostd needs),
//! and a container directory on a read-only filesystem.

use crate::expertd_deploy::Cgroup;
use std::path::Path;
use std::process::Output;
use tests::{hostd, model_dir, workspace_bin};

const MIB: u64 = 1 << 20;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn plan_json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "plan --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            stderr(o)
        )
    })
}

fn tiny() -> String {
    model_dir("tiny").display().to_string()
}

/// `hostd plan TINY --container DIR --probe-bytes 64MiB EXTRA…`.
fn plan_tiny(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "plan".to_string(),
        tiny(),
        "--container".into(),
        dir.display().to_string(),
        "--probe-bytes".into(),
        "64MiB".into(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    hostd(&refs)
}

#[test]
fn a_plan_covers_every_format_and_says_what_to_run() {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path().join("c");
    let o = plan_tiny(&dir, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = plan_json(&o);
    let formats: Vec<&str> = v["formats"]
        .as_array()
        .expect("formats")
        .iter()
        .map(|f| f["format"].as_str().expect("name"))
        .collect();
    assert_eq!(formats, ["int8", "q4k", "q4k-q6k"]);
    // The tiny model fits resident on any test machine: INT8, the most exact format, wins.
    assert_eq!(v["recommended"], "int8");
    assert_eq!(v["formats"][0]["mode"], "resident");
    let point = v["formats"][0]["decode_tok_s"][0]["point"]
        .as_f64()
        .expect("tok/s");
    assert!(point > 0.0 && point.is_finite(), "{point}");
    let cmds: Vec<&str> = v["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .map(|c| c.as_str().expect("command"))
        .collect();
    assert_eq!(
        cmds[0],
        format!("expertd prepare {} --out {}", tiny(), dir.display())
    );
    assert!(
        cmds[1].starts_with(&format!(
            "hostd serve --model {} --dense int8 --experts int8 --container {}",
            tiny(),
            dir.display()
        )),
        "{cmds:?}"
    );
    assert!(cmds[2].starts_with("hostd bench"), "{cmds:?}");
    assert!(v["problems"].as_array().expect("problems").is_empty());
}

#[test]
fn before_the_download_a_22_gib_machine_holds_the_real_models_q4k_experts_and_streams_int8() {
    // The real Qwen3.6-35B-A3B config alone (--config-only): in 22 GiB the 30.3 GiB of INT8
    // experts and the 19.5 GiB of Q4_K/Q6_K ones stream, the 16.9 GiB of Q4_K experts stay
    // resident beside hostd's 3.5 GiB; the disk is probed with a scratch file in the container's
    // directory.
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path().join("c");
    let v = real_plan("22GiB", &dir);
    assert_eq!(v["machine"]["usable_bytes"].as_u64(), Some(22 << 30));
    assert!(
        v["machine"]["disk"]["gbps"].as_f64().expect("disk probed") > 0.0,
        "{v}"
    );
    assert!(
        std::fs::read_dir(work.path()).expect("work dir").count() == 0,
        "the scratch file was left behind"
    );
    let formats = v["formats"].as_array().expect("formats");
    assert_eq!(formats[0]["mode"], "streaming", "int8: {}", formats[0]);
    assert_eq!(formats[1]["mode"], "resident", "q4k: {}", formats[1]);
    assert_eq!(formats[2]["mode"], "streaming", "q4k-q6k: {}", formats[2]);
    for f in formats.iter().filter(|f| f["mode"] == "streaming") {
        let routings: Vec<&str> = f["hit_rates"]
            .as_array()
            .expect("hit rates")
            .iter()
            .map(|h| h["routing"].as_str().expect("routing"))
            .collect();
        assert_eq!(routings, ["no-locality", "trained"], "{f}");
        let share = f["cache_share"].as_f64().expect("share");
        let uniform = f["hit_rates"][0]["decode_hit_rate"].as_f64().expect("rate");
        let trained = f["hit_rates"][1]["decode_hit_rate"].as_f64().expect("rate");
        // Without locality no cache beats its share (by more than the replay's noise); a
        // trained model's routing does better than its share.
        assert!(
            (0.0..=share + 0.05).contains(&uniform),
            "{uniform} at share {share}"
        );
        assert!(
            trained > share && trained < 1.0,
            "{trained} at share {share}"
        );
        let t = &f["decode_tok_s"][0];
        assert!(
            t["low"].as_f64() <= t["point"].as_f64() && t["point"].as_f64() <= t["high"].as_f64(),
            "{t}"
        );
        // Streaming reads from the disk what the cache misses: slower than resident q4k.
        assert!(
            t["point"].as_f64() < formats[1]["decode_tok_s"][0]["point"].as_f64(),
            "{t}"
        );
    }
    // The most exact format that fits resident is recommended, with the command to serve it.
    assert_eq!(v["recommended"], "q4k");
    assert_eq!(
        v["commands"][0],
        format!(
            "expertd prepare {} --out {} --format q4k",
            real_config().parent().unwrap().display(),
            dir.display()
        )
    );
    let serve = v["commands"][1].as_str().expect("serve command");
    assert!(
        serve.contains(&format!(
            "--dense int8 --experts int8 --container {} --threads",
            dir.display()
        )),
        "{serve}"
    );
}

/// The real Qwen3.6-35B-A3B config.json (committed).
fn real_config() -> std::path::PathBuf {
    tests::workspace_root().join("tests/fixtures/configs/qwen3.6-35b-a3b.config.json")
}

/// `hostd plan --config-only REAL_CONFIG --container DIR --memory M --json`, which must succeed
/// but for too little disk room for the recommended container on this machine (checked).
fn real_plan(memory: &str, dir: &Path) -> serde_json::Value {
    let config = real_config();
    let o = hostd(&[
        "plan",
        "--config-only",
        config.to_str().expect("utf-8"),
        "--container",
        dir.to_str().expect("utf-8"),
        "--memory",
        memory,
        "--probe-bytes",
        "64MiB",
        "--json",
    ]);
    let v = plan_json(&o);
    if !o.status.success() {
        // The plan is about the machine the test runs on: a disk without room for the
        // recommended container is a true problem there (CI's /tmp had 16 GiB free), and the
        // rest of the plan still stands. Any other problem fails the test.
        let free = v["container"]["free_bytes"].as_u64();
        let problems = v["problems"].as_array().expect("problems");
        assert!(
            !problems.is_empty()
                && problems.iter().all(|p| {
                    p.as_str()
                        .is_some_and(|p| p.contains(" container needs ") && p.contains(" free; "))
                })
                && free.is_some(),
            "{}",
            stderr(&o)
        );
        let need = v["facts"]["formats"]
            .as_array()
            .expect("formats")
            .iter()
            .find(|f| f["format"] == v["recommended"])
            .and_then(|f| f["container_bytes"].as_u64())
            .expect("the recommended format's container size");
        assert!(free < Some(need), "{free:?} free, {need} needed: {v}");
    }
    v
}

#[test]
fn the_no_locality_hit_rate_is_zero_below_one_tokens_experts_and_near_the_share_above() {
    // 5.5 GiB leaves the INT8 cache 0.74 GiB: 250 slots, fewer than the 40 × 8 = 320 experts one
    // token routes, so LRU over routes without locality keeps nothing from token to token.
    let work = tempfile::tempdir().expect("tempdir");
    let small = real_plan("5.5GiB", &work.path().join("c"));
    let int8 = &small["formats"][0];
    let slots = int8["cache_bytes"].as_u64().expect("cache")
        / small["facts"]["formats"][0]["slot_bytes"]
            .as_u64()
            .expect("slot");
    assert!(slots < 320, "{slots} slots");
    assert_eq!(int8["hit_rates"][0]["routing"], "no-locality");
    assert_eq!(
        int8["hit_rates"][0]["decode_hit_rate"].as_f64(),
        Some(0.0),
        "{int8}"
    );
    // 10.8 GiB: a 6 GiB cache, 2,000 slots (20% of the experts): the rate approaches the share.
    let large = real_plan("10.8GiB", &work.path().join("c"));
    let int8 = &large["formats"][0];
    let share = int8["cache_share"].as_f64().expect("share");
    let hit = int8["hit_rates"][0]["decode_hit_rate"]
        .as_f64()
        .expect("rate");
    assert!(
        share > 0.15 && hit > share - 0.03 && hit <= share + 0.01,
        "{hit} at share {share}"
    );
    // The commands stream through a private expertd with the planned budget, checked cold.
    let rec = large["recommended"].as_str().expect("recommended");
    let f = large["formats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["format"] == rec)
        .unwrap();
    let flags = format!(
        "--experts expertd --container {}",
        large["container"]["dir"].as_str().unwrap()
    );
    let budget = format!("--expertd-cache-bytes {}", f["cache_bytes"]);
    let serve = large["commands"][1].as_str().unwrap();
    let bench = large["commands"][2].as_str().unwrap();
    assert!(serve.contains(&flags) && serve.contains(&budget), "{serve}");
    assert!(
        bench.contains(" --cold ") && bench.contains(&flags) && bench.contains(&budget),
        "{bench}"
    );
}

#[test]
fn a_wrong_or_missing_model_path_is_named() {
    let o = hostd(&["plan", "/nonexistent/model"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("/nonexistent/model is not a checkpoint hostd can run")
            && e.contains("No such file"),
        "{e}"
    );
    let empty = tempfile::tempdir().expect("tempdir");
    let o = hostd(&["plan", empty.path().to_str().expect("utf-8")]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn too_little_memory_is_refused_with_what_hostd_needs() {
    let o = hostd(&[
        "plan",
        &tiny(),
        "--memory",
        "512MiB",
        "--probe-bytes",
        "64MiB",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("nothing fits in 512.0 MiB: hostd alone needs"),
        "{e}"
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("recommended: nothing runs here"));
}

#[test]
fn in_a_cgroup_smaller_than_the_dense_weights_the_plan_names_the_limit() {
    // The real model's INT8 dense weights are 1.83 GiB; the cgroup allows 600 MiB.
    let cg = match Cgroup::make(
        &format!("sluice-test-plan-{}", std::process::id()),
        600 * MIB,
    ) {
        Ok(cg) => cg,
        Err(why) => {
            shared::skip::skip(
                "cgroup",
                "the plan-in-a-cgroup test",
                &format!(
                    "cannot make a memory cgroup here ({why}; it needs root and a writable cgroup hierarchy)"
                ),
            );
            return;
        }
    };
    let work = tempfile::tempdir().expect("tempdir");
    let o = cg
        .command(&workspace_bin("hostd"))
        .args(["plan", "--config-only"])
        .arg(real_config())
        .arg("--container")
        .arg(work.path().join("c"))
        .args(["--probe-bytes", "64MiB"])
        .output()
        .expect("spawn hostd plan");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("(less than the INT8 dense weights alone, 1.83 GiB)")
            && e.contains("this process's cgroup allows 600.0 MiB in all: raise its memory limit"),
        "{e}"
    );
}

/// A read-only tmpfs mounted at a fresh directory, unmounted when dropped.
struct ReadOnlyMount(tempfile::TempDir);

impl ReadOnlyMount {
    fn make() -> Result<ReadOnlyMount, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let o = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if o.status.success() {
            Ok(ReadOnlyMount(dir))
        } else {
            Err(String::from_utf8_lossy(&o.stderr).trim().to_string())
        }
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_container_directory_on_a_read_only_disk_is_refused_with_the_reason() {
    let ro = match ReadOnlyMount::make() {
        Ok(m) => m,
        Err(why) => {
            shared::skip::skip(
                "mount",
                "the read-only container directory test",
                &format!("cannot mount a read-only tmpfs here ({why})"),
            );
            return;
        }
    };
    let dir = ro.path().join("experts");
    let o = plan_tiny(&dir, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "the int8 container cannot be written to {}",
            dir.display()
        )) && e.contains("read-only filesystem")
            && e.contains("pass --container DIR on a writable disk"),
        "{e}"
    );
}
