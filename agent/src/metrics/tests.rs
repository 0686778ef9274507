//! Scrapes a real server over TCP and parses the body with a Prometheus
//! text parser.

use foldhash::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_parse::{Sample, Scrape, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use super::*;
use crate::model::Target;

struct Reply {
    status: u16,
    content_type: String,
    body: String,
}

async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Reply {
        status,
        content_type,
        body: body.to_string(),
    }
}

async fn start(metrics: Arc<Metrics>, ready: Arc<Readiness>) -> (SocketAddr, oneshot::Sender<()>) {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(serve_listener(listener, metrics, ready, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

fn parse(body: &str) -> Scrape {
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap()
}

fn find<'a>(s: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    s.samples
        .iter()
        .filter(|x| x.metric == metric && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect()
}

/// `headroom_cgroup_drift_events_total{cgroup="pod"}`.
fn pod_drift_events(s: &Scrape) -> f64 {
    value(
        s,
        "headroom_cgroup_drift_events_total",
        &[("cgroup", "pod")],
    )
}

fn value(s: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let found = find(s, metric, labels);
    assert_eq!(found.len(), 1, "{metric} {labels:?}: {found:?}");
    match &found[0].value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{metric}: not a scalar: {other:?}"),
    }
}

fn filled() -> Arc<Metrics> {
    let m = Arc::new(Metrics::new("1.2.3"));
    m.set_node(&NodeValues {
        capacity_millicores: 4000.0,
        usage_millicores: 1250.5,
        real_slack_millicores: 2000.0,
        booked_slack_millicores: 500.0,
        pressure_some_ratio: 0.12,
        pressure_full_ratio: Some(0.03),
        throttling_stall_ratio: 0.4,
        contention_ratio: 0.05,
    });
    m.set_pod(
        &"ns".into(),
        &"web".into(),
        &PodValues {
            request_millicores: 200.0,
            limit_millicores: Some(800.0),
            target_millicores: Some(900.0),
            usage_millicores: 450.0,
            throttled_ratio: 0.25,
        },
    );
    m.resize(ResizeResult::applied, Direction::Raise);
    m.resize(ResizeResult::applied, Direction::Raise);
    m.resize(ResizeResult::refused, Direction::Lower);
    m.resize_verified(Direction::Raise, 1.5);
    m.patch_error(PatchErrorClass::conflict);
    m.set_drift(
        &"ns".into(),
        &"web".into(),
        &Target::Container("app".into()),
        true,
    );
    m.set_drift(&"ns".into(), &"web".into(), &Target::Pod, true);
    m.drift_detected(&Target::Pod);
    m.set_pod_states(3, &HashMap::from_iter([("not-burstable", 2usize)]));
    m.scan_duration.observe(0.001);
    m
}

#[tokio::test]
async fn every_patch_error_class_is_exported_under_its_name() {
    let m = Arc::new(Metrics::new("1.2.3"));
    for (i, class) in PatchErrorClass::ALL.into_iter().enumerate() {
        for _ in 0..=i {
            m.patch_error(class);
        }
    }
    let (addr, _stop) = start(m, Arc::new(Readiness::default())).await;
    let s = parse(&get(addr, "/metrics", None).await.body);
    for (i, name) in [
        "refused",
        "conflict",
        "not_found",
        "forbidden",
        "transport",
        "node_not_found",
        "throttled",
        "server_error",
        "unexpected",
    ]
    .into_iter()
    .enumerate()
    {
        let got = value(&s, "headroom_patch_errors_total", &[("class", name)]);
        assert_eq!(got, (i + 1) as f64, "{name}");
    }
}

#[tokio::test]
async fn scrape_parses_and_reports_set_values() {
    let m = filled();
    let (addr, _stop) = start(m, Arc::new(Readiness::default())).await;
    let r = get(addr, "/metrics", None).await;
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("text/plain; version=0.0.4"));
    let s = parse(&r.body);
    assert_eq!(value(&s, "headroom_node_capacity_millicores", &[]), 4000.0);
    assert_eq!(value(&s, "headroom_node_usage_millicores", &[]), 1250.5);
    assert_eq!(
        value(&s, "headroom_node_real_slack_millicores", &[]),
        2000.0
    );
    assert_eq!(
        value(&s, "headroom_node_booked_slack_millicores", &[]),
        500.0
    );
    assert_eq!(value(&s, "headroom_node_pressure_some_ratio", &[]), 0.12);
    assert_eq!(value(&s, "headroom_node_pressure_full_ratio", &[]), 0.03);
    assert_eq!(
        value(&s, "headroom_node_cpu_throttling_stall_ratio", &[]),
        0.4
    );
    assert_eq!(value(&s, "headroom_node_cpu_contention_ratio", &[]), 0.05);
    let pod = [("namespace", "ns"), ("pod", "web")];
    assert_eq!(
        value(&s, "headroom_pod_cpu_request_millicores", &pod),
        200.0
    );
    assert_eq!(value(&s, "headroom_pod_cpu_limit_millicores", &pod), 800.0);
    assert_eq!(value(&s, "headroom_pod_cpu_target_millicores", &pod), 900.0);
    assert_eq!(value(&s, "headroom_pod_cpu_usage_millicores", &pod), 450.0);
    assert_eq!(value(&s, "headroom_pod_cpu_throttled_ratio", &pod), 0.25);
    let applied = [("result", "applied"), ("direction", "raise")];
    assert_eq!(value(&s, "headroom_resizes_total", &applied), 2.0);
    let refused = [("result", "refused"), ("direction", "lower")];
    assert_eq!(value(&s, "headroom_resizes_total", &refused), 1.0);
    let verified = [("result", "verified"), ("direction", "raise")];
    assert_eq!(value(&s, "headroom_resizes_total", &verified), 1.0);
    assert_eq!(
        value(&s, "headroom_patch_errors_total", &[("class", "conflict")]),
        1.0
    );
    let app = [("namespace", "ns"), ("pod", "web"), ("container", "app")];
    assert_eq!(value(&s, "headroom_cgroup_drift", &app), 1.0);
    assert_eq!(find(&s, "headroom_cgroup_drift", &pod).len(), 2);
    assert_eq!(pod_drift_events(&s), 1.0);
    assert_eq!(value(&s, "headroom_pods", &[("state", "managed")]), 3.0);
    let unmanaged = [("state", "unmanaged"), ("reason", "not-burstable")];
    assert_eq!(value(&s, "headroom_pods", &unmanaged), 2.0);
    assert_eq!(
        value(&s, "headroom_build_info", &[("version", "1.2.3")]),
        1.0
    );
    let lat = find(&s, "headroom_resize_verification_latency_seconds", &[]);
    let Value::Histogram(buckets) = &lat[0].value else {
        panic!("latency is not a histogram: {lat:?}");
    };
    let le2 = buckets.iter().find(|b| b.less_than == 2.0).unwrap();
    let le1 = buckets.iter().find(|b| b.less_than == 1.0).unwrap();
    assert_eq!((le1.count, le2.count), (0.0, 1.0));
    assert!(!find(&s, "headroom_scan_duration_seconds", &[]).is_empty());
    assert!(!find(&s, "headroom_decision_duration_seconds", &[]).is_empty());
}

#[tokio::test]
async fn openmetrics_is_served_when_asked_for() {
    let (addr, _stop) = start(filled(), Arc::new(Readiness::default())).await;
    let r = get(
        addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0"),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.content_type.starts_with("application/openmetrics-text"));
    assert_eq!(r.body.lines().last(), Some("# EOF"));
}

#[tokio::test]
async fn vanished_pod_drops_its_series() {
    let m = filled();
    m.set_pod(&"ns".into(), &"other".into(), &PodValues::default());
    m.remove_pod(&"ns".into(), &"web".into());
    let (addr, _stop) = start(m.clone(), Arc::new(Readiness::default())).await;
    let s = parse(&get(addr, "/metrics", None).await.body);
    let web = [("pod", "web")];
    for f in [
        "headroom_pod_cpu_request_millicores",
        "headroom_pod_cpu_limit_millicores",
        "headroom_pod_cpu_target_millicores",
        "headroom_pod_cpu_usage_millicores",
        "headroom_pod_cpu_throttled_ratio",
        "headroom_cgroup_drift",
    ] {
        assert!(find(&s, f, &web).is_empty(), "{f} still has pod web");
    }
    assert_eq!(
        find(
            &s,
            "headroom_pod_cpu_request_millicores",
            &[("pod", "other")]
        )
        .len(),
        1
    );
    // The node-level drift counter survives the pod.
    assert_eq!(pod_drift_events(&s), 1.0);
}

#[test]
fn retain_pods_sweeps_pods_not_live() {
    let m = Metrics::new("t");
    m.set_pod(&"a".into(), &"keep".into(), &PodValues::default());
    m.set_pod(&"a".into(), &"gone".into(), &PodValues::default());
    m.set_drift(&"a".into(), &"gone2".into(), &Target::Pod, true);
    m.retain_pods(&HashSet::from_iter([("a", "keep")]));
    let s = parse(&m.encode_prometheus());
    assert_eq!(
        find(&s, "headroom_pod_cpu_request_millicores", &[]).len(),
        1
    );
    assert!(find(&s, "headroom_cgroup_drift", &[]).is_empty());
}

#[test]
fn cleared_drift_removes_the_gauge_and_unset_limit_removes_its_series() {
    let m = Metrics::new("t");
    m.set_drift(&"a".into(), &"p".into(), &Target::Pod, true);
    m.set_drift(&"a".into(), &"p".into(), &Target::Pod, false);
    m.set_pod(
        &"a".into(),
        &"p".into(),
        &PodValues {
            limit_millicores: Some(500.0),
            ..Default::default()
        },
    );
    m.set_pod(&"a".into(), &"p".into(), &PodValues::default());
    let s = parse(&m.encode_prometheus());
    assert!(find(&s, "headroom_cgroup_drift", &[]).is_empty());
    assert!(find(&s, "headroom_pod_cpu_limit_millicores", &[]).is_empty());
}

#[tokio::test]
async fn healthz_is_ok_and_readyz_waits_for_sync_and_scan() {
    let ready = Arc::new(Readiness::default());
    let (addr, _stop) = start(Arc::new(Metrics::new("t")), ready.clone()).await;
    assert_eq!(get(addr, "/healthz", None).await.status, 200);
    assert_eq!(get(addr, "/readyz", None).await.status, 503);
    ready.set_pods_synced();
    assert_eq!(get(addr, "/readyz", None).await.status, 503);
    ready.set_first_scan_done();
    assert_eq!(get(addr, "/readyz", None).await.status, 200);
    assert_eq!(get(addr, "/nope", None).await.status, 404);
}

/// Failed ticks (malformed kubepods files, a stuck scan) left /readyz at 200
/// with frozen gauges.
#[tokio::test]
async fn readyz_turns_503_after_n_failed_ticks_and_recovers() {
    let ready = Arc::new(Readiness::new(3));
    ready.set_pods_synced();
    ready.set_first_scan_done();
    let m = Arc::new(Metrics::new("t"));
    let (addr, _stop) = start(m.clone(), ready.clone()).await;
    for _ in 0..2 {
        ready.tick_done(false);
        assert_eq!(get(addr, "/readyz", None).await.status, 200);
    }
    ready.tick_done(false);
    let r = get(addr, "/readyz", None).await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("last 3 ticks failed"), "{}", r.body);
    assert_eq!(get(addr, "/healthz", None).await.status, 200);
    ready.tick_done(true);
    assert_eq!(get(addr, "/readyz", None).await.status, 200);

    m.scan_error(ScanErrorKind::kubepods);
    m.scan_error(ScanErrorKind::permission_denied);
    m.scan_error(ScanErrorKind::permission_denied);
    let s = parse(&m.encode_prometheus());
    assert_eq!(
        value(&s, "headroom_scan_errors_total", &[("kind", "kubepods")]),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "headroom_scan_errors_total",
            &[("kind", "permission_denied")]
        ),
        2.0
    );
}

#[tokio::test]
async fn non_get_is_refused() {
    let req = hyper::Request::post("/metrics").body(()).unwrap();
    let r = server::respond(&req, &Metrics::new("t"), &Readiness::default());
    assert_eq!(r.status(), 405);
}

#[tokio::test]
async fn shutdown_stops_accepting() {
    let (addr, stop) = start(Arc::new(Metrics::new("t")), Arc::new(Readiness::default())).await;
    assert_eq!(get(addr, "/healthz", None).await.status, 200);
    stop.send(()).unwrap();
    // Once the serve task has returned, the listener is closed.
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(refused);
}

#[tokio::test]
async fn node_gauges_are_absent_until_the_first_scan() {
    let m = Arc::new(Metrics::new("t"));
    let (addr, _stop) = start(m.clone(), Arc::new(Readiness::default())).await;
    let node_families = [
        "headroom_node_capacity_millicores",
        "headroom_node_usage_millicores",
        "headroom_node_real_slack_millicores",
        "headroom_node_booked_slack_millicores",
        "headroom_node_pressure_some_ratio",
        "headroom_node_pressure_full_ratio",
        "headroom_node_cpu_throttling_stall_ratio",
        "headroom_node_cpu_contention_ratio",
    ];
    for accept in [None, Some("application/openmetrics-text")] {
        let body = get(addr, "/metrics", accept).await.body;
        for f in node_families {
            assert!(!body.contains(f), "{f} exported before any scan:\n{body}");
        }
        assert!(body.contains("headroom_build_info"));
    }
    m.set_node(&NodeValues::default());
    let s = parse(&get(addr, "/metrics", None).await.body);
    for f in node_families {
        assert_eq!(value(&s, f, &[]), 0.0, "{f}");
    }
    let om = get(addr, "/metrics", Some("application/openmetrics-text")).await;
    assert_eq!(om.body.matches("# EOF").count(), 1);
    assert_eq!(om.body.lines().last(), Some("# EOF"));
}

#[tokio::test]
async fn openmetrics_with_q_zero_is_not_served() {
    let (addr, _stop) = start(filled(), Arc::new(Readiness::default())).await;
    let r = get(addr, "/metrics", Some("application/openmetrics-text;q=0")).await;
    assert_eq!(r.status, 200);
    assert!(
        r.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        r.content_type
    );
    assert!(!r.body.contains("# EOF"));
}

// ------------------------------------------------------- connection limits

async fn start_limited(limits: ConnLimits) -> (SocketAddr, Arc<Readiness>, oneshot::Sender<()>) {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Arc::new(Readiness::default());
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(serve_listener_with(
        listener,
        Arc::new(Metrics::new("t")),
        ready.clone(),
        limits,
        async {
            let _ = rx.await;
        },
    ));
    (addr, ready, tx)
}

/// Did the server close `s` (EOF or reset) within `within`?
async fn closed_by_server(s: &mut TcpStream, within: std::time::Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(within, s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

const LONG: std::time::Duration = std::time::Duration::from_secs(60);

/// Limits whose timeouts never fire within a test.
fn patient(max_connections: usize, probe_slots: usize) -> ConnLimits {
    ConnLimits {
        max_connections,
        probe_slots,
        header_read_timeout: LONG,
        probe_read_timeout: LONG,
        connection_timeout: LONG,
    }
}

#[tokio::test]
async fn healthz_answers_while_every_http_slot_is_held() {
    let limits = patient(4, 2);
    let (addr, ready, _stop) = start_limited(limits).await;
    // The cap's worth of connections, each in the middle of a request head.
    let mut held = Vec::new();
    for _ in 0..limits.max_connections {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    // Let the server take them all before the probes arrive.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let h = get(addr, "/healthz", None).await;
    assert_eq!((h.status, h.body.as_str()), (200, "ok\n"));
    assert_eq!(get(addr, "/readyz", None).await.status, 503);
    ready.set_pods_synced();
    ready.set_first_scan_done();
    let r = get(addr, "/readyz", None).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ready\n"));
    // Anything else is refused on the probe lane, not served.
    let m = get(addr, "/metrics", None).await;
    assert_eq!(m.status, 503);
    // Slots come back when the holders go.
    drop(held);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(get(addr, "/metrics", None).await.status, 200);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let limits = patient(3, 2);
    let (addr, _ready, _stop) = start_limited(limits).await;
    let mut conns = Vec::new();
    for _ in 0..limits.max_connections + limits.probe_slots {
        conns.push(TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut extra = Vec::new();
    for _ in 0..10 {
        extra.push(TcpStream::connect(addr).await.unwrap());
    }
    for s in &mut extra {
        assert!(
            closed_by_server(s, std::time::Duration::from_secs(5)).await,
            "a connection beyond the cap was kept"
        );
    }
    // The ones within the cap are kept (no deadline has passed).
    for s in &mut conns {
        assert!(!closed_by_server(s, std::time::Duration::from_millis(50)).await);
    }
}

#[tokio::test]
async fn idle_and_slow_connections_are_dropped_after_the_head_deadline() {
    let limits = ConnLimits {
        max_connections: 2,
        probe_slots: 1,
        header_read_timeout: std::time::Duration::from_millis(300),
        probe_read_timeout: std::time::Duration::from_millis(300),
        connection_timeout: std::time::Duration::from_secs(2),
    };
    let (addr, _ready, _stop) = start_limited(limits).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /metr").await.unwrap();
    let mut probe_idle = TcpStream::connect(addr).await.unwrap();
    for s in [&mut idle, &mut slow, &mut probe_idle] {
        assert!(
            closed_by_server(s, std::time::Duration::from_secs(10)).await,
            "connection outlived its deadlines"
        );
    }
    // Freed slots serve again.
    assert_eq!(get(addr, "/metrics", None).await.status, 200);
}

#[tokio::test]
async fn an_oversized_request_head_is_refused_not_buffered() {
    let (addr, _ready, _stop) = start_limited(ConnLimits::default()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    // The server may reset before the whole head is written.
    let _ = s.write_all(big.as_bytes()).await;
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "{text}"
    );
}
