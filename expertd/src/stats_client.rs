//! `expertd stats`: asks a running daemon for its counters over its unix socket (the `Stats`
//! RPC, the same snapshot the Prometheus endpoint renders) and prints them as the endpoint
//! would (OpenMetrics text), or as the raw `Stats` answer in JSON-like debug form.

use anyhow::Context as _;
use proto::v1 as pb;
use proto::v1::expert_service_client::ExpertServiceClient;
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `expertd stats`.
#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// The daemon's unix socket.
    #[arg(long, env = "EXPERTD_SOCKET")]
    pub socket: PathBuf,
    /// Print the `Stats` answer field by field instead of the Prometheus text.
    #[arg(long)]
    pub raw: bool,
}

/// How long `expertd stats` waits for the daemon.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Fetches one `Stats` snapshot over `socket` (plain HTTP/2, no shared-memory pre-handshake).
pub async fn fetch(socket: PathBuf) -> anyhow::Result<pb::StatsResponse> {
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://expertd.local")
        .connect_timeout(TIMEOUT)
        .timeout(TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .with_context(|| format!("connecting to expertd at {}", socket.display()))?;
    let mut client = ExpertServiceClient::new(channel);
    let stats = client
        .stats(pb::StatsRequest {})
        .await
        .with_context(|| format!("Stats from expertd at {}", socket.display()))?;
    Ok(stats.into_inner())
}

/// Runs `expertd stats`.
pub fn stats(args: &StatsArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let stats = rt.block_on(fetch(args.socket.clone()))?;
    if args.raw {
        println!("{stats:#?}");
    } else {
        print!("{}", crate::metrics::render(&stats));
    }
    Ok(())
}
