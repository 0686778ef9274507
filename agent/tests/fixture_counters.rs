//! The two samples of every tree under `cgroup-fixtures/` (`root/`, then
//! `later/` 10 s on) are one cgroup tree read twice: every cumulative
//! counter in `later/` is at least the one in `root/` (the agent reads a
//! counter that went down as a reset), the deltas are physical (periods and
//! throttling only under a quota), and every pod's and container's
//! `cpu.pressure` has the `full` line of kernels ≥ 5.13. The two contention
//! scenarios carry the stall their notes describe.
//!
//! Plain file reading, no agent code: it checks the fixtures, not the reader.
//! `HEADROOM_FIXTURES_DIR` points it at another fixtures directory (e.g. a
//! generator's output under test).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

const LATER_US: u64 = 10_000_000;

/// `cpu.stat` keys that only grow.
const STAT_COUNTERS: [&str; 6] = [
    "usage_usec",
    "user_usec",
    "system_usec",
    "nr_periods",
    "nr_throttled",
    "throttled_usec",
];

fn fixtures_dir() -> PathBuf {
    std::env::var_os("HEADROOM_FIXTURES_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../cgroup-fixtures"),
        PathBuf::from,
    )
}

/// `(name, dir)` of every fixture (a directory with a `pods.json`).
fn fixtures() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("pods.json").is_file())
        .map(|d| (d.file_name().unwrap().to_string_lossy().into_owned(), d))
        .collect();
    out.sort();
    assert!(out.len() >= 5, "{} fixtures", out.len());
    out
}

/// Every directory under `dir` that holds `file`, relative to `dir`.
fn cgroups_with(dir: &Path, file: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        if d.join(file).is_file() {
            out.push(d.strip_prefix(dir).unwrap().to_path_buf());
        }
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            }
        }
    }
    out.sort();
    out
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn cpu_stat(p: &Path) -> BTreeMap<String, u64> {
    read(p)
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_string(), v.trim().parse().unwrap())
        })
        .collect()
}

/// `some`/`full` → `total=` (µs).
fn pressure(p: &Path) -> BTreeMap<String, u64> {
    read(p)
        .lines()
        .map(|l| {
            let (kind, rest) = l.split_once(' ').unwrap();
            let total = rest
                .split_whitespace()
                .find_map(|f| f.strip_prefix("total="))
                .unwrap_or_else(|| panic!("{}: no total= in {l:?}", p.display()));
            (kind.to_string(), total.parse().unwrap())
        })
        .collect()
}

/// `cpu.max`: has a quota.
fn limited(p: &Path) -> bool {
    !read(p).starts_with("max ")
}

/// Δ of every counter of one cgroup, `later − root`; panics naming the
/// counter that went down.
struct Deltas {
    stat: BTreeMap<String, u64>,
    some: u64,
    full: u64,
}

fn deltas(fixture: &Path, rel: &Path) -> Deltas {
    let (a, b) = (
        fixture.join("root").join(rel),
        fixture.join("later").join(rel),
    );
    let what = |f: &str| format!("{}/{{root,later}}/{}/{f}", fixture.display(), rel.display());
    let (s0, s1) = (cpu_stat(&a.join("cpu.stat")), cpu_stat(&b.join("cpu.stat")));
    let mut stat = BTreeMap::new();
    for k in STAT_COUNTERS {
        let (x, y) = (s0.get(k).copied(), s1.get(k).copied());
        let (Some(x), Some(y)) = (x, y) else {
            panic!("{}: no {k}", what("cpu.stat"))
        };
        assert!(y >= x, "{}: {k} went down, {x} → {y}", what("cpu.stat"));
        stat.insert(k.to_string(), y - x);
    }
    let (p0, p1) = (
        pressure(&a.join("cpu.pressure")),
        pressure(&b.join("cpu.pressure")),
    );
    let d = |k: &str| {
        let line = |p: &BTreeMap<String, u64>| {
            *p.get(k)
                .unwrap_or_else(|| panic!("{}: no {k} line", what("cpu.pressure")))
        };
        let (x, y) = (line(&p0), line(&p1));
        assert!(
            y >= x,
            "{}: {k} total went down, {x} → {y}",
            what("cpu.pressure")
        );
        y - x
    };
    let (some, full) = (d("some"), d("full"));
    Deltas { stat, some, full }
}

#[test]
fn cumulative_counters_only_grow_from_root_to_later() {
    for (name, dir) in fixtures() {
        let root = cgroups_with(&dir.join("root"), "cpu.stat");
        let later = cgroups_with(&dir.join("later"), "cpu.stat");
        assert_eq!(root, later, "{name}: the two samples hold other cgroups");
        assert!(root.len() > 10, "{name}: {} cgroups", root.len());
        let mut grew = 0;
        for rel in &root {
            let d = deltas(&dir, rel);
            grew += usize::from(d.stat["usage_usec"] > 0);
            let max = dir.join("root").join(rel).join("cpu.max");
            if !limited(&max) {
                // No quota: no period is enforced, nothing is throttled.
                for k in ["nr_periods", "nr_throttled", "throttled_usec"] {
                    assert_eq!(
                        d.stat[k],
                        0,
                        "{name} {}: {k} moved without a quota",
                        rel.display()
                    );
                }
            }
            // Throttled periods are enforced periods; each is at most one
            // period long on each CPU.
            assert!(
                d.stat["nr_throttled"] <= d.stat["nr_periods"],
                "{name} {}",
                rel.display()
            );
            assert_eq!(
                d.stat["nr_throttled"] == 0,
                d.stat["throttled_usec"] == 0,
                "{name} {}",
                rel.display()
            );
            // Stall is wall time within the interval; `full` implies `some`.
            assert!(
                d.some <= LATER_US && d.full <= d.some,
                "{name} {}",
                rel.display()
            );
        }
        assert!(
            grew > 0,
            "{name}: no cgroup used any CPU between the samples"
        );
    }
}

/// The uid a pod's cgroup is named after (a static pod's config hash).
fn cgroup_uid(p: &Value) -> String {
    let m = &p["metadata"];
    m["annotations"]["kubernetes.io/config.mirror"]
        .as_str()
        .or(m["uid"].as_str())
        .unwrap()
        .to_string()
}

fn pods(dir: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_str(&read(&dir.join("pods.json"))).unwrap();
    v["items"].as_array().unwrap().clone()
}

/// `name` → the pod's cgroup directory, relative to a sample.
fn pod_dirs(dir: &Path) -> BTreeMap<String, PathBuf> {
    let all = cgroups_with(&dir.join("root"), "cpu.pressure");
    pods(dir)
        .iter()
        .map(|p| {
            let uid = cgroup_uid(p);
            let names = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
            let d = all
                .iter()
                .find(|d| {
                    let n = d.file_name().unwrap().to_string_lossy();
                    names
                        .iter()
                        .any(|x| n == *x || n.ends_with(&format!("-{x}.slice")))
                })
                .unwrap_or_else(|| panic!("{}: no cgroup for pod {uid}", dir.display()));
            (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                d.clone(),
            )
        })
        .collect()
}

#[test]
fn every_pod_and_container_pressure_has_some_and_full() {
    for (name, dir) in fixtures() {
        for (pod, rel) in pod_dirs(&dir) {
            for sample in ["root", "later"] {
                let pod_dir = dir.join(sample).join(&rel);
                // The pod cgroup and each of its containers (pause and conmon too).
                let cgs = cgroups_with(&pod_dir, "cpu.pressure");
                assert!(cgs.len() >= 2, "{name} {pod}: {cgs:?}");
                for c in cgs {
                    let f = pod_dir.join(&c).join("cpu.pressure");
                    let text = read(&f);
                    let kinds: Vec<&str> =
                        text.lines().map(|l| l.split(' ').next().unwrap()).collect();
                    assert_eq!(kinds, ["some", "full"], "{}", f.display());
                    for l in text.lines() {
                        let fields: Vec<&str> = l.split(' ').skip(1).collect();
                        let keys: Vec<&str> = fields
                            .iter()
                            .map(|f| f.split('=').next().unwrap())
                            .collect();
                        assert_eq!(
                            keys,
                            ["avg10", "avg60", "avg300", "total"],
                            "{}",
                            f.display()
                        );
                    }
                }
            }
        }
    }
}

fn fixture(name: &str) -> PathBuf {
    let dir = fixtures_dir().join(name);
    assert!(dir.join("pods.json").is_file(), "fixture {name} missing");
    dir
}

/// Δ of pod `pod`'s cgroup, and of kubepods (the parent of the QoS slices).
fn pod_and_kubepods(dir: &Path, pod: &str) -> (Deltas, Deltas) {
    let rel = pod_dirs(dir)
        .remove(pod)
        .unwrap_or_else(|| panic!("{}: no pod {pod}", dir.display()));
    let kp = Path::new("kubelet.slice/kubelet-kubepods.slice");
    (deltas(dir, &rel), deltas(dir, kp))
}

fn pct(us: u64) -> f64 {
    us as f64 * 100.0 / LATER_US as f64
}

#[test]
fn lone_threads_queue_behind_each_other_and_nothing_else() {
    let dir = fixture("lone-threads");
    let (pod, kp) = pod_and_kubepods(&dir, "thumbnailer-6f9c7d8b5-kx2vq");
    // 2000m over the interval: both CPUs.
    assert_eq!(pod.stat["usage_usec"], 2 * LATER_US);
    assert!(pct(pod.some) > 99.0, "some {}%", pct(pod.some));
    assert!(pct(pod.full) < 1.0, "full {}%", pct(pod.full));
    // A quota (2000m) and demand: every period counted, none throttled.
    assert_eq!(pod.stat["nr_periods"], LATER_US / 100_000);
    assert_eq!(
        (pod.stat["nr_throttled"], pod.stat["throttled_usec"]),
        (0, 0)
    );
    assert!(pct(kp.some) > 99.0 && pct(kp.full) < 1.0);
    // Nobody else used CPU or waited for it.
    for (name, rel) in pod_dirs(&dir) {
        if name != "thumbnailer-6f9c7d8b5-kx2vq" {
            let d = deltas(&dir, &rel);
            assert_eq!((d.stat["usage_usec"], d.some, d.full), (0, 0, 0), "{name}");
        }
    }
}

#[test]
fn displaced_neighbour_waits_30_percent_with_nothing_running() {
    let dir = fixture("displaced");
    let (managed, kp) = pod_and_kubepods(&dir, "indexer-7c5d9b8f6-m4zqt");
    assert_eq!(managed.stat["usage_usec"], 15 * LATER_US / 10);
    assert!(pct(managed.some) > 99.0 && pct(managed.full) < 1.0);
    assert_eq!(managed.stat["nr_periods"], LATER_US / 100_000);
    assert_eq!(
        (managed.stat["nr_throttled"], managed.stat["throttled_usec"]),
        (0, 0)
    );
    let (nbr, _) = pod_and_kubepods(&dir, "ledger-api-5b8c6d7f9-r2wxp");
    // 500m of the 800m it requests; waited 300 ms a second, unthrottled.
    assert_eq!(nbr.stat["usage_usec"], LATER_US / 2);
    assert_eq!((nbr.some, nbr.full), (3 * LATER_US / 10, 3 * LATER_US / 10));
    assert_eq!(nbr.stat["throttled_usec"], 0);
    // Both CPUs busy all along.
    assert_eq!(kp.stat["usage_usec"], 2 * LATER_US);
    assert!(pct(kp.some) > 99.0 && pct(kp.full) < 1.0);
}
