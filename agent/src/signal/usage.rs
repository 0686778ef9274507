//! What a node's slack is made of, from two snapshots of the kubepods tree:
//! capacity, usage, per-pod usage and throttling, pressure ([`NodeUsage`]).
//! Pure but for [`online_cpus`] (sysconf) and [`online_cpus_at`] (the
//! root's cpuset, read through `crate::cgroup::cpuset`).
//!
//! Three figures, three names. *Idle* is `capacity − kubepods usage`,
//! clamped at 0 ([`NodeUsage::idle_m`]; `headroom-agent slack` shows it).
//! *Slack* is the policy's (`NodeDecision::slack_m`): it applies its
//! own-burst correction (`Σ_managed min(u_i, r_i)`), the reserve and what
//! displaced pods are owed on top, from the per-pod usage kept in
//! [`NodeUsage::pods`]. *Booked slack* is allocatable − requests, as the
//! scheduler sees it (a gauge only).

use foldhash::HashMap;

use crate::cgroup::{CgroupSample, CpuStat, NodeSnapshot, PodCgroup};
use crate::model::{CgroupPodId, Millis, PodView, Qos};

/// What bounds the CPU pods can use, besides the cgroup tree itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityInputs {
    /// Node `status.allocatable.cpu` (or `--node-allocatable`).
    pub node_allocatable_m: Option<Millis>,
    /// Online CPUs of the host ([`online_cpus`]); 0 = unknown.
    pub online_cpus: u64,
    /// CPUs in the shared pool Burstable pods run on under the static CPU
    /// manager ([`crate::signal::shared_pool`]); `None` = not read.
    pub shared_pool_cpus: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// An operator set a finite `cpu.max` on kubepods: the real cap.
    KubepodsCpuMax,
    NodeAllocatable,
    OnlineCpus,
    /// The shared pool (Burstable containers' `cpuset.cpus.effective`) is
    /// smaller than the node: exclusive CPUs of Guaranteed pods are out of reach.
    SharedPool,
    /// Nothing known: capacity 0, so no slack is claimed.
    Unknown,
}

/// Where the total usage came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageBasis {
    /// Rate of kubepods `usage_usec` (the normal case).
    Kubepods,
    /// kubepods' counter went backwards (cgroup recreated): sum of the pods
    /// whose rate is known instead.
    PodSum,
    /// The two snapshots are not ordered in time: no rate at all, and no
    /// slack is claimed.
    None,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PodUsage {
    /// Serialized as `pod_id` (and `uid`, its old name, for one release).
    #[serde(flatten, serialize_with = "CgroupPodId::serialize_keys")]
    pub id: CgroupPodId,
    pub qos: Qos,
    /// CPU used over the interval, millicores. `None` for a pod that appeared
    /// since the previous snapshot, whose counters reset, or whose cgroup
    /// could not be read in either snapshot.
    pub usage_m: Option<Millis>,
    /// Δnr_throttled / Δnr_periods: the share of enforcement periods in which
    /// the pod hit its quota. `None` when no period ran (unlimited) or unknown.
    pub throttled_ratio: Option<f64>,
    /// Time its tasks spent throttled over the interval, µs: the larger of the
    /// pod cgroup's Δ`throttled_usec` and the sum over its limited
    /// containers' (a task is throttled at whichever quota runs out first).
    /// `None` when unknown; 0 when nothing throttled it.
    pub throttled_us: Option<u64>,
}

/// kubepods CPU stall over one interval, split into what the pods' own CFS
/// quotas explain and the rest. Display only: the rest still mixes a pod's
/// own queued threads with pods displaced by others, which only per-pod
/// pressure tells apart (`crate::signal::contention`).
///
/// The kernel counts a throttled task as runnable and not running, so a pod
/// throttled at its own limit raises kubepods `cpu.pressure` even on an idle
/// node (on a 2-CPU node one single-threaded pod at 300m gave `some` ≈ 70 %;
/// docs/kubelet-behaviour.md §8). Exact per interval from the `total`
/// counters; the kernel's `avg10` would still carry throttling from before a
/// raise for tens of seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stall {
    /// Δ`some total` / interval, percent.
    pub some_pct: f64,
    /// Σ pods' throttled time / interval, percent, at most `some_pct`.
    pub throttling_pct: f64,
    /// `some_pct − throttling_pct`: tasks that waited for a CPU others held,
    /// whoever the others were (the pod's own threads included). Raw, this
    /// interval's; not the owed demand `headroom_node_cpu_contention_ratio`
    /// holds across ticks.
    pub queued_pct: f64,
}

/// `queued_pct` is also written under its name before 0.2, `contention_pct`
/// (`headroom-agent slack --json`), for one release: readers of the old
/// name keep working while they move.
impl serde::Serialize for Stall {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Stall", 4)?;
        st.serialize_field("some_pct", &self.some_pct)?;
        st.serialize_field("throttling_pct", &self.throttling_pct)?;
        st.serialize_field("queued_pct", &self.queued_pct)?;
        st.serialize_field("contention_pct", &self.queued_pct)?;
        st.end()
    }
}

impl Stall {
    /// From Δ`some total` and Σ throttled time over `dt_us`; `None` when the
    /// interval is empty.
    pub fn from_deltas(some_us: u64, throttled_us: u64, dt_us: u64) -> Option<Stall> {
        if dt_us == 0 {
            return None;
        }
        let pct = |us: u64| (us as f64 * 100.0 / dt_us as f64).min(100.0);
        let some_pct = pct(some_us);
        let throttling_pct = pct(throttled_us).min(some_pct);
        Some(Stall {
            some_pct,
            throttling_pct,
            queued_pct: (some_pct - throttling_pct).max(0.0),
        })
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NodeUsage {
    pub interval_us: u64,
    pub capacity_m: Millis,
    pub capacity_source: CapacitySource,
    pub usage_m: Millis,
    pub usage_basis: UsageBasis,
    /// `capacity − usage`, at least 0: idle CPU, not the policy's slack
    /// (`NodeDecision::slack_m`, after reserve, requests and what is owed)
    /// nor the booked slack (allocatable − requests).
    pub idle_m: Millis,
    pub pressure_some_avg10: Option<f64>,
    pub pressure_full_avg10: Option<f64>,
    /// Stall over the interval; `None` without PSI on kubepods in both
    /// snapshots, or when its counter went backwards.
    pub stall: Option<Stall>,
    /// CPU everything on the machine used over the interval (the root
    /// cgroup's `usage_usec`: pods and the node's own processes),
    /// millicores; `None` without a root `cpu.stat` in both snapshots or
    /// when its counter went back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_busy_m: Option<Millis>,
    /// CPUs of the machine (online CPUs) less `node_busy_m`: what it left
    /// idle, whoever could have used it; `None` when either is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_idle_m: Option<Millis>,
    pub kubepods_throttled_ratio: Option<f64>,
    /// One per pod of the current snapshot, in its order.
    pub pods: Vec<PodUsage>,
    /// Cgroup ids of pods in the previous snapshot that are gone now.
    pub vanished: Vec<CgroupPodId>,
}

/// Online CPUs of the host. Not `std::thread::available_parallelism`: that
/// reflects the agent's own cgroup quota and CPU affinity (a DaemonSet with a
/// 100m limit would see 1 CPU), while we want the node's.
pub fn online_cpus() -> u64 {
    sysconf_online_cpus()
}

/// Online CPUs of the host whose cgroup tree is at `root`: the root cgroup's
/// `cpuset.cpus.effective` (a CPU list such as `0-3,6`), else [`online_cpus`].
/// Reading it from the tree keeps every node-level input under the one root
/// (the agent's mount of the host's cgroupfs, a fixture, a simulated node).
pub fn online_cpus_at(root: &std::path::Path) -> u64 {
    crate::cgroup::cpuset::read_cpus(root, std::path::Path::new(""))
        .map_or_else(|_| online_cpus(), |cpus| cpus.len() as u64)
}

fn sysconf_online_cpus() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN) {
        Ok(Some(n)) if n > 0 => n as u64,
        _ => 0,
    }
}

/// Capacity = min of what is known: finite kubepods `cpu.max`, allocatable,
/// online CPUs, the shared pool (named only when strictly smallest).
pub fn capacity(kubepods: &CgroupSample, cap: CapacityInputs) -> (Millis, CapacitySource) {
    [
        (
            kubepods.cpu_max.millicores(),
            CapacitySource::KubepodsCpuMax,
        ),
        (cap.node_allocatable_m, CapacitySource::NodeAllocatable),
        (
            (cap.online_cpus > 0).then(|| cap.online_cpus.saturating_mul(1000)),
            CapacitySource::OnlineCpus,
        ),
        (
            cap.shared_pool_cpus
                .filter(|n| *n > 0)
                .map(|n| n.saturating_mul(1000)),
            CapacitySource::SharedPool,
        ),
    ]
    .into_iter()
    .filter_map(|(m, s)| m.map(|m| (m, s)))
    .min_by_key(|(m, _)| *m)
    .unwrap_or((0, CapacitySource::Unknown))
}

/// Δ`usage_usec` (µs of CPU) over `dt_us` in millicores (rounded to
/// nearest); `None` on a counter reset.
fn rate_m(prev_usec: u64, cur_usec: u64, dt_us: u64) -> Option<Millis> {
    let d = cur_usec.checked_sub(prev_usec)?;
    if dt_us == 0 {
        return None;
    }
    let m = (d as u128 * 1000 + dt_us as u128 / 2) / dt_us as u128;
    Some(m.min(u64::MAX as u128) as u64)
}

fn throttled_ratio(prev: &CpuStat, cur: &CpuStat) -> Option<f64> {
    let periods = cur.nr_periods?.checked_sub(prev.nr_periods?)?;
    let throttled = cur.nr_throttled?.checked_sub(prev.nr_throttled?)?;
    if periods == 0 {
        return None;
    }
    Some((throttled as f64 / periods as f64).min(1.0))
}

/// Δ of a counter that may be absent or reset (then `None`).
fn delta(prev: Option<u64>, cur: Option<u64>) -> Option<u64> {
    cur?.checked_sub(prev?)
}

/// See [`PodUsage::throttled_us`]. Containers are matched by id; one that
/// is new or whose counter reset adds nothing.
fn pod_throttled_us(prev: &PodCgroup, cur: &PodCgroup) -> Option<u64> {
    let pod = match (&prev.sample, &cur.sample) {
        (Ok(p), Ok(c)) => delta(p.cpu_stat.throttled_usec, c.cpu_stat.throttled_usec),
        _ => None,
    };
    let containers: u64 = cur
        .containers
        .iter()
        .filter_map(|c| {
            let p = prev.containers.iter().find(|p| p.id == c.id)?;
            delta(p.throttled_usec, c.throttled_usec)
        })
        .fold(0u64, u64::saturating_add);
    match pod {
        Some(p) => Some(p.max(containers)),
        None if containers > 0 => Some(containers),
        None => None,
    }
}

fn pod_usage(prev: Option<&PodCgroup>, cur: &PodCgroup, dt_us: u64) -> PodUsage {
    let pair = match (prev.map(|p| &p.sample), &cur.sample) {
        (Some(Ok(p)), Ok(c)) => Some((&p.cpu_stat, &c.cpu_stat)),
        _ => None,
    };
    PodUsage {
        id: cur.id.clone(),
        qos: cur.qos,
        usage_m: pair.and_then(|(p, c)| rate_m(p.usage_usec, c.usage_usec, dt_us)),
        throttled_ratio: pair.and_then(|(p, c)| throttled_ratio(p, c)),
        throttled_us: prev.and_then(|p| pod_throttled_us(p, cur)),
    }
}

/// Measures the node between two snapshots of the same node.
pub fn measure(prev: &NodeSnapshot, cur: &NodeSnapshot, cap: CapacityInputs) -> NodeUsage {
    measure_with(prev, cur, cap, None)
}

/// [`measure`], where a pod that `prev` did not read takes its usage since
/// `older` (an earlier snapshot that read it, e.g. the last full scan): a
/// pod read only while it is managed has a usage on its first managed tick,
/// averaged over a longer interval, instead of none (which would count its
/// burst as other pods' usage for that tick). Its throttled time stays
/// unknown (`None`): the stall is per interval.
pub fn measure_with(
    prev: &NodeSnapshot,
    cur: &NodeSnapshot,
    cap: CapacityInputs,
    older: Option<&NodeSnapshot>,
) -> NodeUsage {
    let dt_us = cur.at_us.saturating_sub(prev.at_us);
    let (capacity_m, capacity_source) = capacity(&cur.kubepods, cap);
    let by_id: HashMap<&CgroupPodId, &PodCgroup> = prev.pods.iter().map(|p| (&p.id, p)).collect();
    let older = older.filter(|o| o.at_us < prev.at_us);
    let pods: Vec<PodUsage> = cur
        .pods
        .iter()
        .map(|p| match by_id.get(&p.id) {
            Some(before) => pod_usage(Some(before), p, dt_us),
            None => {
                let then = older.and_then(|o| o.pods.iter().find(|q| q.id == p.id));
                match (older, then) {
                    (Some(o), Some(then)) => PodUsage {
                        throttled_us: None,
                        ..pod_usage(Some(then), p, cur.at_us.saturating_sub(o.at_us))
                    },
                    _ => pod_usage(None, p, dt_us),
                }
            }
        })
        .collect();
    let cur_ids: foldhash::HashSet<&CgroupPodId> = cur.pods.iter().map(|p| &p.id).collect();
    let vanished = prev
        .pods
        .iter()
        .filter(|p| !cur_ids.contains(&p.id))
        .map(|p| p.id.clone())
        .collect();

    let (usage_m, usage_basis) = if dt_us == 0 {
        (0, UsageBasis::None)
    } else if let Some(u) = rate_m(
        prev.kubepods.cpu_stat.usage_usec,
        cur.kubepods.cpu_stat.usage_usec,
        dt_us,
    ) {
        (u, UsageBasis::Kubepods)
    } else {
        let sum = pods.iter().filter_map(|p| p.usage_m).sum();
        (sum, UsageBasis::PodSum)
    };
    let idle_m = match usage_basis {
        UsageBasis::None => 0,
        _ => capacity_m.saturating_sub(usage_m),
    };
    let pressure = cur.kubepods.pressure.as_ref();
    let stall = match (&prev.kubepods.pressure, pressure) {
        (Some(p), Some(c)) => c
            .some
            .total_us
            .checked_sub(p.some.total_us)
            .and_then(|some| {
                let throttled = pods
                    .iter()
                    .filter_map(|p| p.throttled_us)
                    .fold(0u64, u64::saturating_add);
                Stall::from_deltas(some, throttled, dt_us)
            }),
        _ => None,
    };
    let mut usage = NodeUsage {
        interval_us: dt_us,
        capacity_m,
        capacity_source,
        usage_m,
        usage_basis,
        idle_m,
        pressure_some_avg10: pressure.map(|p| p.some.avg10),
        pressure_full_avg10: pressure.and_then(|p| p.full.map(|f| f.avg10)),
        stall,
        node_busy_m: match (prev.node_usage_us, cur.node_usage_us) {
            (Some(p), Some(c)) => rate_m(p, c, dt_us),
            _ => None,
        },
        kubepods_throttled_ratio: throttled_ratio(&prev.kubepods.cpu_stat, &cur.kubepods.cpu_stat),
        machine_idle_m: None,
        pods,
        vanished,
    };
    usage.machine_idle_m = usage
        .node_busy_m
        .filter(|_| cap.online_cpus > 0)
        .map(|busy| cap.online_cpus.saturating_mul(1000).saturating_sub(busy));
    usage
}

impl NodeUsage {
    /// Idle CPU pods could have had: `idle_m` (capacity − kubepods usage),
    /// and at most what the whole machine left idle where the root cgroup
    /// says (`machine_idle_m`): the node's own processes (kubelet,
    /// containerd; hundreds of millicores under emulation) use CPU kubepods
    /// does not hold, and capacity (allocatable) leaves them only what the
    /// node reserves.
    ///
    /// Only the contention signal reads it (is a waiting pod short of
    /// CPU?), never the slack: the node's own processes' usage grows with
    /// the pods' (on the emulated nodes a lone managed pod that kubepods
    /// showed using 1,300–1,900m left the machine 0–600m idle from one
    /// second to the next), and a slack that took it off lowered a pod
    /// alone on the node (2026-12-06).
    pub fn pods_idle_m(&self) -> Millis {
        self.machine_idle_m
            .map_or(self.idle_m, |m| m.min(self.idle_m))
    }
}

/// What the scheduler books for a pod (docs/kubelet-behaviour.md §5): max(spec, allocated)
/// requests plus overhead. Allocatable minus the sum is the slack the
/// scheduler sees, beside the real slack measured here.
pub fn booked_request(v: &PodView) -> Millis {
    let spec = v.cpu_request();
    let allocated: Millis = v
        .statuses
        .iter()
        .filter_map(|s| s.allocated.and_then(|a| a.cpu_request))
        .sum();
    spec.max(allocated) + v.overhead_cpu.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{CgroupError, CpuMax, Driver, Layout, Pressure, PsiLine};
    use std::path::PathBuf;

    fn sample(quota: Option<u64>, usage: u64, periods: u64, throttled: u64) -> CgroupSample {
        CgroupSample {
            cpu_max: CpuMax {
                quota_us: quota,
                period_us: 100_000,
            },
            cpu_stat: CpuStat {
                usage_usec: usage,
                nr_periods: Some(periods),
                nr_throttled: Some(throttled),
                ..Default::default()
            },
            pressure: None,
            weight: None,
        }
    }

    fn pod(uid: &str, s: Result<CgroupSample, CgroupError>) -> PodCgroup {
        PodCgroup {
            id: uid.into(),
            qos: Qos::Burstable,
            path: std::path::Path::new(uid).into(),
            sample: s,
            containers: vec![],
            containers_unlisted: None,
        }
    }

    fn snap(at_us: u64, kubepods: CgroupSample, pods: Vec<PodCgroup>) -> NodeSnapshot {
        NodeSnapshot {
            at_us,
            layout: Layout {
                driver: Driver::Systemd,
                kubepods: "kubepods.slice".into(),
            },
            kubepods,
            pods,
            unlisted_qos: vec![],
            node_usage_us: None,
            issues: vec![],
        }
    }

    const CAP: CapacityInputs = CapacityInputs {
        node_allocatable_m: Some(3800),
        online_cpus: 4,
        shared_pool_cpus: None,
    };

    #[test]
    fn usage_and_slack_from_kubepods_rate() {
        // 1.5 s of CPU over 1 s = 1500m on a 3800m node.
        let a = snap(1_000_000, sample(None, 10_000_000, 0, 0), vec![]);
        let b = snap(2_000_000, sample(None, 11_500_000, 0, 0), vec![]);
        let s = measure(&a, &b, CAP);
        assert_eq!(s.interval_us, 1_000_000);
        assert_eq!(s.capacity_m, 3800);
        assert_eq!(s.capacity_source, CapacitySource::NodeAllocatable);
        assert_eq!(s.usage_m, 1500);
        assert_eq!(s.usage_basis, UsageBasis::Kubepods);
        assert_eq!(s.idle_m, 2300);
    }

    #[test]
    fn capacity_is_min_of_known_inputs() {
        let k = sample(Some(250_000), 0, 0, 0);
        assert_eq!(capacity(&k, CAP), (2500, CapacitySource::KubepodsCpuMax));
        let k = sample(None, 0, 0, 0);
        let c = CapacityInputs {
            node_allocatable_m: None,
            online_cpus: 2,
            shared_pool_cpus: None,
        };
        assert_eq!(capacity(&k, c), (2000, CapacitySource::OnlineCpus));
        let c = CapacityInputs {
            node_allocatable_m: Some(8000),
            online_cpus: 2,
            shared_pool_cpus: None,
        };
        assert_eq!(capacity(&k, c), (2000, CapacitySource::OnlineCpus));
        let none = CapacityInputs {
            node_allocatable_m: None,
            online_cpus: 0,
            shared_pool_cpus: None,
        };
        assert_eq!(capacity(&k, none), (0, CapacitySource::Unknown));
        // The static CPU manager's shared pool bounds what Burstable pods can use.
        let pool = CapacityInputs {
            node_allocatable_m: Some(3000),
            online_cpus: 4,
            shared_pool_cpus: Some(2),
        };
        assert_eq!(capacity(&k, pool), (2000, CapacitySource::SharedPool));
        // The pool of the whole node (policy `none`) is not named.
        let whole = CapacityInputs {
            shared_pool_cpus: Some(4),
            node_allocatable_m: None,
            ..pool
        };
        assert_eq!(capacity(&k, whole), (4000, CapacitySource::OnlineCpus));
        // A pool read as 0 CPUs is no input.
        let zero = CapacityInputs {
            shared_pool_cpus: Some(0),
            ..pool
        };
        assert_eq!(capacity(&k, zero), (3000, CapacitySource::NodeAllocatable));
    }

    #[test]
    fn capacity_honours_non_default_period() {
        let mut k = sample(Some(100_000), 0, 0, 0);
        k.cpu_max.period_us = 50_000;
        assert_eq!(capacity(&k, CAP), (2000, CapacitySource::KubepodsCpuMax));
    }

    #[test]
    fn slack_clamps_at_zero_when_usage_exceeds_capacity() {
        let a = snap(0, sample(None, 0, 0, 0), vec![]);
        let b = snap(1_000_000, sample(None, 5_000_000, 0, 0), vec![]);
        let s = measure(&a, &b, CAP);
        assert_eq!(s.usage_m, 5000);
        assert_eq!(s.idle_m, 0);
    }

    #[test]
    fn per_pod_usage_and_throttling_ratio() {
        let a = snap(
            0,
            sample(None, 0, 0, 0),
            vec![pod("p1", Ok(sample(Some(50_000), 1_000_000, 100, 10)))],
        );
        let b = snap(
            2_000_000,
            sample(None, 2_000_000, 0, 0),
            vec![pod("p1", Ok(sample(Some(50_000), 1_800_000, 120, 15)))],
        );
        let s = measure(&a, &b, CAP);
        assert_eq!(s.pods[0].usage_m, Some(400));
        assert_eq!(s.pods[0].throttled_ratio, Some(0.25));
    }

    #[test]
    fn pod_counter_reset_gives_no_usage() {
        let a = snap(
            0,
            sample(None, 0, 0, 0),
            vec![pod("p", Ok(sample(None, 9_000, 50, 5)))],
        );
        let b = snap(
            1_000_000,
            sample(None, 100_000, 0, 0),
            vec![pod("p", Ok(sample(None, 10, 1, 0)))],
        );
        let s = measure(&a, &b, CAP);
        assert_eq!(s.pods[0].usage_m, None);
        assert_eq!(s.pods[0].throttled_ratio, None);
        assert_eq!(s.usage_m, 100);
    }

    #[test]
    fn kubepods_counter_reset_falls_back_to_pod_sum() {
        let a = snap(
            0,
            sample(None, 50_000_000, 0, 0),
            vec![
                pod("a", Ok(sample(None, 0, 0, 0))),
                pod("b", Ok(sample(None, 0, 0, 0))),
            ],
        );
        let b = snap(
            1_000_000,
            sample(None, 1_000, 0, 0),
            vec![
                pod("a", Ok(sample(None, 300_000, 0, 0))),
                pod("b", Ok(sample(None, 200_000, 0, 0))),
            ],
        );
        let s = measure(&a, &b, CAP);
        assert_eq!(s.usage_basis, UsageBasis::PodSum);
        assert_eq!(s.usage_m, 500);
        assert_eq!(s.idle_m, 3300);
    }

    #[test]
    fn appearing_and_vanishing_pods_give_no_garbage() {
        let a = snap(
            0,
            sample(None, 0, 0, 0),
            vec![pod("old", Ok(sample(None, 1_000_000, 0, 0)))],
        );
        let b = snap(
            1_000_000,
            sample(None, 200_000, 0, 0),
            vec![pod("new", Ok(sample(None, 99_000_000, 10, 10)))],
        );
        let s = measure(&a, &b, CAP);
        assert_eq!(s.pods.len(), 1);
        assert_eq!(s.pods[0].id.as_str(), "new");
        assert_eq!(s.pods[0].usage_m, None);
        assert_eq!(s.pods[0].throttled_ratio, None);
        assert_eq!(s.vanished, vec![CgroupPodId::from("old")]);
        assert_eq!(s.usage_m, 200);
    }

    #[test]
    fn unreadable_pod_sample_gives_no_usage() {
        let err = Err(CgroupError::Vanished(PathBuf::from("x")));
        let a = snap(0, sample(None, 0, 0, 0), vec![pod("p", err.clone())]);
        let b = snap(
            1_000_000,
            sample(None, 0, 0, 0),
            vec![pod("p", Ok(sample(None, 5, 0, 0)))],
        );
        assert_eq!(measure(&a, &b, CAP).pods[0].usage_m, None);
        assert_eq!(measure(&b, &a, CAP).pods[0].usage_m, None);
    }

    #[test]
    fn unordered_snapshots_claim_no_slack() {
        let a = snap(5, sample(None, 0, 0, 0), vec![]);
        let b = snap(5, sample(None, 1_000, 0, 0), vec![]);
        let s = measure(&a, &b, CAP);
        assert_eq!(s.usage_basis, UsageBasis::None);
        assert_eq!(s.idle_m, 0);
        let s = measure(&b, &a, CAP);
        assert_eq!(s.idle_m, 0);
    }

    #[test]
    fn pressure_comes_from_current_kubepods() {
        let line = |v| PsiLine {
            avg10: v,
            ..Default::default()
        };
        let mut k = sample(None, 0, 0, 0);
        k.pressure = Some(Pressure {
            some: line(12.5),
            full: Some(line(3.0)),
        });
        let a = snap(0, sample(None, 0, 0, 0), vec![]);
        let b = snap(1, k, vec![]);
        let s = measure(&a, &b, CAP);
        assert_eq!(s.pressure_some_avg10, Some(12.5));
        assert_eq!(s.pressure_full_avg10, Some(3.0));
    }

    #[test]
    fn throttled_ratio_needs_periods() {
        let a = sample(None, 0, 10, 1).cpu_stat;
        let b = sample(None, 0, 10, 1).cpu_stat;
        assert_eq!(throttled_ratio(&a, &b), None);
        let no_ctl = CpuStat::default();
        assert_eq!(throttled_ratio(&no_ctl, &no_ctl), None);
    }

    #[test]
    fn online_cpus_is_positive_here() {
        assert!(online_cpus() >= 1);
    }

    #[test]
    fn the_root_cgroup_tells_what_the_machine_left_idle() {
        // kubepods used 1000m of 3800m allocatable on 4 CPUs; the whole
        // machine 3500m (the node's own processes 2500m).
        let mut a = snap(0, sample(None, 0, 0, 0), vec![]);
        let mut b = snap(1_000_000, sample(None, 1_000_000, 0, 0), vec![]);
        a.node_usage_us = Some(10_000_000);
        b.node_usage_us = Some(13_500_000);
        let s = measure(&a, &b, CAP);
        assert_eq!((s.node_busy_m, s.machine_idle_m), (Some(3500), Some(500)));
        assert_eq!(s.idle_m, 2800);
        assert_eq!(s.pods_idle_m(), 500);
        // Without a root cpu.stat (or a counter that went back): kubepods alone.
        b.node_usage_us = Some(9_000_000);
        let s = measure(&a, &b, CAP);
        assert_eq!((s.machine_idle_m, s.pods_idle_m()), (None, 2800));
    }

    #[test]
    fn online_cpus_come_from_the_root_cgroup_when_it_says() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join(crate::cgroup::file::CPUSET_CPUS_EFFECTIVE),
            "0-7\n",
        )
        .unwrap();
        assert_eq!(online_cpus_at(t.path()), 8);
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            online_cpus_at(empty.path()),
            online_cpus(),
            "falls back to sysconf"
        );
    }

    fn with_psi(mut s: CgroupSample, some_total_us: u64) -> CgroupSample {
        s.pressure = Some(Pressure {
            some: PsiLine {
                total_us: some_total_us,
                ..Default::default()
            },
            full: None,
        });
        s
    }

    fn limited_container(id: &str, throttled_usec: Option<u64>) -> crate::cgroup::ContainerCgroup {
        crate::cgroup::ContainerCgroup {
            id: id.into(),
            runtime: crate::cgroup::Runtime::Containerd,
            role: crate::cgroup::ContainerRole::App,
            path: PathBuf::from(id),
            cpu_max: Ok(CpuMax {
                quota_us: Some(30_000),
                period_us: 100_000,
            }),
            throttled_usec,
        }
    }

    #[test]
    fn stall_splits_into_own_throttling_and_contention() {
        // 1 s interval: 700 ms of `some`, of which 600 ms the pod's own
        // container quota explains.
        let mut k0 = with_psi(sample(None, 0, 0, 0), 1_000);
        let mut k1 = with_psi(sample(None, 500_000, 0, 0), 701_000);
        k0.cpu_stat.throttled_usec = None;
        k1.cpu_stat.throttled_usec = None;
        let mut p0 = pod("a", Ok(sample(Some(30_000), 0, 0, 0)));
        let mut p1 = pod("a", Ok(sample(Some(30_000), 300_000, 10, 0)));
        p0.containers = vec![limited_container("c", Some(50))];
        p1.containers = vec![limited_container("c", Some(600_050))];
        let s = measure(&snap(0, k0, vec![p0]), &snap(1_000_000, k1, vec![p1]), CAP);
        assert_eq!(s.pods[0].throttled_us, Some(600_000));
        let st = s.stall.unwrap();
        assert!((st.some_pct - 70.0).abs() < 1e-9);
        assert!((st.throttling_pct - 60.0).abs() < 1e-9);
        assert!((st.queued_pct - 10.0).abs() < 1e-9);
    }

    #[test]
    fn throttling_counts_at_whichever_level_ran_out() {
        // The same task throttled at the pod quota this time: the pod
        // cgroup's throttled_usec moves, the container's does not.
        let mut a = sample(Some(30_000), 0, 0, 0);
        a.cpu_stat.throttled_usec = Some(1_000);
        let mut b = sample(Some(30_000), 300_000, 10, 10);
        b.cpu_stat.throttled_usec = Some(701_000);
        let mut p0 = pod("a", Ok(a));
        let mut p1 = pod("a", Ok(b));
        p0.containers = vec![limited_container("c", Some(7))];
        p1.containers = vec![limited_container("c", Some(7))];
        assert_eq!(pod_throttled_us(&p0, &p1), Some(700_000));
        // A container that is new this interval adds nothing.
        p1.containers = vec![limited_container("d", Some(900_000))];
        assert_eq!(pod_throttled_us(&p0, &p1), Some(700_000));
    }

    #[test]
    fn stall_is_capped_and_absent_without_both_psi_readings() {
        let st = Stall::from_deltas(500_000, 2_000_000, 1_000_000).unwrap();
        assert_eq!((st.throttling_pct, st.queued_pct), (50.0, 0.0));
        assert_eq!(Stall::from_deltas(1, 1, 0), None);
        // PSI counter went backwards (cgroup recreated): unknown, not huge.
        let k0 = with_psi(sample(None, 0, 0, 0), 900_000);
        let k1 = with_psi(sample(None, 10, 0, 0), 5);
        let s = measure(&snap(0, k0, vec![]), &snap(1_000_000, k1, vec![]), CAP);
        assert_eq!(s.stall, None);
        let s = measure(
            &snap(0, sample(None, 0, 0, 0), vec![]),
            &snap(1_000_000, with_psi(sample(None, 0, 0, 0), 5), vec![]),
            CAP,
        );
        assert_eq!(s.stall, None);
    }

    /// A pod the previous tick did not read (it was not managed then) takes
    /// its usage since the older snapshot that read it; without one, none.
    #[test]
    fn a_pod_unread_last_tick_is_measured_since_the_older_snapshot() {
        let u = |us| Ok(sample(None, us, 0, 0));
        let older = snap(
            0,
            sample(None, 0, 0, 0),
            vec![pod("a", u(0)), pod("b", u(0))],
        );
        let prev = snap(
            10_000_000,
            sample(None, 5_000_000, 0, 0),
            vec![pod("a", u(5_000_000))],
        );
        let cur = snap(
            11_000_000,
            sample(None, 6_000_000, 0, 0),
            vec![pod("a", u(5_500_000)), pod("b", u(2_200_000))],
        );
        let s = measure_with(&prev, &cur, CAP, Some(&older));
        assert_eq!(s.pods[0].usage_m, Some(500), "over the last interval");
        assert_eq!(s.pods[1].usage_m, Some(200), "2.2 s of CPU over 11 s");
        assert_eq!(s.pods[1].throttled_us, None, "the stall is per interval");
        assert_eq!(measure(&prev, &cur, CAP).pods[1].usage_m, None);
        let newer = snap(10_500_000, sample(None, 0, 0, 0), vec![pod("b", u(0))]);
        assert_eq!(
            measure_with(&prev, &cur, CAP, Some(&newer)).pods[1].usage_m,
            None,
            "only a snapshot older than the previous one"
        );
    }
}
