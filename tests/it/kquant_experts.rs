//! 4-bit expert containers end to end (`expertd prepare --format q4k | q4k-q6k`, container v2):
//! `hostd eval` writes byte-equal logits in process, through expertd's ring and through the
//! `MoeLayer` RPC, at a budget that evicts every step and at one that holds everything; the
//! daemon's handshake names the format; `expertd verify --deep` checks the blocks. (At these
//! tiny widths the 256-weight blocks are mostly zero padding, so the blobs are larger than
//! INT8's; the real shapes' sizes are unit-tested in `shared::container`.)

use super::expertd::{Daemon, blob_stride, container_bytes, eval, prompts_file};
use shared::container::{CONTAINER_FILE, ContainerFile, PARTIAL_FILE};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tests::{model_dir, prepare_container_as, workspace_bin};

#[test]
fn kquant_containers_stream_and_reside_bit_identically_in_process_and_through_expertd() {
    for (preset, format) in [("tiny", "q4k"), ("small", "q4k-q6k")] {
        let work = tempfile::tempdir().expect("tempdir");
        let container = work.path().join(format);
        prepare_container_as(&model_dir(preset), &container, format);
        let int8 = work.path().join("int8");
        prepare_container_as(&model_dir(preset), &int8, "int8");
        let verify = Command::new(workspace_bin("expertd"))
            .args(["verify", "--deep"])
            .arg(&container)
            .arg("--model")
            .arg(model_dir(preset))
            .output()
            .expect("spawn expertd verify");
        let text = String::from_utf8_lossy(&verify.stdout).to_string()
            + &String::from_utf8_lossy(&verify.stderr);
        assert!(verify.status.success(), "{text}");
        assert!(
            text.contains("format v2") && text.contains(format),
            "{text}"
        );

        let prompts = prompts_file(preset, work.path(), 1);
        let c = container.to_str().expect("utf-8");
        let local = eval(
            preset,
            &prompts,
            work.path(),
            "in-process",
            &["--experts", "int8", "--container", c],
        );
        let i8c = int8.to_str().expect("utf-8");
        let int8_out = eval(
            preset,
            &prompts,
            work.path(),
            "int8",
            &["--experts", "int8", "--container", i8c],
        );
        assert_ne!(local, int8_out, "{format}: the 4-bit experts were used");
        for (tag, budget) in [
            ("tiny budget", 2 * blob_stride(&container)),
            ("full budget", container_bytes(&container)),
        ] {
            let d = Daemon::unix(&container, budget, &[]);
            let log = d.log_text();
            assert!(log.contains(&format!("expert_format={format}")), "{log}");
            let ring = eval(
                preset,
                &prompts,
                work.path(),
                "ring",
                &["--expertd", &d.uri()],
            );
            assert_eq!(ring, local, "{preset} {format} {tag}: ring vs in-process");
            let rpc = eval(
                preset,
                &prompts,
                work.path(),
                "rpc",
                &["--expertd", &d.uri(), "--expertd-no-ring"],
            );
            assert_eq!(rpc, local, "{preset} {format} {tag}: RPC vs in-process");
        }
    }
}

#[test]
fn an_interrupted_q4k_prepare_is_not_wiped_by_another_format_and_resumes_byte_identically() {
    let model = model_dir("small");
    let work = tempfile::tempdir().expect("tempdir");
    let reference = work.path().join("ref");
    prepare_container_as(&model, &reference, "q4k");
    let want = std::fs::read(reference.join(CONTAINER_FILE)).expect("reference");
    let out = work.path().join("c");
    let partial = out.join(PARTIAL_FILE);
    let mut child = Command::new(workspace_bin("expertd"))
        .arg("prepare")
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .args(["--format", "q4k", "--throttle-ms", "40"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn expertd");
    // Kill it once a few blobs are written (the unfinished header is first, then blobs).
    let first_blob_trailer = {
        let c = ContainerFile::open(&reference).expect("reference opens");
        let l = c.header().layout;
        (l.blob_offset_at(2) + l.blob.checksum_offset as u64) as usize
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read(&partial).ok().is_none_or(|b| {
        b.len() < want.len() || b[first_blob_trailer..][..8] != want[first_blob_trailer..][..8]
    }) {
        assert!(Instant::now() < deadline, "prepare never wrote blob 2");
        assert!(
            child.try_wait().expect("poll").is_none(),
            "prepare finished too soon"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let before = std::fs::read(&partial).expect("partial");
    let o = Command::new(workspace_bin("expertd"))
        .arg("prepare")
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .args(["--format", "int8"])
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("format q4k, not int8"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&partial).expect("partial kept"),
        before,
        "partial untouched"
    );
    prepare_container_as(&model, &out, "q4k");
    assert!(
        std::fs::read(out.join(CONTAINER_FILE)).expect("final") == want,
        "a resumed q4k prepare writes the uninterrupted run's bytes"
    );
}

#[test]
fn prepare_refuses_to_mix_formats_in_one_directory() {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path().join("c");
    prepare_container_as(&model_dir("tiny"), &dir, "q4k");
    let o = Command::new(workspace_bin("expertd"))
        .arg("prepare")
        .arg(model_dir("tiny"))
        .arg("--out")
        .arg(&dir)
        .args(["--format", "int8"])
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("format q4k, not int8"), "{err}");
    // The same format again is up to date.
    prepare_container_as(&model_dir("tiny"), &dir, "q4k");
    // --help lists the formats as possible values.
    let help = Command::new(workspace_bin("expertd"))
        .args(["prepare", "--help"])
        .output()
        .expect("spawn");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("int8") && help.contains("q4k") && help.contains("q4k-q6k"),
        "{help}"
    );
}
