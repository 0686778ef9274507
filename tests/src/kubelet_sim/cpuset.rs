//! The kubelet's static CPU manager (`cpuManagerPolicy: static`), as the
//! simulator lays it out (docs/kubelet-behaviour.md §10): the node has
//! `cpus` online CPUs; the lowest `reserved` stay in the shared pool for
//! good; an app container of a Guaranteed pod whose CPU request is a whole
//! number of CPUs gets that many CPUs of its own (the lowest free ones); every
//! other app container gets the shared pool (all CPUs less the exclusive
//! ones), rewritten whenever an allocation comes or goes. The files are the
//! containers' `cpuset.cpus.effective`; pod, QoS and kubepods cgroups and the
//! pause containers keep the whole node (they are never written).
//!
//! Left out: topology (sockets, SMT siblings, NUMA), init containers'
//! allocations, and the real kubelet's 10 s reconcile lag before the pool
//! narrows (the simulator narrows it at once).

use std::collections::{BTreeMap, BTreeSet};

use super::cgroup_writer::write_atomic;
use super::driver::State;
use super::plan::{ContainerPlan, PodPlan};
use super::{PodKey, SimConfig, SimQos};

/// The static policy's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticCpuManager {
    /// Online CPUs of the node (the root's `cpuset.cpus.effective` is `0-(cpus−1)`).
    pub cpus: u32,
    /// Whole CPUs kept for the shared pool (⌈kube + system reserved⌉), CPU 0 up.
    pub reserved: u32,
}

/// Whole CPUs a container of this pod holds exclusively, if any.
pub(crate) fn exclusive_cpus(plan: &PodPlan, c: &ContainerPlan) -> Option<u32> {
    let req = c.request_m?;
    (plan.qos == SimQos::Guaranteed && req > 0 && req % 1000 == 0 && c.limit_m == Some(req))
        .then(|| u32::try_from(req / 1000).ok())
        .flatten()
}

/// A CPU set as a kernel CPU list (`0-1,4`).
pub fn cpu_list(set: &BTreeSet<u32>) -> String {
    let mut out = Vec::new();
    let mut it = set.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b += 1;
            it.next();
        }
        out.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
    }
    out.join(",")
}

/// Allocates CPUs for the containers of a pod just started (none when the
/// pod wants none, or too few are free: the real kubelet then fails the
/// pod's admission, which the simulator does not model).
pub(crate) fn allocate(cfg: &SimConfig, st: &mut State, key: &PodKey, plan: &PodPlan) {
    let Some(m) = cfg.static_cpu_manager else {
        return;
    };
    for c in plan.running() {
        let Some(n) = exclusive_cpus(plan, c) else {
            continue;
        };
        let taken: BTreeSet<u32> = st.exclusive.values().flatten().copied().collect();
        let free: Vec<u32> = (m.reserved..m.cpus)
            .filter(|x| !taken.contains(x))
            .collect();
        if free.len() < n as usize {
            tracing::warn!(pod = %key, container = %c.name, "sim kubelet: not enough free CPUs");
            continue;
        }
        st.exclusive.insert(
            (key.clone(), c.name.clone()),
            free[..n as usize].iter().copied().collect(),
        );
    }
}

/// Frees what a pod held.
pub(crate) fn release(st: &mut State, key: &PodKey) {
    st.exclusive.retain(|(k, _), _| k != key);
}

/// The shared pool: every CPU not held exclusively.
pub(crate) fn shared_pool(m: StaticCpuManager, st: &State) -> BTreeSet<u32> {
    let taken: BTreeSet<u32> = st.exclusive.values().flatten().copied().collect();
    (0..m.cpus).filter(|x| !taken.contains(x)).collect()
}

/// Writes every running app container's `cpuset.cpus.effective`.
pub(crate) fn write_all(cfg: &SimConfig, st: &State) {
    let Some(m) = cfg.static_cpu_manager else {
        return;
    };
    let pool = cpu_list(&shared_pool(m, st));
    for (key, entry) in &st.pods {
        for c in entry.applied.running() {
            let Some(id) = entry.ids.get(&c.name) else {
                continue;
            };
            let dir = entry.container_dir(cfg, id);
            let list = st
                .exclusive
                .get(&(key.clone(), c.name.clone()))
                .map_or_else(|| pool.clone(), cpu_list);
            if let Err(e) = write_atomic(&dir, "cpuset.cpus.effective", &format!("{list}\n")) {
                tracing::warn!(error = %e, dir = %dir.display(), "sim kubelet: writing cpuset");
            }
        }
    }
}

/// Exclusive CPUs by (pod, container), for tests.
pub(crate) type Exclusive = BTreeMap<(PodKey, String), BTreeSet<u32>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_merge_ranges() {
        let s: BTreeSet<u32> = [0, 1, 2, 5, 7, 8].into();
        assert_eq!(cpu_list(&s), "0-2,5,7-8");
        assert_eq!(cpu_list(&[3].into()), "3");
    }
}
