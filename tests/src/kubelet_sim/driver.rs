//! The simulator's task: pod watch events and ticks drive cgroup writes, the load
//! model and status patches. State lives behind a std mutex never held across an
//! await, so the test-facing setters stay synchronous.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use super::faults::Fault;
use super::load::CgroupCounters;
use super::pods::{PodEntry, on_pod, teardown};
use super::static_pods::{StaticState, is_mirror_of, mirror_body};
use super::tick::{StatusPatch, on_tick};
use super::{Demand, PodKey, SimConfig};

const FIELD_MANAGER: &str = "headroom-sim-kubelet";

pub(crate) struct Shared {
    pub cfg: SimConfig,
    state: Mutex<State>,
}

impl Shared {
    pub fn new(cfg: SimConfig) -> Shared {
        Shared {
            cfg,
            state: Mutex::new(State::default()),
        }
    }

    /// The state even if a panic poisoned the lock (the data stays usable).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Default)]
pub(crate) struct State {
    pub pods: BTreeMap<PodKey, PodEntry>,
    pub demands: HashMap<PodKey, Demand>,
    pub faults: HashMap<PodKey, Fault>,
    /// Counters of kubepods and the QoS cgroups, by absolute path.
    pub node_counters: BTreeMap<PathBuf, CgroupCounters>,
    /// Pods listed since the last watch (re)start, to drop those that went missing.
    relist: Option<HashSet<PodKey>>,
    pub last_tick: Option<Instant>,
    /// CPUs held exclusively under the static CPU manager ([`super::cpuset`]).
    pub exclusive: super::cpuset::Exclusive,
    /// Static pods by their (mirror's) namespace and name; each also has a
    /// [`PodEntry`] in `pods`, named after its config hash.
    pub statics: BTreeMap<PodKey, StaticState>,
    /// Share of its grant each pod cedes to other busy pods on a full node
    /// ([`super::load::cede`]).
    pub cede: HashMap<PodKey, f64>,
}

/// A pod being deleted whose deletion the simulator confirms (grace period 0),
/// as the kubelet does once the containers are gone.
struct Deletion {
    key: PodKey,
    /// Precondition: a pod recreated under the same name is left alone.
    uid: String,
}

fn pod_key(pod: &Pod) -> PodKey {
    PodKey {
        ns: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    }
}

pub(crate) async fn run(shared: Arc<Shared>, client: Client, mut stop: watch::Receiver<bool>) {
    let cfg = &shared.cfg;
    let pods: Api<Pod> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.node_name));
    let stream = watcher::watcher(pods, wc).default_backoff();
    futures::pin_mut!(stream);
    let mut tick = tokio::time::interval(cfg.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lease = tokio::time::interval(super::node::LEASE_RENEW);
    lease.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    create_mirrors(&shared, &client).await;
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = lease.tick() => {
                if let Err(e) = super::node::renew_lease(&client, cfg).await {
                    tracing::warn!(error = %e, "sim kubelet: renewing the node lease");
                }
            }
            ev = stream.next() => match ev {
                Some(Ok(ev)) => {
                    let deletes = on_event(&shared, ev);
                    confirm_deletes(&client, deletes).await;
                }
                Some(Err(e)) => tracing::warn!(error = %e, "sim kubelet: pod watch error"),
                None => break,
            },
            _ = tick.tick() => {
                let patches = on_tick(&shared);
                send_status(&shared, &client, patches).await;
                create_mirrors(&shared, &client).await;
            }
        }
    }
}

/// Handles one watch event; returns the deletions to confirm.
fn on_event(shared: &Shared, ev: Event<Pod>) -> Vec<Deletion> {
    let mut st = shared.lock();
    let mut deletes = Vec::new();
    match ev {
        Event::Init => st.relist = Some(HashSet::new()),
        Event::InitApply(pod) | Event::Apply(pod) => {
            let key = pod_key(&pod);
            if let Some(seen) = st.relist.as_mut() {
                seen.insert(key.clone());
            }
            if let Some(s) = st.statics.get_mut(&key) {
                let before = s.mirror_uid.clone();
                deletes.extend(on_mirror(s, &key, &pod));
                // A new mirror has no status yet: report it.
                if s.mirror_uid.is_some()
                    && s.mirror_uid != before
                    && let Some(e) = st.pods.get_mut(&key)
                {
                    e.touch_status();
                }
            } else if pod.metadata.deletion_timestamp.is_some() {
                teardown(&shared.cfg, &mut st, &key);
                deletes.push(Deletion {
                    key,
                    uid: pod.uid().unwrap_or_default(),
                });
            } else {
                on_pod(&shared.cfg, &mut st, key, &pod);
            }
        }
        Event::InitDone => {
            if let Some(seen) = st.relist.take() {
                let gone: Vec<PodKey> = st
                    .pods
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for k in gone {
                    // A static pod runs on without its mirror: recreate that.
                    match st.statics.get_mut(&k) {
                        Some(s) => s.create_mirror = true,
                        None => teardown(&shared.cfg, &mut st, &k),
                    }
                }
            }
        }
        Event::Delete(pod) => {
            let key = pod_key(&pod);
            match st.statics.get_mut(&key) {
                Some(s) => s.create_mirror = true,
                None => teardown(&shared.cfg, &mut st, &key),
            }
        }
    }
    deletes
}

/// The apiserver's pod under a static pod's name: its mirror (remember its
/// uid), or one being deleted or not of this hash, which the kubelet
/// deletes at once (grace 0) and replaces with a mirror of its own.
fn on_mirror(s: &mut StaticState, key: &PodKey, pod: &Pod) -> Option<Deletion> {
    let uid = pod.uid().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_none() && is_mirror_of(pod, &s.defaulted.hash) {
        s.mirror_uid = Some(uid);
        s.create_mirror = false;
        return None;
    }
    s.mirror_uid = None;
    s.create_mirror = true;
    Some(Deletion {
        key: key.clone(),
        uid,
    })
}

/// Creates the mirror pods that are missing, as the kubelet's pod sync does.
/// A mirror of the same hash already there is kept (the kubelet's
/// `CreateMirrorPod` on AlreadyExists); any other pod under the name is
/// left to [`on_mirror`] to delete when its watch event comes.
async fn create_mirrors(shared: &Shared, client: &Client) {
    let wanted: Vec<_> = shared
        .lock()
        .statics
        .values()
        .filter(|s| s.create_mirror)
        .map(|s| s.defaulted.clone())
        .collect();
    if wanted.is_empty() {
        return;
    }
    let node = &shared.cfg.node_name;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node_uid = match tokio::time::timeout(REQUEST_TIMEOUT, nodes.get(node)).await {
        Ok(Ok(n)) => n.uid().unwrap_or_default(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "sim kubelet: reading the node for mirror pods");
            return;
        }
        Err(_) => return,
    };
    for d in wanted {
        let api: Api<Pod> = Api::namespaced(client.clone(), &d.key.ns);
        let body = mirror_body(&d, node, &node_uid);
        let pp = kube::api::PostParams::default();
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, api.create(&pp, &body));
        let uid = match sent.await {
            Ok(Ok(p)) => p.uid(),
            Ok(Err(kube::Error::Api(e))) if e.code == 409 => match api.get(&d.key.name).await {
                Ok(p) if is_mirror_of(&p, &d.hash) && p.metadata.deletion_timestamp.is_none() => {
                    p.uid()
                }
                _ => None,
            },
            Ok(Err(e)) => {
                tracing::warn!(error = %e, pod = %d.key, "sim kubelet: creating mirror pod");
                None
            }
            Err(_) => None,
        };
        if let Some(uid) = uid {
            let mut st = shared.lock();
            if let Some(s) = st.statics.get_mut(&d.key) {
                s.mirror_uid = Some(uid);
                s.create_mirror = false;
            }
            if let Some(e) = st.pods.get_mut(&d.key) {
                e.touch_status();
            }
        }
    }
}

async fn send_status(shared: &Shared, client: &Client, patches: Vec<StatusPatch>) {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    // Several at once: a burst of resizes reporting in one tick (the agent
    // raising 50 pods) sent one by one kept the watch waiting for seconds at
    // 250 pods on a loaded host, so resizes outlived the agent's grace.
    futures::stream::iter(patches)
        .for_each_concurrent(STATUS_PATCHES_IN_FLIGHT, |p| {
            send_one(shared, client, &pp, p)
        })
        .await;
}

/// How long one request of the loop may take. The loop sends them between
/// watch events and ticks, so one that hangs stops the whole node. In a
/// 250-pod soak the node stopped for about 4 minutes, close to the client's
/// own read timeout (295 s): no resize or deletion went through meanwhile.
/// The soak run with this timeout had no such stop. A timed-out
/// patch is sent again on the next tick, a deletion on its next event.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
const TIMED_OUT: &str = "sim kubelet: request timed out";

/// Status patches in flight at once (a real kubelet's client defaults to
/// 50 QPS, burst 100).
const STATUS_PATCHES_IN_FLIGHT: usize = 16;

async fn send_one(shared: &Shared, client: &Client, pp: &PatchParams, patch: StatusPatch) {
    let StatusPatch {
        key,
        uid,
        version,
        body,
    } = patch;
    let api: Api<Pod> = Api::namespaced(client.clone(), &key.ns);
    let body = Patch::Merge(&body);
    let sent = tokio::time::timeout(REQUEST_TIMEOUT, api.patch_status(&key.name, pp, &body));
    match sent
        .await
        .unwrap_or(Err(kube::Error::Service(TIMED_OUT.into())))
    {
        Ok(_) => {
            let mut st = shared.lock();
            if let Some(e) = st.pods.get_mut(&key)
                && e.uid == uid
            {
                e.synced_version = e.synced_version.max(version);
            }
        }
        // Retried on the next tick; a vanished pod is dropped by its watch event.
        Err(e) => {
            tracing::warn!(error = %e, pod = %key, "sim kubelet: status patch")
        }
    }
}

async fn confirm_deletes(client: &Client, deletes: Vec<Deletion>) {
    for Deletion { key, uid } in deletes {
        let api: Api<Pod> = Api::namespaced(client.clone(), &key.ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, api.delete(&key.name, &dp));
        match sent
            .await
            .unwrap_or(Err(kube::Error::Service(TIMED_OUT.into())))
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                tracing::warn!(error = %e, pod = %key, "sim kubelet: confirming deletion")
            }
        }
    }
}
