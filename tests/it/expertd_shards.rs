//! Experts sharded over several expertd daemons, and expertd over TCP with TLS: two daemons on
//! the same container, one on a unix socket serving the first layers and one on TCP+TLS (a CA
//! and certificate generated here with rcgen) serving the rest, give `hostd eval` logits
//! byte-equal to one daemon's, each daemon seeing only its own layers; killing one shard fails
//! only its layers' calls, naming it; a TLS daemon refuses plain-TCP clients, wrong tokens and
//! clients that do not trust its CA; hostd refuses gaps, overlaps, daemons on another
//! container, `http://` without `--expertd-insecure` and `https://` without a CA file. The
//! refusal tests run the daemons in this process ([`InProcessDaemon`]); the eval and kill tests
//! run the `expertd serve` binary.

use crate::expertd::{
    Daemon, HIDDEN_TINY, activations, check_status, container_bytes, eval, handshake_request,
    prompts_file, rt, whole_container,
};
use expertd::server::{ServeConfig, TlsIdentity};
use hostd::expert_client::health::Readiness;
use hostd::expert_client::{
    CaCertificate, ClientOptions, Endpoint, ExpertClientError, ExpertdClient, ShardSpec,
    ShardedExperts,
};
use hostd::experts::{ExpertBackend, MoeCall};
use proto::v1::expert_service_client::ExpertServiceClient;
use shared::ids::LayerId;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tests::{InProcessDaemon, model_dir, prepare_container, work_with_container, workspace_bin};
use tonic::Code;

const TOKEN: &str = "shard-s3cret";

/// A test CA and a server certificate it signed for 127.0.0.1 and localhost, as PEM files.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn make_pki(dir: &Path, tag: &str) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("sluice test CA {tag}"));
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
        .expect("ca cert");
    let key = KeyPair::generate().expect("server key");
    let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("server params");
    let cert = params.signed_by(&key, &*ca).expect("server cert");
    let pki = Pki {
        ca: dir.join(format!("{tag}-ca.pem")),
        cert: dir.join(format!("{tag}-cert.pem")),
        key: dir.join(format!("{tag}-key.pem")),
    };
    std::fs::write(&pki.ca, ca.pem()).expect("write ca");
    std::fs::write(&pki.cert, cert.pem()).expect("write cert");
    std::fs::write(&pki.key, key.serialize_pem()).expect("write key");
    pki
}

fn token_file(dir: &Path) -> PathBuf {
    let p = dir.join("token");
    std::fs::write(&p, format!("{TOKEN}\n")).expect("token");
    p
}

fn tls_daemon(container: &Path, token: &Path, pki: &Pki, extra: &[&str]) -> Daemon {
    let mut args = vec![
        "--tls-cert",
        pki.cert.to_str().expect("utf-8"),
        "--tls-key",
        pki.key.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    Daemon::start(container, container_bytes(container), Some(token), &args)
}

/// [`tls_daemon`] in this process: TLS with `pki`'s certificate, [`TOKEN`] required.
fn tls_in_process(container: &Path, pki: &Pki) -> InProcessDaemon {
    InProcessDaemon::tcp(ServeConfig {
        auth_token: Some(TOKEN.into()),
        tls: Some(TlsIdentity::read(&pki.cert, &pki.key).expect("certificate and key")),
        ..whole_container(container)
    })
}

/// The layers a daemon's route trace saw calls for.
fn traced_layers(trace: &Path) -> std::collections::BTreeSet<u64> {
    std::fs::read_to_string(trace)
        .expect("route trace")
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["ev"] == "acquire")
        .map(|v| v["layer"].as_u64().expect("layer"))
        .collect()
}

#[test]
fn a_unix_shard_and_a_tls_shard_give_one_daemons_logits_each_serving_only_its_layers() {
    let (work, container) = work_with_container("tiny");
    let prompts = prompts_file("tiny", work.path(), 1);
    let (token, pki) = (token_file(work.path()), make_pki(work.path(), "a"));
    let (trace_a, trace_b) = (work.path().join("a.trace"), work.path().join("b.trace"));
    let single = Daemon::unix(&container, container_bytes(&container), &[]);
    let baseline = eval(
        "tiny",
        &prompts,
        work.path(),
        "single",
        &["--expertd", &single.uri()],
    );

    let a = Daemon::unix(
        &container,
        container_bytes(&container),
        &["--route-trace", trace_a.to_str().expect("utf-8")],
    );
    let b = tls_daemon(
        &container,
        &token,
        &pki,
        &["--route-trace", trace_b.to_str().expect("utf-8")],
    );
    assert!(b.uri().starts_with("https://"), "{}", b.uri());
    let (t, ca) = (
        token.to_str().expect("utf-8"),
        pki.ca.to_str().expect("utf-8"),
    );
    let sharded = eval(
        "tiny",
        &prompts,
        work.path(),
        "sharded",
        &[
            "--expertd",
            &format!("{}=0-1", a.uri()),
            "--expertd",
            &format!("{}=2-3", b.uri()),
            "--expertd-token-file",
            t,
            "--expertd-ca-file",
            ca,
        ],
    );
    assert_eq!(
        sharded, baseline,
        "two shards (unix 0-1, TLS 2-3) give one daemon's logits"
    );
    assert_eq!(a.stop().code(), Some(0));
    assert_eq!(b.stop().code(), Some(0));
    assert_eq!(
        traced_layers(&trace_a),
        [0, 1].into(),
        "the unix shard served layers 0-1 only"
    );
    assert_eq!(
        traced_layers(&trace_b),
        [2, 3].into(),
        "the TLS shard served layers 2-3 only"
    );

    // The whole model through the TLS daemon alone, too.
    let b = tls_daemon(&container, &token, &pki, &[]);
    let over_tls = eval(
        "tiny",
        &prompts,
        work.path(),
        "tls",
        &[
            "--expertd",
            &b.uri(),
            "--expertd-token-file",
            t,
            "--expertd-ca-file",
            ca,
        ],
    );
    assert_eq!(
        over_tls, baseline,
        "one TLS daemon gives the unix daemon's logits"
    );
}

fn base_options(token: &str) -> ClientOptions {
    let mut opts = ClientOptions::new(Endpoint::Unix("/nonexistent".into()), 4, 8, HIDDEN_TINY);
    opts.token = Some(token.to_string());
    opts.client_name = "shard test".into();
    opts.connect_timeout = Duration::from_secs(10);
    opts.reconnect_timeout = Duration::from_millis(500);
    opts.call_timeout = Duration::from_secs(5);
    opts.health_interval = Some(Duration::from_millis(100));
    opts
}

fn https_spec(arg: &str, ca: &Path) -> ShardSpec {
    let mut spec = ShardSpec::parse(arg).expect("spec");
    spec.endpoint = spec
        .endpoint
        .with_ca(Some(CaCertificate::read(ca).expect("ca")));
    spec
}

fn layer_call(
    backend: &dyn ExpertBackend,
    layer: usize,
) -> Result<Vec<u32>, hostd::experts::ExpertError> {
    let x = activations(3, HIDDEN_TINY);
    let call = MoeCall {
        layer: LayerId::from_index(layer),
        n_rows: 3,
        top_k: 2,
        x: &x,
        ids: &[4, 5, 6, 7, 0, 4],
        weights: &[0.6, 0.4, 0.3, 0.7, 0.5, 0.5],
    };
    let mut out = vec![0.0f32; 3 * HIDDEN_TINY];
    backend
        .moe_layer(&call, &mut out)
        .map(|()| out.iter().map(|v| v.to_bits()).collect())
}

#[test]
fn killing_one_shard_fails_only_its_layers_calls_naming_it() {
    let (work, container) = work_with_container("tiny");
    let (token, pki) = (token_file(work.path()), make_pki(work.path(), "k"));
    let a = Daemon::unix(&container, container_bytes(&container), &[]);
    let b = tls_daemon(&container, &token, &pki, &[]);
    let single = ExpertdClient::connect(
        ClientOptions {
            endpoint: Endpoint::Unix(a.socket.clone().expect("socket")),
            ..base_options(TOKEN)
        },
        None,
    )
    .expect("single");
    let specs = vec![
        ShardSpec::parse(&format!("{}=0-1", a.uri())).expect("spec"),
        https_spec(&format!("{}=2-3", b.uri()), &pki.ca),
    ];
    let sharded =
        ShardedExperts::connect(&base_options(TOKEN), specs).expect("connect both shards");
    assert_eq!(
        sharded.shards(),
        vec![(a.uri(), "0-1".to_string()), (b.uri(), "2-3".to_string())]
    );
    let before: Vec<Vec<u32>> = (0..4)
        .map(|l| layer_call(&sharded, l).expect("every layer answers"))
        .collect();
    for (l, bits) in before.iter().enumerate() {
        assert_eq!(
            bits,
            &layer_call(&single, l).expect("single"),
            "layer {l}: a shard computes what one daemon computes"
        );
    }

    b.signal("KILL");
    for layer in [2, 3] {
        let err = layer_call(&sharded, layer)
            .expect_err("the killed shard's layers fail")
            .to_string();
        assert!(
            err.contains(&b.uri()) && err.contains(&format!("layer {layer}")),
            "layer {layer}: {err}"
        );
    }
    for layer in [0, 1] {
        assert_eq!(
            layer_call(&sharded, layer).expect("the live shard's layers still answer"),
            before[layer],
            "layer {layer}"
        );
    }
    let health = sharded.health().expect("health");
    assert_eq!(health.readiness, Readiness::Unavailable, "{health:?}");
    let reason = health.reason.expect("reason");
    assert!(
        reason.contains(&b.uri()) && !reason.contains(&a.uri()),
        "{reason}"
    );
}

#[test]
fn a_tls_daemon_refuses_plain_tcp_wrong_tokens_and_clients_without_its_ca() {
    let (work, container) = work_with_container("tiny");
    let (token, pki, other) = (
        token_file(work.path()),
        make_pki(work.path(), "t"),
        make_pki(work.path(), "other"),
    );
    let b = tls_in_process(&container, &pki);
    let plain_uri = b.uri().replacen("https://", "http://", 1);
    let bearer = |t: &str| -> tonic::Request<proto::v1::HandshakeRequest> {
        let mut r = tonic::Request::new(handshake_request(None));
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
        r
    };
    rt().block_on(async {
        // Plain HTTP/2 to the TLS port: no answer, even with the right token.
        let plain = async {
            ExpertServiceClient::connect(plain_uri.clone())
                .await
                .map_err(|e| e.to_string())?
                .handshake(bearer(TOKEN))
                .await
                .map_err(|e| e.to_string())
        };
        let r = tokio::time::timeout(Duration::from_secs(10), plain)
            .await
            .expect("a plain client is refused promptly");
        assert!(
            r.is_err(),
            "a plain-TCP client must not get a session from a TLS daemon: {r:?}"
        );

        let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
            tonic::transport::Certificate::from_pem(std::fs::read(&pki.ca).expect("ca")),
        );
        let ch = tonic::transport::Endpoint::from_shared(b.uri())
            .expect("uri")
            .tls_config(tls)
            .expect("tls")
            .connect()
            .await
            .expect("TLS connect");
        let mut c = ExpertServiceClient::new(ch);
        check_status(
            "TLS, no token",
            c.handshake(handshake_request(None)).await,
            Code::Unauthenticated,
            "missing",
        );
        check_status(
            "TLS, wrong token",
            c.handshake(bearer("shard-s3creT")).await,
            Code::Unauthenticated,
            "does not match",
        );
        c.handshake(bearer(TOKEN))
            .await
            .expect("TLS with the right token is served");
    });

    // hostd's client: plain TCP to the TLS port fails, naming the address.
    let plain = ExpertdClient::connect(
        ClientOptions {
            endpoint: Endpoint::parse(&plain_uri).expect("uri"),
            connect_timeout: Duration::from_secs(1),
            ..base_options(TOKEN)
        },
        None,
    )
    .expect_err("plain TCP to a TLS daemon");
    assert!(plain.to_string().contains(&plain_uri), "{plain}");
    // A client trusting another CA fails at once (no retrying), as a TLS error naming its CA file.
    let t = Instant::now();
    let untrusted = ExpertdClient::connect(
        ClientOptions {
            endpoint: https_spec(&b.uri(), &other.ca).endpoint,
            ..base_options(TOKEN)
        },
        None,
    )
    .expect_err("untrusted certificate");
    assert!(
        matches!(untrusted, ExpertClientError::Tls { .. }),
        "{untrusted:?}"
    );
    let msg = untrusted.to_string();
    assert!(
        msg.contains(&b.uri())
            && msg.contains("certificate")
            && msg.contains(&other.ca.display().to_string()),
        "{msg}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a certificate error is not waited on ({:?})",
        t.elapsed()
    );
    // A certificate or key that does not parse stops the daemon before it listens, naming both.
    let bad = work.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate\n").expect("bad pem");
    let out = Command::new(workspace_bin("expertd"))
        .args(["serve", "--cache-bytes", "0", "--listen", "127.0.0.1:0"])
        .arg("--container")
        .arg(&container)
        .arg("--auth-token-file")
        .arg(&token)
        .arg("--tls-cert")
        .arg(&bad)
        .arg("--tls-key")
        .arg(&bad)
        .output()
        .expect("spawn expertd");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("TLS")
            && stderr.contains(&bad.display().to_string()),
        "{stderr}"
    );
    // The right CA and token connect.
    ExpertdClient::connect(
        ClientOptions {
            endpoint: https_spec(&b.uri(), &pki.ca).endpoint,
            ..base_options(TOKEN)
        },
        None,
    )
    .expect("TLS with the right CA");
}

/// `hostd eval` on the tiny model with these backend flags must fail, its stderr holding every
/// one of `needles`.
fn refused(work: &Path, backend: &[&str], needles: &[&str]) {
    let prompts = prompts_file("tiny", work, 1);
    let o = Command::new(workspace_bin("hostd"))
        .arg("eval")
        .arg("--model")
        .arg(model_dir("tiny"))
        .arg("--prompts")
        .arg(&prompts)
        .arg("--new-tokens")
        .arg("1")
        .arg("--out")
        .arg(work.join("refused.json"))
        .args(backend)
        .output()
        .expect("spawn hostd");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "hostd {backend:?} must fail");
    for n in needles {
        assert!(
            stderr.contains(n),
            "hostd {backend:?}: stderr lacks {n:?}: {stderr}"
        );
    }
}

#[test]
fn hostd_refuses_gaps_overlaps_other_containers_and_unprotected_tcp_by_name() {
    let work = tempfile::tempdir().expect("tempdir");
    let (tiny, trained) = (work.path().join("tiny"), work.path().join("trained"));
    prepare_container(&model_dir("tiny"), &tiny);
    prepare_container(&model_dir("trained"), &trained);
    let a = InProcessDaemon::unix(whole_container(&tiny));
    let other = InProcessDaemon::unix(whole_container(&trained));
    let w = work.path();
    let (a0_1, a0_2) = (format!("{}=0-1", a.uri()), format!("{}=0-2", a.uri()));
    refused(
        w,
        &["--expertd", &a0_1, "--expertd", &format!("{}=3-3", a.uri())],
        &["no --expertd serves layer 2"],
    );
    refused(
        w,
        &["--expertd", &a0_2, "--expertd", &format!("{}=2-3", a.uri())],
        &["claim layer 2"],
    );
    refused(
        w,
        &["--expertd", &a0_1, "--expertd", &format!("{}=2-5", a.uri())],
        &["claims layers 2-5, but the model has 4 MoE layers (0-3)"],
    );
    refused(
        w,
        &[
            "--expertd",
            &a0_1,
            "--expertd",
            &format!("{}=2-3", other.uri()),
        ],
        &["layers 2-3", &other.uri(), "different model"],
    );
    refused(
        w,
        &[
            "--expertd",
            "http://127.0.0.1:9",
            "--expertd-token-file",
            "/dev/null",
        ],
        &["http://127.0.0.1:9", "--expertd-insecure"],
    );
    refused(
        w,
        &["--expertd", "https://127.0.0.1:9"],
        &["https://127.0.0.1:9", "--expertd-ca-file"],
    );
}
