//! One decision round of the agent for 110, 250 and 500 pods:
//! `policy` = decide + plan from measured slack (no I/O);
//! `tick` = what `run` does every tick: light rescan (kubepods + every
//! managed pod's cpu.stat) + slack + decide + plan;
//! `tick_full` = the same with a full scan (audit ticks).
//!
//! `cargo bench -p headroom-agent --bench round`

use foldhash::HashSet;
use std::hint::black_box;
use std::path::Path;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use headroom::cgroup::{self, Depth};
use headroom::model::PodView;
use headroom::policy::{PolicyConfig, TokenBucket, plan};
use headroom::reconcile::decide_round;
use headroom::signal::contention::{self, Contention, Thresholds};
use headroom::signal::usage::{self, CapacityInputs};
use headroom::testkit::{PodBuilder, container, resources};

fn write(dir: &Path, cpu_max: &str, usage: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("cpu.max"), cpu_max).unwrap();
    std::fs::write(
        dir.join("cpu.stat"),
        format!("usage_usec {usage}\nuser_usec {usage}\nsystem_usec 0\nnr_periods 100\nnr_throttled 3\nthrottled_usec 900\n"),
    )
    .unwrap();
    std::fs::write(dir.join("cpu.pressure"), "some avg10=1.00 avg60=0.50 avg300=0.10 total=100\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap();
    std::fs::write(dir.join("cpu.weight"), "10\n").unwrap();
}

fn container_id(pod: usize, container: usize) -> String {
    format!("{pod:032x}{container:032x}")
}

/// A kind-layout tree of `n` Burstable pods × 3 containers (+ pause), and the
/// matching pod views (all opted in).
fn node(root: &Path, n: usize) -> Vec<PodView> {
    std::fs::write(root.join("cgroup.controllers"), "cpuset cpu memory\n").unwrap();
    let kp = root.join("kubelet.slice/kubelet-kubepods.slice");
    write(&kp, "max 100000\n", 1);
    let bu = kp.join("kubelet-kubepods-burstable.slice");
    write(&bu, "max 100000\n", 1);
    let mut views = Vec::new();
    for i in 0..n {
        let uid = format!("{i:08x}-0000-4000-8000-000000000000");
        let pod = bu.join(format!(
            "kubelet-kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        ));
        write(&pod, "60000 100000\n", 1000 + i as u64);
        for c in 0..3 {
            write(
                &pod.join(format!("cri-containerd-{}.scope", container_id(i, c))),
                "20000 100000\n",
                10,
            );
        }
        write(
            &pod.join(format!("cri-containerd-{:064x}.scope", (i + 1) << 20)),
            "max 100000\n",
            1,
        );
        let containers = (0..3)
            .map(|c| {
                let r = resources(Some(50), Some(200), Some(64 << 20), None);
                container(&format!("c{c}"), r)
            })
            .collect();
        views.push(
            PodBuilder::new("bench", &format!("p{i}"), &uid)
                .node("n")
                .containers(containers)
                .running("containerd", |c, _| container_id(i, c))
                .observed_generation(1)
                .build(),
        );
    }
    views
}

fn bench(c: &mut Criterion) {
    let cfg = PolicyConfig::default();
    let cap = CapacityInputs {
        node_allocatable_m: Some(64_000),
        online_cpus: 64,
        shared_pool_cpus: None,
    };
    let opted: HashSet<String> = ["bench".to_string()].into_iter().collect();
    let mut g = c.benchmark_group("round");
    for n in [110usize, 250, 500] {
        let t = tempfile::tempdir().unwrap();
        let views = node(t.path(), n);
        let layout = cgroup::discover(t.path()).unwrap();
        let prev = cgroup::scan(t.path(), &layout, 0).unwrap();
        let cur = cgroup::scan(t.path(), &layout, 1_000_000).unwrap();
        let s = usage::measure(&prev, &cur, cap);
        let th = Thresholds {
            min_pct_of_request: cfg.pressure_start_pct,
            cpus: 64,
            reserve_m: cfg.reserve_m,
        };
        let calm = Contention::default();
        let eligible = headroom::policy::Eligibility::of(&views, "n", &opted, Some(true), 0);
        let managed = contention::managed(&views, &eligible);
        let round = |s: &usage::NodeUsage, c: &Contention| {
            let r = decide_round(
                "n",
                &views,
                &eligible,
                s,
                c,
                headroom::reconcile::Owed::of(c),
                &opted,
                |_| Default::default(),
                Some(true),
                0,
                &cfg,
            );
            let mut bucket = TokenBucket::from_config(&cfg);
            plan(&r.node, &r.decisions, |_| None, 100.0, &mut bucket, &cfg)
        };
        g.bench_with_input(BenchmarkId::new("policy", n), &n, |b, _| {
            b.iter(|| black_box(round(&s, &calm)))
        });
        g.bench_with_input(BenchmarkId::new("tick", n), &n, |b, _| {
            let mut at = 2_000_000;
            b.iter(|| {
                at += 1_000_000;
                let light = cgroup::rescan(t.path(), &cur, at, |_, _| Depth::Stat).unwrap();
                let s = usage::measure(&cur, &light, cap);
                black_box(round(&s, &calm))
            })
        });
        // A contended tick: every pod's pressure read and attributed.
        g.bench_with_input(BenchmarkId::new("tick_contended", n), &n, |b, _| {
            let mut at = 2_000_000;
            b.iter(|| {
                at += 1_000_000;
                let light = cgroup::rescan(t.path(), &cur, at, |_, _| Depth::StatPressure).unwrap();
                let s = usage::measure(&cur, &light, cap);
                let c = contention::attribute(
                    &cur,
                    &light,
                    &s,
                    &contention::requests(&views),
                    &managed,
                    &contention::Contention::default(),
                    th,
                );
                black_box(round(&s, &c))
            })
        });
        g.bench_with_input(BenchmarkId::new("tick_full", n), &n, |b, _| {
            let mut at = 2_000_000;
            b.iter(|| {
                at += 1_000_000;
                let full = cgroup::scan(t.path(), &layout, at).unwrap();
                let s = usage::measure(&cur, &full, cap);
                black_box(round(&s, &calm))
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
