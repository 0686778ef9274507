//! The simulator's task: pod watch events and ticks drive cgroup writes, the load
//! model and status patches. State lives behind a std mutex never held across an
//! await, so the test-facing setters stay synchronous.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::cgroup_writer::{
    ensure_cgroup, read_limit_m, read_regular, remove_cgroup, write_atomic, write_setting,
};
use super::faults::{Fault, read_back_limit_m};
use super::layout::{SimLayout, SimQos, container_id};
use super::load::{self, CgroupCounters, ContainerIn, PodIn};
use super::plan::{PodPlan, cpu_max_line, cpu_max_line_systemd, cpu_weight};
use super::resize::{OnGeneration, ResizeState, Step, on_generation};
use super::status::{StatusInput, status_patch};
use super::{Demand, PodKey, SimConfig};

const FIELD_MANAGER: &str = "headroom-sim-kubelet";
const HOST_IP: &str = "10.0.0.1";

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
    node_counters: BTreeMap<PathBuf, CgroupCounters>,
    /// Pods listed since the last watch (re)start, to drop those that went missing.
    relist: Option<HashSet<PodKey>>,
    last_tick: Option<Instant>,
}

pub(crate) struct PodEntry {
    uid: String,
    qos: SimQos,
    pub dir: PathBuf,
    pub pause_id: String,
    /// Container name → raw id (all containers, init ones included).
    pub ids: BTreeMap<String, String>,
    /// What the cgroups were last written for (also the allocated resources).
    applied: PodPlan,
    /// What status reports.
    reported: PodPlan,
    read_back: BTreeMap<String, u64>,
    pod_read_back: Option<u64>,
    observed_generation: i64,
    seen_generation: i64,
    resize: Option<ResizeState>,
    started_at: Value,
    status_version: u64,
    synced_version: u64,
    counters: BTreeMap<PathBuf, CgroupCounters>,
}

impl PodEntry {
    pub fn container_dir(&self, cfg: &SimConfig, id: &str) -> PathBuf {
        self.dir
            .join(cfg.layout.container_dir_name(cfg.runtime, id))
    }

    /// Every cgroup of the pod that has no workload: pause and conmon.
    fn idle_dirs(&self, cfg: &SimConfig) -> Vec<PathBuf> {
        let mut ids: Vec<&String> = vec![&self.pause_id];
        ids.extend(self.running_ids());
        let mut out = vec![self.container_dir(cfg, &self.pause_id)];
        for id in ids {
            if let Some(c) = cfg.layout.conmon_dir_name(cfg.runtime, id) {
                out.push(self.dir.join(c));
            }
        }
        out
    }

    fn running_ids(&self) -> impl Iterator<Item = &String> {
        self.applied.running().filter_map(|c| self.ids.get(&c.name))
    }

    fn touch_status(&mut self) {
        self.status_version += 1;
    }
}

fn now_time() -> Value {
    serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now())).unwrap_or(Value::Null)
}

fn abs(cfg: &SimConfig, rel: &Path) -> PathBuf {
    cfg.cgroup_root.join(rel)
}

pub(crate) async fn register_node(client: &Client, cfg: &SimConfig) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": cfg.node_name, "labels": {
            "kubernetes.io/hostname": cfg.node_name, "kubernetes.io/os": "linux"}},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let res = json!({"cpu": format!("{}m", cfg.allocatable_cpu_m),
                     "memory": cfg.allocatable_memory, "pods": "110"});
    let now = now_time();
    let status = json!({"status": {
        "capacity": res, "allocatable": res,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "simulated kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "declaredFeatures": cfg.declared_features,
        "addresses": [{"type": "InternalIP", "address": HOST_IP},
                      {"type": "Hostname", "address": cfg.node_name}],
    }});
    nodes
        .patch_status(
            &cfg.node_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    Ok(())
}

/// The cgroup root, kubepods (and its ancestors) and the QoS cgroups.
pub(crate) fn write_node_tree(cfg: &SimConfig) -> std::io::Result<()> {
    std::fs::create_dir_all(&cfg.cgroup_root)?;
    write_atomic(
        &cfg.cgroup_root,
        "cgroup.controllers",
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    )?;
    write_atomic(
        &cfg.cgroup_root,
        "cgroup.subtree_control",
        "cpu memory pids\n",
    )?;
    // The host's online CPUs as the root cgroup lists them: as many as the
    // node's allocatable needs (a real host has at least that many).
    let cpus = cfg.allocatable_cpu_m.div_ceil(1000).max(1);
    write_atomic(
        &cfg.cgroup_root,
        "cpuset.cpus.effective",
        &format!("0-{}\n", cpus - 1),
    )?;
    let max = cpu_max_line(None, cfg.period_us);
    let kubepods = cfg.layout.kubepods_dir();
    for dir in cfg.layout.kubepods_ancestry() {
        let weight = if dir == kubepods {
            cpu_weight(cfg.allocatable_cpu_m)
        } else {
            100
        };
        ensure_cgroup(&abs(cfg, &dir), &max, weight, cfg.write_mode)?;
    }
    for qos in [SimQos::Burstable, SimQos::BestEffort] {
        ensure_cgroup(&abs(cfg, &cfg.layout.qos_dir(qos)), &max, 1, cfg.write_mode)?;
    }
    Ok(())
}

pub(crate) async fn run(shared: Arc<Shared>, client: Client, mut stop: watch::Receiver<bool>) {
    let cfg = &shared.cfg;
    let pods: Api<Pod> = Api::all(client.clone());
    let wc = watcher::Config::default().fields(&format!("spec.nodeName={}", cfg.node_name));
    let stream = watcher::watcher(pods, wc).default_backoff();
    futures::pin_mut!(stream);
    let mut tick = tokio::time::interval(cfg.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => break,
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
            }
        }
    }
}

/// Handles one watch event; returns pods to delete for good (grace period 0).
fn on_event(shared: &Shared, ev: Event<Pod>) -> Vec<(PodKey, String)> {
    let mut st = shared.lock();
    let mut deletes = Vec::new();
    match ev {
        Event::Init => st.relist = Some(HashSet::new()),
        Event::InitApply(pod) | Event::Apply(pod) => {
            let key = (pod.namespace().unwrap_or_default(), pod.name_any());
            if let Some(seen) = st.relist.as_mut() {
                seen.insert(key.clone());
            }
            if pod.metadata.deletion_timestamp.is_some() {
                teardown(&shared.cfg, &mut st, &key);
                deletes.push((key, pod.uid().unwrap_or_default()));
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
                    teardown(&shared.cfg, &mut st, &k);
                }
            }
        }
        Event::Delete(pod) => {
            let key = (pod.namespace().unwrap_or_default(), pod.name_any());
            teardown(&shared.cfg, &mut st, &key);
        }
    }
    deletes
}

fn teardown(cfg: &SimConfig, st: &mut State, key: &PodKey) {
    if let Some(entry) = st.pods.remove(key) {
        if let Err(e) = remove_cgroup(&entry.dir) {
            tracing::warn!(error = %e, dir = %entry.dir.display(), "sim kubelet: removing pod cgroup");
        }
        update_qos_weights(cfg, st);
    }
}

fn on_pod(cfg: &SimConfig, st: &mut State, key: PodKey, pod: &Pod) {
    let plan = match PodPlan::from_pod(pod) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, pod = ?key, "sim kubelet: cannot plan pod");
            return;
        }
    };
    let generation = pod.metadata.generation.unwrap_or(1);
    let fault = st.faults.get(&key).cloned().unwrap_or_default();
    match st.pods.get_mut(&key) {
        None => {
            let uid = pod.uid().unwrap_or_default();
            let mut ids: BTreeMap<String, String> = plan
                .containers
                .iter()
                .map(|c| (c.name.clone(), container_id(&uid, &c.name)))
                .collect();
            let pause_id = container_id(&uid, "\0pause");
            ids.retain(|_, v| *v != pause_id);
            let mut entry = PodEntry {
                dir: abs(cfg, &cfg.layout.pod_dir(plan.qos, &uid)),
                uid,
                qos: plan.qos,
                pause_id,
                ids,
                applied: plan.clone(),
                reported: plan.clone(),
                read_back: BTreeMap::new(),
                pod_read_back: None,
                observed_generation: generation,
                seen_generation: generation,
                resize: None,
                started_at: now_time(),
                status_version: 1,
                synced_version: 0,
                counters: BTreeMap::new(),
            };
            if let Err(e) = write_pod_cgroups(cfg, &mut entry, &plan, &fault, false) {
                tracing::warn!(error = %e, pod = ?key, "sim kubelet: writing pod cgroups");
            }
            st.pods.insert(key, entry);
            update_qos_weights(cfg, st);
        }
        Some(entry) => {
            if generation <= entry.seen_generation {
                return;
            }
            entry.seen_generation = generation;
            match on_generation(entry.resize.is_some(), &entry.applied, &plan) {
                OnGeneration::Observe => entry.observed_generation = generation,
                OnGeneration::Start => {
                    // A real kubelet v1.37 moves status.observedGeneration with
                    // the PodResizeInProgress condition, not at the end
                    // (real-node parity test, docs/kubelet-behaviour.md §3).
                    entry.observed_generation = generation;
                    entry.resize = Some(ResizeState::new(
                        generation,
                        plan,
                        Instant::now(),
                        cfg.resize_delay,
                    ));
                }
            }
            entry.touch_status();
        }
    }
}

/// Writes `plan`'s values into the pod's cgroups, creating them if needed.
fn write_pod_cgroups(
    cfg: &SimConfig,
    entry: &mut PodEntry,
    plan: &PodPlan,
    fault: &Fault,
    resizing: bool,
) -> std::io::Result<()> {
    let period = cfg.period_us;
    let mode = cfg.write_mode;
    let pod_max = match cfg.layout {
        // The kubelet sets a systemd pod slice's quota through systemd
        // (CPUQuotaPerSecUSec, 10 ms steps); containers get runc's exact write.
        SimLayout::Kind | SimLayout::Systemd => {
            cpu_max_line_systemd(plan.pod_limit_total_m(), period)
        }
        SimLayout::Cgroupfs => cpu_max_line(plan.pod_limit_total_m(), period),
    };
    let pod_weight = if plan.qos == SimQos::BestEffort {
        1
    } else {
        cpu_weight(plan.pod_request_total_m())
    };
    ensure_cgroup(&entry.dir, &pod_max, pod_weight, mode)?;
    if let Some(v) = fault.cpu_max_override(None, &pod_max, resizing) {
        write_setting(&entry.dir, "cpu.max", &format!("{v}\n"), mode)?;
        entry.pod_read_back = (v != pod_max).then(|| read_back_limit_m(&v)).flatten();
    }
    write_setting(&entry.dir, "cpu.weight", &format!("{pod_weight}\n"), mode)?;
    let max = cpu_max_line(None, period);
    for dir in entry.idle_dirs(cfg) {
        ensure_cgroup(&dir, &max, 1, mode)?;
    }
    for c in plan.running() {
        let Some(id) = entry.ids.get(&c.name) else {
            continue;
        };
        let dir = entry.container_dir(cfg, id);
        let correct = cpu_max_line(plan.container_limit_m(c), period);
        let weight = cpu_weight(c.request_m.unwrap_or(0));
        ensure_cgroup(&dir, &correct, weight, mode)?;
        if let Some(v) = fault.cpu_max_override(Some(&c.name), &correct, resizing) {
            write_setting(&dir, "cpu.max", &format!("{v}\n"), mode)?;
            match read_back_limit_m(&v) {
                Some(m) if v != correct && c.limit_m.is_some() => {
                    entry.read_back.insert(c.name.clone(), m)
                }
                _ => entry.read_back.remove(&c.name),
            };
            write_setting(&dir, "cpu.weight", &format!("{weight}\n"), mode)?;
        }
    }
    Ok(())
}

/// Burstable QoS weight follows the sum of its pods' requests, as the kubelet's QoS
/// manager keeps it.
fn update_qos_weights(cfg: &SimConfig, st: &State) {
    let sum: u64 = st
        .pods
        .values()
        .filter(|p| p.qos == SimQos::Burstable)
        .map(|p| p.applied.pod_request_total_m())
        .sum();
    let dir = abs(cfg, &cfg.layout.qos_dir(SimQos::Burstable));
    if let Err(e) = write_setting(
        &dir,
        "cpu.weight",
        &format!("{}\n", cpu_weight(sum)),
        cfg.write_mode,
    ) {
        tracing::warn!(error = %e, "sim kubelet: writing burstable cpu.weight");
    }
}

type StatusPatch = (PodKey, String, u64, Value);

/// One tick: resize steps, the load model, and the status patches to send.
fn on_tick(shared: &Shared) -> Vec<StatusPatch> {
    let cfg = &shared.cfg;
    let mut st = shared.lock();
    let now = Instant::now();
    let dt_us = st
        .last_tick
        .map_or(0.0, |t| now.duration_since(t).as_secs_f64() * 1e6);
    st.last_tick = Some(now);
    let mut weights_changed = false;
    let State { pods, faults, .. } = &mut *st;
    for (key, entry) in pods.iter_mut() {
        let fault = faults.get(key).cloned().unwrap_or_default();
        let Some(r) = entry.resize.as_mut() else {
            continue;
        };
        match r.step(now, &fault, cfg.status_delay) {
            Step::Wait => {}
            Step::Apply => {
                let target = r.target.clone();
                if let Err(e) = write_pod_cgroups(cfg, entry, &target, &fault, true) {
                    tracing::warn!(error = %e, pod = ?key, "sim kubelet: applying resize");
                }
                entry.applied = target;
                weights_changed = true;
            }
            Step::Report => {
                if let Some(r) = entry.resize.take() {
                    entry.reported = r.target;
                    entry.observed_generation = r.generation;
                    entry.touch_status();
                }
            }
        }
    }
    if weights_changed {
        update_qos_weights(cfg, &st);
    }
    if dt_us > 0.0 {
        advance_load(cfg, &mut st, dt_us);
    }
    let mut patches = Vec::new();
    for (key, entry) in &st.pods {
        if entry.status_version == entry.synced_version {
            continue;
        }
        let fault = st.faults.get(key).cloned().unwrap_or_default();
        let ids: BTreeMap<String, String> = entry
            .ids
            .iter()
            .map(|(k, v)| (k.clone(), cfg.runtime.container_id_uri(v)))
            .collect();
        let body = status_patch(&StatusInput {
            reported: &entry.reported,
            allocated: &entry.reported,
            ids: &ids,
            read_back_m: &entry.read_back,
            pod_read_back_m: entry.pod_read_back,
            observed_generation: entry.observed_generation,
            resize_in_progress: entry.resize.as_ref().map(|r| r.generation),
            fault: &fault,
            started_at: &entry.started_at,
            host_ip: HOST_IP,
        });
        patches.push((key.clone(), entry.uid.clone(), entry.status_version, body));
    }
    patches
}

/// Runs the load model over every pod and writes `cpu.stat`/`cpu.pressure`.
fn advance_load(cfg: &SimConfig, st: &mut State, dt_us: f64) {
    let period = cfg.period_us as f64;
    let kubepods = abs(cfg, &cfg.layout.kubepods_dir());
    let capacity = match read_limit_m(&kubepods) {
        Some(l) => l.min(cfg.allocatable_cpu_m as f64),
        None => cfg.allocatable_cpu_m as f64,
    };
    // Inputs, from the cpu.max files as they are on disk.
    let mut keys = Vec::new();
    let mut inputs = Vec::new();
    let mut dirs: Vec<Vec<PathBuf>> = Vec::new();
    for (key, entry) in &st.pods {
        let demand = st.demands.get(key).cloned().unwrap_or_default();
        let running: Vec<(&String, &String)> = entry
            .applied
            .running()
            .filter_map(|c| entry.ids.get(&c.name).map(|id| (&c.name, id)))
            .collect();
        let even = if running.is_empty() {
            0.0
        } else {
            demand.pod_m / running.len() as f64
        };
        let cdirs: Vec<PathBuf> = running
            .iter()
            .map(|(_, id)| entry.container_dir(cfg, id))
            .collect();
        let containers = running
            .iter()
            .zip(&cdirs)
            .map(|((name, _), dir)| ContainerIn {
                demand_m: demand.containers.get(*name).copied().unwrap_or(even),
                limit_m: read_limit_m(dir),
            })
            .collect();
        let weight = read_regular(&entry.dir.join("cpu.weight"))
            .and_then(|w| w.trim().parse().ok())
            .unwrap_or(100.0);
        inputs.push(PodIn {
            containers,
            limit_m: read_limit_m(&entry.dir),
            weight,
        });
        keys.push(key.clone());
        dirs.push(cdirs);
    }
    let outs = load::allocate(&inputs, capacity);
    let tw = cfg.throttle_psi_weight;

    let mut node_members: BTreeMap<PathBuf, Vec<(f64, f64)>> = BTreeMap::new();
    let mut node_got: BTreeMap<PathBuf, f64> = BTreeMap::new();
    let mut written = Vec::new();
    for (((key, inp), out), cdirs) in keys.iter().zip(&inputs).zip(&outs).zip(&dirs) {
        let Some(entry) = st.pods.get_mut(key) else {
            continue;
        };
        let qos_dir = abs(cfg, &cfg.layout.qos_dir(entry.qos));
        let mut members = Vec::new();
        let mut pod_got = 0.0;
        for ((cin, cout), dir) in inp.containers.iter().zip(&out.containers).zip(cdirs) {
            let stall = load::stall_fraction(cout, tw);
            members.push((cout.demand_m, stall));
            pod_got += cout.got_m;
            let quota = cin.limit_m.map(|l| (cout.demand_m, l));
            entry.counters.entry(dir.clone()).or_default().advance(
                dt_us,
                period,
                cout.got_m,
                quota,
                (stall, stall),
            );
            written.push(dir.clone());
        }
        let pod_stall = load::group_stall(&members);
        entry
            .counters
            .entry(entry.dir.clone())
            .or_default()
            .advance(
                dt_us,
                period,
                pod_got,
                inp.limit_m.map(|l| (out.capped_m, l)),
                pod_stall,
            );
        written.push(entry.dir.clone());
        for idle in entry.idle_dirs(cfg) {
            entry.counters.entry(idle.clone()).or_default().advance(
                dt_us,
                period,
                0.0,
                None,
                (0.0, 0.0),
            );
            written.push(idle);
        }
        if qos_dir != kubepods {
            node_members
                .entry(qos_dir.clone())
                .or_default()
                .extend(&members);
            *node_got.entry(qos_dir).or_default() += pod_got;
        }
        node_members
            .entry(kubepods.clone())
            .or_default()
            .extend(&members);
        *node_got.entry(kubepods.clone()).or_default() += pod_got;
        for path in written.drain(..) {
            if let Some(c) = entry.counters.get(&path) {
                write_counters(&path, c);
            }
        }
    }
    let kube_demand: f64 = outs
        .iter()
        .flat_map(|p| &p.containers)
        .map(|c| c.demand_m)
        .sum();
    for qos in [SimQos::Burstable, SimQos::BestEffort, SimQos::Guaranteed] {
        let dir = abs(cfg, &cfg.layout.qos_dir(qos));
        let got = node_got.get(&dir).copied().unwrap_or(0.0);
        let stall = load::group_stall(node_members.get(&dir).map_or(&[][..], |v| v));
        let quota = if dir == kubepods {
            read_limit_m(&kubepods).map(|l| (kube_demand, l))
        } else {
            None
        };
        let c = st.node_counters.entry(dir.clone()).or_default();
        c.advance(dt_us, period, got, quota, stall);
        write_counters(&dir, c);
    }
}

fn write_counters(dir: &Path, c: &CgroupCounters) {
    if !dir.exists() {
        return;
    }
    let r = write_atomic(dir, "cpu.stat", &c.cpu_stat())
        .and_then(|_| write_atomic(dir, "cpu.pressure", &c.cpu_pressure()));
    if let Err(e) = r {
        tracing::debug!(error = %e, dir = %dir.display(), "sim kubelet: writing counters");
    }
}

async fn send_status(shared: &Shared, client: &Client, patches: Vec<StatusPatch>) {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for ((ns, name), uid, version, body) in patches {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match api.patch_status(&name, &pp, &Patch::Merge(&body)).await {
            Ok(_) => {
                let mut st = shared.lock();
                if let Some(e) = st.pods.get_mut(&(ns, name))
                    && e.uid == uid
                {
                    e.synced_version = e.synced_version.max(version);
                }
            }
            // Retried on the next tick; a vanished pod is dropped by its watch event.
            Err(e) => {
                tracing::warn!(error = %e, pod = %format!("{ns}/{name}"), "sim kubelet: status patch")
            }
        }
    }
}

async fn confirm_deletes(client: &Client, deletes: Vec<(PodKey, String)>) {
    for ((ns, name), uid) in deletes {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                tracing::warn!(error = %e, pod = %format!("{ns}/{name}"), "sim kubelet: confirming deletion")
            }
        }
    }
}
