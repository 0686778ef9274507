//! Truth suite, docs/kubelet-behaviour.md §4 with `InPlacePodLevelResourcesVerticalScaling=false`
//! on the v1.37.2 binary (what a 1.35 cluster does): any resize of a pod with
//! `spec.resources` is refused, even one that touches only a container.
//!
//! Same driver as `truth_resize.rs` (`truth/mod.rs`): one [`Case`] per test.

mod truth;

use serde_json::json;
use testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use truth::{
    Case, Expect, PODLEVEL_FEATURE, Suite, container_patch, cpu_limit, ctr_res, dry_run,
    pod_level_100m_500m, pod_patch,
};

const SUITE: Suite = Suite {
    control_plane: cp,
    declared_features: &[PODLEVEL_FEATURE],
};

/// docs/kubelet-behaviour.md quotes `The Pod "<name>" is invalid: ...`; the server's Status
/// message has no leading "The " (kubectl adds it when printing).
fn forbidden(name: &str) -> Expect {
    Expect::RefusedExactly(format!(
        "Pod \"{name}\" is invalid: []: Forbidden: resize of pods with pod-level resources is \
         forbidden when InPlacePodLevelResourcesVerticalScalingEnabled feature gate is disabled"
    ))
}

fn cp() -> &'static ControlPlane {
    ControlPlane::shared_with(
        "podlevel-gate-off",
        ControlPlaneOptions::default().with_gate(PODLEVEL_FEATURE, false),
    )
}

/// Pod `p` with container `c` at cpu 100m/400m.
fn pod(ns: &'static str) -> Case {
    Case::new(
        ns,
        "p",
        json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}}),
    )
}

#[tokio::test]
async fn pod_level_limit_resize_is_forbidden() {
    pod("off-pod")
        .pod_level(pod_level_100m_500m())
        .step(pod_patch(cpu_limit("800m")), forbidden("p"))
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn container_only_resize_of_a_pod_with_pod_level_resources_is_forbidden() {
    pod("off-ctr")
        .pod_level(pod_level_100m_500m())
        .step(container_patch(cpu_limit("450m")), forbidden("p"))
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn dry_run_resize_detects_the_gate() {
    pod("off-dry")
        .pod_level(pod_level_100m_500m())
        .step(dry_run(pod_patch(cpu_limit("500m"))), forbidden("p"))
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn container_level_pods_still_resize_with_the_gate_off() {
    pod("off-plain")
        .admits_then(container_patch(cpu_limit("800m")), |a| {
            assert_eq!(ctr_res(a.pod)["limits"]["cpu"], "800m");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn gate_is_reported_off_in_metrics() {
    // Stage is BETA on 1.37 and ALPHA on 1.35 (HEADROOM_APISERVER_VERSION=v1.35.4).
    let line = truth::gate_metric(cp(), PODLEVEL_FEATURE).await;
    assert!(
        line.as_deref().is_some_and(|l| l.ends_with("} 0")),
        "gate line: {line:?}"
    );
}
