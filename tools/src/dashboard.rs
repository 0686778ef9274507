//! The Grafana dashboard shipped in deploy/helm/headroom/dashboards/headroom.json,
//! generated here so every query is code a test can run: tools/tests/dashboard.rs
//! checks the committed JSON equals [`dashboard`] and runs every [`Panel`]'s
//! queries against a real Prometheus scraping a real agent.
//!
//! Regenerate after a change: `cargo run -p headroom-tools --bin gen-dashboard`
//! (or `HEADROOM_WRITE_DASHBOARD=1 cargo test -p headroom-tools --test dashboard committed`).

use serde_json::{Value, json};

/// Repository path of the generated JSON (the chart's ConfigMap includes it).
pub const DASHBOARD_PATH: &str = "deploy/helm/headroom/dashboards/headroom.json";

/// Grafana variables the queries use; [`substitute`] replaces them for a
/// direct Prometheus query.
pub const NODE_VAR: &str = "$node";
pub const NAMESPACE_VAR: &str = "$namespace";
pub const RATE_VAR: &str = "$__rate_interval";

/// One query of a panel: PromQL and its legend.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub expr: String,
    pub legend: String,
    /// For a query that falls back to 0 per node ([`or_zero_per_node`]): the
    /// expression without the fallback, which a test checks separately where
    /// it makes the counter exist.
    pub counter: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    TimeSeries,
    Heatmap,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: &'static str,
    pub description: &'static str,
    pub kind: Kind,
    /// Grafana unit id (e.g. "percentunit", "s").
    pub unit: &'static str,
    pub queries: Vec<Query>,
}

/// A section of panels under a collapsed-by-default-off row.
pub struct Row {
    pub title: &'static str,
    pub panels: Vec<Panel>,
}

fn q(expr: impl Into<String>, legend: &str) -> Query {
    Query {
        expr: expr.into(),
        legend: legend.to_string(),
        counter: None,
    }
}

/// `{node=~"$node"}`, plus the namespace filter for per-pod series.
const NODE: &str = r#"node=~"$node""#;
const POD: &str = r#"node=~"$node", namespace=~"$namespace""#;

/// `expr`, or 0 per node while the counter has no series yet (a counter
/// family appears only at its first increment, e.g. the first patch error):
/// an empty panel would read as "no data", not "none happened".
fn or_zero_per_node(expr: String, legend: &str) -> Query {
    Query {
        expr: format!("({expr}) or on (node) (0 * max by (node) (headroom_build_info{{{NODE}}}))"),
        legend: legend.to_string(),
        counter: Some(expr),
    }
}

pub fn rows() -> Vec<Row> {
    use Kind::*;
    vec![
        Row {
            title: "Node",
            panels: vec![
                Panel {
                    title: "Node CPU: real vs booked slack",
                    description: "Real slack: allocatable CPU the pods leave unused (measured). \
                        Booked slack: CPU handed out above requests by the limits Headroom set. \
                        Booked above real means the limits promise more than the node has spare.",
                    kind: TimeSeries,
                    unit: "none",
                    queries: vec![
                        q(
                            format!("headroom_node_real_slack_millicores{{{NODE}}}"),
                            "real slack {{node}}",
                        ),
                        q(
                            format!("headroom_node_booked_slack_millicores{{{NODE}}}"),
                            "booked slack {{node}}",
                        ),
                        q(
                            format!("headroom_node_usage_millicores{{{NODE}}}"),
                            "usage {{node}}",
                        ),
                        q(
                            format!("headroom_node_capacity_millicores{{{NODE}}}"),
                            "capacity {{node}}",
                        ),
                    ],
                },
                Panel {
                    title: "Node CPU pressure",
                    description: "cpu.pressure `some` avg10 of the pods' cgroup (kubepods), the part \
                        the pods' own CFS throttling explains, and the CPU owed to pods displaced \
                        within their requests, over capacity: what managed pods give back \
                        (docs/design.md, Every tick).",
                    kind: TimeSeries,
                    unit: "percentunit",
                    queries: vec![
                        q(
                            format!("headroom_node_pressure_some_ratio{{{NODE}}}"),
                            "PSI some {{node}}",
                        ),
                        q(
                            format!("headroom_node_cpu_throttling_stall_ratio{{{NODE}}}"),
                            "throttling stall {{node}}",
                        ),
                        q(
                            format!("headroom_node_cpu_contention_ratio{{{NODE}}}"),
                            "owed to displaced pods {{node}}",
                        ),
                    ],
                },
                Panel {
                    title: "Pods by state",
                    description: "Pods on the node Headroom manages, and why the others are not managed.",
                    kind: TimeSeries,
                    unit: "none",
                    queries: vec![q(
                        format!("sum by (node, state, reason) (headroom_pods{{{NODE}}})"),
                        "{{node}} {{state}} {{reason}}",
                    )],
                },
            ],
        },
        Row {
            title: "Pods",
            panels: vec![
                Panel {
                    title: "Pod CPU: limit, target, usage, request",
                    description: "Per managed pod (pod totals, millicores): the limit in its spec, \
                        the target the policy computed, measured usage and the request.",
                    kind: TimeSeries,
                    unit: "none",
                    queries: vec![
                        q(
                            format!("headroom_pod_cpu_limit_millicores{{{POD}}}"),
                            "limit {{namespace}}/{{pod}}",
                        ),
                        q(
                            format!("headroom_pod_cpu_target_millicores{{{POD}}}"),
                            "target {{namespace}}/{{pod}}",
                        ),
                        q(
                            format!("headroom_pod_cpu_usage_millicores{{{POD}}}"),
                            "usage {{namespace}}/{{pod}}",
                        ),
                        q(
                            format!("headroom_pod_cpu_request_millicores{{{POD}}}"),
                            "request {{namespace}}/{{pod}}",
                        ),
                    ],
                },
                Panel {
                    title: "Pod CPU throttling",
                    description: "Throttled CFS periods / periods over the last tick, per managed pod.",
                    kind: TimeSeries,
                    unit: "percentunit",
                    queries: vec![q(
                        format!("headroom_pod_cpu_throttled_ratio{{{POD}}}"),
                        "{{namespace}}/{{pod}}",
                    )],
                },
            ],
        },
        Row {
            title: "Resizes",
            panels: vec![
                Panel {
                    title: "Resizes by result",
                    description: "Resize patches per second by result (applied, verified, unverified, \
                        refused, error, dry_run) and direction.",
                    kind: TimeSeries,
                    unit: "ops",
                    queries: vec![q(
                        format!(
                            "sum by (node, result, direction) (rate(headroom_resizes_total{{{NODE}}}[$__rate_interval]))"
                        ),
                        "{{node}} {{result}} {{direction}}",
                    )],
                },
                Panel {
                    title: "Verification latency",
                    description: "Time from an accepted patch until the new cpu.max is seen in the \
                        cgroup files (the kubelet applied it).",
                    kind: Heatmap,
                    unit: "s",
                    queries: vec![q(
                        format!(
                            "sum by (le) (increase(headroom_resize_verification_latency_seconds_bucket{{{NODE}}}[$__rate_interval]))"
                        ),
                        "{{le}}",
                    )],
                },
                Panel {
                    title: "Cgroup drift",
                    description: "Cgroups whose cpu.max has not matched the pod spec for longer than \
                        the drift grace, per node and per pod (HeadroomCgroupDrift fires after 10 min).",
                    kind: TimeSeries,
                    unit: "none",
                    queries: vec![
                        or_zero_per_node(
                            format!("sum by (node) (headroom_cgroup_drift{{{NODE}}})"),
                            "drifting cgroups {{node}}",
                        ),
                        q(
                            format!(
                                "max by (namespace, pod, container) (headroom_cgroup_drift{{{POD}}}) == 1"
                            ),
                            "{{namespace}}/{{pod}} {{container}}",
                        ),
                    ],
                },
                Panel {
                    title: "Patch errors",
                    description: "Failed resize patches per second by class (refused, forbidden, \
                        conflict, not_found, throttled, server_error, other).",
                    kind: TimeSeries,
                    unit: "ops",
                    queries: vec![or_zero_per_node(
                        format!(
                            "sum by (node, class) (rate(headroom_patch_errors_total{{{NODE}}}[$__rate_interval]))"
                        ),
                        "{{node}} {{class}}",
                    )],
                },
            ],
        },
        Row {
            title: "Agent",
            panels: vec![
                Panel {
                    title: "Agent footprint: tick work",
                    description: "p99 of the agent's cgroup scan and policy decision per tick. \
                        The agent exports no process metrics; its CPU and memory are the \
                        container's (cAdvisor).",
                    kind: TimeSeries,
                    unit: "s",
                    queries: vec![
                        q(
                            format!(
                                "histogram_quantile(0.99, sum by (node, le) (rate(headroom_scan_duration_seconds_bucket{{{NODE}}}[$__rate_interval])))"
                            ),
                            "scan p99 {{node}}",
                        ),
                        q(
                            format!(
                                "histogram_quantile(0.99, sum by (node, le) (rate(headroom_decision_duration_seconds_bucket{{{NODE}}}[$__rate_interval])))"
                            ),
                            "decision p99 {{node}}",
                        ),
                    ],
                },
                Panel {
                    title: "Agent footprint: series and scrape",
                    description: "Series one scrape of the agent returns (bounded: per-pod series \
                        exist only while the pod is on the node) and how long the scrape takes.",
                    kind: TimeSeries,
                    unit: "none",
                    queries: vec![
                        q(
                            format!("scrape_samples_scraped{{job=~\".*headroom.*\", {NODE}}}"),
                            "series {{node}}",
                        ),
                        q(
                            format!("scrape_duration_seconds{{job=~\".*headroom.*\", {NODE}}}"),
                            "scrape seconds {{node}}",
                        ),
                    ],
                },
                Panel {
                    title: "Agent scan errors and health",
                    description: "cgroup read errors per second by kind, and whether each agent is \
                        scraped (up).",
                    kind: TimeSeries,
                    unit: "none",
                    queries: vec![
                        or_zero_per_node(
                            format!(
                                "sum by (node, kind) (rate(headroom_scan_errors_total{{{NODE}}}[$__rate_interval]))"
                            ),
                            "scan errors {{node}} {{kind}}",
                        ),
                        q(
                            format!("up{{job=~\".*headroom.*\", {NODE}}}"),
                            "up {{node}}",
                        ),
                    ],
                },
            ],
        },
    ]
}

/// Every panel, in dashboard order.
pub fn panels() -> Vec<Panel> {
    rows().into_iter().flat_map(|r| r.panels).collect()
}

/// The template variables: (name, label_values query).
pub fn variables() -> Vec<(&'static str, String)> {
    vec![
        (
            "node",
            "label_values(headroom_node_capacity_millicores, node)".to_string(),
        ),
        (
            "namespace",
            format!("label_values(headroom_pod_cpu_limit_millicores{{{NODE}}}, namespace)"),
        ),
    ]
}

/// A query with the Grafana variables replaced by values a plain Prometheus
/// query accepts. `node`/`namespace` are regexes (the variables are multi-value).
pub fn substitute(expr: &str, node: &str, namespace: &str, rate_interval: &str) -> String {
    expr.replace(RATE_VAR, rate_interval)
        .replace(NODE_VAR, node)
        .replace(NAMESPACE_VAR, namespace)
}

fn datasource() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

fn panel_json(p: &Panel, id: u64, x: u64, y: u64) -> Value {
    let targets: Vec<Value> = p
        .queries
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut v = json!({
                "datasource": datasource(),
                "expr": t.expr,
                "legendFormat": t.legend,
                "refId": char::from(b'A' + i as u8).to_string(),
            });
            if p.kind == Kind::Heatmap {
                v["format"] = json!("heatmap");
            }
            v
        })
        .collect();
    let mut v = json!({
        "id": id,
        "title": p.title,
        "description": p.description,
        "datasource": datasource(),
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "targets": targets,
    });
    match p.kind {
        Kind::TimeSeries => {
            v["type"] = json!("timeseries");
            v["fieldConfig"] = json!({"defaults": {"unit": p.unit}, "overrides": []});
            v["options"] = json!({"legend": {"displayMode": "list", "placement": "bottom"},
                                  "tooltip": {"mode": "multi", "sort": "desc"}});
        }
        Kind::Heatmap => {
            v["type"] = json!("heatmap");
            v["fieldConfig"] = json!({"defaults": {}, "overrides": []});
            v["options"] = json!({
                "calculate": false,
                "yAxis": {"unit": p.unit},
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges"},
            });
        }
    }
    v
}

fn variable_json(name: &str, query: &str) -> Value {
    json!({
        "name": name,
        "label": name,
        "type": "query",
        "datasource": datasource(),
        "query": {"query": query, "refId": format!("{name}-var")},
        "definition": query,
        "refresh": 2,
        "multi": true,
        "includeAll": true,
        "allValue": ".*",
        "current": {"selected": true, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    })
}

/// The dashboard JSON (Grafana schema 39, importable and sidecar-loadable).
pub fn dashboard() -> Value {
    let mut panels = Vec::new();
    let mut id = 1;
    let mut y = 0;
    for row in rows() {
        panels.push(json!({
            "id": id, "type": "row", "title": row.title, "collapsed": false,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": [],
        }));
        id += 1;
        y += 1;
        for (i, p) in row.panels.iter().enumerate() {
            let x = if i % 2 == 0 { 0 } else { 12 };
            panels.push(panel_json(p, id, x, y));
            id += 1;
            if i % 2 == 1 || i + 1 == row.panels.len() {
                y += 8;
            }
        }
    }
    let mut list = vec![json!({
        "name": "datasource", "label": "Data source", "type": "datasource",
        "query": "prometheus", "current": {}, "hide": 0,
    })];
    list.extend(variables().iter().map(|(n, q)| variable_json(n, q)));
    json!({
        "uid": "headroom",
        "title": "Headroom",
        "description": "Headroom node agent: slack, pressure, per-pod limits, resizes, drift, agent footprint.",
        "tags": ["headroom", "kubernetes"],
        "editable": true,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": list},
        "annotations": {"list": []},
        "panels": panels,
    })
}

/// The committed file's text: pretty JSON with a trailing newline.
pub fn dashboard_text() -> String {
    let mut s = serde_json::to_string_pretty(&dashboard()).expect("dashboard serialises");
    s.push('\n');
    s
}
