//! What a new user meets in the first hour, with the real binaries: errors that say each cause
//! once and name the wrong directory, a cache budget that holds no expert refused, a daemon
//! log that is plain text with one key per field and says resident or streaming, a private
//! daemon whose budget hostd prints, `hostd serve` saying loading then ready, and honest
//! `--help`/`--version`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tests::{Killed, Spawned, copy_model, hostd, model_dir, work_with_container, workspace_bin};

/// Runs `expertd ARGS…`, which must exit within 30 s (a daemon that starts serving where it
/// should have refused is killed and fails the test instead of hanging it).
fn expertd(args: &[&str]) -> Output {
    let mut cmd = Command::new(workspace_bin("expertd"));
    cmd.args(args);
    output_within(cmd, 30)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn an_error_says_each_cause_once() {
    let dir = copy_model(&model_dir("tiny"));
    let config = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).expect("config")).expect("json");
    v["model_type"] = "llama".into();
    std::fs::write(&config, v.to_string()).expect("write config");
    let o = hostd(&["inspect", dir.path().to_str().expect("utf-8")]);
    assert!(!o.status.success());
    assert_eq!(
        stderr(&o).matches("unsupported model_type").count(),
        1,
        "{}",
        stderr(&o)
    );

    let o = expertd(&[
        "serve",
        "--container",
        "/nonexistent/container",
        "--socket",
        "/nonexistent/s.sock",
        "--cache-bytes",
        "1000000",
    ]);
    assert!(!o.status.success());
    assert_eq!(
        stderr(&o).matches("no expert container at").count(),
        1,
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_missing_model_directory_is_named_as_such() {
    let runs: [&[&str]; 4] = [
        &["run", "--model", "/nonexistent/model", "--prompt", "hi"],
        &["serve", "--model", "/nonexistent/model", "--port", "0"],
        &[
            "eval",
            "--model",
            "/nonexistent/model",
            "--prompts",
            "/nonexistent/prompts.json",
            "--new-tokens",
            "1",
            "--out",
            "/nonexistent/out.json",
        ],
        &["inspect", "/nonexistent/model"],
    ];
    for args in runs {
        let o = hostd(args);
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains("/nonexistent/model: No such file or directory"),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("tokenizer") && !err.contains("config.json"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_cache_budget_that_holds_no_expert_is_refused() {
    let (work, container) = work_with_container("tiny");
    let socket = work.path().join("s.sock");
    // Given and as read (size flags take units: 1KiB is 1024 bytes).
    for (budget, bytes) in [("0", "0"), ("1000", "1000"), ("1KiB", "1024")] {
        let o = expertd(&[
            "serve",
            "--container",
            container.to_str().expect("utf-8"),
            "--socket",
            socket.to_str().expect("utf-8"),
            "--cache-bytes",
            budget,
        ]);
        assert!(
            !o.status.success(),
            "--cache-bytes {budget} must be refused"
        );
        assert!(
            stderr(&o).contains(&format!(
                "--cache-bytes {bytes} holds no expert: one expert blob is "
            )),
            "{}",
            stderr(&o)
        );
        assert!(!socket.exists());
    }
}

/// Starts `expertd serve` with its log redirected to a file, waits for the start-up lines,
/// stops it and returns the log.
fn daemon_log(container: &Path, budget: u64) -> String {
    let work = tempfile::tempdir().expect("tempdir");
    let log = work.path().join("expertd.log");
    let socket = work.path().join("s.sock");
    let mut daemon = Spawned::spawn(
        Command::new(workspace_bin("expertd"))
            .args([
                "serve",
                "--container",
                container.to_str().expect("utf-8"),
                "--socket",
                socket.to_str().expect("utf-8"),
            ])
            .args(["--cache-bytes", &budget.to_string()])
            .env_remove("RUST_LOG"),
        &log,
    );
    daemon.wait_ready(Duration::from_secs(30), |log| {
        log.contains("compute and IO")
    });
    drop(daemon);
    std::fs::read_to_string(&log).expect("log")
}

#[test]
fn a_redirected_daemon_log_is_plain_and_says_resident_or_streaming() {
    let (_work, container) = work_with_container("tiny");
    let whole = std::fs::metadata(container.join(shared::container::CONTAINER_FILE))
        .expect("container")
        .len();

    let log = daemon_log(&container, whole);
    assert!(
        !log.contains('\u{1b}'),
        "no ANSI colour in a redirected log: {log:?}"
    );
    assert!(!log.contains("io=io="), "{log}");
    for line in log.lines() {
        assert!(line.len() < 400, "start-up lines stay short: {line}");
    }
    assert!(log.contains("cache=resident: "), "{log}");
    assert!(daemon_log(&container, whole / 4).contains("cache=streaming: "));
}

#[test]
fn a_private_daemon_says_its_budget() {
    let work = tempfile::tempdir().expect("tempdir");
    let container = work.path().join("container");
    let model = model_dir("tiny");
    let o = hostd(&[
        "run",
        "--model",
        model.to_str().expect("utf-8"),
        "--experts",
        "expertd",
        "--container",
        container.to_str().expect("utf-8"),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The tiny container fits in any machine's free memory: the default keeps it resident.
    assert!(
        stderr(&o).contains("hostd: private expertd cache: resident: "),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("(default: "), "{}", stderr(&o));

    let o = hostd(&[
        "run",
        "--model",
        model.to_str().expect("utf-8"),
        "--experts",
        "expertd",
        "--container",
        container.to_str().expect("utf-8"),
        "--expertd-cache-bytes",
        "65536",
        "--prompt",
        "hi",
        "--max-new-tokens",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("hostd: private expertd cache: streaming: ")
            && stderr(&o).contains("set by --expertd-cache-bytes"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn serve_says_loading_then_ready() {
    let mut child = Killed(
        Command::new(workspace_bin("hostd"))
            .args([
                "serve",
                "--model",
                model_dir("tiny").to_str().expect("utf-8"),
                "--port",
                "0",
                "--threads",
                "2",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn hostd serve"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while lines.len() < 3 {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    assert_eq!(lines.len(), 3, "{lines:?}");
    let addr = lines[0]
        .strip_prefix("hostd serve: listening on http://")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(lines[1].starts_with("hostd serve: loading "), "{lines:?}");
    assert!(lines[2].starts_with("hostd serve: ready "), "{lines:?}");
    // Ready means ready: /health answers 200 at once.
    assert_eq!(health_status(addr), 200);
    drop(child);
}

/// The HTTP status of `GET /health` at `addr`.
fn health_status(addr: &str) -> u16 {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .new_agent();
    agent
        .get(format!("http://{addr}/health"))
        .call()
        .expect("GET /health")
        .status()
        .as_u16()
}

#[test]
fn help_and_version_describe_the_binaries_as_they_are() {
    for bin in ["hostd", "expertd"] {
        let help = Command::new(workspace_bin(bin))
            .arg("--help")
            .output()
            .expect("help");
        let text = String::from_utf8_lossy(&help.stdout);
        assert!(
            help.status.success() && !text.contains("later"),
            "{bin} --help: {text}"
        );
        let v = Command::new(workspace_bin(bin))
            .arg("--version")
            .output()
            .expect("version");
        assert_eq!(
            String::from_utf8_lossy(&v.stdout).trim(),
            format!("{bin} {}", env!("CARGO_PKG_VERSION"))
        );
        assert_ne!(env!("CARGO_PKG_VERSION"), "0.0.0");
    }
}

/// Runs `cmd`, which must exit within `secs`; else it is killed and the test fails with its
/// stderr.
fn output_within(mut cmd: Command, secs: u64) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{cmd:?} did not exit within {secs} s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

#[test]
fn size_flags_take_units() {
    // expertd reads `--cache-bytes 1KiB` as 1024: see a_cache_budget_that_holds_no_expert_is_refused.
    let o = hostd(&["serve", "--model", "x", "--state-cache-bytes", "2XB"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("`2XB`") && stderr(&o).contains("16GiB"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_missing_daemon_is_announced_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let uri = format!("unix://{}", dir.path().join("none.sock").display());
    let mut child = Killed(
        Command::new(workspace_bin("hostd"))
            .args(["run", "--model", model_dir("tiny").to_str().expect("utf-8")])
            .args(["--expertd", &uri, "--prompt", "hi", "--max-new-tokens", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hostd"),
    );
    let err = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("waiting up to 30 s for expertd at ") => {
                assert!(line.contains("there is no socket file at"), "{line}");
                assert!(
                    line.contains("expertd serve --container DIR --socket"),
                    "{line}"
                );
                break;
            }
            Ok(line) => seen.push(line),
            Err(_) => panic!("no waiting notice within 10 s; stderr so far: {seen:?}"),
        }
    }
}

#[test]
fn a_socket_uri_with_two_slashes_is_refused_at_once() {
    let mut cmd = Command::new(workspace_bin("hostd"));
    cmd.args(["run", "--model", model_dir("tiny").to_str().expect("utf-8")])
        .args(["--expertd", "unix://tmp/x.sock", "--prompt", "hi"]);
    let o = output_within(cmd, 10);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("did you mean unix:///tmp/x.sock?"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_missing_container_says_how_to_make_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("experts");
    let missing = missing.to_str().expect("utf-8");
    let mut cmd = Command::new(workspace_bin("hostd"));
    cmd.args(["run", "--model", model_dir("tiny").to_str().expect("utf-8")])
        .args([
            "--experts",
            "int8",
            "--container",
            missing,
            "--prompt",
            "hi",
        ]);
    let o = output_within(cmd, 30);
    let want = format!("make one with `expertd prepare MODEL_DIR --out {missing}`");
    assert!(
        !o.status.success() && stderr(&o).contains(&want),
        "{}",
        stderr(&o)
    );
    std::fs::create_dir(missing).expect("mkdir");
    let socket = dir.path().join("s.sock");
    let o = expertd(&[
        "serve",
        "--container",
        missing,
        "--socket",
        socket.to_str().expect("utf-8"),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains(&want),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_container_of_another_model_leads_with_the_reason() {
    let (_work, container) = work_with_container("tiny");
    let mut cmd = Command::new(workspace_bin("hostd"));
    cmd.args([
        "run",
        "--model",
        model_dir("small").to_str().expect("utf-8"),
    ])
    .args(["--experts", "int8", "--container"])
    .arg(&container)
    .args(["--prompt", "hi"]);
    let o = output_within(cmd, 60);
    let err = stderr(&o);
    assert!(!o.status.success());
    let reason = err
        .find("prepared from a different model than")
        .expect(&err);
    let fix = err
        .find("make one for it with `expertd prepare")
        .expect(&err);
    // No hex digest before the fix, and none longer than 12 digits anywhere.
    let hex_run = |s: &str| {
        s.split(|c: char| !c.is_ascii_hexdigit())
            .map(str::len)
            .max()
            .unwrap_or(0)
    };
    assert!(reason < fix && hex_run(&err[..fix]) < 12, "{err}");
    assert!(hex_run(&err) <= 12, "{err}");
}

/// A directory's `NAME.tmp-*` entries.
fn partials(parent: &Path, name: &str) -> Vec<String> {
    std::fs::read_dir(parent)
        .expect("read_dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("{name}.tmp-")))
        .collect()
}

/// Starts a realdim synth into `out` and waits until its partial directory holds shard bytes.
fn synth_under_way(out: &Path) -> Killed {
    let child = Killed(
        Command::new(workspace_bin("hostd"))
            .args(["synth", "--preset", "realdim", "--layers", "4", "--out"])
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn synth"),
    );
    let tmp = out.with_file_name(format!("m.tmp-{}", child.id()));
    tests::wait_for(
        "the synth's first shard bytes",
        Duration::from_secs(30),
        || {
            std::fs::read_dir(&tmp).is_ok_and(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.metadata().is_ok_and(|m| m.len() > (1 << 20)))
            })
        },
    );
    child
}

#[test]
fn an_interrupted_synth_leaves_no_partial_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("m");
    let mut child = synth_under_way(&out);
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    assert!(status.is_ok_and(|s| s.success()));
    let err = child.stderr.take().expect("stderr");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "Ctrl-C exit status");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut BufReader::new(err), &mut text).expect("stderr");
    assert!(
        text.contains("interrupted; removed the partial checkpoint"),
        "{text}"
    );
    assert!(partials(dir.path(), "m").is_empty() && !out.exists());

    // A synth killed outright cannot clean up; the next one removes what it left, and says so.
    let mut child = synth_under_way(&out);
    child.kill().expect("kill");
    child.wait().expect("wait");
    assert_eq!(partials(dir.path(), "m").len(), 1);
    let o = hostd(&[
        "synth",
        "--preset",
        "tiny",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("left by an interrupted synth"),
        "{}",
        stderr(&o)
    );
    assert!(partials(dir.path(), "m").is_empty() && out.join("config.json").exists());
}

#[test]
fn missing_system_packages_are_named_before_anything_compiles() {
    // A PATH with everything scripts/prereqs looks for except systemd-analyze.
    let bin = tempfile::tempdir().expect("tempdir");
    for tool in [
        "bash",
        "python3",
        "cc",
        "c++",
        "openssl",
        "systemd-socket-activate",
    ] {
        if let Ok(o) = Command::new("bash")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            && o.status.success()
        {
            let path = String::from_utf8_lossy(&o.stdout).trim().to_string();
            std::os::unix::fs::symlink(path, bin.path().join(tool)).expect("symlink");
        }
    }
    let script = tests::workspace_root().join("scripts/prereqs");
    let mut cmd = Command::new(bin.path().join("bash"));
    cmd.arg(&script).arg("test").env("PATH", bin.path());
    let o = output_within(cmd, 10);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("apt-get install -y") && stderr(&o).contains("systemd"),
        "{}",
        stderr(&o)
    );
}
