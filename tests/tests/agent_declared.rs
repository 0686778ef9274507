//! Opting in never lowers a limit on an idle node (issue 15): the default
//! ceiling is never below the limit the workload declares, whether the agent
//! sees the pod before it changed anything or, after a restart, reads the
//! declared limit from the owner's pod template. Real kube-apiserver,
//! simulated kubelet, real agent process; outcomes read from the apiserver.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tempfile::TempDir;
use testkit::agent::{AgentProcess, fast_args};
use testkit::control_plane::ControlPlane;
use testkit::kubelet_sim::{SimConfig, SimKubelet};

const WAIT: Duration = Duration::from_secs(60);

struct Node {
    client: Client,
    ns: String,
    name: String,
    _sim: SimKubelet,
    dir: TempDir,
    root: std::path::PathBuf,
}

impl Node {
    async fn start(prefix: &str) -> Node {
        let cp = ControlPlane::shared();
        let client = cp.client().await;
        let ns = cp.namespace(prefix).await;
        testkit::workload::opt_in(&client, &ns)
            .await
            .expect("opt the namespace in");
        let dir = tempfile::tempdir().expect("tempdir");
        let name = format!("{ns}-n0");
        let root = dir.path().join("cg");
        let mut cfg = SimConfig::new(&name, &root);
        cfg.resize_delay = Duration::from_millis(100);
        cfg.status_delay = Duration::from_millis(100);
        let sim = SimKubelet::start(client.clone(), cfg)
            .await
            .expect("sim starts");
        cp.wait_node_admissible(&name)
            .await
            .expect("node admissible");
        Node {
            client,
            ns,
            name,
            _sim: sim,
            dir,
            root,
        }
    }

    async fn agent(&self) -> AgentProcess {
        AgentProcess::start(
            ControlPlane::shared().kubeconfig_path(),
            &self.name,
            &self.root,
            self.dir.path(),
            &fast_args(),
        )
        .await
        .expect("agent starts")
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create(&self, pod: Value) {
        let pod: Pod = serde_json::from_value(pod).expect("pod json");
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }

    async fn wait_for(
        &self,
        name: &str,
        what: &str,
        agent: Option<&AgentProcess>,
        f: impl Fn(&Pod) -> bool,
    ) {
        let t0 = Instant::now();
        loop {
            let p = self.pods().get(name).await.expect("get pod");
            if f(&p) {
                return;
            }
            if t0.elapsed() > WAIT {
                panic!(
                    "{name}: {what} not reached in {WAIT:?}: limit {:?}\nagent log:\n{}",
                    testkit::workload::container_limit_m(&p),
                    agent.map(|a| a.log_tail(40)).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_running(&self, name: &str) {
        self.wait_for(name, "Running", None, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await;
    }

    /// A resize as an earlier agent sent it: the agent's field manager.
    async fn resize_as_agent(&self, name: &str, limit: &str) {
        self.pods()
            .patch_subresource(
                "resize",
                name,
                &PatchParams {
                    field_manager: Some("headroom-agent".into()),
                    ..Default::default()
                },
                &Patch::Strategic(json!({"spec": {"containers": [
                    {"name": "app", "resources": {"limits": {"cpu": limit}}}]}})),
            )
            .await
            .expect("resize as the agent");
    }
}

fn container(req: &str, lim: &str) -> Value {
    json!({"name": "app", "image": "registry.k8s.io/pause:3.10",
           "resources": {"requests": {"cpu": req, "memory": "64Mi"}, "limits": {"cpu": lim}}})
}

fn pod(name: &str, node: &str, req: &str, lim: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"nodeName": node, "containers": [container(req, lim)]}})
}

fn touched_by_agent(p: &Pod) -> bool {
    p.metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some("headroom-agent"))
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
    let n = Node::start("declared-idle").await;
    // 4 × request (40m) is below the declared 100m: the old default ceiling
    // lowered it on the first tick.
    n.create(pod("small", &n.name, "10m", "100m")).await;
    // A control: a pod whose ceiling is above its limit is raised, so the
    // agent is deciding and acting while `small` keeps its limit.
    n.create(pod("open", &n.name, "100m", "150m")).await;
    n.wait_running("small").await;
    n.wait_running("open").await;
    let agent = n.agent().await;
    n.wait_for("open", "raised to 400m", Some(&agent), |p| {
        testkit::workload::container_limit_m(p) == Some(400)
    })
    .await;
    // Several more ticks (200 ms each) with the node idle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let small = n.pods().get("small").await.unwrap();
    assert_eq!(
        testkit::workload::container_limit_m(&small),
        Some(100),
        "declared limit kept"
    );
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
    let n = Node::start("declared-owner").await;
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
    let mut owned = pod("web-1", &n.name, "10m", "100m");
    owned["metadata"]["labels"] = json!({"app": "web"});
    owned["metadata"]["ownerReferences"] = owner;
    n.create(owned).await;
    // A bare pod: nothing records what it declared once the agent changed it.
    n.create(pod("bare", &n.name, "10m", "100m")).await;
    n.wait_running("web-1").await;
    n.wait_running("bare").await;
    // An earlier agent lowered both to 30m (the node was busy), then restarted.
    n.resize_as_agent("web-1", "30m").await;
    n.resize_as_agent("bare", "30m").await;
    for p in ["web-1", "bare"] {
        n.wait_for(p, "at 30m", None, |p| {
            testkit::workload::container_limit_m(p) == Some(30)
        })
        .await;
    }
    let agent = n.agent().await;
    // The template's 100m is the ceiling's lower bound: back to it.
    n.wait_for("web-1", "back at the declared 100m", Some(&agent), |p| {
        testkit::workload::container_limit_m(p) == Some(100)
    })
    .await;
    // The bare pod: only 4 × request (40m) — what is known. Never below 30m.
    n.wait_for("bare", "raised to 40m", Some(&agent), |p| {
        testkit::workload::container_limit_m(p) == Some(40)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        testkit::workload::container_limit_m(&n.pods().get("web-1").await.unwrap()),
        Some(100)
    );
    assert_eq!(
        testkit::workload::container_limit_m(&n.pods().get("bare").await.unwrap()),
        Some(40)
    );
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
    let n = Node::start("declared-fields").await;
    n.create(pod("p", &n.name, "10m", "100m")).await;
    n.wait_running("p").await;
    let view = |p: &Pod| headroom::model::PodView::try_from(p).unwrap();
    let p = n.pods().get("p").await.unwrap();
    assert!(!view(&p).limits_set_by_headroom, "created by the user");
    n.resize_as_agent("p", "200m").await;
    let p = n.pods().get("p").await.unwrap();
    assert!(
        view(&p).limits_set_by_headroom,
        "{:?}",
        p.metadata.managed_fields
    );
    // The user resizes it back: the limit is theirs again.
    n.pods()
        .patch_subresource(
            "resize",
            "p",
            &PatchParams {
                field_manager: Some("kubectl".into()),
                ..Default::default()
            },
            &Patch::Strategic(json!({"spec": {"containers": [
                {"name": "app", "resources": {"limits": {"cpu": "150m"}}}]}})),
        )
        .await
        .expect("user resize");
    let p = n.pods().get("p").await.unwrap();
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
