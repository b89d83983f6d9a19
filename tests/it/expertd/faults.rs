//! expertd end to end when things go wrong: a killed hostd, a daemon restart, malformed calls, a
//! corrupted blob, and a call larger than the cache.

use super::*;

/// How long a killed client's session and leases may outlive it (see the test below).
const CLEANUP_BOUND: Duration = Duration::from_secs(10);

#[test]
/// The daemon learns of the kill from the closed socket, typically within milliseconds. The bound
/// is 10 s so that a loaded 2-core box cannot fail it, and still half the keepalive timeout
/// (`expertd::server::KEEPALIVE_TIMEOUT`, 20 s): passing shows the close was noticed by EOF, not by
/// a keepalive probe; a leaked session or lease never clears and fails it.
fn a_killed_hostd_leaves_no_session_and_no_lease_promptly() {
    let (work, container) = work_with_container("tiny");
    let daemon = Daemon::unix(&container, 2 * blob_stride(&container), &[]);
    let socket = daemon.socket.clone().expect("socket");
    // Enough prompts to keep hostd generating for far longer than the test waits.
    let prompts = prompts_file("tiny", work.path(), 2000);
    let mut hostd = eval_cmd(
        "tiny",
        &prompts,
        &work.path().join("killed.json"),
        &["--expertd", &daemon.uri()],
    )
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn hostd");
    rt().block_on(async {
        let mut c = raw_unix(&socket).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = c
                .stats(pb::StatsRequest {})
                .await
                .expect("stats")
                .into_inner();
            if s.sessions
                .iter()
                .any(|s| s.client_name == "hostd eval" && s.calls > 10)
            {
                break;
            }
            assert!(Instant::now() < deadline, "hostd never got going: {s:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        hostd.kill().expect("kill -9 hostd");
        let killed = Instant::now();
        let _ = hostd.wait();
        loop {
            let s = c
                .stats(pb::StatsRequest {})
                .await
                .expect("stats")
                .into_inner();
            let cache = s.cache.expect("cache");
            if s.sessions.is_empty() && cache.leases_held == 0 && cache.sessions_open == 0 {
                break;
            }
            assert!(
                killed.elapsed() < CLEANUP_BOUND,
                "after {CLEANUP_BOUND:?}: sessions {:?}, cache {cache:?}",
                s.sessions
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

#[test]
fn a_daemon_restart_fails_the_call_in_flight_clearly_and_the_client_reconnects() {
    let (_work, container) = work_with_container("tiny");
    let budget = container_bytes(&container);
    let mut first = Daemon::unix(&container, budget, &[]);
    let socket = first.socket.clone().expect("socket");
    let client = client_for(&socket, Duration::from_secs(2));
    assert!(
        client.daemon_info().expect("connected").shared_memory,
        "a unix client uses shared memory"
    );
    let before = tiny_call(&client).expect("first call");

    // Freeze the daemon so a call is surely in flight, then kill it.
    first.signal("STOP");
    std::thread::scope(|s| {
        let in_flight = s.spawn(|| tiny_call(&client));
        std::thread::sleep(Duration::from_millis(300));
        first.signal("KILL");
        let err = in_flight
            .join()
            .expect("join")
            .expect_err("the call in flight must fail");
        let msg = err.to_string();
        assert!(
            msg.contains("expertd") && msg.contains(&socket.display().to_string()),
            "{msg}"
        );
    });
    // Keep the first daemon's directory (and so the socket path) alive across the restart.
    let first_dir = std::mem::replace(&mut first._dir, tempfile::tempdir().expect("tempdir"));
    drop(first);

    // Restart on the same socket path (the stale socket file is replaced).
    let second = Daemon::start_at(&container, budget, None, &[], Some(&socket));
    let after = tiny_call(&client).expect("the client reconnects to the restarted daemon");
    assert_eq!(
        before.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        after.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    drop(second);

    // With no daemon at all, a call fails after the reconnect window, naming the address.
    let err = tiny_call(&client).expect_err("no daemon");
    assert!(err.to_string().contains("expertd"), "{err}");
    drop(first_dir);
}

#[test]
fn malformed_calls_get_specific_statuses_and_the_daemon_keeps_serving() {
    let (work, container) = work_with_container("tiny");
    let daemon = InProcessDaemon::unix(whole_container(&container));
    let socket = daemon.socket();
    let tiny_identity = ModelIdentity::of_checkpoint(
        &shared::checkpoint::Checkpoint::open(&model_dir("tiny")).expect("ckpt"),
    )
    .expect("identity");
    let small_identity = ModelIdentity::of_checkpoint(
        &shared::checkpoint::Checkpoint::open(&model_dir("small")).expect("ckpt"),
    )
    .expect("identity");
    rt().block_on(async {
        let mut c = raw_unix(socket).await;
        check_status("unknown session", c.moe_layer(valid_call(42)).await, Code::NotFound, "unknown session 42");
        let old = pb::HandshakeRequest { protocol_version: 1, ..handshake_request(None) };
        check_status("old version", c.handshake(old).await, Code::FailedPrecondition, "protocol version 1");
        let fp = pb::HandshakeRequest { expected_container_fingerprint: 0x1234, ..handshake_request(None) };
        check_status("wrong fingerprint", c.handshake(fp).await, Code::FailedPrecondition, "0x0000000000001234");
        check_status("wrong model", c.handshake(handshake_request(Some(&small_identity))).await, Code::FailedPrecondition, "different model");
        let hs = c.handshake(handshake_request(Some(&tiny_identity))).await.expect("handshake").into_inner();
        assert_eq!(hs.transport, pb::Transport::Inline as i32, "no pre-handshake: inline");
        let sid = hs.session_id;

        let cases: Vec<(&str, pb::MoeLayerRequest, Code, &str)> = vec![
            ("layer out of range", pb::MoeLayerRequest { layer_idx: 4, ..valid_call(sid) }, Code::InvalidArgument, "layer 4 out of range"),
            ("expert out of range", pb::MoeLayerRequest { expert_ids: vec![0, 8, 2, 3], ..valid_call(sid) }, Code::InvalidArgument, "expert 8 out of range"),
            ("ids length", pb::MoeLayerRequest { expert_ids: vec![0, 1, 2], ..valid_call(sid) }, Code::InvalidArgument, "n_tokens × top_k"),
            ("weights length", pb::MoeLayerRequest { weights: vec![1.0; 5], ..valid_call(sid) }, Code::InvalidArgument, "n_tokens × top_k"),
            ("duplicate expert", pb::MoeLayerRequest { expert_ids: vec![0, 1, 3, 3], ..valid_call(sid) }, Code::InvalidArgument, "expert 3 chosen twice"),
            ("NaN weight", pb::MoeLayerRequest { weights: vec![0.5, f32::NAN, 0.5, 0.5], ..valid_call(sid) }, Code::InvalidArgument, "not finite"),
            ("infinite weight", pb::MoeLayerRequest { weights: vec![0.5, 0.5, f32::INFINITY, 0.5], ..valid_call(sid) }, Code::InvalidArgument, "not finite"),
            ("zero rows", pb::MoeLayerRequest { n_tokens: 0, expert_ids: vec![], weights: vec![], ..valid_call(sid) }, Code::InvalidArgument, "n_tokens 0"),
            (
                "input too small",
                pb::MoeLayerRequest { input: Some(Input::InputInlineF32Le(vec![0; 100])), ..valid_call(sid) },
                Code::InvalidArgument,
                "holds 100 bytes",
            ),
            ("no input", pb::MoeLayerRequest { input: None, ..valid_call(sid) }, Code::InvalidArgument, "no activations"),
            (
                // Finite, but the experts' sums overflow: refused, not returned as NaN (issue 37).
                "huge finite activations",
                pb::MoeLayerRequest {
                    input: Some(Input::InputInlineF32Le(proto::convert::f32s_to_le_bytes(&vec![3e38; 2 * HIDDEN_TINY]))),
                    ..valid_call(sid)
                },
                Code::InvalidArgument,
                "output of row 0 is not finite",
            ),
            (
                "shared memory without a segment",
                pb::MoeLayerRequest {
                    input: Some(Input::InputShm(pb::ShmSlice { segment_id: 1, offset_bytes: 64, length_bytes: 512, dtype: pb::Dtype::F32 as i32 })),
                    ..valid_call(sid)
                },
                Code::FailedPrecondition,
                "passed no segment",
            ),
        ];
        for (what, req, code, needle) in cases {
            check_status(what, c.moe_layer(req).await, code, needle);
        }
        // After every refusal the same session still computes.
        let ok = c.moe_layer(valid_call(sid)).await.expect("valid call").into_inner();
        assert!(matches!(ok.output, Some(pb::moe_layer_response::Output::OutputInlineF32Le(ref b)) if b.len() == 2 * HIDDEN_TINY * 4));
        let s = c.stats(pb::StatsRequest {}).await.expect("stats").into_inner();
        assert_eq!(s.sessions.len(), 1);
        // Ids and weights unequal in number are refused by the codec's scan, before decoding,
        // so before the session is looked up: those two are not the session's failures.
        assert!(s.sessions[0].failed_calls >= 9 && s.sessions[0].calls == 1, "{:?}", s.sessions[0]);
        c.close_session(pb::CloseSessionRequest { session_id: sid }).await.expect("close");
        check_status("closed session", c.moe_layer(valid_call(sid)).await, Code::NotFound, "unknown session");
    });

    // A unix peer outside --allow-uid is refused.
    let restricted = InProcessDaemon::unix(ServeConfig {
        allow_uids: vec![54321],
        ..whole_container(&container)
    });
    rt().block_on(async {
        let mut c = raw_unix(restricted.socket()).await;
        check_status(
            "uid not allowed",
            c.handshake(handshake_request(None)).await,
            Code::PermissionDenied,
            "not allowed",
        );
    });
    // Its shared-memory segment is refused unread: the allow lists are applied before the
    // pre-handshake looks at a descriptor (issue 37 (b)). The same hello to a daemon without
    // allow lists is accepted, so the refusal is the allow list's.
    let layout = shared::shm_layout::SlotLayout::new(2, 4, HIDDEN_TINY).expect("layout");
    let seg = hostd::expert_client::shm::ClientSegment::create(layout).expect("segment");
    let hello = |socket: &Path| {
        let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
        hostd::expert_client::shm::send_hello(&mut s, Some(&seg))
            .expect("hello")
            .status
    };
    assert_eq!(
        hello(restricted.socket()),
        shared::shm_layout::REPLY_SEGMENT_REFUSED,
        "a disallowed peer's segment was accepted"
    );
    let open = InProcessDaemon::unix(whole_container(&container));
    assert_eq!(hello(open.socket()), shared::shm_layout::REPLY_OK);

    // TCP needs the bearer token.
    let tcp = InProcessDaemon::tcp(ServeConfig {
        auth_token: Some("open-sesame".into()),
        insecure_tcp: true,
        ..whole_container(&container)
    });
    rt().block_on(async {
        let mut c = ExpertServiceClient::connect(tcp.uri())
            .await
            .expect("tcp connect");
        check_status(
            "no token",
            c.handshake(handshake_request(None)).await,
            Code::Unauthenticated,
            "missing",
        );
        let mut wrong = tonic::Request::new(handshake_request(None));
        wrong.metadata_mut().insert(
            "authorization",
            "Bearer open-sesamE".parse().expect("ascii"),
        );
        check_status(
            "wrong token",
            c.handshake(wrong).await,
            Code::Unauthenticated,
            "does not match",
        );
        let mut right = tonic::Request::new(handshake_request(None));
        right.metadata_mut().insert(
            "authorization",
            "Bearer open-sesame".parse().expect("ascii"),
        );
        c.handshake(right)
            .await
            .expect("the right token is accepted");
    });
    // The command line refuses TCP without a token, and without TLS or --insecure.
    let token = work.path().join("token");
    std::fs::write(&token, "open-sesame").expect("token");
    let out = Command::new(workspace_bin("expertd"))
        .args([
            "serve",
            "--container",
            container.to_str().expect("utf-8"),
            "--cache-bytes",
            "0",
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .expect("spawn expertd");
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--auth-token-file"),
        "TCP without a token must be refused"
    );
    let out = Command::new(workspace_bin("expertd"))
        .args([
            "serve",
            "--container",
            container.to_str().expect("utf-8"),
            "--cache-bytes",
            "0",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--auth-token-file")
        .arg(&token)
        .output()
        .expect("spawn expertd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--tls-cert") && stderr.contains("--insecure"),
        "TCP without TLS or --insecure must be refused: {stderr}"
    );
}

#[test]
fn a_corrupted_blob_is_data_loss_for_that_expert_only() {
    let (_work, container) = work_with_container("tiny");
    // Flip one byte of layer 0 expert 1's packed weights.
    tests::corrupt_blobs(&container, &[1], 100);
    let daemon = InProcessDaemon::unix(whole_container(&container));
    rt().block_on(async {
        let (mut c, sid) = raw_session(daemon.socket()).await;
        let s = c
            .moe_layer(valid_call(sid))
            .await
            .expect_err("expert 1 is corrupt");
        assert_eq!(s.code(), Code::DataLoss, "{}", s.message());
        assert!(s.message().contains("layer 0 expert 1"), "{}", s.message());
        assert_eq!(
            s.metadata()
                .get("expertd-expert")
                .and_then(|v| v.to_str().ok()),
            Some("1")
        );
        // Other experts still serve, and the corrupt one is refused again (never cached).
        let other = pb::MoeLayerRequest {
            expert_ids: vec![2, 3, 4, 5],
            ..valid_call(sid)
        };
        c.moe_layer(other).await.expect("experts 2..5 are intact");
        let again = c
            .moe_layer(valid_call(sid))
            .await
            .expect_err("still corrupt");
        assert_eq!(again.code(), Code::DataLoss);
    });
}

/// A call whose experts exceed everything the cache can lend (a prefill under a tiny budget and
/// no spare transient buffers) runs in waves instead of failing, with identical results.
#[test]
fn a_call_larger_than_the_cache_runs_in_waves() {
    let (work, container) = work_with_container("small");
    let prompts = prompts_file("small", work.path(), 1);
    let c = container.to_str().expect("utf-8");
    let baseline = eval(
        "small",
        &prompts,
        work.path(),
        "int8",
        &["--experts", "int8", "--container", c],
    );
    // 2 resident slots + 1 transient buffer: a 70-token prefill routes to all 16 experts.
    let daemon = Daemon::unix(
        &container,
        2 * blob_stride(&container),
        &["--transient-slots", "1"],
    );
    let waves = eval(
        "small",
        &prompts,
        work.path(),
        "waves",
        &["--expertd", &daemon.uri()],
    );
    assert_eq!(waves, baseline, "results do not depend on waves");
    assert_eq!(daemon.stop().code(), Some(0));
}
