//! One full audit (expected `cpu.max` + compare, for every pod) on in-memory
//! `PodView`s and `PodCgroup`s: 110, 250 and 500 pods, each with 2 app
//! containers and a sidecar (+ a sandbox cgroup), one pod in ten with a
//! pod-level limit, one in five with a container without a limit.
//!
//! `cargo bench -p headroom-agent --bench audit`

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use headroom::cgroup::{
    CgroupSample, ContainerCgroup, ContainerRole, CpuMax, CpuStat, Driver, PodCgroup, Runtime,
};
use headroom::model::{PodView, Resources};
use headroom::testkit::{PodBuilder, container, cpu, resources, sidecar};
use headroom::verify::{audit, expected_cpu_max};

const PERIOD: u64 = 100_000;

/// CPU as given, memory 64 Mi / 128 Mi.
fn spec(req: u64, lim: Option<u64>) -> Resources {
    resources(Some(req), lim, Some(64 << 20), Some(128 << 20))
}

fn pod(i: usize) -> PodView {
    let unlimited = i.is_multiple_of(5);
    PodBuilder::new(
        &format!("ns{}", i % 7),
        &format!("pod-{i}"),
        &format!("{i:08x}-1111-2222-3333-444455556666"),
    )
    .node("node")
    .containers(vec![
        container("app", spec(100, Some(500 + i as u64))),
        container("worker", spec(50, (!unlimited).then_some(250))),
        sidecar("proxy", spec(20, Some(100))),
    ])
    .pod_resources(i.is_multiple_of(10).then_some(cpu(Some(200), Some(2000))))
    .overhead_cpu(i.is_multiple_of(3).then_some(50))
    .running("containerd", |_, c| {
        format!("{:0>64}", format!("{i}{}", c.name.len()))
    })
    .build()
}

fn max(q: Option<u64>) -> CpuMax {
    CpuMax {
        quota_us: q,
        period_us: PERIOD,
    }
}

/// The tree the kubelet would have written for `p`.
fn cgroup(p: &PodView) -> PodCgroup {
    let e = expected_cpu_max(p, PERIOD);
    let path = PathBuf::from(format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        p.uid.as_str().replace('-', "_")
    ));
    let mut containers: Vec<ContainerCgroup> = e
        .containers
        .iter()
        .map(|c| {
            let id = c.container_id.clone().unwrap_or_default();
            ContainerCgroup {
                path: path.join(format!("cri-containerd-{id}.scope")),
                id,
                runtime: Runtime::Containerd,
                role: ContainerRole::App,
                cpu_max: Ok(max(c.max.quota_us())),
                throttled_usec: None,
            }
        })
        .collect();
    containers.push(ContainerCgroup {
        id: "f".repeat(64),
        runtime: Runtime::Containerd,
        role: ContainerRole::Sandbox,
        path: path.join("cri-containerd-sandbox.scope"),
        cpu_max: Ok(max(None)),
        throttled_usec: None,
    });
    PodCgroup {
        id: p.cgroup_id.clone(),
        qos: p.qos,
        path: path.into(),
        sample: Ok(CgroupSample {
            cpu_max: max(e.pod.quota_us()),
            cpu_stat: CpuStat::default(),
            pressure: None,
            weight: Some(100),
        }),
        containers,
        containers_unlisted: None,
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("audit");
    for n in [110usize, 250, 500] {
        let pods: Vec<PodView> = (0..n).map(pod).collect();
        let mut cgroups: Vec<PodCgroup> = pods.iter().map(cgroup).collect();
        // The scanner returns pods sorted by path, not in API order.
        cgroups.reverse();
        let found = audit(&pods, &cgroups, Driver::Systemd);
        assert!(found.iter().all(|a| a.mismatches.is_empty()));
        assert_eq!(found.len(), n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| audit(black_box(&pods), black_box(&cgroups), Driver::Systemd))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
