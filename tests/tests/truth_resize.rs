//! Truth suite: how the real kube-apiserver (v1.37.2, default gates, so
//! `InPlacePodLevelResourcesVerticalScaling` on) treats `resize` patches.
//! These tests are the project's record of docs/kubelet-behaviour.md §3 and §4; where the
//! server disagrees with docs/kubelet-behaviour.md, the test asserts what the server does.
//!
//! Pods are bound (`spec.nodeName`) to a Node object that no kubelet backs, and
//! have no status, so the apiserver assumes the node supports resize.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::control_plane::{ControlPlane, api_message, resize};

const QOS_REFUSAL: &str = "Pod QOS Class may not change as a result of resizing";
const PODLEVEL_FEATURE: &str = "InPlacePodLevelResourcesVerticalScaling";
/// Node the pods are bound to: 1.37's resize admission needs it to exist.
const NODE: &str = "truth-node";

async fn setup(prefix: &str) -> Api<Pod> {
    let cp = ControlPlane::shared();
    cp.ensure_node(NODE, "4", "16Gi", &[PODLEVEL_FEATURE])
        .await
        .expect("node");
    let ns = cp.namespace(prefix).await;
    Api::namespaced(cp.client().await, &ns)
}

/// A pod bound to a fake node; `containers` are merged into a pause container
/// named `c`; `pod_resources` is `spec.resources` when given.
async fn create_pod(
    api: &Api<Pod>,
    name: &str,
    container: Value,
    pod_resources: Option<Value>,
) -> Pod {
    let mut c = json!({"name": "c", "image": "registry.k8s.io/pause:3.10"});
    merge(&mut c, container);
    let mut spec = json!({"nodeName": NODE, "containers": [c]});
    if let Some(r) = pod_resources {
        spec["resources"] = r;
    }
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
        .expect("pod json");
    api.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {name}: {e}"))
}

fn merge(base: &mut Value, add: Value) {
    if let (Some(b), Value::Object(a)) = (base.as_object_mut(), add) {
        for (k, v) in a {
            b.insert(k, v);
        }
    }
}

/// Strategic-merge resize of container `c`'s resources.
fn container_patch(resources: Value) -> Patch<Value> {
    Patch::Strategic(json!({"spec": {"containers": [{"name": "c", "resources": resources}]}}))
}

/// Strategic-merge resize of pod-level resources.
fn pod_patch(resources: Value) -> Patch<Value> {
    Patch::Strategic(json!({"spec": {"resources": resources}}))
}

async fn admitted(api: &Api<Pod>, name: &str, patch: Patch<Value>) -> Pod {
    match resize(api, name, &patch, false).await {
        Ok(p) => p,
        Err(e) => panic!("resize {patch:?} of {name} was refused: {e}"),
    }
}

/// Asserts the resize is refused with `text` in the Status message and
/// leaves the pod unchanged; returns the message.
async fn refused(api: &Api<Pod>, name: &str, patch: Patch<Value>, text: &str) -> String {
    let before = api.get(name).await.expect("get pod");
    let err = match resize(api, name, &patch, false).await {
        Ok(p) => panic!(
            "resize {patch:?} of {name} was admitted, expected refusal {text:?}; \
             container resources now {}, pod-level {}",
            ctr_res(&p),
            pod_res(&p)
        ),
        Err(e) => e,
    };
    let msg = api_message(&err)
        .unwrap_or_else(|| panic!("not an API error: {err}"))
        .to_string();
    assert!(msg.contains(text), "message {msg:?} lacks {text:?}");
    let after = api.get(name).await.expect("get pod");
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "a refused resize changed the pod"
    );
    msg
}

fn ctr_res(pod: &Pod) -> Value {
    serde_json::to_value(&pod.spec.as_ref().expect("spec").containers[0].resources).expect("json")
}

fn pod_res(pod: &Pod) -> Value {
    serde_json::to_value(&pod.spec.as_ref().expect("spec").resources).expect("json")
}

// ---- docs/kubelet-behaviour.md §3: container-level resize -------------------------------------

#[tokio::test]
async fn qos_changing_limit_resize_is_refused() {
    let api = setup("qos-change").await;
    // Burstable only because cpu limit > request; limit := request would make it Guaranteed.
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                             "limits": {"cpu": "200m", "memory": "64Mi"}}}),
        None,
    )
    .await;
    refused(
        &api,
        "p",
        container_patch(json!({"limits": {"cpu": "100m"}})),
        QOS_REFUSAL,
    )
    .await;
}

#[tokio::test]
async fn adding_a_cpu_limit_to_a_burstable_container_without_one_is_admitted() {
    let api = setup("add-limit").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                             "limits": {"memory": "128Mi"}}}),
        None,
    )
    .await;
    let pod = admitted(
        &api,
        "p",
        container_patch(json!({"limits": {"cpu": "800m"}})),
    )
    .await;
    let r = ctr_res(&pod);
    assert_eq!(r["limits"]["cpu"], "800m");
    assert_eq!(r["limits"]["memory"], "128Mi");
    assert_eq!(r["requests"]["cpu"], "100m");
}

#[tokio::test]
async fn removing_a_cpu_limit_is_refused() {
    let api = setup("rm-limit").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    refused(
        &api,
        "p",
        container_patch(json!({"limits": {"cpu": null}})),
        "resource limits cannot be removed",
    )
    .await;
}

#[tokio::test]
async fn removing_a_cpu_request_without_a_cpu_limit_is_refused() {
    let api = setup("rm-request").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                             "limits": {"memory": "128Mi"}}}),
        None,
    )
    .await;
    refused(
        &api,
        "p",
        container_patch(json!({"requests": {"cpu": null}})),
        "resource requests cannot be removed",
    )
    .await;
}

#[tokio::test]
async fn removing_a_cpu_request_under_a_cpu_limit_defaults_it_to_the_limit() {
    // Not in docs/kubelet-behaviour.md: defaulting runs on the patched object before
    // validation, so a dropped request comes back equal to the limit and the
    // "removal" is admitted as a request change.
    let api = setup("rm-request-lim").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                             "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    let pod = admitted(
        &api,
        "p",
        container_patch(json!({"requests": {"cpu": null}})),
    )
    .await;
    let r = ctr_res(&pod);
    assert_eq!(r["requests"]["cpu"], "500m", "resources now {r}");
    assert_eq!(r["requests"]["memory"], "64Mi", "resources now {r}");
}

#[tokio::test]
async fn changing_a_resource_other_than_cpu_or_memory_is_refused() {
    let api = setup("other-resource").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m", "ephemeral-storage": "1Gi"},
                             "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    refused(
        &api,
        "p",
        container_patch(json!({"requests": {"ephemeral-storage": "2Gi"}})),
        "only cpu and memory resources are mutable",
    )
    .await;
}

#[tokio::test]
async fn strategic_merge_patch_keeps_the_requests() {
    let api = setup("smp").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    let pod = admitted(
        &api,
        "p",
        container_patch(json!({"limits": {"cpu": "800m"}})),
    )
    .await;
    let r = ctr_res(&pod);
    assert_eq!(r["limits"]["cpu"], "800m");
    assert_eq!(r["requests"]["cpu"], "100m");
}

#[tokio::test]
async fn json_merge_patch_on_containers_replaces_the_requests_with_the_new_limits() {
    let api = setup("merge-patch").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    // A JSON merge patch replaces the whole containers list: the container
    // arrives with limits only and defaulting sets requests := limits.
    let patch = Patch::Merge(json!({"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"cpu": "800m"}}}
    ]}}));
    let pod = admitted(&api, "p", patch).await;
    let r = ctr_res(&pod);
    assert_eq!(r["limits"]["cpu"], "800m");
    assert_eq!(r["requests"]["cpu"], "800m", "resources now {r}");
    // The rest of the container (image) is not part of the resize and stays.
    let spec = pod.spec.expect("spec");
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("registry.k8s.io/pause:3.10")
    );
}

#[tokio::test]
async fn resize_bumps_metadata_generation() {
    let api = setup("generation").await;
    let created = create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    let before = created.metadata.generation.expect("generation");
    let pod = admitted(
        &api,
        "p",
        container_patch(json!({"limits": {"cpu": "600m"}})),
    )
    .await;
    assert_eq!(pod.metadata.generation, Some(before + 1));
}

#[tokio::test]
async fn non_resource_fields_in_a_resize_patch_are_dropped() {
    let api = setup("dropped-fields").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    let patch = Patch::Strategic(json!({
        "metadata": {"labels": {"sneaky": "yes"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:other",
                                  "resources": {"limits": {"cpu": "700m"}}}]}
    }));
    // Admitted: the resize subresource keeps only the resources (and
    // resizePolicy) of the patched object and drops the rest.
    let answer = admitted(&api, "p", patch).await;
    assert_eq!(ctr_res(&answer)["limits"]["cpu"], "700m");
    let pod = api.get("p").await.expect("get");
    let spec = pod.spec.clone().expect("spec");
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("registry.k8s.io/pause:3.10")
    );
    let labels = pod.metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key("sneaky"), "labels: {labels:?}");
}

#[tokio::test]
async fn dry_run_resize_is_admitted_without_changing_the_pod() {
    let api = setup("dry-ok").await;
    let created = create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    let answer = resize(
        &api,
        "p",
        &container_patch(json!({"limits": {"cpu": "900m"}})),
        true,
    )
    .await
    .expect("dry-run resize refused");
    assert_eq!(ctr_res(&answer)["limits"]["cpu"], "900m");
    let stored = api.get("p").await.expect("get");
    assert_eq!(ctr_res(&stored)["limits"]["cpu"], "500m");
    assert_eq!(stored.metadata.generation, created.metadata.generation);
    assert_eq!(
        stored.metadata.resource_version,
        created.metadata.resource_version
    );
}

#[tokio::test]
async fn dry_run_resize_reports_the_refusal() {
    let api = setup("dry-refused").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                             "limits": {"cpu": "200m", "memory": "64Mi"}}}),
        None,
    )
    .await;
    let err = resize(
        &api,
        "p",
        &container_patch(json!({"limits": {"cpu": "100m"}})),
        true,
    )
    .await
    .expect_err("dry-run of a QoS change admitted");
    assert!(
        api_message(&err).unwrap_or_default().contains(QOS_REFUSAL),
        "{err}"
    );
}

#[tokio::test]
async fn resize_of_a_running_pod_without_status_resources_is_refused() {
    // What a kubelet (or the simulated one) must report: a running container
    // status without `resources` means "node without resize support".
    let api = setup("no-status-resources").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "c", "image": "registry.k8s.io/pause:3.10", "imageID": "", "ready": true,
        "restartCount": 0, "containerID": "containerd://abc",
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    }]}});
    api.patch_status("p", &PatchParams::default(), &Patch::Strategic(status))
        .await
        .expect("status patch");
    refused(
        &api,
        "p",
        container_patch(json!({"limits": {"cpu": "700m"}})),
        "Pod running on node without support for resize",
    )
    .await;
}

#[tokio::test]
async fn sidecar_cpu_limit_resize_is_admitted() {
    let api = setup("sidecar").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "nodeName": NODE,
            "initContainers": [{"name": "s", "image": "registry.k8s.io/pause:3.10",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "50m"}, "limits": {"cpu": "100m"}}}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}]
        }
    }))
    .expect("pod json");
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    let patch = Patch::Strategic(json!({"spec": {"initContainers": [
        {"name": "s", "resources": {"limits": {"cpu": "300m"}}}
    ]}}));
    let pod = admitted(&api, "p", patch).await;
    let init = &pod.spec.expect("spec").init_containers.expect("init")[0];
    let r = serde_json::to_value(&init.resources).expect("json");
    assert_eq!(r["limits"]["cpu"], "300m");
    assert_eq!(r["requests"]["cpu"], "50m");
}

#[tokio::test]
async fn resize_of_a_pod_whose_node_does_not_exist_is_forbidden() {
    let api = setup("no-node").await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "c",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}]}
    }))
    .expect("pod json");
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    let msg = refused(
        &api,
        "p",
        container_patch(json!({"limits": {"cpu": "600m"}})),
        r#"node "no-such-node" not found"#,
    )
    .await;
    assert!(msg.starts_with(r#"pods "p" is forbidden"#), "{msg}");
}

#[tokio::test]
async fn raising_requests_above_node_allocatable_is_forbidden() {
    let api = setup("over-alloc").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "8"}}}),
        None,
    )
    .await;
    refused(
        &api,
        "p",
        container_patch(json!({"requests": {"cpu": "5"}})),
        "node didn't have enough allocatable resources: cpu, requested: 5000, allocatable: 4000",
    )
    .await;
}

#[tokio::test]
async fn raising_a_limit_above_node_allocatable_is_admitted() {
    let api = setup("limit-over-alloc").await;
    create_pod(
        &api,
        "p",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}),
        None,
    )
    .await;
    let pod = admitted(&api, "p", container_patch(json!({"limits": {"cpu": "6"}}))).await;
    assert_eq!(ctr_res(&pod)["limits"]["cpu"], "6");
}

// ---- docs/kubelet-behaviour.md §4: pod-level resources, gate on --------------------------------

fn pod_level_ab() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}})
}

fn pod_level_cd() -> Value {
    json!({"requests": {"memory": "64Mi"}, "limits": {"memory": "128Mi"}})
}

#[tokio::test]
async fn podlevel_a_pod_limit_resizes_up_and_down_are_admitted() {
    let api = setup("pl-a").await;
    create_pod(
        &api,
        "a",
        json!({"resources": {"requests": {"cpu": "100m"}}}),
        Some(pod_level_ab()),
    )
    .await;
    let p = admitted(&api, "a", pod_patch(json!({"limits": {"cpu": "800m"}}))).await;
    assert_eq!(pod_res(&p)["limits"]["cpu"], "800m");
    let p = admitted(&api, "a", pod_patch(json!({"limits": {"cpu": "300m"}}))).await;
    assert_eq!(pod_res(&p)["limits"]["cpu"], "300m");
    assert_eq!(pod_res(&p)["requests"]["cpu"], "100m");
}

#[tokio::test]
async fn podlevel_b_pod_limit_cannot_go_under_a_container_limit() {
    let api = setup("pl-b").await;
    create_pod(
        &api,
        "b",
        json!({"resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}}}),
        Some(pod_level_ab()),
    )
    .await;
    admitted(&api, "b", pod_patch(json!({"limits": {"cpu": "800m"}}))).await;
    admitted(&api, "b", pod_patch(json!({"limits": {"cpu": "450m"}}))).await;
    refused(
        &api,
        "b",
        pod_patch(json!({"limits": {"cpu": "300m"}})),
        r#"spec.resources.containers[0][cpu].limits: Invalid value: "400m": must be less than or equal to pod limits of 300m"#,
    )
    .await;
    admitted(&api, "b", pod_patch(json!({"limits": {"cpu": "1000m"}}))).await;
    let p = admitted(
        &api,
        "b",
        container_patch(json!({"limits": {"cpu": "900m"}})),
    )
    .await;
    assert_eq!(ctr_res(&p)["limits"]["cpu"], "900m");
    // Both in one patch.
    let both = Patch::Strategic(json!({"spec": {
        "resources": {"limits": {"cpu": "1500m"}},
        "containers": [{"name": "c", "resources": {"limits": {"cpu": "1400m"}}}]
    }}));
    let p = admitted(&api, "b", both).await;
    assert_eq!(pod_res(&p)["limits"]["cpu"], "1500m");
    assert_eq!(ctr_res(&p)["limits"]["cpu"], "1400m");
}

#[tokio::test]
async fn podlevel_c_pod_limit_cannot_go_under_the_pod_request() {
    let api = setup("pl-c").await;
    let created = create_pod(
        &api,
        "c",
        json!({"resources": {"requests": {"cpu": "110m"}}}),
        Some(pod_level_cd()),
    )
    .await;
    // Defaulting fills in a pod-level CPU request (sum of container requests), no limit.
    let r = pod_res(&created);
    assert_eq!(
        r["requests"]["cpu"], "110m",
        "pod-level resources at create: {r}"
    );
    assert!(
        r["limits"].get("cpu").is_none(),
        "pod-level resources at create: {r}"
    );
    let p = admitted(&api, "c", pod_patch(json!({"limits": {"cpu": "800m"}}))).await;
    assert_eq!(pod_res(&p)["limits"]["cpu"], "800m");
    admitted(&api, "c", pod_patch(json!({"limits": {"cpu": "200m"}}))).await;
    refused(
        &api,
        "c",
        pod_patch(json!({"limits": {"cpu": "100m"}})),
        r#"spec.resources.requests: Invalid value: "110m": must be less than or equal to cpu limit of 100m"#,
    )
    .await;
}

#[tokio::test]
async fn podlevel_d_container_limit_is_a_sub_cap_of_the_pod_limit() {
    let api = setup("pl-d").await;
    let created = create_pod(
        &api,
        "d",
        json!({"resources": {"requests": {"cpu": "110m"}, "limits": {"cpu": "110m"}}}),
        Some(pod_level_cd()),
    )
    .await;
    // Every container sets a CPU limit, so a pod-level limit is filled in.
    let r = pod_res(&created);
    assert_eq!(
        r["limits"]["cpu"], "110m",
        "pod-level resources at create: {r}"
    );
    admitted(&api, "d", pod_patch(json!({"limits": {"cpu": "800m"}}))).await;
    admitted(
        &api,
        "d",
        container_patch(json!({"limits": {"cpu": "700m"}})),
    )
    .await;
    refused(
        &api,
        "d",
        pod_patch(json!({"limits": {"cpu": "300m"}})),
        r#"spec.resources.containers[0][cpu].limits: Invalid value: "700m": must be less than or equal to pod limits of 300m"#,
    )
    .await;
}

#[tokio::test]
async fn podlevel_e_limit_down_to_the_request_would_make_it_guaranteed_and_is_refused() {
    let api = setup("pl-e").await;
    create_pod(
        &api,
        "e",
        json!({"resources": {"requests": {"cpu": "100m"}}}),
        Some(json!({"requests": {"cpu": "100m", "memory": "128Mi"},
                    "limits": {"cpu": "500m", "memory": "128Mi"}})),
    )
    .await;
    refused(
        &api,
        "e",
        pod_patch(json!({"limits": {"cpu": "100m"}})),
        QOS_REFUSAL,
    )
    .await;
    let p = admitted(&api, "e", pod_patch(json!({"limits": {"cpu": "101m"}}))).await;
    assert_eq!(pod_res(&p)["limits"]["cpu"], "101m");
}

#[tokio::test]
async fn podlevel_f_guaranteed_through_pod_level_resources_cannot_be_raised() {
    let api = setup("pl-f").await;
    create_pod(
        &api,
        "f",
        json!({"resources": {"requests": {"cpu": "100m"}}}),
        Some(json!({"requests": {"cpu": "500m", "memory": "128Mi"},
                    "limits": {"cpu": "500m", "memory": "128Mi"}})),
    )
    .await;
    refused(
        &api,
        "f",
        pod_patch(json!({"limits": {"cpu": "600m"}})),
        QOS_REFUSAL,
    )
    .await;
}

#[tokio::test]
async fn podlevel_resize_on_a_node_not_declaring_the_feature_is_forbidden() {
    // Not in docs/kubelet-behaviour.md: 1.37's NodeDeclaredFeatures admission requires the
    // Node to list the feature in status.declaredFeatures (a 1.37 kubelet with
    // the gate on does). Container-only resizes need no declared feature.
    let api = setup("pl-undeclared").await;
    let cp = ControlPlane::shared();
    cp.ensure_node("plain-node", "4", "16Gi", &[])
        .await
        .expect("node");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"nodeName": "plain-node", "resources": pod_level_ab(), "containers": [{
            "name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m"}}}]}
    }))
    .expect("pod json");
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    refused(
        &api,
        "p",
        pod_patch(json!({"limits": {"cpu": "800m"}})),
        r#"pods "p" is forbidden: pod update requires features InPlacePodLevelResourcesVerticalScaling which are not available on node "plain-node""#,
    )
    .await;
}

#[tokio::test]
async fn podlevel_gate_is_reported_on_in_metrics() {
    let cp = ControlPlane::shared();
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let metrics = cp.client().await.request_text(req).await.expect("/metrics");
    assert!(
        metrics.contains(
            r#"kubernetes_feature_enabled{name="InPlacePodLevelResourcesVerticalScaling",stage="BETA"} 1"#
        ),
        "gate line: {:?}",
        metrics.lines().find(|l| l.contains("InPlacePodLevelResourcesVerticalScaling"))
    );
}
