//! Pods for benches and soak tests on one simulated node: the footprint mix
//! (managed 1- and 3-container Burstable pods, Guaranteed, BestEffort, opted
//! out), bulk creation, waiting for Running, and [`Churn`]: pods deleted and
//! replaced under new names, and their simulated CPU demand changed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::kubelet_sim::SimKubelet;

/// CPU requests (and an optional limit), memory request 16Mi.
pub fn res(req: &str, lim: Option<&str>) -> Value {
    let mut r = json!({"requests": {"cpu": req, "memory": "16Mi"}});
    if let Some(l) = lim {
        r["limits"] = json!({"cpu": l});
    }
    r
}

/// A pod bound to `node` (no scheduler), with optional annotations.
pub fn pod(name: &str, node: &str, containers: Vec<Value>, annotations: Option<Value>) -> Value {
    let mut p = json!({"metadata": {"name": name},
        "spec": {"nodeName": node, "containers": containers}});
    if let Some(a) = annotations {
        p["metadata"]["annotations"] = a;
    }
    p
}

pub fn container(name: &str, resources: Value) -> Value {
    json!({"name": name, "image": "registry.k8s.io/pause:3.10", "resources": resources})
}

/// The kinds of pod in the footprint mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Burstable, 1 container, request 20m, limit 30m: managed.
    Managed1,
    /// Burstable, 3 containers, each request 10m, limit 15m: managed.
    Managed3,
    /// Guaranteed, 100m: never resized.
    Guaranteed,
    /// BestEffort: never resized.
    BestEffort,
    /// Burstable, request 100m, no limit, annotated `headroom.dev/managed=false`.
    OptedOut,
}

impl Kind {
    /// Name prefix of the kind's pods.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Managed1 => "m1",
            Kind::Managed3 => "m3",
            Kind::Guaranteed => "g",
            Kind::BestEffort => "be",
            Kind::OptedOut => "out",
        }
    }

    /// Whether the agent manages pods of this kind (in an opted-in namespace).
    pub fn managed(self) -> bool {
        matches!(self, Kind::Managed1 | Kind::Managed3)
    }

    /// The steady CPU demand of the footprint bench, in millicores.
    pub fn demand_m(self) -> u64 {
        match self {
            Kind::Managed1 => 10,
            Kind::Managed3 => 15,
            Kind::Guaranteed => 50,
            Kind::BestEffort => 20,
            Kind::OptedOut => 100,
        }
    }

    /// Highest demand [`Churn`] draws (uniformly from 0): managed pods up
    /// to 3× their request, so limits and slack both bind now and then;
    /// opted-out pods up to 1 CPU, which moves the node's slack. Drawn over
    /// the footprint mix, the demands average about the node's 16 CPUs.
    pub fn churn_demand_max_m(self) -> u64 {
        match self {
            Kind::Managed1 => 60,
            Kind::Managed3 => 90,
            Kind::Guaranteed => 100,
            Kind::BestEffort => 100,
            Kind::OptedOut => 1000,
        }
    }

    /// The pod body.
    pub fn body(self, name: &str, node: &str) -> Value {
        match self {
            Kind::Managed1 => pod(
                name,
                node,
                vec![container("app", res("20m", Some("30m")))],
                None,
            ),
            Kind::Managed3 => {
                let cs = ["app", "sidecar", "log"]
                    .iter()
                    .map(|c| container(c, res("10m", Some("15m"))))
                    .collect();
                pod(name, node, cs, None)
            }
            Kind::Guaranteed => {
                let r = json!({"requests": {"cpu": "100m", "memory": "16Mi"},
                    "limits": {"cpu": "100m", "memory": "16Mi"}});
                pod(name, node, vec![container("app", r)], None)
            }
            Kind::BestEffort => pod(name, node, vec![container("app", json!({}))], None),
            Kind::OptedOut => pod(
                name,
                node,
                vec![container("app", res("100m", None))],
                Some(json!({"headroom.dev/managed": "false"})),
            ),
        }
    }
}

/// The footprint bench's 250 pods: 160 managed 1-container, 40 managed
/// 3-container Burstable pods, 20 Guaranteed, 15 BestEffort, 15 opted out.
pub const FOOTPRINT_MIX: [(Kind, usize); 5] = [
    (Kind::Managed1, 160),
    (Kind::Managed3, 40),
    (Kind::Guaranteed, 20),
    (Kind::BestEffort, 15),
    (Kind::OptedOut, 15),
];

/// A pod of a mix and the CPU demand the sim gives it.
pub struct Spec {
    pub name: String,
    pub kind: Kind,
    pub body: Value,
    pub demand_m: u64,
}

/// `n` pods of each kind, named `<prefix>-<i>`, at the kind's steady demand.
pub fn mix(node: &str, counts: &[(Kind, usize)]) -> Vec<Spec> {
    let mut out = Vec::new();
    for &(kind, n) in counts {
        for i in 0..n {
            let name = format!("{}-{i}", kind.prefix());
            out.push(Spec {
                body: kind.body(&name, node),
                name,
                kind,
                demand_m: kind.demand_m(),
            });
        }
    }
    out
}

/// The first container's CPU limit in millicores, if it has one.
pub fn container_limit_m(p: &Pod) -> Option<u64> {
    let first = &p.spec.as_ref()?.containers.first()?.name;
    crate::scenario::pod::cpu_limit_m(p, first)
}

/// Labels the namespace `headroom.dev/managed=true`.
pub async fn opt_in(client: &Client, ns: &str) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"headroom.dev/managed": "true"}}})),
        )
        .await?;
    Ok(())
}

/// Creates pods 25 at a time.
pub async fn create_all(api: &Api<Pod>, bodies: Vec<Value>) -> anyhow::Result<()> {
    futures::stream::iter(bodies)
        .map(|b| async move {
            let p: Pod = serde_json::from_value(b)?;
            api.create(&PostParams::default(), &p).await?;
            anyhow::Ok(())
        })
        .buffer_unordered(25)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Deletes pods 25 at a time (default grace: the simulated kubelet
/// confirms each deletion once the pod's cgroups are gone).
pub async fn delete_all(api: &Api<Pod>, names: Vec<String>) -> anyhow::Result<()> {
    futures::stream::iter(names)
        .map(|n| async move {
            api.delete(&n, &DeleteParams::default()).await?;
            anyhow::Ok(())
        })
        .buffer_unordered(25)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

pub fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits until at least `n` pods of the namespace are Running.
pub async fn wait_running(api: &Api<Pod>, n: usize, bound: Duration) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    loop {
        let pods = api.list(&ListParams::default()).await?;
        let up = pods.items.iter().filter(|p| running(p)).count();
        if up >= n {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > bound {
            bail!("{up}/{n} pods Running after {bound:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Names of the pods the apiserver lists in the namespace (terminating
/// ones included).
pub async fn pod_names(api: &Api<Pod>) -> anyhow::Result<BTreeSet<String>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect())
}

/// Pod churn on one simulated node: each [`Churn::step`] deletes random
/// pods, creates as many of the same kinds under names never used before,
/// and draws a new demand for random pods. Deterministic (a seeded PRNG).
pub struct Churn {
    api: Api<Pod>,
    ns: String,
    node: String,
    live: Vec<(String, Kind)>,
    gone: BTreeSet<String>,
    rng: u64,
    seq: usize,
    /// Pods created by [`Churn::step`] (the initial mix not counted).
    pub created: usize,
    /// Pods deleted by [`Churn::step`] or [`Churn::delete_all_but`].
    pub deleted: usize,
    /// Demands changed (of existing pods; new pods' not counted).
    pub demand_changes: usize,
}

impl Churn {
    /// Starts from `specs`, which must exist (or be about to).
    pub fn new(api: Api<Pod>, ns: &str, node: &str, specs: &[Spec], seed: u64) -> Churn {
        Churn {
            api,
            ns: ns.to_string(),
            node: node.to_string(),
            live: specs.iter().map(|s| (s.name.clone(), s.kind)).collect(),
            gone: BTreeSet::new(),
            rng: seed | 1,
            seq: 0,
            created: 0,
            deleted: 0,
            demand_changes: 0,
        }
    }

    /// xorshift64*: good enough to pick pods.
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn draw_demand(&mut self, kind: Kind) -> u64 {
        self.below(kind.churn_demand_max_m() + 1)
    }

    /// One round of churn: deletes `replace` random pods and creates as
    /// many of the same kinds under new names (their demand drawn first),
    /// then draws a new demand for `reload` random pods.
    pub async fn step(
        &mut self,
        sim: &SimKubelet,
        replace: usize,
        reload: usize,
    ) -> anyhow::Result<()> {
        let mut doomed = Vec::new();
        let mut bodies = Vec::new();
        let mut born = Vec::new();
        for _ in 0..replace.min(self.live.len()) {
            let i = self.below(self.live.len() as u64) as usize;
            let (name, kind) = self.live.swap_remove(i);
            doomed.push(name.clone());
            self.gone.insert(name);
            self.seq += 1;
            let new = format!("{}-r{}", kind.prefix(), self.seq);
            let d = self.draw_demand(kind);
            sim.set_demand(&self.ns, &new, d);
            bodies.push(kind.body(&new, &self.node));
            born.push((new, kind));
        }
        // Only now: a pod is never picked for deletion before it exists.
        self.live.extend(born);
        self.deleted += doomed.len();
        self.created += bodies.len();
        delete_all(&self.api, doomed).await?;
        create_all(&self.api, bodies).await?;
        for _ in 0..reload {
            let i = self.below(self.live.len() as u64) as usize;
            let kind = self.live[i].1;
            let d = self.draw_demand(kind);
            sim.set_demand(&self.ns, &self.live[i].0, d);
            self.demand_changes += 1;
        }
        Ok(())
    }

    /// Puts every live pod back at its kind's steady demand.
    pub fn calm(&self, sim: &SimKubelet) {
        for (name, kind) in &self.live {
            sim.set_demand(&self.ns, name, kind.demand_m());
        }
    }

    /// Deletes every live pod but the first `keep` of each kind.
    pub async fn delete_all_but(&mut self, keep: usize) -> anyhow::Result<()> {
        let mut kept: Vec<(String, Kind)> = Vec::new();
        let mut doomed = Vec::new();
        for (name, kind) in std::mem::take(&mut self.live) {
            if kept.iter().filter(|(_, k)| *k == kind).count() < keep {
                kept.push((name, kind));
            } else {
                self.gone.insert(name.clone());
                doomed.push(name);
            }
        }
        self.live = kept;
        self.deleted += doomed.len();
        delete_all(&self.api, doomed).await
    }

    /// Pods that should exist now.
    pub fn live(&self) -> impl Iterator<Item = (&str, Kind)> {
        self.live.iter().map(|(n, k)| (n.as_str(), *k))
    }

    /// Live pods of managed kinds.
    pub fn live_managed(&self) -> BTreeSet<String> {
        self.live()
            .filter(|(_, k)| k.managed())
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// Every pod deleted so far (names are never reused).
    pub fn gone(&self) -> &BTreeSet<String> {
        &self.gone
    }
}
