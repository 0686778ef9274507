//! Pods, nodes and rounds the policy's tests share (eligibility, floors,
//! hysteresis and the cross-module properties), built with the crate's
//! [`testkit`](crate::testkit).

use crate::model::{ContainerSpec, Millis, PodView, Resources};
use crate::policy::{
    Decision, EligibilityCtx, NodeDecision, NodeInputs, PlanOutcome, PodInput, PolicyConfig,
    TokenBucket, Unmanaged, decide, eligibility, plan, slack_formula,
};
use crate::testkit::{self, PodBuilder};

pub(in crate::policy) use crate::testkit::{container, resources as res};

pub(in crate::policy) const NODE: &str = "node-a";
pub(in crate::policy) const MI: u64 = 1 << 20;

/// A Running, opted-in pod on NODE with the given containers.
pub(in crate::policy) fn pod(name: &str, containers: Vec<ContainerSpec>) -> PodView {
    PodBuilder::new("ns", name, &format!("uid-{name}"))
        .node(NODE)
        .containers(containers)
        .managed()
        .qos_from_spec()
        .build()
}

/// One container with cpu req/limit and memory 64Mi/128Mi (Burstable).
pub(in crate::policy) fn simple(name: &str, req: Millis, lim: Option<Millis>) -> PodView {
    pod(
        name,
        vec![container(
            "c",
            res(Some(req), lim, Some(64 * MI), Some(128 * MI)),
        )],
    )
}

pub(in crate::policy) fn with_pod_level(p: PodView, r: Resources) -> PodView {
    PodBuilder::from(p)
        .pod_resources(Some(r))
        .qos_from_spec()
        .build()
}

/// A pod with pod-level resources `pod_r` and one container "c" with `c`.
pub(in crate::policy) fn pod_level(name: &str, c: Resources, pod_r: Resources) -> PodView {
    with_pod_level(pod(name, vec![container("c", c)]), pod_r)
}

/// docs/kubelet-behaviour.md §4 pod a: req 100m/64Mi, lim 500m/128Mi; c req 100m.
pub(in crate::policy) fn pod_level_a() -> PodView {
    pod_level(
        "a",
        res(Some(100), None, None, None),
        res(Some(100), Some(500), Some(64 * MI), Some(128 * MI)),
    )
}

pub(in crate::policy) fn ctx(supported: Option<bool>) -> EligibilityCtx<'static> {
    EligibilityCtx {
        node_name: NODE,
        namespace_opted_in: false,
        pod_level_resize_supported: supported,
        wall_clock_s: crate::policy::eligibility::TEST_WALL_CLOCK_S,
    }
}

/// Why `p` is unmanaged on a cluster that resizes pod-level resources.
pub(in crate::policy) fn why(p: &PodView) -> Option<Unmanaged> {
    eligibility(p, &ctx(Some(true))).err()
}

/// NODE with this capacity and usage; `owed_m` is owed to one displaced
/// pod within its request.
pub(in crate::policy) fn node(
    capacity_m: Millis,
    usage_m: Millis,
    owed_m: Millis,
) -> NodeInputs<'static> {
    NodeInputs {
        node_name: NODE,
        capacity_m,
        kubepods_usage_m: usage_m,
        contention: slack_formula::ContentionInputs {
            some_pct: if owed_m > 0 { 100.0 } else { 0.0 },
            throttling_pct: 0.0,
            displaced_pods: usize::from(owed_m > 0),
            demand_m: owed_m,
            free_m: 0,
        },
        pod_level_resize_supported: Some(true),
        wall_clock_s: crate::policy::eligibility::TEST_WALL_CLOCK_S,
    }
}

pub(in crate::policy) fn input(p: &PodView, usage_m: Millis) -> PodInput<'_> {
    testkit::pod_input(p, usage_m)
}

/// A round of `p` alone, idle, on NODE, with the default config.
pub(in crate::policy) fn decided(
    p: &PodView,
    capacity_m: Millis,
    usage_m: Millis,
    owed_m: Millis,
) -> (NodeDecision, Vec<Decision>) {
    decide(
        &node(capacity_m, usage_m, owed_m),
        &[input(p, 0)],
        &PolicyConfig::default(),
    )
}

/// [`plan`] with no memory of earlier patches, at 0 s, from an ample bucket.
pub(in crate::policy) fn first_plan(
    n: &NodeDecision,
    ds: &[Decision],
    cfg: &PolicyConfig,
) -> PlanOutcome {
    plan(n, ds, |_| None, 0.0, &mut big_bucket(), cfg)
}

pub(in crate::policy) fn big_bucket() -> TokenBucket {
    TokenBucket::new(1000.0, 1000)
}
