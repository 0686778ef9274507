//! Input at the edges of the agent's command line, against the real
//! apiserver: values that used to be accepted and then shaped API requests
//! (an empty node name watched unscheduled pods with `/readyz` at 200; a
//! node name with a comma extended the field selector; `explain` built API
//! paths from `NAMESPACE/NAME` as typed) are refused before any request,
//! with a clear error and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use testkit::agent::{agent_binary, free_port};
use testkit::control_plane::ControlPlane;

fn fixture_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cgroup-fixtures/kind/root")
}

/// Runs the agent with `args`; fails the test if it is still running after
/// `limit` (i.e. it accepted the input and started serving).
fn run_agent(args: &[&str], envs: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = Command::new(agent_binary().unwrap());
    cmd.args(args)
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "agent {args:?} {envs:?} still running after {limit:?}: the input was accepted\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn refused(out: &Output, want: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(stderr.contains(want), "stderr lacks {want:?}:\n{stderr}");
}

fn run_args(cp: &ControlPlane, node: &str) -> Vec<String> {
    vec![
        "run".into(),
        "--node-name".into(),
        node.into(),
        "--kubeconfig".into(),
        cp.kubeconfig_path().display().to_string(),
        "--cgroup-root".into(),
        fixture_root().display().to_string(),
        "--metrics-addr".into(),
        format!("127.0.0.1:{}", free_port().unwrap()),
    ]
}

const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn run_refuses_an_empty_or_malformed_node_name() {
    let cp = ControlPlane::shared();
    for (node, want) in [
        ("", "node name must not be empty"),
        (
            "a,metadata.namespace=x",
            "node name \"a,metadata.namespace=x\" is not a DNS-1123 subdomain",
        ),
        ("Node-A", "is not a DNS-1123 subdomain"),
    ] {
        let args = run_args(cp, node);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&run_agent(&args, &[], LIMIT), want);
    }
}

#[test]
fn run_refuses_an_empty_node_name_env() {
    let cp = ControlPlane::shared();
    let mut args = run_args(cp, "x");
    args.drain(1..3); // no --node-name: NODE_NAME only
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_agent(&args, &[("NODE_NAME", "")], LIMIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("node name must not be empty") || stderr.contains("--node-name"),
        "{stderr}"
    );
}

#[test]
fn run_refuses_a_busy_tick_and_zero_allocatable() {
    let cp = ControlPlane::shared();
    for (extra, want) in [
        (
            ["--tick", "0.000001s"],
            "\"0.000001s\" must be between 100ms and 24h",
        ),
        (["--node-allocatable", "0"], "\"0\" must be more than 0"),
        (
            ["--ceiling-factor", "1e308"],
            "ceiling_factor = 1e308 is out of range",
        ),
        (
            ["--floor", "limit"],
            "\"limit\": expected request or declared",
        ),
    ] {
        let mut args = run_args(cp, "node-a");
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&run_agent(&args, &[], LIMIT), want);
    }
}

#[test]
fn explain_refuses_pod_references_that_are_not_names() {
    let cp = ControlPlane::shared();
    let kc = cp.kubeconfig_path().display().to_string();
    for (pod, want) in [
        (
            "default/pod/log",
            "pod name \"pod/log\" is not a DNS-1123 subdomain",
        ),
        ("../../x/y", "namespace \"..\" is not a DNS-1123 label"),
        (
            "Default/web",
            "namespace \"Default\" is not a DNS-1123 label",
        ),
        ("web", "expected NAMESPACE/POD"),
    ] {
        let out = run_agent(
            &["explain", pod, "--kubeconfig", &kc, "--interval", "100ms"],
            &[],
            LIMIT,
        );
        refused(&out, want);
        // Refused before any API request (which would say "reading pod").
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("reading pod"),
            "{pod}: an API request was made"
        );
    }
}
