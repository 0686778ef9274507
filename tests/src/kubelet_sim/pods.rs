//! The pods the simulator runs: what it knows of each, creating and removing
//! their cgroups, and what a new spec generation starts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::Value;

use super::cgroup_writer::{ensure_cgroup, remove_cgroup, write_setting};
use super::driver::State;
use super::faults::{Fault, read_back_limit_m};
use super::layout::{SimLayout, SimQos, container_id};
use super::load::CgroupCounters;
use super::node::{abs, now_time};
use super::plan::{PodPlan, cpu_max_line, cpu_max_line_systemd, cpu_weight};
use super::resize::{OnGeneration, ResizeState, on_generation};
use super::{PodKey, SimConfig};

pub(crate) struct PodEntry {
    pub uid: String,
    pub qos: SimQos,
    pub dir: PathBuf,
    pub pause_id: String,
    /// Container name → raw id (all containers, init ones included).
    pub ids: BTreeMap<String, String>,
    /// What the cgroups were last written for (also the allocated resources).
    pub applied: PodPlan,
    /// What status reports.
    pub reported: PodPlan,
    pub read_back: BTreeMap<String, u64>,
    pub pod_read_back: Option<u64>,
    pub observed_generation: i64,
    seen_generation: i64,
    pub resize: Option<ResizeState>,
    pub started_at: Value,
    pub status_version: u64,
    pub synced_version: u64,
    pub counters: BTreeMap<PathBuf, CgroupCounters>,
}

impl PodEntry {
    /// A pod just seen, at `generation`, with its cgroups not written yet.
    fn new(cfg: &SimConfig, uid: String, plan: PodPlan, generation: i64) -> PodEntry {
        let mut ids: BTreeMap<String, String> = plan
            .containers
            .iter()
            .map(|c| (c.name.clone(), container_id(&uid, &c.name)))
            .collect();
        let pause_id = container_id(&uid, "\0pause");
        ids.retain(|_, v| *v != pause_id);
        PodEntry {
            dir: abs(cfg, &cfg.layout.pod_dir(plan.qos, &uid)),
            uid,
            qos: plan.qos,
            pause_id,
            ids,
            applied: plan.clone(),
            reported: plan,
            read_back: BTreeMap::new(),
            pod_read_back: None,
            observed_generation: generation,
            seen_generation: generation,
            resize: None,
            started_at: now_time(),
            status_version: 1,
            synced_version: 0,
            counters: BTreeMap::new(),
        }
    }

    pub fn container_dir(&self, cfg: &SimConfig, id: &str) -> PathBuf {
        self.dir
            .join(cfg.layout.container_dir_name(cfg.runtime, id))
    }

    /// Every cgroup of the pod that has no workload: pause and conmon.
    pub fn idle_dirs(&self, cfg: &SimConfig) -> Vec<PathBuf> {
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

    pub fn touch_status(&mut self) {
        self.status_version += 1;
    }

    /// A spec at a generation newer than any seen: observe it, or (re)start a
    /// resize toward it.
    fn on_generation(&mut self, cfg: &SimConfig, plan: PodPlan, generation: i64) {
        self.seen_generation = generation;
        match on_generation(self.resize.is_some(), &self.applied, &plan) {
            OnGeneration::Observe => self.observed_generation = generation,
            OnGeneration::Start => {
                // A real kubelet v1.37 moves status.observedGeneration with
                // the PodResizeInProgress condition, not at the end
                // (real-node parity test, docs/kubelet-behaviour.md §3).
                self.observed_generation = generation;
                self.resize = Some(ResizeState::new(
                    generation,
                    plan,
                    Instant::now(),
                    cfg.resize_delay,
                ));
            }
        }
        self.touch_status();
    }
}

/// A pod added or updated (not being deleted): start it, or take its new generation.
pub(crate) fn on_pod(cfg: &SimConfig, st: &mut State, key: PodKey, pod: &Pod) {
    let plan = match PodPlan::from_pod(pod) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, pod = %key, "sim kubelet: cannot plan pod");
            return;
        }
    };
    let generation = pod.metadata.generation.unwrap_or(1);
    match st.pods.get_mut(&key) {
        None => start_pod(
            cfg,
            st,
            key,
            pod.uid().unwrap_or_default(),
            plan,
            generation,
        ),
        Some(entry) if generation > entry.seen_generation => {
            entry.on_generation(cfg, plan, generation);
        }
        Some(_) => {}
    }
}

/// Starts a pod: its cgroups, named after `uid` (`metadata.uid`, or a
/// static pod's config hash), and its place in the node's weights and cpusets.
pub(crate) fn start_pod(
    cfg: &SimConfig,
    st: &mut State,
    key: PodKey,
    uid: String,
    plan: PodPlan,
    generation: i64,
) {
    let fault = st.faults.get(&key).cloned().unwrap_or_default();
    let mut entry = PodEntry::new(cfg, uid, plan.clone(), generation);
    if let Err(e) = write_pod_cgroups(cfg, &mut entry, &plan, &fault, false) {
        tracing::warn!(error = %e, pod = %key, "sim kubelet: writing pod cgroups");
    }
    super::cpuset::allocate(cfg, st, &key, &plan);
    st.pods.insert(key, entry);
    update_qos_weights(cfg, st);
    super::cpuset::write_all(cfg, st);
}

/// Removes a pod's cgroups and forgets it.
pub(crate) fn teardown(cfg: &SimConfig, st: &mut State, key: &PodKey) {
    if let Some(entry) = st.pods.remove(key) {
        if let Err(e) = remove_cgroup(&entry.dir) {
            tracing::warn!(error = %e, dir = %entry.dir.display(), "sim kubelet: removing pod cgroup");
        }
        update_qos_weights(cfg, st);
        super::cpuset::release(st, key);
        super::cpuset::write_all(cfg, st);
    }
}

/// The pod cgroup's `cpu.max` as the kubelet writes it for this layout.
fn pod_cpu_max(cfg: &SimConfig, plan: &PodPlan) -> String {
    match cfg.layout {
        // The kubelet sets a systemd pod slice's quota through systemd
        // (CPUQuotaPerSecUSec, 10 ms steps); containers get runc's exact write.
        SimLayout::Kind | SimLayout::Systemd => {
            cpu_max_line_systemd(plan.pod_limit_total_m(), cfg.period_us)
        }
        SimLayout::Cgroupfs => cpu_max_line(plan.pod_limit_total_m(), cfg.period_us),
    }
}

/// Writes `plan`'s values into the pod's cgroups, creating them if needed.
pub(crate) fn write_pod_cgroups(
    cfg: &SimConfig,
    entry: &mut PodEntry,
    plan: &PodPlan,
    fault: &Fault,
    resizing: bool,
) -> std::io::Result<()> {
    let period = cfg.period_us;
    let mode = cfg.write_mode;
    let pod_max = pod_cpu_max(cfg, plan);
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
pub(crate) fn update_qos_weights(cfg: &SimConfig, st: &State) {
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
