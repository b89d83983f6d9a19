//! Experts sharded over several expertd daemons: [`ShardedExperts`] owns one [`ExpertdClient`]
//! per daemon, each serving a range of MoE layers (`--expertd unix:///run/sluice/a.sock=0-19
//! --expertd https://node2:7443=20-39`), and sends each layer's call to its owner.
//!
//! Before connecting, [`plan_layers`] checks that the ranges cover every layer exactly once
//! (naming the missing and doubly claimed layers and the endpoints); after connecting, every
//! daemon must serve the same container (each client checks the model identity, dimensions and
//! an expected fingerprint on its own; [`same_container`] then compares the fingerprints the
//! daemons reported with each other).
//!
//! Each shard keeps the single-daemon client's transport (the shared-memory ring on a unix
//! socket, inline gRPC over TCP), deadlines, reconnection and health probe. A shard that fails
//! fails only the calls of its layers, with an error naming its endpoint and the layer; the
//! other shards keep answering. `/health` reports the worst shard, naming it.

use super::health::{HealthReport, Readiness};
use super::transport::Endpoint;
use super::{ClientOptions, ExpertClientError, ExpertdClient};
use crate::experts::{ExpertBackend, ExpertError, MoeCall, SpeculativeCounters};
use crate::profile::Profiler;
use shared::ids::LayerId;
use std::ops::RangeInclusive;

/// One `--expertd` argument: the daemon and the layers it serves (`None`: all of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    /// The daemon.
    pub endpoint: Endpoint,
    /// Its layers, inclusive.
    pub layers: Option<RangeInclusive<usize>>,
}

impl ShardSpec {
    /// Parses `URI` or `URI=FIRST-LAST` (or `URI=LAYER`). The range follows the last `=`, and
    /// only when it reads as one: a unix path containing `=` still parses as a plain URI.
    pub fn parse(s: &str) -> Result<ShardSpec, String> {
        let (uri, layers) = match s.rsplit_once('=') {
            Some((uri, range))
                if !range.is_empty() && range.bytes().all(|b| b.is_ascii_digit() || b == b'-') =>
            {
                let bad = || {
                    format!(
                        "{s:?}: the layer range {range:?} is not FIRST-LAST (e.g. 0-19) or a single layer"
                    )
                };
                let (first, last) = match range.split_once('-') {
                    Some((a, b)) => (
                        a.parse::<usize>().map_err(|_| bad())?,
                        b.parse::<usize>().map_err(|_| bad())?,
                    ),
                    None => {
                        let l = range.parse::<usize>().map_err(|_| bad())?;
                        (l, l)
                    }
                };
                if first > last {
                    return Err(format!(
                        "{s:?}: the layer range {first}-{last} is empty (first > last)"
                    ));
                }
                (uri, Some(first..=last))
            }
            _ => (s, None),
        };
        Ok(ShardSpec {
            endpoint: Endpoint::parse(uri)?,
            layers,
        })
    }
}

/// `layer 3`, `layers 3-7`, `layers 0-1, 5`: for messages.
fn layers_text(layers: &[usize]) -> String {
    let runs = runs(layers);
    if layers.len() == 1 {
        format!("layer {runs}")
    } else {
        format!("layers {runs}")
    }
}

/// Layers as text: `3`, `3-7`, or a list of such runs.
fn runs(layers: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            layers[i].to_string()
        } else {
            format!("{}-{}", layers[i], layers[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// The owner (index into `shards`) of each of `n_layers` layers, or why the ranges do not
/// cover every layer exactly once.
pub fn plan_layers(n_layers: usize, shards: &[ShardSpec]) -> Result<Vec<usize>, String> {
    if shards.is_empty() {
        return Err("no --expertd endpoint given".into());
    }
    if let [one] = shards
        && one.layers.is_none()
    {
        return Ok(vec![0; n_layers]);
    }
    let mut claims: Vec<Vec<usize>> = vec![Vec::new(); n_layers];
    let mut problems = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        let Some(range) = &s.layers else {
            problems.push(format!(
                "--expertd {} has no layer range; with several daemons each needs =FIRST-LAST",
                s.endpoint
            ));
            continue;
        };
        if *range.end() >= n_layers {
            problems.push(format!(
                "--expertd {} claims layers {}-{}, but the model has {n_layers} MoE layers (0-{})",
                s.endpoint,
                range.start(),
                range.end(),
                n_layers.saturating_sub(1)
            ));
        }
        for l in range.clone().filter(|&l| l < n_layers) {
            claims[l].push(i);
        }
    }
    let missing: Vec<usize> = (0..n_layers).filter(|&l| claims[l].is_empty()).collect();
    if !missing.is_empty() {
        problems.push(format!("no --expertd serves {}", layers_text(&missing)));
    }
    // Overlaps, grouped by the pair of shards that both claim them.
    let mut pairs: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    for (l, owners) in claims.iter().enumerate() {
        for (a, &x) in owners.iter().enumerate() {
            for &y in &owners[a + 1..] {
                match pairs.iter_mut().find(|(p, _)| *p == (x, y)) {
                    Some((_, ls)) => ls.push(l),
                    None => pairs.push(((x, y), vec![l])),
                }
            }
        }
    }
    for ((x, y), ls) in pairs {
        problems.push(format!(
            "both --expertd {} and --expertd {} claim {}",
            shards[x].endpoint,
            shards[y].endpoint,
            layers_text(&ls)
        ));
    }
    if !problems.is_empty() {
        return Err(format!(
            "the --expertd layer ranges must cover each of the model's {n_layers} MoE layers exactly once: {}",
            problems.join("; ")
        ));
    }
    Ok(claims.into_iter().map(|o| o[0]).collect())
}

/// Checks that every daemon reported the same container fingerprint, naming the first that
/// differs from the first daemon's.
pub fn same_container(reported: &[(String, u64)]) -> Result<(), String> {
    let Some((first_ep, first)) = reported.first() else {
        return Ok(());
    };
    match reported.iter().find(|(_, f)| f != first) {
        Some((ep, f)) => Err(format!(
            "the sharded daemons serve different containers: {first_ep} serves fingerprint {first:#018x}, {ep} serves {f:#018x}; every shard must serve the same container (expertd verify prints its fingerprint)"
        )),
        None => Ok(()),
    }
}

/// One daemon and the layers it serves.
struct Shard {
    client: ExpertdClient,
    layers: String,
}

/// The expertd backend over several daemons, each serving its own layers.
pub struct ShardedExperts {
    shards: Vec<Shard>,
    /// The shard serving each layer.
    owner: Vec<usize>,
}

impl std::fmt::Debug for ShardedExperts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list: Vec<String> = self
            .shards
            .iter()
            .map(|s| format!("{}={}", s.client.endpoint(), s.layers))
            .collect();
        f.debug_struct("ShardedExperts")
            .field("shards", &list)
            .finish()
    }
}

/// Why the sharded backend could not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The ranges do not cover every layer exactly once, or the daemons disagree.
    #[error("{0}")]
    Plan(String),
    /// One daemon could not be connected (its handshake refused, unreachable).
    #[error("shard serving layers {layers}: {error}")]
    Connect {
        /// The shard's layers.
        layers: String,
        /// The client's error (naming the endpoint; shown in this one's text, so not chained
        /// as its source too).
        error: ExpertClientError,
    },
}

impl ShardedExperts {
    /// Checks the plan, connects every shard with `base`'s options (its endpoint replaced by
    /// the shard's), and checks that they serve one container.
    pub fn connect(
        base: &ClientOptions,
        specs: Vec<ShardSpec>,
    ) -> Result<ShardedExperts, ShardError> {
        let owner = plan_layers(base.n_layers, &specs).map_err(ShardError::Plan)?;
        let mut shards = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            let owned: Vec<usize> = (0..owner.len()).filter(|&l| owner[l] == i).collect();
            let layers = runs(&owned);
            let opts = ClientOptions {
                endpoint: spec.endpoint,
                client_name: format!("{} (layers {layers})", base.client_name),
                ..base.clone()
            };
            let client =
                ExpertdClient::connect(opts, None).map_err(|error| ShardError::Connect {
                    layers: layers.clone(),
                    error,
                })?;
            shards.push(Shard { client, layers });
        }
        let reported: Vec<(String, u64)> = shards
            .iter()
            .map(|s| {
                (
                    s.client.endpoint().to_string(),
                    s.client.daemon_info().map_or(0, |i| i.fingerprint),
                )
            })
            .collect();
        same_container(&reported).map_err(ShardError::Plan)?;
        for s in &shards {
            tracing::info!(endpoint = %s.client.endpoint(), layers = %s.layers, "expertd shard");
        }
        Ok(ShardedExperts { shards, owner })
    }

    /// Each shard's endpoint and layers (`0-19`), in the order given.
    pub fn shards(&self) -> Vec<(String, String)> {
        self.shards
            .iter()
            .map(|s| (s.client.endpoint().to_string(), s.layers.clone()))
            .collect()
    }

    fn owner_of(&self, layer: LayerId) -> Option<&Shard> {
        self.owner.get(layer.index()).map(|&i| &self.shards[i])
    }
}

impl ExpertBackend for ShardedExperts {
    fn name(&self) -> &'static str {
        "expertd"
    }

    /// Every shard serves the same container (checked at connect); a shard not connected
    /// leaves it unknown.
    fn results_identity(&self) -> Option<String> {
        let ids: Vec<Option<String>> = self
            .shards
            .iter()
            .map(|s| s.client.results_identity())
            .collect();
        match ids.first() {
            Some(Some(first)) if ids.iter().all(|i| i.as_ref() == Some(first)) => {
                Some(first.clone())
            }
            _ => None,
        }
    }

    fn moe_layer_profiled(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
    ) -> Result<(), ExpertError> {
        self.moe_layer_overlapped(call, out, profiler, &mut || {})
    }

    fn moe_layer_overlapped(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
        during: &mut dyn FnMut(),
    ) -> Result<(), ExpertError> {
        let Some(shard) = self.owner_of(call.layer) else {
            during();
            return Err(ExpertError::InvalidCall {
                layer: call.layer,
                reason: format!("layer out of range (model has {})", self.owner.len()),
            });
        };
        // The shard's client names its endpoint in every error, and the error names the layer.
        shard
            .client
            .moe_layer_overlapped(call, out, profiler, during)
    }

    fn expert_bytes(&self) -> Option<usize> {
        self.shards.iter().find_map(|s| s.client.expert_bytes())
    }

    fn io_backend(&self) -> Option<String> {
        // The first connected shard's; sharded daemons are never private, so no report pairs it
        // with a daemon's process.
        self.shards.iter().find_map(|s| s.client.io_backend())
    }

    fn transport(&self) -> Option<String> {
        let each: Vec<String> = self
            .shards
            .iter()
            .map(|s| {
                format!(
                    "{} (layers {})",
                    s.client
                        .transport()
                        .unwrap_or_else(|| "disconnected".into()),
                    s.layers
                )
            })
            .collect();
        Some(each.join(", "))
    }

    fn wants_prefetch(&self) -> bool {
        self.shards.iter().any(|s| s.client.wants_prefetch())
    }

    fn prefetch(&self, layer: LayerId, experts: &[u32], profiler: Option<&Profiler>) {
        if let Some(shard) = self.owner_of(layer) {
            shard.client.prefetch(layer, experts, profiler);
        }
    }

    fn speculative_counters(&self) -> Option<SpeculativeCounters> {
        self.shards
            .iter()
            .filter_map(|s| s.client.speculative_counters())
            .reduce(|a, b| a.plus(&b))
    }

    fn cache_view(&self) -> Option<crate::experts::view::CacheView> {
        self.shards
            .iter()
            .filter_map(|s| s.client.cache_view())
            .reduce(crate::experts::view::CacheView::merge)
    }

    fn health(&self) -> Option<HealthReport> {
        let reports: Vec<HealthReport> = self
            .shards
            .iter()
            .filter_map(|s| s.client.health())
            .collect();
        let worst = |r: &HealthReport| r.readiness.code();
        let top = reports.iter().max_by_key(|r| worst(r))?;
        // Every shard that is not ready, by its own reason (each names its endpoint).
        let reasons: Vec<String> = reports
            .iter()
            .filter(|r| r.readiness != Readiness::Ready)
            .filter_map(|r| r.reason.clone())
            .collect();
        Some(HealthReport {
            readiness: top.readiness,
            reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
            for_s: top.for_s,
            restarts: reports.iter().map(|r| r.restarts).sum(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> ShardSpec {
        ShardSpec::parse(s).expect("spec")
    }

    #[test]
    fn shard_arguments_parse() {
        assert_eq!(spec("unix:///run/a.sock=0-19").layers, Some(0..=19));
        assert_eq!(
            spec("https://node2:7443=20-39").endpoint.to_string(),
            "https://node2:7443"
        );
        assert_eq!(spec("https://node2:7443=7").layers, Some(7..=7));
        assert_eq!(
            spec("unix:///run/a=b.sock").layers,
            None,
            "a path with = is a path"
        );
        assert_eq!(spec("unix:///run/a.sock").layers, None);
        assert!(
            ShardSpec::parse("unix:///a=5-2")
                .expect_err("empty")
                .contains("first > last")
        );
        assert!(ShardSpec::parse("unix:///a=1-2-3").is_err());
    }

    #[test]
    fn one_endpoint_without_a_range_serves_every_layer() {
        assert_eq!(plan_layers(4, &[spec("unix:///a")]), Ok(vec![0, 0, 0, 0]));
        assert_eq!(
            plan_layers(4, &[spec("unix:///a=0-1"), spec("https://b:1=2-3")]),
            Ok(vec![0, 0, 1, 1])
        );
    }

    #[test]
    fn gaps_overlaps_and_ranges_past_the_model_are_named() {
        // (layers, first and second --expertd, what the refusal says)
        let cases = [
            (
                40,
                "unix:///a=0-19",
                "https://b:1=22-37",
                "no --expertd serves layers 20-21, 38-39",
            ),
            (
                40,
                "unix:///a=0-21",
                "https://b:1=20-39",
                "both --expertd unix:///a and --expertd https://b:1 claim layers 20-21",
            ),
            (4, "unix:///a=0-2", "https://b:1=2-3", "claim layer 2"),
            (
                40,
                "unix:///a=0-19",
                "https://b:1=20-45",
                "claims layers 20-45, but the model has 40 MoE layers (0-39)",
            ),
            (
                4,
                "unix:///a",
                "https://b:1=2-3",
                "--expertd unix:///a has no layer range",
            ),
        ];
        for (layers, a, b, says) in cases {
            let e = plan_layers(layers, &[spec(a), spec(b)]).expect_err(says);
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn daemons_serving_different_containers_are_refused_by_name() {
        assert!(same_container(&[("unix:///a".into(), 7), ("https://b:1".into(), 7)]).is_ok());
        let e = same_container(&[("unix:///a".into(), 7), ("https://b:1".into(), 9)])
            .expect_err("differ");
        assert!(e.contains("unix:///a serves fingerprint 0x0000000000000007, https://b:1 serves 0x0000000000000009"), "{e}");
    }
}
