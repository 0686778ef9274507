//! The alerts of deploy/monitoring/prometheusrule.yaml, checked by Prometheus'
//! own tool: `promtool check rules` on its rule groups, and `promtool test rules`
//! with tests/alerts/headroom.test.yaml, which has, for every alert, a series
//! that fires it and one that must not.
//!
//! promtool comes from Debian's `prometheus` package (tests/tools/prometheus.sh,
//! run by scripts/test).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn promtool() -> Command {
    Command::new("promtool")
}

/// The PrometheusRule's `spec` (a Prometheus rule file: `groups:`).
fn rule_groups() -> Value {
    let text = std::fs::read_to_string(repo().join("deploy/monitoring/prometheusrule.yaml"))
        .expect("read prometheusrule.yaml");
    let rule: Value = serde_saphyr::from_str(&text).expect("prometheusrule.yaml parses");
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

fn alert_names(groups: &Value) -> BTreeSet<String> {
    groups["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

/// Writes `groups` as rules.yaml (JSON is YAML) beside a copy of the unit-test file.
fn stage(groups: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), groups.to_string()).expect("write rules");
    std::fs::copy(
        repo().join("tests/alerts/headroom.test.yaml"),
        dir.path().join("headroom.test.yaml"),
    )
    .expect("copy test file");
    dir
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .expect("run promtool (Debian package prometheus; tests/tools/prometheus.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn promtool_check_rules_accepts_the_prometheus_rule() {
    let groups = rule_groups();
    let dir = stage(&groups);
    let (ok, out) = run(promtool()
        .arg("check")
        .arg("rules")
        .arg(dir.path().join("rules.yaml")));
    assert!(ok, "promtool check rules failed:\n{out}");
    let n = alert_names(&groups).len();
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
}

#[test]
fn promtool_unit_tests_of_every_alert_pass() {
    let dir = stage(&rule_groups());
    let (ok, out) =
        run(promtool()
            .current_dir(dir.path())
            .args(["test", "rules", "headroom.test.yaml"]));
    assert!(ok, "promtool test rules failed:\n{out}");
}

#[test]
fn every_alert_has_a_firing_case_and_a_silent_case() {
    let text = std::fs::read_to_string(repo().join("tests/alerts/headroom.test.yaml")).unwrap();
    let tests: Value = serde_saphyr::from_str(&text).unwrap();
    let (mut fires, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for t in tests["tests"].as_array().unwrap() {
        for a in t["alert_rule_test"].as_array().into_iter().flatten() {
            let name = a["alertname"].as_str().unwrap().to_string();
            if a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()) {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    let alerts = alert_names(&rule_groups());
    assert!(!alerts.is_empty());
    assert_eq!(fires, alerts, "alerts with a firing case");
    assert_eq!(silent, alerts, "alerts with a silent case");
}

/// The unit tests can fail: the first refusal appears as a new counter series
/// at 1, which a plain `increase()` rule (the rule before this test existed)
/// does not see; and a pressure threshold moved from 0.5 to 0.8 stops firing.
#[test]
fn unit_tests_fail_on_a_rule_that_misses_what_they_test() {
    for (from, to, alert) in [
        (
            r#"(headroom_resizes_total{result="refused"} unless headroom_resizes_total{result="refused"} offset 15m) or "#,
            "",
            "HeadroomResizeRefused",
        ),
        ("> 0.5", "> 0.8", "HeadroomNodeCpuPressure"),
    ] {
        let mut groups = rule_groups();
        let mut changed = false;
        for r in groups["groups"][0]["rules"].as_array_mut().unwrap() {
            if r["alert"] == alert {
                // Whitespace as promtool sees it: folded to single spaces.
                let expr: String = r["expr"]
                    .as_str()
                    .unwrap()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                let new = expr.replace(from, to);
                changed = new != expr;
                r["expr"] = Value::String(new);
            }
        }
        assert!(changed, "{alert}: {from:?} not found in the rule");
        let dir = stage(&groups);
        let (ok, out) =
            run(promtool()
                .current_dir(dir.path())
                .args(["test", "rules", "headroom.test.yaml"]));
        assert!(!ok, "{alert}: broken rule still passes:\n{out}");
        assert!(out.contains(&format!("alertname: {alert}")), "{out}");
    }
}
