//! Reads every tree under `cgroup-fixtures/` and checks what the cgroup
//! reader finds against the Pod objects the tree belongs to (`pods.json`):
//! layout, every pod uid and QoS, every container id, runtime and role, and
//! the cpu.max values docs/kubelet-behaviour.md §2 implies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use headroom::cgroup::{self, ContainerRole, CpuMax, Driver, PodCgroup, Runtime};
use headroom::model::{Millis, PodView};
use headroom::signal::usage::{self, CapacityInputs, CapacitySource};
use k8s_openapi::api::core::v1::{Node, Pod};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cgroup-fixtures")
}

struct Fixture {
    name: String,
    root: PathBuf,
    pods: Vec<Pod>,
    node: Node,
}

fn fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(fixtures_dir()).unwrap() {
        let dir = e.unwrap().path();
        if !dir.join("pods.json").is_file() {
            continue;
        }
        let list: k8s_openapi::List<Pod> =
            serde_json::from_slice(&std::fs::read(dir.join("pods.json")).unwrap()).unwrap();
        let node: Node =
            serde_json::from_slice(&std::fs::read(dir.join("node.json")).unwrap()).unwrap();
        out.push(Fixture {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            root: dir.join("root"),
            pods: list.items,
            node,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The uid the kubelet names the pod cgroup after: a static pod's config
/// hash (its mirror Pod has another `metadata.uid`), else `metadata.uid`.
fn cgroup_uid(p: &Pod) -> String {
    let m = &p.metadata;
    m.annotations
        .as_ref()
        .and_then(|a| a.get("kubernetes.io/config.mirror"))
        .cloned()
        .unwrap_or_else(|| m.uid.clone().unwrap())
}

fn quota(milli: Millis, period: u64) -> u64 {
    (milli * period / 1000).max(1000)
}

/// Expected container limit in millicores: own limit, else the pod-level
/// limit, else unlimited.
fn expected_container_limit(v: &PodView, name: &str) -> Option<Millis> {
    let c = v.containers.iter().find(|c| &*c.name == name).unwrap();
    c.resources
        .cpu_limit
        .or(v.pod_resources.and_then(|r| r.cpu_limit))
}

/// Expected pod limit: pod-level limit, or the sum when every container has
/// one, plus overhead; else unlimited.
fn expected_pod_limit(v: &PodView) -> Option<Millis> {
    let base = match v.pod_resources.and_then(|r| r.cpu_limit) {
        Some(l) => Some(l),
        None => v
            .containers
            .iter()
            .map(|c| c.resources.cpu_limit)
            .sum::<Option<Millis>>(),
    };
    base.map(|b| b + v.overhead_cpu.unwrap_or(0))
}

fn check_cpu_max(what: &str, got: &CpuMax, want: Option<Millis>, systemd_pod: bool) {
    match want {
        None => assert_eq!(got.quota_us, None, "{what}: want unlimited, got {got:?}"),
        Some(m) => {
            let q = quota(m, got.period_us);
            let got_q = got
                .quota_us
                .unwrap_or_else(|| panic!("{what}: unlimited, want {m}m"));
            if systemd_pod {
                // systemd keeps slice quotas in 10 ms/s steps (docs/kubelet-behaviour.md §2).
                let step = got.period_us / 100;
                assert!(
                    got_q >= q && got_q < q + step && got_q.is_multiple_of(step),
                    "{what}: {got_q} vs {q} (step {step})"
                );
            } else {
                assert_eq!(got_q, q, "{what}: period {}", got.period_us);
            }
        }
    }
}

fn expected_layout(name: &str) -> (Driver, &'static str) {
    match name {
        "kind" | "pod-level" | "lone-threads" | "displaced" => {
            (Driver::Systemd, "kubelet.slice/kubelet-kubepods.slice")
        }
        "systemd-containerd" | "crio" => (Driver::Systemd, "kubepods.slice"),
        "cgroupfs-containerd" => (Driver::Cgroupfs, "kubepods"),
        other => panic!("unknown fixture {other}: add its expected layout here"),
    }
}

#[test]
fn at_least_the_five_required_fixtures_exist() {
    let names: BTreeSet<String> = fixtures().into_iter().map(|f| f.name).collect();
    for n in [
        "kind",
        "systemd-containerd",
        "cgroupfs-containerd",
        "crio",
        "pod-level",
    ] {
        assert!(names.contains(n), "missing fixture {n}");
    }
}

#[test]
fn layout_is_discovered_in_every_fixture() {
    for f in fixtures() {
        let l = cgroup::discover(&f.root).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let (driver, kp) = expected_layout(&f.name);
        assert_eq!(l.driver, driver, "{}", f.name);
        assert_eq!(l.kubepods, PathBuf::from(kp), "{}", f.name);
    }
}

fn scan_fixture(f: &Fixture) -> BTreeMap<String, PodCgroup> {
    let l = cgroup::discover(&f.root).unwrap();
    let snap = cgroup::scan(&f.root, &l, 0).unwrap();
    snap.pods
        .into_iter()
        .map(|p| (p.id.to_string(), p))
        .collect()
}

#[test]
fn every_pod_is_found_with_its_uid_and_qos() {
    for f in fixtures() {
        let found = scan_fixture(&f);
        let want: BTreeSet<String> = f.pods.iter().map(cgroup_uid).collect();
        let got: BTreeSet<String> = found.keys().cloned().collect();
        assert_eq!(got, want, "{}", f.name);
        let mut qos_seen = BTreeSet::new();
        for p in &f.pods {
            let v = PodView::try_from(p).unwrap();
            let cg = &found[&cgroup_uid(p)];
            assert_eq!(cg.qos, v.qos, "{} {}", f.name, v.key());
            assert!(cg.sample.is_ok(), "{} {}: {:?}", f.name, v.key(), cg.sample);
            qos_seen.insert(v.qos);
        }
        assert_eq!(
            qos_seen.len(),
            3,
            "{}: Guaranteed, Burstable and BestEffort",
            f.name
        );
    }
}

#[test]
fn every_container_is_found_with_runtime_and_role() {
    for f in fixtures() {
        let mut found = scan_fixture(&f);
        let driver = expected_layout(&f.name).0;
        for p in &f.pods {
            let v = PodView::try_from(p).unwrap();
            let cg = found.get_mut(&cgroup_uid(p)).unwrap();
            let ids: Vec<&str> = v
                .statuses
                .iter()
                .map(|s| s.container_id.as_deref().unwrap())
                .collect();
            cgroup::mark_roles(cg, |id| ids.contains(&id));
            for s in &v.statuses {
                let id = s.container_id.as_deref().unwrap();
                let c = cg
                    .containers
                    .iter()
                    .find(|c| c.id == id && c.role != ContainerRole::Conmon)
                    .unwrap_or_else(|| panic!("{} {}: no cgroup for {id}", f.name, v.key()));
                assert_eq!(c.role, ContainerRole::App);
                let want_rt = match (s.runtime.as_deref(), driver) {
                    (Some("cri-o"), _) => Runtime::Crio,
                    // A bare id (cgroupfs) does not name its runtime.
                    (_, Driver::Cgroupfs) => Runtime::Unknown,
                    (Some("containerd"), _) => Runtime::Containerd,
                    (Some("docker"), _) => Runtime::Docker,
                    (rt, _) => panic!("unexpected runtime {rt:?}"),
                };
                assert_eq!(c.runtime, want_rt, "{} {}", f.name, v.key());
            }
            let crio = v
                .statuses
                .iter()
                .any(|s| s.runtime.as_deref() == Some("cri-o"));
            let sandboxes: Vec<_> = cg
                .containers
                .iter()
                .filter(|c| c.role == ContainerRole::Sandbox)
                .collect();
            let shares_pid = p
                .spec
                .as_ref()
                .and_then(|s| s.share_process_namespace)
                .unwrap_or(false);
            // CRI-O drops the infra container unless the pod needs one.
            let want_sandboxes = usize::from(!crio || shares_pid);
            assert_eq!(sandboxes.len(), want_sandboxes, "{} {}", f.name, v.key());
            for c in cg
                .containers
                .iter()
                .filter(|c| c.role == ContainerRole::Conmon)
            {
                assert!(crio, "{}: conmon outside CRI-O", f.name);
                assert!(
                    cg.containers
                        .iter()
                        .any(|o| o.id == c.id && o.role != ContainerRole::Conmon),
                    "{} {}: conmon {} watches nothing",
                    f.name,
                    v.key(),
                    c.id
                );
            }
            if crio {
                let conmons = cg
                    .containers
                    .iter()
                    .filter(|c| c.role == ContainerRole::Conmon)
                    .count();
                assert_eq!(
                    conmons,
                    ids.len() + want_sandboxes,
                    "{} {}",
                    f.name,
                    v.key()
                );
            }
        }
    }
}

#[test]
fn cpu_max_values_follow_the_pod_specs() {
    let mut periods = BTreeSet::new();
    for f in fixtures() {
        let found = scan_fixture(&f);
        let systemd = expected_layout(&f.name).0 == Driver::Systemd;
        for p in &f.pods {
            let v = PodView::try_from(p).unwrap();
            let cg = &found[&cgroup_uid(p)];
            let pod_max = cg.sample.as_ref().unwrap().cpu_max;
            periods.insert(pod_max.period_us);
            let what = format!("{} {} pod", f.name, v.key());
            check_cpu_max(&what, &pod_max, expected_pod_limit(&v), systemd);
            for s in &v.statuses {
                let id = s.container_id.as_deref().unwrap();
                let c = cg
                    .containers
                    .iter()
                    .find(|c| c.id == id && c.role != ContainerRole::Conmon)
                    .unwrap();
                let m = c.cpu_max.as_ref().unwrap();
                let what = format!("{} {} container {}", f.name, v.key(), s.name);
                check_cpu_max(&what, m, expected_container_limit(&v, &s.name), false);
            }
        }
    }
    assert!(
        periods.iter().any(|p| *p != 100_000),
        "some fixture must use a non-default CFS period: {periods:?}"
    );
}

#[test]
fn slack_reads_capacity_from_each_fixture() {
    for f in fixtures() {
        let l = cgroup::discover(&f.root).unwrap();
        let a = cgroup::scan(&f.root, &l, 0).unwrap();
        let b = cgroup::scan(&f.root, &l, 1_000_000).unwrap();
        let alloc = f
            .node
            .status
            .as_ref()
            .unwrap()
            .allocatable
            .as_ref()
            .unwrap()["cpu"]
            .0
            .clone();
        let alloc_m = headroom::quantity::cpu_millis(&alloc).unwrap();
        let cap = CapacityInputs {
            node_allocatable_m: Some(alloc_m),
            online_cpus: 64,
            shared_pool_cpus: None,
        };
        let s = usage::measure(&a, &b, cap);
        // Same bytes twice: nothing used, all capacity is slack.
        assert_eq!(s.usage_m, 0, "{}", f.name);
        assert_eq!(s.idle_m, s.capacity_m, "{}", f.name);
        assert_eq!(s.pods.len(), f.pods.len());
        match a.kubepods.cpu_max.millicores() {
            Some(k) if k < alloc_m => {
                assert_eq!(s.capacity_source, CapacitySource::KubepodsCpuMax);
                assert_eq!(s.capacity_m, k);
            }
            _ => {
                assert_eq!(s.capacity_source, CapacitySource::NodeAllocatable);
                assert_eq!(s.capacity_m, alloc_m);
            }
        }
    }
}
