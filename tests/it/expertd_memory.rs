//! Clients that try to make expertd hold memory (issue 37, item 2), against the real binary in a
//! 256 MiB memory cgroup with its cache budget derived from the limit: a legal-looking call of
//! 8192 rows × top_k 32 is refused (RESOURCE_EXHAUSTED, `call_too_large`) before its buffers
//! exist, while the largest admitted call (8192 × 8) runs and raises the daemon's peak RSS by no
//! more than the bound the budget counted for it; a 512 MiB shared-memory segment is refused at
//! the pre-handshake (the connection carries activations inline); a `MoeLayer` request larger
//! than the largest admissible call is refused from its length prefix, never decoded. After
//! each probe the daemon lives, another session's result is bit-identical to before, and the
//! daemon's peak RSS stays within what it derived (budget + overhead), under the limit.

use super::expertd::{activations, handshake_request, output, rt, unix_channel};
use super::expertd_deploy::Cgroup;
use hostd::expert_client::shm::ClientSegment;
use proto::v1::expert_service_client::ExpertServiceClient;
use proto::v1::{self as pb, moe_layer_request::Input};
use shared::shm_layout::SlotLayout;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tests::{Spawned, work_with_container, workspace_bin};
use tonic::Code;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;
/// The `wide` fixture: 32 experts per layer of hidden size 128.
const HIDDEN: usize = 128;
const EXPERTS: u32 = 32;

/// One number from the daemon's log: the first `key=N` on a line containing `marker`.
fn logged(log: &str, marker: &str, key: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker:?} line in the log:\n{log}"));
    let at = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key}= in {line}"));
    line[at + key.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{key}= is not a number in {line}"))
}

async fn client(socket: &Path) -> ExpertServiceClient<Channel> {
    ExpertServiceClient::new(unix_channel(socket).await)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

/// A call of `n` rows, each routed to experts `0..top_k` (shifted per row) with equal weights.
fn call(session_id: u64, n: usize, top_k: usize) -> pb::MoeLayerRequest {
    let ids: Vec<u32> = (0..n)
        .flat_map(|r| (0..top_k).map(move |j| ((r + j) as u32) % EXPERTS))
        .collect();
    pb::MoeLayerRequest {
        session_id,
        request_id: 1,
        step: 0,
        layer_idx: 1,
        n_tokens: n as u32,
        top_k: top_k as u32,
        weights: vec![1.0 / top_k as f32; ids.len()],
        expert_ids: ids,
        input: Some(Input::InputInlineF32Le(proto::convert::f32s_to_le_bytes(
            &activations(n, HIDDEN),
        ))),
        output_shm: None,
    }
}

#[test]
fn in_a_256_mib_cgroup_clients_cannot_make_expertd_hold_more_than_it_derived() {
    let (work, container) = work_with_container("wide");
    let limit = 256 * MIB;
    let cg = match Cgroup::make(
        &format!("sluice-test-hostile-{}", std::process::id()),
        limit,
    ) {
        Ok(cg) => cg,
        Err(why) => {
            shared::skip::skip(
                "cgroup",
                "the hostile-memory probes",
                &format!(
                    "cannot make a memory cgroup here ({why}; it needs root and a writable cgroup hierarchy)"
                ),
            );
            return;
        }
    };
    let socket = work.path().join("hostile.sock");
    let log = work.path().join("hostile.log");
    // One compute lane and two threads: the lane's share of the budget is one call of 8192 rows
    // at top-8.
    let mut daemon = Spawned::spawn(
        cg.command(&workspace_bin("expertd"))
            .args([
                "serve",
                "--container",
                container.to_str().expect("utf-8"),
                "--compute-lanes",
                "1",
                "--threads",
                "2",
                "--socket",
            ])
            .arg(&socket)
            .env("RUST_LOG", "info"),
        &log,
    );
    daemon.wait_ready(Duration::from_secs(30), |log| {
        log.contains("expertd serving") && std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let text = daemon.log_text();
    let budget = logged(&text, "budget derived from the memory limit", "cache_bytes");
    let overhead = logged(
        &text,
        "budget derived from the memory limit",
        "overhead_bytes",
    );
    // One lane's share: the "call buffers N B" of the overhead's rendering.
    let lane = logged(
        &text.replace("call buffers ", "call_buffers="),
        "budget derived",
        "call_buffers",
    );
    let pid = daemon.id();
    let hwm = || shared::procfs::vm_hwm_bytes(Some(pid)).expect("expertd died (OOM-killed?)");
    let rss = || shared::procfs::vm_rss_bytes(Some(pid)).expect("expertd died (OOM-killed?)");
    let derived = budget + overhead;
    eprintln!(
        "derived: cache {} MiB + overhead {} MiB = {} MiB of a {} MiB limit",
        budget / MIB,
        overhead / MIB,
        derived / MIB,
        limit / MIB
    );
    assert!(derived < limit, "derived {derived} B not under {limit} B");

    rt().block_on(async {
        let mut victim = client(&socket).await;
        let vid = victim
            .handshake(handshake_request(None))
            .await
            .expect("victim handshake")
            .into_inner()
            .session_id;
        let baseline = output(
            victim
                .moe_layer(call(vid, 4, 8))
                .await
                .expect("victim call")
                .into_inner(),
        );

        let mut hostile = client(&socket).await;
        let hs = hostile
            .handshake(handshake_request(None))
            .await
            .expect("handshake")
            .into_inner();
        let limits = hs.limits.expect("limits");
        assert_eq!(limits.max_rows_per_call, 8192);

        // Probe 1: 8192 rows × top_k 32, inside every advertised limit, ~300 MB of buffers:
        // refused before they exist.
        let err = hostile
            .moe_layer(call(hs.session_id, 8192, 32))
            .await
            .expect_err("8192 × 32 must be refused");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        assert!(
            err.message()
                .contains("n_tokens 8192 × top_k 32 needs about")
                && err.message().contains("--max-rows-per-call"),
            "{}",
            err.message()
        );
        assert!(
            hwm() < derived,
            "peak {} B past the derived {derived} B",
            hwm()
        );

        // The largest admitted call runs, and raises the peak by at most the bound counted for
        // one lane (the budget's `calls` term).
        let before = rss();
        let out = hostile
            .moe_layer(call(hs.session_id, 8192, 8))
            .await
            .expect("the largest admitted call")
            .into_inner();
        assert_eq!(output(out).len(), 8192 * HIDDEN * 4);
        let rise = hwm().saturating_sub(before);
        eprintln!(
            "8192 × 8: peak rose {:.1} MiB; overhead past the base {:.1} MiB",
            rise as f64 / MIB as f64,
            lane as f64 / MIB as f64
        );
        assert!(
            rise <= lane,
            "a call raised the peak {rise} B, past its bound {lane} B"
        );

        // Probe 3: a request larger than the largest admissible call, refused from its length
        // prefix: ~64 MiB of ids (one byte each on the wire).
        let cap = limits.max_message_bytes as usize;
        assert!(cap < 16 << 20, "message cap {cap} B");
        let mut big = call(hs.session_id, 1, 1);
        big.expert_ids = vec![0; 64 << 20];
        let err = hostile.moe_layer(big).await.expect_err("oversized request");
        assert!(
            matches!(err.code(), Code::OutOfRange | Code::ResourceExhausted),
            "{err:?}"
        );
        assert!(
            hwm() < derived,
            "peak {} B past the derived {derived} B",
            hwm()
        );

        // The victim's result is bit-identical after the probes.
        let again = output(
            victim
                .moe_layer(call(vid, 4, 8))
                .await
                .expect("victim call after the probes")
                .into_inner(),
        );
        assert_eq!(again, baseline, "the victim's output changed");
    });

    // Probe 2: a 512 MiB segment (written by this process, so allocated): over the daemon's cap,
    // refused at the pre-handshake; the connection still serves, inline.
    let huge = SlotLayout::new(2, 1 << 20, HIDDEN).expect("layout");
    assert!(huge.segment_bytes >= 512 * MIB);
    let seg = Arc::new(ClientSegment::create(huge).expect("segment"));
    let (link, hs) = rt().block_on(super::expertd::ring_client(
        &socket,
        &seg,
        handshake_request(None),
    ));
    assert_eq!(link.segment_id, 0, "a 512 MiB segment was mapped");
    assert_eq!(
        hs.shm_segment_bytes, 0,
        "the connection still serves, inline"
    );
    // The connection closes here, before the daemon is stopped (it drains open connections).
    drop(link);
    let text = daemon.log_text();
    assert!(
        text.contains("expertd serve --max-segment-bytes"),
        "no refusal naming the flag:\n{text}"
    );
    let peak = hwm();
    eprintln!(
        "expertd peak VmHWM {:.1} MiB; cgroup peak {:?} MiB",
        peak as f64 / MIB as f64,
        cg.peak().map(|p| p / MIB)
    );
    assert!(peak < derived, "peak {peak} B past the derived {derived} B");
    assert!(daemon.try_wait().is_none(), "expertd died");
    assert!(daemon.stop().success());
}
