//! What a gRPC client can make expertd hold while its requests arrive (issue 37, item 2): a
//! raw HTTP/2 client opens many `MoeLayer` streams on several connections, each declaring a
//! message of the largest admissible size in its length prefix, sends a little of it and never
//! finishes. The daemon counts each message from its prefix against `--max-queued-bytes`
//! (wire bytes plus what they may decode to), so all but what fits are refused at once with
//! RESOURCE_EXHAUSTED; the streams it did admit are cut off with DEADLINE_EXCEEDED when
//! `--request-arrival-timeout-secs` passes, and the count returns to zero. Meanwhile another
//! session's calls are answered, bit-identical to before.

use super::expertd::{handshake_request, output, raw_unix, rt, valid_call, whole_container};
use expertd::server::ServeConfig;
use prost::bytes::Bytes;
use proto::v1 as pb;
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

#[test]
fn requests_still_arriving_are_counted_from_their_prefix_and_cut_off_when_slow() {
    let (_work, container) = work_with_container("tiny");
    let daemon = InProcessDaemon::unix(ServeConfig {
        compute_lanes: 1,
        request_arrival_limit: Duration::from_secs(3),
        ..whole_container(&container)
    });
    let socket = daemon.socket().to_path_buf();
    rt().block_on(async {
        let mut victim = raw_unix(&socket).await;
        let hs = victim
            .handshake(handshake_request(None))
            .await
            .expect("handshake")
            .into_inner();
        let largest = hs.limits.expect("limits").max_message_bytes;
        let baseline = output(
            victim
                .moe_layer(valid_call(hs.session_id))
                .await
                .expect("victim call")
                .into_inner(),
        );

        let mut answers = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..CONNECTIONS {
            let mut client = h2_connection(&socket).await;
            for _ in 0..STREAMS {
                let (c, answer) = stalled_upload(client, largest as u32).await;
                client = c;
                answers.push(answer);
            }
            clients.push(client);
        }
        // Every stream's prefix has been read once all but the admitted ones are answered.
        let stats = |v: &mut proto::v1::expert_service_client::ExpertServiceClient<_>| {
            let mut v = v.clone();
            async move {
                v.stats(pb::StatsRequest {})
                    .await
                    .expect("stats")
                    .into_inner()
            }
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut st = stats(&mut victim).await;
        while st.queue_full_refusals < (CONNECTIONS * STREAMS) as u64 - 1
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
            st = stats(&mut victim).await;
        }
        let counted = 3 * largest;
        eprintln!(
            "{} streams declaring {largest} B each: {} B counted, {} refused",
            CONNECTIONS * STREAMS,
            st.queued_request_bytes,
            st.queue_full_refusals
        );
        // The default cap (one largest request per lane plus one arriving, counted 3× while
        // it arrives) admits exactly one stalled stream of the largest size.
        assert_eq!(st.queued_request_bytes, counted, "{st:?}");
        assert_eq!(
            st.queue_full_refusals,
            (CONNECTIONS * STREAMS) as u64 - 1,
            "{st:?}"
        );

        // Meanwhile another session's calls still fit, and compute the same.
        for _ in 0..5 {
            let again = output(
                victim
                    .moe_layer(valid_call(hs.session_id))
                    .await
                    .expect("victim call during the stalled uploads")
                    .into_inner(),
            );
            assert_eq!(again, baseline, "the victim's output changed");
        }

        // Every stream is answered: refused at its prefix, or cut off at the arrival limit.
        let mut codes = std::collections::BTreeMap::new();
        for a in answers {
            let code = tokio::time::timeout(Duration::from_secs(10), a)
                .await
                .expect("every stalled stream is answered within the arrival limit")
                .expect("task");
            *codes.entry(code).or_insert(0) += 1;
        }
        eprintln!("grpc-status of the stalled streams: {codes:?}");
        let exhausted = Some(tonic::Code::ResourceExhausted as i32);
        let deadline_exceeded = Some(tonic::Code::DeadlineExceeded as i32);
        assert_eq!(codes.get(&exhausted), Some(&(CONNECTIONS * STREAMS - 1)));
        assert_eq!(codes.get(&deadline_exceeded), Some(&1));
        let st = stats(&mut victim).await;
        assert_eq!(st.queued_request_bytes, 0, "bytes still counted: {st:?}");
        drop(clients);
        let again = output(
            victim
                .moe_layer(valid_call(hs.session_id))
                .await
                .expect("victim call afterwards")
                .into_inner(),
        );
        assert_eq!(again, baseline, "the victim's output changed");
    });
}
