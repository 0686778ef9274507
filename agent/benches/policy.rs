//! One policy round (decide + plan) for 110, 250 and 500 pods.
//!
//! `cargo bench -p headroom-agent --bench policy`. Pods: 70% container-level
//! (1–3 containers, some memory-equal so the QoS guard is exercised), 20%
//! pod-level, 10% unmanaged (Guaranteed or not opted in). The node has 64
//! cores and half of it is used, so the water-filling runs its stepping path
//! (slack below Σ ceilings) rather than the all-at-ceiling shortcut. Prints
//! median and p99 per round and the median per pod. `HEADROOM_BENCH_USAGE_M`
//! (comma-separated millicores, default `32000`) picks other node loads.

use std::hint::black_box;
use std::time::{Duration, Instant};

use headroom::model::{ContainerSpec, PodView};
use headroom::policy::{self, NodeInputs, PodInput, PolicyConfig, TokenBucket};
use headroom::testkit::{self, PodBuilder, pod_input, resources};

const MI: u64 = 1 << 20;

fn container(i: usize, req: u64, lim: u64, mem_equal: bool) -> ContainerSpec {
    let mem_limit = if mem_equal { 64 * MI } else { 128 * MI };
    testkit::container(
        &format!("c{i}"),
        resources(Some(req), Some(lim), Some(64 * MI), Some(mem_limit)),
    )
}

fn pods(n: usize) -> Vec<PodView> {
    (0..n)
        .map(|i| {
            let req = 50 + (i as u64 * 37) % 950;
            let nc = 1 + i % 3;
            let containers = if i % 10 == 8 {
                // Guaranteed.
                vec![testkit::container(
                    "c0",
                    resources(Some(req), Some(req), Some(MI), Some(MI)),
                )]
            } else {
                (0..nc)
                    .map(|c| container(c, req, req * 2, i % 5 == 0))
                    .collect()
            };
            let pod_resources = (i % 10 < 2).then(|| {
                let total = req * nc as u64;
                resources(Some(total), Some(total * 3), Some(256 * MI), Some(512 * MI))
            });
            let uid = format!(
                "{:08x}-uid",
                (i as u64).wrapping_mul(2654435761) % (1 << 32)
            );
            let mut b = PodBuilder::new("bench", &format!("p{i}"), &uid)
                .node("node")
                .containers(containers)
                .pod_resources(pod_resources);
            if i % 10 != 9 {
                b = b.managed();
            }
            b.qos_from_spec().build()
        })
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let cfg = PolicyConfig::default();
    println!("policy round (decide + plan), 64-core node");
    let usage_levels: Vec<u64> = std::env::var("HEADROOM_BENCH_USAGE_M")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or(vec![32_000]);
    for usage in usage_levels {
        for n in [110usize, 250, 500] {
            let views = pods(n);
            let inputs: Vec<PodInput> = views
                .iter()
                .enumerate()
                .map(|(i, p)| pod_input(p, (i as u64 * 53) % 400))
                .collect();
            let node = NodeInputs {
                node_name: "node",
                capacity_m: 64_000,
                kubepods_usage_m: usage,
                contention: Default::default(),
                pod_level_resize_supported: Some(true),
                wall_clock_s: 0,
            };
            let iters = 2000;
            let mut samples = Vec::with_capacity(iters);
            let mut patches = 0;
            let mut managed = 0;
            for k in 0..iters + 100 {
                let mut bucket = TokenBucket::from_config(&cfg);
                let t0 = Instant::now();
                let (nd, ds) = policy::decide(black_box(&node), black_box(&inputs), &cfg);
                let out = policy::plan(&nd, &ds, |_| None, 0.0, &mut bucket, &cfg);
                let dt = t0.elapsed();
                if k >= 100 {
                    samples.push(dt);
                }
                patches = out.patches.len() + out.held.len();
                managed = nd.managed_pods;
                black_box(out);
            }
            samples.sort();
            let med = percentile(&samples, 0.5);
            println!(
                "  usage {usage:>5}m {n:>3} pods ({managed} managed, {patches} wanting a patch): median {:>7.1} µs, p99 {:>7.1} µs, {:>5.0} ns/pod",
                med.as_secs_f64() * 1e6,
                percentile(&samples, 0.99).as_secs_f64() * 1e6,
                med.as_secs_f64() * 1e9 / n as f64,
            );
        }
    }
}
