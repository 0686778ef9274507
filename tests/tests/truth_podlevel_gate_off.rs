//! Truth suite, docs/kubelet-behaviour.md §4 with `InPlacePodLevelResourcesVerticalScaling=false`
//! on the v1.37.2 binary (what a 1.35 cluster does): any resize of a pod with
//! `spec.resources` is refused, even one that touches only a container.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PostParams};
use serde_json::{Value, json};
use testkit::control_plane::{ControlPlane, ControlPlaneOptions, api_message, resize};

const GATE: &str = "InPlacePodLevelResourcesVerticalScaling";

/// docs/kubelet-behaviour.md quotes `The Pod "<name>" is invalid: ...`; the server's Status
/// message has no leading "The " (kubectl adds it when printing).
fn forbidden(name: &str) -> String {
    format!(
        "Pod \"{name}\" is invalid: []: Forbidden: resize of pods with pod-level resources is \
         forbidden when InPlacePodLevelResourcesVerticalScalingEnabled feature gate is disabled"
    )
}

fn cp() -> &'static ControlPlane {
    ControlPlane::shared_with(
        "podlevel-gate-off",
        ControlPlaneOptions::default().with_gate(GATE, false),
    )
}

const NODE: &str = "truth-node";

async fn setup(prefix: &str) -> Api<Pod> {
    let cp = cp();
    cp.ensure_node(NODE, "4", "16Gi", &[GATE])
        .await
        .expect("node");
    let ns = cp.namespace(prefix).await;
    Api::namespaced(cp.client().await, &ns)
}

async fn create(api: &Api<Pod>, name: &str, pod_resources: Option<Value>) {
    let mut spec = json!({
        "nodeName": NODE,
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}}}]
    });
    if let Some(r) = pod_resources {
        spec["resources"] = r;
    }
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
        .expect("pod json");
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

fn pod_level() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}})
}

async fn expect_forbidden(api: &Api<Pod>, name: &str, patch: Patch<Value>, dry_run: bool) {
    let err = resize(api, name, &patch, dry_run)
        .await
        .expect_err("resize of a pod with pod-level resources admitted with the gate off");
    let msg = api_message(&err).unwrap_or_else(|| panic!("not an API error: {err}"));
    assert_eq!(msg, forbidden(name));
}

#[tokio::test]
async fn pod_level_limit_resize_is_forbidden() {
    let api = setup("off-pod").await;
    create(&api, "p", Some(pod_level())).await;
    let patch = Patch::Strategic(json!({"spec": {"resources": {"limits": {"cpu": "800m"}}}}));
    expect_forbidden(&api, "p", patch, false).await;
}

#[tokio::test]
async fn container_only_resize_of_a_pod_with_pod_level_resources_is_forbidden() {
    let api = setup("off-ctr").await;
    create(&api, "p", Some(pod_level())).await;
    let patch = Patch::Strategic(json!({"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"cpu": "450m"}}}
    ]}}));
    expect_forbidden(&api, "p", patch, false).await;
}

#[tokio::test]
async fn dry_run_resize_detects_the_gate() {
    let api = setup("off-dry").await;
    create(&api, "p", Some(pod_level())).await;
    let patch = Patch::Strategic(json!({"spec": {"resources": {"limits": {"cpu": "500m"}}}}));
    expect_forbidden(&api, "p", patch, true).await;
}

#[tokio::test]
async fn container_level_pods_still_resize_with_the_gate_off() {
    let api = setup("off-plain").await;
    create(&api, "p", None).await;
    let patch = Patch::Strategic(json!({"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"cpu": "800m"}}}
    ]}}));
    let pod = resize(&api, "p", &patch, false)
        .await
        .expect("resize refused");
    let r = serde_json::to_value(&pod.spec.expect("spec").containers[0].resources).expect("json");
    assert_eq!(r["limits"]["cpu"], "800m");
}

#[tokio::test]
async fn gate_is_reported_off_in_metrics() {
    // Stage is BETA on 1.37 and ALPHA on 1.35 (HEADROOM_APISERVER_VERSION=v1.35.4).
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let metrics = cp()
        .client()
        .await
        .request_text(req)
        .await
        .expect("/metrics");
    let prefix = format!(r#"kubernetes_feature_enabled{{name="{GATE}",stage="#);
    let line = metrics.lines().find(|l| l.starts_with(&prefix));
    assert!(
        line.is_some_and(|l| l.ends_with("} 0")),
        "gate line: {line:?}"
    );
}
