//! The `cpu.max` the kubelet should have written for a pod, derived from the
//! pod's spec (docs/kubelet-behaviour.md §2, §4). Pure: no I/O.
//!
//! We compare the cgroups with the *spec*, never with `status.resources`: the
//! status lags behind the cgroup (docs/kubelet-behaviour.md §3) and under-reports requests
//! after pod-level resizes (docs/kubelet-behaviour.md §4), so comparing with it would flap.

use std::fmt;

use crate::cgroup::{CpuMax, Driver};
use crate::model::{Millis, PodView, Qos};
use crate::quantity::format_cpu_millis;

/// The kubelet's default CFS period. Only a fallback for display: a compare
/// always uses the period of the file it reads.
pub const DEFAULT_PERIOD_US: u64 = 100_000;
/// The kubelet never writes a quota below 1000 µs (`MinQuotaPeriod`).
pub const MIN_QUOTA_US: u64 = 1_000;

/// The expected content of one `cpu.max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedMax {
    /// `max <period>`: no CPU limit applies.
    Unlimited,
    /// A quota derived from `millis` at `period_us`.
    Limit { millis: Millis, period_us: u64 },
}

impl ExpectedMax {
    fn limit(millis: Option<Millis>, period_us: u64) -> Self {
        match millis {
            // A zero limit gives quota 0, which the kubelet treats as "not set".
            Some(millis) if millis > 0 => ExpectedMax::Limit { millis, period_us },
            _ => ExpectedMax::Unlimited,
        }
    }

    /// The same limit at another period (the one the file actually has).
    pub fn at_period(self, period_us: u64) -> Self {
        match self {
            ExpectedMax::Unlimited => ExpectedMax::Unlimited,
            ExpectedMax::Limit { millis, .. } => ExpectedMax::Limit { millis, period_us },
        }
    }

    pub fn millis(&self) -> Option<Millis> {
        match self {
            ExpectedMax::Unlimited => None,
            ExpectedMax::Limit { millis, .. } => Some(*millis),
        }
    }

    pub fn period_us(&self) -> Option<u64> {
        match self {
            ExpectedMax::Unlimited => None,
            ExpectedMax::Limit { period_us, .. } => Some(*period_us),
        }
    }

    /// The quota the kubelet computes: `millis × period / 1000` (floored, as
    /// the kubelet's integer arithmetic does), at least [`MIN_QUOTA_US`].
    pub fn quota_us(&self) -> Option<u64> {
        let ExpectedMax::Limit { millis, period_us } = *self else {
            return None;
        };
        let q = (millis as u128 * period_us as u128 / 1000).min(u64::MAX as u128) as u64;
        Some(q.max(MIN_QUOTA_US))
    }

    /// Accepted quotas `[low, high]`. With the systemd driver, runc passes the
    /// quota to systemd as `CPUQuotaPerSecUSec` rounded up to 10 ms per
    /// second (1% of a CPU, i.e. 10m), so the file may hold the quota of the
    /// next 10m; with cgroupfs the value is exact.
    pub fn quota_range(&self, driver: Driver) -> Option<(u64, u64)> {
        let exact = self.quota_us()?;
        let period = self.period_us()?.max(1) as u128;
        let high = match driver {
            Driver::Cgroupfs => exact,
            Driver::Systemd => {
                let per_sec = exact as u128 * 1_000_000 / period;
                let per_sec = per_sec.div_ceil(10_000) * 10_000;
                ((per_sec * period / 1_000_000).min(u64::MAX as u128) as u64).max(exact)
            }
        };
        Some((exact, high))
    }

    /// Whether `observed` is what the kubelet should have written. The quota
    /// is judged at the observed file's own period.
    pub fn accepts(&self, observed: &CpuMax, driver: Driver) -> bool {
        match (
            self.at_period(observed.period_us).quota_range(driver),
            observed.quota_us,
        ) {
            (None, None) => true,
            (Some((lo, hi)), Some(q)) => (lo..=hi).contains(&q),
            _ => false,
        }
    }

    /// `"80000 100000 (800m)"`, `"10100..11000 100000 (101m)"`, `"max (no limit)"`.
    pub fn describe(&self, driver: Driver) -> String {
        match (self.quota_range(driver), self.period_us(), self.millis()) {
            (Some((lo, hi)), Some(p), Some(m)) if lo == hi => {
                format!("{lo} {p} ({})", format_cpu_millis(m))
            }
            (Some((lo, hi)), Some(p), Some(m)) => {
                format!("{lo}..{hi} {p} ({})", format_cpu_millis(m))
            }
            _ => "max (no limit)".to_string(),
        }
    }
}

impl fmt::Display for ExpectedMax {
    /// The exact value, without tolerance; see [`ExpectedMax::describe`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe(Driver::Cgroupfs))
    }
}

/// Expected `cpu.max` of one container cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedContainer {
    pub name: String,
    /// The id of the *running* container, from its status. `None` while the
    /// container is not running: its cgroup then need not exist, and an old id
    /// would point at a gone cgroup.
    pub container_id: Option<String>,
    pub max: ExpectedMax,
}

/// Expected `cpu.max` of a pod cgroup and its app and sidecar containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub pod: ExpectedMax,
    pub containers: Vec<ExpectedContainer>,
}

/// The `cpu.max` values the kubelet should converge to for `pod`'s spec.
///
/// - Container: its own CPU limit; without one, the pod-level CPU limit if
///   set; else `max`.
/// - Pod cgroup: BestEffort → `max`. Otherwise, with a pod-level CPU limit:
///   that limit + `spec.overhead.cpu`; else, when every container (sidecars
///   included) has a CPU limit: their sum + overhead; else `max`. Guaranteed
///   pods get a quota too.
///
/// Not covered: regular (non-sidecar) init containers, which [`PodView`] does
/// not carry; the kubelet takes max(Σ, each init container) and leaves the pod
/// unlimited if one of them has no CPU limit. Also a kubelet with
/// `cpuCFSQuota: false`, which writes `max` everywhere.
pub fn expected_cpu_max(pod: &PodView, period_us: u64) -> Expected {
    let pod_limit = pod
        .pod_resources
        .and_then(|r| r.cpu_limit)
        .filter(|&m| m > 0);
    let containers = pod
        .containers
        .iter()
        .map(|c| ExpectedContainer {
            name: c.name.to_string(),
            container_id: pod
                .status_of(&c.name)
                .filter(|s| s.running)
                .and_then(|s| s.container_id.clone()),
            max: ExpectedMax::limit(
                c.resources.cpu_limit.filter(|&m| m > 0).or(pod_limit),
                period_us,
            ),
        })
        .collect();
    let aggregate = || -> Option<Millis> {
        if pod.containers.is_empty() {
            return None;
        }
        pod.containers
            .iter()
            .map(|c| c.resources.cpu_limit.filter(|&m| m > 0))
            .try_fold(0u64, |acc, l| l.map(|l| acc.saturating_add(l)))
    };
    let pod_max = match pod.qos {
        Qos::BestEffort => ExpectedMax::Unlimited,
        Qos::Burstable | Qos::Guaranteed => ExpectedMax::limit(
            pod_limit
                .or_else(aggregate)
                .map(|l| l.saturating_add(pod.overhead_cpu.unwrap_or(0))),
            period_us,
        ),
    };
    Expected {
        pod: pod_max,
        containers,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{ContainerKind, ContainerSpec, Resources};
    use crate::testkit::{self, PodBuilder};

    pub(crate) fn container(name: &str, req: Option<Millis>, lim: Option<Millis>) -> ContainerSpec {
        testkit::container(name, testkit::cpu(req, lim))
    }

    /// A running Burstable pod whose containers run with ids `id-<name>`.
    pub(crate) fn pod(uid: &str, containers: Vec<ContainerSpec>) -> PodView {
        PodBuilder::new("ns", &format!("pod-{uid}"), uid)
            .node("n1")
            .containers(containers)
            .running("containerd", |_, c| format!("id-{}", c.name))
            .build()
    }

    fn lim(millis: Millis) -> ExpectedMax {
        ExpectedMax::Limit {
            millis,
            period_us: DEFAULT_PERIOD_US,
        }
    }

    fn pod_level(p: &mut PodView, req: Option<Millis>, lim: Option<Millis>) {
        p.pod_resources = Some(Resources {
            cpu_request: req,
            cpu_limit: lim,
            ..Default::default()
        });
    }

    #[test]
    fn container_limits_sum_into_pod_quota() {
        let p = pod(
            "u",
            vec![
                container("a", Some(100), Some(500)),
                container("b", Some(100), Some(300)),
            ],
        );
        let e = expected_cpu_max(&p, DEFAULT_PERIOD_US);
        assert_eq!(e.pod, lim(800));
        assert_eq!(e.pod.quota_us(), Some(80_000));
        assert_eq!(e.containers[0].max, lim(500));
        assert_eq!(e.containers[1].max, lim(300));
        assert_eq!(e.containers[0].container_id.as_deref(), Some("id-a"));
    }

    #[test]
    fn one_container_without_limit_leaves_pod_unlimited() {
        let p = pod(
            "u",
            vec![
                container("a", Some(100), Some(500)),
                container("b", Some(100), None),
            ],
        );
        let e = expected_cpu_max(&p, DEFAULT_PERIOD_US);
        assert_eq!(e.pod, ExpectedMax::Unlimited);
        assert_eq!(e.containers[1].max, ExpectedMax::Unlimited);
    }

    #[test]
    fn sidecar_limit_counts_in_pod_aggregate() {
        let mut side = container("side", Some(50), Some(200));
        side.kind = ContainerKind::Sidecar;
        let p = pod("u", vec![container("a", Some(100), Some(500)), side]);
        assert_eq!(expected_cpu_max(&p, DEFAULT_PERIOD_US).pod, lim(700));
    }

    #[test]
    fn sidecar_without_limit_leaves_pod_unlimited() {
        let mut side = container("side", Some(50), None);
        side.kind = ContainerKind::Sidecar;
        let p = pod("u", vec![container("a", Some(100), Some(500)), side]);
        assert_eq!(
            expected_cpu_max(&p, DEFAULT_PERIOD_US).pod,
            ExpectedMax::Unlimited
        );
    }

    #[test]
    fn overhead_is_added_to_aggregate_and_pod_level_limit() {
        let mut p = pod("u", vec![container("a", Some(100), Some(500))]);
        p.overhead_cpu = Some(250);
        assert_eq!(expected_cpu_max(&p, DEFAULT_PERIOD_US).pod, lim(750));
        pod_level(&mut p, Some(100), Some(800));
        assert_eq!(expected_cpu_max(&p, DEFAULT_PERIOD_US).pod, lim(1050));
    }

    #[test]
    fn overhead_does_not_create_a_quota_for_an_unlimited_pod() {
        let mut p = pod("u", vec![container("a", Some(100), None)]);
        p.overhead_cpu = Some(250);
        assert_eq!(
            expected_cpu_max(&p, DEFAULT_PERIOD_US).pod,
            ExpectedMax::Unlimited
        );
    }

    /// docs/kubelet-behaviour.md §4 pod a: pod limit 800m, container without a limit follows it.
    #[test]
    fn container_without_limit_follows_pod_level_limit() {
        let mut p = pod("u", vec![container("c", Some(100), None)]);
        pod_level(&mut p, Some(100), Some(800));
        let e = expected_cpu_max(&p, DEFAULT_PERIOD_US);
        assert_eq!(e.pod.quota_us(), Some(80_000));
        assert_eq!(e.containers[0].max.quota_us(), Some(80_000));
    }

    /// docs/kubelet-behaviour.md §4 pod b: container with its own 400m keeps it under a 800m pod limit.
    #[test]
    fn container_limit_stays_a_sub_cap_under_pod_level_limit() {
        let mut p = pod("u", vec![container("c", Some(100), Some(400))]);
        pod_level(&mut p, Some(100), Some(800));
        let e = expected_cpu_max(&p, DEFAULT_PERIOD_US);
        assert_eq!(e.pod.quota_us(), Some(80_000));
        assert_eq!(e.containers[0].max.quota_us(), Some(40_000));
    }

    #[test]
    fn pod_level_limit_wins_over_container_aggregate() {
        let mut p = pod(
            "u",
            vec![
                container("a", Some(100), Some(400)),
                container("b", Some(100), Some(400)),
            ],
        );
        pod_level(&mut p, None, Some(500));
        assert_eq!(expected_cpu_max(&p, DEFAULT_PERIOD_US).pod, lim(500));
    }

    #[test]
    fn guaranteed_pod_gets_a_quota() {
        let mut p = pod("u", vec![container("a", Some(500), Some(500))]);
        p.qos = Qos::Guaranteed;
        assert_eq!(
            expected_cpu_max(&p, DEFAULT_PERIOD_US).pod.quota_us(),
            Some(50_000)
        );
    }

    #[test]
    fn best_effort_pod_is_unlimited() {
        let mut p = pod("u", vec![container("a", None, None)]);
        p.qos = Qos::BestEffort;
        let e = expected_cpu_max(&p, DEFAULT_PERIOD_US);
        assert_eq!(e.pod, ExpectedMax::Unlimited);
        assert_eq!(e.containers[0].max, ExpectedMax::Unlimited);
    }

    #[test]
    fn quota_has_a_1000us_minimum() {
        assert_eq!(lim(5).quota_us(), Some(1_000));
        assert_eq!(lim(1).quota_us(), Some(1_000));
        assert_eq!(lim(10).quota_us(), Some(1_000));
        assert_eq!(lim(11).quota_us(), Some(1_100));
    }

    #[test]
    fn quota_uses_the_given_period() {
        let p = pod("u", vec![container("a", Some(100), Some(250))]);
        let e = expected_cpu_max(&p, 50_000);
        assert_eq!(e.pod.quota_us(), Some(12_500));
        assert_eq!(e.pod.at_period(200_000).quota_us(), Some(50_000));
    }

    #[test]
    fn zero_limit_means_no_quota() {
        let p = pod("u", vec![container("a", Some(0), Some(0))]);
        let e = expected_cpu_max(&p, DEFAULT_PERIOD_US);
        assert_eq!(e.containers[0].max, ExpectedMax::Unlimited);
        assert_eq!(e.pod, ExpectedMax::Unlimited);
    }

    #[test]
    fn container_not_running_has_no_id() {
        let mut p = pod("u", vec![container("a", Some(100), Some(200))]);
        p.statuses[0].running = false;
        assert_eq!(
            expected_cpu_max(&p, DEFAULT_PERIOD_US).containers[0].container_id,
            None
        );
    }

    #[test]
    fn systemd_tolerance_rounds_up_to_next_10m() {
        // docs/kubelet-behaviour.md §4: a 101m limit came out as 11000 100000 with systemd.
        let e = lim(101);
        assert_eq!(e.quota_range(Driver::Systemd), Some((10_100, 11_000)));
        assert_eq!(e.quota_range(Driver::Cgroupfs), Some((10_100, 10_100)));
        let m = |q| CpuMax {
            quota_us: Some(q),
            period_us: DEFAULT_PERIOD_US,
        };
        assert!(e.accepts(&m(11_000), Driver::Systemd));
        assert!(!e.accepts(&m(11_000), Driver::Cgroupfs));
        assert!(!e.accepts(&m(11_100), Driver::Systemd));
        assert!(!e.accepts(&m(10_000), Driver::Systemd));
        // A multiple of 10m has no slack even with systemd.
        assert_eq!(
            lim(800).quota_range(Driver::Systemd),
            Some((80_000, 80_000))
        );
    }

    #[test]
    fn tolerance_is_relative_to_the_period() {
        // 101m at a 50 ms period: exact 5050, next 10m is 110m → 5500.
        let e = ExpectedMax::Limit {
            millis: 101,
            period_us: 50_000,
        };
        assert_eq!(e.quota_range(Driver::Systemd), Some((5_050, 5_500)));
    }

    #[test]
    fn accepts_judges_at_the_observed_period() {
        let e = lim(800);
        let obs = CpuMax {
            quota_us: Some(40_000),
            period_us: 50_000,
        };
        assert!(e.accepts(&obs, Driver::Cgroupfs));
        let unl = CpuMax {
            quota_us: None,
            period_us: 100_000,
        };
        assert!(!e.accepts(&unl, Driver::Cgroupfs));
        assert!(ExpectedMax::Unlimited.accepts(&unl, Driver::Systemd));
        assert!(!ExpectedMax::Unlimited.accepts(&obs, Driver::Systemd));
    }

    #[test]
    fn describe_shows_quota_period_and_millis() {
        assert_eq!(lim(800).to_string(), "80000 100000 (800m)");
        assert_eq!(lim(2000).to_string(), "200000 100000 (2)");
        assert_eq!(
            lim(101).describe(Driver::Systemd),
            "10100..11000 100000 (101m)"
        );
        assert_eq!(ExpectedMax::Unlimited.to_string(), "max (no limit)");
    }
}
