//! Full-tree scan vs. the floor: a bare `std::fs::read` loop over the same
//! files the scan parses (no directory listing, no parsing), and a second
//! floor that also lists the directories the scan must list (kubepods, the
//! QoS slices, each pod), so the remainder is parsing and bookkeeping.
//!
//! `cargo bench -p headroom-agent --bench scan`. Trees of 110, 250 and 500
//! pods × 3 containers (+ a sandbox each), with the usual cgroup interface
//! files beside the ones Headroom reads, so directory listings cost what
//! they cost on a node. Prints the median ns/pod and the ratios to both
//! floors. The scan reads each pod's cpu.max, cpu.stat, cpu.pressure and
//! cpu.weight, and each container's cpu.max and (finite quota) cpu.stat.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use headroom::cgroup::read::{Buf, Handles};
use headroom::cgroup::{self, Depth, Scanner};

/// Interface files of a cgroup v2 directory that Headroom does not read.
const OTHER_FILES: &[&str] = &[
    "cgroup.controllers",
    "cgroup.events",
    "cgroup.freeze",
    "cgroup.kill",
    "cgroup.max.depth",
    "cgroup.max.descendants",
    "cgroup.procs",
    "cgroup.stat",
    "cgroup.subtree_control",
    "cgroup.threads",
    "cgroup.type",
    "cpu.idle",
    "cpu.max.burst",
    "cpu.uclamp.max",
    "cpu.uclamp.min",
    "cpu.weight.nice",
    "cpuset.cpus",
    "io.pressure",
    "memory.current",
    "memory.events",
    "memory.high",
    "memory.low",
    "memory.max",
    "memory.min",
    "memory.pressure",
    "memory.stat",
    "memory.swap.max",
    "pids.current",
    "pids.max",
];

/// Writes one cgroup directory; pushes the paths of `reads` (the files the
/// scan reads there) onto `read`.
fn cgroup_dir(dir: &Path, cpu_max: &str, read: &mut Vec<PathBuf>, reads: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    for f in OTHER_FILES {
        std::fs::write(dir.join(f), "0\n").unwrap();
    }
    let files: &[(&str, &str)] = &[
        ("cpu.max", cpu_max),
        (
            "cpu.stat",
            "usage_usec 123456789\nuser_usec 100000000\nsystem_usec 23456789\n\
core_sched.force_idle_usec 0\nnr_periods 45678\nnr_throttled 1234\n\
throttled_usec 5678901\nnr_bursts 0\nburst_usec 0\n",
        ),
        (
            "cpu.pressure",
            "some avg10=1.23 avg60=0.98 avg300=0.50 total=123456789\n\
full avg10=0.12 avg60=0.10 avg300=0.05 total=12345678\n",
        ),
        ("cpu.weight", "79\n"),
    ];
    for (f, c) in files {
        std::fs::write(dir.join(f), c).unwrap();
        if reads.contains(f) {
            read.push(dir.join(f));
        }
    }
}

fn id(pod: usize, c: usize) -> String {
    format!("{pod:032x}{c:032x}")
}

const POD_FILES: &[&str] = &["cpu.max", "cpu.stat", "cpu.pressure", "cpu.weight"];
/// A container with a finite quota: its throttling is part of the stall.
const CONTAINER_FILES: &[&str] = &["cpu.max", "cpu.stat"];

/// Writes the tree; returns the files a scan parses (the floor's list) and
/// the directories it lists.
fn build(root: &Path, pods: usize) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut read = Vec::new();
    std::fs::write(
        root.join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .unwrap();
    let kp = root.join("kubepods.slice");
    cgroup_dir(&kp, "max 100000\n", &mut read, POD_FILES);
    let mut dirs = vec![kp.clone()];
    for qos in ["kubepods-burstable.slice", "kubepods-besteffort.slice"] {
        cgroup_dir(&kp.join(qos), "max 100000\n", &mut read, &[]);
        dirs.push(kp.join(qos));
    }
    for p in 0..pods {
        let uid = format!("{p:08x}_0000_4000_8000_{p:012x}");
        let dir = match p % 3 {
            0 => kp.join(format!("kubepods-pod{uid}.slice")),
            1 => kp.join(format!(
                "kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"
            )),
            _ => kp.join(format!(
                "kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice"
            )),
        };
        cgroup_dir(&dir, "150000 100000\n", &mut read, POD_FILES);
        for c in 0..4 {
            // c == 3: the pause container.
            let cdir = dir.join(format!("cri-containerd-{}.scope", id(p, c)));
            cgroup_dir(&cdir, "50000 100000\n", &mut read, CONTAINER_FILES);
        }
        dirs.push(dir);
    }
    (read, dirs)
}

/// Median time of one call to `f`, over at least 5 runs and ~1 s.
fn median(mut f: impl FnMut()) -> Duration {
    for _ in 0..3 {
        f();
    }
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < Duration::from_secs(1) && times.len() < 500) {
        let t = Instant::now();
        f();
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

fn main() {
    println!(
        "{:>5}  {:>6}  {:>5}  {:>12}  {:>12}  {:>6}  {:>14}  {:>6}",
        "pods", "files", "dirs", "scan ns/pod", "floor ns/pod", "ratio", "+list ns/pod", "ratio"
    );
    let mut lights = Vec::new();
    for pods in [110, 250, 500] {
        let t = tempfile::tempdir().unwrap();
        let (files, dirs) = build(t.path(), pods);
        let layout = cgroup::discover(t.path()).unwrap();
        let snap = cgroup::scan(t.path(), &layout, 0).unwrap();
        assert_eq!(snap.pods.len(), pods);
        assert!(
            snap.pods
                .iter()
                .all(|p| p.sample.is_ok() && p.containers.len() == 4)
        );

        let scan = median(|| {
            black_box(cgroup::scan(t.path(), &layout, 0).unwrap());
        });
        let floor = median(|| {
            for f in &files {
                black_box(std::fs::read(f).unwrap());
            }
        });
        let listed = median(|| {
            for d in &dirs {
                for e in std::fs::read_dir(d).unwrap().flatten() {
                    black_box(e.file_name());
                }
            }
            for f in &files {
                black_box(std::fs::read(f).unwrap());
            }
        });
        let per = |d: Duration| d.as_nanos() as f64 / pods as f64;
        // A calm tick: each pod's cpu.stat, read by open + fstat + read +
        // close, or through a kept handle with one pread.
        let mut opening = Scanner::new(t.path(), Handles::none());
        let mut keeping = Scanner::new(t.path(), Handles::keeping(4096));
        let light_open = median(|| {
            black_box(opening.rescan(&snap, 1, |_, _| Depth::Stat).unwrap());
        });
        let light_kept = median(|| {
            black_box(keeping.rescan(&snap, 1, |_, _| Depth::Stat).unwrap());
        });
        lights.push((pods, per(light_open), per(light_kept)));
        println!(
            "{pods:>5}  {:>6}  {:>5}  {:>12.0}  {:>12.0}  {:>6.2}  {:>14.0}  {:>6.2}",
            files.len(),
            dirs.len(),
            per(scan),
            per(floor),
            scan.as_secs_f64() / floor.as_secs_f64(),
            per(listed),
            scan.as_secs_f64() / listed.as_secs_f64()
        );
    }
    println!(
        "\ncalm tick (kubepods' counters + each pod's cpu.stat), temp-dir tree: \
         open+fstat+read+close vs kept handle + pread, ns per pod"
    );
    for (pods, open, kept) in lights {
        println!(
            "{pods:>5}  open {open:>8.0}  kept {kept:>8.0}  kept/open {:.2}",
            kept / open
        );
    }
    real_cgroupfs();
}

/// The same two ways over real cgroupfs files (`cpu.stat` of child cgroups
/// of a cgroup2 mount, which the kernel generates on each read), where one
/// can be made; skipped otherwise.
fn real_cgroupfs() {
    let Some(base) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(Path::new)
        .find(|p| cgroup::read::is_cgroup2(p))
    else {
        println!("no cgroup2 mount: real cgroupfs comparison skipped");
        return;
    };
    let top = base.join(format!("headroom-bench-{}", std::process::id()));
    if std::fs::create_dir(&top).is_err() {
        println!(
            "{} not writable: real cgroupfs comparison skipped",
            base.display()
        );
        return;
    }
    let n = 250;
    let files: Vec<PathBuf> = (0..n)
        .filter_map(|i| {
            let d = top.join(format!("pod{i}"));
            std::fs::create_dir(&d).ok()?;
            Some(d.join("cpu.stat"))
        })
        .collect();
    let mut b = Buf::default();
    let mut none = Handles::none();
    let open = median(|| {
        for f in &files {
            none.read_into(f, &mut b).unwrap();
        }
    });
    let mut kept = Handles::keeping(4096);
    let pread = median(|| {
        for f in &files {
            kept.read_into(f, &mut b).unwrap();
        }
    });
    let per = |d: Duration| d.as_nanos() as f64 / files.len() as f64;
    println!(
        "real cgroupfs ({}), {} cpu.stat files: open {:.0} ns, kept {:.0} ns per file, \
         kept/open {:.2}",
        base.display(),
        files.len(),
        per(open),
        per(pread),
        pread.as_secs_f64() / open.as_secs_f64()
    );
    drop(kept);
    for f in &files {
        let _ = std::fs::remove_dir(f.parent().unwrap());
    }
    let _ = std::fs::remove_dir(&top);
}
