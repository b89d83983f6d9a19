//! A prefetch-hint flood (issue 37): a session that sends hints, each with a fresh step number,
//! used to get a fresh speculative budget per hint and read the whole container into the cache,
//! evicting another session's experts. Speculation is now a per-session byte bucket that starts
//! empty and only the session's own completed calls refill: after one token's calls (one per
//! layer) the flood reads at most one token's worth, and the victim's calls keep hitting
//! (misses per call unchanged, 0).

use super::expertd::{activations, blob_stride, handshake_request, raw_unix, rt};
use hostd::expert_client::shm::ClientSegment;
use proto::v1::{self as pb, moe_layer_request::Input};
use shared::ids::LayerId;
use shared::ring::{self, OP_PREFETCH, Submission};
use shared::shm_layout::SlotLayout;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tests::{InProcessDaemon, work_with_container};

/// The `wide` fixture: 3 layers of 32 experts, hidden size 128.
const HIDDEN: usize = 128;
const LAYERS: u64 = 3;

fn victim_call(session_id: u64) -> pb::MoeLayerRequest {
    pb::MoeLayerRequest {
        session_id,
        request_id: 1,
        step: 0,
        layer_idx: 0,
        n_tokens: 1,
        top_k: 8,
        expert_ids: (0..8).collect(),
        weights: vec![0.125; 8],
        input: Some(Input::InputInlineF32Le(proto::convert::f32s_to_le_bytes(
            &activations(1, HIDDEN),
        ))),
        output_shm: None,
    }
}

#[test]
fn a_hint_flood_with_fresh_steps_reads_one_token_worth_and_evicts_no_other_session() {
    let (_work, container) = work_with_container("wide");
    let stride = blob_stride(&container);
    // 40 slots: the victim's 8 experts plus one token's speculation (8 × 3 layers) fit; the
    // flood's 64 experts of layers 1 and 2 do not.
    let daemon = InProcessDaemon::unix(expertd::server::ServeConfig::new(
        container.clone(),
        40 * stride,
    ));
    let socket = daemon.socket().to_path_buf();

    // One runtime for every call: a channel's connection task lives on the runtime that made it.
    let rt = rt();
    let mut victim = rt.block_on(raw_unix(&socket));
    let vid = rt
        .block_on(victim.handshake(handshake_request(None)))
        .expect("victim handshake")
        .into_inner()
        .session_id;
    let misses = |victim: &mut pb::expert_service_client::ExpertServiceClient<_>| {
        rt.block_on(victim.moe_layer(victim_call(vid)))
            .expect("victim call")
            .into_inner()
            .misses
    };
    assert_eq!(misses(&mut victim), 8, "the first call reads its experts");
    assert_eq!(misses(&mut victim), 0, "the second hits them");

    // The hostile session: a call ring whose hint entry (the last) it fills as fast as the
    // daemon takes hints, a fresh step each time, 8 experts of layer 1 or 2 per hint.
    let layout = SlotLayout::new(1, 1, HIDDEN)
        .and_then(|l| l.with_ring(8))
        .expect("layout");
    let seg = Arc::new(ClientSegment::create(layout).expect("segment"));
    let (link, hs) = rt.block_on(super::expertd::ring_client(
        &socket,
        &seg,
        handshake_request(None),
    ));
    assert_eq!(hs.ring_entries, 2);
    let hostile_id = hs.session_id;
    // One token's demand calls of the hostile session (one per layer, one expert each): they
    // earn it one token's worth of speculation, 8 experts per layer.
    rt.block_on(async {
        let mut c = link.client.clone();
        for layer in 0..LAYERS as u32 {
            c.moe_layer(pb::MoeLayerRequest {
                session_id: hostile_id,
                layer_idx: layer,
                top_k: 1,
                expert_ids: vec![31],
                weights: vec![1.0],
                ..victim_call(hostile_id)
            })
            .await
            .expect("the hostile session's own call");
        }
    });
    let ring = seg.ring().expect("ring");
    let entry = ring.entry(1);
    for i in 0..200u32 {
        let sub = Submission {
            op: OP_PREFETCH,
            seq: i,
            layer: LayerId::new(1 + i % 2),
            n_rows: 1,
            top_k: 8,
            step: u64::from(i) + 1,
            input_offset: 0,
            output_offset: 0,
        };
        let ids: Vec<u32> = (0..8).map(|j| (i / 2 * 8 + j) % 32).collect();
        entry.submit(&sub, &ids, &[0.0; 8]);
        ring.ring_doorbell();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(
            entry.wait_finished(
                Duration::from_micros(50),
                Duration::from_millis(5),
                || Instant::now() < deadline
            ),
            "hint {i} not taken within 10 s"
        );
        let (_, _, failure) = entry.result();
        assert_eq!(failure, None, "hint {i} refused");
        entry
            .state()
            .store(ring::STATE_FREE, std::sync::atomic::Ordering::Release);
        std::thread::sleep(Duration::from_millis(2));
    }
    // Let the prefetch thread finish what it queued.
    std::thread::sleep(Duration::from_millis(300));
    let stats = rt
        .block_on(victim.stats(pb::StatsRequest {}))
        .expect("stats")
        .into_inner();
    let p = stats.prefetch.expect("the daemon runs a prefetcher");
    eprintln!("flood: {p:?}");
    assert!(p.hints >= 20, "the flood's hints did not arrive: {p:?}");
    assert!(
        p.reads >= 8 && p.reads <= 8 * LAYERS,
        "speculative reads {} not within one token's worth (8 × {LAYERS}): {p:?}",
        p.reads
    );
    assert_eq!(
        misses(&mut victim),
        0,
        "the flood evicted the victim's experts"
    );
    drop((link, victim));
    drop(rt);
    daemon.stop().expect("clean stop");
}
