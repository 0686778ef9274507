//! For every tree under `cgroup-fixtures/`: the expected `cpu.max` derived
//! from each Pod's spec matches what the scanner reads (no mismatch), and a
//! deliberately altered value is found.

use std::path::{Path, PathBuf};

use headroom::cgroup::{self, CpuMax, Driver, NodeSnapshot};
use headroom::model::PodView;
use headroom::verify::{self, Observed, Target, audit, compare, expected_cpu_max};
use k8s_openapi::api::core::v1::Pod;

struct Fixture {
    name: String,
    pods: Vec<PodView>,
    snapshot: NodeSnapshot,
}

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cgroup-fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("pods.json").is_file())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|d| {
            let list: k8s_openapi::List<Pod> =
                serde_json::from_slice(&std::fs::read(d.join("pods.json")).unwrap()).unwrap();
            let pods = list
                .items
                .iter()
                .map(|p| PodView::try_from(p).unwrap())
                .collect();
            let root = d.join("root");
            let layout = cgroup::discover(&root).unwrap();
            let snapshot = cgroup::scan(&root, &layout, 0).unwrap();
            Fixture {
                name: d.file_name().unwrap().to_string_lossy().into_owned(),
                pods,
                snapshot,
            }
        })
        .collect()
}

#[test]
fn there_are_fixtures_of_both_drivers() {
    let f = fixtures();
    assert!(f.len() >= 5, "{} fixtures", f.len());
    assert!(
        f.iter()
            .any(|f| f.snapshot.layout.driver == Driver::Systemd)
    );
    assert!(
        f.iter()
            .any(|f| f.snapshot.layout.driver == Driver::Cgroupfs)
    );
}

#[test]
fn every_fixture_pod_matches_its_expected_cpu_max() {
    for f in fixtures() {
        let driver = f.snapshot.layout.driver;
        let audited = audit(&f.pods, &f.snapshot.pods, driver);
        assert!(!audited.is_empty(), "{}: no pod audited", f.name);
        for a in &audited {
            assert_eq!(a.mismatches, vec![], "{}: pod {}", f.name, a.uid);
        }
        // Every running container was actually compared: its cgroup exists.
        for p in f.pods.iter().filter(|p| p.is_running()) {
            let cg = f
                .snapshot
                .pods
                .iter()
                .find(|c| c.id == p.cgroup_id)
                .unwrap_or_else(|| panic!("{}: no cgroup for {}", f.name, p.key()));
            for c in expected_cpu_max(p, 100_000).containers {
                let id = c.container_id.expect("fixture containers run");
                assert!(cg.containers.iter().any(|x| x.id == id), "{}: {id}", f.name);
            }
        }
    }
}

/// The fixture notes' special cases are covered by the compare, not skipped.
#[test]
fn fixture_special_cases_are_audited() {
    let all = fixtures();
    let find = |fixture: &str, pod: &str| {
        let f = all.iter().find(|f| f.name == fixture).unwrap();
        let p = f.pods.iter().find(|p| &*p.name == pod).cloned();
        (f, p.unwrap_or_else(|| panic!("{fixture}/{pod} missing")))
    };
    // pod-level 101m limit: pod reads 11000 (systemd rounding), accepted.
    let (f, p) = find("pod-level", "plr-101m");
    let cg = f
        .snapshot
        .pods
        .iter()
        .find(|c| c.id == p.cgroup_id)
        .unwrap();
    let pod_max = cg.sample.as_ref().unwrap().cpu_max;
    assert_eq!(pod_max.quota_us, Some(11_000));
    assert_eq!(
        compare(&expected_cpu_max(&p, 100_000), cg, Driver::Systemd),
        vec![]
    );
    // ... but with the cgroupfs driver the same value would be drift.
    assert_eq!(
        compare(&expected_cpu_max(&p, 100_000), cg, Driver::Cgroupfs).len(),
        1
    );
}

#[test]
fn an_altered_cpu_max_is_found_in_every_fixture() {
    for f in fixtures() {
        let driver = f.snapshot.layout.driver;
        // Alter the first running pod with a limited pod cgroup, and the
        // first container cgroup of a running pod.
        let mut pods_cg = f.snapshot.pods.clone();
        let limited = f
            .pods
            .iter()
            .filter(|p| p.is_running())
            .find(|p| expected_cpu_max(p, 100_000).pod.millis().is_some())
            .unwrap_or_else(|| panic!("{}: no limited pod", f.name));
        let cg = pods_cg
            .iter_mut()
            .find(|c| c.id == limited.cgroup_id)
            .unwrap();
        let old = cg.sample.as_ref().unwrap().cpu_max;
        let altered = CpuMax {
            quota_us: old.quota_us.map(|q| q * 2),
            period_us: old.period_us,
        };
        cg.sample.as_mut().unwrap().cpu_max = altered;
        let container = expected_cpu_max(limited, 100_000).containers[0].clone();
        let id = container.container_id.clone().unwrap();
        let ccg = cg.containers.iter_mut().find(|c| c.id == id).unwrap();
        ccg.cpu_max = Ok(CpuMax {
            quota_us: Some(ccg.cpu_max.as_ref().unwrap().quota_us.unwrap_or(1000) + 50_000),
            period_us: 100_000,
        });
        let audited = audit(&f.pods, &pods_cg, driver);
        let bad: Vec<_> = audited
            .iter()
            .filter(|a| !a.mismatches.is_empty())
            .collect();
        assert_eq!(bad.len(), 1, "{}: {bad:?}", f.name);
        assert_eq!(bad[0].uid, limited.uid);
        let targets: Vec<&Target> = bad[0].mismatches.iter().map(|m| &m.target).collect();
        assert_eq!(
            targets,
            vec![&Target::Pod, &Target::Container(container.name.clone())],
            "{}",
            f.name
        );
        assert_eq!(bad[0].mismatches[0].actual, Observed::Value(altered));
        // The tracker turns it into drift only after the grace period.
        let mut t = verify::PodDrift::default();
        let (t0, grace) = (std::time::Duration::ZERO, verify::DEFAULT_GRACE);
        assert!(
            t.observe_pod(&limited.uid, &bad[0].mismatches, t0, grace)
                .is_empty()
        );
        let ev = t.observe_pod(&limited.uid, &bad[0].mismatches, grace, grace);
        assert_eq!(ev.len(), 2, "{}", f.name);
    }
}

#[test]
fn a_removed_container_cgroup_is_no_cgroup() {
    let f = fixtures().into_iter().find(|f| f.name == "kind").unwrap();
    let p = f
        .pods
        .iter()
        .find(|p| p.is_running() && !p.containers.is_empty())
        .unwrap();
    let mut cg = f
        .snapshot
        .pods
        .iter()
        .find(|c| c.id == p.cgroup_id)
        .unwrap()
        .clone();
    let id = expected_cpu_max(p, 100_000).containers[0]
        .container_id
        .clone()
        .unwrap();
    cg.containers.retain(|c| c.id != id);
    let m = compare(&expected_cpu_max(p, 100_000), &cg, f.snapshot.layout.driver);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].actual, Observed::NoCgroup);
}
