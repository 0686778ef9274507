//! Tests across the policy: `decide` (eligibility, floors, slack and
//! water-filling together), and the property tests of the issue over
//! `decide` + `plan`. Each part's own tests sit beside it; the fixtures
//! they share are in [`fixtures`].

use proptest::prelude::*;

use super::*;
use crate::model::{
    ANN_ADOPT, ANN_CEILING, ContainerSpec, Millis, PodView, ResizePolicy, compute_qos,
};

pub(super) mod fixtures;
use fixtures::*;

#[test]
fn declared_limit_comes_from_the_pod_until_headroom_sets_it() {
    let p = simple("d", 10, Some(100));
    let shape = eligibility(&p, &ctx(Some(true))).expect("managed");
    // Limits not Headroom's: they are the declared ones.
    assert_eq!(declared_limit(&p, &shape, None), Some(100));
    let mut known = crate::model::DeclaredLimits::of(&p);
    let mut r = p.clone();
    r.limits_set_by_headroom = true;
    r.containers[0].resources.cpu_limit = Some(30);
    let shape = eligibility(&r, &ctx(Some(true))).expect("managed");
    // Headroom's: what the caller knows (memory or the owner's template)...
    assert_eq!(declared_limit(&r, &shape, Some(&known)), Some(100));
    // ...or, knowing nothing, the limit as it is now.
    assert_eq!(declared_limit(&r, &shape, None), Some(30));
    // A template that lacks the container (an injected sidecar) declares none.
    known.containers.clear();
    assert_eq!(declared_limit(&r, &shape, Some(&known)), None);
}

#[test]
fn opting_in_on_an_idle_node_never_lowers_a_declared_limit() {
    // Request 10m, limit 100m: 4 × request is 40m, below what the workload declares.
    let p = simple("idle", 10, Some(100));
    let inputs = [PodInput {
        namespace_opted_in: true,
        ..input(&p, 0)
    }];
    let (n, ds) = decide(&node(4000, 0, 0), &inputs, &PolicyConfig::default());
    assert_eq!(ds[0].ceiling_m(), Some(100));
    assert_eq!(ds[0].target_m(), Some(100));
    let mut bucket = TokenBucket::new(100.0, 100);
    let out = plan(
        &n,
        &ds,
        |_| None,
        0.0,
        &mut bucket,
        &PolicyConfig::default(),
    );
    assert!(out.patches.is_empty(), "{:?}", out.patches);
}

fn full_pressure_target(
    p: &PodView,
    known: Option<&crate::model::DeclaredLimits>,
    floor: FloorMode,
) -> (Option<Millis>, Floor) {
    let cfg = PolicyConfig {
        floor,
        ..PolicyConfig::default()
    };
    let inputs = [PodInput {
        declared: known,
        ..input(p, 150)
    }];
    // More owed to displaced pods than the slack: none left.
    let (_, ds) = decide(&node(2000, 1900, 10_000), &inputs, &cfg);
    (ds[0].target_m(), ds[0].managed().expect("managed").floor)
}

#[test]
fn floor_request_lowers_a_declared_limit_to_the_request_under_full_pressure() {
    let p = simple("d", 200, Some(300));
    let (target, f) = full_pressure_target(&p, None, FloorMode::Request);
    assert_eq!(target, Some(200));
    assert!(!f.declared_bound);
}

#[test]
fn floor_declared_keeps_the_declared_limit_under_full_pressure() {
    let p = simple("d", 200, Some(300));
    let (target, f) = full_pressure_target(&p, None, FloorMode::Declared);
    assert_eq!(target, Some(300));
    assert_eq!(f.floor_m, 300);
    assert!(f.declared_bound);
    // Raised by Headroom to 800m, the declaration known (memory or template):
    // it comes back down to 300m, not to the request and not to 800m.
    let known = crate::model::DeclaredLimits::of(&p);
    let mut raised = p.clone();
    raised.limits_set_by_headroom = true;
    raised.containers[0].resources.cpu_limit = Some(800);
    let (target, _) = full_pressure_target(&raised, Some(&known), FloorMode::Declared);
    assert_eq!(target, Some(300));
}

#[test]
fn floor_declared_never_takes_the_current_limit_for_an_unknown_declaration() {
    // Raised by Headroom, nothing known of the declaration (no owner, agent
    // restarted): the current 800m must not become a floor it can never leave.
    let mut raised = simple("d", 200, Some(800));
    raised.limits_set_by_headroom = true;
    let (target, f) = full_pressure_target(&raised, None, FloorMode::Declared);
    assert_eq!(target, Some(200));
    assert!(!f.declared_bound);
}

#[test]
fn floor_declared_falls_back_to_the_request_for_an_adopted_pod_without_a_limit() {
    let mut p = simple("adopted", 200, None);
    p.annotations.insert(ANN_ADOPT.into(), "true".into());
    let (target, f) = full_pressure_target(&p, None, FloorMode::Declared);
    assert_eq!(f.floor_m, 200);
    assert_eq!(target, Some(200));
}

#[test]
fn a_pod_in_a_resize_keeps_its_own_burst_out_of_other_usage() {
    let cfg = PolicyConfig::default();
    let a = simple("a", 100, Some(200));
    let mut busy = simple("busy", 200, Some(800));
    // busy uses 700m: 500m above its request.
    let round = |busy: &PodView| {
        let (n, _) = decide(&node(4000, 700, 0), &[input(&a, 0), input(busy, 700)], &cfg);
        n.raw_slack_m
    };
    let managed = round(&busy);
    busy.resize.in_progress = Some(String::new());
    let in_flight = round(&busy);
    assert_eq!(
        in_flight, managed,
        "slack must not drop while busy's resize is in flight"
    );
    // A pod that is really unmanaged (opted out) counts in full.
    busy.resize.in_progress = None;
    busy.annotations
        .insert(crate::model::ANN_MANAGED.into(), "false".into());
    assert_eq!(round(&busy), managed - 500);
}

#[test]
fn idle_node_gives_ceilings() {
    let a = simple("a", 100, Some(200));
    let b = simple("b", 250, Some(300));
    let (n, ds) = decide(
        &node(4000, 50, 0),
        &[input(&a, 10), input(&b, 10)],
        &PolicyConfig::default(),
    );
    assert_eq!(ds[0].target_m(), Some(400));
    assert_eq!(ds[1].target_m(), Some(1000));
    assert_eq!(n.managed_pods, 2);
    assert_eq!(n.allocated_m, 300 + 750);
}

#[test]
fn full_node_gives_floors() {
    let a = simple("a", 100, Some(400));
    let (n, ds) = decide(
        &node(4000, 4000, 0),
        &[input(&a, 50)],
        &PolicyConfig::default(),
    );
    assert_eq!(n.slack_m, 0);
    assert_eq!(ds[0].target_m(), Some(100));
    assert_eq!(ds[0].managed().unwrap().share_m, 0);
}

#[test]
fn contention_pressure_lowers_targets() {
    let a = simple("a", 100, Some(400));
    let cfg = PolicyConfig::default();
    let calm = decide(&node(4000, 3700, 0), &[input(&a, 50)], &cfg).1[0].target_m();
    let hot = decide(&node(4000, 3700, 10_000), &[input(&a, 50)], &cfg);
    assert_eq!(calm, Some(300));
    assert_eq!(hot.0.slack_m, 0);
    assert_eq!(hot.1[0].target_m(), Some(100));
}

#[test]
fn unmanaged_pods_get_reasons_and_no_target() {
    let g = pod(
        "g",
        vec![container("c", res(Some(1), Some(1), Some(1), Some(1)))],
    );
    let (n, ds) = decided(&g, 4000, 0, 0);
    assert_eq!(n.managed_pods, 0);
    assert_eq!(ds[0].reason(), Some(Unmanaged::Guaranteed));
    assert_eq!(ds[0].target_m(), None);
}

#[test]
fn container_level_split_by_request() {
    let p = pod(
        "two",
        vec![
            container("a", res(Some(100), Some(150), None, None)),
            container("b", res(Some(300), Some(450), None, None)),
        ],
    );
    let (_, ds) = decided(&p, 100_000, 0, 0);
    let d = &ds[0];
    assert_eq!(d.target_m(), Some(1600));
    let parts: Vec<(&str, Millis)> = d
        .managed()
        .unwrap()
        .containers
        .iter()
        .map(|c| (&*c.name, c.target_m))
        .collect();
    assert_eq!(parts, [("a", 400), ("b", 1200)]);
}

#[test]
fn decision_serializes_for_explain() {
    let a = simple("a", 100, Some(200));
    let (n, ds) = decided(&a, 4000, 0, 0);
    let j = serde_json::to_value((&n, &ds)).unwrap();
    assert_eq!(j[1][0]["level"], "containers");
    assert_eq!(j[1][0]["floor"]["floor_m"], 100);
    assert_eq!(j[0]["slack_m"], 3900);
}

fn arb_container(i: usize) -> impl Strategy<Value = ContainerSpec> {
    (
        1u64..3000,
        proptest::option::weighted(0.8, 0u64..3000),
        proptest::option::of(1u64..4),
        0u64..3,
        any::<bool>(),
    )
        .prop_map(move |(req, extra, mem_req, mem_extra, restart)| {
            let mem_req = mem_req.map(|m| m * MI);
            let mut c = container(
                &format!("c{i}"),
                res(
                    Some(req),
                    extra.map(|e| req + e),
                    mem_req,
                    mem_req.map(|m| m + mem_extra * MI),
                ),
            );
            if restart && extra.is_none() {
                c.cpu_resize_policy = ResizePolicy::RestartContainer;
            }
            c
        })
}

fn arb_pod(i: usize) -> impl Strategy<Value = PodView> {
    (
        proptest::collection::vec(0usize..3, 1..4),
        any::<bool>(),
        proptest::option::weighted(0.3, (1u64..2000, 0u64..3000, 1u64..4, 0u64..3)),
        proptest::option::weighted(0.2, 1u64..10_000),
    )
        .prop_flat_map(move |(cs, adopt, pl, ceiling)| {
            let n = cs.len();
            (
                (0..n).map(arb_container).collect::<Vec<_>>(),
                Just((adopt, pl, ceiling)),
            )
        })
        .prop_map(move |(containers, (adopt, pl, ceiling))| {
            let mut p = pod(&format!("p{i}"), containers);
            if adopt {
                p.annotations.insert(ANN_ADOPT.into(), "true".into());
            }
            if let Some(c) = ceiling {
                p.annotations.insert(ANN_CEILING.into(), format!("{c}m"));
            }
            if let Some((req, extra, mem, mem_extra)) = pl {
                let largest = p
                    .containers
                    .iter()
                    .filter_map(|c| c.resources.cpu_limit)
                    .max()
                    .unwrap_or(0);
                p = with_pod_level(
                    p,
                    res(
                        Some(req),
                        Some((req + extra).max(largest)),
                        Some(mem * MI),
                        Some((mem + mem_extra) * MI),
                    ),
                );
            }
            p
        })
}

fn arb_pods() -> impl Strategy<Value = Vec<PodView>> {
    (1usize..8).prop_flat_map(|n| (0..n).map(arb_pod).collect::<Vec<_>>())
}

fn run(
    pods: &[PodView],
    capacity_m: Millis,
    usage_m: Millis,
    owed_m: Millis,
    reserve_m: Millis,
) -> (NodeDecision, Vec<Decision>) {
    let cfg = PolicyConfig {
        reserve_m,
        ..Default::default()
    };
    let inputs: Vec<PodInput> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| PodInput {
            pod: p,
            namespace_opted_in: false,
            usage_m: (i as Millis * 37) % 500,
            throttled_ratio: 0.0,
            extra_floor_m: None,
            declared: None,
            held_at_m: None,
        })
        .collect();
    decide(&node(capacity_m, usage_m, owed_m), &inputs, &cfg)
}

/// Applies a plan to a copy of the pod, as the apiserver would.
fn apply(p: &PodView, pp: &PatchPlan) -> PodView {
    let mut p = p.clone();
    // The apiserver records the agent as the limits' field manager.
    p.limits_set_by_headroom = true;
    match &pp.kind {
        PatchKind::PodLimit(m) => {
            if let Some(r) = p.pod_resources.as_mut() {
                r.cpu_limit = Some(*m);
            }
        }
        PatchKind::ContainerLimits(cs) => {
            for (name, m) in cs {
                if let Some(c) = p.containers.iter_mut().find(|c| *c.name == **name) {
                    c.resources.cpu_limit = Some(*m);
                }
            }
        }
    }
    p
}

proptest! {
    #[test]
    fn allocation_never_exceeds_slack(pods in arb_pods(), cap in 0u64..20_000, usage in 0u64..20_000, owed in 0u64..3000) {
        let (n, ds) = run(&pods, cap, usage, owed, 100);
        let floors_excess: Millis = ds.iter().filter_map(|d| d.floor_m().map(|f| f - d.request_m)).sum();
        let allocated: Millis = ds.iter().filter_map(|d| d.target_m().map(|t| t - d.request_m)).sum();
        prop_assert!(allocated <= n.slack_m.max(floors_excess), "allocated {} slack {} floors {}", allocated, n.slack_m, floors_excess);
        prop_assert_eq!(allocated, n.allocated_m);
    }

    #[test]
    fn targets_lie_within_floor_and_ceiling(pods in arb_pods(), cap in 0u64..20_000, usage in 0u64..20_000) {
        let (_, ds) = run(&pods, cap, usage, 0, 100);
        for (d, m) in ds.iter().filter_map(|d| Some((d, d.managed()?))) {
            let (t, f, c) = (m.target_m, m.floor.floor_m, m.ceiling_m);
            prop_assert!(f >= d.request_m);
            prop_assert!(f <= t && t <= c, "{} <= {} <= {}", f, t, c);
            if m.level == Level::Containers {
                prop_assert_eq!(m.containers.iter().map(|c| c.target_m).sum::<Millis>(), t);
                for c in &m.containers {
                    prop_assert!(c.target_m >= c.request_m);
                }
            }
        }
    }

    #[test]
    fn targets_never_fall_when_slack_rises(pods in arb_pods(), cap in 0u64..20_000, usage in 0u64..20_000, r1 in 0u64..5_000, r2 in 0u64..5_000) {
        let (lo_reserve, hi_reserve) = (r1.min(r2), r1.max(r2));
        let (n_more, more) = run(&pods, cap, usage, 0, lo_reserve);
        let (n_less, less) = run(&pods, cap, usage, 0, hi_reserve);
        prop_assert!(n_more.slack_m >= n_less.slack_m);
        for (a, b) in more.iter().zip(&less) {
            prop_assert!(a.target_m() >= b.target_m(), "{:?} < {:?}", a.target_m(), b.target_m());
        }
    }

    #[test]
    fn plans_never_change_qos_or_break_apiserver_rules(pods in arb_pods(), cap in 0u64..20_000, usage in 0u64..20_000, owed in 0u64..3000) {
        let (n, ds) = run(&pods, cap, usage, owed, 100);
        let out = first_plan(&n, &ds, &PolicyConfig::default());
        for pp in &out.patches {
            let before = pods.iter().find(|p| p.uid == pp.uid).unwrap();
            let after = apply(before, pp);
            prop_assert_eq!(
                compute_qos(&before.containers, before.pod_resources.as_ref()),
                compute_qos(&after.containers, after.pod_resources.as_ref())
            );
            for c in &after.containers {
                if let Some(l) = c.resources.cpu_limit {
                    prop_assert!(l >= c.resources.cpu_request.unwrap_or(0));
                }
            }
            if let Some(pr) = after.pod_resources
                && let Some(l) = pr.cpu_limit
            {
                prop_assert!(l >= pr.cpu_request.unwrap_or(0));
                let largest = after.containers.iter().filter_map(|c| c.resources.cpu_limit).max().unwrap_or(0);
                prop_assert!(l >= largest);
            }
            // Containers with RestartContainer are never in a patch.
            if let PatchKind::ContainerLimits(cs) = &pp.kind {
                for (name, _) in cs {
                    let c = before.containers.iter().find(|c| *c.name == **name).unwrap();
                    prop_assert_eq!(c.cpu_resize_policy, ResizePolicy::NotRequired);
                }
            }
        }
    }

    #[test]
    fn decide_does_not_depend_on_pod_order(pods in arb_pods(), cap in 0u64..20_000) {
        let (_, fwd) = run(&pods, cap, 0, 0, 100);
        let mut rev_pods = pods.clone();
        rev_pods.reverse();
        // Usage depends on the index in `run`; give both the same by zero usage.
        let cfg = PolicyConfig::default();
        let inputs = |ps: &[PodView]| -> (NodeDecision, Vec<Decision>) {
            let v: Vec<PodInput> = ps.iter().map(|p| input(p, 0)).collect();
            decide(&node(cap, 0, 0), &v, &cfg)
        };
        let (_, a) = inputs(&pods);
        let (_, mut b) = inputs(&rev_pods);
        b.reverse();
        prop_assert_eq!(a, b);
        prop_assert_eq!(fwd.len(), pods.len());
    }
}

proptest! {
    #[test]
    fn applied_plan_converges_with_no_further_patches(pods in arb_pods(), cap in 0u64..20_000, usage in 0u64..20_000, owed in 0u64..3000) {
        let (n, ds) = run(&pods, cap, usage, owed, 100);
        let cfg = PolicyConfig::default();
        let out = first_plan(&n, &ds, &cfg);
        let after: Vec<PodView> = pods
            .iter()
            .map(|p| match out.patches.iter().find(|pp| pp.uid == p.uid) {
                Some(pp) => apply(p, pp),
                None => p.clone(),
            })
            .collect();
        let (n2, ds2) = run(&after, cap, usage, owed, 100);
        let again = first_plan(&n2, &ds2, &cfg);
        prop_assert!(again.patches.is_empty(), "{:?}", again.patches);
    }
}

/// Any policy config inside the accepted ranges.
fn arb_config() -> impl Strategy<Value = PolicyConfig> {
    use config::range::*;
    (
        (
            RESERVE_M.0..=RESERVE_M.1,
            CEILING_FACTOR.0..=CEILING_FACTOR.1,
            QUANTUM_M.0..=QUANTUM_M.1,
        ),
        (
            DEAD_BAND_PCT.0..=DEAD_BAND_PCT.1,
            DEAD_BAND_M.0..=DEAD_BAND_M.1,
        ),
        (
            DEAD_BAND_PCT.0..=DEAD_BAND_PCT.1,
            DEAD_BAND_M.0..=DEAD_BAND_M.1,
        ),
        (0.0f64..=99.0, 0.5f64..=60.0),
        (
            PATCH_RATE_PER_S.0..=PATCH_RATE_PER_S.1,
            PATCH_BURST.0..=PATCH_BURST.1,
            RAISE_COOLDOWN_S.0..=RAISE_COOLDOWN_S.1,
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (reserve, factor, q),
                (rp, rm),
                (lp, lm),
                (ps, window),
                (rate, burst, cool, declared),
            )| {
                PolicyConfig {
                    reserve_m: reserve,
                    ceiling_factor: factor,
                    quantum_m: q,
                    raise_dead_band_pct: rp,
                    raise_dead_band_m: rm,
                    lower_dead_band_pct: lp,
                    lower_dead_band_m: lm,
                    raise_cooldown_s: cool,
                    pressure_start_pct: ps,
                    contention_window_s: window,
                    patch_rate_per_s: rate,
                    patch_burst: burst,
                    floor: if declared {
                        FloorMode::Declared
                    } else {
                        FloorMode::Request
                    },
                }
            },
        )
}

/// Pods with a request and a current limit within what the config's
/// ceiling factor allows (request ≤ limit ≤ request × factor); the limit
/// is a fraction `f` of the way up.
fn arb_limited_pods(factor: f64) -> impl Strategy<Value = Vec<(Millis, Millis)>> {
    proptest::collection::vec((1u64..8000, 0.0f64..=1.0), 1..10).prop_map(move |v| {
        v.into_iter()
            .map(|(r, f)| {
                let top = floors::scale(r, factor);
                (r, r + ((top - r) as f64 * f) as Millis)
            })
            .collect()
    })
}

proptest! {
    /// On an idle node with room for every ceiling, no in-range config
    /// lowers a managed pod whose limit is within its ceiling: the config's
    /// arithmetic (rounding to the quantum, overflow, scaling) never pulls a
    /// ceiling below what the setting says.
    #[test]
    fn idle_node_never_lowers_a_pod_because_of_the_config(
        (cfg, pods) in arb_config().prop_flat_map(|c| {
            let f = c.ceiling_factor;
            (Just(c), arb_limited_pods(f))
        })
    ) {
        prop_assert_eq!(cfg.validate(), Ok(()));
        let views: Vec<PodView> = pods
            .iter()
            .enumerate()
            .map(|(i, &(r, l))| simple(&format!("p{i}"), r, Some(l)))
            .collect();
        let room: Millis = pods.iter().map(|&(r, _)| floors::scale(r, cfg.ceiling_factor)).sum();
        let capacity = cfg.reserve_m + room + 1000;
        let inputs: Vec<PodInput> = views.iter().map(|p| input(p, 0)).collect();
        let (n, ds) = decide(&node(capacity, 0, 0), &inputs, &cfg);
        let out = plan(&n, &ds, |_| None, 1e9, &mut TokenBucket::new(1000.0, 1000), &cfg);
        for (d, &(r, l)) in ds.iter().zip(&pods) {
            prop_assert!(d.is_managed(), "{:?}", d.reason());
            prop_assert!(d.target_m().unwrap() >= l, "request {} limit {} target {:?} ceiling {:?}", r, l, d.target_m(), d.ceiling_m());
        }
        for pp in &out.patches {
            prop_assert_eq!(pp.direction, Direction::Raise, "{:?}", pp);
        }
    }
}

#[test]
fn a_quantum_larger_than_the_headroom_does_not_collapse_the_ceiling() {
    // request 100m, factor 1.5 → ceiling 150m; with 100m quanta the grid
    // is 100, 200, ...: rounding the ceiling down to it gave 100m, and the
    // pod at 150m was lowered to its request on an idle node.
    let cfg = PolicyConfig {
        quantum_m: 100,
        ceiling_factor: 1.5,
        ..Default::default()
    };
    let p = simple("a", 100, Some(150));
    let (n, ds) = decide(&node(4000, 0, 0), &[input(&p, 0)], &cfg);
    assert_eq!(ds[0].ceiling_m(), Some(150));
    assert_eq!(ds[0].target_m(), Some(150));
    let out = first_plan(&n, &ds, &cfg);
    assert!(out.patches.is_empty(), "{:?}", out.patches);
}

/// The number right after `key` in `s` (digits only), if `key` occurs.
fn number_after(s: &str, key: &str) -> Option<Millis> {
    let rest = &s[s.find(key)? + key.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Every figure a patch's reason states is the figure of this round.
fn check_reason(n: &NodeDecision, d: &Decision, pp: &PatchPlan) -> Result<(), String> {
    let w = &pp.why;
    let fail = |what: &str| Err(format!("{what}: {w:?} for {d:?} on {n:?}"));
    let cur = d.current_limit_m();
    let (floor, ceiling) = (d.floor_m().unwrap(), d.ceiling_m().unwrap());
    if w.starts_with("adopt:") {
        if cur.is_some() || number_after(w, "add CPU limit ") != Some(pp.new_total_m) {
            return fail("adopt");
        }
        return Ok(());
    }
    let verb = if pp.direction == Direction::Raise {
        "raise "
    } else {
        "lower "
    };
    if !w.starts_with(&format!("{verb}{}m→{}m: ", cur.unwrap(), pp.new_total_m)) {
        return fail("from → to");
    }
    if let Some(s) = number_after(w, "slack ")
        && s != n.slack_m
    {
        return fail("slack");
    }
    if let Some(s) = number_after(w, "share ").or(number_after(w, "share of "))
        && Some(s) != d.managed().map(|m| m.share_m)
    {
        return fail("share");
    }
    if let Some(c) = number_after(w, "ceiling ")
        && c != ceiling
    {
        return fail("ceiling");
    }
    if let Some(f) = number_after(w, "floor ")
        && f != floor
    {
        return fail("floor");
    }
    if w.contains("above ceiling") && cur.unwrap() <= ceiling {
        return fail("not above the ceiling");
    }
    if w.contains("below floor") && cur.unwrap() >= floor {
        return fail("not below the floor");
    }
    if w.contains("at its floor") && pp.new_total_m != floor {
        return fail("not at the floor");
    }
    if w.contains("contention") && !n.under_pressure() {
        return fail("no contention");
    }
    if let Some(k) = number_after(w, "over ")
        && k != n.managed_pods as Millis
    {
        return fail("managed pods");
    }
    Ok(())
}

proptest! {
    #[test]
    fn every_reason_states_only_facts_of_the_round(pods in arb_pods(), cap in 0u64..20_000, usage in 0u64..20_000, owed in 0u64..3000) {
        let (n, ds) = run(&pods, cap, usage, owed, 100);
        let out = first_plan(&n, &ds, &PolicyConfig::default());
        for pp in &out.patches {
            let d = ds.iter().find(|d| d.uid == pp.uid).unwrap();
            if let Err(e) = check_reason(&n, d, pp) {
                prop_assert!(false, "{}", e);
            }
        }
    }

    #[test]
    fn an_idle_node_with_room_never_lowers_a_limit(pods in arb_pods()) {
        // Room for every ceiling, no usage, no contention: the only lowering
        // allowed is to a ceiling the user annotated below the limit.
        let cfg = PolicyConfig::default();
        let inputs: Vec<PodInput> = pods.iter().map(|p| input(p, 0)).collect();
        let (n, ds) = decide(&node(1_000_000, 0, 0), &inputs, &cfg);
        let out = first_plan(&n, &ds, &cfg);
        for pp in out.patches.iter().filter(|pp| pp.direction == Direction::Lower && pp.old_total_m.is_some()) {
            let p = pods.iter().find(|p| p.uid == pp.uid).unwrap();
            let annotated = p.annotation(ANN_CEILING).and_then(|c| crate::quantity::cpu_millis(c).ok());
            prop_assert!(annotated.is_some_and(|c| c < pp.old_total_m.unwrap()), "{:?}", pp);
        }
    }
}

#[test]
fn lowering_reasons_name_this_rounds_slack_not_a_change() {
    // First round after a start: no earlier slack to have "shrunk" from.
    let a = simple("a", 100, Some(400));
    let b = simple("b", 100, Some(400));
    let inputs = [input(&a, 0), input(&b, 0)];
    let cfg = PolicyConfig::default();
    // 100m reserve, 100m of other usage: 300m of slack over two pods.
    let (n, ds) = decide(&node(500, 100, 0), &inputs, &cfg);
    let out = first_plan(&n, &ds, &cfg);
    assert_eq!(out.patches.len(), 2, "{out:?}");
    for pp in &out.patches {
        assert!(!pp.why.contains("shrank"), "{}", pp.why);
        let d = ds.iter().find(|d| d.uid == pp.uid).unwrap();
        check_reason(&n, d, pp).unwrap();
    }
    assert_eq!(
        out.patches[0].why,
        "lower 400m→250m: slack 300m over 2 managed pods gives it a share of 150m"
    );
}

#[test]
fn a_pod_a_lowering_holds_is_not_filled_above_where_it_is_held() {
    // An idle 4-CPU node would give it its 400m ceiling; a lowering that
    // bought a neighbour CPU holds it at 250m, and never below its floor.
    let p = simple("held", 100, Some(400));
    let decide_held = |held_at_m| {
        let inputs = [PodInput {
            namespace_opted_in: true,
            held_at_m,
            ..input(&p, 0)
        }];
        decide(&node(4000, 0, 0), &inputs, &PolicyConfig::default()).1
    };
    assert_eq!(decide_held(None)[0].target_m(), Some(400));
    let held = decide_held(Some(250));
    assert_eq!(held[0].target_m(), Some(250));
    assert_eq!(
        held[0].ceiling_m(),
        Some(400),
        "the ceiling shown is the pod's own"
    );
    assert_eq!(held[0].managed().unwrap().held_at_m, Some(250));
    let below = decide_held(Some(10));
    assert_eq!(below[0].target_m(), below[0].floor_m());
}
