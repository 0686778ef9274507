//! Verification and drift end to end (issue 5): a real kube-apiserver, one
//! simulated node whose kubelet misbehaves on purpose (`Fault`), and the real
//! `headroom-agent`. Outcomes are read where an operator would read them:
//! `/metrics` (parsed with a Prometheus text parser), events.k8s.io/v1 Events
//! on the pod, and the pod itself.

use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::api::DeleteParams;
use prometheus_parse::Scrape;
use serde_json::{Value, json};
use testkit::agent::{fast_args, fast_args_with, metric};
use testkit::kubelet_sim::{Fault, SimConfig, WriteMode};
use testkit::scenario::Scenario;
use testkit::scenario::pod::{cpu_limit_m, generation, opted_out, pod_limit_m};

const DRIFT: &str = "headroom_cgroup_drift";
const DRIFT_EVENTS: &str = "headroom_cgroup_drift_events_total";
const RESIZES: &str = "headroom_resizes_total";
const LATENCY: &str = "headroom_resize_verification_latency_seconds";

/// One simulated node with its agent (`args`), in a fresh opted-in
/// namespace; the simulator writes cgroup files in place, as the real
/// kubelet does (truncate + write, raising IN_MODIFY).
async fn env_with(
    prefix: &str,
    tweak: impl FnOnce(&mut SimConfig),
    args: Vec<String>,
) -> Scenario<'static> {
    Scenario::builder(prefix)
        .sim(|c| c.write_mode = WriteMode::InPlace)
        .sim(tweak)
        .agent(args)
        .start()
        .await
}

/// [`env_with`] the fast test flags.
async fn env(prefix: &str, tweak: impl FnOnce(&mut SimConfig)) -> Scenario<'static> {
    env_with(prefix, tweak, fast_args()).await
}

/// The drift gauge of one cgroup (`""` = pod cgroup), `None` if absent.
fn drift(e: &Scenario<'_>, s: &Scrape, pod: &str, container: &str) -> Option<f64> {
    metric(
        s,
        DRIFT,
        &[("namespace", &e.ns), ("pod", pod), ("container", container)],
    )
}

/// Waits until the drift gauge of p/app is set; that scrape and the wait.
async fn wait_app_drift(e: &Scenario<'_>, what: &str) -> (Scrape, Duration) {
    e.wait_metrics(what, |s| drift(e, s, "p", "app") == Some(1.0))
        .await
}

/// Every drift gauge of a pod, any cgroup.
fn drift_any(e: &Scenario<'_>, s: &Scrape, pod: &str) -> f64 {
    metric(s, DRIFT, &[("namespace", &e.ns), ("pod", pod)]).unwrap_or(0.0)
}

/// A Burstable pod: CPU request and limit, memory request only.
fn burstable(name: &str, node: &str, req: &str, lim: &str) -> Value {
    testkit::scenario::pod::burstable(name, node, req, Some(lim))
}

/// docs/kubelet-behaviour.md §4 pod e: pod-level req cpu 100m / mem 128Mi, lim cpu 500m / mem 128Mi.
fn pod_level_e(name: &str, node: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"nodeName": node,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m"}}}]}})
}

fn notes(evs: &[Event]) -> Vec<String> {
    evs.iter().filter_map(|e| e.note.clone()).collect()
}

/// Mean verification latency from the histogram, for the report.
fn mean_latency(s: &Scrape) -> Option<(f64, f64)> {
    let sum = metric(s, &format!("{LATENCY}_sum"), &[])?;
    let count = metric(s, &format!("{LATENCY}_count"), &[])?;
    (count > 0.0).then(|| (sum / count, count))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_applied_resize_is_drift_with_expected_and_actual_in_the_event() {
    let e = env("vnever", |_| {}).await;
    // Set before the pod exists, so the agent's first raise is never applied.
    e.sim().set_fault(&e.ns, "p", Fault::NeverApply);
    e.create(burstable("p", e.node(), "100m", "150m")).await;
    let raised = e
        .wait_pod("p", "spec raised to 400m", |p| {
            cpu_limit_m(p, "app") == Some(400)
        })
        .await;
    // Grace (2 s) + one audit interval (1 s), bounded by WAIT.
    let (s, took) = e
        .wait_metrics("drift gauge on p", |s| drift_any(&e, s, "p") >= 1.0)
        .await;
    eprintln!("measured: raise visible after {raised:?}, then drift gauge after {took:?}");
    assert!(
        drift(&e, &s, "p", "app") == Some(1.0) || drift(&e, &s, "p", "") == Some(1.0),
        "drift gauge set for the container or the pod cgroup"
    );
    let evs = e.wait_events("p", "CgroupDrift").await;
    let notes = notes(&evs);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("expected 40000 100000") && n.contains("found 15000 100000")),
        "CgroupDrift note names expected (40000) and found (15000) cpu.max: {notes:?}"
    );
    assert!(
        evs.iter().all(|ev| ev.type_.as_deref() == Some("Warning")),
        "CgroupDrift is a Warning"
    );
    let (s, _) = e
        .wait_metrics("an unverified resize", |s| {
            metric(s, RESIZES, &[("result", "unverified")]).unwrap_or(0.0) >= 1.0
        })
        .await;
    assert_eq!(
        metric(&s, RESIZES, &[("result", "verified")]).unwrap_or(0.0),
        0.0,
        "a never-applied resize counted as verified"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_value_is_drift() {
    let e = env("vwrong", |_| {}).await;
    // docs/kubelet-behaviour.md §4's odd value: 110m in the container cgroup, whatever the spec says.
    e.sim().set_fault(
        &e.ns,
        "p",
        Fault::WrongValue {
            container: Some("app".into()),
            cpu_max: "11000 100000".into(),
        },
    );
    e.create(burstable("p", e.node(), "100m", "150m")).await;
    let (s, took) = wait_app_drift(&e, "drift gauge on p/app").await;
    eprintln!("measured: wrong value → drift gauge after {took:?}");
    assert_eq!(
        drift(&e, &s, "p", ""),
        None,
        "the pod cgroup holds the right value: no drift there"
    );
    assert!(metric(&s, DRIFT_EVENTS, &[("cgroup", "container")]).unwrap_or(0.0) >= 1.0);
    let notes = notes(&e.wait_events("p", "CgroupDrift").await);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("container app") && n.contains("found 11000 100000")),
        "note names the container and the wrong value: {notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_cgroup_updated_but_not_the_container_is_drift_on_the_container() {
    let e = env("vpodonly", |_| {}).await;
    e.sim().set_fault(&e.ns, "p", Fault::PodOnly);
    e.create(burstable("p", e.node(), "100m", "150m")).await;
    e.wait_pod("p", "spec raised to 400m", |p| {
        cpu_limit_m(p, "app") == Some(400)
    })
    .await;
    let (s, took) = wait_app_drift(&e, "drift gauge on p/app").await;
    eprintln!("measured: pod-only resize → container drift gauge after {took:?}");
    assert_eq!(
        drift(&e, &s, "p", ""),
        None,
        "the pod cgroup was updated: no drift on it"
    );
    let notes = notes(&e.wait_events("p", "CgroupDrift").await);
    assert!(
        notes.iter().any(|n| n.contains("container app")
            && n.contains("expected 40000 100000")
            && n.contains("found 15000 100000")),
        "note names the container, expected and found: {notes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_write_is_drift_and_clears_when_restored() {
    let e = env("voob", |_| {}).await;
    // Opted out: the agent never patches it, so its right value stays 150m.
    let pod = opted_out(burstable("p", e.node(), "100m", "150m"));
    e.create(pod).await;
    e.wait_pod("p", "Running", testkit::workload::running).await;
    // Let a few audits pass on the correct value: no drift before the write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = e.scrape().await;
    assert_eq!(drift_any(&e, &s, "p"), 0.0, "drift before any write");
    let before = metric(&s, DRIFT_EVENTS, &[("cgroup", "container")]).unwrap_or(0.0);

    e.sim()
        .write_cpu_max_out_of_band(&e.ns, "p", Some("app"), "20000 100000")
        .expect("out-of-band write");
    let (s, took) = wait_app_drift(&e, "drift gauge on p/app").await;
    eprintln!("measured: out-of-band write → drift gauge after {took:?} (grace 2 s)");
    assert_eq!(
        metric(&s, DRIFT_EVENTS, &[("cgroup", "container")]).unwrap_or(0.0),
        before + 1.0,
        "one drift counted"
    );
    let notes = notes(&e.wait_events("p", "CgroupDrift").await);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("expected 15000 100000") && n.contains("found 20000 100000")),
        "note: {notes:?}"
    );

    e.sim()
        .write_cpu_max_out_of_band(&e.ns, "p", Some("app"), "15000 100000")
        .expect("restore");
    let (s, took) = e
        .wait_metrics("drift gauge of p/app gone", |s| {
            drift(&e, s, "p", "app").unwrap_or(0.0) == 0.0
        })
        .await;
    eprintln!("measured: restore → drift cleared after {took:?}");
    assert_eq!(drift_any(&e, &s, "p"), 0.0);
    assert_eq!(
        metric(&s, DRIFT_EVENTS, &[("cgroup", "container")]).unwrap_or(0.0),
        before + 1.0,
        "clearing is not a new drift"
    );
    let cleared = e.wait_events("p", "CgroupDriftCleared").await;
    assert!(
        cleared
            .iter()
            .all(|ev| ev.type_.as_deref() == Some("Normal")),
        "CgroupDriftCleared is Normal"
    );
}

/// With no interval audit during the test, only inotify can start an audit
/// once the pod's cgroups are known. A mismatch needs two audits (first seen,
/// then past the 1 ms grace), so the file is written twice.
async fn inotify_case(prefix: &str, managed: bool) {
    let args = fast_args_with(&[("--audit-interval", "60m"), ("--drift-grace", "1ms")]);
    let e = env_with(prefix, |_| {}, args).await;
    let pod = burstable("p", e.node(), "100m", "150m");
    let right = if managed {
        e.create(pod).await;
        e.wait_pod("p", "limit 400m", |p| cpu_limit_m(p, "app") == Some(400))
            .await;
        "40000 100000"
    } else {
        e.create(opted_out(pod)).await;
        e.wait_metrics("p seen as opted out", |s| {
            metric(
                s,
                "headroom_pods",
                &[("state", "unmanaged"), ("reason", "opted_out")],
            ) == Some(1.0)
        })
        .await;
        "15000 100000"
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        drift_any(&e, &e.scrape().await, "p"),
        0.0,
        "drift before any write"
    );
    for _ in 0..2 {
        e.sim()
            .write_cpu_max_out_of_band(&e.ns, "p", Some("app"), "20000 100000")
            .expect("out-of-band write");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (_, took) = wait_app_drift(&e, "drift gauge on p/app from inotify audits").await;
    eprintln!(
        "measured ({prefix}): second in-place write → drift gauge after {took:?} (+1 s pause)"
    );
    e.sim()
        .write_cpu_max_out_of_band(&e.ns, "p", Some("app"), right)
        .expect("restore");
    let (_, took) = e
        .wait_metrics("drift cleared by an inotify audit", |s| {
            drift_any(&e, s, "p") == 0.0
        })
        .await;
    eprintln!("measured ({prefix}): in-place restore → drift cleared after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_write_to_a_managed_pod_is_audited_through_inotify() {
    inotify_case("vinotm", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_write_to_an_unmanaged_pod_is_audited_through_inotify() {
    inotify_case("vinotu", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_status_with_a_correct_cgroup_is_not_drift() {
    let e = env("vstale", |_| {}).await;
    e.sim()
        .set_fault(&e.ns, "p", Fault::StaleStatus(Duration::from_secs(5)));
    e.create(burstable("p", e.node(), "100m", "150m")).await;
    e.wait_pod("p", "spec raised to 400m", |p| {
        cpu_limit_m(p, "app") == Some(400)
    })
    .await;
    let (s, took) = e
        .wait_metrics("a verified resize", |s| {
            metric(s, RESIZES, &[("result", "verified")]).unwrap_or(0.0) >= 1.0
        })
        .await;
    eprintln!(
        "measured: verified {took:?} after the raise was visible; mean verification latency {:?}",
        mean_latency(&s)
    );
    // Watch past the status lag (5 s) and several grace periods.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let s = e.scrape().await;
        assert_eq!(
            drift_any(&e, &s, "p"),
            0.0,
            "drift gauge while only the status lagged:\n{}",
            e.agent().log_tail(30)
        );
        assert_eq!(
            metric(&s, RESIZES, &[("result", "unverified")]).unwrap_or(0.0),
            0.0,
            "resize counted unverified while the cgroup was right"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        e.events("p", "CgroupDrift").await.is_empty(),
        "CgroupDrift Event for a stale status"
    );
    let p = e.get("p").await;
    assert!(
        p.status
            .as_ref()
            .and_then(|s| s.observed_generation)
            .is_some_and(|g| g >= generation(&p)),
        "status caught up in the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_reported_status_requests_do_not_flap() {
    let e = env("vunder", |_| {}).await;
    let f = Fault::UnderReportRequests { factor: 0.79 };
    e.sim().set_fault(&e.ns, "c", f.clone());
    e.sim().set_fault(&e.ns, "e", f);
    e.create(burstable("c", e.node(), "100m", "150m")).await;
    // A pod-level limit below the ceiling, so it is raised (a declared limit
    // above 4 × request would be kept as it is, and never resized).
    let mut pl = pod_level_e("e", e.node());
    pl["spec"]["resources"]["limits"]["cpu"] = json!("150m");
    e.create(pl).await;
    // Ceilings come from spec requests (100m × 4), not the reported 79m.
    e.wait_pod("c", "container limit 400m", |p| {
        cpu_limit_m(p, "app") == Some(400)
    })
    .await;
    e.wait_pod("e", "pod limit 400m", |p| pod_limit_m(p) == Some(400))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = (generation(&e.get("c").await), generation(&e.get("e").await));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        let s = e.scrape().await;
        for n in ["c", "e"] {
            assert_eq!(drift_any(&e, &s, n), 0.0, "drift on {n}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = (generation(&e.get("c").await), generation(&e.get("e").await));
    eprintln!("measured: generations (c, e) {before:?} → {after:?} over 10 s after convergence");
    assert_eq!(before, after, "patches after convergence (flapping)");
    for n in ["c", "e"] {
        assert!(
            e.events(n, "CgroupDrift").await.is_empty(),
            "drift Event on {n}"
        );
    }
    let s = e.scrape().await;
    assert_eq!(
        metric(&s, DRIFT_EVENTS, &[]).unwrap_or(0.0),
        0.0,
        "drifts counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_parseable_metrics_health_and_readiness() {
    // Allocatable under the host's online CPUs, so it is the smallest
    // capacity input the agent sees (capacity = min of kubepods cpu.max,
    // allocatable, online CPUs).
    let e = env("vmetrics", |c| c.allocatable_cpu_m = 1500).await;
    assert_eq!(e.agent().get("/healthz").await.expect("healthz").0, 200);
    assert_eq!(e.agent().get("/readyz").await.expect("readyz").0, 200);
    e.create(burstable("m", e.node(), "100m", "150m")).await;
    e.wait_pod("m", "limit 400m", |p| cpu_limit_m(p, "app") == Some(400))
        .await;
    let pod = [("namespace", e.ns.as_str()), ("pod", "m")];
    let (s, _) = e
        .wait_metrics("per-pod series at 400m", |s| {
            metric(s, "headroom_pod_cpu_limit_millicores", &pod) == Some(400.0)
        })
        .await;
    assert_eq!(
        metric(&s, "headroom_node_capacity_millicores", &[]),
        Some(1500.0),
        "node capacity = the Node's allocatable"
    );
    assert_eq!(
        metric(&s, "headroom_pod_cpu_request_millicores", &pod),
        Some(100.0)
    );
    assert_eq!(
        metric(&s, "headroom_pod_cpu_target_millicores", &pod),
        Some(400.0)
    );
    assert!(metric(&s, "headroom_pod_cpu_usage_millicores", &pod).is_some());
    assert!(metric(&s, "headroom_pod_cpu_throttled_ratio", &pod).is_some());
    assert_eq!(
        metric(&s, "headroom_pods", &[("state", "managed")]),
        Some(1.0)
    );
    let build = s
        .samples
        .iter()
        .find(|x| x.metric == "headroom_build_info")
        .expect("headroom_build_info present");
    assert!(
        build.labels.get("version").is_some_and(|v| !v.is_empty()),
        "build info carries a version"
    );
    for family in [
        "headroom_node_usage_millicores",
        "headroom_node_real_slack_millicores",
        "headroom_node_booked_slack_millicores",
        "headroom_node_pressure_some_ratio",
    ] {
        assert!(metric(&s, family, &[]).is_some(), "{family} missing");
    }
    assert!(
        s.samples
            .iter()
            .any(|x| x.metric == "headroom_scan_duration_seconds"),
        "scan duration histogram missing"
    );
    if let Some((mean, n)) = mean_latency(&s) {
        eprintln!("measured: mean resize verification latency {mean:.3} s over {n} resizes");
    }

    e.pods()
        .delete("m", &DeleteParams::default())
        .await
        .expect("delete pod");
    let (s, took) = e
        .wait_metrics("per-pod series of m gone", |s| {
            !s.samples.iter().any(|x| x.labels.get("pod") == Some("m"))
        })
        .await;
    eprintln!("measured: pod deleted → its series gone after {took:?}");
    assert_eq!(
        metric(&s, "headroom_pods", &[("state", "managed")]),
        Some(0.0)
    );
}
