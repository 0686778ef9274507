//! The load model: demand → CPU time, CFS throttling counters and PSI, per tick.
//! Pure arithmetic; the caller reads `cpu.max` and writes the resulting files.
//!
//! A container's demand is busy threads of at most one CPU each: ⌈demand / 1000m⌉
//! of them. That is all the model knows of threads, and it matters only for PSI:
//! threads that outnumber the node's CPUs queue behind each other, which the kernel
//! counts as `some` of their cgroup but not as `full` (one of them runs).

/// Input for one container: what its tasks want and its own quota.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContainerIn {
    pub demand_m: f64,
    /// Effective limit from the container's `cpu.max` (None = `max`).
    pub limit_m: Option<f64>,
}

/// Input for one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodIn {
    pub containers: Vec<ContainerIn>,
    /// Limit from the pod cgroup's `cpu.max`.
    pub limit_m: Option<f64>,
    /// The pod cgroup's `cpu.weight`, used to share a contended node.
    pub weight: f64,
}

/// What one container got in a tick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ContainerOut {
    pub demand_m: f64,
    /// CPU it ran, in millicores.
    pub got_m: f64,
    /// Demand its own quota denied (0 when the quota does not bind).
    pub own_throttled_m: f64,
    /// Demand denied by the pod quota.
    pub pod_throttled_m: f64,
    /// Part of the demand the node denied (after quotas) that its own threads
    /// could not have run anyway: they outnumber the CPUs. The rest of what the
    /// node denied it was displaced from, by other pods.
    pub self_queued_m: f64,
}

impl ContainerOut {
    /// Demand its own and its pod's quota denied.
    pub fn throttled_m(&self) -> f64 {
        self.own_throttled_m + self.pod_throttled_m
    }

    /// Demand the node denied after quotas: queued behind its own threads or displaced.
    pub fn node_denied_m(&self) -> f64 {
        (self.demand_m - self.throttled_m() - self.got_m).max(0.0)
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodOut {
    pub containers: Vec<ContainerOut>,
    /// Sum of container demand after container quotas, the load on the pod quota.
    pub capped_m: f64,
}

/// Shares `capacity_m` over the pods: container quota, then pod quota, then the
/// node by water-filling on pod weight (CFS gives each runnable group CPU in
/// proportion to weight, and what a group does not use goes to the others).
/// `cpus` is the node's online CPUs; `capacity_m` may be less (a kubepods
/// quota, or what the node's own processes leave). A container's threads
/// beyond `cpus` queue behind each other (`self_queued_m`): they are never
/// runnable on a CPU, so neither its quota nor the node sees them.
pub fn allocate(pods: &[PodIn], capacity_m: f64, cpus: u64) -> Vec<PodOut> {
    let mut outs: Vec<PodOut> = pods.iter().map(|p| quota_capped(p, cpus)).collect();
    let wants: Vec<f64> = outs
        .iter()
        .map(|p| p.containers.iter().map(|c| c.got_m).sum())
        .collect();
    let grants = water_fill(
        &wants,
        &pods.iter().map(|p| p.weight.max(1.0)).collect::<Vec<_>>(),
        capacity_m.max(0.0),
    );
    for ((out, want), grant) in outs.iter_mut().zip(&wants).zip(&grants) {
        if *want > 0.0 && grant < want {
            let k = grant / want;
            for c in &mut out.containers {
                c.got_m *= k;
            }
        }
    }
    outs
}

/// What the fluid model cannot give: pods that wait though within their
/// weight's share. `shares[i]` is the part of pod `i`'s grant it cedes to
/// the other pods that still want CPU (their demand after quotas beyond
/// what they got): only as much as they can take, so nothing is ceded while
/// the node has idle CPU (every pod then got what it wanted) or nobody else
/// wants more. The ceded CPU goes to them by weight ([`water_fill`]), and
/// within a pod to its containers by what each still wants. What a pod
/// cedes is node-denied demand not queued behind its own threads: it shows
/// as displacement (`full`, [`container_stall`]).
///
/// The real kernel does this: on the real nodes a one-thread pod within its
/// request beside a four-thread burster waited 21–25 % of the time
/// (tests/data/real-node-attribution.txt, phase `displaced`), where water-
/// filling by weight gives it all it wants. The simulator applies it only
/// where a test asks ([`super::SimKubelet::set_cede`]).
pub fn cede(pods: &[PodIn], outs: &mut [PodOut], shares: &[f64]) {
    for i in 0..outs.len() {
        let share = shares.get(i).copied().unwrap_or(0.0).clamp(0.0, 1.0);
        let got: f64 = outs[i].containers.iter().map(|c| c.got_m).sum();
        if share <= 0.0 || got <= 0.0 {
            continue;
        }
        // What every other pod still wants: denied, not self-queued.
        let room = |o: &PodOut| -> f64 {
            o.containers
                .iter()
                .map(|c| (c.node_denied_m() - c.self_queued_m).max(0.0))
                .sum()
        };
        let rooms: Vec<f64> = outs
            .iter()
            .enumerate()
            .map(|(j, o)| if j == i { 0.0 } else { room(o) })
            .collect();
        let taken = (share * got).min(rooms.iter().sum());
        if taken <= 1e-9 {
            continue;
        }
        let weights: Vec<f64> = pods.iter().map(|p| p.weight.max(1.0)).collect();
        let grants = water_fill(&rooms, &weights, taken);
        let keep = (got - taken) / got;
        for c in &mut outs[i].containers {
            c.got_m *= keep;
        }
        for (o, (grant, r)) in outs.iter_mut().zip(grants.iter().zip(&rooms)) {
            if *grant <= 0.0 || *r <= 0.0 {
                continue;
            }
            for c in &mut o.containers {
                let want = (c.node_denied_m() - c.self_queued_m).max(0.0);
                c.got_m += grant * want / r;
            }
        }
    }
}

/// One pod under its own quotas only: each container's threads as far as
/// the CPUs run them at once, then its quota, then the pod's, which scales
/// the containers down in proportion. On a real node a pod with 4 busy
/// threads and a 1890m limit on 2 CPUs was throttled 0.7 % of the time, not
/// the 53 % a 4000m demand against the quota would give.
fn quota_capped(p: &PodIn, cpus: u64) -> PodOut {
    let mut cs: Vec<ContainerOut> = p
        .containers
        .iter()
        .map(|c| {
            let d = c.demand_m.max(0.0);
            let parallel = d.min(cpus.max(1) as f64 * 1000.0);
            let capped = c.limit_m.map_or(parallel, |l| parallel.min(l.max(0.0)));
            ContainerOut {
                demand_m: d,
                got_m: capped,
                own_throttled_m: parallel - capped,
                self_queued_m: d - parallel,
                ..ContainerOut::default()
            }
        })
        .collect();
    let capped: f64 = cs.iter().map(|c| c.got_m).sum();
    if let Some(l) = p.limit_m
        && capped > l
        && capped > 0.0
    {
        let k = l.max(0.0) / capped;
        for c in &mut cs {
            let g = c.got_m * k;
            c.pod_throttled_m = c.got_m - g;
            c.got_m = g;
        }
    }
    PodOut {
        containers: cs,
        capped_m: capped,
    }
}

/// Max-min fair share of `capacity` over `wants`, weighted.
pub fn water_fill(wants: &[f64], weights: &[f64], capacity: f64) -> Vec<f64> {
    let mut grant = vec![0.0; wants.len()];
    let mut open: Vec<usize> = (0..wants.len()).filter(|&i| wants[i] > 0.0).collect();
    let mut left = capacity;
    while !open.is_empty() && left > 1e-9 {
        let wsum: f64 = open.iter().map(|&i| weights[i]).sum();
        let mut satisfied = Vec::new();
        for &i in &open {
            let share = left * weights[i] / wsum;
            if wants[i] - grant[i] <= share {
                satisfied.push(i);
            }
        }
        if satisfied.is_empty() {
            for &i in &open {
                grant[i] += left * weights[i] / wsum;
            }
            break;
        }
        for &i in &satisfied {
            left -= wants[i] - grant[i];
            grant[i] = wants[i];
        }
        open.retain(|i| !satisfied.contains(i));
    }
    grant
}

/// PSI of a container's cgroup in a tick, as shares of the CPU time its threads
/// were runnable on a CPU: `runnable = demand − self_queued` (threads beyond the
/// CPUs wait on a CPU another of its threads holds; the kernel averages over the
/// CPUs the cgroup is on).
///
/// - `full` = (displaced + `throttle_weight` × throttled) / runnable: no thread of
///   it runs while others hold its CPUs or a quota holds it back (the kernel counts
///   throttled tasks as stalled: 0.84–0.87 of the throttled time showed on a real
///   node).
/// - `some` = `full` + (1 − `full`) × [`SELF_QUEUE_PSI`] × min(1, self_queued /
///   runnable): also while one of its threads runs and another waits behind it,
///   which is never `full`.
///
/// One thread never self-queues: `some` = `full` = (displaced + weight ×
/// throttled) / demand.
pub fn container_stall(c: &ContainerOut, throttle_weight: f64) -> Stall {
    if c.demand_m <= 0.0 {
        return Stall::default();
    }
    let runnable = c.demand_m - c.self_queued_m;
    if runnable <= 0.0 {
        // Only its own queue (not from `allocate`, which leaves a CPU's worth).
        return Stall {
            some: 1.0,
            full: 0.0,
        };
    }
    let displaced = c.node_denied_m() - c.self_queued_m;
    let full = ((displaced + throttle_weight * c.throttled_m()) / runnable).clamp(0.0, 1.0);
    let queued = (c.self_queued_m / runnable).min(1.0);
    Stall {
        some: (full + (1.0 - full) * SELF_QUEUE_PSI * queued).clamp(0.0, 1.0),
        full,
    }
}

/// The share of the time a pod whose threads outnumber the CPUs has one of
/// them waiting behind another: on the real nodes 4 and 8 busy threads on 2
/// CPUs read `some` 81–98 % (docs/kubelet-behaviour.md §8; parity test
/// `per_pod_psi_matches_the_real_kernel_for_queued_and_displaced_threads`),
/// not 100 %.
pub const SELF_QUEUE_PSI: f64 = 0.9;

/// One busy-or-idle member of a PSI group: its demand and stall.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Member {
    pub demand_m: f64,
    pub some: f64,
    pub full: f64,
}

/// PSI stall fractions of a cgroup in a tick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stall {
    /// Share of time at least one task stalled.
    pub some: f64,
    /// Share of time every busy task stalled.
    pub full: f64,
}

/// PSI `some`/`full` of a group from its members', members assumed independent:
/// some = P(at least one has a waiting thread) = 1 − Π(1 − someᵢ), full = P(every
/// busy one is wholly stalled) = Π fullᵢ.
pub fn group_stall(members: &[Member]) -> Stall {
    let busy: Vec<&Member> = members.iter().filter(|m| m.demand_m > 0.0).collect();
    if busy.is_empty() {
        return Stall::default();
    }
    let none = busy.iter().fold(1.0, |acc, m| acc * (1.0 - m.some));
    let all = busy.iter().fold(1.0, |acc, m| acc * m.full);
    Stall {
        some: 1.0 - none,
        full: all,
    }
}

/// Running averages like the kernel's avg10/avg60/avg300, as fractions.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Averages {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_us: f64,
}

impl Averages {
    /// Exponential decay toward `stall` over `dt_s`, like the kernel's periodic
    /// `avg = avg·e + sample·(1−e)`, done continuously.
    pub fn advance(&mut self, stall: f64, dt_s: f64) {
        let step = |avg: &mut f64, window: f64| {
            let e = (-dt_s / window).exp();
            *avg = *avg * e + stall * (1.0 - e);
        };
        step(&mut self.avg10, 10.0);
        step(&mut self.avg60, 60.0);
        step(&mut self.avg300, 300.0);
        self.total_us += stall * dt_s * 1e6;
    }
}

/// The demand on a finite CFS quota in a tick and the quota's limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaLoad {
    pub load_m: f64,
    pub limit_m: f64,
}

/// `cpu.stat` counters and `cpu.pressure` state of one cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CgroupCounters {
    pub usage_us: f64,
    pub nr_periods: f64,
    pub nr_throttled: f64,
    pub throttled_us: f64,
    pub some: Averages,
    pub full: Averages,
}

impl CgroupCounters {
    /// One tick: `got_m` ran for `dt_us`; `quota` is the load on this cgroup's
    /// quota when the cgroup has a finite one.
    pub fn advance(
        &mut self,
        dt_us: f64,
        period_us: f64,
        got_m: f64,
        quota: Option<QuotaLoad>,
        stall: Stall,
    ) {
        self.usage_us += got_m / 1000.0 * dt_us;
        if let Some(QuotaLoad { load_m, limit_m }) = quota
            && load_m > 0.0
            && period_us > 0.0
        {
            let periods = dt_us / period_us;
            self.nr_periods += periods;
            if load_m > limit_m {
                self.nr_throttled += periods;
                // One run queue's view: the share of each period spent throttled.
                self.throttled_us += dt_us * (1.0 - limit_m / load_m).clamp(0.0, 1.0);
            }
        }
        self.some.advance(stall.some, dt_us / 1e6);
        self.full.advance(stall.full, dt_us / 1e6);
    }

    /// `cpu.stat` file content (user/system split 9:1).
    pub fn cpu_stat(&self) -> String {
        let usage = self.usage_us as u64;
        let system = usage / 10;
        format!(
            "usage_usec {usage}\nuser_usec {}\nsystem_usec {system}\nnr_periods {}\nnr_throttled {}\nthrottled_usec {}\nnr_bursts 0\nburst_usec 0\n",
            usage - system,
            self.nr_periods as u64,
            self.nr_throttled as u64,
            self.throttled_us as u64,
        )
    }

    /// `cpu.pressure` file content.
    pub fn cpu_pressure(&self) -> String {
        let line = |name: &str, a: &Averages| {
            format!(
                "{name} avg10={:.2} avg60={:.2} avg300={:.2} total={}\n",
                a.avg10 * 100.0,
                a.avg60 * 100.0,
                a.avg300 * 100.0,
                a.total_us as u64
            )
        };
        format!("{}{}", line("some", &self.some), line("full", &self.full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(demands: &[(f64, Option<f64>)], limit: Option<f64>, weight: f64) -> PodIn {
        PodIn {
            containers: demands
                .iter()
                .map(|&(demand_m, limit_m)| ContainerIn { demand_m, limit_m })
                .collect(),
            limit_m: limit,
            weight,
        }
    }

    #[test]
    fn container_limit_caps_and_counts_throttle() {
        let out = allocate(&[pod(&[(800.0, Some(500.0))], None, 10.0)], 4000.0, 4);
        let c = out[0].containers[0];
        assert_eq!(c.got_m, 500.0);
        assert_eq!(c.own_throttled_m, 300.0);
    }

    #[test]
    fn pod_limit_scales_containers() {
        let out = allocate(
            &[pod(&[(400.0, None), (400.0, None)], Some(400.0), 10.0)],
            4000.0,
            4,
        );
        assert_eq!(out[0].containers[0].got_m, 200.0);
        assert_eq!(out[0].containers[1].pod_throttled_m, 200.0);
    }

    #[test]
    fn contention_water_fills_by_weight() {
        let pods = [
            pod(&[(3000.0, None)], None, 10.0),
            pod(&[(3000.0, None)], None, 30.0),
            pod(&[(100.0, None)], None, 4.0),
        ];
        let out = allocate(&pods, 2100.0, 3);
        let got: Vec<f64> = out.iter().map(|p| p.containers[0].got_m).collect();
        assert!((got[2] - 100.0).abs() < 1e-6);
        assert!((got[0] - 500.0).abs() < 1e-6);
        assert!((got[1] - 1500.0).abs() < 1e-6);
    }

    #[test]
    fn throttling_stalls_less_than_contention() {
        let throttled = ContainerOut {
            demand_m: 1000.0,
            got_m: 500.0,
            own_throttled_m: 500.0,
            ..ContainerOut::default()
        };
        let contended = ContainerOut {
            demand_m: 1000.0,
            got_m: 500.0,
            ..ContainerOut::default()
        };
        let t = container_stall(&throttled, 0.25);
        let c = container_stall(&contended, 0.25);
        assert!((t.full - 0.125).abs() < 1e-9 && t.some == t.full);
        assert!((c.full - 0.5).abs() < 1e-9 && c.some == c.full);
        let member = |demand_m, stall| Member {
            demand_m,
            some: stall,
            full: stall,
        };
        let Stall { some, full } =
            group_stall(&[member(1.0, 0.5), member(1.0, 0.5), member(0.0, 1.0)]);
        assert!((some - 0.75).abs() < 1e-9 && (full - 0.25).abs() < 1e-9);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Stall of each container of each pod on a node of `capacity_m` over
    /// `capacity_m / 1000` CPUs, at the default throttle weight.
    fn stalls(pods: &[PodIn], capacity_m: f64) -> Vec<Vec<Stall>> {
        let cpus = (capacity_m / 1000.0).ceil() as u64;
        allocate(pods, capacity_m, cpus)
            .iter()
            .map(|p| {
                p.containers
                    .iter()
                    .map(|c| container_stall(c, 0.85))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn lone_pod_threads_beyond_the_cpus_are_some_not_full() {
        let q = SELF_QUEUE_PSI;
        for (demand, some) in [(2000.0, 0.0), (3000.0, 0.5 * q), (4000.0, q), (8000.0, q)] {
            let s = stalls(&[pod(&[(demand, None)], None, 10.0)], 2000.0)[0][0];
            assert!(
                close(s.some, some) && close(s.full, 0.0),
                "{demand}m: {s:?}"
            );
            let g = group_stall(&[Member {
                demand_m: demand,
                some: s.some,
                full: s.full,
            }]);
            assert!(
                close(g.some, s.some) && close(g.full, s.full),
                "a pod of one container reads as the container: {g:?} {s:?}"
            );
        }
    }

    /// A single thread throttled at its own limit on an idle node: some = full =
    /// weight × throttled share, as before threads were modelled.
    #[test]
    fn single_thread_throttled_at_its_limit_is_unchanged() {
        let out = allocate(&[pod(&[(1000.0, Some(300.0))], None, 10.0)], 2000.0, 2);
        let c = out[0].containers[0];
        assert_eq!(c.self_queued_m, 0.0);
        let s = container_stall(&c, 0.85);
        assert!(close(s.full, 0.85 * 0.7) && s.some == s.full, "{s:?}");
    }

    /// Beside a 4-thread pod on 2 CPUs a single-threaded neighbour's `full` is
    /// the share of its demand it was denied: none within its weight's share,
    /// half when it wants twice that. The 4-thread pod is displaced by what the
    /// neighbour took of the CPUs it could run on (`full`) and queues behind its
    /// own threads the rest of the time (`some` 1).
    #[test]
    fn neighbour_of_a_many_threaded_pod_is_displaced_by_its_denied_share() {
        // Weights 1:3 share 2000m as 500m:1500m.
        for (demand, denied) in [(400.0, 0.0), (500.0, 0.0), (1000.0, 0.5)] {
            let pods = [
                pod(&[(demand, None)], None, 1.0),
                pod(&[(4000.0, None)], None, 3.0),
            ];
            let out = allocate(&pods, 2000.0, 2);
            let n = out[0].containers[0];
            assert_eq!(n.self_queued_m, 0.0);
            assert!(close(n.node_denied_m() / n.demand_m, denied));
            let ns = container_stall(&n, 0.85);
            assert!(
                close(ns.full, denied) && ns.some == ns.full,
                "{demand}m: {ns:?}"
            );
            let h = out[1].containers[0];
            let hs = container_stall(&h, 0.85);
            let took = n.got_m / 2000.0;
            assert!(close(h.self_queued_m, 2000.0), "{h:?}");
            assert!(
                close(hs.full, took) && close(hs.some, took + (1.0 - took) * SELF_QUEUE_PSI),
                "{demand}m: {hs:?}"
            );
        }
    }

    /// Two single-threaded pods sharing one CPU stall exactly as before: what
    /// each was denied is displacement, `some` = `full`.
    #[test]
    fn single_threads_sharing_a_cpu_are_displaced_as_before() {
        let s = stalls(
            &[
                pod(&[(1000.0, None)], None, 10.0),
                pod(&[(1000.0, None)], None, 10.0),
            ],
            1000.0,
        );
        for p in &s {
            assert!(close(p[0].full, 0.5) && p[0].some == p[0].full, "{p:?}");
        }
    }

    /// A pod within its share that cedes 40 % on a full node waits that
    /// much (`full`), and its neighbour runs it; on a node with idle CPU,
    /// or beside a neighbour at its own limit, nothing is ceded.
    #[test]
    fn a_ceding_pod_is_displaced_only_by_a_neighbour_that_takes_the_cpu() {
        let pods = [
            pod(&[(400.0, None)], None, 20.0),
            pod(&[(1000.0, Some(1000.0))], None, 10.0),
        ];
        let mut out = allocate(&pods, 1000.0, 1);
        assert!(close(out[0].containers[0].got_m, 400.0));
        cede(&pods, &mut out, &[0.4, 0.0]);
        let (s, b) = (out[0].containers[0], out[1].containers[0]);
        assert!(
            close(s.got_m, 240.0) && close(b.got_m, 760.0),
            "{s:?} {b:?}"
        );
        let st = container_stall(&s, 0.85);
        assert!(close(st.full, 0.4) && close(st.some, 0.4), "{st:?}");
        // The neighbour held at 600m by its limit takes nothing more.
        let capped = [pods[0].clone(), pod(&[(1000.0, Some(600.0))], None, 10.0)];
        let mut out = allocate(&capped, 1000.0, 1);
        cede(&capped, &mut out, &[0.4, 0.0]);
        assert!(close(out[0].containers[0].got_m, 400.0), "{out:?}");
        // Idle CPU: nobody wants more.
        let mut out = allocate(&pods, 2000.0, 2);
        cede(&pods, &mut out, &[0.4, 0.0]);
        assert!(close(out[0].containers[0].got_m, 400.0), "{out:?}");
    }

    #[test]
    fn averages_converge_and_stat_text_is_kernel_shaped() {
        let mut c = CgroupCounters::default();
        for _ in 0..600 {
            c.advance(
                100_000.0,
                100_000.0,
                500.0,
                Some(QuotaLoad {
                    load_m: 800.0,
                    limit_m: 500.0,
                }),
                Stall {
                    some: 1.0,
                    full: 0.5,
                },
            );
        }
        assert!(c.some.avg10 > 0.99 && c.some.avg300 < c.some.avg60);
        assert_eq!(c.nr_periods as u64, 600);
        assert_eq!(c.nr_throttled as u64, 600);
        assert!(
            c.cpu_stat()
                .starts_with("usage_usec 30000000\nuser_usec 27000000\n")
        );
        assert!(c.cpu_pressure().starts_with("some avg10=99.75 avg60="));
        assert!(c.cpu_pressure().contains("\nfull avg10="));
    }
}
