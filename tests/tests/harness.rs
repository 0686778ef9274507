//! The control-plane harness itself: it starts, it serves what the other
//! suites rely on (admin client, kubeconfig file, namespaces, pod-bound
//! ServiceAccount tokens), and it leaves no process behind however the test
//! binary ends.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use testkit::process::{process_gone, spawn_guarded};

/// Tests that start control planes of their own run one at a time: the
/// machine has two cores.
static HEAVY: Mutex<()> = Mutex::new(());

const PIDS_LINE: &str = "HEADROOM_PIDS";
const MODE_ENV: &str = "HEADROOM_ORPHAN_MODE";

#[tokio::test]
async fn shared_control_plane_reports_its_version_and_start_up_time() {
    let cp = ControlPlane::shared();
    println!(
        "control plane ready after {:.2?} (apiserver {}, dir {})",
        cp.ready_after(),
        cp.apiserver_version(),
        cp.dir().display()
    );
    let info = cp.client().await.apiserver_version().await.unwrap();
    assert_eq!(info.git_version, cp.apiserver_version());
}

#[tokio::test]
async fn kubeconfig_file_gives_an_admin_client() {
    let cp = ControlPlane::shared();
    let kc = kube::config::Kubeconfig::read_from(cp.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some("headroom-admin"));
    assert!(user.groups.unwrap().contains(&"system:masters".to_string()));
    // Cluster-wide reads work (cluster-admin).
    Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn namespace_gets_a_default_service_account_so_pods_are_admitted() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("harness_ns").await;
    let client = cp.client().await;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .get("default")
        .await
        .unwrap();
    let pod = Api::<Pod>::namespaced(client, &ns)
        .create(&PostParams::default(), &pod_on("p", "node-x"))
        .await
        .unwrap();
    let spec = pod.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.node_name.as_deref(), Some("node-x"));
}

#[tokio::test]
async fn pod_bound_token_carries_the_node_name() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("harness-token").await;
    let client = cp.client().await;
    let node_name = format!("{ns}-node");
    let node: Node = serde_json::from_value(json!({"metadata": {"name": node_name}})).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pod_on("agent", &node_name))
        .await
        .unwrap();
    let tr: TokenRequest = serde_json::from_value(json!({
        "spec": {
            "audiences": ["https://kubernetes.default.svc.cluster.local"],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1", "kind": "Pod",
                "name": pod.metadata.name, "uid": pod.metadata.uid,
            }
        }
    }))
    .unwrap();
    let token = Api::<ServiceAccount>::namespaced(client, &ns)
        .create_token_request("default", &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .expect("TokenRequest status without a token");
    let sa_client = cp.client_for_token(&token).unwrap();
    let review = Api::<SelfSubjectReview>::all(sa_client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{ns}:default").as_str())
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/node-name"),
        Some(&vec![node_name.clone()]),
        "extra: {extra:?}"
    );
}

#[test]
fn dropping_a_control_plane_kills_its_processes() {
    let _heavy = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cp = rt
        .block_on(ControlPlane::start(ControlPlaneOptions::default()))
        .unwrap();
    let (etcd, api) = (cp.etcd_pid(), cp.apiserver_pid());
    let dir = cp.dir().to_path_buf();
    assert!(!process_gone(etcd, "etcd") && !process_gone(api, "kube-apiserver"));
    drop(cp);
    // Drop waits for both children, so they are gone at once.
    assert!(process_gone(etcd, "etcd"), "etcd {etcd} still runs");
    assert!(
        process_gone(api, "kube-apiserver"),
        "apiserver {api} still runs"
    );
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

#[test]
fn no_orphans_when_the_test_process_is_sigkilled() {
    orphan_check("sigkill");
}

#[test]
fn no_orphans_when_the_test_process_gets_sigterm() {
    orphan_check("sigterm");
}

#[test]
fn no_orphans_when_a_test_using_the_shared_control_plane_panics() {
    orphan_check("panic");
}

/// Child-process mode of this test binary, driven by [`orphan_check`]: starts
/// a control plane, prints its pids, then waits to be killed or panics.
#[tokio::test]
#[ignore = "helper: runs only as a child of the no_orphans_* tests"]
async fn orphan_helper() {
    let Ok(mode) = std::env::var(MODE_ENV) else {
        return;
    };
    if mode == "panic" {
        let cp = ControlPlane::shared();
        println!("{PIDS_LINE} {} {}", cp.etcd_pid(), cp.apiserver_pid());
        panic!("deliberate panic with a shared control plane running");
    }
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .unwrap();
    println!("{PIDS_LINE} {} {}", cp.etcd_pid(), cp.apiserver_pid());
    // Never dropped: only the death of this process may clean up.
    std::mem::forget(cp);
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

fn orphan_check(mode: &str) {
    let _heavy = HEAVY.lock().unwrap_or_else(|p| p.into_inner());
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["orphan_helper", "--exact", "--ignored", "--nocapture"])
        .env(MODE_ENV, mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = spawn_guarded(cmd).unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let pids = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("helper printed no pids (control plane did not start?)");
        if let Some(rest) = line.strip_prefix(PIDS_LINE) {
            let pids: Vec<u32> = rest
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
            break pids;
        }
    };
    let (etcd, api) = (pids[0], pids[1]);
    match mode {
        "sigkill" | "sigterm" => {
            assert!(
                !process_gone(etcd, "etcd"),
                "etcd not running before the kill"
            );
            assert!(!process_gone(api, "kube-apiserver"));
            let sig = if mode == "sigkill" {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            // SAFETY: signalling our own child.
            unsafe {
                libc::kill(child.id() as libc::pid_t, sig);
            }
        }
        _ => {} // the helper panics by itself
    }
    let status = child.wait().unwrap();
    if mode == "panic" {
        assert!(!status.success(), "helper test should have failed");
    }
    // Poll with a generous bound: this checks that they die, not how fast.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(process_gone(etcd, "etcd") && process_gone(api, "kube-apiserver")) {
        assert!(
            Instant::now() < deadline,
            "orphans after {mode}: etcd {etcd} gone={}, kube-apiserver {api} gone={}",
            process_gone(etcd, "etcd"),
            process_gone(api, "kube-apiserver")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pod_on(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]
        }
    }))
    .unwrap()
}

/// A DaemonSet pod meant for `node`: bound to it, or (not yet scheduled:
/// this Node has no kubelet) pinned to it by the node affinity the
/// DaemonSet controller writes (`matchFields` `metadata.name`).
fn daemon_pod_for(p: &Pod, node: &str) -> bool {
    let Some(spec) = p.spec.as_ref() else {
        return false;
    };
    spec.node_name.as_deref() == Some(node)
        || spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .is_some_and(|r| {
                r.node_selector_terms.iter().any(|t| {
                    t.match_fields.iter().flatten().any(|f| {
                        f.key == "metadata.name" && f.values.iter().flatten().any(|v| v == node)
                    })
                })
            })
}

/// The full cluster the real-node tier uses really runs its controllers: the
/// DaemonSet controller schedules one pod per Node, and kube-controller-manager
/// publishes the root CA ConfigMap every namespace's pods mount. (Until this
/// test, a flag the 1.37 controller manager no longer knew made it exit at
/// start, unnoticed: the real-node tests never needed a controller.)
#[tokio::test]
async fn full_cluster_runs_the_daemonset_controller_and_publishes_the_root_ca() {
    let cp = ControlPlane::start(ControlPlaneOptions {
        full_cluster: true,
        ..ControlPlaneOptions::default()
    })
    .await
    .expect("full control plane");
    let client = cp.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "ds-node"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let ns = cp.namespace("ds").await;
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "c", "image": "headroom.local/pause:1"}],
                },
            },
        },
    }))
    .unwrap();
    let dss: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client.clone(), &ns);
    dss.create(&PostParams::default(), &ds).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let on_node = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|p| daemon_pod_for(p, "ds-node"))
            .count();
        let ca = cms.get_opt("kube-root-ca.crt").await.unwrap();
        let published = ca.is_some();
        if let (1, Some(ca)) = (on_node, ca) {
            let pem = ca
                .data
                .and_then(|d| d.get("ca.crt").cloned())
                .unwrap_or_default();
            assert_eq!(pem.trim(), cp.ca_pem().trim(), "root CA is the cluster CA");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "DaemonSet pods for ds-node: {on_node}, root CA ConfigMap: {published}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
