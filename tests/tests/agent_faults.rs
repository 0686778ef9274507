//! Faults survived: a real kube-apiserver, a simulated kubelet and the real
//! `headroom-agent`, with a fault landing between a resize patch and its
//! verification. The faults: the apiserver restarts; the pod watch expires
//! (410 Gone after an etcd compaction); the agent is SIGKILLed and started
//! again; the Node object is deleted and recreated; the pod is deleted.
//!
//! Every test holds the resize in flight the same way: the simulated kubelet
//! acknowledges the agent's patch (`PodResizeInProgress=True`,
//! `observedGeneration` moved) but does not apply it (`Fault::NeverApply`)
//! until the test releases it, so the fault is sure to land between the
//! patch and its verification. The agent runs with a verification grace of
//! 120 s (`--drift-grace`), longer than any wait here: a resize can then only
//! be counted verified once the agent has seen the kubelet report it done,
//! never by the grace running out.
//!
//! After each fault the test asserts: no panic (process alive unless the test
//! killed it, no "panicked" in any log); no duplicate or stray patch (the
//! agent's `applied` counter equals the generation bumps of the pod, the pod
//! on the other node, which has no agent, is never written by the agent);
//! verification resumes (`headroom_resizes_total{result="verified"}` grows);
//! metric series stay bounded (per-pod series only for live managed pods,
//! `headroom_pods` counts each pod of the node once, no drift gauge); and the
//! agent converges (the limit reaches its target and stays there, and a pod
//! created after the fault is raised by one patch, verified).
//!
//! Every node stays idle, so every target is the ceiling (request × 4). A
//! saturated node would do for convergence too, but on a busy test machine
//! the simulator's counter ticks lag now and then, and a one-interval dip in
//! kubepods usage reads as slack: a raise and a lowering right after, which
//! would blur the patch counts asserted here.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use prometheus_parse::Scrape;
use serde_json::json;
use testkit::agent::{fast_args_with, metric, pod_series};
use testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use testkit::kubelet_sim::Fault;
use testkit::scenario::pod::{burstable, generation, has_condition, touched_by_agent};
use testkit::scenario::{Scenario, quick_kubelet};

const RESIZES: &str = "headroom_resizes_total";
/// Pod "a": request 100m, limit 150m; ceiling = request × 4.
const CEILING_MAX: &str = "40000 100000";

/// `fast_args()` with a verification (and drift) grace far longer than any
/// wait of these tests (see the module docs).
fn agent_args() -> Vec<String> {
    fast_args_with(&[("--drift-grace", "120s")])
}

/// Two simulated nodes on `cp`, the agent on node 0, an opted-in namespace
/// with a pod "other" on node 1, which has no agent: it must never be
/// written. Pod "a" (not created yet) will be held in flight. Every pod is
/// idle: the agent raises limits to their ceilings.
async fn setup<'a>(cp: &'a ControlPlane, prefix: &str) -> Scenario<'a> {
    let mut fx = Scenario::builder(prefix)
        .control_plane(cp)
        .nodes(2)
        .sim(quick_kubelet)
        .start()
        .await;
    fx.sim().set_fault(&fx.ns, "a", Fault::NeverApply);
    fx.start_agent(0, agent_args()).await;
    fx.create(burstable("other", &fx.nodes[1].name, "100m", Some("150m")))
        .await;
    fx.wait_running("other").await;
    fx
}

/// The container "app"'s CPU limit in millicores.
fn cpu_limit_m(p: &Pod) -> Option<u64> {
    testkit::scenario::pod::cpu_limit_m(p, "app")
}

fn in_progress(p: &Pod) -> bool {
    has_condition(p, "PodResizeInProgress")
}

/// `headroom_resizes_total{result}`, summed over directions.
fn resizes(s: &Scrape, result: &str) -> f64 {
    metric(s, RESIZES, &[("result", result)]).unwrap_or(0.0)
}

/// `cpu.max` of container "app" of `name` on node 0, as on disk.
fn cpu_max(fx: &Scenario<'_>, name: &str) -> Option<String> {
    fx.cpu_max(name, "app")
}

async fn wait_cpu_max(fx: &Scenario<'_>, name: &str, want: &str) {
    fx.wait_cpu_max(name, "app", want).await;
}

/// Waits until the agent's raise of `name` is patched (generation 2)
/// and acknowledged by the kubelet but not applied: in flight.
async fn wait_in_flight(fx: &Scenario<'_>, name: &str) {
    fx.wait_pod(name, "resize patched and in progress", |p| {
        generation(p) == 2 && cpu_limit_m(p) == Some(400) && in_progress(p)
    })
    .await;
    assert_eq!(
        cpu_max(fx, name).as_deref(),
        Some("15000 100000"),
        "the held resize must not be applied yet"
    );
}

/// Lets the simulated kubelet apply `name`'s resizes again.
fn release(fx: &Scenario<'_>, name: &str) {
    fx.sim().set_fault(&fx.ns, name, Fault::None);
}

async fn wait_resizes(fx: &Scenario<'_>, result: &str, at_least: f64) -> Scrape {
    let what = format!("{RESIZES}{{result={result:?}}} ≥ {at_least}");
    fx.wait_metrics(&what, |s| resizes(s, result) >= at_least)
        .await
        .0
}

/// The pod on the node without an agent was never written by it.
async fn assert_other_node_untouched(fx: &Scenario<'_>) {
    let p = fx.get("other").await;
    assert_eq!(generation(&p), 1, "the pod on the other node was resized");
    assert_eq!(cpu_limit_m(&p), Some(150));
    assert!(
        !touched_by_agent(&p),
        "the agent's field manager wrote the other node's pod"
    );
}

/// Series stay bounded: per-pod series exist only for the live managed
/// pods of this namespace on this node (`managed`), no drift gauge is
/// left, and `headroom_pods` counts every pod of the node exactly once
/// (a re-list must not count a pod twice). Waits for the agent's next
/// ticks to catch up, then asserts.
async fn assert_series_bounded(fx: &Scenario<'_>, managed: &[&str]) {
    let want: BTreeSet<String> = managed.iter().map(|s| s.to_string()).collect();
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", fx.node()));
    let all = Api::<Pod>::all(fx.client.clone());
    fx.wait("series bounded", || async {
        let on_node = all
            .list(&on_node)
            .await
            .expect("list pods of the node")
            .items
            .len() as f64;
        let s = fx.scrape().await;
        let have = pod_series(&s, &fx.ns);
        let counted = metric(&s, "headroom_pods", &[]).unwrap_or(0.0);
        let drift = metric(&s, "headroom_cgroup_drift", &[("namespace", &fx.ns)]);
        if have == want && counted == on_node && drift.is_none() {
            return Ok(());
        }
        Err(format!(
            "per-pod series for {have:?} (want {want:?}), headroom_pods {counted} for \
             {on_node} pods on the node, drift {drift:?}"
        ))
    })
    .await;
}

/// Converged and quiet: each pod stays at its generation, at its
/// ceiling in cpu.max and out of resize over 5 s (25 ticks).
async fn assert_quiet(fx: &Scenario<'_>, pods: &[(&str, i64)]) {
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (name, g) in pods {
        let p = fx.get(name).await;
        assert_eq!(
            generation(&p),
            *g,
            "{name} patched again after converging:\n{}",
            fx.logs()
        );
        assert_eq!(cpu_max(fx, name).as_deref(), Some(CEILING_MAX));
        assert!(!in_progress(&p), "{name} still resizing");
    }
}

/// No duplicate patch: every patch this agent counted as applied moved a
/// pod's generation (an identical patch sent twice is accepted and counted
/// but moves nothing). `since`: each pod's generation when this agent
/// process started (1 for a pod created after it).
async fn assert_patches_match_generations(fx: &Scenario<'_>, since: &[(&str, i64)]) {
    let s = fx.scrape().await;
    let mut bumps = 0;
    for (name, g) in since {
        bumps += generation(&fx.get(name).await) - g;
    }
    assert_eq!(
        resizes(&s, "applied"),
        bumps as f64,
        "patches applied by this agent vs generation bumps of {since:?}:\n{}",
        fx.logs()
    );
}

/// Converges after the fault: a pod created now is raised to its ceiling
/// by one patch, which is verified (`verified` grows past `verified_before`).
async fn new_pod_is_raised_and_verified(fx: &Scenario<'_>, verified_before: f64) {
    fx.create(burstable("b", fx.node(), "100m", Some("150m")))
        .await;
    fx.wait_pod("b", "raised to its ceiling", |p| {
        cpu_limit_m(p) == Some(400)
    })
    .await;
    wait_cpu_max(fx, "b", CEILING_MAX).await;
    wait_resizes(fx, "verified", verified_before + 1.0).await;
}

/// The end state after every fault: pods "a" and "b" quiet at their
/// ceilings, one patch each since `since` (their generations when this
/// agent started), nothing unverified, the other node's pod untouched,
/// series bounded, no panic.
async fn assert_converged(fx: &mut Scenario<'_>, since: &[(&str, i64)]) {
    assert_quiet(fx, &[("a", 2), ("b", 2)]).await;
    assert_patches_match_generations(fx, since).await;
    assert_eq!(resizes(&fx.scrape().await, "unverified"), 0.0);
    assert_other_node_untouched(fx).await;
    assert_series_bounded(fx, &["a", "b"]).await;
    fx.assert_no_panic();
}

/// Agent log lines of the pod watch that report a 410 (expired
/// resourceVersion).
fn gone_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("watch error") && l.contains("pods"))
        .filter(|l| l.contains("410") || l.contains("too old") || l.contains("Expired"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_restart_in_the_middle_of_a_resize() {
    // A control plane of its own: other tests keep theirs.
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let mut fx = setup(&cp, "apirestart").await;
    fx.create(burstable("a", fx.node(), "100m", Some("150m")))
        .await;
    wait_in_flight(&fx, "a").await;
    let s = fx.scrape().await;
    assert_eq!(resizes(&s, "applied"), 1.0);
    assert_eq!(resizes(&s, "verified"), 0.0);

    cp.kill_apiserver().expect("kill kube-apiserver");
    // The kubelet applies the resize while the apiserver is away; its
    // status report (done) can only reach the agent after the restart.
    release(&fx, "a");
    wait_cpu_max(&fx, "a", CEILING_MAX).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, _) = fx.agent().get("/healthz").await.expect("agent serves");
    assert_eq!(code, 200);
    assert_eq!(
        resizes(&fx.scrape().await, "verified"),
        0.0,
        "verified without the kubelet's status: the test would prove nothing"
    );

    let took = cp.start_apiserver().await.expect("restart kube-apiserver");
    eprintln!("measured: kube-apiserver ready {took:?} after its restart");
    // Verification resumes: the resize in flight is verified once the
    // agent's watch is back and shows the kubelet done.
    wait_resizes(&fx, "verified", 1.0).await;
    assert_quiet(&fx, &[("a", 2)]).await;
    assert_patches_match_generations(&fx, &[("a", 1)]).await;

    // Converges after the fault: patches go through the new apiserver.
    new_pod_is_raised_and_verified(&fx, 1.0).await;
    assert_converged(&mut fx, &[("a", 1), ("b", 1)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_watch_expired_by_etcd_compaction_is_relisted_and_verification_resumes() {
    // Watches served from etcd, not from the apiserver's watch cache: then
    // whether a resumed watch is answered 410 depends on etcd's compaction
    // alone (the watch cache has a window of its own, and a restarted
    // apiserver's cache starts empty, which would answer 410 anyway).
    let cp = ControlPlane::start(ControlPlaneOptions {
        extra_args: vec!["--watch-cache=false".into()],
        ..ControlPlaneOptions::default()
    })
    .await
    .expect("control plane");
    let mut fx = setup(&cp, "compact").await;
    fx.create(burstable("a", fx.node(), "100m", Some("150m")))
        .await;
    wait_in_flight(&fx, "a").await;
    assert!(
        gone_lines(&fx.agent().log()).is_empty(),
        "a 410 before the fault"
    );

    // Writes the agent's pod watch does not see, so its resourceVersion
    // falls behind etcd's revision; then that history is compacted away.
    let cms: Api<ConfigMap> = Api::namespaced(fx.client.clone(), &fx.ns);
    for i in 0..5 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("churn-{i}")}}))
                .expect("configmap");
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("create configmap");
    }
    let rev = cp.compact_etcd().await.expect("compact etcd");
    eprintln!("compacted etcd at revision {rev}");
    // The watch connection breaks (the apiserver goes away and comes
    // back); the agent resumes from its last resourceVersion: compacted.
    cp.kill_apiserver().expect("kill kube-apiserver");
    cp.start_apiserver().await.expect("restart kube-apiserver");
    fx.wait("a 410 Gone on the agent's pod watch", || async {
        !gone_lines(&fx.agent().log()).is_empty()
    })
    .await;
    eprintln!(
        "agent saw: {}",
        gone_lines(&fx.agent().log()).first().copied().unwrap_or("")
    );
    assert_eq!(resizes(&fx.scrape().await, "verified"), 0.0);

    // The re-listed cache still carries the resize in flight.
    release(&fx, "a");
    wait_cpu_max(&fx, "a", CEILING_MAX).await;
    wait_resizes(&fx, "verified", 1.0).await;
    assert_quiet(&fx, &[("a", 2)]).await;
    assert_patches_match_generations(&fx, &[("a", 1)]).await;
    // The re-list leaves no stale or doubled pod behind.
    assert_series_bounded(&fx, &["a"]).await;

    new_pod_is_raised_and_verified(&fx, 1.0).await;
    assert_converged(&mut fx, &[("a", 1), ("b", 1)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sigkilled_between_patch_and_verification_is_started_again() {
    let cp = ControlPlane::shared();
    let mut fx = setup(cp, "sigkill").await;
    fx.create(burstable("a", fx.node(), "100m", Some("150m")))
        .await;
    wait_in_flight(&fx, "a").await;

    // SIGKILL: no shutdown path runs. Then the same agent starts again.
    fx.kill_agent(0);
    fx.start_agent(0, agent_args()).await;

    // The new process finds the resize still in flight: it must leave it
    // to the kubelet, not send it again.
    fx.wait_metrics("pod a counted as resizing", |s| {
        metric(
            s,
            "headroom_pods",
            &[("state", "unmanaged"), ("reason", "resize_in_progress")],
        ) == Some(1.0)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    release(&fx, "a");
    wait_cpu_max(&fx, "a", CEILING_MAX).await;
    // Verification resumes in the new process: it knows nothing of the
    // patch, but its audit holds the pod to its spec, finds cpu.max
    // matching (no drift) and reports the pod managed at the limit applied.
    fx.wait_metrics("pod a managed at 400m", |s| {
        metric(
            s,
            "headroom_pod_cpu_limit_millicores",
            &[("namespace", &fx.ns), ("pod", "a")],
        ) == Some(400.0)
    })
    .await;
    assert_quiet(&fx, &[("a", 2)]).await;
    assert_patches_match_generations(&fx, &[("a", 2)]).await;
    assert!(
        !fx.agent().log().contains("cgroup drift"),
        "drift reported for a resize the kubelet completed:\n{}",
        fx.logs()
    );
    assert_series_bounded(&fx, &["a"]).await;

    // Converges after the fault, verifying its own resizes.
    new_pod_is_raised_and_verified(&fx, 0.0).await;
    assert_converged(&mut fx, &[("a", 2), ("b", 1)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_object_deleted_and_recreated_mid_resize() {
    let cp = ControlPlane::shared();
    let mut fx = setup(cp, "nodegone").await;
    fx.create(burstable("a", fx.node(), "100m", Some("150m")))
        .await;
    wait_in_flight(&fx, "a").await;

    let nodes: Api<Node> = Api::all(fx.client.clone());
    nodes
        .delete(fx.node(), &DeleteParams::default())
        .await
        .expect("delete Node");
    fx.wait("Node deleted", || async {
        nodes.get_opt(fx.node()).await.expect("get Node").is_none()
    })
    .await;
    // While the Node is gone the kubelet finishes the resize: verification
    // needs the pod and its cgroups, not the Node.
    release(&fx, "a");
    wait_cpu_max(&fx, "a", CEILING_MAX).await;
    wait_resizes(&fx, "verified", 1.0).await;
    // A new pod the agent wants to raise: resize admission cannot find
    // the Node and refuses. Bounded retries, no patch through.
    fx.create(burstable("b", fx.node(), "100m", Some("150m")))
        .await;
    fx.wait_running("b").await;
    fx.wait_metrics("a refused patch of b", |s| {
        metric(s, "headroom_patch_errors_total", &[]).unwrap_or(0.0) >= 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = fx.scrape().await;
    let errors = metric(&s, "headroom_patch_errors_total", &[]).unwrap_or(0.0);
    eprintln!("measured: {errors} failed patches in ≥ 5 s without a Node");
    assert!(
        errors <= 8.0,
        "{errors} failed patches in ≥ 5 s without a Node: a retry storm (25+ ticks)"
    );
    assert_eq!(generation(&fx.get("b").await), 1, "b resized with no Node");
    // A Node being registered again is no RBAC or policy alarm: such an
    // alarm pauses every patch of the node (30 s, doubling per 403).
    assert_eq!(
        metric(&s, "headroom_patch_errors_total", &[("class", "forbidden")]).unwrap_or(0.0),
        0.0,
        "a missing Node taken for a configuration alarm:\n{}",
        fx.logs()
    );

    // The kubelet registers the Node again; the agent converges.
    fx.sim()
        .register_node(&fx.client)
        .await
        .expect("recreate Node");
    cp.wait_node_admissible(fx.node())
        .await
        .expect("Node admissible again");
    fx.wait_pod("b", "raised to its ceiling", |p| {
        cpu_limit_m(p) == Some(400)
    })
    .await;
    wait_cpu_max(&fx, "b", CEILING_MAX).await;
    wait_resizes(&fx, "verified", 2.0).await;
    assert_converged(&mut fx, &[("a", 1), ("b", 1)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_deleted_during_its_resize_is_forgotten() {
    let cp = ControlPlane::shared();
    let mut fx = setup(cp, "poddel").await;
    let first = fx
        .create(burstable("a", fx.node(), "100m", Some("150m")))
        .await;
    wait_in_flight(&fx, "a").await;

    fx.pods()
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete pod");
    fx.wait("pod a gone", || async {
        fx.pods().get_opt("a").await.expect("get pod").is_none()
    })
    .await;
    // Its series go with it; its resize is neither verified nor sent again.
    assert_series_bounded(&fx, &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = fx.scrape().await;
    assert_eq!(
        resizes(&s, "verified"),
        0.0,
        "a deleted pod's resize verified"
    );
    assert_eq!(resizes(&s, "applied"), 1.0, "patched after the deletion");
    assert_eq!(
        metric(&s, "headroom_patch_errors_total", &[]).unwrap_or(0.0),
        0.0,
        "a patch was tried on the deleted pod:\n{}",
        fx.logs()
    );

    // A new pod of the same name (a new uid) is managed afresh: one patch,
    // verified, nothing inherited from the deleted one.
    release(&fx, "a");
    let second = fx
        .create(burstable("a", fx.node(), "100m", Some("150m")))
        .await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
    fx.wait_pod("a", "raised to its ceiling", |p| {
        cpu_limit_m(p) == Some(400)
    })
    .await;
    wait_cpu_max(&fx, "a", CEILING_MAX).await;
    wait_resizes(&fx, "verified", 1.0).await;
    assert_quiet(&fx, &[("a", 2)]).await;
    // 2 = the deleted pod's patch + this one.
    let s = fx.scrape().await;
    assert_eq!(
        resizes(&s, "applied"),
        2.0,
        "one patch per pod:\n{}",
        fx.logs()
    );
    assert_eq!(resizes(&s, "unverified"), 0.0);
    assert_other_node_untouched(&fx).await;
    assert_series_bounded(&fx, &["a"]).await;
    fx.assert_no_panic();
}
