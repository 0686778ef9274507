//! Expected vs observed `cpu.max`. Pure: works on the scanner's
//! [`PodCgroup`]s, so a test or benchmark can feed it any tree.

use foldhash::HashMap;
use std::fmt;

use crate::cgroup::{CgroupError, ContainerRole, CpuMax, Driver, NodeSnapshot, PodCgroup};
pub use crate::model::Target;
use crate::model::{CgroupPodId, PodView, Uid};
use crate::quantity::format_cpu_millis;
use crate::verify::expected::{DEFAULT_PERIOD_US, Expected, ExpectedMax, expected_cpu_max};

/// What was found where a value was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// `cpu.max` was read and holds another value.
    Value(CpuMax),
    /// The cgroup exists but `cpu.max` could not be read or parsed.
    Unreadable(String),
    /// No cgroup for the pod, or for the running container's id.
    NoCgroup,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub target: Target,
    /// At the observed file's period when one was read.
    pub expected: ExpectedMax,
    pub actual: Observed,
    /// Sets the accepted tolerance (systemd rounding).
    pub driver: Driver,
}

fn describe_cpu_max(m: &CpuMax) -> String {
    match (m.quota_us, m.millicores()) {
        (Some(q), Some(milli)) => format!("{q} {} ({})", m.period_us, format_cpu_millis(milli)),
        _ => format!("max {} (no limit)", m.period_us),
    }
}

impl fmt::Display for Mismatch {
    /// `expected 80000 100000 (800m), found 11000 100000 (110m)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected {}, ", self.expected.describe(self.driver))?;
        match &self.actual {
            Observed::Value(m) => write!(f, "found {}", describe_cpu_max(m)),
            Observed::Unreadable(e) => write!(f, "cpu.max unreadable: {e}"),
            Observed::NoCgroup => f.write_str("found no cgroup"),
        }
    }
}

fn check(
    target: Target,
    expected: ExpectedMax,
    observed: Result<&CpuMax, String>,
    driver: Driver,
) -> Option<Mismatch> {
    let (expected, actual) = match observed {
        Ok(m) if expected.accepts(m, driver) => return None,
        Ok(m) => (expected.at_period(m.period_us), Observed::Value(*m)),
        Err(e) => (expected, Observed::Unreadable(e)),
    };
    Some(Mismatch {
        target,
        expected,
        actual,
        driver,
    })
}

/// Every cgroup of the pod whose `cpu.max` is not what `expected` says.
/// Container cgroups are found by the running container's id; containers
/// that are not running are skipped, and cgroups of containers the spec does
/// not name (sandbox) or that only share the id (CRI-O conmon) are ignored.
///
/// A `cpu.max` the agent may not read (EACCES), and containers of a pod
/// cgroup it may not list, are unknown, never drift.
pub fn compare(expected: &Expected, observed: &PodCgroup, driver: Driver) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let pod_denied = observed
        .sample
        .as_ref()
        .is_err_and(CgroupError::is_permission_denied);
    if !pod_denied {
        out.extend(check(
            Target::Pod,
            expected.pod,
            observed
                .sample
                .as_ref()
                .map(|s| &s.cpu_max)
                .map_err(|e| e.to_string()),
            driver,
        ));
    }
    for c in &expected.containers {
        let Some(id) = c.container_id.as_deref() else {
            continue;
        };
        let target = Target::Container(c.name.clone());
        // CRI-O's conmon cgroup carries the same id: never the container's.
        match observed
            .containers
            .iter()
            .find(|cg| cg.id == id && cg.role != ContainerRole::Conmon)
        {
            Some(cg)
                if cg
                    .cpu_max
                    .as_ref()
                    .is_err_and(CgroupError::is_permission_denied) => {}
            None if observed.containers_unlisted.is_some() => {}
            Some(cg) => out.extend(check(
                target,
                c.max,
                cg.cpu_max.as_ref().map_err(|e| e.to_string()),
                driver,
            )),
            None => out.push(Mismatch {
                target,
                expected: c.max,
                actual: Observed::NoCgroup,
                driver,
            }),
        }
    }
    out
}

/// The result of auditing one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAudit {
    pub uid: Uid,
    pub mismatches: Vec<Mismatch>,
}

/// The period to derive expectations with: the pod cgroup's own, else a
/// container's, else the kubelet default (then nothing was readable and the
/// period only shows in messages).
fn period_of(cg: &PodCgroup) -> u64 {
    cg.sample
        .as_ref()
        .ok()
        .map(|s| s.cpu_max.period_us)
        .or_else(|| {
            cg.containers
                .iter()
                .find_map(|c| c.cpu_max.as_ref().ok().map(|m| m.period_us))
        })
        .unwrap_or(DEFAULT_PERIOD_US)
}

/// One full audit: every running, non-terminating pod against the scanned
/// cgroups. A running pod without a pod cgroup is a [`Observed::NoCgroup`]
/// mismatch. A pod is matched to its cgroup by [`PodView::cgroup_id`]; the
/// result is keyed by its `metadata.uid`. Pods with no mismatch are listed too
/// (empty `mismatches`), so a drift tracker can clear them.
pub fn audit<'a>(
    pods: impl IntoIterator<Item = &'a PodView>,
    cgroups: &[PodCgroup],
    driver: Driver,
) -> Vec<PodAudit> {
    let by_id: HashMap<&CgroupPodId, &PodCgroup> = cgroups.iter().map(|c| (&c.id, c)).collect();
    pods.into_iter()
        .filter(|p| p.is_running() && !p.terminating)
        .map(|p| {
            let mismatches = match by_id.get(&p.cgroup_id) {
                Some(cg) => compare(&expected_cpu_max(p, period_of(cg)), cg, driver),
                None => vec![Mismatch {
                    target: Target::Pod,
                    expected: expected_cpu_max(p, DEFAULT_PERIOD_US).pod,
                    actual: Observed::NoCgroup,
                    driver,
                }],
            };
            PodAudit {
                uid: p.uid.clone(),
                mismatches,
            }
        })
        .collect()
}

/// [`audit`] over a snapshot, leaving out pods it cannot judge: those in a
/// QoS directory it could not list (their cgroups are unknown, not absent)
/// and those whose pod cgroup it may not read. Their drift state stands.
pub fn audit_snapshot<'a>(
    pods: impl IntoIterator<Item = &'a PodView>,
    snap: &NodeSnapshot,
) -> Vec<PodAudit> {
    let by_id: HashMap<&CgroupPodId, &PodCgroup> = snap.pods.iter().map(|c| (&c.id, c)).collect();
    let judged = pods.into_iter().filter(|p| match by_id.get(&p.cgroup_id) {
        None => !snap.unlisted_qos.contains(&p.qos),
        Some(cg) => !cg
            .sample
            .as_ref()
            .is_err_and(CgroupError::is_permission_denied),
    });
    audit(judged, &snap.pods, snap.layout.driver)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::cgroup::{
        CgroupError, CgroupSample, ContainerCgroup, ContainerRole, CpuStat, Runtime,
    };
    use crate::model::{Millis, Qos};
    use crate::verify::expected::tests::{container, pod};

    pub(crate) fn max(quota: Option<u64>) -> CpuMax {
        CpuMax {
            quota_us: quota,
            period_us: DEFAULT_PERIOD_US,
        }
    }

    fn sample(m: CpuMax) -> CgroupSample {
        CgroupSample {
            cpu_max: m,
            cpu_stat: CpuStat::default(),
            pressure: None,
            weight: None,
        }
    }

    /// A pod cgroup holding exactly what the kubelet would write for `p`
    /// (cgroupfs layout), plus a sandbox container.
    pub(crate) fn cgroup_for(p: &PodView) -> PodCgroup {
        let e = expected_cpu_max(p, DEFAULT_PERIOD_US);
        let path = PathBuf::from(format!("kubepods/burstable/pod{}", p.uid));
        let mut containers: Vec<ContainerCgroup> = e
            .containers
            .iter()
            .filter_map(|c| {
                Some(ContainerCgroup {
                    id: c.container_id.clone()?,
                    runtime: Runtime::Unknown,
                    role: ContainerRole::App,
                    path: path.join(c.container_id.as_deref()?),
                    cpu_max: Ok(max(c.max.quota_us())),
                    throttled_usec: None,
                })
            })
            .collect();
        containers.push(ContainerCgroup {
            id: "pause".into(),
            runtime: Runtime::Unknown,
            role: ContainerRole::Sandbox,
            path: path.join("pause"),
            cpu_max: Ok(max(None)),
            throttled_usec: None,
        });
        PodCgroup {
            id: p.cgroup_id.clone(),
            qos: p.qos,
            path: path.into(),
            sample: Ok(sample(max(e.pod.quota_us()))),
            containers,
            containers_unlisted: None,
        }
    }

    fn two_containers() -> PodView {
        pod(
            "u1",
            vec![
                container("a", Some(100), Some(500)),
                container("b", Some(100), Some(300)),
            ],
        )
    }

    fn cmp(p: &PodView, cg: &PodCgroup) -> Vec<Mismatch> {
        compare(
            &expected_cpu_max(p, DEFAULT_PERIOD_US),
            cg,
            Driver::Cgroupfs,
        )
    }

    #[test]
    fn kubelet_output_matches() {
        let p = two_containers();
        assert_eq!(cmp(&p, &cgroup_for(&p)), vec![]);
    }

    #[test]
    fn wrong_pod_quota_is_reported_with_display() {
        let p = two_containers();
        let mut cg = cgroup_for(&p);
        cg.sample.as_mut().unwrap().cpu_max = max(Some(11_000));
        let m = cmp(&p, &cg);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].target, Target::Pod);
        assert_eq!(m[0].actual, Observed::Value(max(Some(11_000))));
        assert_eq!(
            m[0].to_string(),
            "expected 80000 100000 (800m), found 11000 100000 (110m)"
        );
    }

    #[test]
    fn container_not_updated_is_reported_on_the_container() {
        let p = two_containers();
        let mut cg = cgroup_for(&p);
        let i = cg.containers.iter().position(|c| c.id == "id-b").unwrap();
        cg.containers[i].cpu_max = Ok(max(Some(20_000)));
        let m = cmp(&p, &cg);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].target, Target::Container("b".into()));
    }

    #[test]
    fn crio_conmon_cgroup_with_the_same_id_is_not_the_container() {
        let p = two_containers();
        let mut cg = cgroup_for(&p);
        let mut conmon = cg.containers[0].clone();
        conmon.role = ContainerRole::Conmon;
        conmon.cpu_max = Ok(max(None));
        cg.containers.insert(0, conmon);
        assert_eq!(cmp(&p, &cg), vec![]);
    }

    #[test]
    fn unlimited_where_limited_is_a_mismatch() {
        let p = two_containers();
        let mut cg = cgroup_for(&p);
        cg.sample.as_mut().unwrap().cpu_max = max(None);
        let m = cmp(&p, &cg);
        assert_eq!(
            m[0].to_string(),
            "expected 80000 100000 (800m), found max 100000 (no limit)"
        );
    }

    #[test]
    fn unreadable_pod_cpu_max_is_a_distinct_mismatch() {
        let p = two_containers();
        let mut cg = cgroup_for(&p);
        cg.sample = Err(CgroupError::Malformed {
            path: "x/cpu.max".into(),
            source: crate::cgroup::parse::ParseError::Invalid("bad".into()),
        });
        let m = cmp(&p, &cg);
        assert_eq!(m.len(), 1);
        assert!(matches!(m[0].actual, Observed::Unreadable(_)));
        assert!(m[0].to_string().contains("unreadable"));
    }

    #[test]
    fn missing_container_cgroup_is_no_cgroup() {
        let p = two_containers();
        let mut cg = cgroup_for(&p);
        cg.containers.retain(|c| c.id != "id-a");
        let m = cmp(&p, &cg);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].target, Target::Container("a".into()));
        assert_eq!(m[0].actual, Observed::NoCgroup);
    }

    #[test]
    fn not_running_container_is_skipped() {
        let mut p = two_containers();
        let mut cg = cgroup_for(&p);
        p.statuses[0].running = false;
        cg.containers.retain(|c| c.id != "id-a");
        assert_eq!(cmp(&p, &cg), vec![]);
    }

    #[test]
    fn systemd_rounding_is_tolerated_only_with_systemd() {
        let p = pod("u", vec![container("a", Some(100), Some(101))]);
        let mut cg = cgroup_for(&p);
        cg.sample.as_mut().unwrap().cpu_max = max(Some(11_000));
        let e = expected_cpu_max(&p, DEFAULT_PERIOD_US);
        assert_eq!(compare(&e, &cg, Driver::Systemd), vec![]);
        assert_eq!(compare(&e, &cg, Driver::Cgroupfs).len(), 1);
    }

    #[test]
    fn other_period_is_judged_at_that_period() {
        let p = two_containers();
        let mut cg = cgroup_for(&p);
        cg.sample.as_mut().unwrap().cpu_max = CpuMax {
            quota_us: Some(40_000),
            period_us: 50_000,
        };
        assert_eq!(cmp(&p, &cg), vec![]);
        cg.sample.as_mut().unwrap().cpu_max = CpuMax {
            quota_us: Some(80_000),
            period_us: 50_000,
        };
        let m = cmp(&p, &cg);
        assert_eq!(
            m[0].to_string(),
            "expected 40000 50000 (800m), found 80000 50000 (1600m)"
        );
    }

    fn many(n: usize, lim: Millis) -> Vec<PodView> {
        (0..n)
            .map(|i| pod(&format!("u{i}"), vec![container("c", Some(100), Some(lim))]))
            .collect()
    }

    #[test]
    fn audit_lists_every_running_pod_and_flags_missing_cgroup() {
        let mut pods = many(3, 200);
        pods[2].phase = Some("Pending".into());
        let cgroups = vec![cgroup_for(&pods[0])];
        let a = audit(&pods, &cgroups, Driver::Cgroupfs);
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].mismatches, vec![]);
        assert_eq!(a[1].uid.as_str(), "u1");
        assert_eq!(a[1].mismatches[0].actual, Observed::NoCgroup);
    }

    /// EACCES on a QoS directory or a pod cgroup turned its pods into
    /// "found no cgroup" drift.
    #[test]
    fn unreadable_cgroups_are_not_judged() {
        let denied = || CgroupError::PermissionDenied {
            path: PathBuf::from("x"),
            source: std::io::Error::from_raw_os_error(13).into(),
        };
        let mut pods = many(3, 200);
        for p in &mut pods {
            p.qos = Qos::Burstable;
        }
        let mut readable = cgroup_for(&pods[0]);
        readable.containers[0].cpu_max = Err(denied());
        let mut locked = cgroup_for(&pods[1]);
        locked.sample = Err(denied());
        locked.containers.clear();
        locked.containers_unlisted = Some(denied());
        let mut snap = NodeSnapshot {
            at_us: 0,
            layout: crate::cgroup::Layout {
                driver: Driver::Cgroupfs,
                kubepods: "kubepods".into(),
            },
            kubepods: sample(max(None)),
            pods: vec![readable.clone(), locked],
            unlisted_qos: vec![Qos::Burstable],
            node_usage_us: None,
            issues: vec![],
        };
        let a = audit_snapshot(&pods, &snap);
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(a[0].uid.as_str(), "u0");
        assert_eq!(a[0].mismatches, vec![], "a denied container is not drift");
        // Once the QoS directory lists again, a pod without a cgroup is drift.
        snap.unlisted_qos.clear();
        let a = audit_snapshot(&pods, &snap);
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].mismatches[0].actual, Observed::NoCgroup);
        // Without the denial, the unreadable container is a mismatch as before.
        readable.containers[0].cpu_max = Err(CgroupError::Missing(PathBuf::from("y")));
        assert_eq!(cmp(&pods[0], &readable).len(), 1);
    }

    #[test]
    fn static_pod_is_found_by_its_config_hash() {
        let mut pods = many(1, 200);
        let mut cg = cgroup_for(&pods[0]);
        cg.id = "confighash".into();
        pods[0].annotations.insert(
            crate::kube::view::MIRROR_ANNOTATION.into(),
            "confighash".into(),
        );
        pods[0].cgroup_id = crate::kube::view::cgroup_pod_id(&pods[0].uid, &pods[0].annotations);
        let a = audit(&pods, &[cg], Driver::Cgroupfs);
        assert_eq!(a[0].uid.as_str(), "u0");
        assert_eq!(a[0].mismatches, vec![]);
    }

    #[test]
    fn audit_skips_terminating_pods() {
        let mut pods = many(1, 200);
        pods[0].terminating = true;
        assert_eq!(audit(&pods, &[], Driver::Cgroupfs), vec![]);
    }

    #[test]
    fn guaranteed_pod_is_audited() {
        let mut p = pod("g", vec![container("c", Some(500), Some(500))]);
        p.qos = Qos::Guaranteed;
        let mut cg = cgroup_for(&p);
        assert_eq!(cmp(&p, &cg), vec![]);
        cg.sample.as_mut().unwrap().cpu_max = max(None);
        assert_eq!(cmp(&p, &cg).len(), 1);
    }
}
