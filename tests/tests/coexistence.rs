//! Living beside other writers of pod resources (issue 31, docs/coexistence.md):
//! the real VPA updater (v1.8.1, built from its Go module by tests/vpa/build.sh)
//! in place on the same pod as the agent, VPA on requests only beside Headroom
//! on limits, and a person's `kubectl patch --subresource resize`. Real
//! kube-apiserver, simulated kubelet, real agent process; the VPA
//! recommendation is written into the VPA's status by the test (no
//! recommender). Patches are counted from both sides: the agent's `resized`
//! log lines, the updater's "In-place patched pod /resize" lines (`--v=4`),
//! and the pod's `metadata.generation` (every resize that changes the spec
//! bumps it once), which must add up.
//!
//! The VPA tests watch for `HEADROOM_VPA_SOAK_S` seconds (default 60; the
//! issue's 5 minutes is `HEADROOM_VPA_SOAK_S=300`). With the updater every
//! 2 s and the agent every 200 ms, 60 s is 30 updater loops and 300 agent
//! ticks — more rounds of each than 5 minutes at the updater's default 1 min
//! interval and a 1 s agent tick.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use testkit::agent::fast_args;
use testkit::scenario::pod::{cpu_limit_m, cpu_request, generation};
use testkit::scenario::{Scenario, quick_kubelet};
use testkit::vpa::{self, Updater};

/// Field manager `kubectl patch` uses.
const KUBECTL_PATCH: &str = "kubectl-patch";
const YIELDED: &str = "HeadroomYielded";

fn soak() -> Duration {
    let s = std::env::var("HEADROOM_VPA_SOAK_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(s)
}

fn container(req: &str, lim: &str) -> Value {
    json!({"name": "app", "image": "registry.k8s.io/pause:3.10",
           "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
           "resources": {"requests": {"cpu": req, "memory": "64Mi"}, "limits": {"cpu": lim}}})
}

fn request_m(p: &Pod) -> Option<u64> {
    cpu_request(p, "app").and_then(|q| headroom::quantity::cpu_millis(&q).ok())
}

/// `resized` lines the agent logged for pod `name`.
fn agent_resizes(s: &Scenario<'_>, name: &str) -> usize {
    let pod = format!("{}/{name}", s.ns);
    s.agent()
        .log()
        .lines()
        .filter(|l| l.contains(" resized") && l.contains(&pod))
        .count()
}

/// `headroom_pods{state="unmanaged",reason}` on the agent's `/metrics`.
async fn pods_with_reason(s: &Scenario<'_>, reason: &str) -> f64 {
    s.scrape()
        .await
        .samples
        .iter()
        .filter(|m| m.metric == "headroom_pods" && m.labels.get("reason") == Some(reason))
        .map(|m| match m.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum()
}

/// Deployment `web` → ReplicaSet → pod `web-1` on the node (CPU `req`/`lim`,
/// extra pod annotations), Running; the VPA CRDs installed.
async fn workload(s: &Scenario<'_>, req: &str, lim: &str, annotations: Value) {
    vpa::install_crds(&s.client).await.expect("VPA CRDs");
    let c = container(req, lim);
    let owners = vpa::deployment(&s.client, &s.ns, "web", &c)
        .await
        .expect("deployment");
    s.create(json!({
        "metadata": {"name": "web-1", "labels": {"app": "web"}, "ownerReferences": owners,
                     "annotations": annotations},
        "spec": {"nodeName": s.node(), "containers": [c]}
    }))
    .await;
    s.wait_running("web-1").await;
}

/// Waits until pod `web-1` has CPU request `req` and limit `lim` (millicores).
async fn wait_at(s: &Scenario<'_>, what: &str, req: u64, lim: u64) {
    s.wait_pod("web-1", what, |p| {
        request_m(p) == Some(req) && cpu_limit_m(p, "app") == Some(lim)
    })
    .await;
}

/// Sleeps until `until`, failing early if the updater died.
async fn watch_until(u: &mut Updater, until: Instant) {
    while Instant::now() < until {
        assert!(u.is_running(), "updater exited:\n{}", u.log_tail(40));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The supported-only-by-yielding setup: VPA `InPlaceOrRecreate` with the
/// default `controlledValues: RequestsAndLimits` on a pod Headroom manages.
/// VPA resizes request and limit (keeping the pod's limit:request ratio);
/// Headroom sees another manager own the CPU limit, yields (one Event,
/// reason `other_writer`) and never patches the pod again; a second
/// recommendation moves it again, and the pod ends where VPA put it.
/// Without yielding, Headroom would pull the limit back to its 500m ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vpa_in_place_on_limits_headroom_yields_and_the_pod_ends_where_vpa_put_it() {
    let started = Instant::now();
    let window = soak();
    let mut s = Scenario::builder("vpa-limits")
        .sim(quick_kubelet)
        .start()
        .await;
    workload(&s, "100m", "200m", json!({"headroom.dev/ceiling": "500m"})).await;
    s.start_agent(0, fast_args()).await;
    wait_at(&s, "raised by Headroom to its 500m ceiling", 100, 500).await;

    vpa::create_vpa(
        &s.client,
        &s.ns,
        vpa::vpa("web", "web", "InPlaceOrRecreate", "RequestsAndLimits"),
    )
    .await
    .unwrap();
    vpa::recommend(&s.client, &s.ns, "web", "250m")
        .await
        .unwrap();
    let mut u = Updater::start(s.cp, &s.ns, s.dir.path(), Duration::from_secs(2), &[])
        .expect("start the updater");
    let t0 = Instant::now();
    // 250m at the pod's limit:request ratio of 5 (Headroom's 500m / 100m).
    wait_at(&s, "resized by VPA to 250m/1250m", 250, 1250).await;
    let yielded = s.wait_events("web-1", YIELDED).await;
    let note = yielded[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("container app changed in place by updater"),
        "{note}"
    );

    // Half way, the recommendation moves: VPA resizes again, Headroom stays out.
    watch_until(&mut u, t0 + window / 2).await;
    vpa::recommend(&s.client, &s.ns, "web", "300m")
        .await
        .unwrap();
    wait_at(&s, "resized by VPA to 300m/1500m", 300, 1500).await;
    watch_until(&mut u, t0 + window).await;

    let p = s.get("web-1").await;
    assert_eq!(
        (request_m(&p), cpu_limit_m(&p, "app")),
        (Some(300), Some(1500)),
        "where VPA put it"
    );
    assert!(
        p.metadata.managed_fields.iter().flatten().any(|e| {
            e.manager.as_deref() == Some("updater") && e.subresource.as_deref() == Some("resize")
        }),
        "VPA's resizes are recorded as manager `updater`: {:?}",
        p.metadata.managed_fields
    );
    let headroom = agent_resizes(&s, "web-1");
    let vpa_n = u.resizes_of("web-1");
    eprintln!(
        "vpa-limits: over {:.0?} of the updater ({:.0?} in all): Headroom {headroom} resize(s), VPA {vpa_n} resize(s), generation {}",
        t0.elapsed(),
        started.elapsed(),
        generation(&p)
    );
    assert_eq!(
        headroom,
        1,
        "only the raise before VPA came:\n{}",
        s.agent().log_tail(30)
    );
    assert_eq!(vpa_n, 2, "one per recommendation:\n{}", u.log_tail(40));
    assert_eq!(
        generation(&p),
        1 + (headroom + vpa_n) as i64,
        "every spec change is one of the counted patches"
    );
    assert_eq!(u.evictions_of("web-1"), 0, "{}", u.log_tail(40));
    assert_eq!(
        s.events("web-1", YIELDED).await.len(),
        1,
        "one Event, not one per tick"
    );
    assert_eq!(pods_with_reason(&s, "other_writer").await, 1.0);
    assert!(
        s.agent().log().contains("yielding to another writer"),
        "{}",
        s.agent().log_tail(30)
    );
}

/// The supported split: VPA `controlledValues: RequestsOnly` resizes the
/// request in place, Headroom keeps managing the limit (its ceiling follows
/// the request: 4 ×). Neither yields, both keep working through two
/// recommendations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vpa_on_requests_only_and_headroom_on_limits_both_keep_working() {
    let window = soak();
    let mut s = Scenario::builder("vpa-requests")
        .sim(quick_kubelet)
        .start()
        .await;
    workload(&s, "100m", "200m", json!({})).await;
    s.start_agent(0, fast_args()).await;
    wait_at(&s, "raised by Headroom to 4 × request", 100, 400).await;

    vpa::create_vpa(
        &s.client,
        &s.ns,
        vpa::vpa("web", "web", "InPlaceOrRecreate", "RequestsOnly"),
    )
    .await
    .unwrap();
    vpa::recommend(&s.client, &s.ns, "web", "200m")
        .await
        .unwrap();
    let mut u = Updater::start(s.cp, &s.ns, s.dir.path(), Duration::from_secs(2), &[])
        .expect("start the updater");
    let t0 = Instant::now();
    wait_at(&s, "request from VPA, limit from Headroom", 200, 800).await;
    watch_until(&mut u, t0 + window / 2).await;
    vpa::recommend(&s.client, &s.ns, "web", "300m")
        .await
        .unwrap();
    wait_at(&s, "both moved again", 300, 1200).await;
    watch_until(&mut u, t0 + window).await;

    let p = s.get("web-1").await;
    assert_eq!(
        (request_m(&p), cpu_limit_m(&p, "app")),
        (Some(300), Some(1200))
    );
    let headroom = agent_resizes(&s, "web-1");
    let vpa_n = u.resizes_of("web-1");
    eprintln!(
        "vpa-requests: over {:.0?}: Headroom {headroom} resize(s), VPA {vpa_n} resize(s), generation {}",
        t0.elapsed(),
        generation(&p)
    );
    assert_eq!(headroom, 3, "{}", s.agent().log_tail(30));
    assert_eq!(vpa_n, 2, "{}", u.log_tail(40));
    assert_eq!(generation(&p), 1 + (headroom + vpa_n) as i64);
    assert!(s.events("web-1", YIELDED).await.is_empty());
    assert_eq!(pods_with_reason(&s, "other_writer").await, 0.0);
    assert_eq!(u.evictions_of("web-1"), 0, "{}", u.log_tail(40));
}

async fn annotate_resume(s: &Scenario<'_>, name: &str, at: k8s_openapi::jiff::Timestamp) {
    let at = k8s_openapi::jiff::Timestamp::from_second(at.as_second()).unwrap();
    s.pods()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"headroom.dev/resume": at.to_string()}}}),
            ),
        )
        .await
        .expect("annotate");
}

/// `headroom-agent explain NS/NAME --json` against the scenario's node.
fn explain(s: &Scenario<'_>, pod: &str) -> Value {
    let out = std::process::Command::new(testkit::agent::agent_binary().unwrap())
        .args([
            "explain",
            &format!("{}/{pod}", s.ns),
            "--json",
            "--interval",
            "300ms",
        ])
        .arg("--kubeconfig")
        .arg(s.cp.kubeconfig_path())
        .arg("--cgroup-root")
        .arg(&s.sim().config().cgroup_root)
        .output()
        .expect("run explain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain --json")
}

/// `headroom-agent plan --json` on the node's pods as the API lists them.
async fn plan(s: &Scenario<'_>) -> Value {
    let list = s.pods().list(&ListParams::default()).await.unwrap();
    let file = s.dir.path().join("pods.json");
    std::fs::write(&file, serde_json::to_vec(&list).unwrap()).unwrap();
    let out = std::process::Command::new(testkit::agent::agent_binary().unwrap())
        .args([
            "plan",
            "--json",
            "--interval",
            "300ms",
            "--node-allocatable",
            "4000m",
        ])
        .args(["--node-name", s.node(), "--opted-in-namespace", &s.ns])
        .arg("--pods")
        .arg(&file)
        .arg("--cgroup-root")
        .arg(&s.sim().config().cgroup_root)
        .output()
        .expect("run plan");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("plan --json")
}

/// A person's one `kubectl patch --subresource resize` of a limit Headroom
/// set pauses Headroom on that pod (it does not become a new declared limit
/// Headroom keeps moving: a lowered limit would be raised straight back, and
/// the person would patch again). `explain`, `plan`, the metric and one Event
/// say why. A `headroom.dev/resume` time before the change changes nothing;
/// one after it hands the limit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_resize_pauses_headroom_on_the_pod_until_resume_covers_it() {
    let s = Scenario::builder("person-resize")
        .sim(quick_kubelet)
        .agent(fast_args())
        .start()
        .await;
    s.create(json!({"metadata": {"name": "p"},
                    "spec": {"nodeName": s.node(), "containers": [container("100m", "200m")]}}))
        .await;
    s.wait_pod("p", "raised to 400m", |p| {
        cpu_limit_m(p, "app") == Some(400)
    })
    .await;
    let before =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600);
    s.resize_as("p", KUBECTL_PATCH, "300m")
        .await
        .expect("resize");
    let g = generation(&s.get("p").await);
    s.wait_events("p", YIELDED).await;
    // Eight raise cooldowns and forty ticks: Headroom would have raised it back.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let p = s.get("p").await;
    assert_eq!(
        (cpu_limit_m(&p, "app"), generation(&p)),
        (Some(300), g),
        "left alone"
    );
    assert_eq!(pods_with_reason(&s, "other_writer").await, 1.0);

    let e = explain(&s, "p");
    assert_eq!(e["reason"], "other_writer", "{e:#}");
    assert_eq!(e["pod"]["yielded"]["manager"], KUBECTL_PATCH, "{e:#}");
    assert_eq!(
        e["pod"]["yielded"]["limits"],
        json!(["container app"]),
        "{e:#}"
    );
    let v = plan(&s).await;
    let d = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "p")
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(d["unmanaged_reason"], "other_writer", "{d:#}");
    assert_eq!(d["decision"], "leave", "{d:#}");
    assert_eq!(d["yielded_to"]["manager"], KUBECTL_PATCH, "{d:#}");
    assert!(
        d["why"]
            .as_str()
            .unwrap()
            .contains("changed in place by kubectl-patch"),
        "{d:#}"
    );

    // A resume time before the person's change: still theirs.
    annotate_resume(&s, "p", before).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = s.get("p").await;
    assert_eq!(cpu_limit_m(&p, "app"), Some(300));
    assert!(
        explain(&s, "p")["pod"]["yielded"]["resume"]
            .as_str()
            .is_some_and(|r| r.contains("is before this change")),
    );
    // After it: Headroom's again, raised back to its ceiling.
    annotate_resume(&s, "p", k8s_openapi::jiff::Timestamp::now()).await;
    s.wait_pod("p", "raised back to 400m", |p| {
        cpu_limit_m(p, "app") == Some(400)
    })
    .await;
    assert_eq!(pods_with_reason(&s, "other_writer").await, 0.0);
    assert_eq!(s.events("p", YIELDED).await.len(), 1);
    assert!(
        s.agent()
            .log()
            .contains("no longer yielding to another writer"),
        "{}",
        s.agent().log_tail(30)
    );
}
