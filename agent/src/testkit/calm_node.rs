//! A calm node for whole-tick tests and benches: the agent's real tick on a
//! cgroup v2 tree under a directory the caller owns, the pod cache a
//! reflector store, the clock manual, and an API that fails the caller on
//! any call (a calm node resizes nothing and publishes nothing).
//!
//! `n` pods on `16 + n / 2` CPUs, request 100m and limit 400m per container: the even ones opted
//! in and already at their ceiling on an idle node (4 × request), every
//! fourth pod with three containers (an app and two sidecars, each limited);
//! the odd ones not opted in, as most pods of a node are not. Nothing is
//! busy, so every tick after the first two is steady.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::Event;
use kube::runtime::{reflector, watcher};
use serde_json::json;

use crate::kube::events::EventApi;
use crate::kube::owner::OwnerError;
use crate::kube::pods::PodApi;
use crate::kube::resize::{ResizeAnswer, ResizeRequest};
use crate::kube::watch::Caches;
use crate::metrics::Metrics;
use crate::model::{DeclaredLimits, OwnerRef};
use crate::policy::PolicyConfig;
use crate::reconcile::{Agent, Round, Settings};
use crate::testkit::cgroup_tree::{self, cpu_stat, write};

const NODE: &str = "n1";
/// Container index of the pause container in [`container_id`].
const PAUSE: usize = 15;

/// The apiserver of a calm node: any call is a failure of the caller.
#[derive(Clone, Copy, Debug)]
pub struct NoCalls;

impl PodApi for NoCalls {
    async fn resize(&self, req: &ResizeRequest) -> ResizeAnswer {
        panic!("a calm node was resized: {req:?}");
    }
    async fn get(&self, ns: &str, name: &str) -> Result<Option<Pod>, kube::Error> {
        panic!("a calm node re-read {ns}/{name}");
    }
    async fn template_limits(
        &self,
        _: &str,
        owner: &OwnerRef,
    ) -> Result<Option<DeclaredLimits>, OwnerError> {
        panic!("the pods have no owner, yet {owner:?} was read")
    }
}

impl EventApi for NoCalls {
    async fn publish(&self, ev: &Event, _: &ObjectReference) -> Result<(), kube::Error> {
        panic!("a calm node published {:?}", ev.reason);
    }
}

/// The agent on a calm node of `n` pods, and its clock.
pub struct CalmNode {
    pub agent: Agent<NoCalls, NoCalls>,
    clock: Arc<AtomicU64>,
}

impl CalmNode {
    /// Writes the tree of `n` pods under `root` (an empty directory the
    /// caller keeps) and makes the agent. No audit comes due: every tick
    /// after the first reads what a steady tick reads.
    pub fn new(root: &Path, n: usize) -> Self {
        write(root, "cgroup.controllers", "cpuset cpu io memory pids\n");
        // Room for every managed pod's ceiling (600m a pod on average, half
        // the pods managed) with the reserve to spare.
        let cpus = 16 + n / 2;
        write(root, "cpuset.cpus.effective", &format!("0-{}\n", cpus - 1));
        write(root, "cpu.stat", &cpu_stat(0));
        let kubepods = root.join("kubepods.slice");
        write(
            &kubepods,
            "cgroup.controllers",
            "cpuset cpu io memory pids\n",
        );
        cgroup(&kubepods, "max 100000");
        let burstable = kubepods.join("kubepods-burstable.slice");
        cgroup(&burstable, "max 100000");
        let (store, mut writer) = reflector::store();
        for i in 0..n {
            let dir = burstable.join(format!(
                "kubepods-burstable-pod{}.slice",
                uid(i).replace('-', "_")
            ));
            let count = containers(i).len();
            cgroup(&dir, &format!("{} 100000", count * 40_000));
            for k in 0..count {
                let c = format!("cri-containerd-{}.scope", container_id(i, k));
                cgroup(&dir.join(c), "40000 100000");
            }
            let pause = format!("cri-containerd-{}.scope", container_id(i, PAUSE));
            cgroup(&dir.join(pause), "max 100000");
            writer.apply_watcher_event(&watcher::Event::Apply(pod(i)));
        }
        let caches = Caches {
            pods: store,
            node: reflector::store().0,
            namespaces: reflector::store().0,
        };
        let settings = Settings {
            node_name: NODE.into(),
            cgroup_root: root.to_path_buf(),
            tick: Duration::from_secs(1),
            dry_run: false,
            policy: PolicyConfig::default(),
            node_allocatable_m: Some(cpus as u64 * 1000),
            audit_interval: Duration::from_secs(100 * 365 * 24 * 3600),
            drift_grace: Duration::from_secs(30),
            event_interval: Duration::from_secs(60),
        };
        let layout = crate::cgroup::discover(root).expect("the calm node's layout");
        let clock = Arc::new(AtomicU64::new(0));
        let c = clock.clone();
        let agent = Agent::new(
            settings,
            layout,
            caches,
            NoCalls,
            NoCalls,
            Arc::new(Metrics::new("test")),
        )
        .with_clock(move || Duration::from_secs(c.load(Ordering::SeqCst)));
        Self { agent, clock }
    }

    /// One second later, one tick.
    pub async fn tick(&mut self) -> Option<Round> {
        self.clock.fetch_add(1, Ordering::SeqCst);
        self.agent.tick().await
    }
}

/// A cgroup as [`cgroup_tree::cgroup`] writes it, with the `cpu.weight` of a
/// 100m request (the audit reads it).
fn cgroup(dir: &Path, cpu_max: &str) {
    cgroup_tree::cgroup(dir, cpu_max);
    write(dir, "cpu.weight", "4\n");
}

fn uid(i: usize) -> String {
    format!("5f0c1a2b-3c4d-4e5f-8a9b-{i:012x}")
}

/// Container `k` of pod `i` ([`PAUSE`] for the pause container).
fn container_id(i: usize, k: usize) -> String {
    format!("{:064x}", (i as u128) << 4 | k as u128)
}

/// Pod `i`'s containers.
fn containers(i: usize) -> &'static [&'static str] {
    if i % 4 == 2 {
        &["app", "side-a", "side-b"]
    } else {
        &["app"]
    }
}

fn pod(i: usize) -> Pod {
    let res = json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}});
    let specs: Vec<_> = containers(i)
        .iter()
        .map(|name| {
            json!({"name": name, "image": "i", "resources": res,
                "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]})
        })
        .collect();
    let statuses: Vec<_> = containers(i)
        .iter()
        .enumerate()
        .map(|(k, name)| {
            json!({"name": name, "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "containerID": format!("containerd://{}", container_id(i, k)),
                "state": {"running": {}}, "resources": res})
        })
        .collect();
    let annotations = if i.is_multiple_of(2) {
        json!({"headroom.dev/managed": "true"})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "metadata": {"name": format!("p{i}"), "namespace": "ns", "uid": uid(i),
            "generation": 1, "resourceVersion": "1", "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": specs},
        "status": {"phase": "Running", "qosClass": "Burstable", "observedGeneration": 1,
            "containerStatuses": statuses}
    }))
    .expect("a calm node's pod")
}
