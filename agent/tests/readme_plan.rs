//! The README's main command prints what the README shows, byte for byte,
//! on any machine: the fixture carries both samples and its CPU set, so
//! nothing comes from the host.

use std::path::Path;
use std::process::Command;

const MARKER: &str = "<!-- readme-test: plan -->";

/// The fenced blocks right after [`MARKER`]: the command and its output.
fn blocks(readme: &str) -> (String, String) {
    let at = readme.find(MARKER).expect("README has the plan marker");
    let mut fences = readme[at..].split("```").skip(1);
    let cmd = fences.next().expect("command block");
    fences.next(); // text between the two blocks
    let out = fences.next().expect("output block");
    let body = |b: &str| b.split_once('\n').map(|x| x.1).unwrap_or("").to_string();
    (body(cmd), body(out))
}

#[test]
fn readme_main_command_prints_the_documented_output() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let (cmd, expected) = blocks(&readme);
    let args: Vec<&str> = cmd
        .split_once(" -- ")
        .expect("cargo run ... -- ARGS")
        .1
        .split_whitespace()
        .collect();
    assert_eq!(args.first(), Some(&"plan"), "{cmd}");
    let out = Command::new(env!("CARGO_BIN_EXE_headroom-agent"))
        .args(&args)
        .current_dir(&repo)
        // Nothing from the environment may change the answer.
        .env_remove("HEADROOM_CGROUP_ROOT")
        .env_remove("HEADROOM_CONFIG")
        .env_remove("NODE_NAME")
        .env_remove("HEADROOM_NODE_ALLOCATABLE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).unwrap();
    assert_eq!(got, expected, "README output differs; got:\n{got}");
}

#[test]
fn plan_on_the_fixture_raises_one_pod_and_lowers_another_with_true_reasons() {
    let v = plan_json("kind");
    let slack = v["node"]["real_slack_millicores"].as_u64().unwrap();
    let capacity = v["node"]["capacity_millicores"].as_u64().unwrap();
    assert_eq!(v["node"]["capacity_source"], "node_allocatable");
    assert_eq!(
        capacity, 8000,
        "the Node's allocatable, not this host's CPUs"
    );
    let pod = |name: &str| {
        v["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()
            .clone()
    };
    let web = pod("web");
    assert_eq!(web["decision"], "raise", "{web}");
    let why = web["why"].as_str().unwrap();
    assert!(why.starts_with("raise 300m→"), "{why}");
    assert!(why.contains(&format!("slack {slack}m")), "{why}");
    let report = pod("report");
    assert_eq!(report["decision"], "lower", "{report}");
    let why = report["why"].as_str().unwrap();
    assert!(why.starts_with("lower 800m→"), "{why}");
    assert!(
        why.contains(&format!("slack {slack}m over 2 managed pods")),
        "{why}"
    );
    // Usage is the fixture's known load between its samples.
    assert_eq!(web["usage_millicores"], 290, "{web}");
}

#[test]
fn plan_refuses_missing_inputs_with_one_clear_error() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom-agent"))
            .args(args)
            .env_remove("NODE_NAME")
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = run(&[
        "plan",
        "--cgroup-root",
        "/nonexistent",
        "--pods",
        "cgroup-fixtures/kind/pods.json",
        "--node",
        "cgroup-fixtures/kind/node.json",
    ]);
    assert_eq!(code, Some(2));
    assert_eq!(err.matches("/nonexistent").count(), 1, "{err}");
    let (code, err) = run(&[
        "plan",
        "--cgroup-root",
        "cgroup-fixtures/kind/root",
        "--pods",
        "/nonexistent.json",
    ]);
    assert_eq!(code, Some(2));
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
    // Pods but no node name anywhere.
    let (code, err) = run(&[
        "plan",
        "--cgroup-root",
        "cgroup-fixtures/kind/root",
        "--pods",
        "cgroup-fixtures/kind/pods.json",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("no node name"), "{err}");
    // Not JSON.
    let (code, err) = run(&[
        "plan",
        "--cgroup-root",
        "cgroup-fixtures/kind/root",
        "--pods",
        "README.md",
        "--node-name",
        "n",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("parsing README.md"), "{err}");
}

#[test]
fn slack_with_pods_names_pods_and_marks_pause_containers() {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom-agent"))
        .args([
            "slack",
            "--interval",
            "100ms",
            "--cgroup-root",
            "cgroup-fixtures/kind/root",
        ])
        .args(["--pods", "cgroup-fixtures/kind/pods.json"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("capacity 8000m (CPUs in cpuset.cpus.effective)"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("default/kind-guaranteed "))
        .expect("rows by namespace/name");
    // Guaranteed: the app container's 500m, and the pause container marked
    // as such (its cpu.max is unlimited on every node).
    assert!(
        row.contains("=500m") && row.contains("(pause)=unlimited"),
        "{row}"
    );
}

/// `plan --json` on fixture `name` (its two samples 10 s apart).
fn plan_json(name: &str) -> serde_json::Value {
    serde_json::from_slice(&plan_out(name, true)).unwrap()
}

fn plan_text(name: &str) -> String {
    String::from_utf8(plan_out(name, false)).unwrap()
}

fn plan_out(name: &str, json: bool) -> Vec<u8> {
    let f = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../cgroup-fixtures")
        .join(name);
    let mut args = vec!["plan"];
    if json {
        args.push("--json");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_headroom-agent"))
        .args(args)
        .args(["--interval", "10s", "--cgroup-root"])
        .arg(f.join("root"))
        .arg("--later")
        .arg(f.join("later"))
        .arg("--pods")
        .arg(f.join("pods.json"))
        .arg("--node")
        .arg(f.join("node.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn decision_of<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str().is_some_and(|n| n.starts_with(name)))
        .unwrap_or_else(|| panic!("no pod {name} in {v}"))
}

/// A pod alone whose 4 threads outnumber the 2 CPUs: kubepods `some` near
/// 100 %, the pod's `full` near 0. Nobody else waits: it keeps its limit.
#[test]
fn plan_never_lowers_a_lone_pod_for_its_own_queued_threads() {
    let v = plan_json("lone-threads");
    let t = decision_of(&v, "thumbnailer");
    assert_ne!(t["decision"], "lower", "{t}");
    assert!(t["target_millicores"].as_u64().unwrap() >= 1900, "{t}");
}

/// A neighbour within its request (800m) got 500m and waited 30 % of the
/// time: the managed pod gives back what it waited for.
#[test]
fn plan_lowers_for_a_neighbour_displaced_within_its_request_by_what_it_waited_for() {
    let v = plan_json("displaced");
    let t = decision_of(&v, "indexer");
    assert_eq!(t["decision"], "lower", "{t}");
    let why = t["why"].as_str().unwrap();
    assert!(why.contains("1 pod(s) displaced, 300m owed"), "{why}");
    let text = plan_text("displaced");
    assert!(
        text.contains("waited for 300m (usage 500m, request 800m; node free 0m): short of CPU within its request: owed 300m"),
        "{text}"
    );
}
