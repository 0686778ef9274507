//! Setters of the gauges: the node's values of a tick, and per-pod series
//! that exist only while the pod is on the node (an index of the pods with
//! series makes their removal possible; families cannot be iterated).

use foldhash::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::labels::{CgroupLabels, PodLabels, PodState, PodStateLabels, pod_labels};
use super::registry::Metrics;
use crate::model::{Name, Target};

/// Node-level values of one tick.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeValues {
    pub capacity_millicores: f64,
    pub usage_millicores: f64,
    pub real_slack_millicores: f64,
    pub booked_slack_millicores: f64,
    /// `cpu.pressure` avg10 of the node-allocatable cgroup, as a ratio (0–1).
    pub pressure_some_ratio: f64,
    pub pressure_full_ratio: Option<f64>,
    /// Stall of the last interval the pods' own CFS throttling explains (0–1).
    pub throttling_stall_ratio: f64,
    /// CPU owed to pods displaced within their requests, held across ticks,
    /// over capacity (0–1): what managed pods give back.
    pub contention_ratio: f64,
}

/// One managed pod's values of one tick (pod totals).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PodValues {
    pub request_millicores: f64,
    /// `None` while the pod has no CPU limit.
    pub limit_millicores: Option<f64>,
    /// `None` when the policy has no target this tick.
    pub target_millicores: Option<f64>,
    pub usage_millicores: f64,
    /// Throttled periods / periods over the last tick (0–1).
    pub throttled_ratio: f64,
}

impl Metrics {
    pub fn set_node(&self, v: &NodeValues) {
        // Millicore gauges are whole numbers already (from integers).
        self.node_capacity.set(v.capacity_millicores);
        self.node_usage.set(v.usage_millicores);
        self.node_real_slack.set(v.real_slack_millicores);
        self.node_booked_slack.set(v.booked_slack_millicores);
        self.node_pressure_some.set(ratio(v.pressure_some_ratio));
        self.node_pressure_full
            .set(ratio(v.pressure_full_ratio.unwrap_or(0.0)));
        self.node_throttling_stall
            .set(ratio(v.throttling_stall_ratio));
        self.node_contention.set(ratio(v.contention_ratio));
        self.node_set.store(true, Ordering::Release);
    }

    /// Sets a managed pod's series. `None` limit/target removes that series.
    pub fn set_pod(&self, namespace: &Name, pod: &Name, v: &PodValues) {
        let l = pod_labels(namespace, pod);
        if let Ok(mut i) = self.index.lock()
            && !i.contains_key(&l)
        {
            i.insert(l.clone(), Default::default());
        }
        self.pod_request.get_or_create(&l).set(v.request_millicores);
        match v.limit_millicores {
            Some(x) => {
                self.pod_limit.get_or_create(&l).set(x);
            }
            None => {
                self.pod_limit.remove(&l);
            }
        }
        match v.target_millicores {
            Some(x) => {
                self.pod_target.get_or_create(&l).set(x);
            }
            None => {
                self.pod_target.remove(&l);
            }
        }
        self.pod_usage.get_or_create(&l).set(v.usage_millicores);
        self.pod_throttled
            .get_or_create(&l)
            .set(ratio(v.throttled_ratio));
    }

    /// Drops a pod's managed-pod series (it became unmanaged), keeping drift.
    /// Asked of every unmanaged pod every tick: a pod the index does not
    /// hold has no series, and costs one lookup.
    pub fn remove_pod_values(&self, namespace: &Name, pod: &Name) {
        let l = pod_labels(namespace, pod);
        if self.index.lock().is_ok_and(|i| !i.contains_key(&l)) {
            return;
        }
        for f in [
            &self.pod_request,
            &self.pod_limit,
            &self.pod_target,
            &self.pod_usage,
            &self.pod_throttled,
        ] {
            f.remove(&l);
        }
    }

    /// Drops every series of a pod (it left the node).
    pub fn remove_pod(&self, namespace: &Name, pod: &Name) {
        self.remove_pod_values(namespace, pod);
        let l = pod_labels(namespace, pod);
        let containers = self
            .index
            .lock()
            .map(|mut i| i.remove(&l))
            .unwrap_or_default();
        for container in containers.into_iter().flatten() {
            self.drift.remove(&CgroupLabels {
                namespace: l.namespace.0.to_string(),
                pod: l.pod.0.to_string(),
                container,
            });
        }
    }

    /// Removes every pod not in `live` (namespace, name): a sweep after a
    /// relist, in case a deletion was missed. Runs every tick, so only the
    /// pods to remove are copied out of the index.
    pub fn retain_pods(&self, live: &HashSet<(&str, &str)>) {
        let gone: Vec<PodLabels> = match self.index.lock() {
            Ok(i) => i
                .keys()
                .filter(|l| !live.contains(&(&*l.namespace.0, &*l.pod.0)))
                .cloned()
                .collect(),
            Err(_) => return,
        };
        for l in gone {
            self.remove_pod(&l.namespace.0, &l.pod.0);
        }
    }

    /// Sets (1) or removes the drift gauge of one cgroup of a pod.
    pub fn set_drift(&self, namespace: &Name, pod: &Name, target: &Target, drifting: bool) {
        let l = CgroupLabels {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            container: target.container().to_string(),
        };
        let key = pod_labels(namespace, pod);
        if drifting {
            self.drift.get_or_create(&l).set(1);
            if let Ok(mut i) = self.index.lock() {
                i.entry(key).or_default().insert(l.container);
            }
        } else {
            self.drift.remove(&l);
            if let Ok(mut i) = self.index.lock()
                && let Some(set) = i.get_mut(&key)
            {
                set.remove(&l.container);
            }
        }
    }

    /// Replaces the pods-by-state gauge with this tick's counts.
    /// `unmanaged` maps reason → number of pods.
    pub fn set_pod_states(&self, managed: usize, unmanaged: &HashMap<&str, usize>) {
        self.pods.clear();
        self.pods
            .get_or_create(&PodStateLabels {
                state: PodState::managed,
                reason: String::new(),
            })
            .set(managed as i64);
        for (reason, n) in unmanaged {
            self.pods
                .get_or_create(&PodStateLabels {
                    state: PodState::unmanaged,
                    reason: (*reason).to_string(),
                })
                .set(*n as i64);
        }
    }
}

/// A ratio rounded to 6 decimals: `0.41 / 100` is 0.0040999999999999999 in
/// binary, and the exposition would print all of it. Six decimals are far
/// below what PSI (2 decimals of a percent) or a CFS period count resolve.
pub fn ratio(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1e6).round() / 1e6
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::ratio;

    #[test]
    fn ratios_print_without_float_noise() {
        let noisy = 0.41 / 100.0;
        assert_ne!(noisy.to_string(), "0.0041", "the noise this removes");
        assert_eq!(ratio(noisy).to_string(), "0.0041");
        assert_eq!(ratio(2.0 / 3.0).to_string(), "0.666667");
        assert_eq!(ratio(0.0), 0.0);
        assert!(ratio(f64::NAN).is_nan());
    }
}
