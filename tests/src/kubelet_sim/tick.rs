//! One tick of the simulator: resizes step on, the load model runs over every
//! pod and writes the counter files, and the pods whose status changed get a
//! status patch to send.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use super::cgroup_writer::{read_limit_m, read_regular, write_atomic};
use super::driver::{Shared, State};
use super::faults::Fault;
use super::layout::SimQos;
use super::load::{
    self, CgroupCounters, ContainerIn, ContainerOut, Member, PodIn, PodOut, QuotaLoad, Stall,
};
use super::node::{HOST_IP, abs, online_cpus};
use super::pods::{PodEntry, update_qos_weights, write_pod_cgroups};
use super::resize::Step;
use super::status::{StatusInput, status_patch};
use super::{PodKey, SimConfig};

/// A status merge patch for one pod, and what it reports.
pub(crate) struct StatusPatch {
    pub key: PodKey,
    /// The pod it was built for: a pod recreated under the same name is not it.
    pub uid: String,
    /// The entry's `status_version` the body reports.
    pub version: u64,
    pub body: Value,
}

/// One tick: resize steps, the load model, and the status patches to send.
pub(crate) fn on_tick(shared: &Shared) -> Vec<StatusPatch> {
    let cfg = &shared.cfg;
    let mut st = shared.lock();
    let now = Instant::now();
    let dt_us = st
        .last_tick
        .map_or(0.0, |t| now.duration_since(t).as_secs_f64() * 1e6);
    st.last_tick = Some(now);
    if step_resizes(cfg, &mut st, now) {
        update_qos_weights(cfg, &st);
    }
    if dt_us > 0.0 {
        advance_load(cfg, &mut st, dt_us);
    }
    status_patches(cfg, &st)
}

/// Moves every resize in flight one step; true when cgroups were written (the
/// QoS weights then follow).
fn step_resizes(cfg: &SimConfig, st: &mut State, now: Instant) -> bool {
    let mut weights_changed = false;
    let State { pods, faults, .. } = st;
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
                    tracing::warn!(error = %e, pod = %key, "sim kubelet: applying resize");
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
    weights_changed
}

/// A status patch for every pod whose status changed since the last one sent.
fn status_patches(cfg: &SimConfig, st: &State) -> Vec<StatusPatch> {
    st.pods
        .iter()
        .filter(|(_, entry)| entry.status_version != entry.synced_version)
        .map(|(key, entry)| {
            let fault = st.faults.get(key).cloned().unwrap_or_default();
            StatusPatch {
                key: key.clone(),
                uid: entry.uid.clone(),
                version: entry.status_version,
                body: status_body(cfg, entry, &fault),
            }
        })
        .collect()
}

fn status_body(cfg: &SimConfig, entry: &PodEntry, fault: &Fault) -> Value {
    let ids: BTreeMap<String, String> = entry
        .ids
        .iter()
        .map(|(k, v)| (k.clone(), cfg.runtime.container_id_uri(v)))
        .collect();
    status_patch(&StatusInput {
        reported: &entry.reported,
        allocated: &entry.reported,
        ids: &ids,
        read_back_m: &entry.read_back,
        pod_read_back_m: entry.pod_read_back,
        observed_generation: entry.observed_generation,
        resize_in_progress: entry.resize.as_ref().map(|r| r.generation),
        fault,
        started_at: &entry.started_at,
        host_ip: HOST_IP,
    })
}

/// One pod's input to the load model and the container cgroups it was read from
/// (in the order of `input.containers`).
struct PodLoad {
    key: PodKey,
    input: PodIn,
    container_dirs: Vec<PathBuf>,
}

/// What the pods gave their QoS cgroups and kubepods in a tick, by absolute path.
#[derive(Default)]
struct NodeShare {
    members: BTreeMap<PathBuf, Vec<Member>>,
    got_m: BTreeMap<PathBuf, f64>,
}

impl NodeShare {
    fn add(&mut self, dir: &Path, members: &[Member], got_m: f64) {
        self.members
            .entry(dir.to_path_buf())
            .or_default()
            .extend(members);
        *self.got_m.entry(dir.to_path_buf()).or_default() += got_m;
    }
}

/// What every step of one load-model tick needs.
struct LoadTick<'a> {
    cfg: &'a SimConfig,
    /// Measured length of the tick.
    dt_us: f64,
    /// Absolute path of kubepods.
    kubepods: PathBuf,
}

impl LoadTick<'_> {
    fn advance(&self, c: &mut CgroupCounters, got_m: f64, quota: Option<QuotaLoad>, stall: Stall) {
        c.advance(self.dt_us, self.cfg.period_us as f64, got_m, quota, stall);
    }
}

/// Runs the load model over every pod and writes `cpu.stat`/`cpu.pressure`.
fn advance_load(cfg: &SimConfig, st: &mut State, dt_us: f64) {
    let tick = LoadTick {
        cfg,
        dt_us,
        kubepods: abs(cfg, &cfg.layout.kubepods_dir()),
    };
    let loads = read_loads(cfg, st);
    let inputs: Vec<PodIn> = loads.iter().map(|l| l.input.clone()).collect();
    let mut outs = load::allocate(
        &inputs,
        node_capacity_m(cfg, &tick.kubepods),
        online_cpus(cfg),
    );
    if !st.cede.is_empty() {
        let shares: Vec<f64> = loads
            .iter()
            .map(|l| st.cede.get(&l.key).copied().unwrap_or(0.0))
            .collect();
        load::cede(&inputs, &mut outs, &shares);
    }
    let mut share = NodeShare::default();
    for (pod, out) in loads.iter().zip(&outs) {
        if let Some(entry) = st.pods.get_mut(&pod.key) {
            advance_pod(&tick, entry, pod, out, &mut share);
        }
    }
    let kube_demand: f64 = outs
        .iter()
        .flat_map(|p| &p.containers)
        .map(|c| c.demand_m)
        .sum();
    advance_node(&tick, st, &share, kube_demand);
}

/// CPU the pods can share: the Node's allocatable, or a finite kubepods
/// `cpu.max` if lower.
fn node_capacity_m(cfg: &SimConfig, kubepods: &Path) -> f64 {
    match read_limit_m(kubepods) {
        Some(l) => l.min(cfg.allocatable_cpu_m as f64),
        None => cfg.allocatable_cpu_m as f64,
    }
}

/// Every pod's load-model input, from the demands and the `cpu.max` and
/// `cpu.weight` files as they are on disk.
fn read_loads(cfg: &SimConfig, st: &State) -> Vec<PodLoad> {
    st.pods
        .iter()
        .map(|(key, entry)| {
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
            let container_dirs: Vec<PathBuf> = running
                .iter()
                .map(|(_, id)| entry.container_dir(cfg, id))
                .collect();
            let containers = running
                .iter()
                .zip(&container_dirs)
                .map(|((name, _), dir)| ContainerIn {
                    demand_m: demand.containers.get(*name).copied().unwrap_or(even),
                    limit_m: read_limit_m(dir),
                })
                .collect();
            let weight = read_regular(&entry.dir.join("cpu.weight"))
                .and_then(|w| w.trim().parse().ok())
                .unwrap_or(100.0);
            PodLoad {
                key: key.clone(),
                input: PodIn {
                    containers,
                    limit_m: read_limit_m(&entry.dir),
                    weight,
                },
                container_dirs,
            }
        })
        .collect()
}

/// Advances and writes the counters of one pod's containers, pod cgroup and
/// idle cgroups, and adds what it got to its QoS cgroup and kubepods.
fn advance_pod(
    tick: &LoadTick,
    entry: &mut PodEntry,
    pod: &PodLoad,
    out: &PodOut,
    share: &mut NodeShare,
) {
    let mut written = Vec::new();
    let mut members = Vec::new();
    let mut pod_got = 0.0;
    let containers = pod.input.containers.iter().zip(&out.containers);
    for ((cin, cout), dir) in containers.zip(&pod.container_dirs) {
        let counters = entry.counters.entry(dir.clone()).or_default();
        members.push(advance_container(tick, counters, cin, cout));
        pod_got += cout.got_m;
        written.push(dir.clone());
    }
    let pod_quota = pod.input.limit_m.map(|limit_m| QuotaLoad {
        load_m: out.capped_m,
        limit_m,
    });
    let pod_counters = entry.counters.entry(entry.dir.clone()).or_default();
    tick.advance(
        pod_counters,
        pod_got,
        pod_quota,
        load::group_stall(&members),
    );
    written.push(entry.dir.clone());
    for idle in entry.idle_dirs(tick.cfg) {
        let idle_counters = entry.counters.entry(idle.clone()).or_default();
        tick.advance(idle_counters, 0.0, None, Stall::default());
        written.push(idle);
    }
    let qos_dir = abs(tick.cfg, &tick.cfg.layout.qos_dir(entry.qos));
    if qos_dir != tick.kubepods {
        share.add(&qos_dir, &members, pod_got);
    }
    share.add(&tick.kubepods, &members, pod_got);
    for path in written {
        if let Some(c) = entry.counters.get(&path) {
            write_counters(&path, c);
        }
    }
}

/// Advances one container's counters; returns it as a member of its pod's PSI group.
fn advance_container(
    tick: &LoadTick,
    counters: &mut CgroupCounters,
    cin: &ContainerIn,
    cout: &ContainerOut,
) -> Member {
    let stall = load::container_stall(cout, tick.cfg.throttle_psi_weight);
    // Threads queued behind its own never reach the quota.
    let quota = cin.limit_m.map(|limit_m| QuotaLoad {
        load_m: cout.demand_m - cout.self_queued_m,
        limit_m,
    });
    tick.advance(counters, cout.got_m, quota, stall);
    Member {
        demand_m: cout.demand_m,
        some: stall.some,
        full: stall.full,
    }
}

/// Advances and writes the counters of the QoS cgroups and kubepods from what
/// their pods got; kubepods' own quota is loaded by all the demand.
fn advance_node(tick: &LoadTick, st: &mut State, share: &NodeShare, kube_demand: f64) {
    for qos in [SimQos::Burstable, SimQos::BestEffort, SimQos::Guaranteed] {
        let dir = abs(tick.cfg, &tick.cfg.layout.qos_dir(qos));
        let got = share.got_m.get(&dir).copied().unwrap_or(0.0);
        let stall = load::group_stall(share.members.get(&dir).map_or(&[][..], |v| v));
        let quota = if dir == tick.kubepods {
            read_limit_m(&tick.kubepods).map(|limit_m| QuotaLoad {
                load_m: kube_demand,
                limit_m,
            })
        } else {
            None
        };
        let c = st.node_counters.entry(dir.clone()).or_default();
        tick.advance(c, got, quota, stall);
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
