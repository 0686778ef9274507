//! Truth suite: how the real kube-apiserver (v1.37.2, default gates, so
//! `InPlacePodLevelResourcesVerticalScaling` on) treats `resize` patches.
//! These tests are the project's record of docs/kubelet-behaviour.md §3 and §4; where the
//! server disagrees with docs/kubelet-behaviour.md, the test asserts what the server does.
//!
//! Each test is one [`Case`] (create a pod, send resizes, expect admission or a
//! refusal text) run by the shared driver in `truth/mod.rs`; one `#[tokio::test]` per
//! case so that a failure names its case and `cargo test <filter>` picks cases.

mod truth;

use kube::api::Patch;
use serde_json::{Value, json};
use testkit::control_plane::ControlPlane;
use truth::{
    Case, Expect, Node, PODLEVEL_FEATURE, Suite, container_patch, cpu_limit, ctr_res, dry_run,
    image, pod_level_100m_500m, pod_patch, pod_res, sidecar_res,
};

const QOS_REFUSAL: &str = "Pod QOS Class may not change as a result of resizing";

const SUITE: Suite = Suite {
    control_plane: ControlPlane::shared,
    declared_features: &[PODLEVEL_FEATURE],
};

/// Container resources: cpu 100m/500m, the usual starting point.
fn cpu_100m_500m() -> Value {
    json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}})
}

/// Burstable only because cpu limit > request; limit := request would make it Guaranteed.
fn burstable_by_cpu() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}})
}

/// Burstable with a memory limit and no cpu limit.
fn no_cpu_limit() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}})
}

// ---- docs/kubelet-behaviour.md §3: container-level resize -------------------------------------

#[tokio::test]
async fn qos_changing_limit_resize_is_refused() {
    Case::new("qos-change", "p", burstable_by_cpu())
        .refuses(container_patch(cpu_limit("100m")), QOS_REFUSAL)
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn adding_a_cpu_limit_to_a_burstable_container_without_one_is_admitted() {
    Case::new("add-limit", "p", no_cpu_limit())
        .admits_then(container_patch(cpu_limit("800m")), |a| {
            let r = ctr_res(a.pod);
            assert_eq!(r["limits"]["cpu"], "800m");
            assert_eq!(r["limits"]["memory"], "128Mi");
            assert_eq!(r["requests"]["cpu"], "100m");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn removing_a_cpu_limit_is_refused() {
    Case::new("rm-limit", "p", cpu_100m_500m())
        .refuses(
            container_patch(json!({"limits": {"cpu": null}})),
            "resource limits cannot be removed",
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn removing_a_cpu_request_without_a_cpu_limit_is_refused() {
    Case::new("rm-request", "p", no_cpu_limit())
        .refuses(
            container_patch(json!({"requests": {"cpu": null}})),
            "resource requests cannot be removed",
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn removing_a_cpu_request_under_a_cpu_limit_defaults_it_to_the_limit() {
    // Not in docs/kubelet-behaviour.md: defaulting runs on the patched object before
    // validation, so a dropped request comes back equal to the limit and the
    // "removal" is admitted as a request change.
    let container =
        json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m"}});
    Case::new("rm-request-lim", "p", container)
        .admits_then(container_patch(json!({"requests": {"cpu": null}})), |a| {
            let r = ctr_res(a.pod);
            assert_eq!(r["requests"]["cpu"], "500m", "resources now {r}");
            assert_eq!(r["requests"]["memory"], "64Mi", "resources now {r}");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn changing_a_resource_other_than_cpu_or_memory_is_refused() {
    let container =
        json!({"requests": {"cpu": "100m", "ephemeral-storage": "1Gi"}, "limits": {"cpu": "500m"}});
    Case::new("other-resource", "p", container)
        .refuses(
            container_patch(json!({"requests": {"ephemeral-storage": "2Gi"}})),
            "only cpu and memory resources are mutable",
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn strategic_merge_patch_keeps_the_requests() {
    Case::new("smp", "p", cpu_100m_500m())
        .admits_then(container_patch(cpu_limit("800m")), |a| {
            let r = ctr_res(a.pod);
            assert_eq!(r["limits"]["cpu"], "800m");
            assert_eq!(r["requests"]["cpu"], "100m");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn json_merge_patch_on_containers_replaces_the_requests_with_the_new_limits() {
    // A JSON merge patch replaces the whole containers list: the container
    // arrives with limits only and defaulting sets requests := limits.
    let patch = Patch::Merge(json!({"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"cpu": "800m"}}}
    ]}}));
    Case::new("merge-patch", "p", cpu_100m_500m())
        .admits_then(patch, |a| {
            let r = ctr_res(a.pod);
            assert_eq!(r["limits"]["cpu"], "800m");
            assert_eq!(r["requests"]["cpu"], "800m", "resources now {r}");
            // The rest of the container (image) is not part of the resize and stays.
            assert_eq!(image(a.pod), Some("registry.k8s.io/pause:3.10"));
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn resize_bumps_metadata_generation() {
    Case::new("generation", "p", cpu_100m_500m())
        .admits_then(container_patch(cpu_limit("600m")), |a| {
            let before = a.created.metadata.generation.expect("generation");
            assert_eq!(a.pod.metadata.generation, Some(before + 1));
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn non_resource_fields_in_a_resize_patch_are_dropped() {
    let patch = Patch::Strategic(json!({
        "metadata": {"labels": {"sneaky": "yes"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:other",
                                  "resources": {"limits": {"cpu": "700m"}}}]}
    }));
    // Admitted: the resize subresource keeps only the resources (and
    // resizePolicy) of the patched object and drops the rest.
    Case::new("dropped-fields", "p", cpu_100m_500m())
        .admits_then(patch, |a| {
            assert_eq!(ctr_res(a.pod)["limits"]["cpu"], "700m");
            assert_eq!(image(a.stored), Some("registry.k8s.io/pause:3.10"));
            let labels = a.stored.metadata.labels.clone().unwrap_or_default();
            assert!(!labels.contains_key("sneaky"), "labels: {labels:?}");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn dry_run_resize_is_admitted_without_changing_the_pod() {
    Case::new("dry-ok", "p", cpu_100m_500m())
        .admits_then(dry_run(container_patch(cpu_limit("900m"))), |a| {
            assert_eq!(ctr_res(a.pod)["limits"]["cpu"], "900m");
            assert_eq!(ctr_res(a.stored)["limits"]["cpu"], "500m");
            assert_eq!(a.stored.metadata.generation, a.created.metadata.generation);
            assert_eq!(
                a.stored.metadata.resource_version,
                a.created.metadata.resource_version
            );
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn dry_run_resize_reports_the_refusal() {
    Case::new("dry-refused", "p", burstable_by_cpu())
        .refuses(dry_run(container_patch(cpu_limit("100m"))), QOS_REFUSAL)
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn resize_of_a_running_pod_without_status_resources_is_refused() {
    // What a kubelet (or the simulated one) must report: a running container
    // status without `resources` means "node without resize support".
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "c", "image": "registry.k8s.io/pause:3.10", "imageID": "", "ready": true,
        "restartCount": 0, "containerID": "containerd://abc",
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    }]}});
    Case::new("no-status-resources", "p", cpu_100m_500m())
        .status(status)
        .refuses(
            container_patch(cpu_limit("700m")),
            "Pod running on node without support for resize",
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn sidecar_cpu_limit_resize_is_admitted() {
    let patch = Patch::Strategic(json!({"spec": {"initContainers": [
        {"name": "s", "resources": {"limits": {"cpu": "300m"}}}
    ]}}));
    Case::new("sidecar", "p", cpu_100m_500m())
        .sidecar(json!({"requests": {"cpu": "50m"}, "limits": {"cpu": "100m"}}))
        .admits_then(patch, |a| {
            let r = sidecar_res(a.pod);
            assert_eq!(r["limits"]["cpu"], "300m");
            assert_eq!(r["requests"]["cpu"], "50m");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn resize_of_a_pod_whose_node_does_not_exist_is_forbidden() {
    let refusal = Expect::RefusedStarting {
        prefix: r#"pods "p" is forbidden"#,
        text: r#"node "no-such-node" not found"#,
    };
    Case::new("no-node", "p", cpu_100m_500m())
        .on(Node::Missing("no-such-node"))
        .step(container_patch(cpu_limit("600m")), refusal)
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn raising_requests_above_node_allocatable_is_forbidden() {
    let container = json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "8"}});
    Case::new("over-alloc", "p", container)
        .refuses(
            container_patch(json!({"requests": {"cpu": "5"}})),
            "node didn't have enough allocatable resources: cpu, requested: 5000, allocatable: 4000",
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn raising_a_limit_above_node_allocatable_is_admitted() {
    Case::new("limit-over-alloc", "p", cpu_100m_500m())
        .admits_then(container_patch(cpu_limit("6")), |a| {
            assert_eq!(ctr_res(a.pod)["limits"]["cpu"], "6");
        })
        .run(&SUITE)
        .await;
}

// ---- docs/kubelet-behaviour.md §4: pod-level resources, gate on --------------------------------

fn pod_level_cd() -> Value {
    json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}})
}

fn cpu_request(cpu: &str) -> Value {
    json!({"requests": {"cpu": cpu}})
}

#[tokio::test]
async fn podlevel_a_pod_limit_resizes_up_and_down_are_admitted() {
    Case::new("pl-a", "a", cpu_request("100m"))
        .pod_level(pod_level_100m_500m())
        .admits_then(pod_patch(cpu_limit("800m")), |a| {
            assert_eq!(pod_res(a.pod)["limits"]["cpu"], "800m");
        })
        .admits_then(pod_patch(cpu_limit("300m")), |a| {
            assert_eq!(pod_res(a.pod)["limits"]["cpu"], "300m");
            assert_eq!(pod_res(a.pod)["requests"]["cpu"], "100m");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn podlevel_b_pod_limit_cannot_go_under_a_container_limit() {
    // Both in one patch.
    let both = Patch::Strategic(json!({"spec": {
        "resources": {"limits": {"cpu": "1500m"}},
        "containers": [{"name": "c", "resources": {"limits": {"cpu": "1400m"}}}]
    }}));
    Case::new("pl-b", "b", json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}}))
        .pod_level(pod_level_100m_500m())
        .admits(pod_patch(cpu_limit("800m")))
        .admits(pod_patch(cpu_limit("450m")))
        .refuses(
            pod_patch(cpu_limit("300m")),
            r#"spec.resources.containers[0][cpu].limits: Invalid value: "400m": must be less than or equal to pod limits of 300m"#,
        )
        .admits(pod_patch(cpu_limit("1000m")))
        .admits_then(container_patch(cpu_limit("900m")), |a| {
            assert_eq!(ctr_res(a.pod)["limits"]["cpu"], "900m");
        })
        .admits_then(both, |a| {
            assert_eq!(pod_res(a.pod)["limits"]["cpu"], "1500m");
            assert_eq!(ctr_res(a.pod)["limits"]["cpu"], "1400m");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn podlevel_c_pod_limit_cannot_go_under_the_pod_request() {
    Case::new("pl-c", "c", cpu_request("110m"))
        .pod_level(pod_level_cd())
        .created(|created| {
            // Defaulting fills in a pod-level CPU request (sum of container requests), no limit.
            let r = pod_res(created);
            assert_eq!(
                r["requests"]["cpu"], "110m",
                "pod-level resources at create: {r}"
            );
            assert!(
                r["limits"].get("cpu").is_none(),
                "pod-level resources at create: {r}"
            );
        })
        .admits_then(pod_patch(cpu_limit("800m")), |a| {
            assert_eq!(pod_res(a.pod)["limits"]["cpu"], "800m");
        })
        .admits(pod_patch(cpu_limit("200m")))
        .refuses(
            pod_patch(cpu_limit("100m")),
            r#"spec.resources.requests: Invalid value: "110m": must be less than or equal to cpu limit of 100m"#,
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn podlevel_d_container_limit_is_a_sub_cap_of_the_pod_limit() {
    Case::new("pl-d", "d", json!({"requests": {"cpu": "110m"}, "limits": {"cpu": "110m"}}))
        .pod_level(pod_level_cd())
        .created(|created| {
            // Every container sets a CPU limit, so a pod-level limit is filled in.
            let r = pod_res(created);
            assert_eq!(
                r["limits"]["cpu"], "110m",
                "pod-level resources at create: {r}"
            );
        })
        .admits(pod_patch(cpu_limit("800m")))
        .admits(container_patch(cpu_limit("700m")))
        .refuses(
            pod_patch(cpu_limit("300m")),
            r#"spec.resources.containers[0][cpu].limits: Invalid value: "700m": must be less than or equal to pod limits of 300m"#,
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn podlevel_e_limit_down_to_the_request_would_make_it_guaranteed_and_is_refused() {
    Case::new("pl-e", "e", cpu_request("100m"))
        .pod_level(json!({"requests": {"cpu": "100m", "memory": "128Mi"},
                          "limits": {"cpu": "500m", "memory": "128Mi"}}))
        .refuses(pod_patch(cpu_limit("100m")), QOS_REFUSAL)
        .admits_then(pod_patch(cpu_limit("101m")), |a| {
            assert_eq!(pod_res(a.pod)["limits"]["cpu"], "101m");
        })
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn podlevel_f_guaranteed_through_pod_level_resources_cannot_be_raised() {
    Case::new("pl-f", "f", cpu_request("100m"))
        .pod_level(json!({"requests": {"cpu": "500m", "memory": "128Mi"},
                          "limits": {"cpu": "500m", "memory": "128Mi"}}))
        .refuses(pod_patch(cpu_limit("600m")), QOS_REFUSAL)
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn podlevel_resize_on_a_node_not_declaring_the_feature_is_forbidden() {
    // Not in docs/kubelet-behaviour.md: 1.37's NodeDeclaredFeatures admission requires the
    // Node to list the feature in status.declaredFeatures (a 1.37 kubelet with
    // the gate on does). Container-only resizes need no declared feature.
    Case::new("pl-undeclared", "p", cpu_request("100m"))
        .pod_level(pod_level_100m_500m())
        .on(Node::Undeclared("plain-node"))
        .refuses(
            pod_patch(cpu_limit("800m")),
            r#"pods "p" is forbidden: pod update requires features InPlacePodLevelResourcesVerticalScaling which are not available on node "plain-node""#,
        )
        .run(&SUITE)
        .await;
}

#[tokio::test]
async fn podlevel_gate_is_reported_on_in_metrics() {
    let line = truth::gate_metric(ControlPlane::shared(), PODLEVEL_FEATURE).await;
    assert!(
        line.as_deref().is_some_and(|l| l.contains(
            r#"kubernetes_feature_enabled{name="InPlacePodLevelResourcesVerticalScaling",stage="BETA"} 1"#
        )),
        "gate line: {line:?}"
    );
}
