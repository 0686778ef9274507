//! scripts/lib/benefit_table.py on a matrix run's files as the bench writes
//! them (runs.csv, summary.json from `summary::summarise_matrix`, meta.json):
//! a table and goal lines per scenario, a headline of goals met per
//! scenario, and no table at all for a run meta.json marks failed. Skipped
//! without python3 (as agent/tests/readme_benefit.rs is).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use benefit::matrix::{self, MixedSchedules};
use benefit::summary::{self, AGENT_DRY_RUN, AGENT_NONE, AGENT_PATCH, RunRow};
use serde_json::json;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh directory under the system's temp dir.
fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let d = std::env::temp_dir().join(format!(
        "benefit-table-{name}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `None` when there is no python3.
fn table_script(dir: &Path) -> Option<Output> {
    match Command::new("python3")
        .arg(repo().join("scripts/lib/benefit_table.py"))
        .arg(dir)
        .output()
    {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("skipped: no python3 to run scripts/lib/benefit_table.py");
            None
        }
        Err(e) => panic!("python3: {e}"),
    }
}

fn rows() -> Vec<RunRow> {
    let mut v = Vec::new();
    for scenario in ["mixed", "pair", "flicker"] {
        for rep in 0..2 {
            let r = rep as f64;
            let row = |config: &str, agent: &str, svc_p99: f64| RunRow {
                id: format!("{scenario}-{config}-r{rep}"),
                scenario: scenario.into(),
                config: config.into(),
                agent: agent.into(),
                rep,
                svc_p50_ms: svc_p99 / 2.0,
                svc_p99_ms: svc_p99 + r,
                svc_p999_ms: svc_p99 + 10.0,
                svc2_p99_ms: if scenario == "pair" {
                    svc_p99 + 5.0
                } else {
                    f64::NAN
                },
                within_p99_ms: 100.0,
                within_contended_usage_m: 150.0,
                batch_demand_p99_ms: if scenario == "pair" { f64::NAN } else { 900.0 },
                raise1_s: (agent == AGENT_PATCH).then_some(0.3),
                ..RunRow::default()
            };
            v.push(row(summary::STATIC, AGENT_NONE, 15_000.0));
            v.push(row(summary::NO_LIMIT, AGENT_NONE, 120.0));
            v.push(RunRow {
                lowerings_helped: 1,
                lowerings_no_effect: usize::from(scenario == "pair"),
                max_patches_per_burst: 2,
                svc_lowerings: 1,
                batch_demand_p99_ms: if scenario == "pair" { f64::NAN } else { 1800.0 },
                // flicker: 6 episodes; a third patch in one of them in
                // the second repetition.
                episodes: if scenario == "flicker" { 6 } else { 0 },
                max_patches_per_episode: if scenario == "flicker" { 2 + rep } else { 0 },
                ..row("c-headroom", AGENT_PATCH, 8_000.0)
            });
            v.push(row("e-dryrun", AGENT_DRY_RUN, 15_100.0));
            // mixed: koordlet beside them, its service p99 6,000 (c's
            // 8,000: worse), the neighbours' figures as (a)'s (c's batch
            // p99 twice its).
            if scenario == "mixed" {
                v.push(row(summary::KOORDLET, AGENT_NONE, 6_000.0));
            }
        }
    }
    v
}

fn write_run(dir: &Path, failed: Option<&str>) {
    let scenarios: Vec<matrix::Scenario> = ["mixed", "pair", "flicker"]
        .iter()
        .map(|n| matrix::scenario(n, MixedSchedules::default()).unwrap())
        .collect();
    let parties: Vec<(&str, matrix::Parties)> =
        scenarios.iter().map(|s| (s.name, s.parties())).collect();
    let rows = rows();
    std::fs::write(dir.join("runs.csv"), summary::runs_csv(&rows).unwrap()).unwrap();
    let s = summary::summarise_matrix(&rows, &parties);
    std::fs::write(dir.join("summary.json"), s.to_string()).unwrap();
    let meta = json!({
        "scenario_names": ["mixed", "pair", "flicker"],
        "scenarios": scenarios.iter().map(|s| (s.name.to_string(), json!({"about": s.about, "parties": s.parties()}))).collect::<serde_json::Map<_, _>>(),
        "flagged": false,
        "failed": failed,
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
}

#[test]
fn a_matrix_run_gets_a_table_and_goals_per_scenario_and_a_headline() {
    let dir = scratch("ok");
    write_run(&dir, None);
    let Some(out) = table_script(&dir) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = std::fs::read_to_string(dir.join("table.md")).unwrap();
    assert!(
        table.contains("**Scenario `mixed`**: bursts to 1.5"),
        "{table}"
    );
    assert!(table.contains("**Scenario `pair`**"), "{table}");
    // pair has a second service column, mixed an unmanaged one.
    let mixed = table.split("**Scenario `pair`**").next().unwrap();
    assert!(mixed.contains("unmanaged p99 ms") && !mixed.contains("second service p99 ms"));
    let pair = table
        .split("**Scenario `pair`**")
        .nth(1)
        .unwrap()
        .split("**Scenario `flicker`**")
        .next()
        .unwrap();
    assert!(pair.contains("second service p99 ms") && !pair.contains("unmanaged p99 ms"));
    // (c)'s p99 8,000 against (a)'s 15,000: met; against (b)'s 120: not.
    assert!(
        table.contains(
            "- **service's p99 never worse than under (a)** (median at most 1×): (c) 0.53×"
        ),
        "{table}"
    );
    assert!(table.contains("**not met**") && table.contains("**met**"));
    assert!(
        pair.contains("0 lowerings that bought the pod owed nothing")
            && pair.contains("worst run 1: **not met**"),
        "{pair}"
    );
    assert!(table.contains("(e) 1.01×"), "{table}");
    // flicker: its patches per episode, as a column and a goal, in place of
    // per burst; no goal against (b) for the service (the node is short).
    let flicker = table.split("**Scenario `flicker`**").nth(1).unwrap();
    assert!(
        flicker.contains("| patches per episode (max) |")
            && !mixed.contains("patches per episode")
            && !pair.contains("patches per episode"),
        "{table}"
    );
    assert!(
        flicker.contains(
            "- **at most 2 patches of a managed pod per episode of the within-request \
             neighbour's need** (no run above 2): (c) median 2.5 [2–3], worst run 3: **not met**"
        ),
        "{flicker}"
    );
    assert!(!flicker.contains("at most 3 patches of a managed pod per burst"));
    assert!(!flicker.contains("service's p99 within 2× of (b)"));
    assert!(flicker.contains("within-request neighbour's p99 at most +10 % against (a)"));
    let headline = std::fs::read_to_string(dir.join("headline.md")).unwrap();
    let line = |name: &str| {
        headline
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("no {name} row in {headline}"))
            .to_string()
    };
    // mixed: (c) 8 goals and 4 against (k), (e) 1; not met: p99 against
    // (b), batch against (b), and both again against (k).
    assert!(line("mixed").contains("| 9 of 13 |"), "{headline}");
    assert!(
        line("mixed").contains(
            "(c) service p99 ≤ 2× (b); (c) unmanaged p99 ≤ (b); (c) service p99 ≤ (k); \
             (c) unmanaged p99 ≤ +10 % of (k) |"
        ),
        "{headline}"
    );
    // Against (k) only where it ran.
    assert!(
        mixed.contains(
            "- **service's p99 no worse than under (k) koordlet** (median at most 1×): \
             (c) 1.33×"
        ) && mixed.contains("| (k) koordlet CPU Burst auto |"),
        "{mixed}"
    );
    assert!(!pair.contains("(k) koordlet") && !line("pair").contains("(k)"));
    assert!(
        line("pair").contains("(c) 0 lowerings that bought nothing"),
        "{headline}"
    );
    // flicker: (c) 7 goals, (e) 1; not met: batch against (b), per episode.
    assert!(line("flicker").contains("| 6 of 8 |"), "{headline}");
    assert!(
        line("flicker").contains("(c) unmanaged p99 ≤ (b); (c) ≤ 2 patches per episode |"),
        "{headline}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_run_gets_no_table() {
    let dir = scratch("failed");
    write_run(
        &dir,
        Some("mixed-c-headroom-r0: the agent yielded to another writer"),
    );
    let Some(out) = table_script(&dir) else {
        return;
    };
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("yielded to another writer"), "{err}");
    assert!(!dir.join("table.md").exists());
    assert!(!dir.join("headline.md").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
