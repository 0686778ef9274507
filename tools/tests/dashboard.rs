//! The Grafana dashboard (headroom_tools::dashboard): the committed JSON is the
//! generated one, its structure is sound, and every panel's query runs on a
//! real Prometheus (Debian's `prometheus`, tests/tools/prometheus.sh) that
//! scrapes a real agent on a simulated node, once the agent has resized a pod:
//! each query must parse and return at least one series.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom_tools::dashboard::{self, DASHBOARD_PATH, Kind};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::agent::{fast_args, free_port, http_get};
use testkit::kubelet_sim::Fault;
use testkit::manifests::{apply_all, repo_dir};
use testkit::process::spawn_guarded;
use testkit::scenario::{Scenario, quick_kubelet, wait_until};
use testkit::workload::{container, pod, res};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn committed_dashboard_equals_generated() {
    let path = repo_dir().join(DASHBOARD_PATH);
    let want = dashboard::dashboard_text();
    if std::env::var_os("HEADROOM_WRITE_DASHBOARD").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let got = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        got == want,
        "{DASHBOARD_PATH} is not the generated dashboard: regenerate with \
         cargo run -p headroom-tools --bin gen-dashboard"
    );
}

#[test]
fn dashboard_covers_the_issue_panels_and_uses_its_variables() {
    let d = dashboard::dashboard();
    let panels = d["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids unique");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "node", "namespace"]);
    let all = dashboard::panels();
    for p in &all {
        assert!(!p.queries.is_empty(), "{}: no query", p.title);
        for q in &p.queries {
            assert!(
                q.expr.contains(r#"node=~"$node""#),
                "{}: not by node: {}",
                p.title,
                q.expr
            );
            let left = dashboard::substitute(&q.expr, "n", "ns", "1m");
            assert!(
                !left.contains('$'),
                "{}: unknown variable in {left}",
                p.title
            );
        }
    }
    // Per-pod panels filter by namespace.
    for p in all.iter().filter(|p| p.title.starts_with("Pod ")) {
        for q in &p.queries {
            assert!(q.expr.contains(r#"namespace=~"$namespace""#), "{}", q.expr);
        }
    }
    let exprs: String = all
        .iter()
        .flat_map(|p| p.queries.iter().map(|q| q.expr.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    // What the issue lists: slack real vs booked, pressure, per-pod
    // limit/target/usage/throttling, resizes by result, verification latency
    // heatmap, drift, patch errors, agent footprint.
    for metric in [
        "headroom_node_real_slack_millicores",
        "headroom_node_booked_slack_millicores",
        "headroom_node_pressure_some_ratio",
        "headroom_pod_cpu_limit_millicores",
        "headroom_pod_cpu_target_millicores",
        "headroom_pod_cpu_usage_millicores",
        "headroom_pod_cpu_throttled_ratio",
        "headroom_resizes_total",
        "headroom_resize_verification_latency_seconds_bucket",
        "headroom_cgroup_drift",
        "headroom_patch_errors_total",
        "headroom_scan_duration_seconds_bucket",
        "scrape_samples_scraped",
    ] {
        assert!(exprs.contains(metric), "no panel queries {metric}");
    }
    assert!(
        all.iter()
            .any(|p| p.kind == Kind::Heatmap && p.title.contains("Verification"))
    );
    let heat = panels.iter().find(|p| p["type"] == "heatmap").unwrap();
    assert_eq!(heat["targets"][0]["format"], "heatmap");
}

// ---------------------------------------------------------------- real Prometheus

struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Prometheus on loopback scraping the agent every second, with the
    /// labels the chart's PodMonitor gives a target (job, node).
    async fn start(agent_port: u16, node: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = json!({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{
                "job_name": "headroom-system/headroom-agent",
                "honor_labels": true,
                "static_configs": [{"targets": [format!("127.0.0.1:{agent_port}")],
                                    "labels": {"node": node}}],
            }],
        });
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config.to_string()).unwrap();
        let port = free_port().unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=1h")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = spawn_guarded(cmd)
            .expect("start prometheus (Debian package; tests/tools/prometheus.sh installs it)");
        let p = Prometheus {
            child,
            port,
            _dir: dir,
        };
        let t0 = Instant::now();
        while !matches!(http_get(port, "/-/ready").await, Ok((200, _))) {
            assert!(t0.elapsed() < WAIT, "prometheus not ready:\n{}", p.log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<api>?<param>=<value>`: the `data` of a success, or the error.
    async fn api(&self, api: &str, param: &str, value: &str) -> Result<Value, String> {
        let path = format!("/api/v1/{api}?{param}={}", percent_encode(value));
        let (code, body) = http_get(self.port, &path)
            .await
            .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&body).map_err(|e| format!("{code}: {e}: {body}"))?;
        if v["status"] == "success" {
            Ok(v["data"].clone())
        } else {
            Err(format!("{code} {}: {}", v["errorType"], v["error"]))
        }
    }

    /// Number of series an instant query returns (an error if it does not parse).
    async fn series(&self, expr: &str) -> Result<usize, String> {
        let data = self.api("query", "query", expr).await?;
        Ok(data["result"].as_array().map_or(0, Vec::len))
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Refuses (422 Invalid) any resize of a pod in `ns` whose name starts with
/// `prefix`, so the agent records a refused resize and a patch error, as on a
/// real cluster when the apiserver says no.
fn refuse_resizes_of(ns: &str, prefix: &str) -> Vec<Value> {
    let policy = format!("dashboard-test-refuse-{ns}");
    vec![
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["pods/resize"]}]},
                "matchConditions": [{"name": "this-pod",
                    "expression": format!("request.namespace == '{ns}' && request.name.startsWith('{prefix}')")}],
                "validations": [{"expression": "false", "reason": "Invalid",
                    "message": "refused by the dashboard test"}],
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"]},
        }),
    ]
}

async fn wait_limit(s: &Scenario<'_>, name: &str, want: u64) {
    let what = format!("{name} resized to {want}m");
    let resized =
        || async { testkit::workload::container_limit_m(&s.get(name).await) == Some(want) };
    if let Err(t) = wait_until(&what, WAIT, resized).await {
        s.fail(t);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_returns_series_from_prometheus_scraping_the_agent() {
    let s = Scenario::builder("dashboard")
        .sim(quick_kubelet)
        .agent(fast_args())
        .start()
        .await;
    let (client, ns, node, sim, agent) =
        (&s.client, &s.ns, s.node().to_string(), s.sim(), s.agent());
    let prom = Prometheus::start(agent.metrics_port, &node).await;

    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let create = |name: &str| {
        let p: Pod = serde_json::from_value(pod(
            name,
            &node,
            vec![container("app", res("250m", Some("300m")))],
            None,
        ))
        .unwrap();
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &p).await.unwrap() }
    };
    // An idle node: the agent raises the limit to the ceiling (4 × request).
    create("web").await;
    wait_limit(&s, "web", 1000).await;
    // A pod whose container cgroup keeps a wrong cpu.max: drift.
    sim.set_fault(
        ns,
        "stuck",
        Fault::WrongValue {
            container: Some("app".into()),
            cpu_max: "11000 100000".into(),
        },
    );
    create("stuck").await;
    // A pod the apiserver refuses to resize: a refused resize, a patch error.
    apply_all(client, &refuse_resizes_of(ns, "refused"), "dashboard-test")
        .await
        .unwrap();
    // The policy is in force once a dry-run resize of an opted-out probe pod
    // (which the agent leaves alone) is refused.
    let probe: Pod = serde_json::from_value(pod(
        "refused-probe",
        &node,
        vec![container("app", res("100m", Some("200m")))],
        Some(json!({"headroom.dev/managed": "false"})),
    ))
    .unwrap();
    pods.create(&PostParams::default(), &probe).await.unwrap();
    let bump = json!({"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "300m"}}}]}});
    let refused = || async {
        pods.patch_subresource(
            "resize",
            "refused-probe",
            &PatchParams::default().dry_run(),
            &Patch::Strategic(&bump),
        )
        .await
        .is_err()
    };
    wait_until("refusing policy in force", WAIT, refused)
        .await
        .unwrap();
    create("refused").await;

    let mut queries: Vec<(String, String)> = Vec::new();
    for p in dashboard::panels() {
        for q in &p.queries {
            queries.push((p.title.to_string(), q.expr.clone()));
            // The counter behind a 0 fallback, where this test makes it exist.
            if let Some(c) = &q.counter
                && !c.contains("headroom_scan_errors_total")
            {
                queries.push((format!("{} (counter without fallback)", p.title), c.clone()));
            }
        }
    }
    let node_re = regex_quote(&node);
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let failing = loop {
        let mut failing = Vec::new();
        for (title, expr) in &queries {
            let e = dashboard::substitute(expr, &node_re, &regex_quote(ns), "30s");
            match prom.series(&e).await {
                Ok(n) if n >= 1 => seen.push(format!("{n:>3} series  {title}: {e}")),
                Ok(_) => failing.push(format!("{title}: no series: {e}")),
                Err(err) => failing.push(format!("{title}: {err}: {e}")),
            }
        }
        if failing.is_empty() || t0.elapsed() > WAIT {
            break failing;
        }
        seen.clear();
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(
        failing.is_empty(),
        "queries without series after {WAIT:?}:\n{}\nagent log:\n{}",
        failing.join("\n"),
        agent.log_tail(30)
    );
    println!("{}", seen.join("\n"));

    // The variables list this node and namespace.
    for (name, query) in dashboard::variables() {
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(&format!(", {name})")))
            .unwrap_or_else(|| panic!("{name}: not label_values(selector, {name}): {query}"));
        let selector = dashboard::substitute(inner, &node_re, ".*", "30s");
        let data = prom
            .api(&format!("label/{name}/values"), "match[]", &selector)
            .await
            .unwrap();
        let want = if name == "node" { &node } else { ns };
        assert!(
            data.as_array().unwrap().iter().any(|v| v == want.as_str()),
            "variable {name}: {data} lacks {want}"
        );
    }
}

/// `s` as a regex matching only itself (names here are [a-z0-9-]).
fn regex_quote(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_string()
            } else {
                format!("\\\\{c}")
            }
        })
        .collect()
}
