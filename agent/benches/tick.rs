//! One whole steady tick of the agent (`Agent::tick`: views, eligibility,
//! the light rescan, the signal, the round, verification, metrics) on a
//! calm node of 110, 250 and 500 pods, half of them managed
//! ([`headroom::testkit::calm_node`]). The tree is tmpfs-like (files opened
//! and read each tick, no kept handles), so the kernel's part is larger
//! than on cgroupfs; what this bench compares is the agent's own work,
//! build against build, in one run.
//!
//! `cargo bench -p headroom-agent --bench tick` (`TICK_PODS=250`: one size)

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use headroom::testkit::calm_node::CalmNode;

fn tick(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("tick");
    g.measurement_time(Duration::from_secs(8));
    // TICK_PODS=250 builds only that node (for a profiler: the trees of
    // the others are thousands of files to write).
    let counts: Vec<usize> = std::env::var("TICK_PODS")
        .unwrap_or_else(|_| "110,250,500".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for n in counts {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut node = CalmNode::new(dir.path(), n);
        // The first tick has no rates; the second decides; steady after.
        rt.block_on(async {
            for _ in 0..3 {
                node.tick().await;
            }
        });
        g.bench_function(BenchmarkId::new("steady", n), |b| {
            b.iter(|| rt.block_on(node.tick()).expect("a round"));
        });
    }
    g.finish();
}

criterion_group!(benches, tick);
criterion_main!(benches);
