//! Opting in never lowers a limit on an idle node (issue 15): the default
//! ceiling is never below the limit the workload declares, whether the agent
//! sees the pod before it changed anything or, after a restart, reads the
//! declared limit from the owner's pod template. Real kube-apiserver,
//! simulated kubelet, real agent process; outcomes read from the apiserver.

use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use testkit::agent::fast_args;
use testkit::scenario::pod::touched_by_agent;
use testkit::scenario::{Scenario, quick_kubelet};
use testkit::workload::container_limit_m;

/// One simulated node, no agent yet, in a fresh opted-in namespace.
async fn node(prefix: &str) -> Scenario<'static> {
    Scenario::builder(prefix).sim(quick_kubelet).start().await
}

/// A resize as an earlier agent sent it: the agent's field manager.
async fn resize_as_agent(n: &Scenario<'_>, name: &str, limit: &str) {
    n.resize_as(name, "headroom-agent", limit)
        .await
        .expect("resize as the agent");
}

fn container(req: &str, lim: &str) -> Value {
    json!({"name": "app", "image": "registry.k8s.io/pause:3.10",
           "resources": {"requests": {"cpu": req, "memory": "64Mi"}, "limits": {"cpu": lim}}})
}

fn pod(name: &str, node: &str, req: &str, lim: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"nodeName": node, "containers": [container(req, lim)]}})
}

/// The `why` of every `resized` line the agent logged for `pod`.
fn resized_reasons(log: &str, pod: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(" resized") && l.contains(pod))
        .filter_map(|l| l.split("why=").nth(1).map(|w| w.trim().to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opting_in_on_an_idle_node_never_lowers_a_declared_limit() {
    let mut n = node("declared-idle").await;
    // 4 × request (40m) is below the declared 100m: the old default ceiling
    // lowered it on the first tick.
    n.create(pod("small", n.node(), "10m", "100m")).await;
    // A control: a pod whose ceiling is above its limit is raised, so the
    // agent is deciding and acting while `small` keeps its limit.
    n.create(pod("open", n.node(), "100m", "150m")).await;
    n.wait_running("small").await;
    n.wait_running("open").await;
    n.start_agent(0, fast_args()).await;
    let agent = n.agent();
    n.wait_pod("open", "raised to 400m", |p| {
        container_limit_m(p) == Some(400)
    })
    .await;
    // Several more ticks (200 ms each) with the node idle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let small = n.get("small").await;
    assert_eq!(container_limit_m(&small), Some(100), "declared limit kept");
    assert!(!touched_by_agent(&small), "no resize of small was sent");
    let log = agent.log();
    assert!(
        resized_reasons(&log, "small").is_empty(),
        "{}",
        agent.log_tail(40)
    );
    // The reason logged for the raise states this round's figures.
    let why = resized_reasons(&log, "/open");
    assert_eq!(why.len(), 1, "{}", agent.log_tail(40));
    assert!(
        why[0].contains("raise 150m→400m: slack ") && why[0].contains("ceiling 400m"),
        "{why:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_declared_limit_comes_from_the_owners_template() {
    let mut n = node("declared-owner").await;
    // A ReplicaSet whose template declares 10m/100m (no controller-manager
    // runs here, so it creates no pods of its own: replicas 0).
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [container("10m", "100m")]}}}
    }))
    .unwrap();
    let rs = Api::<ReplicaSet>::namespaced(n.client.clone(), &n.ns)
        .create(&PostParams::default(), &rs)
        .await
        .expect("create replicaset");
    let owner = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                        "uid": rs.metadata.uid, "controller": true}]);
    let mut owned = pod("web-1", n.node(), "10m", "100m");
    owned["metadata"]["labels"] = json!({"app": "web"});
    owned["metadata"]["ownerReferences"] = owner;
    n.create(owned).await;
    // A bare pod: nothing records what it declared once the agent changed it.
    n.create(pod("bare", n.node(), "10m", "100m")).await;
    n.wait_running("web-1").await;
    n.wait_running("bare").await;
    // An earlier agent lowered both to 30m (the node was busy), then restarted.
    resize_as_agent(&n, "web-1", "30m").await;
    resize_as_agent(&n, "bare", "30m").await;
    for p in ["web-1", "bare"] {
        n.wait_pod(p, "at 30m", |p| container_limit_m(p) == Some(30))
            .await;
    }
    n.start_agent(0, fast_args()).await;
    let agent = n.agent();
    // The template's 100m is the ceiling's lower bound: back to it.
    n.wait_pod("web-1", "back at the declared 100m", |p| {
        container_limit_m(p) == Some(100)
    })
    .await;
    // The bare pod: only 4 × request (40m) — what is known. Never below 30m.
    n.wait_pod("bare", "raised to 40m", |p| {
        container_limit_m(p) == Some(40)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(container_limit_m(&n.get("web-1").await), Some(100));
    assert_eq!(container_limit_m(&n.get("bare").await), Some(40));
    assert!(
        agent
            .log()
            .contains("declared limits read from the owner's pod template"),
        "{}",
        agent.log_tail(40)
    );
}

/// docs/kubelet-behaviour.md §9: a resize sent with a field manager makes it
/// the manager of the limits it changed; a later resize by someone else
/// takes them over. The agent reads "whose limits are these" from this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_fields_name_who_last_set_a_limit() {
    let n = node("declared-fields").await;
    n.create(pod("p", n.node(), "10m", "100m")).await;
    n.wait_running("p").await;
    let view = |p: &Pod| headroom::model::PodView::try_from(p).unwrap();
    let p = n.get("p").await;
    assert!(!view(&p).limits_set_by_headroom, "created by the user");
    resize_as_agent(&n, "p", "200m").await;
    let p = n.get("p").await;
    assert!(
        view(&p).limits_set_by_headroom,
        "{:?}",
        p.metadata.managed_fields
    );
    // The user resizes it back: the limit is theirs again.
    n.resize_as("p", "kubectl", "150m")
        .await
        .expect("user resize");
    let p = n.get("p").await;
    assert!(
        !view(&p).limits_set_by_headroom,
        "{:?}",
        p.metadata.managed_fields
    );
    // The view and what the agent keeps of the pod (slim_pod) agree.
    let mut slim = p.clone();
    headroom::kube::watch::slim_pod(&mut slim);
    assert_eq!(
        view(&slim).limits_set_by_headroom,
        view(&p).limits_set_by_headroom
    );
}
