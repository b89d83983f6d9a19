//! expertd's own limits against a misbehaving client (issue 14, part C): a flood of handshakes
//! is refused past the per-connection and per-uid session caps with RESOURCE_EXHAUSTED naming
//! the flag, and a dropped connection frees its sessions; a client name with a newline and an
//! escape sequence is logged escaped, on one line; NaN and infinite activations are refused
//! with INVALID_ARGUMENT naming the layer and the row, on the `MoeLayer` RPC and on the
//! shared-memory call ring, and the session keeps serving; gRPC health on TCP needs the bearer
//! token, while on the unix socket it stays open; a flood of connections past the per-uid cap is
//! closed as accepted. Each test runs the server in this process on a
//! temporary socket ([`InProcessDaemon`]) and reads its log from there.

use super::expertd::{
    HIDDEN_TINY, activations, check_status, handshake_request, raw_session, raw_unix, ring_client,
    rt, unix_channel, valid_call, whole_container,
};
use expertd::server::ServeConfig;
use hostd::expert_client::shm::ClientSegment;
use proto::v1::{self as pb, moe_layer_request::Input};
use shared::ids::LayerId;
use shared::ring::{self, OP_MOE, Submission};
use shared::shm_layout::SlotLayout;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tests::{InProcessDaemon, work_with_container};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

/// The `tiny` fixture's container in a temp dir (keep the dir alive).
fn tiny_container() -> (tempfile::TempDir, PathBuf) {
    let (work, container) = work_with_container("tiny");
    (work, container)
}

fn named(name: &str) -> pb::HandshakeRequest {
    pb::HandshakeRequest {
        client_name: name.into(),
        ..handshake_request(None)
    }
}

async fn open_sessions(
    c: &mut proto::v1::expert_service_client::ExpertServiceClient<tonic::transport::Channel>,
) -> usize {
    c.stats(pb::StatsRequest {})
        .await
        .expect("stats")
        .into_inner()
        .sessions
        .len()
}

#[test]
fn a_session_flood_is_refused_past_the_caps_and_a_dropped_connection_frees_its_sessions() {
    let (_work, container) = tiny_container();
    // The per-connection cap at its default (64); the per-uid cap lowered to 70 so a second
    // connection of the same user reaches it after 6.
    let daemon = InProcessDaemon::unix(ServeConfig {
        max_sessions_per_uid: 70,
        ..whole_container(&container)
    });
    let socket = daemon.socket();
    rt().block_on(async {
        let mut a = raw_unix(socket).await;
        let t = Instant::now();
        for i in 0..64 {
            a.handshake(named(&format!("flood {i}"))).await.unwrap_or_else(|e| panic!("handshake {i} under the cap: {e}"));
        }
        let flood = t.elapsed();
        check_status("65th session on one connection", a.handshake(named("one too many")).await, Code::ResourceExhausted, "--max-sessions-per-connection");
        // Hammering the cap is refused every time, and does not flood the log (checked below).
        for _ in 0..40 {
            check_status("hammering the cap", a.handshake(named("again")).await, Code::ResourceExhausted, "--max-sessions-per-connection");
        }
        assert_eq!(open_sessions(&mut a).await, 64, "Stats lists exactly the cap");

        // A second connection of the same uid: room for 6 more, then the uid's cap.
        let mut b = raw_unix(socket).await;
        for i in 0..6 {
            b.handshake(named(&format!("second {i}"))).await.unwrap_or_else(|e| panic!("second connection, session {i}: {e}"));
        }
        let s = b.handshake(named("over the uid cap")).await.expect_err("the uid's 71st session");
        assert_eq!(s.code(), Code::ResourceExhausted, "{}", s.message());
        assert!(s.message().contains("--max-sessions-per-uid") && s.message().contains("70 open sessions"), "{}", s.message());
        assert_eq!(open_sessions(&mut b).await, 70);

        // The first connection goes away: its 64 sessions close, and the uid has room again.
        drop(a);
        let dropped = Instant::now();
        while open_sessions(&mut b).await != 6 {
            assert!(dropped.elapsed() < Duration::from_secs(5), "the dropped connection's sessions are still open after 5 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let freed = dropped.elapsed();
        b.handshake(named("room again")).await.expect("room after the first connection closed");
        eprintln!("session flood: 64 handshakes in {:.1} ms; 64 sessions freed {:.1} ms after their connection dropped", flood.as_secs_f64() * 1e3, freed.as_secs_f64() * 1e3);
    });
    // 42 refusals (41 on the connection, 1 on the uid): logged at the 1st, 2nd, 4th, … 32nd.
    let log = daemon.log_text();
    let logged = log
        .lines()
        .filter(|l| l.contains("handshake refused") && l.contains("session_cap"))
        .count();
    assert_eq!(logged, 6, "cap refusals are logged, rate-limited:\n{log}");
}

#[test]
fn a_connection_flood_is_closed_past_the_per_uid_cap_before_anything_is_read() {
    let (_work, container) = tiny_container();
    let daemon = InProcessDaemon::unix(ServeConfig {
        max_connections_per_uid: 4,
        ..whole_container(&container)
    });
    let socket = daemon.socket();
    rt().block_on(async {
        // Four connections that never send a byte hold the uid's four places.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                tokio::net::UnixStream::connect(socket)
                    .await
                    .expect("connect"),
            );
        }
        // The fifth is accepted by the kernel and closed by the daemon at once: end of stream,
        // however long it waits, and its hello (with or without a segment) is never read.
        for _ in 0..20 {
            let mut extra = tokio::net::UnixStream::connect(socket)
                .await
                .expect("connect");
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(
                Duration::from_secs(2),
                tokio::io::AsyncReadExt::read(&mut extra, &mut buf),
            )
            .await
            .expect("a refused connection is closed at once, not left waiting");
            assert_eq!(
                n.ok(),
                Some(0),
                "the daemon sent bytes to a refused connection"
            );
        }
        // One place freed: a full client connects and works.
        drop(held.pop());
        let t = Instant::now();
        loop {
            let status = match super::expertd::try_unix_channel(socket).await {
                Ok(ch) => pb::expert_service_client::ExpertServiceClient::new(ch)
                    .handshake(named("after the flood"))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match status {
                Ok(()) => break,
                Err(e) => assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "no room 5 s after a connection closed: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    // 20 refusals: logged at the 1st, 2nd, 4th, 8th and 16th.
    let log = daemon.log_text();
    let logged = log
        .lines()
        .filter(|l| l.contains("connection refused") && l.contains("--max-connections-per-uid"))
        .count();
    assert_eq!(logged, 5, "cap refusals are logged, rate-limited:\n{log}");
}

#[test]
fn a_client_name_with_control_characters_is_logged_escaped_on_one_line() {
    let (_work, container) = tiny_container();
    let daemon = InProcessDaemon::unix(whole_container(&container));
    let socket = daemon.socket();
    let evil = "evil\n\x1b[31mFAKE expertd line\r";
    rt().block_on(async {
        let mut c = raw_unix(socket).await;
        let sid = c
            .handshake(named(evil))
            .await
            .expect("handshake")
            .into_inner()
            .session_id;
        // Stats returns the name as given (it is data, not a log line).
        let stats = c
            .stats(pb::StatsRequest {})
            .await
            .expect("stats")
            .into_inner();
        assert_eq!(stats.sessions[0].client_name, evil);
        c.close_session(pb::CloseSessionRequest { session_id: sid })
            .await
            .expect("close");
    });
    let log = daemon.log_text();
    assert!(
        !log.contains('\u{1b}') && !log.contains('\r'),
        "a raw escape or carriage return reached the log:\n{log:?}"
    );
    let escaped = r"evil\n\u{1b}[31mFAKE expertd line\r";
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(escaped)).collect();
    assert_eq!(
        lines.len(),
        2,
        "the name, escaped, on the 'session opened' and the 'session closed' lines:\n{log}"
    );
    assert!(
        lines[0].contains("session opened") && lines[1].contains("session closed"),
        "{lines:?}"
    );
}

/// Writes `x` into a fresh ring client's slot, submits one MoE call on `layer` and returns the
/// failure (code, message), if any.
fn ring_call(
    seg: &ClientSegment,
    segment_id: u64,
    layer: u32,
    x: &[f32],
    seq: u32,
) -> Option<(u32, String)> {
    let ring = seg.ring().expect("ring");
    let slot = seg.try_slot().expect("slot");
    let input = seg.write_input(&slot, segment_id, x).offset_bytes;
    let output = seg.output_slice(&slot, segment_id, x.len()).offset_bytes;
    let entry = ring.entry(slot.index() as u32);
    let n_rows = (x.len() / HIDDEN_TINY) as u32;
    let sub = Submission {
        op: OP_MOE,
        seq,
        layer: LayerId::new(layer),
        n_rows,
        top_k: 2,
        step: 0,
        input_offset: input,
        output_offset: output,
    };
    let ids: Vec<u32> = (0..n_rows * 2).map(|i| i % 8).collect();
    let weights = vec![0.5f32; ids.len()];
    entry.submit(&sub, &ids, &weights);
    ring.ring_doorbell();
    let deadline = Instant::now() + Duration::from_secs(10);
    assert!(
        entry.wait_finished(
            Duration::from_micros(50),
            Duration::from_millis(20),
            || Instant::now() < deadline
        ),
        "no answer within 10 s"
    );
    let (got_seq, _, failure) = entry.result();
    entry
        .state()
        .store(ring::STATE_FREE, std::sync::atomic::Ordering::Release);
    assert_eq!(got_seq, seq);
    failure
}

#[test]
fn nan_and_infinite_activations_are_refused_naming_layer_and_row_on_the_rpc_and_the_ring() {
    let (_work, container) = tiny_container();
    let daemon = InProcessDaemon::unix(whole_container(&container));
    let socket = daemon.socket();
    // (value, row, column): a NaN mid-row, +Inf at a row's last column, -Inf at the first.
    let cases = [
        (f32::NAN, 1usize, 5usize),
        (f32::INFINITY, 0, HIDDEN_TINY - 1),
        (f32::NEG_INFINITY, 1, 0),
    ];
    let poisoned = |bad: f32, row: usize, col: usize| {
        let mut x = activations(2, HIDDEN_TINY);
        x[row * HIDDEN_TINY + col] = bad;
        x
    };

    // The MoeLayer RPC (inline activations).
    rt().block_on(async {
        let mut c = raw_unix(socket).await;
        let sid = c.handshake(named("nan rpc")).await.expect("handshake").into_inner().session_id;
        for (bad, row, col) in cases {
            let x = poisoned(bad, row, col);
            let req = pb::MoeLayerRequest { layer_idx: 2, input: Some(Input::InputInlineF32Le(proto::convert::f32s_to_le_bytes(&x))), ..valid_call(sid) };
            let needle = format!("invalid call for layer 2: activation row {row} is not finite ({bad} at column {col})");
            check_status(&format!("RPC with {bad}"), c.moe_layer(req).await, Code::InvalidArgument, &needle);
        }
        c.moe_layer(valid_call(sid)).await.expect("the session still computes");
    });

    // The call ring: a hand-driven client writes the rows into shared memory.
    let layout = SlotLayout::new(2, 4, HIDDEN_TINY)
        .and_then(|l| l.with_ring(8))
        .expect("layout");
    let seg = Arc::new(ClientSegment::create(layout).expect("segment"));
    let (link, hs) = rt().block_on(ring_client(socket, &seg, named("nan ring")));
    assert_eq!(hs.ring_entries, 3, "the session serves a call ring");
    for (i, (bad, row, col)) in cases.into_iter().enumerate() {
        let (code, message) = ring_call(
            &seg,
            link.segment_id,
            3,
            &poisoned(bad, row, col),
            10 + i as u32,
        )
        .unwrap_or_else(|| panic!("ring call with {bad} must fail"));
        assert_eq!(Code::from(code as i32), Code::InvalidArgument, "{message}");
        let needle = format!(
            "invalid call for layer 3: activation row {row} is not finite ({bad} at column {col})"
        );
        assert!(
            message.contains(&needle),
            "{message:?} does not contain {needle:?}"
        );
    }
    assert_eq!(
        ring_call(&seg, link.segment_id, 3, &activations(2, HIDDEN_TINY), 20),
        None,
        "the ring worker still serves"
    );
    let stats = rt().block_on(async {
        raw_unix(socket)
            .await
            .stats(pb::StatsRequest {})
            .await
            .expect("stats")
            .into_inner()
    });
    let ring_session = stats
        .sessions
        .iter()
        .find(|s| s.client_name == "nan ring")
        .expect("ring session");
    assert_eq!(
        (
            ring_session.failed_calls,
            ring_session.calls,
            ring_session.ring_calls
        ),
        (3, 1, 1),
        "{ring_session:?}"
    );
    drop(link);
}

async fn health(
    channel: tonic::transport::Channel,
    service: &str,
    token: Option<&str>,
) -> Result<HealthCheckResponse, tonic::Status> {
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: service.into(),
    });
    if let Some(t) = token {
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    HealthClient::new(channel)
        .check(req)
        .await
        .map(tonic::Response::into_inner)
}

#[test]
fn grpc_health_on_tcp_requires_the_token_and_stays_open_on_the_unix_socket() {
    let (_work, container) = tiny_container();
    let tcp = InProcessDaemon::tcp(ServeConfig {
        auth_token: Some("open-sesame".into()),
        insecure_tcp: true,
        ..whole_container(&container)
    });
    let serving = ServingStatus::Serving as i32;
    rt().block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(tcp.uri())
            .expect("uri")
            .connect()
            .await
            .expect("tcp connect");
        check_status(
            "TCP health without a token",
            health(ch.clone(), "", None).await,
            Code::Unauthenticated,
            "missing",
        );
        check_status(
            "TCP health of the service without a token",
            health(ch.clone(), "expertd.v1.ExpertService", None).await,
            Code::Unauthenticated,
            "missing",
        );
        check_status(
            "TCP health with a wrong token",
            health(ch.clone(), "", Some("open-sesamE")).await,
            Code::Unauthenticated,
            "does not match",
        );
        assert_eq!(
            health(ch.clone(), "", Some("open-sesame"))
                .await
                .expect("with the token")
                .status,
            serving
        );
        assert_eq!(
            health(ch, "expertd.v1.ExpertService", Some("open-sesame"))
                .await
                .expect("with the token")
                .status,
            serving
        );
    });
    let unix = InProcessDaemon::unix(whole_container(&container));
    rt().block_on(async {
        let ch = unix_channel(unix.socket()).await;
        assert_eq!(
            health(ch, "expertd.v1.ExpertService", None)
                .await
                .expect("unix health needs no token")
                .status,
            serving
        );
    });
}

/// What [`valid_call`]'s decoded request holds while it waits for a lane: its ids, weights and
/// inline activations (it is under expertd's `UNCOUNTED_MESSAGE_BYTES`, so it is not counted
/// while it arrives).
fn held_bytes(r: &pb::MoeLayerRequest) -> u64 {
    let input = match &r.input {
        Some(Input::InputInlineF32Le(b)) => b.len(),
        _ => 0,
    };
    assert!(prost::Message::encoded_len(r) as u64 <= expertd::rpc::intake::UNCOUNTED_MESSAGE_BYTES);
    (4 * (r.expert_ids.len() + r.weights.len()) + input) as u64
}

/// `MoeLayer` requests arriving or waiting for a lane are capped in bytes over every connection
/// (`--max-queued-bytes`): a request larger than the cap is refused with RESOURCE_EXHAUSTED
/// naming the flag, concurrent calls from several connections past it are refused, never
/// buffered or queued, and every admitted call gives its bytes back when it gets its lane
/// (afterwards, calls that fit are admitted again, one after another, as often as wanted).
#[test]
fn decoded_requests_waiting_for_a_lane_are_capped_in_bytes_over_every_connection() {
    let (_work, container) = tiny_container();
    let one = held_bytes(&valid_call(0));
    let daemon = InProcessDaemon::unix(ServeConfig {
        max_queued_bytes: Some(3 * one),
        compute_lanes: 1,
        ..whole_container(&container)
    });
    let socket = daemon.socket().to_path_buf();
    rt().block_on(async {
        let (mut c, sid) = raw_session(&socket).await;
        c.moe_layer(valid_call(sid))
            .await
            .expect("a call within the cap");
        // Four calls' worth of rows in one request: more than the cap even with nothing queued.
        let big = pb::MoeLayerRequest {
            n_tokens: 8,
            expert_ids: (0..16).map(|j| j % 8).collect::<Vec<u32>>(),
            weights: vec![0.5; 16],
            input: Some(Input::InputInlineF32Le(proto::convert::f32s_to_le_bytes(
                &activations(8, HIDDEN_TINY),
            ))),
            ..valid_call(sid)
        };
        assert!(held_bytes(&big) > 3 * one);
        check_status(
            "a request past the queue's byte cap",
            c.moe_layer(big).await,
            Code::ResourceExhausted,
            "--max-queued-bytes",
        );

        // Eight connections call at once, 20 times each, on one lane: whatever is refused is
        // refused for the queue's cap, and the rest is answered.
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let socket = socket.clone();
            tasks.push(tokio::spawn(async move {
                let (mut c, sid) = raw_session(&socket).await;
                let (mut ok, mut full) = (0, 0);
                for _ in 0..20 {
                    match c.moe_layer(valid_call(sid)).await {
                        Ok(_) => ok += 1,
                        Err(s) => {
                            assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                            assert!(s.message().contains("--max-queued-bytes"), "{s:?}");
                            full += 1;
                        }
                    }
                }
                (ok, full)
            }));
        }
        let (mut ok, mut full) = (0, 0);
        for t in tasks {
            let (o, f) = t.await.expect("caller");
            ok += o;
            full += f;
        }
        eprintln!("concurrent: {ok} answered, {full} refused for the queue's cap");
        assert!(ok > 0);
        // Eight callers on one lane queue more than three calls at once: the cap refused some.
        assert!(
            full > 0,
            "160 concurrent calls on one lane never met a cap of three"
        );
        // Every admitted call gave its bytes back: nothing queued, the refusals counted, and
        // sequential calls within the cap all pass.
        let st = c
            .stats(pb::StatsRequest {})
            .await
            .expect("stats")
            .into_inner();
        assert_eq!(st.queued_request_bytes, 0, "bytes still counted as queued");
        assert_eq!(st.queue_full_refusals, full as u64 + 1);
        for _ in 0..50 {
            c.moe_layer(valid_call(sid))
                .await
                .expect("a call after the burst");
        }
    });
}
