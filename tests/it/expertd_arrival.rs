//! What a gRPC client can make expertd hold while its requests arrive (issue 37, item 2): a
//! raw HTTP/2 client, running as another uid than the victim, opens many `MoeLayer` streams on
//! several connections, each declaring a third of the largest admissible message in its length
//! prefix, sends a little of it and never finishes. The daemon counts each message from its
//! prefix against `--max-queued-bytes` (wire bytes plus what they may decode to) and the
//! peer's share of it (three quarters), so all but what the share admits are refused at once
//! with RESOURCE_EXHAUSTED; the streams it did admit are cut off with DEADLINE_EXCEEDED when
//! `--request-arrival-timeout-secs` passes, and the count returns to zero. Meanwhile the other
//! peer's calls are admitted and answered, bit-identical to before.

use super::expertd::{handshake_request, output, raw_unix, rt, valid_call, whole_container};
use expertd::server::ServeConfig;
use prost::bytes::Bytes;
use proto::v1 as pb;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tests::{InProcessDaemon, work_with_container};

const CONNECTIONS: usize = 3;
const STREAMS: usize = 32;

/// A `MoeLayer` stream whose 5-byte prefix declares `declared` bytes, of which 1 KiB is sent;
/// the body is left open. Returns the stream's grpc-status once the daemon answers (its task
/// runs on the caller's runtime).
pub(crate) async fn stalled_upload(
    client: h2::client::SendRequest<Bytes>,
    declared: u32,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Option<i32>>,
) {
    let mut client = client.ready().await.expect("h2 ready");
    let req = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri("http://expertd/expertd.v1.ExpertService/MoeLayer")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut body) = client.send_request(req, false).expect("send_request");
    let mut data = vec![0u8; 5 + 1024];
    data[1..5].copy_from_slice(&declared.to_be_bytes());
    body.send_data(Bytes::from(data), false).expect("send_data");
    let answer = tokio::spawn(async move {
        // Kept open (not dropped, which would reset the stream) until the daemon answers.
        let _body = body;
        let resp = response.await.ok()?;
        let status = |h: &tonic::codegen::http::HeaderMap| {
            h.get("grpc-status")?.to_str().ok()?.parse::<i32>().ok()
        };
        if let Some(s) = status(resp.headers()) {
            return Some(s);
        }
        let mut recv = resp.into_body();
        while let Some(chunk) = recv.data().await {
            let _ = chunk.ok()?;
        }
        recv.trailers().await.ok()?.as_ref().and_then(status)
    });
    (client, answer)
}

pub(crate) async fn h2_connection(socket: &Path) -> h2::client::SendRequest<Bytes> {
    let io = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    let (client, conn) = h2::client::handshake(io).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// The uid the hostile clients run as: a peer other than the test's own uid 0.
pub(crate) const STRANGER: u32 = 65534;

/// Whether this process may run threads as [`STRANGER`]; skips (naming why) when not.
pub(crate) fn can_be_stranger(what: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    shared::skip::skip(
        "root",
        what,
        "running a client thread as another uid needs root",
    );
    false
}

/// Runs `f` on a thread whose uid is [`STRANGER`] (a per-thread `setuid`, so the rest of the
/// process keeps its own), so that the connections it opens are another peer's.
pub(crate) fn as_stranger<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        rustix::thread::set_thread_uid(rustix::process::Uid::from_raw(STRANGER))
            .expect("setuid for this thread");
        f()
    })
}

/// Lets every uid reach `socket` (its directory and itself); the daemon's allow lists decide.
pub(crate) fn open_to_everyone(socket: &Path) {
    let dir = socket.parent().expect("socket directory");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod dir");
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
}

/// Opens `connections × STREAMS` stalled uploads declaring `declared(i)` bytes each, reports
/// once they are all open, and returns every stream's grpc-status once the daemon answered.
pub(crate) async fn stalled_uploads(
    socket: &Path,
    connections: usize,
    mut declared: impl FnMut() -> u32,
    opened: std::sync::mpsc::Sender<()>,
) -> Vec<Option<i32>> {
    let mut answers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..connections {
        let mut client = h2_connection(socket).await;
        for _ in 0..STREAMS {
            let (c, answer) = stalled_upload(client, declared()).await;
            client = c;
            answers.push(answer);
        }
        clients.push(client);
    }
    let _ = opened.send(());
    let mut codes = Vec::new();
    for a in answers {
        let code = tokio::time::timeout(Duration::from_secs(30), a)
            .await
            .expect("a stalled upload was never answered")
            .expect("task");
        codes.push(code);
    }
    codes
}

#[test]
fn requests_still_arriving_are_counted_from_their_prefix_and_cut_off_when_slow() {
    if !can_be_stranger("the stalled-upload probe") {
        return;
    }
    let (_work, container) = work_with_container("tiny");
    let daemon = InProcessDaemon::unix(ServeConfig {
        compute_lanes: 1,
        request_arrival_limit: Duration::from_secs(8),
        ..whole_container(&container)
    });
    let socket = daemon.socket().to_path_buf();
    open_to_everyone(&socket);
    let rt = rt();
    let mut victim = rt.block_on(raw_unix(&socket));
    let hs = rt
        .block_on(victim.handshake(handshake_request(None)))
        .expect("handshake")
        .into_inner();
    let largest = hs.limits.expect("limits").max_message_bytes;
    let call = |victim: &mut proto::v1::expert_service_client::ExpertServiceClient<_>| {
        rt.block_on(victim.moe_layer(valid_call(hs.session_id)))
            .map(|r| output(r.into_inner()))
    };
    let baseline = call(&mut victim).expect("victim call");

    // A third of the largest message each: counted as the largest message's wire bytes, so
    // four would fill the default cap (one largest request per lane plus one arriving at 3×,
    // with one lane: 4 × largest), but the stranger's share (three quarters) admits three.
    let third = (largest / 3) as u32;
    let (opened_tx, opened) = std::sync::mpsc::channel();
    let sock = socket.clone();
    let hostile = as_stranger(move || {
        super::expertd::rt().block_on(stalled_uploads(&sock, CONNECTIONS, || third, opened_tx))
    });
    opened.recv().expect("the stranger's streams are open");
    let stats = |v: &mut proto::v1::expert_service_client::ExpertServiceClient<_>| {
        rt.block_on(v.stats(pb::StatsRequest {}))
            .expect("stats")
            .into_inner()
    };
    let streams = (CONNECTIONS * STREAMS) as u64;
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut st = stats(&mut victim);
    while st.queue_full_refusals < streams - 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        st = stats(&mut victim);
    }
    eprintln!(
        "{streams} streams declaring {third} B each: {} B counted, {} refused",
        st.queued_request_bytes, st.queue_full_refusals
    );
    assert_eq!(st.queued_request_bytes, 9 * u64::from(third), "{st:?}");
    assert_eq!(st.queue_full_refusals, streams - 3, "{st:?}");

    // Meanwhile the victim (another peer) finds its quarter of the cap, and computes the same.
    for _ in 0..5 {
        let again = call(&mut victim).expect("victim call during the stalled uploads");
        assert_eq!(again, baseline, "the victim's output changed");
    }

    // Every stream is answered: refused at its prefix, or cut off at the arrival limit.
    let mut codes = std::collections::BTreeMap::new();
    for code in hostile.join().expect("the stranger's thread") {
        *codes.entry(code).or_insert(0) += 1;
    }
    eprintln!("grpc-status of the stalled streams: {codes:?}");
    let exhausted = Some(tonic::Code::ResourceExhausted as i32);
    let deadline_exceeded = Some(tonic::Code::DeadlineExceeded as i32);
    assert_eq!(codes.get(&exhausted), Some(&(streams as usize - 3)));
    assert_eq!(codes.get(&deadline_exceeded), Some(&3));
    let st = stats(&mut victim);
    assert_eq!(st.queued_request_bytes, 0, "bytes still counted: {st:?}");
    let again = call(&mut victim).expect("victim call afterwards");
    assert_eq!(again, baseline, "the victim's output changed");
}
