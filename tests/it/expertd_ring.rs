//! The shared-memory call ring between hostd and expertd (`shared::ring`,
//! `expertd/src/call/ring_worker.rs`): a unix client with shared memory sends its MoE calls
//! through the ring by default, and `hostd eval` writes byte-equal logits through the ring,
//! through the `MoeLayer` RPC and in process, at a budget that evicts every step and at one that
//! holds everything, with prefetch hints on and off; the echo op returns its input; and every
//! malformed ring entry fails that call with its own status while the worker keeps serving. The
//! tests of single calls run the server in this process ([`InProcessDaemon`]); those with
//! `hostd eval` run the `expertd serve` binary.

use super::expertd::{
    Daemon, HIDDEN_TINY, activations, blob_stride, container_bytes, eval, prompts_file, raw_unix,
    rt, tiny_call, whole_container,
};
use hostd::expert_client::shm::ClientSegment;
use hostd::expert_client::{ClientOptions, Endpoint, ExpertdClient};
use hostd::experts::{ExpertBackend, MoeCall};
use proto::v1 as pb;
use shared::ids::LayerId;
use shared::ring::{self, OP_ECHO, OP_MOE, OP_PREFETCH, Submission};
use shared::shm_layout::SlotLayout;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tests::{InProcessDaemon, work_with_container};
use tonic::Code;

fn client(socket: &Path, ring: bool) -> ExpertdClient {
    let mut opts = ClientOptions::new(Endpoint::Unix(socket.to_path_buf()), 4, 8, HIDDEN_TINY);
    opts.ring = ring;
    opts.ring_top_k = 2;
    opts.client_name = format!("ring test ring={ring}");
    ExpertdClient::connect(opts, None).expect("connect")
}

/// A daemon in this process on the `tiny` fixture's container, whole container cached, and its
/// socket; keep the temp dir alive.
fn tiny_daemon() -> (tempfile::TempDir, InProcessDaemon, std::path::PathBuf) {
    let (work, container) = work_with_container("tiny");
    let d = InProcessDaemon::unix(whole_container(&container));
    let socket = d.socket().to_path_buf();
    (work, d, socket)
}

/// `preset`'s container and oracle prompts in a temp dir, and the in-process INT8 backend's
/// eval of them: the baseline every expertd path must equal byte for byte.
struct Baseline {
    work: tempfile::TempDir,
    container: std::path::PathBuf,
    prompts: std::path::PathBuf,
    out: super::expertd::EvalOut,
}

fn int8_baseline(preset: &str) -> Baseline {
    let (work, container) = work_with_container(preset);
    let prompts = prompts_file(preset, work.path(), 1);
    let c = container.to_str().expect("utf-8");
    let out = eval(
        preset,
        &prompts,
        work.path(),
        "int8",
        &["--experts", "int8", "--container", c],
    );
    Baseline {
        work,
        container,
        prompts,
        out,
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn ring_rpc_and_in_process_give_byte_equal_logits_at_tiny_and_full_budgets() {
    for preset in ["tiny", "small"] {
        let Baseline {
            work,
            container,
            prompts,
            out: baseline,
        } = int8_baseline(preset);
        for (tag, budget) in [
            ("tiny budget", 2 * blob_stride(&container)),
            ("full budget", container_bytes(&container)),
        ] {
            let d = Daemon::unix(&container, budget, &[]);
            let ring = eval(
                preset,
                &prompts,
                work.path(),
                "ring",
                &["--expertd", &d.uri()],
            );
            assert_eq!(ring, baseline, "{preset} {tag}: ring vs in-process");
            let prefetch = eval(
                preset,
                &prompts,
                work.path(),
                "ring-prefetch",
                &["--expertd", &d.uri(), "--expertd-prefetch"],
            );
            assert_eq!(
                prefetch, baseline,
                "{preset} {tag}: ring with prefetch hints vs in-process"
            );
            let no_prefetch = eval(
                preset,
                &prompts,
                work.path(),
                "ring-no-prefetch",
                &["--expertd", &d.uri(), "--expertd-prefetch", "off"],
            );
            assert_eq!(
                no_prefetch, baseline,
                "{preset} {tag}: ring without prefetch hints vs in-process"
            );
            let rpc = eval(
                preset,
                &prompts,
                work.path(),
                "rpc",
                &["--expertd", &d.uri(), "--expertd-no-ring"],
            );
            assert_eq!(rpc, baseline, "{preset} {tag}: MoeLayer RPC vs in-process");
            // The daemon's log proves which path each client took.
            let log = d.log_text();
            assert!(
                log.contains("ring_entries=3"),
                "{preset} {tag}: no session used the ring:\n{log}"
            );
            assert!(
                log.contains("ring_entries=0"),
                "{preset} {tag}: the --expertd-no-ring session used it:\n{log}"
            );
        }
        // The design before the ring (read, then compute) gives the same bits too.
        let d = Daemon::unix(&container, 2 * blob_stride(&container), &["--no-overlap"]);
        let old = eval(
            preset,
            &prompts,
            work.path(),
            "no-overlap",
            &["--expertd", &d.uri()],
        );
        assert_eq!(old, baseline, "{preset}: --no-overlap");
        // The ring worker without its kept-awake compute pool (every call wakes the pool).
        let d = Daemon::unix(
            &container,
            container_bytes(&container),
            &["--no-keep-awake"],
        );
        let asleep = eval(
            preset,
            &prompts,
            work.path(),
            "no-keep-awake",
            &["--expertd", &d.uri()],
        );
        assert_eq!(asleep, baseline, "{preset}: daemon --no-keep-awake");
    }
}

#[test]
fn prefetch_hints_read_ahead_and_change_no_result() {
    let preset = "small";
    let Baseline {
        work,
        container,
        prompts,
        out: baseline,
    } = int8_baseline(preset);
    // A quarter of the container: predictions of experts that are not resident get read.
    let d = Daemon::unix(&container, container_bytes(&container) / 4, &[]);
    let with = eval(
        preset,
        &prompts,
        work.path(),
        "prefetch",
        &["--expertd", &d.uri(), "--expertd-prefetch"],
    );
    assert_eq!(with, baseline, "prefetch on");
    let stats = settled_stats(&d);
    let p = stats.prefetch.expect("the daemon runs a prefetcher");
    assert!(p.hints > 0, "the client sent hints: {p:?}");
    assert!(
        p.reads > 0 && p.bytes_read == p.reads * blob_stride(&container),
        "speculative reads, stride each: {p:?}"
    );
    assert!(p.useful_bytes <= p.bytes_read, "{p:?}");
    assert!(
        p.useful_bytes > 0,
        "some speculatively read expert was then used by a demand call: {p:?}"
    );
    let cache = stats.cache.expect("cache");
    assert_eq!(cache.leases_held, 0, "speculative leases are released");
    // The same daemon with prefetch off in the client: no hint arrives.
    let without = eval(
        preset,
        &prompts,
        work.path(),
        "no-prefetch",
        &["--expertd", &d.uri(), "--expertd-prefetch", "off"],
    );
    assert_eq!(without, baseline, "prefetch off");
    let hints = |d: &Daemon| settled_stats(d).prefetch.expect("prefetcher").hints;
    assert_eq!(hints(&d), p.hints, "--expertd-prefetch off sent hints");
    // The default (auto) hints a daemon that streams (this one: a quarter of the container)…
    let auto = eval(
        preset,
        &prompts,
        work.path(),
        "auto-streaming",
        &["--expertd", &d.uri()],
    );
    assert_eq!(auto, baseline, "prefetch auto, streaming");
    assert!(
        hints(&d) > p.hints,
        "the default sent no hint to a streaming daemon"
    );
    // …and not one whose cache holds the whole container.
    let full = Daemon::unix(&container, container_bytes(&container), &[]);
    let auto = eval(
        preset,
        &prompts,
        work.path(),
        "auto-resident",
        &["--expertd", &full.uri()],
    );
    assert_eq!(auto, baseline, "prefetch auto, resident");
    assert_eq!(
        hints(&full),
        0,
        "the default hinted a daemon that holds every expert"
    );
}

/// The daemon's stats once its prefetch thread has let go of every lease (hints are read
/// asynchronously), or after 10 s.
fn settled_stats(d: &Daemon) -> pb::StatsResponse {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = rt().block_on(async {
            let mut c = raw_unix(d.socket.as_ref().expect("socket")).await;
            c.stats(pb::StatsRequest {})
                .await
                .expect("stats")
                .into_inner()
        });
        if stats.cache.as_ref().is_some_and(|c| c.leases_held == 0)
            || std::time::Instant::now() > deadline
        {
            return stats;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_unix_client_uses_the_ring_by_default_and_both_paths_agree() {
    let (_work, _daemon, socket) = tiny_daemon();
    let with_ring = client(&socket, true);
    let without = client(&socket, false);
    assert_eq!(with_ring.daemon_info().expect("info").ring_entries, 3);
    assert_eq!(without.daemon_info().expect("info").ring_entries, 0);
    let a = tiny_call(&with_ring).expect("ring call");
    let b = tiny_call(&without).expect("rpc call");
    assert_eq!(bits(&a), bits(&b));
    // The daemon saw one call on each session, and only the first came through the ring.
    let stats = rt().block_on(async {
        let mut c = raw_unix(&socket).await;
        c.stats(pb::StatsRequest {})
            .await
            .expect("stats")
            .into_inner()
    });
    let by_name = |n: &str| {
        stats
            .sessions
            .iter()
            .find(|s| s.client_name == n)
            .unwrap_or_else(|| panic!("session {n}: {:?}", stats.sessions))
            .clone()
    };
    let (r, g) = (
        by_name("ring test ring=true"),
        by_name("ring test ring=false"),
    );
    assert_eq!((r.calls, r.ring_calls), (1, 1), "{r:?}");
    assert_eq!((g.calls, g.ring_calls), (1, 0), "{g:?}");
    // The caller's overlapped work (the shared expert) runs exactly once on every path:
    // inside the ring call, after an RPC call, and when the call is refused; the answer is
    // the plain call's.
    let x = activations(3, HIDDEN_TINY);
    let call = MoeCall {
        layer: LayerId::new(1),
        n_rows: 3,
        top_k: 2,
        x: &x,
        ids: &[4, 5, 6, 7, 0, 4],
        weights: &[0.6, 0.4, 0.3, 0.7, 0.5, 0.5],
    };
    for (name, c) in [("ring", &with_ring), ("rpc", &without)] {
        let mut runs = 0;
        let mut out = vec![0.0f32; x.len()];
        c.moe_layer_overlapped(&call, &mut out, None, &mut || runs += 1)
            .expect("overlapped call");
        assert_eq!(runs, 1, "{name}: `during` must run once");
        assert_eq!(bits(&out), bits(&a), "{name}: overlapped vs plain call");
        let bad = MoeCall {
            layer: LayerId::new(9),
            ..call
        };
        let mut runs = 0;
        assert!(
            c.moe_layer_overlapped(&bad, &mut out, None, &mut || runs += 1)
                .is_err()
        );
        assert_eq!(
            runs, 1,
            "{name}: `during` must run once on a refused call too"
        );
        // The caller's work is not booked as IPC: on the ring it overlaps the call (ipc is what
        // outlasts the longer of the two), on the RPC it runs after the timed window. (This
        // catches counting a long `during` as IPC; an overlap shorter than the daemon's work
        // would need a slow daemon to show.)
        let prof = hostd::profile::Profiler::new();
        let pause = Duration::from_millis(300);
        c.moe_layer_overlapped(&call, &mut out, Some(&prof), &mut || {
            std::thread::sleep(pause);
        })
        .expect("profiled call");
        let ipc = prof.take().get("experts.ipc").map_or(0, |s| s.ns);
        assert!(
            ipc < 150_000_000,
            "{name}: {} ms of IPC: the caller's 300 ms were booked as IPC",
            ipc / 1_000_000
        );
    }
    // The echo op moves the rows and computes nothing.
    let mut out = vec![0.0; x.len()];
    with_ring.echo(&x, &mut out).expect("echo");
    assert_eq!(bits(&x), bits(&out));
    assert!(without.echo(&x, &mut out).is_err(), "no ring, no echo");
}

#[test]
fn malformed_ring_entries_fail_that_call_and_the_worker_keeps_serving() {
    let (_work, _daemon, socket) = tiny_daemon();
    // A hand-driven client: its own segment (2 slots of 4 rows, ring cells 8), handshake, then
    // entries written directly.
    let layout = SlotLayout::new(2, 4, HIDDEN_TINY)
        .and_then(|l| l.with_ring(8))
        .expect("layout");
    let seg = Arc::new(ClientSegment::create(layout).expect("segment"));
    let req = pb::HandshakeRequest {
        protocol_version: proto::version::CURRENT,
        client_name: "raw ring".into(),
        ..Default::default()
    };
    let (link, hs) = rt().block_on(super::expertd::ring_client(&socket, &seg, req));
    assert_eq!(hs.ring_entries, 3);
    let ring = seg.ring().expect("ring");
    let slot = seg.try_slot().expect("slot");
    let x = activations(2, HIDDEN_TINY);
    let input = seg.write_input(&slot, link.segment_id, &x).offset_bytes;
    let output = seg
        .output_slice(&slot, link.segment_id, x.len())
        .offset_bytes;
    let entry = ring.entry(slot.index() as u32);
    let valid = Submission {
        op: OP_MOE,
        seq: 1,
        layer: LayerId::new(0),
        n_rows: 2,
        top_k: 2,
        step: 0,
        input_offset: input,
        output_offset: output,
    };
    let send_hinted = |sub: &Submission, ids: &[u32], weights: &[f32], hint: (u32, &[u32])| {
        entry.submit_with_hint(sub, ids, weights, LayerId::new(hint.0), hint.1);
        ring.ring_doorbell();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let answered =
            entry.wait_finished(Duration::from_micros(50), Duration::from_millis(20), || {
                std::time::Instant::now() < deadline
            });
        assert!(
            answered,
            "the worker did not answer within 10 s (op {}, layer {})",
            sub.op, sub.layer
        );
        let (seq, cost, failure) = entry.result();
        entry
            .state()
            .store(ring::STATE_FREE, std::sync::atomic::Ordering::Release);
        assert_eq!(
            seq, sub.seq,
            "the completion echoes the call's sequence number"
        );
        (cost, failure)
    };
    let send =
        |sub: &Submission, ids: &[u32], weights: &[f32]| send_hinted(sub, ids, weights, (0, &[]));
    let (ids, w) = (vec![0, 1, 2, 3], vec![0.75, 0.25, 0.5, 0.5]);
    // (what, entry, ids, weights, expected code, text the message must contain)
    type Case = (
        &'static str,
        Submission,
        Vec<u32>,
        Vec<f32>,
        Code,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "unknown op",
            Submission { op: 99, ..valid },
            ids.clone(),
            w.clone(),
            Code::InvalidArgument,
            "unknown ring op 99",
        ),
        (
            "layer out of range",
            Submission {
                layer: LayerId::new(4),
                ..valid
            },
            ids.clone(),
            w.clone(),
            Code::InvalidArgument,
            "layer 4 out of range",
        ),
        (
            "zero rows",
            Submission { n_rows: 0, ..valid },
            vec![],
            vec![],
            Code::InvalidArgument,
            "n_tokens 0",
        ),
        (
            "more cells than the entry holds",
            Submission {
                n_rows: 4,
                top_k: 8,
                ..valid
            },
            ids.clone(),
            w.clone(),
            Code::InvalidArgument,
            "exceeds the ring entry",
        ),
        (
            "expert out of range",
            valid,
            vec![0, 8, 2, 3],
            w.clone(),
            Code::InvalidArgument,
            "expert 8 out of range",
        ),
        (
            "duplicate expert",
            valid,
            vec![0, 1, 3, 3],
            w.clone(),
            Code::InvalidArgument,
            "expert 3 chosen twice",
        ),
        (
            "NaN weight",
            valid,
            ids.clone(),
            vec![0.5, f32::NAN, 0.5, 0.5],
            Code::InvalidArgument,
            "not finite",
        ),
        (
            "input past the segment",
            Submission {
                input_offset: layout.segment_bytes,
                ..valid
            },
            ids.clone(),
            w.clone(),
            Code::InvalidArgument,
            "past",
        ),
        (
            "misaligned output",
            Submission {
                output_offset: output + 4,
                ..valid
            },
            ids.clone(),
            w.clone(),
            Code::InvalidArgument,
            "multiple of 64",
        ),
        (
            "output over the header",
            Submission {
                output_offset: 0,
                ..valid
            },
            ids.clone(),
            w.clone(),
            Code::InvalidArgument,
            "multiple of 64",
        ),
        (
            // The last 64 bytes before the ring: the output would overwrite its control words.
            "output over the ring",
            Submission {
                output_offset: seg.layout().ring.expect("ring").offset - 64,
                ..valid
            },
            ids.clone(),
            w.clone(),
            Code::InvalidArgument,
            "reaches into the call ring",
        ),
        (
            "hint for a layer out of range",
            Submission {
                op: OP_PREFETCH,
                layer: LayerId::new(4),
                n_rows: 1,
                top_k: 2,
                ..valid
            },
            vec![0, 1],
            vec![0.0; 2],
            Code::InvalidArgument,
            "prefetch hint",
        ),
        (
            "hint for an expert out of range",
            Submission {
                op: OP_PREFETCH,
                n_rows: 1,
                top_k: 2,
                ..valid
            },
            vec![0, 9],
            vec![0.0; 2],
            Code::InvalidArgument,
            "expert 9 out of range",
        ),
    ];
    for (i, (what, sub, ids, w, code, needle)) in cases.into_iter().enumerate() {
        let sub = Submission {
            seq: 100 + i as u32,
            ..sub
        };
        let (_, failure) = send(&sub, &ids, &w);
        let (got, message) = failure.unwrap_or_else(|| panic!("{what}: must fail"));
        assert_eq!(Code::from(got as i32), code, "{what}: {message}");
        assert!(
            message.contains(needle),
            "{what}: {message:?} does not mention {needle:?}"
        );
    }
    // A prefetch hint riding with a call is checked like a hint entry; a bad one fails the call.
    let hinted: [(&str, u32, &[u32], &str); 2] = [
        ("hint layer out of range", 4, &[0], "prefetch hint: layer 4"),
        (
            "hint expert out of range",
            1,
            &[2, 9],
            "expert 9 out of range",
        ),
    ];
    for (i, (what, layer, hint, needle)) in hinted.into_iter().enumerate() {
        let (_, failure) = send_hinted(
            &Submission {
                seq: 200 + i as u32,
                ..valid
            },
            &ids,
            &w,
            (layer, hint),
        );
        let (got, message) = failure.unwrap_or_else(|| panic!("{what}: must fail"));
        assert_eq!(
            Code::from(got as i32),
            Code::InvalidArgument,
            "{what}: {message}"
        );
        assert!(
            message.contains(needle),
            "{what}: {message:?} does not mention {needle:?}"
        );
    }
    // A valid hint changes nothing in the call's answer (compared with the RPC below).
    let (cost, failure) = send_hinted(&Submission { seq: 6, ..valid }, &ids, &w, (1, &[4, 5]));
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(
        cost.hits + cost.misses,
        4,
        "four distinct experts; the hint is not part of the call"
    );
    let mut hinted_out = vec![0.0f32; x.len()];
    seg.read_output(&slot, &mut hinted_out);
    // The worker still serves: a valid call computes what the RPC path computes.
    let (cost, failure) = send(&Submission { seq: 7, ..valid }, &ids, &w);
    assert!(failure.is_none(), "{failure:?}");
    assert_eq!(cost.hits + cost.misses, 4, "four distinct experts");
    let mut ring_out = vec![0.0f32; x.len()];
    seg.read_output(&slot, &mut ring_out);
    let rpc = client(&socket, false);
    let call = MoeCall {
        layer: LayerId::new(0),
        n_rows: 2,
        top_k: 2,
        x: &x,
        ids: &ids,
        weights: &w,
    };
    let mut rpc_out = vec![0.0f32; x.len()];
    ExpertBackend::moe_layer(&rpc, &call, &mut rpc_out).expect("rpc call");
    assert_eq!(bits(&ring_out), bits(&rpc_out));
    assert_eq!(bits(&hinted_out), bits(&rpc_out), "a call carrying a hint");
    // Echo through the raw entry too.
    let (_, failure) = send(
        &Submission {
            op: OP_ECHO,
            seq: 8,
            ..valid
        },
        &[],
        &[],
    );
    assert!(failure.is_none());
    let mut echoed = vec![0.0f32; x.len()];
    seg.read_output(&slot, &mut echoed);
    assert_eq!(bits(&echoed), bits(&x));
    drop(link);
}

#[test]
fn a_burst_on_the_kept_awake_pool_ends_when_another_call_runs_off_the_pool() {
    let (_work, container) = work_with_container("tiny");
    let mut config = whole_container(&container);
    // A poll window far longer than this test: only another call (or the session closing) ends
    // a burst here. Two compute threads: the least the kept-awake pool runs with.
    config.ring_spin = Duration::from_secs(60);
    config.threads = 2;
    let d = InProcessDaemon::unix(config);
    let socket = d.socket().to_path_buf();
    let ring = client(&socket, true);
    let rpc = client(&socket, false);
    let bursts = || {
        let stats = rt().block_on(async {
            let mut c = raw_unix(&socket).await;
            c.stats(pb::StatsRequest {})
                .await
                .expect("stats")
                .into_inner()
        });
        let s = stats
            .sessions
            .iter()
            .find(|s| s.client_name == "ring test ring=true")
            .expect("the ring session")
            .clone();
        (s.ring_calls, s.ring_bursts)
    };
    let first = tiny_call(&ring).expect("ring call 1");
    let second = tiny_call(&ring).expect("ring call 2");
    assert_eq!(
        bursts(),
        (2, 1),
        "two calls within the poll window run as one burst"
    );
    // A call off the pool (the MoeLayer RPC) ends the burst: the ring session's next call
    // starts another.
    let by_rpc = tiny_call(&rpc).expect("rpc call");
    let third = tiny_call(&ring).expect("ring call 3");
    assert_eq!(
        bursts(),
        (3, 2),
        "the RPC call did not end the ring session's burst"
    );
    for (name, v) in [("ring 2", &second), ("rpc", &by_rpc), ("ring 3", &third)] {
        assert_eq!(bits(v), bits(&first), "{name} vs ring call 1");
    }
}
