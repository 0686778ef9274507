//! Every `headroom_` metric family, and setters that keep per-pod series
//! bounded: a pod's series exist only while the pod is on the node.
//!
//! Built on `prometheus-client`, the official Rust client (OpenMetrics);
//! the older `prometheus` crate (tikv) is barely maintained.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::verify::Target;

type GaugeF = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub namespace: String,
    pub pod: String,
}

/// `container` is empty for the pod cgroup (the cAdvisor convention).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CgroupLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ResizeResult {
    /// Patch accepted by the apiserver.
    applied,
    /// Refused by validation/admission (the apiserver said why).
    refused,
    /// Transport or server error.
    error,
    /// Seen in `cpu.max` after the kubelet finished.
    verified,
    /// Not seen in `cpu.max` within the grace period.
    unverified,
    /// Computed but not sent (`--dry-run`).
    dry_run,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Direction {
    raise,
    lower,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResizeLabels {
    pub result: ResizeResult,
    pub direction: Direction,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PatchErrorClass {
    refused,
    conflict,
    not_found,
    forbidden,
    /// No HTTP answer: connection refused or reset, TLS, timeout.
    transport,
    /// 403 while the Node is re-registered (resize admission cannot find it).
    node_not_found,
    throttled,
    server_error,
    /// An HTTP status the agent has no rule for.
    unexpected,
}

impl PatchErrorClass {
    /// Every class, for tests that each one is reachable and exported.
    pub const ALL: [PatchErrorClass; 9] = [
        PatchErrorClass::refused,
        PatchErrorClass::conflict,
        PatchErrorClass::not_found,
        PatchErrorClass::forbidden,
        PatchErrorClass::transport,
        PatchErrorClass::node_not_found,
        PatchErrorClass::throttled,
        PatchErrorClass::server_error,
        PatchErrorClass::unexpected,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PatchErrorLabels {
    pub class: PatchErrorClass,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PodState {
    managed,
    unmanaged,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodStateLabels {
    pub state: PodState,
    /// Why a pod is unmanaged (a fixed set from the policy); empty for managed.
    pub reason: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum CgroupKind {
    pod,
    container,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftEventLabels {
    pub cgroup: CgroupKind,
}

/// What went wrong reading cgroups. The first three fail a whole tick;
/// the others are one file or directory, the tick goes on without it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ScanErrorKind {
    /// kubepods' own files unusable: the tick was skipped.
    kubepods,
    /// The scan did not finish within the tick deadline: the tick was skipped.
    timeout,
    /// kubepods `usage_usec` went backwards: that interval's usage was skipped.
    counter_reset,
    permission_denied,
    malformed,
    missing,
    /// A symlink, FIFO or device where a regular file belongs.
    not_regular_file,
    too_large,
    io,
}

impl ScanErrorKind {
    pub fn of(e: &crate::cgroup::CgroupError) -> Self {
        use crate::cgroup::CgroupError as E;
        match e {
            E::PermissionDenied { .. } => Self::permission_denied,
            E::Malformed { .. } => Self::malformed,
            E::Missing(_) | E::Vanished(_) => Self::missing,
            E::NotRegular { .. } => Self::not_regular_file,
            E::TooLarge { .. } => Self::too_large,
            E::Io { .. } => Self::io,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScanErrorLabels {
    pub kind: ScanErrorKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

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
    /// Smoothed contention, the stall the damping acts on (0–1).
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

/// All families. Fields are public so callers can reach any series; prefer
/// the setters, which keep per-pod series removable.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub node_capacity: GaugeF,
    pub node_usage: GaugeF,
    pub node_real_slack: GaugeF,
    pub node_booked_slack: GaugeF,
    pub node_pressure_some: GaugeF,
    pub node_pressure_full: GaugeF,
    pub node_throttling_stall: GaugeF,
    pub node_contention: GaugeF,
    pub pod_request: Family<PodLabels, GaugeF>,
    pub pod_limit: Family<PodLabels, GaugeF>,
    pub pod_target: Family<PodLabels, GaugeF>,
    pub pod_usage: Family<PodLabels, GaugeF>,
    pub pod_throttled: Family<PodLabels, GaugeF>,
    pub resizes: Family<ResizeLabels, Counter>,
    pub resize_latency: Histogram,
    pub drift: Family<CgroupLabels, Gauge>,
    pub drift_events: Family<DriftEventLabels, Counter>,
    pub pods: Family<PodStateLabels, Gauge>,
    pub scan_duration: Histogram,
    pub decision_duration: Histogram,
    pub patch_errors: Family<PatchErrorLabels, Counter>,
    pub scan_errors: Family<ScanErrorLabels, Counter>,
    /// Pods with series, and their drifting containers ("" = pod cgroup):
    /// families cannot be iterated, so this is what makes removal possible.
    index: Mutex<HashMap<PodLabels, BTreeSet<String>>>,
    /// The `node_*` gauges, encoded only once a measurement (two scans) has
    /// set them: before that, `capacity 0` / `slack 0` would read as a full
    /// node, not as "no data yet".
    node_registry: Registry,
    node_set: AtomicBool,
}

fn pod_labels(namespace: &str, pod: &str) -> PodLabels {
    PodLabels {
        namespace: namespace.to_string(),
        pod: pod.to_string(),
    }
}

impl Metrics {
    /// Registers every family under the `headroom_` prefix.
    pub fn new(version: &str) -> Self {
        let mut r = Registry::with_prefix("headroom");
        let g = || GaugeF::default();
        let m = Metrics {
            node_capacity: g(),
            node_usage: g(),
            node_real_slack: g(),
            node_booked_slack: g(),
            node_pressure_some: g(),
            node_pressure_full: g(),
            node_throttling_stall: g(),
            node_contention: g(),
            pod_request: Family::default(),
            pod_limit: Family::default(),
            pod_target: Family::default(),
            pod_usage: Family::default(),
            pod_throttled: Family::default(),
            resizes: Family::default(),
            // 0.25 s … ~64 s: the kubelet applies a resize in seconds.
            resize_latency: Histogram::new(exponential_buckets(0.25, 2.0, 9)),
            drift: Family::default(),
            drift_events: Family::default(),
            pods: Family::default(),
            // 50 µs … ~0.4 s: a scan of 500 pods takes milliseconds.
            scan_duration: Histogram::new(exponential_buckets(0.00005, 2.0, 14)),
            decision_duration: Histogram::new(exponential_buckets(0.00005, 2.0, 14)),
            patch_errors: Family::default(),
            scan_errors: Family::default(),
            index: Mutex::new(HashMap::new()),
            registry: Registry::default(),
            node_registry: Registry::default(),
            node_set: AtomicBool::new(false),
        };
        let mut nr = Registry::with_prefix("headroom");
        nr.register(
            "node_capacity_millicores",
            "CPU capacity for pods: min(kubepods cpu.max, allocatable, online CPUs)",
            m.node_capacity.clone(),
        );
        nr.register(
            "node_usage_millicores",
            "CPU used by all pods (kubepods cgroup) over the last tick",
            m.node_usage.clone(),
        );
        nr.register(
            "node_real_slack_millicores",
            "Idle CPU the cgroups show, after the reserve, available to managed pods",
            m.node_real_slack.clone(),
        );
        nr.register(
            "node_booked_slack_millicores",
            "Allocatable CPU minus the sum of booked requests (what the scheduler sees)",
            m.node_booked_slack.clone(),
        );
        nr.register(
            "node_pressure_some_ratio",
            "kubepods cpu.pressure some avg10, as a ratio",
            m.node_pressure_some.clone(),
        );
        nr.register(
            "node_pressure_full_ratio",
            "kubepods cpu.pressure full avg10, as a ratio (0 where the kernel has no full line)",
            m.node_pressure_full.clone(),
        );
        nr.register(
            "node_cpu_throttling_stall_ratio",
            "Part of kubepods cpu.pressure some over the last tick explained by pods' own CFS throttling (throttled_usec), as a ratio of wall time",
            m.node_throttling_stall.clone(),
        );
        nr.register(
            "node_cpu_contention_ratio",
            "kubepods CPU stall minus own throttling, smoothed over ~5 s: the contention that damps the slack, as a ratio",
            m.node_contention.clone(),
        );
        r.register(
            "pod_cpu_request_millicores",
            "CPU request of a managed pod (pod-level or sum of containers)",
            m.pod_request.clone(),
        );
        r.register(
            "pod_cpu_limit_millicores",
            "Current CPU limit of a managed pod (pod-level or sum of containers)",
            m.pod_limit.clone(),
        );
        r.register(
            "pod_cpu_target_millicores",
            "CPU limit the policy wants for a managed pod",
            m.pod_target.clone(),
        );
        r.register(
            "pod_cpu_usage_millicores",
            "CPU used by a managed pod's cgroup over the last tick",
            m.pod_usage.clone(),
        );
        r.register(
            "pod_cpu_throttled_ratio",
            "Share of a managed pod's CFS periods throttled over the last tick",
            m.pod_throttled.clone(),
        );
        r.register(
            "resizes",
            "Resize attempts by result and direction",
            m.resizes.clone(),
        );
        r.register(
            "resize_verification_latency_seconds",
            "Time from sending a resize to seeing it in cpu.max",
            m.resize_latency.clone(),
        );
        r.register(
            "cgroup_drift",
            "1 while a cgroup's cpu.max disagrees with the pod spec past the grace period (container empty for the pod cgroup)",
            m.drift.clone(),
        );
        r.register(
            "cgroup_drift_events",
            "Drifts detected, by kind of cgroup",
            m.drift_events.clone(),
        );
        r.register(
            "pods",
            "Pods on the node by state and, when unmanaged, reason",
            m.pods.clone(),
        );
        r.register(
            "scan_duration_seconds",
            "Time to read the cgroup tree once",
            m.scan_duration.clone(),
        );
        r.register(
            "decision_duration_seconds",
            "Time to compute targets for all pods once",
            m.decision_duration.clone(),
        );
        r.register(
            "patch_errors",
            "Failed resize patches by class",
            m.patch_errors.clone(),
        );
        r.register(
            "scan_errors",
            "cgroup read errors by kind; kubepods, timeout and counter_reset skip a tick's decisions",
            m.scan_errors.clone(),
        );
        r.register(
            "build",
            "Build information",
            Info::new(BuildLabels {
                version: version.to_string(),
            }),
        );
        Metrics {
            registry: r,
            node_registry: nr,
            ..m
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    fn node_values_known(&self) -> bool {
        self.node_set.load(Ordering::Acquire)
    }

    /// Prometheus text format 0.0.4.
    pub fn encode_prometheus(&self) -> String {
        use prometheus_client::encoding::prometheus_text::encode;
        let mut s = String::new();
        // Writing to a String cannot fail.
        if self.node_values_known() {
            let _ = encode(&mut s, &self.node_registry);
        }
        let _ = encode(&mut s, &self.registry);
        s
    }

    /// OpenMetrics text format (ends with `# EOF`).
    pub fn encode_openmetrics(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut s = String::new();
        if self.node_values_known() {
            let _ = encode_registry(&mut s, &self.node_registry);
        }
        let _ = encode_registry(&mut s, &self.registry);
        let _ = encode_eof(&mut s);
        s
    }

    pub fn scan_error(&self, kind: ScanErrorKind) {
        self.scan_errors
            .get_or_create(&ScanErrorLabels { kind })
            .inc();
    }

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
    pub fn set_pod(&self, namespace: &str, pod: &str, v: &PodValues) {
        let l = pod_labels(namespace, pod);
        if let Ok(mut i) = self.index.lock() {
            i.entry(l.clone()).or_default();
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
    pub fn remove_pod_values(&self, namespace: &str, pod: &str) {
        let l = pod_labels(namespace, pod);
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
    pub fn remove_pod(&self, namespace: &str, pod: &str) {
        self.remove_pod_values(namespace, pod);
        let l = pod_labels(namespace, pod);
        let containers = self
            .index
            .lock()
            .map(|mut i| i.remove(&l))
            .unwrap_or_default();
        for container in containers.into_iter().flatten() {
            self.drift.remove(&CgroupLabels {
                namespace: l.namespace.clone(),
                pod: l.pod.clone(),
                container,
            });
        }
    }

    /// Removes every pod not in `live` (namespace, name): a sweep after a
    /// relist, in case a deletion was missed.
    pub fn retain_pods(&self, live: &HashSet<(String, String)>) {
        let mut known: HashSet<PodLabels> = HashSet::new();
        if let Ok(i) = self.index.lock() {
            known.extend(i.keys().cloned());
        }
        for l in known {
            if !live.contains(&(l.namespace.clone(), l.pod.clone())) {
                self.remove_pod(&l.namespace, &l.pod);
            }
        }
    }

    /// Sets (1) or removes the drift gauge of one cgroup of a pod.
    pub fn set_drift(&self, namespace: &str, pod: &str, target: &Target, drifting: bool) {
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

    /// A new drift was detected (count it; the gauge is [`Metrics::set_drift`]).
    pub fn drift_detected(&self, target: &Target) {
        let cgroup = match target {
            Target::Pod => CgroupKind::pod,
            Target::Container(_) => CgroupKind::container,
        };
        self.drift_events
            .get_or_create(&DriftEventLabels { cgroup })
            .inc();
    }

    pub fn resize(&self, result: ResizeResult, direction: Direction) {
        self.resizes
            .get_or_create(&ResizeLabels { result, direction })
            .inc();
    }

    pub fn resize_verified(&self, direction: Direction, latency_seconds: f64) {
        self.resize(ResizeResult::verified, direction);
        self.resize_latency.observe(latency_seconds);
    }

    pub fn patch_error(&self, class: PatchErrorClass) {
        self.patch_errors
            .get_or_create(&PatchErrorLabels { class })
            .inc();
    }

    /// Replaces the pods-by-state gauge with this tick's counts.
    /// `unmanaged` maps reason → number of pods.
    pub fn set_pod_states(&self, managed: usize, unmanaged: &HashMap<String, usize>) {
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
                    reason: reason.clone(),
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
mod ratio_tests {
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
