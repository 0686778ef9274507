//! Every `headroom_` metric family, registered under its name and help, and
//! the two text encodings. Setters live beside what they set: [`series`]
//! (node and per-pod gauges, kept bounded), [`counters`] (events).
//!
//! Built on `prometheus-client`, the official Rust client (OpenMetrics);
//! the older `prometheus` crate (tikv) is barely maintained.
//!
//! [`series`]: super::series
//! [`counters`]: super::counters

use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::labels::{
    BuildLabels, CgroupLabels, DriftEventLabels, LoweringLabels, PatchErrorLabels, PodLabels,
    PodStateLabels, ResizeLabels, ScanErrorLabels,
};

pub(super) type GaugeF = Gauge<f64, AtomicU64>;

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
    /// CPUs of the shared pool Burstable pods run on (`crate::signal::shared_pool`).
    pub node_shared_pool_cpus: GaugeF,
    pub pod_request: Family<PodLabels, GaugeF>,
    pub pod_limit: Family<PodLabels, GaugeF>,
    pub pod_target: Family<PodLabels, GaugeF>,
    pub pod_usage: Family<PodLabels, GaugeF>,
    pub pod_throttled: Family<PodLabels, GaugeF>,
    pub resizes: Family<ResizeLabels, Counter>,
    pub resize_latency: Histogram,
    pub drift: Family<CgroupLabels, Gauge>,
    pub drift_events: Family<DriftEventLabels, Counter>,
    pub lowerings: Family<LoweringLabels, Counter>,
    pub pods: Family<PodStateLabels, Gauge>,
    pub scan_duration: Histogram,
    pub decision_duration: Histogram,
    pub patch_errors: Family<PatchErrorLabels, Counter>,
    pub scan_errors: Family<ScanErrorLabels, Counter>,
    /// Pods with series, and their drifting containers ("" = pod cgroup):
    /// families cannot be iterated, so this is what makes removal possible.
    pub(super) index: Mutex<HashMap<PodLabels, BTreeSet<String>>>,
    /// The `node_*` gauges, encoded only once a measurement (two scans) has
    /// set them: before that, `capacity 0` / `slack 0` would read as a full
    /// node, not as "no data yet".
    node_registry: Registry,
    pub(super) node_set: AtomicBool,
}

impl Metrics {
    /// Registers every family under the `headroom_` prefix.
    #[expect(
        clippy::too_many_lines,
        reason = "registers every family in one list, read best whole"
    )]
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
            node_shared_pool_cpus: g(),
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
            lowerings: Family::default(),
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
            "CPU capacity for pods: min(kubepods cpu.max, allocatable, online CPUs, shared CPU pool)",
            m.node_capacity.clone(),
        );
        nr.register(
            "node_shared_pool_cpus",
            "CPUs Burstable pods can run on: the intersection of their containers' cpuset.cpus.effective (the static CPU manager's shared pool; every CPU under the none policy)",
            m.node_shared_pool_cpus.clone(),
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
            "CPU owed to pods displaced within their requests (cpu.pressure full beyond their own throttling), held over --contention-window, as a ratio of capacity: what managed pods give back",
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
            "lowerings",
            "Lowerings made for pods short of CPU, by what they bought once checked",
            m.lowerings.clone(),
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
}
