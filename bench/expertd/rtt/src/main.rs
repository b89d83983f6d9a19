//! Per-call round trip of hostd's real expertd client (`hostd::expert_client::ExpertdClient`,
//! the same code `hostd run --expertd` uses) against a running `expertd serve`.
//!
//! usage: expertd-rtt URI N_LAYERS N_EXPERTS HIDDEN TOP_K CALLS [--no-shm] [--token-file F]
//!
//! Every call is one `moe_layer` on layer 0 with one row, experts 0..TOP_K, weights 1/TOP_K.
//! 200 warm-up calls first (they also make the experts resident), then CALLS timed calls, each
//! timed on its own with `Instant` around `ExpertBackend::moe_layer` (validation, request
//! build, activations into shm or protobuf, gRPC round trip, daemon acquire/compute/release,
//! output copy back). Prints one JSON line: median, p10, p90, p99, mean in microseconds.
use hostd::expert_client::{ClientOptions, Endpoint, ExpertdClient};
use hostd::experts::{ExpertBackend, MoeCall};
use std::time::Instant;

/// `expertd-rtt stats /PATH/TO/SOCKET`: the daemon's Stats RPC (cache counters) as one JSON line.
fn stats(socket: &str) {
    let socket = std::path::PathBuf::from(socket);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(async move {
        let channel = tonic::transport::Endpoint::from_static("http://expertd.stats")
            .connect_with_connector(tower::service_fn(move |_| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .expect("connect");
        let mut c = proto::v1::expert_service_client::ExpertServiceClient::new(channel);
        c.stats(proto::v1::StatsRequest {})
            .await
            .expect("stats")
            .into_inner()
    });
    let c = s.cache.expect("cache stats");
    println!(
        "{{\"budget_bytes\":{},\"resident_bytes\":{},\"resident_experts\":{},\"leases_held\":{},\"hits\":{},\"misses\":{},\"evictions\":{},\"bytes_read\":{},\"sessions_open\":{},\"transient_uses\":{},\"open_sessions\":{}}}",
        c.budget_bytes,
        c.resident_bytes,
        c.resident_experts,
        c.leases_held,
        c.hits,
        c.misses,
        c.evictions,
        c.bytes_read,
        c.sessions_open,
        c.transient_uses,
        s.sessions.len()
    );
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() == 3 && a[1] == "stats" {
        return stats(&a[2]);
    }
    if a.len() < 7 {
        eprintln!(
            "usage: expertd-rtt URI N_LAYERS N_EXPERTS HIDDEN TOP_K CALLS [--no-shm] [--token-file F]"
        );
        std::process::exit(2);
    }
    let uri = &a[1];
    let n_layers: usize = a[2].parse().unwrap();
    let n_experts: usize = a[3].parse().unwrap();
    let hidden: usize = a[4].parse().unwrap();
    let top_k: usize = a[5].parse().unwrap();
    let calls: usize = a[6].parse().unwrap();
    let mut opts = ClientOptions::new(Endpoint::parse(uri).unwrap(), n_layers, n_experts, hidden);
    opts.client_name = "expertd-rtt".into();
    let mut i = 7;
    while i < a.len() {
        match a[i].as_str() {
            "--no-shm" => opts.shm = false,
            "--token-file" => {
                i += 1;
                opts.token = Some(std::fs::read_to_string(&a[i]).unwrap().trim().to_string());
            }
            other => panic!("unknown flag {other}"),
        }
        i += 1;
    }
    let client = ExpertdClient::connect(opts, None).expect("connect");
    let info = client.daemon_info().expect("connected");
    let x: Vec<f32> = (0..hidden).map(|i| ((i as f32) * 0.37).sin()).collect();
    let ids: Vec<u32> = (0..top_k as u32).collect();
    let w = vec![1.0 / top_k as f32; top_k];
    let mut out = vec![0.0f32; hidden];
    let call = MoeCall {
        layer: shared::ids::LayerId::new(0),
        n_rows: 1,
        top_k,
        x: &x,
        ids: &ids,
        weights: &w,
    };
    for _ in 0..200 {
        client.moe_layer(&call, &mut out).expect("warm-up call");
    }
    let mut us: Vec<f64> = Vec::with_capacity(calls);
    let t_all = Instant::now();
    for _ in 0..calls {
        let t = Instant::now();
        client.moe_layer(&call, &mut out).expect("call");
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let total = t_all.elapsed().as_secs_f64();
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
    println!(
        "{{\"uri\":\"{uri}\",\"shared_memory\":{},\"kernel_isa\":\"{}\",\"io\":\"{}\",\"hidden\":{hidden},\"top_k\":{top_k},\"calls\":{calls},\"median_us\":{:.2},\"p10_us\":{:.2},\"p90_us\":{:.2},\"p99_us\":{:.2},\"mean_us\":{:.2},\"calls_per_s\":{:.1}}}",
        info.shared_memory,
        info.kernel_isa,
        info.io_backend,
        q(0.5),
        q(0.1),
        q(0.9),
        q(0.99),
        mean,
        calls as f64 / total
    );
}
