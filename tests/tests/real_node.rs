//! The real-node tier: a real kubelet v1.37, containerd and runc on a real
//! Linux kernel (Debian VMs under QEMU), two nodes — systemd driver under a
//! kind-like `/kubelet` cgroupRoot, and the cgroupfs driver — joined to the
//! test control plane with kube-controller-manager and kube-scheduler.
//!
//! Every test that states a kubelet fact asserts it on the real kubelet and,
//! where the simulated kubelet models it, runs the same pods through the
//! simulator on a node of the same layout and compares (parity).
//!
//! Tests take one lock: the VMs' emulated CPUs are shared, and the agent
//! scenarios measure CPU.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::control_plane::resize;
use testkit::kubelet_sim::{SimConfig, SimKubelet, SimLayout, StaticPod};
use testkit::node_vm::{NodeVm, PodCpuMax, RealCluster};
use testkit::scenario::pod::{millis, pod_limit_m};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static TIER_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Prints when the calling test took the lock, from the first test's start:
/// with the tests one after the other, the per-test times a CI budget needs.
/// Written to the stderr handle, which the test harness does not capture
/// (it captures the print macros only), so a passing test's line shows too.
fn timing(what: &str) {
    use std::io::Write;
    let start = *TIER_START.get_or_init(Instant::now);
    let _ = writeln!(
        std::io::stderr(),
        "TIMING {} {what} at +{:.0} s",
        std::thread::current().name().unwrap_or("?"),
        start.elapsed().as_secs_f64()
    );
}

/// Takes the one lock, then removes what an earlier test left behind when it
/// failed before its own cleanup: its pods (busy loops among them) would
/// otherwise load the nodes under every test that follows.
async fn serial(c: &RealCluster) -> tokio::sync::MutexGuard<'static, ()> {
    TIER_START.get_or_init(Instant::now);
    let guard = SERIAL.lock().await;
    timing("starts");
    for node in &c.nodes {
        GuestAgent::stop_any(node)
            .await
            .expect("stop a leftover agent");
        // A test that failed mid-fault leaves its fault behind: a stopped
        // kubelet (the node goes NotReady and every later pod is evicted),
        // a file mounted over kubepods' cpu.stat, kubepods' files unreadable.
        let stat = format!("{}/cpu.stat", node.spec.kubepods_path());
        let kp = node.spec.kubepods_path();
        // And the hold-end test's cap on the pods (a node whose kubelet
        // is down may have no kubepods to reset).
        let _ = node.sh(&pods_quota_cmd(node, None)).await;
        node.sh(&format!(
            "umount {stat} 2>/dev/null; chmod a+r {kp}/cpu.stat {kp}/cpu.pressure; \
             rm -f {}/*; systemctl start containerd kubelet",
            testkit::node_vm::config::STATIC_POD_PATH
        ))
        .await
        .expect("undo a leftover fault");
    }
    // An agent DaemonSet a failed test left installed; its namespace stays
    // (the next `kubectl apply -k deploy/` must not find it Terminating).
    c.remove_daemonset()
        .await
        .expect("remove a leftover agent DaemonSet");
    let client = c.cp.client().await;
    // Simulated nodes a failed parity test left registered: what is
    // scheduled to them stays Pending for ever.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let ours: Vec<&str> = c.nodes.iter().map(|n| n.name()).collect();
    for n in nodes
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
    {
        let name = n.metadata.name.unwrap_or_default();
        if !ours.contains(&name.as_str()) {
            eprintln!("left by an earlier test, removed: node {name}");
            let _ = nodes.delete(&name, &Default::default()).await;
        }
    }
    // A namespace an earlier cleanup already deleted is Terminating; it is
    // left only if it still has pods.
    let with_pods: std::collections::BTreeSet<String> = Api::<Pod>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.namespace)
        .collect();
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let left: Vec<String> = nss
        .list(&Default::default())
        .await
        .expect("list namespaces")
        .items
        .into_iter()
        .filter(|n| {
            let terminating =
                n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
            let name = n.metadata.name.as_deref().unwrap_or_default();
            !terminating || with_pods.contains(name)
        })
        .filter_map(|n| n.metadata.name)
        .filter(|n| {
            n != "default" && !n.starts_with("kube-") && n != testkit::node_vm::daemonset::NAMESPACE
        })
        .collect();
    if !left.is_empty() {
        eprintln!("left by an earlier test, removed: {left:?}");
        let left: Vec<&str> = left.iter().map(String::as_str).collect();
        cleanup(&client, &left).await;
    }
    guard
}

/// The shared cluster, or `None` with a SKIP line where qemu cannot run at all.
fn cluster() -> Option<&'static RealCluster> {
    TIER_START.get_or_init(Instant::now);
    match RealCluster::shared() {
        Ok(c) => Some(c),
        Err(e) if e.starts_with("SKIP") => {
            eprintln!("{e}");
            None
        }
        Err(e) => panic!("real cluster: {e}"),
    }
}

const BUSYBOX: &str = "headroom.local/busybox:1";
/// How long a real pod may take to reach Running. Under emulation a pod
/// sandbox takes tens of seconds to minutes (runc at a few % of a host CPU);
/// eight created at once took 293 s on a busy CI host, and the next eight
/// outlasted 300 s. Waiting costs nothing when the pod starts sooner.
const POD_START: Duration = Duration::from_secs(900);
/// How long a real kubelet may take to apply one resize and report it. Under
/// emulation the container's cgroup has lagged the patch by 44–47 s on an
/// idle host (systemd driver; the agent's verification latency there averaged
/// 33.7 s in the next run); this leaves room for a slower host.
const KUBELET_APPLY: Duration = Duration::from_secs(240);
/// A RuntimeClass on the default runc handler with 50m CPU overhead.
const OVERHEAD_CLASS: &str = "runc-overhead";

async fn ensure_overhead_class(client: &kube::Client) {
    let rc: k8s_openapi::api::node::v1::RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": OVERHEAD_CLASS}, "handler": "runc",
        "overhead": {"podFixed": {"cpu": "50m", "memory": "16Mi"}}
    }))
    .expect("runtimeclass json");
    let api: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(client.clone());
    match api.create(&PostParams::default(), &rc).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create RuntimeClass: {e}"),
    }
}

fn container(name: &str, requests: Value, limits: Value) -> Value {
    json!({"name": name, "image": BUSYBOX, "imagePullPolicy": "Never",
           "command": ["/bin/sleep", "3600"],
           "resources": {"requests": requests, "limits": limits}})
}

fn pod(name: &str, node: &str, containers: Vec<Value>) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": false,
                    "containers": containers}})
}

/// A pod of one container "app" with these requests and limits.
fn app_pod(name: &str, node: &str, requests: Value, limits: Value) -> Value {
    pod(name, node, vec![container("app", requests, limits)])
}

/// The pod shapes whose cgroups the kubelet writes differently, with the
/// `cpu.max` quota (µs per 100 ms) expected on the pod and each container.
struct Shape {
    name: &'static str,
    spec: fn(&str, &str) -> Value,
    pod: &'static str,
    /// Where the systemd driver writes the pod cgroup differently (10 ms steps).
    pod_on_systemd: Option<&'static str>,
    containers: &'static [(&'static str, &'static str)],
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "guaranteed",
            spec: |n, node| {
                app_pod(
                    n,
                    node,
                    json!({"cpu": "200m", "memory": "32Mi"}),
                    json!({"cpu": "200m", "memory": "32Mi"}),
                )
            },
            pod: "20000 100000",
            pod_on_systemd: None,
            containers: &[("app", "20000 100000")],
        },
        Shape {
            name: "burstable-limit",
            spec: |n, node| app_pod(n, node, json!({"cpu": "100m"}), json!({"cpu": "300m"})),
            pod: "30000 100000",
            pod_on_systemd: None,
            containers: &[("app", "30000 100000")],
        },
        Shape {
            name: "burstable-no-limit",
            spec: |n, node| app_pod(n, node, json!({"cpu": "100m"}), json!({})),
            pod: "max 100000",
            pod_on_systemd: None,
            containers: &[("app", "max 100000")],
        },
        Shape {
            // One container without a limit: the pod cgroup is unlimited.
            name: "burstable-mixed",
            spec: |n, node| {
                pod(
                    n,
                    node,
                    vec![
                        container("a", json!({"cpu": "100m"}), json!({"cpu": "200m"})),
                        container("b", json!({"cpu": "100m"}), json!({})),
                    ],
                )
            },
            pod: "max 100000",
            pod_on_systemd: None,
            containers: &[("a", "20000 100000"), ("b", "max 100000")],
        },
        Shape {
            // A sidecar (init container, restartPolicy Always) counts towards the
            // pod's quota; an ordinary init container that ran before does not
            // add to it (its limit is below the running sum).
            name: "sidecar-init",
            spec: |n, node| {
                let mut p = app_pod(n, node, json!({"cpu": "100m"}), json!({"cpu": "200m"}));
                let mut init = container("init", json!({"cpu": "50m"}), json!({"cpu": "50m"}));
                init["command"] = json!(["/bin/sh", "-c", "true"]);
                let mut side = container("side", json!({"cpu": "50m"}), json!({"cpu": "100m"}));
                side["restartPolicy"] = json!("Always");
                p["spec"]["initContainers"] = json!([init, side]);
                p
            },
            pod: "30000 100000",
            pod_on_systemd: None,
            containers: &[("app", "20000 100000"), ("side", "10000 100000")],
        },
        Shape {
            // Not a multiple of 10m: the systemd driver rounds CPUQuotaPerSecUSec up
            // to 10 ms when it sets the unit property; what the file holds after the
            // runtime's direct write is what matters.
            name: "odd-limit",
            spec: |n, node| app_pod(n, node, json!({"cpu": "10m"}), json!({"cpu": "15m"})),
            pod: "1500 100000",
            pod_on_systemd: Some("2000 100000"),
            containers: &[("app", "1500 100000")],
        },
        Shape {
            // RuntimeClass overhead (50m) is added to the pod cgroup only.
            name: "runtimeclass-overhead",
            spec: |n, node| {
                let mut p = app_pod(n, node, json!({"cpu": "100m"}), json!({"cpu": "200m"}));
                p["spec"]["runtimeClassName"] = json!(OVERHEAD_CLASS);
                p
            },
            pod: "25000 100000",
            pod_on_systemd: None,
            containers: &[("app", "20000 100000")],
        },
        Shape {
            // Pod-level resources: the container without a limit follows the pod's.
            name: "pod-level",
            spec: |n, node| {
                let mut p = app_pod(n, node, json!({"cpu": "100m"}), json!({}));
                p["spec"]["resources"] = json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                                                 "limits": {"cpu": "500m", "memory": "128Mi"}});
                p
            },
            pod: "50000 100000",
            pod_on_systemd: None,
            containers: &[("app", "50000 100000")],
        },
    ]
}

/// Deletes namespaces and waits until their pods are gone from the nodes, so
/// the next test's pods fit in the nodes' 2 CPUs of requests.
async fn cleanup(client: &kube::Client, namespaces: &[&str]) {
    use kube::api::{DeleteParams, ListParams};
    // Pods go first, with grace 0: a namespace deletion waits for the
    // namespace controller and then for each kubelet to confirm, which under
    // emulation with busy loops running took over 3 minutes. A real kubelet
    // kills the containers of a pod gone from the API on its next sync; a
    // stopped simulated kubelet never would confirm at all.
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let _ = pods.delete_collection(&force, &ListParams::default()).await;
    }
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let _ = nss.delete(ns, &DeleteParams::default()).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        while pods
            .list(&ListParams::default())
            .await
            .map(|l| !l.items.is_empty())
            .unwrap_or(false)
        {
            if Instant::now() > deadline {
                eprintln!("cleanup: pods of {ns} still there after 60 s");
                return;
            }
            let _ = pods.delete_collection(&force, &ListParams::default()).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn create(api: &Api<Pod>, spec: Value) -> Pod {
    let p: Pod = serde_json::from_value(spec).expect("pod json");
    api.create(&PostParams::default(), &p)
        .await
        .expect("create pod")
}

/// How long a pod's node may be not Ready (its Lease lapsed: the kubelet or
/// the whole VM stopped answering) before a wait gives up on it. The node
/// lifecycle controller marks a node Unknown 40 s after its last renewal; the
/// rest is room for an emulated kubelet that renews late.
const NODE_LOST: Duration = Duration::from_secs(120);

/// Waits for pod `name` to run. Fails early, with the node's diagnosis, when
/// the pod is deleted meanwhile (taint eviction from a lost node) or its node
/// stays not Ready for `NODE_LOST`: a node that stopped answering must not
/// hold the tier for the whole `timeout`.
async fn wait_running(api: &Api<Pod>, name: &str, timeout: Duration) -> Pod {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(api.clone().into_client());
    let start = Instant::now();
    let mut not_ready_since: Option<Instant> = None;
    let diag = |node: &str| {
        testkit::node_vm::health::diagnose_node(node)
            .unwrap_or_else(|| format!("(node {node} is not a VM of this process)"))
    };
    loop {
        let pod = match api.get_opt(name).await {
            Ok(Some(p)) => p,
            Ok(None) => {
                panic!("{name} was deleted while waiting for it to run (evicted from a lost node?)")
            }
            Err(e) if start.elapsed() < timeout => {
                eprintln!("get {name}: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(3)).await;
                continue;
            }
            Err(e) => panic!("{name}: {e} after {timeout:?}"),
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if phase == Some("Running") {
            return pod;
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if let Some(node) = &node {
            let ready = nodes.get_opt(node).await.ok().flatten().is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            match (ready, not_ready_since) {
                (true, _) => not_ready_since = None,
                (false, None) => not_ready_since = Some(Instant::now()),
                (false, Some(t)) if t.elapsed() > NODE_LOST => panic!(
                    "{name} not Running: its node {node} has not been Ready for {:?}; status: {:?}\n{}",
                    t.elapsed(),
                    pod.status,
                    diag(node)
                ),
                _ => {}
            }
        }
        if start.elapsed() > timeout {
            panic!(
                "{name} not Running after {timeout:?}; status: {:?}\n{}",
                pod.status,
                node.as_deref().map(diag).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// The layout of the simulated node that mirrors a real one.
fn sim_layout(node: &NodeVm) -> SimLayout {
    match node.spec.driver {
        testkit::node_vm::CgroupDriver::Systemd => SimLayout::Kind,
        testkit::node_vm::CgroupDriver::Cgroupfs => SimLayout::Cgroupfs,
    }
}

/// A simulated node `name` of `node`'s layout and 2 CPUs, admissible.
async fn parity_sim(
    c: &RealCluster,
    client: &kube::Client,
    name: &str,
    root: std::path::PathBuf,
    node: &NodeVm,
) -> SimKubelet {
    parity_sim_with(c, client, name, root, node, vec![]).await
}

/// [`parity_sim`] running `static_pods` from its staticPodPath.
async fn parity_sim_with(
    c: &RealCluster,
    client: &kube::Client,
    name: &str,
    root: std::path::PathBuf,
    node: &NodeVm,
    static_pods: Vec<StaticPod>,
) -> SimKubelet {
    let mut cfg = SimConfig::new(name, root);
    cfg.layout = sim_layout(node);
    cfg.allocatable_cpu_m = 2000;
    cfg.static_pods = static_pods;
    let sim = SimKubelet::start(client.clone(), cfg)
        .await
        .expect("sim starts");
    c.cp.wait_node_admissible(name)
        .await
        .expect("sim node admissible");
    sim
}

/// Stops a parity simulator and deletes its Node: a simulated node left
/// registered keeps what is scheduled to it (a DaemonSet's pod) Pending
/// for ever, and a later uninstall then waited 180 s for pods no kubelet
/// would ever end (tier 2, 2026-12-07: 4 such agent pods, the restart test
/// 475 s).
async fn retire_sim(client: &kube::Client, sim: SimKubelet) {
    let name = sim.config().node_name.clone();
    sim.stop().await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    if let Err(e) = nodes.delete(&name, &Default::default()).await {
        eprintln!("WARN: deleting the simulated node {name}: {e}");
    }
}

/// What the simulator wrote for a pod, in the same shape as the real read.
fn sim_cpu_max(sim: &SimKubelet, ns: &str, pod: &Pod, containers: &[&str]) -> PodCpuMax {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let read = |p: Option<std::path::PathBuf>| {
        p.and_then(|p| std::fs::read_to_string(p.join("cpu.max")).ok())
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "<none>".into())
    };
    PodCpuMax {
        pod: read(sim.pod_cgroup_path(ns, name)),
        containers: containers
            .iter()
            .map(|c| (c.to_string(), read(sim.container_cgroup_path(ns, name, c))))
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_ready_with_both_cgroup_layouts_and_their_suites_kernels() {
    let Some(c) = cluster() else { return };
    let _serial = serial(c).await;
    let client = c.cp.client().await;
    for node in &c.nodes {
        let kubepods = node.spec.kubepods_path();
        let out = node
            .sh(&format!(
                "cat {kubepods}/cpu.max {kubepods}/cgroup.subtree_control; \
                          test -f {kubepods}/cpu.pressure && echo psi"
            ))
            .await
            .expect("read kubepods");
        let lines: Vec<&str> = out.lines().collect();
        // The kubelet sets no quota on kubepods; pods get the cpu controller; PSI is on.
        assert_eq!(lines[0], "max 100000", "{}: {out}", node.name());
        assert!(
            lines[1].split(' ').any(|c| c == "cpu"),
            "{}: {out}",
            node.name()
        );
        assert_eq!(lines.last(), Some(&"psi"), "{}: {out}", node.name());
        let n: k8s_openapi::api::core::v1::Node = Api::all(client.clone())
            .get(node.name())
            .await
            .expect("node");
        let alloc = n
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .expect("allocatable");
        assert_eq!(
            alloc.get("cpu").map(|q| q.0.as_str()),
            Some("2"),
            "{}",
            node.name()
        );
    }
    // Each node boots the suite its spec names: the kernel says which.
    for node in &c.nodes {
        let v = node.versions().await.expect("versions");
        eprintln!(
            "MEASURE versions {} ({}, {} driver): {v}",
            node.name(),
            node.spec.suite.as_str(),
            node.spec.driver.as_str()
        );
        let want = match node.spec.suite {
            testkit::node_vm::Suite::Bookworm => "6.1.",
            testkit::node_vm::Suite::Trixie => "6.12.",
        };
        assert!(
            v.kernel.starts_with(want),
            "{}: {} node runs Linux {}",
            node.name(),
            node.spec.suite.as_str(),
            v.kernel
        );
    }
    // The diagnosis a lost node prints asks qemu itself: here, running.
    for node in &c.nodes {
        let d = node.diagnose();
        assert!(
            d.contains(&format!("node {}: vCPUs running", node.name())),
            "{d}"
        );
        let named = testkit::node_vm::health::diagnose_node(node.name()).expect("registered");
        assert!(named.contains("vCPUs running"), "{named}");
    }
    for (name, ssh, ready) in &c.boot_times {
        eprintln!(
            "MEASURE boot {name}: ssh {:.1}s, Ready {:.1}s",
            ssh.as_secs_f64(),
            ready.as_secs_f64()
        );
    }
}

/// `metadata.name` of the static pod the cpu.max parity test runs.
const STATIC_PROBE: &str = "static-probe";

/// A small static pod manifest in namespace `ns` (pause, 10m request).
fn static_probe(ns: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": STATIC_PROBE, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "headroom.local/pause:1",
            "imagePullPolicy": "Never",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}})
}

/// Puts `manifest` in `node`'s staticPodPath (written aside, then renamed:
/// the kubelet skips dot files and never reads half a manifest).
async fn put_static_manifest(node: &NodeVm, manifest: &Value) {
    let dir = testkit::node_vm::config::STATIC_POD_PATH;
    node.sh(&format!(
        "echo '{manifest}' > {dir}/.{STATIC_PROBE}.json && mv {dir}/.{STATIC_PROBE}.json {dir}/{STATIC_PROBE}.json"
    ))
    .await
    .expect("write static pod manifest");
}

/// `path` with the config hash spelled `<hash>`, relative to `root`.
fn hash_blind(path: &str, root: &str, hash: &str) -> String {
    path.trim_start_matches(root)
        .trim_start_matches('/')
        .replace(hash, "<hash>")
}

/// docs/kubelet-behaviour.md "Static pods" on a real kubelet, and the
/// simulator's static pod beside it: the mirror pod carries the config hash
/// (`kubernetes.io/config.mirror` = `config.hash`, 32 hex digits) and
/// another uid, is owned by the Node, and the pod's cgroup is `pod<hash>`
/// (none is named after the mirror's uid). Returns what differs.
async fn static_pod_facts(api: &Api<Pod>, node: &NodeVm, sim: &SimKubelet) -> Vec<String> {
    let mut bad = Vec::new();
    let n = node.name();
    let name = format!("{STATIC_PROBE}-{}", n.to_lowercase());
    let real = wait_running(api, &name, POD_START).await;
    let ann = real.metadata.annotations.clone().unwrap_or_default();
    let hash = ann
        .get("kubernetes.io/config.mirror")
        .cloned()
        .unwrap_or_default();
    let uid = real.metadata.uid.clone().unwrap_or_default();
    let owner = real.metadata.owner_references.clone().unwrap_or_default();
    let node_uid = Api::<k8s_openapi::api::core::v1::Node>::all(api.clone().into_client())
        .get(n)
        .await
        .ok()
        .and_then(|n| n.metadata.uid);
    let dir = node.pod_cgroup(&hash).await;
    let by_uid = node.pod_cgroup(&uid).await;
    eprintln!(
        "MEASURE static pod {n}: mirror {name} uid {uid}, config.mirror {hash:?}, \
         config.hash {:?}, config.source {:?}, owner {:?}, cgroup {:?}, cgroup by mirror uid {:?}",
        ann.get("kubernetes.io/config.hash"),
        ann.get("kubernetes.io/config.source"),
        owner
            .iter()
            .map(|o| format!(
                "{}/{} uid {} controller {:?}",
                o.kind, o.name, o.uid, o.controller
            ))
            .collect::<Vec<_>>(),
        dir.as_ref().map_err(|e| format!("{e:#}")),
        by_uid.as_ref().map_err(|e| format!("{e:#}")),
    );
    let hex32 = |h: &str| h.len() == 32 && h.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
    if !hex32(&hash) {
        bad.push(format!(
            "{n}: config.mirror {hash:?} is not 32 lowercase hex digits"
        ));
    }
    if ann.get("kubernetes.io/config.hash") != Some(&hash) {
        bad.push(format!(
            "{n}: config.hash differs from config.mirror: {ann:?}"
        ));
    }
    if ann.get("kubernetes.io/config.source").map(String::as_str) != Some("file") {
        bad.push(format!("{n}: config.source is not file: {ann:?}"));
    }
    if uid == hash || uid.is_empty() {
        bad.push(format!("{n}: mirror uid {uid:?} is the hash"));
    }
    let owned = owner.len() == 1
        && owner[0].kind == "Node"
        && owner[0].name == n
        && Some(&owner[0].uid) == node_uid.as_ref()
        && owner[0].controller == Some(true);
    if !owned {
        bad.push(format!(
            "{n}: mirror owner {owner:?}, node uid {node_uid:?}"
        ));
    }
    let real_dir = match &dir {
        Ok(d) => d.clone(),
        Err(e) => {
            bad.push(format!("{n}: no cgroup pod<config hash>: {e:#}"));
            String::new()
        }
    };
    if by_uid.is_ok() {
        bad.push(format!(
            "{n}: a cgroup is named after the mirror uid: {by_uid:?}"
        ));
    }
    // The simulator's static pod of the same manifest: the same names.
    let sim_name = sim.static_pod_name(STATIC_PROBE);
    let ns = real.metadata.namespace.clone().unwrap_or_default();
    let simmed = wait_running(api, &sim_name, Duration::from_secs(60)).await;
    let sim_ann = simmed.metadata.annotations.clone().unwrap_or_default();
    let sim_hash = sim.config_hash(&ns, &sim_name).unwrap_or_default();
    let keys = |a: &std::collections::BTreeMap<String, String>| -> Vec<String> {
        a.keys()
            .filter(|k| k.starts_with("kubernetes.io/config."))
            .cloned()
            .collect()
    };
    if keys(&ann) != keys(&sim_ann) {
        bad.push(format!(
            "{n}: PARITY mirror annotations: real {:?}, simulator {:?}",
            keys(&ann),
            keys(&sim_ann)
        ));
    }
    if !hex32(&sim_hash) || sim_ann.get("kubernetes.io/config.mirror") != Some(&sim_hash) {
        bad.push(format!(
            "{n}: PARITY simulator hash {sim_hash:?}: {sim_ann:?}"
        ));
    }
    if simmed.metadata.uid.as_deref() == Some(sim_hash.as_str()) {
        bad.push(format!("{n}: PARITY simulator mirror uid is the hash"));
    }
    let sim_dir = sim
        .pod_cgroup_path(&ns, &sim_name)
        .map(|p| p.to_string_lossy().to_string())
        .unwrap_or_default();
    let sim_root = sim.config().cgroup_root.to_string_lossy().to_string();
    let (r, s) = (
        hash_blind(&real_dir, "/sys/fs/cgroup", &hash),
        hash_blind(&sim_dir, &sim_root, &sim_hash),
    );
    eprintln!("MEASURE static pod {n}: cgroup real {r}, simulator {s}");
    if r != s {
        bad.push(format!(
            "{n}: PARITY static pod cgroup: real {r}, simulator {s}"
        ));
    }
    bad
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_cpu_max_matches_the_documented_rules_and_the_simulator() {
    let Some(c) = cluster() else { return };
    let _serial = serial(c).await;
    let client = c.cp.client().await;
    let ns = c.cp.namespace("truth").await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    ensure_overhead_class(&client).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut failures = Vec::new();
    // Every node's pods are created before any is waited for: the VMs start
    // their pods side by side (pod start under emulation takes minutes).
    let mut sims = Vec::new();
    let started = Instant::now();
    // And a static pod on each node (and its simulator), started with them.
    let probe = static_probe(&ns);
    for node in &c.nodes {
        put_static_manifest(node, &probe).await;
    }
    for (i, node) in c.nodes.iter().enumerate() {
        let sim_name = format!("sim-{}", node.name());
        let root = dir.path().join(format!("cg{i}"));
        let statics = vec![StaticPod::new(probe.clone())];
        let sim = parity_sim_with(c, &client, &sim_name, root, node, statics).await;
        for s in shapes() {
            create(&api, (s.spec)(&format!("{}-{i}", s.name), node.name())).await;
            create(&api, (s.spec)(&format!("sim-{}-{i}", s.name), &sim_name)).await;
        }
        sims.push(sim);
    }
    for ((i, node), sim) in c.nodes.iter().enumerate().zip(&sims) {
        for s in shapes() {
            let real = wait_running(&api, &format!("{}-{i}", s.name), POD_START).await;
            let sim_pod = wait_running(
                &api,
                &format!("sim-{}-{i}", s.name),
                Duration::from_secs(60),
            )
            .await;
            let got = node.pod_cpu_max(&real).await.expect("read real cgroups");
            let names: Vec<&str> = s.containers.iter().map(|(n, _)| *n).collect();
            let systemd = node.spec.driver == testkit::node_vm::CgroupDriver::Systemd;
            let want = PodCpuMax {
                pod: s
                    .pod_on_systemd
                    .filter(|_| systemd)
                    .unwrap_or(s.pod)
                    .to_string(),
                containers: s
                    .containers
                    .iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            };
            let real_named = PodCpuMax {
                pod: got.pod.clone(),
                containers: got
                    .containers
                    .iter()
                    .filter(|(k, _)| names.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            };
            if real_named != want {
                failures.push(format!(
                    "{} {}: real kubelet wrote {got:?}, documented {want:?}",
                    node.name(),
                    s.name
                ));
            }
            let simulated = sim_cpu_max(sim, &ns, &sim_pod, &names);
            if simulated != real_named {
                failures.push(format!(
                    "{} {}: PARITY simulator {simulated:?} vs real {real_named:?}",
                    node.name(),
                    s.name
                ));
            }
        }
        eprintln!(
            "MEASURE {}: {} pods Running in {:.1}s (both nodes' pods created together)",
            node.name(),
            shapes().len(),
            started.elapsed().as_secs_f64()
        );
        let t = Instant::now();
        failures.extend(static_pod_facts(&api, node, sim).await);
        eprintln!(
            "MEASURE {}: static pod checked in {:.1}s more",
            node.name(),
            t.elapsed().as_secs_f64()
        );
    }
    for sim in sims {
        retire_sim(&client, sim).await;
    }
    for node in &c.nodes {
        node.sh(&format!(
            "rm -f {}/{STATIC_PROBE}.json",
            testkit::node_vm::config::STATIC_POD_PATH
        ))
        .await
        .expect("remove static pod manifest");
    }
    cleanup(&client, &[ns.as_str()]).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One observable step of a resize, as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ResizeStep {
    generation_observed: bool,
    in_progress: bool,
    pending: bool,
    status_limit_m: Option<u64>,
}

fn resize_step(p: &Pod) -> ResizeStep {
    let generation = p.metadata.generation.unwrap_or(0);
    let st = p.status.as_ref();
    let conds = st.and_then(|s| s.conditions.clone()).unwrap_or_default();
    let has = |t: &str| conds.iter().any(|c| c.type_ == t && c.status == "True");
    let status_limit_m = st
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == "app"))
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| millis(r.limits.as_ref().and_then(|l| l.get("cpu"))));
    ResizeStep {
        generation_observed: st.and_then(|s| s.observed_generation).unwrap_or(0) >= generation,
        in_progress: has("PodResizeInProgress"),
        pending: has("PodResizePending"),
        status_limit_m,
    }
}

/// Watches `name` from just before a resize to its end; returns the distinct
/// steps in order, and when status first showed `want_m`.
async fn resize_timeline(
    api: &Api<Pod>,
    name: &str,
    want_m: u64,
    patch: impl std::future::Future<Output = Instant>,
) -> (Vec<ResizeStep>, Instant, Instant) {
    use futures::StreamExt;
    let stream = kube::runtime::watcher(
        api.clone(),
        kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}")),
    );
    let steps = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Instant, ResizeStep)>::new()));
    let s2 = steps.clone();
    let watch = tokio::spawn(async move {
        let mut stream = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(stream));
        while let Some(Ok(p)) = stream.next().await {
            s2.lock().unwrap().push((Instant::now(), resize_step(&p)));
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let patched_at = patch.await;
    let deadline = Instant::now() + KUBELET_APPLY;
    let status_at = loop {
        let seen = steps.lock().unwrap().clone();
        if let Some((t, _)) = seen.iter().find(|(t, s)| {
            *t >= patched_at
                && s.status_limit_m == Some(want_m)
                && !s.in_progress
                && s.generation_observed
        }) {
            break *t;
        }
        assert!(
            Instant::now() < deadline,
            "resize of {name} never completed: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();
    let mut out: Vec<ResizeStep> = Vec::new();
    let first_after = steps
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _)| *t < patched_at)
        .count();
    for (_, s) in steps
        .lock()
        .unwrap()
        .iter()
        .skip(first_after.saturating_sub(1))
    {
        if out.last() != Some(s) {
            out.push(s.clone());
        }
    }
    (out, patched_at, status_at)
}

fn limit_patch(m: u64) -> Patch<Value> {
    Patch::Strategic(
        json!({"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": format!("{m}m")}}}]}}),
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_sequence_on_a_real_kubelet_matches_the_simulator() {
    let Some(c) = cluster() else { return };
    let _serial = serial(c).await;
    let client = c.cp.client().await;
    let ns = c.cp.namespace("resize").await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let dir = tempfile::tempdir().expect("tempdir");
    let rounds: usize = std::env::var("HEADROOM_REAL_RESIZE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let mut failures = Vec::new();
    for (i, node) in c.nodes.iter().enumerate() {
        let sim_name = format!("simr-{}", node.name());
        let root = dir.path().join(format!("cg{i}"));
        let sim = parity_sim(c, &client, &sim_name, root, node).await;
        let spec = |n: &str, nd: &str| app_pod(n, nd, json!({"cpu": "2m"}), json!({"cpu": "300m"}));
        let real_name = format!("rs-{i}");
        let sim_pod_name = format!("sim-rs-{i}");
        create(&api, spec(&real_name, node.name())).await;
        create(&api, spec(&sim_pod_name, &sim_name)).await;
        let mut real = wait_running(&api, &real_name, POD_START).await;
        wait_running(&api, &sim_pod_name, Duration::from_secs(60)).await;
        // Wait for the kubelet to report the container's resources before resizing.
        for _ in 0..60 {
            if resize_step(&real).status_limit_m.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            real = api.get(&real_name).await.expect("get");
        }

        let mut to_cgroup = Vec::new();
        let mut to_status = Vec::new();
        for round in 0..rounds {
            let want_m = if round % 2 == 0 { 250 } else { 300 };
            let quota = format!("{} 100000", want_m * 100);
            let pod_now = api.get(&real_name).await.expect("get");
            let patch = limit_patch(want_m);
            let (steps, patched_at, status_at) = resize_timeline(&api, &real_name, want_m, async {
                let t = Instant::now();
                let (patched, cg) = tokio::join!(
                    resize(&api, &real_name, &patch, false),
                    node.wait_cpu_max(&pod_now, "app", &quota, Duration::from_secs(60)),
                );
                patched.expect("resize admitted");
                let cg = cg.expect("cpu.max changes");
                to_cgroup.push(cg.duration_since(t).as_secs_f64());
                t
            })
            .await;
            to_status.push(status_at.duration_since(patched_at).as_secs_f64());
            let (sim_steps, _, _) = resize_timeline(&api, &sim_pod_name, want_m, async {
                let t = Instant::now();
                resize(&api, &sim_pod_name, &patch, false)
                    .await
                    .expect("sim resize");
                t
            })
            .await;
            if round == 0 {
                eprintln!(
                    "{}: real steps {steps:#?}\nsim steps {sim_steps:#?}",
                    node.name()
                );
            }
            if steps != sim_steps {
                failures.push(format!(
                    "{} round {round}: PARITY real {steps:?} vs sim {sim_steps:?}",
                    node.name()
                ));
            }
        }
        // 5m → 500 µs, raised to the 1000 µs minimum. Created at 300m and
        // resized: a container started under a 1 % quota takes minutes to
        // start under emulation.
        let tiny = limit_patch(5);
        resize(&api, &real_name, &tiny, false)
            .await
            .expect("resize to 5m");
        resize(&api, &sim_pod_name, &tiny, false)
            .await
            .expect("sim resize to 5m");
        let pod_now = api.get(&real_name).await.expect("get");
        node.wait_cpu_max(&pod_now, "app", "1000 100000", KUBELET_APPLY)
            .await
            .expect("5m limit enforced as 1000 µs");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let real_files = node
            .pod_cpu_max(&api.get(&real_name).await.expect("get"))
            .await
            .expect("read");
        let sim_pod = api.get(&sim_pod_name).await.expect("get");
        let sim_files = sim_cpu_max(&sim, &ns, &sim_pod, &["app"]);
        assert_eq!(
            real_files.pod,
            "1000 100000",
            "{}: pod cgroup at 5m",
            node.name()
        );
        if sim_files.pod != real_files.pod
            || sim_files.containers.get("app") != real_files.containers.get("app")
        {
            failures.push(format!(
                "{} 5m: PARITY sim {sim_files:?} vs real {real_files:?}",
                node.name()
            ));
        }
        // Which the test saw first, per round. Not asserted: the cgroup time
        // is when an ssh session that polled it in the guest returned, which
        // adds up to a second under emulation, so the order seen from the
        // host is only a measurement (the kubelet reports what the runtime
        // applied, so the write comes first).
        let cgroup_first = to_cgroup
            .iter()
            .zip(&to_status)
            .filter(|(cg, st)| cg <= st)
            .count();
        to_cgroup.sort_by(f64::total_cmp);
        to_status.sort_by(f64::total_cmp);
        eprintln!(
            "MEASURE {} resize PATCH→cpu.max n={} p50 {:.2}s p95 {:.2}s; PATCH→status p50 {:.2}s p95 {:.2}s; cpu.max seen first in {cgroup_first} of {} rounds",
            node.name(),
            to_cgroup.len(),
            percentile(&to_cgroup, 0.5),
            percentile(&to_cgroup, 0.95),
            percentile(&to_status, 0.5),
            percentile(&to_status, 0.95),
            to_cgroup.len(),
        );
        retire_sim(&client, sim).await;
    }
    cleanup(&client, &[ns.as_str()]).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// The agent as a process inside each node VM, reading the real cgroupfs.

use testkit::agent::metric;
use testkit::node_vm::{GuestAgent, static_agent_binary};

/// The static agent, copied into every node's share.
fn install_agents(c: &RealCluster) {
    let bin = static_agent_binary().expect("static agent");
    for node in &c.nodes {
        node.install_agent(&bin).expect("install agent");
    }
}

/// Under the one lock, with the agent installed in every node: runs
/// `scenario` on all nodes side by side.
async fn on_every_node_with_agents<F, Fut>(scenario: F)
where
    F: Fn(&'static RealCluster, &'static NodeVm) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(c) = cluster() else { return };
    let _serial = serial(c).await;
    install_agents(c);
    futures::future::join_all(c.nodes.iter().map(|n| scenario(c, n))).await;
}

/// An idle Guaranteed pod (100m), which the agent must leave alone.
fn guaranteed_idle(node: &str) -> Value {
    app_pod(
        "guaranteed",
        node,
        json!({"cpu": "100m", "memory": "32Mi"}),
        json!({"cpu": "100m", "memory": "32Mi"}),
    )
}

/// Agent settings for the emulated nodes: a 1 s tick, short cooldown and
/// audit so a scenario fits in minutes.
fn vm_agent_args() -> Vec<String> {
    vm_agent_args_with_grace(RESIZE_GRACE)
}

/// How long the agent waits for a resize to reach cpu.max before counting it
/// unverified: [`KUBELET_APPLY`]'s 44–47 s on an idle host with room for a
/// slower one (shorter than it, so a lost resize still shows within a test).
const RESIZE_GRACE: Duration = Duration::from_secs(180);

fn vm_agent_args_with_grace(grace: Duration) -> Vec<String> {
    let grace = format!("{}s", grace.as_secs());
    [
        "--tick",
        "1s",
        "--raise-cooldown",
        "5s",
        "--audit-interval",
        "5s",
        "--drift-grace",
        grace.as_str(),
        "--event-interval",
        "5s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A pod of `threads` busy loops that ends on SIGTERM, as a well-behaved
/// app does: a shell that is its namespace's init ignores a signal it has
/// no handler for, and each such pod held a node's `systemctl reboot` for
/// systemd's 90 s stop timeout.
fn burner(name: &str, node: &str, req: &str, lim: &str, threads: u32) -> Value {
    let loops = vec!["while :; do :; done"; threads as usize].join(" & ");
    let mut c = container("app", json!({"cpu": req}), json!({"cpu": lim}));
    c["command"] = json!(["/bin/sh", "-c", format!("trap 'exit 0' TERM; {loops}")]);
    pod(name, node, vec![c])
}

fn restart_count(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0)
}

fn app_limit_m(p: &Pod) -> Option<u64> {
    testkit::scenario::pod::cpu_limit_m(p, "app")
}

async fn opt_in(client: &kube::Client, ns: &str) {
    testkit::workload::opt_in(client, ns)
        .await
        .expect("label namespace");
}

/// Polls `name` until `f` holds; panics with the agent's log after `timeout`.
async fn wait_pod(
    api: &Api<Pod>,
    agent: &GuestAgent<'_>,
    name: &str,
    what: &str,
    timeout: Duration,
    f: impl Fn(&Pod) -> bool,
) -> Pod {
    let deadline = Instant::now() + timeout;
    loop {
        let p = api.get(name).await.expect("get pod");
        if f(&p) {
            return p;
        }
        if Instant::now() > deadline {
            panic!(
                "{}: {name}: {what} not reached in {timeout:?}; limit {:?}; agent log:\n{}",
                agent.node.name(),
                app_limit_m(&p),
                agent.log_tail(60).await
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Waits up to 2 min until container "app" of `name` is raised above 300m.
async fn wait_raised_above_300m(api: &Api<Pod>, agent: &GuestAgent<'_>, name: &str) -> Pod {
    wait_pod(
        api,
        agent,
        name,
        "raise above 300m",
        Duration::from_secs(120),
        |p| app_limit_m(p).is_some_and(|m| m > 300),
    )
    .await
}

/// Scrapes `agent`, asking again every 2 s for up to 90 s while the scrape
/// itself fails: a DaemonSet agent is scraped through the apiserver's pod
/// proxy, a new ssh tunnel into the guest each time, which an emulated
/// guest busy with a kubelet and an agent restarting left unanswered for
/// the proxy's 30 s once (cold CI 5): three tries. Each failure is printed;
/// the last one is returned after 90 s of them.
async fn try_scrape(agent: &GuestAgent<'_>) -> anyhow::Result<prometheus_parse::Scrape> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match agent.scrape().await {
            Err(e) if Instant::now() < deadline => {
                eprintln!("SCRAPE {}: failed, asking again: {e:#}", agent.node.name());
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            done => return done,
        }
    }
}

/// [`try_scrape`], failing the test with the agent's log after 90 s.
async fn scrape(agent: &GuestAgent<'_>) -> prometheus_parse::Scrape {
    match try_scrape(agent).await {
        Ok(s) => s,
        Err(e) => panic!(
            "{}: no scrape for 90 s: {e:#}\n{}",
            agent.node.name(),
            agent.log_tail(40).await
        ),
    }
}

/// Scrapes `agent` every 2 s until `done` holds; after `bound`, panics with
/// `failure` and the agent's log. Its own loop rather than `wait_until`
/// (which would ask every second): each scrape costs the emulated guest CPU
/// the agent under test competes for, and the failure needs the log fetched
/// asynchronously.
async fn wait_scrape(
    agent: &GuestAgent<'_>,
    bound: Duration,
    failure: &str,
    done: impl Fn(&prometheus_parse::Scrape) -> bool,
) -> prometheus_parse::Scrape {
    let deadline = Instant::now() + bound;
    loop {
        let s = scrape(agent).await;
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{}: {failure}:\n{}",
            agent.node.name(),
            agent.log_tail(60).await
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Idle node: a managed pod throttled at its own limit is raised, the raise
/// reaches cpu.max and is verified; pods that must be left alone are.
async fn idle_raise_on(c: &RealCluster, node: &NodeVm) {
    let client = c.cp.client().await;
    let ns = c.cp.namespace(&format!("idle-{}", node.name())).await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&api, burner("burner", node.name(), "200m", "300m", 1)).await;
    // Left alone: Guaranteed, opted out, RestartContainer policy.
    create(&api, guaranteed_idle(node.name())).await;
    let mut out = app_pod(
        "opted-out",
        node.name(),
        json!({"cpu": "100m"}),
        json!({"cpu": "200m"}),
    );
    out["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    create(&api, out).await;
    let mut restart = app_pod(
        "restart-policy",
        node.name(),
        json!({"cpu": "100m"}),
        json!({"cpu": "200m"}),
    );
    restart["spec"]["containers"][0]["resizePolicy"] =
        json!([{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]);
    create(&api, restart).await;
    // Pod-level resources: managed through spec.resources.limits.cpu only.
    let mut pl = app_pod("pod-level", node.name(), json!({"cpu": "200m"}), json!({}));
    pl["spec"]["resources"] = json!({"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "300m", "memory": "128Mi"}});
    create(&api, pl).await;
    for n in [
        "burner",
        "guaranteed",
        "opted-out",
        "restart-policy",
        "pod-level",
    ] {
        wait_running(&api, n, POD_START).await;
    }

    let mut restarts_before = Vec::new();
    for n in ["guaranteed", "opted-out", "restart-policy"] {
        restarts_before.push((n, restart_count(&api.get(n).await.expect("get"))));
    }
    let agent = GuestAgent::start(node, &vm_agent_args())
        .await
        .expect("agent starts");
    let raised = wait_raised_above_300m(&api, &agent, "burner").await;
    let limit = app_limit_m(&raised).expect("limit");
    node.wait_cpu_max(
        &raised,
        "app",
        &format!("{} 100000", limit * 100),
        KUBELET_APPLY,
    )
    .await
    .expect("raise reaches the container's cpu.max");
    let pl = wait_pod(
        &api,
        &agent,
        "pod-level",
        "pod-level raise above 300m",
        Duration::from_secs(120),
        |p| pod_limit_m(p).is_some_and(|m| m > 300),
    )
    .await;
    let pl_limit = pod_limit_m(&pl).expect("pod-level limit");
    // Verified by the agent itself (re-read of the real cgroups): both
    // resizes within their grace, counted from the later patch.
    let s = wait_scrape(
        &agent,
        RESIZE_GRACE + Duration::from_secs(30),
        "resizes never verified",
        |s| metric(s, "headroom_resizes_total", &[("result", "verified")]).unwrap_or(0.0) >= 2.0,
    )
    .await;
    let drift = metric(&s, "headroom_cgroup_drift", &[("namespace", ns.as_str())]).unwrap_or(0.0);
    assert_eq!(drift, 0.0, "{}: drift after verified resizes", node.name());
    let n = metric(
        &s,
        "headroom_resize_verification_latency_seconds_count",
        &[],
    )
    .unwrap_or(0.0);
    let sum = metric(&s, "headroom_resize_verification_latency_seconds_sum", &[]).unwrap_or(0.0);
    eprintln!(
        "MEASURE {} agent verification latency: {n} resizes, mean {:.2}s; buckets: {:?}",
        node.name(),
        sum / n.max(1.0),
        s.samples
            .iter()
            .filter_map(|x| match &x.value {
                prometheus_parse::Value::Histogram(b)
                    if x.metric == "headroom_resize_verification_latency_seconds" =>
                    Some(
                        b.iter()
                            .map(|b| format!("le {}: {}", b.less_than, b.count))
                            .collect::<Vec<_>>()
                    ),
                _ => None,
            })
            .flatten()
            .collect::<Vec<_>>()
    );
    let got = node
        .pod_cpu_max(&api.get("pod-level").await.expect("get"))
        .await
        .expect("read");
    assert_eq!(
        got.pod,
        format!("{} 100000", pl_limit * 100),
        "{}: pod-level cgroup",
        node.name()
    );
    // A container may have restarted before the agent ran (containerd 1.6 under
    // emulation sometimes fails a first start); only restarts while it ran count.
    for (n, before) in &restarts_before {
        let p = api.get(n).await.expect("get");
        assert_eq!(
            p.metadata.generation,
            Some(1),
            "{}: {n} was changed",
            node.name()
        );
        assert_eq!(
            restart_count(&p),
            *before,
            "{}: {n} restarted while the agent ran",
            node.name()
        );
    }
    agent.stop().await.expect("agent stops");
    cleanup(&client, &[ns.as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tier"),
    ignore = "scripts/test --full; in CI the DaemonSet scenario and the restart test raise and verify on idle nodes, tier 1 leaves Guaranteed, opted-out and RestartContainer pods alone on the simulated kubelet, and the cpu.max shape test holds its pod-level shapes to the real kubelet's"
)]
async fn agent_in_the_vm_raises_a_throttled_pod_on_an_idle_node_and_leaves_others_alone() {
    on_every_node_with_agents(idle_raise_on).await;
}

/// Real contention from an unmanaged busy loop on every CPU brings the
/// managed limits down.
async fn contention_on(c: &RealCluster, node: &NodeVm) {
    let client = c.cp.client().await;
    let ns = c.cp.namespace(&format!("busy-{}", node.name())).await;
    let other = c.cp.namespace(&format!("noisy-{}", node.name())).await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let noisy: Api<Pod> = Api::namespaced(client.clone(), &other);
    create(&api, burner("managed", node.name(), "200m", "300m", 1)).await;
    wait_running(&api, "managed", POD_START).await;
    let agent = GuestAgent::start(node, &vm_agent_args())
        .await
        .expect("agent starts");
    let raised = wait_raised_above_300m(&api, &agent, "managed").await;
    let high = app_limit_m(&raised).expect("limit");
    // Unmanaged, unlimited: 3 busy threads on 2 CPUs.
    let mut hog = app_pod("hog", node.name(), json!({"cpu": "100m"}), json!({}));
    hog["spec"]["containers"][0]["command"] = json!([
        "/bin/sh",
        "-c",
        "while :; do :; done & while :; do :; done & while :; do :; done"
    ]);
    let hog_at = Instant::now();
    create(&noisy, hog).await;
    wait_running(&noisy, "hog", POD_START).await;
    let lowered = wait_pod(
        &api,
        &agent,
        "managed",
        "lowering under contention",
        Duration::from_secs(120),
        |p| app_limit_m(p).is_some_and(|m| m < high),
    )
    .await;
    eprintln!(
        "MEASURE {}: contention lowered {high}m → {:?}m {:?} after the hog was created (tick 1 s; includes its start under emulation)",
        node.name(),
        app_limit_m(&lowered),
        hog_at.elapsed()
    );
    let rec = stall_record(node, &lowered, 10).await;
    eprintln!(
        "{} hog=3-threads",
        rec.line(node.name(), app_limit_m(&lowered).unwrap_or(0))
    );
    assert!(
        app_limit_m(&lowered).expect("limit") >= 200,
        "never below the request"
    );
    agent.stop().await.expect("agent stops");
    cleanup(&client, &[ns.as_str(), other.as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tier"),
    ignore = "scripts/test --full; in CI the DaemonSet scenario's busy loops and the attribution test's displaced neighbour lower limits"
)]
async fn agent_in_the_vm_lowers_managed_limits_under_real_contention() {
    on_every_node_with_agents(contention_on).await;
}

/// Raw kubepods stall and a pod's throttling over an interval on a real
/// node: the figures the contention signal is built from.
#[derive(Debug, Clone, Copy)]
struct StallRecord {
    dt_us: u64,
    some_us: u64,
    full_us: u64,
    kubepods_usage_us: u64,
    pod_usage_us: u64,
    pod_throttled_us: u64,
    containers_throttled_us: u64,
}

impl StallRecord {
    fn line(&self, node: &str, limit_m: u64) -> String {
        format!(
            "RAWSTALL node={node} limit_m={limit_m} dt_us={} some_us={} full_us={} kubepods_usage_us={} pod_usage_us={} pod_throttled_us={} containers_throttled_us={}",
            self.dt_us,
            self.some_us,
            self.full_us,
            self.kubepods_usage_us,
            self.pod_usage_us,
            self.pod_throttled_us,
            self.containers_throttled_us
        )
    }
}

/// Reads the counters twice, `secs` apart, in one ssh session.
async fn stall_record(node: &NodeVm, pod: &Pod, secs: u64) -> StallRecord {
    let uid = pod.metadata.uid.as_deref().expect("uid");
    let dir = node.pod_cgroup(uid).await.expect("pod cgroup");
    let kp = node.spec.kubepods_path();
    let snap = format!(
        "echo T $(date +%s%N); \
         awk '{{print \"K\" $1, substr($5, 7)}}' {kp}/cpu.pressure; \
         echo KU $(awk '/^usage_usec/ {{print $2}}' {kp}/cpu.stat); \
         echo PU $(awk '/^usage_usec/ {{print $2}}' {dir}/cpu.stat); \
         echo PT $(awk '/^throttled_usec/ {{print $2}}' {dir}/cpu.stat); \
         for c in {dir}/*/; do [ \"$(cut -d' ' -f1 $c/cpu.max)\" != max ] && \
           echo CT $(awk '/^throttled_usec/ {{print $2}}' $c/cpu.stat); done; true"
    );
    let out = node
        .sh(&format!("{snap}; echo SPLIT; sleep {secs}; {snap}"))
        .await
        .expect("read counters");
    let (a, b) = out.split_once("SPLIT").expect("two snapshots");
    let parse = |text: &str| {
        let mut m = std::collections::BTreeMap::<String, u64>::new();
        for l in text.lines() {
            let mut it = l.split_whitespace();
            let (Some(k), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            *m.entry(k.to_string()).or_default() += v;
        }
        m
    };
    let (a, b) = (parse(a), parse(b));
    let d = |k: &str| {
        b.get(k)
            .copied()
            .unwrap_or(0)
            .saturating_sub(a.get(k).copied().unwrap_or(0))
    };
    StallRecord {
        dt_us: d("T") / 1000,
        some_us: d("Ksome"),
        full_us: d("Kfull"),
        kubepods_usage_us: d("KU"),
        pod_usage_us: d("PU"),
        pod_throttled_us: d("PT"),
        containers_throttled_us: d("CT"),
    }
}

/// The pod throttled at its own limit on an idle node (one single-threaded
/// busy loop, request 200m, limit 300m; a Guaranteed and a BestEffort pod
/// idle): its throttling makes kubepods PSI high, which must not read as
/// contention. Started after the pod has been throttled for a while, as when
/// the agent first lowered it (avg10 then carries the throttling across the
/// raise). Over two minutes (`HEADROOM_REAL_OWN_THROTTLING_S`; the figure
/// in docs/measurements.md is a 300 s run) it is raised to its ceiling, never lowered, in at
/// most 3 patches. Two minutes are twelve avg10 windows after the raise.
async fn own_throttling_on(c: &RealCluster, node: &NodeVm) {
    let client = c.cp.client().await;
    let ns = c.cp.namespace(&format!("own-{}", node.name())).await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&api, burner("burner", node.name(), "200m", "300m", 1)).await;
    create(&api, guaranteed_idle(node.name())).await;
    create(
        &api,
        app_pod("besteffort", node.name(), json!({}), json!({})),
    )
    .await;
    for n in ["burner", "guaranteed", "besteffort"] {
        wait_running(&api, n, POD_START).await;
    }
    let p = api.get("burner").await.expect("get");
    // Throttled for a while before the agent starts: avg10 is high.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let before = stall_record(node, &p, 10).await;
    eprintln!("{}", before.line(node.name(), 300));

    let agent = GuestAgent::start(node, &vm_agent_args())
        .await
        .expect("agent starts");
    let window = Duration::from_secs(
        std::env::var("HEADROOM_REAL_OWN_THROTTLING_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(120),
    );
    let start = Instant::now();
    let mut history: Vec<(u64, u64)> = Vec::new();
    let mut lowered = None;
    while start.elapsed() < window {
        let p = api.get("burner").await.expect("get");
        let m = app_limit_m(&p).expect("limit");
        if let Some(&(_, prev)) = history.last()
            && m < prev
            && lowered.is_none()
        {
            lowered = Some((prev, m, start.elapsed()));
        }
        history.push((start.elapsed().as_secs(), m));
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let p = api.get("burner").await.expect("get");
    let patches = p.metadata.generation.unwrap_or(1) - 1;
    let after = stall_record(node, &p, 10).await;
    let last = app_limit_m(&p).expect("limit");
    eprintln!("{}", after.line(node.name(), last));
    eprintln!(
        "MEASURE {} own throttling: limit over {window:?} (s, m): {history:?}; {patches} patches",
        node.name()
    );
    let log = agent.log_tail(40).await;
    agent.stop().await.expect("agent stops");
    assert!(
        before.some_us * 100 > before.dt_us * 20,
        "{}: the scenario must show real stall to mean anything: {before:?}",
        node.name()
    );
    assert_eq!(
        lowered,
        None,
        "{}: lowered (from m, to m, at) on an idle node; agent log:\n{log}",
        node.name()
    );
    assert_eq!(
        last,
        800,
        "{}: ceiling (4 × 200m) not reached:\n{log}",
        node.name()
    );
    assert!(
        patches <= 3,
        "{}: {patches} patches in the window:\n{log}",
        node.name()
    );
    cleanup(&client, &[ns.as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tier"),
    ignore = "scripts/test --full; in CI the attribution test's phase 3 keeps a throttled pod raised on both kernels"
)]
async fn agent_in_the_vm_keeps_a_pod_throttled_at_its_own_limit_raised_on_an_idle_node() {
    on_every_node_with_agents(own_throttling_on).await;
}

/// Δ counters of one cgroup over an interval: CPU used, own throttling and
/// PSI `some`/`full` (µs; throttled time is summed over CPUs, PSI is wall).
#[derive(Debug, Clone, Copy, Default)]
struct CgDelta {
    usage_us: u64,
    throttled_us: u64,
    some_us: u64,
    full_us: u64,
}

impl CgDelta {
    /// Percent of `dt_us` for each counter, one line.
    fn pct(&self, dt_us: u64) -> String {
        let p = |v: u64| v as f64 * 100.0 / dt_us.max(1) as f64;
        format!(
            "usage {:.1}% throttled {:.1}% some {:.1}% full {:.1}%",
            p(self.usage_us),
            p(self.throttled_us),
            p(self.some_us),
            p(self.full_us)
        )
    }

    /// Displacement (full beyond own throttling) as millicores over `dt_us`.
    fn displaced_m(&self, dt_us: u64) -> u64 {
        self.full_us.saturating_sub(self.throttled_us) * 1000 / dt_us.max(1)
    }
}

/// Reads `cpu.stat` and `cpu.pressure` of each named cgroup (absolute
/// paths) twice, `secs` apart, in one ssh session; the interval in µs and
/// each cgroup's deltas.
///
/// Each snapshot is one `awk` reading every file back to back, clocked by
/// `/proc/uptime` in the same pass. A shell spawning `date` and two `awk`s per
/// cgroup took about 3 s per snapshot under emulation, so a cgroup's counters
/// were read up to seconds away from the timestamp: a pod the agent read at
/// 780m a second came out at 645m, short of its request by more than it was.
async fn cg_deltas(
    node: &NodeVm,
    dirs: &[(&str, &str)],
    secs: u64,
) -> (u64, std::collections::BTreeMap<String, CgDelta>) {
    let files = dirs
        .iter()
        .map(|(_, dir)| format!("{dir}/cpu.stat {dir}/cpu.pressure"))
        .collect::<Vec<_>>()
        .join(" ");
    let snap = format!("awk '{{print FILENAME, $0}}' /proc/uptime {files};");
    let out = node
        .sh(&format!("{snap} echo SPLIT; sleep {secs}; {snap}"))
        .await
        .expect("read counters");
    let (a, b) = out.split_once("SPLIT").expect("two snapshots");
    let (a, b) = (counter_snapshot(a, dirs), counter_snapshot(b, dirs));
    let dt_us = b.0.saturating_sub(a.0);
    let deltas = dirs
        .iter()
        .map(|(name, _)| {
            let (x, y) = (a.1.get(*name), b.1.get(*name));
            let d = |f: fn(&CgDelta) -> u64| y.map_or(0, f).saturating_sub(x.map_or(0, f));
            let delta = CgDelta {
                usage_us: d(|c| c.usage_us),
                throttled_us: d(|c| c.throttled_us),
                some_us: d(|c| c.some_us),
                full_us: d(|c| c.full_us),
            };
            (name.to_string(), delta)
        })
        .collect();
    (dt_us, deltas)
}

/// One snapshot of [`cg_deltas`]' `awk` output (`FILE LINE` per line): the
/// uptime in µs and each named cgroup's cumulative counters.
fn counter_snapshot(
    text: &str,
    dirs: &[(&str, &str)],
) -> (u64, std::collections::BTreeMap<String, CgDelta>) {
    let mut at_us = 0;
    let mut out = std::collections::BTreeMap::<String, CgDelta>::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(file), Some(key), Some(value)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if file == "/proc/uptime" {
            // Seconds with two decimals: rounded to them, read exactly.
            at_us = (key.parse::<f64>().unwrap_or(0.0) * 100.0).round() as u64 * 10_000;
            continue;
        }
        let Some((dir, leaf)) = file.rsplit_once('/') else {
            continue;
        };
        let Some((name, _)) = dirs.iter().find(|(_, d)| *d == dir) else {
            continue;
        };
        let c = out.entry(name.to_string()).or_default();
        let total = || {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix("total="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        match (leaf, key) {
            ("cpu.stat", "usage_usec") => c.usage_us = value.parse().unwrap_or(0),
            ("cpu.stat", "throttled_usec") => c.throttled_us = value.parse().unwrap_or(0),
            ("cpu.pressure", "some") => c.some_us = total(),
            ("cpu.pressure", "full") => c.full_us = total(),
            _ => {}
        }
    }
    (at_us, out)
}

#[test]
fn counter_snapshot_reads_uptime_and_each_named_cgroup() {
    let text = "/proc/uptime 1234.56 2000.00
/k/a/cpu.stat usage_usec 900
/k/a/cpu.stat throttled_usec 40
/k/a/cpu.pressure some avg10=1.00 avg60=0.00 avg300=0.00 total=700
/k/a/cpu.pressure full avg10=0.50 avg60=0.00 avg300=0.00 total=300
/k/b/cpu.stat usage_usec 5
/other/cpu.stat usage_usec 99
";
    let (at, m) = counter_snapshot(text, &[("a", "/k/a"), ("b", "/k/b")]);
    assert_eq!(at, 1_234_560_000);
    let a = m["a"];
    assert_eq!(
        (a.usage_us, a.throttled_us, a.some_us, a.full_us),
        (900, 40, 700, 300)
    );
    assert_eq!(m["b"].usage_us, 5);
    assert_eq!(m.len(), 2, "a cgroup not asked for is left out");
}

// ---------------------------------------------------------------------------
// Per-cgroup PSI facts the contention signal rests on, on each node's kernel.

/// Test cgroups directly under the root (beside the kubelet's): the kernel's
/// per-cgroup accounting is the same at any depth, and no kubelet or agent
/// reads them.
const PSI_ROOT: &str = "/sys/fs/cgroup/headroom-psi";

/// Starts `threads` busy loops in `PSI_ROOT/<cg>` (made if missing, with
/// `cpu.max` set to `max`).
async fn psi_busy(node: &NodeVm, cg: &str, max: &str, threads: u32) {
    let dir = format!("{PSI_ROOT}/{cg}");
    let mut cmd = format!(
        "mkdir -p {dir} && echo '{max}' > {dir}/cpu.max && grep -qw cpu {PSI_ROOT}/cgroup.subtree_control"
    );
    for _ in 0..threads {
        cmd.push_str(&format!(
            " && (nohup sh -c 'echo $$ > {dir}/cgroup.procs && while :; do :; done' \
             >/dev/null 2>&1 </dev/null &)"
        ));
    }
    node.sh(&cmd).await.expect("start busy loops");
}

/// Kills every task in `PSI_ROOT/<cg>` and removes it.
async fn psi_stop(node: &NodeVm, cg: &str) {
    let dir = format!("{PSI_ROOT}/{cg}");
    node.sh(&format!(
        "[ -d {dir} ] || exit 0; echo 1 > {dir}/cgroup.kill; \
         for i in $(seq 1 100); do [ -n \"$(cat {dir}/cgroup.procs)\" ] || break; sleep 0.1; done; rmdir {dir}"
    ))
    .await
    .expect("stop busy loops");
}

/// Percent of `dt` of each counter: (usage, throttled, some, full).
fn psi_pct(d: &CgDelta, dt_us: u64) -> (f64, f64, f64, f64) {
    let p = |v: u64| v as f64 * 100.0 / dt_us.max(1) as f64;
    (p(d.usage_us), p(d.throttled_us), p(d.some_us), p(d.full_us))
}

async fn psi_facts_on(node: &NodeVm) {
    let n = node.name();
    let v = node.versions().await.expect("versions");
    node.sh(&format!(
        "mkdir -p {PSI_ROOT} && echo +cpu > {PSI_ROOT}/cgroup.subtree_control"
    ))
    .await
    .expect("psi root");
    let window = 10;
    let mut failures = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(what);
        }
    };

    // `full` exists per cgroup (since 5.13) beside `some`.
    let pressure = node
        .sh(&format!("cat {PSI_ROOT}/cpu.pressure"))
        .await
        .expect("cpu.pressure");
    check(
        pressure.lines().any(|l| l.starts_with("some avg10="))
            && pressure.lines().any(|l| l.starts_with("full avg10=")),
        format!("{n}: a cgroup's cpu.pressure has some and full lines: {pressure:?}"),
    );

    // 1. Own threads queued behind each other: 4 busy threads, 2 CPUs, no
    //    limit, nothing else busy. `some` counts them; `full` does not (one
    //    of them always runs).
    psi_busy(node, "queued", "max 100000", 4).await;
    let dir = format!("{PSI_ROOT}/queued");
    let (dt, d) = cg_deltas(node, &[("queued", &dir)], window).await;
    psi_stop(node, "queued").await;
    let (u, t, some, full) = psi_pct(&d["queued"], dt);
    eprintln!(
        "MEASURE psi {n} ({v}) queued 4 threads: usage {u:.1}% throttled {t:.1}% some {some:.1}% full {full:.1}%"
    );
    check(
        some >= 50.0,
        format!("{n}: own queueing counts in some: some {some:.1}% (≥ 50%)"),
    );
    check(
        full <= some - 25.0,
        format!("{n}: own queueing is not full: some {some:.1}%, full {full:.1}% (≤ some − 25)"),
    );

    // 2. Throttled by its own cpu.max: one thread at 200m. Its throttled
    //    time counts in `some`, and `full` = `some` (one task).
    psi_busy(node, "throttled", "20000 100000", 1).await;
    let dir = format!("{PSI_ROOT}/throttled");
    let (dt, d) = cg_deltas(node, &[("throttled", &dir)], window).await;
    psi_stop(node, "throttled").await;
    let (u, t, some, full) = psi_pct(&d["throttled"], dt);
    eprintln!(
        "MEASURE psi {n} ({v}) throttled 1 thread at 200m: usage {u:.1}% throttled {t:.1}% some {some:.1}% full {full:.1}%"
    );
    check(
        t >= 50.0,
        format!("{n}: a busy thread at 200m is throttled most of the time: {t:.1}%"),
    );
    // One thread cannot queue behind its own threads, so any `some` here is
    // throttling. The share of throttled time that shows varies under
    // emulation (0.66–1.0 of it measured), hence half, not all.
    check(
        some >= 0.5 * t,
        format!("{n}: throttling counts in some: some {some:.1}% vs throttled {t:.1}%"),
    );
    check(
        (some - full).abs() <= 3.0,
        format!("{n}: one task: full = some: some {some:.1}%, full {full:.1}%"),
    );

    // 3. Displaced by another cgroup: one thread beside a 4-thread hog of
    //    ten times its weight (as a pod with a larger request), no limits. (At
    //    equal weights the lone thread's fair share is a whole CPU: 7.8 % full
    //    on 6.12.) Its waits are all of it waiting: `full` = `some`, not throttling.
    psi_busy(node, "hog", "max 100000", 4).await;
    node.sh(&format!("echo 1000 > {PSI_ROOT}/hog/cpu.weight"))
        .await
        .expect("hog weight");
    psi_busy(node, "displaced", "max 100000", 1).await;
    let dir = format!("{PSI_ROOT}/displaced");
    let (dt, d) = cg_deltas(node, &[("displaced", &dir)], window).await;
    psi_stop(node, "displaced").await;
    psi_stop(node, "hog").await;
    let (u, t, some, full) = psi_pct(&d["displaced"], dt);
    eprintln!(
        "MEASURE psi {n} ({v}) displaced 1 thread beside 4 of 10× its weight: usage {u:.1}% throttled {t:.1}% some {some:.1}% full {full:.1}%"
    );
    check(
        full >= 10.0 && t < 1.0,
        format!(
            "{n}: displacement shows as full, not throttling: full {full:.1}%, throttled {t:.1}%"
        ),
    );
    check(
        (some - full).abs() <= 3.0,
        format!("{n}: one task displaced: full = some: some {some:.1}%, full {full:.1}%"),
    );
    node.sh(&format!("rmdir {PSI_ROOT}"))
        .await
        .expect("remove psi root");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// docs/kubelet-behaviour.md §8 "Per cgroup: who waits", on each node's
/// kernel: `some` counts a cgroup's own queued threads and its throttled
/// tasks; `full` exists and is time when all its runnable tasks wait (one
/// task displaced by another cgroup; never its own threads' queueing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_cgroup_psi_counts_own_queueing_and_throttling_in_some_and_displacement_in_full() {
    let Some(c) = cluster() else { return };
    let _serial = serial(c).await;
    // One node at a time: each measures an otherwise idle node.
    for node in &c.nodes {
        psi_facts_on(node).await;
    }
}

/// A busybox pod whose busy threads a test switches on and off from the
/// node: one shell loop blocks reading the wanted count from the FIFO
/// `/run/headroom-test/<ns>/<name>/n` (a hostPath the pod sees as `/ctl`),
/// then starts or kills busy subshells to match. Idle, it runs nothing at
/// all: a pod that polled (even one `sleep` a second) waited behind the busy
/// pod long enough, under emulation, to be a displaced pod within its
/// request — which the agent then rightly served.
fn switched(name: &str, node: &str, ns: &str, req: &str, lim: &str) -> Value {
    let script = "n=0; pids=; while :; do w=; read w < /ctl/n || continue; \
        [ -n \"$pids\" ] && kill $pids; pids=; i=0; \
        while [ $i -lt ${w:-0} ]; do (while :; do :; done) & pids=\"$pids $!\"; i=$((i+1)); done; \
        done";
    let mut c = container("app", json!({"cpu": req}), json!({"cpu": lim}));
    c["command"] = json!(["/bin/sh", "-c", script]);
    c["volumeMounts"] = json!([{"name": "ctl", "mountPath": "/ctl"}]);
    let mut p = pod(name, node, vec![c]);
    p["spec"]["volumes"] = json!([{"name": "ctl", "hostPath": {
        "path": ctl_dir(ns, name), "type": "Directory"}}]);
    p
}

/// A [`switched`] pod whose loop keeps its busy threads running when asked
/// for more, and adds only the new ones: `switched` kills them all and
/// starts the count afresh, and under emulation that dipped the pod's
/// usage for a second or two (a busy pod going from 1 to 2 threads read
/// 400m for 2 s where it had run at 610m), which a hold for it may end on.
fn switched_adding(name: &str, node: &str, ns: &str, req: &str, lim: &str) -> Value {
    let script = "n=0; pids=; while :; do w=; read w < /ctl/n || continue; w=${w:-0}; \
        if [ $w -lt $n ]; then [ -n \"$pids\" ] && kill $pids; pids=; n=0; fi; \
        while [ $n -lt $w ]; do (while :; do :; done) & pids=\"$pids $!\"; n=$((n+1)); done; \
        done";
    let mut p = switched(name, node, ns, req, lim);
    p["spec"]["containers"][0]["command"] = json!(["/bin/sh", "-c", script]);
    p
}

fn ctl_dir(ns: &str, name: &str) -> String {
    format!("/run/headroom-test/{ns}/{name}")
}

/// Makes the control FIFO of a [`switched`] pod (before the pod starts).
async fn make_ctl(node: &NodeVm, ns: &str, name: &str) {
    let dir = ctl_dir(ns, name);
    node.sh(&format!("mkdir -p {dir} && mkfifo {dir}/n"))
        .await
        .expect("control fifo");
}

/// Asks `name` for `n` busy threads; the guest's clock (epoch seconds)
/// when the pod read it.
async fn set_threads(node: &NodeVm, ns: &str, name: &str, n: u32) -> f64 {
    let dir = ctl_dir(ns, name);
    let out = node
        .sh(&format!(
            "timeout 30 sh -c 'echo {n} > {dir}/n' && date +%s.%N"
        ))
        .await
        .expect("switch threads");
    out.trim().parse().unwrap_or_else(|_| {
        panic!(
            "{}: {name} did not read its control fifo: {out}",
            node.name()
        )
    })
}

/// Waits until the kubelet reports container "app" of `name` at its spec
/// limit (a resize applied), whatever the agent set last.
async fn applied(api: &Api<Pod>, agent: &GuestAgent<'_>, name: &str) -> Pod {
    wait_pod(api, agent, name, "resize applied", KUBELET_APPLY, |p| {
        let status = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == "app"))
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| millis(l.get("cpu")));
        status.is_some() && status == app_limit_m(p)
    })
    .await
}

/// Waits until `name`'s limit is applied and stays put for 8 s (the agent
/// may lower in more than one step); that limit.
async fn settled(api: &Api<Pod>, agent: &GuestAgent<'_>, name: &str) -> u64 {
    for _ in 0..10 {
        let m = app_limit_m(&applied(api, agent, name).await).expect("limit");
        tokio::time::sleep(Duration::from_secs(8)).await;
        if app_limit_m(&api.get(name).await.expect("get")) == Some(m) {
            return m;
        }
    }
    panic!(
        "{}: {name}'s limit never settled:\n{}",
        agent.node.name(),
        agent.log_tail(60).await
    );
}

/// The agent's `resized` journal lines for `pod` (ns/name) from `since`
/// (guest epoch s) on, each with its time.
async fn resized_since(agent: &GuestAgent<'_>, pod: &str, since: f64) -> Vec<(f64, String)> {
    journal_since(agent, "resized", pod, since).await
}

/// The agent's journal lines holding `what` about `pod` (ns/name) from
/// `since` (guest epoch s) on, each with its time.
async fn journal_since(
    agent: &GuestAgent<'_>,
    what: &str,
    pod: &str,
    since: f64,
) -> Vec<(f64, String)> {
    journal_lines(agent, since, &[what, &format!("pod={pod} ")]).await
}

/// Every line of the agent's journal about `pod` (ns/name) from `since`
/// on: its resizes, their verification, the checks of its lowerings and
/// the ends of their holds, in order — a failure's whole story, where a
/// log tail may start after it.
async fn history_of(agent: &GuestAgent<'_>, pod: &str, since: f64) -> String {
    journal_since(agent, "", pod, since)
        .await
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Guest time (epoch s) of the agent's first lowering of `pod` (ns/name)
/// after `since`, from its journal; `None` if there is none yet.
async fn first_lowering_after(
    agent: &GuestAgent<'_>,
    pod: &str,
    since: f64,
) -> Option<(f64, String)> {
    resized_since(agent, pod, since)
        .await
        .into_iter()
        .find(|(_, l)| l.contains("why=lower "))
}

/// The agent's `lowering checked` journal lines for `pod` (ns/name) from
/// `since` (guest epoch s) on, each with its time: what each lowering made
/// for a pod short of CPU bought it, once the kubelet applied it. Waits up
/// to `timeout` until every such lowering of `pod` since then is checked.
async fn lowerings_checked(
    agent: &GuestAgent<'_>,
    pod: &str,
    since: f64,
    timeout: Duration,
) -> Vec<(f64, String)> {
    let until = Instant::now() + timeout;
    loop {
        let checks = journal_since(agent, "lowering checked", pod, since).await;
        let claims = resized_since(agent, pod, since)
            .await
            .iter()
            .filter(|(_, l)| l.contains("why=lower ") && l.contains("pod(s) displaced"))
            .count();
        if checks.len() >= claims || Instant::now() >= until {
            return checks;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// `key=<n>m` or `key=<n>` of a journal line.
fn field_m(line: &str, key: &str) -> Option<u64> {
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))?;
    v.trim_end_matches('m').parse().ok()
}

/// The lowest limit the agent set `pod` (ns/name) to after `since`, from
/// its journal; `None` if it set none.
async fn lowest_limit_after(agent: &GuestAgent<'_>, pod: &str, since: f64) -> Option<u64> {
    resized_since(agent, pod, since)
        .await
        .iter()
        .filter_map(|(_, l)| field_m(l, "new"))
        .min()
}

/// The contention signal on a real kernel, one node, four phases with the
/// agent at its production defaults (only the drift grace widened for the
/// emulated kubelet):
/// 1. a managed pod (request 500m, ceiling 2000m) runs 2, 4 then 8 busy
///    threads alone for 30 s each: its threads queue behind each other
///    (`some` without `full`), nobody else waits — raised, never lowered;
/// 2. a neighbour within its request (Burstable 800m/800m, one busy thread,
///    not managed) starts beside it, the node short of CPU: the managed pod
///    is lowered within a few ticks; each lowering made for the neighbour
///    is checked once applied and the agent does what the check found (one
///    that helped is not handed back while the neighbour runs, one that
///    bought nothing is undone); once settled, the neighbour's `full` is
///    back within its owed threshold (80m) of its baseline (the managed pod
///    idle), or the managed pod was lowered to its floor, or a check found
///    that lowering it further buys the neighbour nothing;
/// 3. the managed pod idles and opts out, a second managed pod (request
///    200m, default ceiling 800m) runs 2 threads throttled at its ceiling,
///    alone: raised to it, not lowered;
/// 4. the neighbour starts again beside it: its displacement still lowers
///    the throttled pod (the kubepods-wide subtraction of the pods'
///    throttling, summed over CPUs, hid it).
///
/// Prints MEASURE/RAWPSI lines: the per-cgroup facts docs/kubelet-behaviour.md §8
/// pins, and the lowering latencies.
#[allow(clippy::too_many_lines)]
async fn attribution_on(c: &RealCluster, node: &NodeVm) {
    let client = c.cp.client().await;
    let n = node.name();
    let ns = c.cp.namespace(&format!("attr-{n}")).await;
    let other = c.cp.namespace(&format!("nbr-{n}")).await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let nbr: Api<Pod> = Api::namespaced(client.clone(), &other);
    for (namespace, pod) in [(&ns, "svc"), (&ns, "thr"), (&other, "steady")] {
        make_ctl(node, namespace, pod).await;
    }
    let mut svc = switched("svc", n, &ns, "500m", "1000m");
    svc["metadata"]["annotations"] = json!({"headroom.dev/ceiling": "2000m"});
    create(&api, svc).await;
    // Opted out until phase 3: an idle managed pod takes its share of the
    // slack, so svc alone shows what one pod on an idle node gets.
    let mut thr = switched("thr", n, &ns, "200m", "300m");
    thr["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    create(&api, thr).await;
    create(&nbr, switched("steady", n, &other, "800m", "800m")).await;
    wait_running(&api, "svc", POD_START).await;
    wait_running(&api, "thr", POD_START).await;
    wait_running(&nbr, "steady", POD_START).await;
    let dir_of = |p: Pod| async move {
        node.pod_cgroup(p.metadata.uid.as_deref().expect("uid"))
            .await
            .expect("pod cgroup")
    };
    let svc_dir = dir_of(api.get("svc").await.expect("get")).await;
    let thr_dir = dir_of(api.get("thr").await.expect("get")).await;
    let nbr_dir = dir_of(nbr.get("steady").await.expect("get")).await;
    let kp = node.spec.kubepods_path();
    let cgs = [
        ("kubepods", kp.as_str()),
        ("svc", svc_dir.as_str()),
        ("thr", thr_dir.as_str()),
        ("steady", nbr_dir.as_str()),
    ];
    // One line per cgroup, with the managed pods' limits at the end of the
    // window (the simulator's parity test replays each line).
    let raw = |phase: String, dt: u64, d: std::collections::BTreeMap<String, CgDelta>| {
        let api = api.clone();
        async move {
            let lim = |name: &'static str| {
                let api = api.clone();
                async move { app_limit_m(&api.get(name).await.expect("get")).unwrap_or(0) }
            };
            let (svc_m, thr_m) = (lim("svc").await, lim("thr").await);
            for (k, v) in &d {
                eprintln!(
                    "RAWPSI node={n} phase={phase} cgroup={k} dt_us={dt} usage_us={} throttled_us={} some_us={} full_us={} svc_limit_m={svc_m} thr_limit_m={thr_m} ({})",
                    v.usage_us,
                    v.throttled_us,
                    v.some_us,
                    v.full_us,
                    v.pct(dt)
                );
            }
        }
    };

    let agent = GuestAgent::start(node, &["--drift-grace".into(), "180s".into()])
        .await
        .expect("agent starts");
    let svc_name = format!("{ns}/svc");
    let thr_name = format!("{ns}/thr");

    // 1. Alone, 2/4/8 threads: raised, never lowered.
    set_threads(node, &ns, "svc", 2).await;
    let high = wait_pod(
        &api,
        &agent,
        "svc",
        "raise to 1500m+",
        Duration::from_secs(180),
        |p| app_limit_m(p).is_some_and(|m| m >= 1500),
    )
    .await;
    let high = app_limit_m(&high).expect("limit");
    let lone_from = set_threads(node, &ns, "svc", 2).await;
    let mut history = Vec::new();
    for threads in [2, 4, 8] {
        set_threads(node, &ns, "svc", threads).await;
        // 30 s in all with the window below: the lowerings this guards
        // against came within 2 s of the signal (phase 2's latency).
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            let m = app_limit_m(&api.get("svc").await.expect("get")).expect("limit");
            history.push((threads, m));
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let (dt, d) = cg_deltas(node, &cgs, 10).await;
        raw(format!("lone-{threads}"), dt, d.clone()).await;
    }
    let lowered = first_lowering_after(&agent, &svc_name, lone_from).await;
    eprintln!("MEASURE {n} lone threads: svc limit (threads, m) {history:?}");
    assert_eq!(
        lowered,
        None,
        "{n}: a pod alone whose own threads queue was lowered:\n{}",
        agent.log_tail(60).await
    );

    // 2. A neighbour within its request starts: lowered, sized, soon.
    set_threads(node, &ns, "svc", 4).await;
    let t0 = set_threads(node, &other, "steady", 1).await;
    let (dt, d) = cg_deltas(node, &cgs, 5).await;
    raw("displaced".into(), dt, d.clone()).await;
    let lowered = wait_pod(
        &api,
        &agent,
        "svc",
        "lowering for the neighbour",
        Duration::from_secs(120),
        |p| app_limit_m(p).is_some_and(|m| m < high),
    )
    .await;
    let (at, line) = first_lowering_after(&agent, &svc_name, t0)
        .await
        .expect("the lowering is in the agent's journal");
    let to = app_limit_m(&lowered).expect("limit");
    eprintln!(
        "MEASURE {n} displaced neighbour: svc {high}m → {to}m, decided {:.1} s after the neighbour was switched on: {line}",
        at - t0
    );
    assert!(to >= 500, "{n}: below the request: {to}m");
    assert!(
        at - t0 <= 6.0,
        "{n}: lowering decided {:.1} s after the neighbour started (tick 1 s; its loop polls every 1 s)",
        at - t0
    );
    let settled = settled(&api, &agent, "svc").await;
    let (dt, d) = cg_deltas(node, &cgs, 10).await;
    raw("after-lowering".into(), dt, d.clone()).await;
    let full_m = |d: &CgDelta, dt: u64| d.full_us * 1000 / dt.max(1);
    let after = full_m(&d["steady"], dt);
    let (settled_d, settled_dt) = (d["steady"], dt);
    // Second by second, as the agent reads them: the seconds in which svc
    // burst above its request while the neighbour waited past its
    // threshold (its wait beyond its own throttling, at most what its own
    // limit left it). Only in those did svc's limit hold back CPU the
    // neighbour was owed. On the emulated cgroupfs node (2026-12-06) the
    // node's own processes took ~600m of the 2,000m: svc used 705m on
    // average at a 1,150m limit and the neighbour waited 92m short of its
    // request over 10 s, yet second by second the two alternated — svc
    // burst (usage 850–990m) while the neighbour waited 16–50m, and the
    // neighbour waited 200–240m while svc used 360–450m, under its
    // request: both waited for the node's own processes, not each other.
    let owed_from = headroom::signal::contention::owed_threshold_m(
        800,
        headroom::policy::PolicyConfig::default().pressure_start_pct,
    );
    // And only in seconds the node was short (§8 "When a wait is a
    // shortage"): its free CPU — idle by kubepods and by the whole machine
    // (the root cgroup), less svc's throttled time — below the wait (or the
    // reserve). A wait beside idle CPU is wake-up latency no lowering buys
    // back; on the 6.12 node (2026-12-06) the neighbour waited 110–270m a
    // second with svc at 1,100–1,300m, and the agent found idle CPU beside
    // it every second.
    let with_machine = [
        cgs[0],
        cgs[1],
        cgs[2],
        cgs[3],
        ("machine", "/sys/fs/cgroup"),
    ];
    let cpus_m = u64::from(node.spec.cpus) * 1000;
    let reserve_m = headroom::policy::PolicyConfig::default().reserve_m;
    let mut seconds = Vec::new();
    for _ in 0..10 {
        let (dt, d) = cg_deltas(node, &with_machine, 1).await;
        assert!(
            d["machine"].usage_us > 0,
            "{n}: the root cgroup's cpu.stat was not read"
        );
        let m = |us: u64| us * 1000 / dt.max(1);
        let svc_m = m(d["svc"].usage_us);
        let nbr_m = m(d["steady"].usage_us);
        let waited = d["steady"]
            .displaced_m(dt)
            .min(800u64.saturating_sub(nbr_m));
        let idle_m = cpus_m
            .saturating_sub(m(d["kubepods"].usage_us))
            .min(cpus_m.saturating_sub(m(d["machine"].usage_us)));
        let free_m = idle_m.saturating_sub(m(d["svc"].throttled_us));
        seconds.push((svc_m, nbr_m, waited, free_m));
    }
    let held_back = seconds
        .iter()
        .filter(|(svc_m, _, waited, free_m)| {
            *waited >= owed_from
                && *svc_m >= 500 + headroom::signal::contention::MIN_DISPLACED_M
                && *free_m < reserve_m.max(*waited)
        })
        .count();
    eprintln!(
        "MEASURE {n} settled, second by second (svc usage, neighbour usage, neighbour's wait beyond its throttling, node free; m): {seconds:?}: svc burst above its request while the neighbour waited past its {owed_from}m threshold on a short node in {held_back} of 10"
    );
    // Its baseline: the same neighbour with the managed pod idle (under
    // emulation the node's own processes displace it too; alone it is
    // throttled at its own 800m instead of waiting for svc).
    let svc_idle_from = set_threads(node, &ns, "svc", 0).await;
    let (dt, d) = cg_deltas(node, &cgs, 10).await;
    raw("neighbour-alone".into(), dt, d.clone()).await;
    let base = full_m(&d["steady"], dt);
    // Each lowering made for the neighbour was checked once applied, and
    // the agent did what the check found (the neighbour ran all along; svc
    // idled for the last window):
    // - helped: the CPU it bought stays with the neighbour, svc is never
    //   set above that lowering's limit again while both run (once svc
    //   idles the node has the CPU the hold took free, and the hold ends:
    //   a raise then hands the neighbour's CPU to nobody);
    // - bought nothing: undone (svc raised) within 20 s of the check. On
    //   the cgroupfs node (2026-12-06) usage-based lowerings (1840m →
    //   1130m) had already given the neighbour what svc held; a lowering
    //   to 720m for its remaining 116m changed its usage by −2m: the
    //   node's own processes, not svc, kept it waiting.
    // Lowerings the usage-based slack made (the neighbour's usage shows a
    // second before its wait can be read) are no claim: the slack may
    // raise them again.
    let checks = lowerings_checked(&agent, &svc_name, t0, Duration::from_secs(90)).await;
    let resized = resized_since(&agent, &svc_name, t0).await;
    for (at, check) in &checks {
        eprintln!("MEASURE {n} what a lowering of svc bought the neighbour: {check}");
        let after: Vec<&(f64, String)> = resized.iter().filter(|(t, _)| t > at).collect();
        if check.contains("effect=helped") {
            let held = field_m(check, "to_m").expect("to_m");
            let above: Vec<&String> = after
                .iter()
                .filter(|(t, _)| *t < svc_idle_from)
                .map(|(_, l)| l)
                .filter(|l| field_m(l, "new").is_some_and(|m| m > held))
                .collect();
            if !above.is_empty() {
                panic!(
                    "{n}: svc set above the {held}m a lowering that helped the neighbour gave it, while both still ran: {above:?}\nthe agent on svc since the neighbour started:\n{}",
                    history_of(&agent, &svc_name, t0).await
                );
            }
        } else if check.contains("effect=no_effect") {
            assert!(
                after
                    .iter()
                    .any(|(t, l)| l.contains("why=raise ") && t - at <= 20.0),
                "{n}: a lowering that bought nothing was not undone within 20 s: {check}\n{after:?}"
            );
        }
    }
    let found_useless = checks.iter().any(|(_, l)| l.contains("effect=no_effect"));
    eprintln!(
        "MEASURE {n} neighbour's full {after}m (beyond its throttling {}m) with svc settled at {settled}m, {base}m with svc idle",
        settled_d.displaced_m(settled_dt)
    );
    // As far as needed: back to its baseline, or svc lowered to its floor
    // (its request: at 500m its 4 threads still burst through each period's
    // quota and displace the neighbour by 0–110m on the emulated node). "At
    // its floor" as the agent's rule has it: a managed pod bursting less
    // than MIN_DISPLACED_M above its request holds back nothing anyone is
    // owed, so a lowering sized from a window's usage may stop at 510m.
    // Until 2026-12-06 this was judged on the lowest limit set, as a slack
    // raise at the cooldown handed svc the CPU back while the neighbour ran
    // (cold CI 5); a lowering that helped now holds (asserted above), so
    // the lowest and the settled limit are one.
    let floor_band = 500 + headroom::signal::contention::MIN_DISPLACED_M;
    let lowest = lowest_limit_after(&agent, &svc_name, t0)
        .await
        .unwrap_or(to);
    if settled > lowest {
        eprintln!(
            "MEASURE {n} svc raised again after its lowering: lowest {lowest}m, settled at {settled}m while the neighbour ran"
        );
    }
    // "Back to its baseline" as the agent's rule has it too: the neighbour
    // is owed nothing below its threshold (`pressure_start_pct` of its 800m
    // request, at least MIN_OWED_M). One run stopped at 540m with the
    // neighbour 54m above its baseline.
    // Or the agent found, by lowering svc, that svc no longer held the
    // neighbour back (a check that found no effect: after one that helped,
    // a follow-up for the rest of the wait is tried once). Until
    // 2026-12-06 a follow-up after one that helped needed twice the
    // threshold in one second, which the neighbour's wait, capped at what
    // its own 800m limit left it, could not reach: on the cgroupfs node
    // svc stayed at 1180m with the neighbour 184m above its baseline.
    // Or svc held nothing back: at most one second (one marginal interval
    // is no owed wait for the agent either) in which it burst above its
    // request while the neighbour waited past its threshold.
    if !(after <= base + owed_from || lowest <= floor_band || found_useless || held_back <= 1) {
        panic!(
            "{n}: the neighbour's full is {after}m with svc settled at {settled}m, {base}m at its baseline (+{owed_from}m owed from), svc was lowered no further than {lowest}m (above its 500m floor and the {floor_band}m the agent stops lowering at), no lowering was found to buy nothing, and svc burst above its request while the neighbour waited past its threshold on a short node in {held_back} of 10 seconds\nthe agent on svc since the neighbour started:\n{}\n{}",
            history_of(&agent, &svc_name, t0).await,
            agent.log_tail(60).await
        );
    }

    // 3. The throttled pod alone: raised to its ceiling, not lowered.
    set_threads(node, &other, "steady", 0).await;
    // thr managed, svc no longer: an idle managed svc would take 5/7 of the
    // slack (water-filled by request) and keep thr below its ceiling.
    let managed =
        |on: bool| json!({"metadata": {"annotations": {"headroom.dev/managed": on.to_string()}}});
    for (pod, on) in [("svc", false), ("thr", true)] {
        api.patch(pod, &PatchParams::default(), &Patch::Merge(&managed(on)))
            .await
            .expect("opt in or out");
    }
    let thr_from = set_threads(node, &ns, "thr", 2).await;
    wait_pod(
        &api,
        &agent,
        "thr",
        "raise to its ceiling 800m",
        Duration::from_secs(180),
        |p| app_limit_m(p) == Some(800),
    )
    .await;
    applied(&api, &agent, "thr").await;
    let (dt, d) = cg_deltas(node, &cgs, 10).await;
    raw("throttled-alone".into(), dt, d.clone()).await;
    assert_eq!(
        first_lowering_after(&agent, &thr_name, thr_from).await,
        None,
        "{n}: a pod throttled at its ceiling, alone, was lowered:\n{}",
        agent.log_tail(60).await
    );

    // 4. The neighbour beside the throttled pod: still lowers it, when the
    //    kernel left the neighbour short of its request. thr at 800m and
    //    steady at 800m fit the node when its own processes take under 400m;
    //    then steady is displaced only in moments it makes up before its
    //    quota runs out, and nobody is owed anything (its displacement is
    //    capped at what its limit left it).
    let t1 = set_threads(node, &other, "steady", 1).await;
    // Measured once its thread runs (a window from the switch counts the
    // shell's start-up as a shortfall), from the kernel's counters as the
    // agent reads them: owed what it fell short of its request by, as far as
    // others displaced it (`full` beyond its own throttling). A window read
    // by a shell spawning a process per file read 645m where the agent saw
    // 780m a second: see `cg_deltas`.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (dt, d) = cg_deltas(node, &cgs, 5).await;
    raw("displaced-by-throttled".into(), dt, d.clone()).await;
    let steady = d.get("steady").copied().unwrap_or_default();
    let steady_m = steady.usage_us * 1000 / dt.max(1);
    let displaced_m = steady.displaced_m(dt);
    let short_m = 800u64.saturating_sub(steady_m).min(displaced_m);
    if short_m < 80 {
        eprintln!(
            "MEASURE {n} neighbour beside a throttled pod: used {steady_m}m of its 800m request over 5 s from 3 s after it started, displaced {displaced_m}m (owed {short_m}m, under its 80m threshold): no lowering owed"
        );
        // No claim either way: the agent owes per 1 s interval, and one
        // interval displaced by twice the threshold rightly lowers at once
        // (a run whose 5 s window read 5m owed was lowered within 15 s for
        // 177m owed in one second). Phase 3 holds that a pod throttled at
        // its ceiling, alone, keeps it.
        tokio::time::sleep(Duration::from_secs(15)).await;
        if let Some((at, line)) = first_lowering_after(&agent, &thr_name, t1).await {
            eprintln!(
                "MEASURE {n} the throttled pod was lowered {:.1} s after the neighbour started, for a 1 s interval: {line}",
                at - t1
            );
        }
        agent.stop().await.expect("agent stops");
        cleanup(&client, &[ns.as_str(), other.as_str()]).await;
        let _ = node.sh("rm -rf /run/headroom-test").await;
        return;
    }
    wait_pod(
        &api,
        &agent,
        "thr",
        "lowering for the neighbour",
        Duration::from_secs(120),
        |p| app_limit_m(p).is_some_and(|m| m < 800),
    )
    .await;
    let (at, line) = first_lowering_after(&agent, &thr_name, t1)
        .await
        .expect("the lowering is in the agent's journal");
    eprintln!(
        "MEASURE {n} neighbour beside a throttled pod: decided {:.1} s after it started: {line}",
        at - t1
    );
    assert!(
        at - t1 <= 6.0,
        "{n}: lowering decided {:.1} s after the neighbour started",
        at - t1
    );
    let patches = |p: &Pod| p.metadata.generation.unwrap_or(1) - 1;
    eprintln!(
        "MEASURE {n} patches: svc {}, thr {}",
        patches(&api.get("svc").await.expect("get")),
        patches(&api.get("thr").await.expect("get"))
    );
    agent.stop().await.expect("agent stops");
    cleanup(&client, &[ns.as_str(), other.as_str()]).await;
    let _ = node.sh("rm -rf /run/headroom-test").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_in_the_vm_lowers_only_when_a_pod_within_its_request_is_displaced() {
    on_every_node_with_agents(attribution_on).await;
}

/// What the agent's journal says of the lowerings of a managed pod (ns/name)
/// made for pods short of CPU since some time (guest epoch s): the claims
/// (lowerings made for a displaced pod), their checks, and the ends of
/// their holds — each line with its time.
struct HoldJournal {
    claims: Vec<(f64, String)>,
    checks: Vec<(f64, String)>,
    ends: Vec<(f64, String)>,
}

impl HoldJournal {
    /// One `journalctl` from `since` on: this polls every few seconds
    /// while the owed pod's CPU is measured, and each read of the whole
    /// journal costs the emulated guest CPU the neighbour waits for.
    async fn read(agent: &GuestAgent<'_>, pod: &str, since: f64) -> HoldJournal {
        let lines = journal_lines(agent, since, &[&format!("pod={pod} ")]).await;
        let with = |what: &str| -> Vec<(f64, String)> {
            lines
                .iter()
                .filter(|(_, l)| l.contains(what))
                .cloned()
                .collect()
        };
        HoldJournal {
            claims: with("resized ")
                .into_iter()
                // "0 pod(s) displaced": a lowering for what is still owed
                // from earlier intervals, for nobody owed in this one: no
                // claim, no check.
                .filter(|(_, l)| {
                    l.contains("why=lower ")
                        && l.contains("pod(s) displaced")
                        && !l.contains(": 0 pod(s) displaced")
                })
                .collect(),
            checks: with("lowering checked"),
            ends: with("lowering hold ended"),
        }
    }

    /// Every claim checked: no lowering (a follow-up among them) is still
    /// applying or being measured.
    fn settled(&self) -> bool {
        self.checks.len() >= self.claims.len()
    }

    /// The check that found a lowering helped whose hold is in force now:
    /// no claim in flight, and nothing holds the pod no more since it (a
    /// hold that only went back up to an earlier lowering's limit, a
    /// follow-up's undone, still holds).
    fn holding(&self) -> Option<&(f64, String)> {
        if !self.settled() {
            return None;
        }
        let last_end = self
            .full_ends()
            .map(|(t, _)| *t)
            .fold(f64::NEG_INFINITY, f64::max);
        self.checks
            .iter()
            .rev()
            .find(|(t, l)| l.contains("effect=helped") && *t > last_end)
    }

    /// Ends after which nothing holds the pod any more.
    fn full_ends(&self) -> impl Iterator<Item = &(f64, String)> {
        self.ends
            .iter()
            .filter(|(_, l)| l.contains("now_held_m=-1"))
    }

    /// The first end after `t` after which nothing holds the pod.
    fn ended_after(&self, t: f64) -> Option<&(f64, String)> {
        self.full_ends().find(|(at, _)| *at > t)
    }
}

/// `reason=<why>` of a `lowering hold ended` line (agents before 1c4a4bc
/// quoted it).
fn hold_end_reason(line: &str) -> Option<&str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("reason="))
        .map(|r| r.trim_matches('"'))
}

/// The guest's clock (epoch s), as its journal stamps lines.
async fn guest_now(node: &NodeVm) -> f64 {
    let out = node.sh("date +%s.%N").await.expect("guest clock");
    out.trim().parse().expect("epoch seconds")
}

/// The systemd unit [`start_sampler`] runs in the guest.
const SAMPLER_UNIT: &str = "headroom-test-sampler";

/// Starts, in the guest, a loop reading pod cgroup `dir`'s `usage_usec`
/// every 0.25 s (stamped with the guest's clock) into `out`, for at most
/// `secs`; it writes `<t> gone` and ends once the directory is gone. Only
/// shell builtins in the loop: a process spawned per read took seconds
/// under emulation (see [`cg_deltas`]). Returns once the first sample is
/// written.
async fn start_sampler(node: &NodeVm, dir: &str, out: &str, secs: u64) {
    let script = r#"d=$1; exec >"$2"; end=$((EPOCHSECONDS + $3))
f=/run/headroom-test/sampler.tick; rm -f "$f"; mkfifo "$f"; exec 9<>"$f"
while [ "$EPOCHSECONDS" -lt "$end" ]; do
  if [ ! -d "$d" ]; then echo "$EPOCHREALTIME gone"; exit 0; fi
  u=; while read -r k v; do if [ "$k" = usage_usec ]; then u=$v; break; fi; done < "$d/cpu.stat"
  echo "$EPOCHREALTIME ${u:-gone}"
  read -t 0.25 -u 9
done"#;
    node.sh(&format!(
        "systemctl stop {SAMPLER_UNIT} 2>/dev/null; systemctl reset-failed {SAMPLER_UNIT} 2>/dev/null; \
         mkdir -p /run/headroom-test && cat > /run/headroom-test/sampler.sh <<'EOF'\n{script}\nEOF\n\
         rm -f {out}; systemd-run --unit={SAMPLER_UNIT} --collect /bin/bash /run/headroom-test/sampler.sh {dir} {out} {secs} >/dev/null 2>&1; \
         for i in $(seq 50); do [ -s {out} ] && break; sleep 0.1; done; [ -s {out} ]"
    ))
    .await
    .expect("start the sampler");
}

/// Stops [`start_sampler`]'s loop and reads what it wrote: (time, cumulative
/// usage µs; `None` once the cgroup is gone).
async fn stop_sampler(node: &NodeVm, out: &str) -> Vec<(f64, Option<u64>)> {
    let _ = node
        .sh(&format!("systemctl stop {SAMPLER_UNIT} 2>/dev/null; true"))
        .await;
    read_sampler(node, out).await
}

/// What [`start_sampler`]'s loop wrote so far.
async fn read_sampler(node: &NodeVm, out: &str) -> Vec<(f64, Option<u64>)> {
    let text = node
        .sh(&format!("cat {out}"))
        .await
        .expect("read the sampler");
    text.lines()
        .filter_map(|l| {
            let (t, u) = l.split_once(' ')?;
            Some((t.parse().ok()?, u.trim().parse().ok()))
        })
        .collect()
}

/// The usage (m) of each 1 s window of `samples` (the newest sample at
/// least 1 s before each), with the window's end.
fn usage_per_second(samples: &[(f64, Option<u64>)]) -> Vec<(f64, u64)> {
    let read: Vec<(f64, u64)> = samples
        .iter()
        .filter_map(|(t, u)| u.map(|u| (*t, u)))
        .collect();
    read.iter()
        .filter_map(|&(t, u)| {
            let &(t0, u0) = read.iter().rev().find(|(t0, _)| *t0 <= t - 1.0)?;
            Some((
                t,
                u.saturating_sub(u0) * 1000 / (((t - t0) * 1e6) as u64).max(1),
            ))
        })
        .collect()
}

/// Waits up to `timeout` for the first end, after `helped_at`, after which
/// nothing holds `svc` (ns/name); `None` if none came.
async fn wait_hold_end(
    agent: &GuestAgent<'_>,
    svc: &str,
    helped_at: f64,
    timeout: Duration,
) -> Option<(f64, String)> {
    let until = Instant::now() + timeout;
    loop {
        let j = HoldJournal::read(agent, svc, helped_at).await;
        if let Some(end) = j.ended_after(helped_at) {
            return Some(end.clone());
        }
        if Instant::now() >= until {
            return None;
        }
        // The journal's stamps time the end, not this poll.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// The time of the check whose hold is in force now, with no lowering for
/// the neighbour (switched on at `on`) still applying or measured: waits
/// up to 30 s for one in flight to be checked. `None`: no hold any more.
async fn still_holding(agent: &GuestAgent<'_>, svc: &str, on: f64) -> Option<f64> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let j = HoldJournal::read(agent, svc, on).await;
        if let Some((at, _)) = j.holding() {
            return Some(*at);
        }
        if j.settled() || Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A hold in force with nothing in flight, now: the one `helped_hold`
/// found, or a new one where it ended meanwhile (a follow-up lowering came
/// 10 s after a check, and a claim still applying or measured is not ended
/// by its pod going above its request: `follow_up`). Its check's time and
/// when the neighbour was switched on.
async fn hold_now(
    api: &Api<Pod>,
    agent: &GuestAgent<'_>,
    other: &str,
    svc_name: &str,
    (helped_at, on): (f64, f64),
) -> (f64, f64) {
    if let Some(at) = still_holding(agent, svc_name, on).await {
        return (at, on);
    }
    eprintln!(
        "MEASURE {} hold: ended {:.0} s after its check, before the test could use it; once more",
        agent.node.name(),
        guest_now(agent.node).await - helped_at
    );
    let (_, on) = helped_hold(api, agent, other, svc_name).await;
    let at = still_holding(agent, svc_name, on).await.unwrap_or_else(|| {
        panic!(
            "{}: a lowering of svc that helped the neighbour ended twice before the test could use it",
            agent.node.name()
        )
    });
    (at, on)
}

/// For a hold that ended late: the follow-up lowering made for the owed pod
/// between its hold's check (`helped_at`) and its end, if any, and when it
/// was checked. A claim still applying or measured holds the pods it
/// lowered; only one found to help is ended at once by its pod going above
/// its request (`still_held` in agent/src/signal/contention/effect/claim.rs).
async fn follow_up(agent: &GuestAgent<'_>, svc: &str, helped_at: f64, end_at: f64) -> String {
    let j = HoldJournal::read(agent, svc, helped_at).await;
    let Some((made, line)) = j.claims.iter().find(|(t, _)| *t < end_at) else {
        return String::new();
    };
    let checked =
        j.checks
            .iter()
            .find(|(t, _)| t > made)
            .map_or("not checked yet".to_string(), |(t, l)| {
                format!(
                    "checked {:.1} s later ({})",
                    t - made,
                    l.split_whitespace()
                        .find(|w| w.starts_with("effect="))
                        .unwrap_or("?")
                )
            });
    format!(
        ", held on by a follow-up lowering made {:.1} s after the check and {checked}: {}",
        made - helped_at,
        line.split_whitespace()
            .find(|w| w.starts_with("old="))
            .map_or(line.as_str(), |_| line.split("why=").nth(1).unwrap_or(line))
    )
}

/// The agent's debug lines on the neighbour's waits since `on` (its only
/// pod requesting 800m): (s from `on`, displaced, usage, owed; m).
async fn neighbour_waits(agent: &GuestAgent<'_>, on: f64) -> String {
    journal_lines(agent, on, &["pod displaced", "request_m=800"])
        .await
        .iter()
        .map(|(at, l)| {
            let f = |k: &str| field_m(l, k).map_or("?".into(), |m| m.to_string());
            format!(
                "({:.0} {} {} {})",
                at - on,
                f("displaced_m"),
                f("usage_m"),
                f("owed_m")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The agent unit's journal lines from `since` (guest epoch s) on that
/// contain every one of `greps`, each with its time: one `journalctl` over
/// ssh, filtered in the guest (each read of the whole journal costs the
/// emulated guest CPU the neighbour waits for).
async fn journal_lines(agent: &GuestAgent<'_>, since: f64, greps: &[&str]) -> Vec<(f64, String)> {
    let filters: String = greps.iter().map(|g| format!(" | grep -F '{g}'")).collect();
    let out = agent
        .node
        .sh(&format!(
            "journalctl -u {} --no-pager -o short-unix --since @{}{filters}",
            agent.unit().expect("an agent run as a unit"),
            since.floor() as u64
        ))
        .await
        .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let at: f64 = l.split_whitespace().next()?.parse().ok()?;
            (at >= since).then(|| (at, l.to_string()))
        })
        .collect()
}

/// When the block the agent's checks left the neighbour under ends (guest
/// epoch s; −∞ if none): after a lowering that bought it nothing,
/// [`block_for`] the lowerings in a row that did (a lowering that helped,
/// or one whose owed pod changed its need, starts the count afresh); after
/// one that could not be judged, the base block, no strike.
///
/// [`block_for`]: headroom::signal::contention::effect::block_for
fn blocked_until(j: &HoldJournal) -> f64 {
    use headroom::signal::contention::effect::block_for;
    let mut strikes = 0;
    let mut until = f64::NEG_INFINITY;
    for (t, l) in &j.checks {
        if l.contains("effect=no_effect") {
            strikes += 1;
            // A follow-up that bought nothing gives back its own step and
            // blocks nothing: the lowering before it holds again.
            let follow_up = j.ends.iter().any(|(e, end)| {
                (e - t).abs() < 1.0
                    && hold_end_reason(end) == Some("no_effect")
                    && !end.contains("now_held_m=-1")
            });
            if !follow_up {
                until = until.max(t + block_for(strikes).as_secs_f64());
            }
        } else if l.contains("effect=unjudged") {
            until = until.max(t + block_for(1).as_secs_f64());
        } else {
            strikes = 0;
        }
    }
    until
}

/// How long [`helped_hold`] tries for a lowering that helps.
const HOLD_TRIES_FOR: Duration = Duration::from_secs(300);

/// Gets a hold: the neighbour `nbr` (in `other`) idle, svc raised above
/// what it leaves it, then the neighbour's one busy thread switched on,
/// and once svc's limit followed its usage, the pods capped
/// ([`pods_quota`]); waits until a lowering of svc made for it was checked
/// and found to help, with no other lowering in flight. Not every lowering helps (one
/// may buy nothing where the node's own processes, not svc, kept the
/// neighbour waiting, and a usage-based lowering may leave it owed nothing
/// at all): a few tries, each after the block a lowering that bought
/// nothing leaves ([`blocked_until`]), for at most [`HOLD_TRIES_FOR`]. The
/// check's time, and when the neighbour was switched on.
async fn helped_hold(
    api: &Api<Pod>,
    agent: &GuestAgent<'_>,
    other: &str,
    svc_name: &str,
) -> (f64, f64) {
    let deadline = Instant::now() + HOLD_TRIES_FOR;
    let node = agent.node;
    let n = node.name();
    let mut tries = Vec::new();
    let first = guest_now(node).await;
    loop {
        set_threads(node, other, "nbr", 0).await;
        pods_quota(node, None).await;
        // The whole journal: a block doubles with each lowering in a row
        // that bought the pod nothing, strikes from before this call
        // included (cold CI of 53fe26a: two tries ran inside a 60 s block
        // the test took for 30 s).
        let blocked_until = blocked_until(&HoldJournal::read(agent, svc_name, 0.0).await);
        let raised = wait_pod(
            api,
            agent,
            "svc",
            "raise to its 1300m ceiling beside the idle neighbour",
            Duration::from_secs(120),
            |p| app_limit_m(p).is_some_and(|m| m >= 1250),
        )
        .await;
        let raised = app_limit_m(&raised).expect("limit");
        applied(api, agent, "svc").await;
        let wait = blocked_until - guest_now(node).await;
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
        let on = set_threads(node, other, "nbr", 1).await;
        // A few seconds of the neighbour steady beside svc (at its ceiling,
        // which the slack leaves it: uncapped, the agent finds free CPU
        // beside the wait and owes nothing), then the pods capped
        // ([`pods_quota`]): from the next interval the node is short, the
        // neighbour's wait is owed, and svc is lowered for it, its claim's
        // before window the neighbour at its steady usage. (Switched on
        // with the pods capped, the neighbour's first interval, part of a
        // second, showed it as usage more than as a wait: svc was lowered
        // for the slack alone, no claim, and with that resize in flight not
        // again until the wait was no longer owed; or a claim's before
        // window held that part-second, its spread (507–612m) a bar no gain
        // cleared. With svc raised above what the slack leaves it beside
        // the neighbour, the slack lowered it as the neighbour started, and
        // the first patch after the cap came for the slack alone in 3 tries
        // of 8 holds, 2026-12-07.) Should the slack lower svc anyway, the cap waits a second
        // after it.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until
            && app_limit_m(&api.get("svc").await.expect("get svc")).is_some_and(|m| m >= raised)
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        pods_quota(node, Some(PODS_QUOTA_M)).await;
        let capped = guest_now(node).await;
        // No lowering made for it within 25 s: the node had idle CPU beside
        // its wait (owed nothing) and svc followed the slack; the next try
        // costs no block. The lowerings that helped were made 1–30 s after.
        let until = (Instant::now() + Duration::from_secs(25)).min(deadline);
        // Little asked of the guest while the lowering is made and checked
        // (a lowering, its apply and its check took 6–10 s in the
        // attribution test): each `journalctl` over ssh costs the emulated
        // guest CPU, which swings the neighbour's usage and so the bar its
        // check must clear. Yet the hold is wanted soon after its check: a
        // follow-up lowering for the neighbour came 10 s after one.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let outcome = loop {
            let j = HoldJournal::read(agent, svc_name, on).await;
            if let Some(h) = j.holding() {
                eprintln!(
                    "MEASURE {n} hold: a lowering helped {:.1} s after the neighbour was switched on, {:.1} s after the pods were capped (try {}): {}",
                    h.0 - on,
                    h.0 - capped,
                    tries.len() + 1,
                    h.1
                );
                return (h.0, on);
            }
            if !j.claims.is_empty() && j.settled() {
                break format!(
                    "every lowering checked, none holding: {:?}; ends: {:?}",
                    j.checks.iter().map(|(_, l)| l).collect::<Vec<_>>(),
                    j.ends.iter().map(|(_, l)| l).collect::<Vec<_>>()
                );
            }
            // A lowering still applying or measured (a follow-up after one
            // that helped among them) is waited for, up to 35 s more.
            let waited = if j.settled() {
                until
            } else {
                until + Duration::from_secs(35)
            };
            if Instant::now() >= waited.min(deadline) {
                break format!(
                    "{} lowering(s) made for a displaced pod, {} checked in {:.0} s",
                    j.claims.len(),
                    j.checks.len(),
                    guest_now(node).await - on
                );
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        };
        eprintln!(
            "MEASURE {n} hold: try {} found no hold: {outcome}; svc since: {}; the neighbour's waits (s, displaced, usage, owed; m): {}",
            tries.len() + 1,
            resized_since(agent, svc_name, on)
                .await
                .iter()
                .map(|(t, l)| format!(
                    "{:+.1}s {}",
                    t - on,
                    l.split("why=")
                        .nth(1)
                        .unwrap_or(l)
                        .chars()
                        .take(60)
                        .collect::<String>()
                ))
                .collect::<Vec<_>>()
                .join(" | "),
            neighbour_waits(agent, on).await
        );
        tries.push(outcome);
        if Instant::now() + Duration::from_secs(70) > deadline {
            panic!(
                "{n}: no lowering of svc for the neighbour held in {} tries: {tries:?}\nthe agent on svc:\n{}",
                tries.len(),
                history_of(agent, svc_name, first).await
            );
        }
    }
}

/// The CPU quota [`pods_quota`] gives kubepods when [`helped_hold`] wants
/// the neighbour owed: about what the pods get beside the emulated node's
/// own processes.
const PODS_QUOTA_M: u64 = 1300;

/// Sets the node's kubepods `cpu.max` to `quota_m` (`None`: `max`, as the
/// kubelet leaves it): with the systemd driver through systemd
/// (`CPUQuota` of the slice, which systemd would otherwise write back), with
/// cgroupfs directly (the kubelet writes only kubepods' weight). The agent
/// takes a finite kubepods `cpu.max` as the node's capacity.
///
/// Why [`helped_hold`] caps the pods: under emulation the node's own
/// processes (kubelet, containerd, journald, sshd) take 500–700m of the
/// 2 CPUs, and the agent cannot see it there — the root cgroup's usage,
/// counted in ticks, which the overloaded guest loses, read 1,077–1,414m
/// while kubepods alone used 1,309–1,713m and `/proc/stat` counted no idle
/// tick (2026-12-07). So it took the CPU those processes used for idle,
/// found 300–700m free beside the neighbour's wait of 150–400m a second,
/// and owed it nothing in 28 of 30 seconds: the wait of a pod beside idle
/// CPU is wake-up latency. With the pods' capacity at what they can get,
/// the wait is on a node with nothing free, as on a node whose
/// allocatable reserves the system's CPU.
async fn pods_quota(node: &NodeVm, quota_m: Option<u64>) {
    let cmd = pods_quota_cmd(node, quota_m);
    let out = node.sh(&cmd).await.expect("set kubepods cpu.max");
    let want = quota_m.map_or("max 100000".to_string(), |m| format!("{} 100000", m * 100));
    assert_eq!(
        out.trim(),
        want,
        "{}: kubepods cpu.max after `{cmd}`",
        node.name()
    );
}

/// [`pods_quota`]'s command, which prints kubepods' `cpu.max` after.
fn pods_quota_cmd(node: &NodeVm, quota_m: Option<u64>) -> String {
    let kp = node.spec.kubepods_path();
    match (node.spec.driver, quota_m) {
        (testkit::node_vm::CgroupDriver::Systemd, q) => format!(
            "systemctl set-property --runtime \"$(basename {kp})\" CPUQuota={} && cat {kp}/cpu.max",
            q.map_or(String::new(), |m| format!("{}%", m / 10))
        ),
        (testkit::node_vm::CgroupDriver::Cgroupfs, q) => format!(
            "echo {} > {kp}/cpu.max && cat {kp}/cpu.max",
            q.map_or("max".to_string(), |m| format!("{} 100000", m * 100))
        ),
    }
}

/// Where [`hold_sampled`] has the neighbour's usage sampled.
const HOLD_SAMPLES: &str = "/run/headroom-test/nbr-usage";

/// A hold in force now, with nothing in flight ([`helped_hold`] within
/// 300 s, then [`hold_now`]), and the neighbour's cgroup `nbr_dir` sampled
/// into [`HOLD_SAMPLES`] from then on: the check's time, and the guest's
/// clock once the sampler runs (what the event that should end the hold is
/// timed from).
async fn hold_sampled(
    api: &Api<Pod>,
    agent: &GuestAgent<'_>,
    other: &str,
    svc_name: &str,
    nbr_dir: &str,
) -> (f64, f64) {
    let found = helped_hold(api, agent, other, svc_name).await;
    let (helped_at, _) = hold_now(api, agent, other, svc_name, found).await;
    start_sampler(agent.node, nbr_dir, HOLD_SAMPLES, 90).await;
    (helped_at, guest_now(agent.node).await)
}

/// Issue 47: a lowering that helped stops holding within 3 ticks (1 s
/// each) of its owed pod going above its request, and of it leaving the
/// node. One node, the agent at its defaults but a 5 s raise cooldown (svc
/// is raised before each hold; the cooldown plays no part in a hold's
/// end):
/// 1. a managed svc (request 500m, ceiling 1300m, 4 busy threads) raised
///    beside an idle unmanaged neighbour (800m/800m, another namespace);
///    the neighbour's one busy thread switched on, then the pods capped
///    ([`pods_quota`]): displaced within its request on a short node, svc
///    lowered for it, the lowering found to help (tries);
/// 2. the cap lifted, the neighbour's limit raised to 1600m through
///    `resize` and 2 threads:
///    from the first 1 s window its usage is above its request + 50m (read
///    in the guest every 0.25 s), the hold ends within 3 s
///    (`reason=above_request` where logged);
/// 3. the neighbour back at 800m, a hold again, then the neighbour deleted
///    (grace 0): the hold ends within 3 s of the deletion, so of its
///    cgroup going too, which the kubelet removes seconds later
///    (`reason=owed_left`).
#[allow(clippy::too_many_lines)]
async fn hold_end_on(c: &RealCluster, node: &NodeVm) {
    let start = Instant::now();
    let client = c.cp.client().await;
    let n = node.name();
    let ns = c.cp.namespace(&format!("hold-{n}")).await;
    let other = c.cp.namespace(&format!("owed-{n}")).await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let nbr: Api<Pod> = Api::namespaced(client.clone(), &other);
    make_ctl(node, &ns, "svc").await;
    make_ctl(node, &other, "nbr").await;
    let mut svc = switched("svc", n, &ns, "500m", "1000m");
    // About what the slack leaves it beside the busy neighbour (1100–
    // 1300m): raised higher, the slack lowered it as the neighbour started,
    // a resize in flight when the pods were capped, and the next patch came
    // for the slack alone (see `helped_hold`). Lower (1100m), the lowering
    // made for the neighbour under the cap took little of what svc used
    // (gains of 38–51m).
    svc["metadata"]["annotations"] = json!({"headroom.dev/ceiling": "1300m"});
    create(&api, svc).await;
    create(&nbr, switched_adding("nbr", n, &other, "800m", "800m")).await;
    wait_running(&api, "svc", POD_START).await;
    let nbr_pod = wait_running(&nbr, "nbr", POD_START).await;
    let nbr_dir = node
        .pod_cgroup(nbr_pod.metadata.uid.as_deref().expect("uid"))
        .await
        .expect("pod cgroup");
    let up = start.elapsed().as_secs_f64();
    // A 5 s raise cooldown: each try raises svc and lowers it again, a
    // flap that doubles the cooldown up to 8 times (with the agent's 15 s,
    // svc waited 2 minutes at 690m for its raise before a try, 2026-12-07).
    let agent = GuestAgent::start(
        node,
        &[
            "--tick".into(),
            "1s".into(),
            "--raise-cooldown".into(),
            "5s".into(),
            "--drift-grace".into(),
            "180s".into(),
        ],
    )
    .await
    .expect("agent starts");
    let svc_name = format!("{ns}/svc");
    set_threads(node, &ns, "svc", 4).await;
    // How late a hold may end: 3 ticks of 1 s. The agent reads the owed
    // pod every tick while its claim holds and ends the hold in the tick
    // that reads it above its request (or gone); the first 1 s window
    // above read here (every 0.25 s) ends within a sample of the first tick
    // whose interval shows it (one run's hold ended 0.10 s before it), so
    // the agent needs 1 tick and a scan; the rest is the issue's bound, no
    // slack beyond it.
    let bound = 3.0;
    let over_m = 800 + headroom::signal::contention::MIN_OWED_M;

    // 1.–2. A hold, then the neighbour above its request.
    let (helped_at, fired) = hold_sampled(&api, &agent, &other, &svc_name, &nbr_dir).await;
    // The pods' cap off: at 1600m with 2 threads beside svc held at 500m
    // the neighbour must find more than 850m.
    pods_quota(node, None).await;
    resize(&nbr, "nbr", &limit_patch(1600), false)
        .await
        .expect("resize the neighbour to 1600m");
    set_threads(node, &other, "nbr", 2).await;
    let end = wait_hold_end(&agent, &svc_name, helped_at, Duration::from_secs(60)).await;
    let usage = usage_per_second(&stop_sampler(node, HOLD_SAMPLES).await);
    // Idle again at once: at 1600m with two threads beside svc raised
    // again it fell back within its request, and a lowering made for it
    // then bought nothing (cold CI of 53fe26a), a strike that doubled the
    // block of the next one that did.
    set_threads(node, &other, "nbr", 0).await;
    let above = usage.iter().find(|(_, m)| *m > over_m).copied();
    let figures = usage
        .iter()
        .map(|(t, m)| format!("{:+.2}s {m}m", t - fired))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!(
        "MEASURE {n} above request: the neighbour's usage per 1 s window from the resize: {figures}"
    );
    let Some((end_at, end_line)) = end else {
        panic!(
            "{n}: the hold never ended within 60 s of the neighbour's resize to 1600m (first 1 s above {over_m}m: {above:?}); usage: {figures}\nthe agent on svc:\n{}",
            history_of(&agent, &svc_name, helped_at - 60.0).await
        );
    };
    assert!(
        end_at >= fired,
        "{n}: the hold ended {:.1} s before the neighbour was resized, not for it: {end_line}",
        fired - end_at
    );
    let Some((above_at, above_m)) = above else {
        panic!(
            "{n}: the neighbour never used above its request + {}m ({over_m}m) at a 1600m limit with 2 threads (the node full); its usage per 1 s: {figures}; the hold ended anyway: {end_line}",
            headroom::signal::contention::MIN_OWED_M
        );
    };
    eprintln!(
        "MEASURE {n} above request: first 1 s above {over_m}m ({above_m}m) {:.2} s after the resize; hold ended {:.2} s after that: {end_line}",
        above_at - fired,
        end_at - above_at
    );
    assert_eq!(
        hold_end_reason(&end_line),
        Some("above_request"),
        "{n}: the hold ended {:+.2} s from the neighbour's usage going above {over_m}m, for another reason: {end_line}; usage: {figures}",
        end_at - above_at
    );
    if end_at - above_at > bound {
        panic!(
            "{n}: the hold ended {:.2} s after the neighbour's usage went above its request (bound {bound} s, 3 ticks){}: {end_line}; usage: {figures}\nthe agent on svc:\n{}",
            end_at - above_at,
            follow_up(&agent, &svc_name, helped_at, end_at).await,
            history_of(&agent, &svc_name, helped_at - 60.0).await
        );
    }

    // 3. Back within its request, a hold again; then the neighbour leaves.
    resize(&nbr, "nbr", &limit_patch(800), false)
        .await
        .expect("resize the neighbour back to 800m");
    applied(&nbr, &agent, "nbr").await;
    let (helped_at, deleted) = hold_sampled(&api, &agent, &other, &svc_name, &nbr_dir).await;
    nbr.delete(
        "nbr",
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("delete the neighbour");
    let end = wait_hold_end(&agent, &svc_name, helped_at, Duration::from_secs(30)).await;
    // The kubelet took 14–24 s to remove the cgroup of a pod deleted with
    // grace 0 (2026-12-07).
    let until = Instant::now() + Duration::from_secs(60);
    while !read_sampler(node, HOLD_SAMPLES)
        .await
        .last()
        .is_some_and(|(_, u)| u.is_none())
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let samples_read = stop_sampler(node, HOLD_SAMPLES).await;
    let gone_at = samples_read
        .iter()
        .find(|(_, u)| u.is_none())
        .map(|(t, _)| *t);
    let Some((end_at, end_line)) = end else {
        panic!(
            "{n}: the hold never ended within 30 s of the neighbour's deletion (its cgroup gone {:?} s after)\nthe agent on svc:\n{}",
            gone_at.map(|g| g - deleted),
            history_of(&agent, &svc_name, helped_at - 60.0).await
        );
    };
    assert!(
        end_at >= deleted,
        "{n}: the hold ended {:.1} s before the neighbour was deleted, not for it: {end_line}",
        deleted - end_at
    );
    let Some(gone_at) = gone_at else {
        panic!(
            "{n}: the neighbour's cgroup {nbr_dir} was still there 60 s after its deletion (the hold ended {:.1} s after it: {end_line})",
            end_at - deleted
        );
    };
    eprintln!(
        "MEASURE {n} owed pod left: cgroup gone {:.2} s after the delete, hold ended {:.2} s after the delete ({:+.2} s from the cgroup going): {end_line}",
        gone_at - deleted,
        end_at - deleted,
        end_at - gone_at
    );
    assert_eq!(
        hold_end_reason(&end_line),
        Some("owed_left"),
        "{n}: the hold ended {:+.2} s from the neighbour's cgroup going, for another reason: {end_line}",
        end_at - gone_at
    );
    // The agent learns the pod left from its watch of the API, where a
    // deletion with grace 0 removes it at once; the kubelet removes its
    // cgroup seconds later. Both bounds: from the cgroup going, and from
    // the deletion (stamped before the DELETE was sent, so the request and
    // the watch's delivery to the agent count against it).
    let late = (end_at - gone_at).max(end_at - deleted);
    if late > bound {
        panic!(
            "{n}: the hold ended {:.2} s after the neighbour's deletion and {:+.2} s from its cgroup going (bound {bound} s, 3 ticks){}: {end_line}\nthe agent on svc:\n{}",
            end_at - deleted,
            end_at - gone_at,
            follow_up(&agent, &svc_name, helped_at, end_at).await,
            history_of(&agent, &svc_name, helped_at - 60.0).await
        );
    }
    pods_quota(node, None).await;
    agent.stop().await.expect("agent stops");
    cleanup(&client, &[ns.as_str(), other.as_str()]).await;
    let _ = node.sh("rm -rf /run/headroom-test").await;
    eprintln!(
        "MEASURE {n} hold ends: pods up in {up:.0} s, scenario done in {:.0} s",
        start.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tier"),
    ignore = "scripts/test --full until it passes reliably: 3 of its last 11 runs failed, 4 passes in a row since (2026-12-07; ten in a row to return: docs/development.md)"
)]
async fn a_lowering_that_helped_stops_holding_within_3_ticks_once_its_owed_pod_leaves_or_goes_above_its_request()
 {
    on_every_node_with_agents(hold_end_on).await;
}

/// Drift grace of the drift scenario: nothing is resized there, so no kubelet
/// latency to cover; the waits below allow twice this.
const DRIFT_GRACE: Duration = Duration::from_secs(45);

/// An out-of-band write to a container's cpu.max on the real node is drift.
async fn drift_on(c: &RealCluster, node: &NodeVm) {
    let client = c.cp.client().await;
    let ns = c.cp.namespace(&format!("drift-{}", node.name())).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Not opted in: audited, never resized, so only the write changes cpu.max.
    create(
        &api,
        app_pod(
            "victim",
            node.name(),
            json!({"cpu": "100m"}),
            json!({"cpu": "200m"}),
        ),
    )
    .await;
    let p = wait_running(&api, "victim", POD_START).await;
    let agent = GuestAgent::start(node, &vm_agent_args_with_grace(DRIFT_GRACE))
        .await
        .expect("agent starts");
    let uid = p.metadata.uid.clone().expect("uid");
    let id = testkit::node_vm::container_ids(&p)
        .remove("app")
        .expect("id");
    let dir = node.pod_cgroup(&uid).await.expect("pod cgroup");
    node.sh(&format!("echo '12345 100000' > {dir}/*{id}*/cpu.max"))
        .await
        .expect("write");
    let labels = [("namespace", ns.as_str()), ("pod", "victim")];
    wait_scrape(
        &agent,
        DRIFT_GRACE * 2 + Duration::from_secs(30),
        "no drift reported",
        |s| metric(s, "headroom_cgroup_drift", &labels) == Some(1.0),
    )
    .await;
    node.sh(&format!("echo '20000 100000' > {dir}/*{id}*/cpu.max"))
        .await
        .expect("restore");
    wait_scrape(
        &agent,
        DRIFT_GRACE * 2 + Duration::from_secs(30),
        "drift never cleared",
        |s| metric(s, "headroom_cgroup_drift", &labels).unwrap_or(0.0) == 0.0,
    )
    .await;
    agent.stop().await.expect("agent stops");
    cleanup(&client, &[ns.as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tier"),
    ignore = "scripts/test --full; in CI the DaemonSet scenario reports a hand-written cpu.max as drift"
)]
async fn agent_in_the_vm_reports_an_out_of_band_cpu_max_write_as_drift() {
    on_every_node_with_agents(drift_on).await;
}

// ---------------------------------------------------------------------------
// No orphans: VMs (and the full control plane) die with the test process.

const ORPHAN_MODE: &str = "HEADROOM_VM_ORPHAN_MODE";
const PIDS_LINE: &str = "VM-ORPHAN-PIDS";

// ---------------------------------------------------------------------------
// Installed as users install it: the image built without Docker, imported
// into each node's containerd; `kubectl apply -k deploy/`; the DaemonSet's
// pods started by the real kubelets; the scenarios tests/kind/run.sh runs on
// kind, here through the same runner; rollout and uninstall.

const AGENT_IMAGE: &str = "docker.io/library/headroom-agent:0.1.0";
const AGENT_IMAGE_NEXT: &str = "docker.io/library/headroom-agent:0.1.0-next";

// ---------------------------------------------------------------------------
// Restarts on a real node while the agent runs.

/// The agent's counters of resizes by result (summed over directions).
fn resizes(s: &prometheus_parse::Scrape, result: &str) -> f64 {
    metric(s, "headroom_resizes_total", &[("result", result)]).unwrap_or(0.0)
}

/// Scrapes every 2 s for `secs`: the drift gauge of `ns` must stay 0.
async fn no_drift_for(agent: &GuestAgent<'_>, ns: &str, secs: u64) {
    for _ in 0..secs / 2 {
        let s = scrape(agent).await;
        let drift = metric(&s, "headroom_cgroup_drift", &[("namespace", ns)]).unwrap_or(0.0);
        assert_eq!(
            drift,
            0.0,
            "{}: false drift:\n{}",
            agent.node.name(),
            agent.log_tail(40).await
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Starts the agent on `node` while a file that does not parse is mounted
/// over kubepods' `cpu.stat`: every tick is skipped and counted
/// (`kind="kubepods"`), nothing is patched (`pod` keeps generation 1). Then
/// unmounts it: the agent reads kubepods again and raises `pod` above 300m.
/// Returns the agent, the raised pod and the time from the unmount to the raise.
async fn start_over_unreadable_kubepods<'a>(
    node: &'a NodeVm,
    api: &Api<Pod>,
    pod: &str,
) -> (GuestAgent<'a>, Pod, Duration) {
    let n = node.name();
    let stat = format!("{}/cpu.stat", node.spec.kubepods_path());
    node.sh(&format!(
        "printf 'garbage\\n' > /run/garbage-stat && mount --bind /run/garbage-stat {stat}"
    ))
    .await
    .expect("mount over kubepods cpu.stat");
    let agent = GuestAgent::start(node, &vm_agent_args())
        .await
        .expect("agent starts");
    let kubepods_errors = |s: &prometheus_parse::Scrape| {
        metric(s, "headroom_scan_errors_total", &[("kind", "kubepods")]).unwrap_or(0.0)
    };
    let s = wait_scrape(
        &agent,
        Duration::from_secs(90),
        "ticks over an unreadable kubepods were never counted",
        |s| kubepods_errors(s) >= 3.0,
    )
    .await;
    assert_eq!(
        resizes(&s, "applied"),
        0.0,
        "{n}: patched over an unreadable kubepods"
    );
    let untouched = api.get(pod).await.expect("get");
    assert_eq!(untouched.metadata.generation, Some(1), "{n}: resized blind");
    // Busy for as long as anyone has the file open: the agent between its
    // read and the parse that makes it drop the handle, the kubelet's own
    // stats. Once on the 6.12 reboot node (2026-12-07) the one try met that.
    node.sh(&format!(
        "for i in $(seq 20); do umount {stat} && exit 0; sleep 0.5; done; exit 1"
    ))
    .await
    .expect("umount kubepods cpu.stat (20 tries in 10 s)");
    let mended = Instant::now();
    let raised = wait_raised_above_300m(api, &agent, pod).await;
    let took = mended.elapsed();
    let log = agent.log_tail(200).await;
    assert!(!log.contains("panicked"), "{n}: agent panicked:\n{log}");
    (agent, raised, took)
}

/// kubepods' `cpu.stat` and `cpu.pressure` made unreadable to the DaemonSet
/// agent (mode 000: it runs without CAP_DAC_OVERRIDE, the kubelet as root
/// still reads them, and a mode set on the host holds in every mount of the
/// hierarchy, the container's too), then the kubelet restarted:
/// - the running agent reads on through the handles it keeps open (no
///   kubepods error counted over 10 s): a mode, like a mount, is checked at
///   open only;
/// - its process killed, the kubelet restarts its container once (liveness
///   holds), and the new process, which must open the files, counts and
///   skips each tick (≥ 3): no pod of `api` patched or below its request
///   (200m) meanwhile;
/// - the files readable again, the count stops rising.
///
/// Returns what it measured, for the MEASURE line.
async fn unreadable_kubepods_on(
    node: &NodeVm,
    client: &kube::Client,
    agent: &GuestAgent<'_>,
    api: &Api<Pod>,
) -> String {
    let n = node.name();
    let kp = node.spec.kubepods_path();
    let files = format!("{kp}/cpu.stat {kp}/cpu.pressure");
    let modes = node
        .sh(&format!("stat -c '%a %n' {files}"))
        .await
        .expect("modes of kubepods' files");
    let restore = modes
        .lines()
        .map(|l| format!("chmod {l}"))
        .collect::<Vec<_>>()
        .join(" && ");
    let kubepods_errors = |s: &prometheus_parse::Scrape| {
        metric(s, "headroom_scan_errors_total", &[("kind", "kubepods")]).unwrap_or(0.0)
    };
    let agent_restarts = || async {
        let p = testkit::node_vm::daemonset::agent_pod(client, n)
            .await
            .expect("list")
            .expect("agent pod");
        (p.metadata.uid.clone(), restart_count(&p))
    };
    let (uid, restarts) = agent_restarts().await;
    let before = kubepods_errors(&scrape(agent).await);
    let blinded = Instant::now();
    node.sh(&format!("chmod 000 {files} && systemctl restart kubelet"))
        .await
        .expect("kubepods unreadable, kubelet restarted");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let kept = try_scrape(agent).await.map(|s| kubepods_errors(&s));
    // The new process must open them. Polled here rather than with
    // `wait_scrape`, whose panic would skip the restore below.
    let killed = node.sh("pkill -KILL -x headroom-agent").await;
    // The pods' generations once the running agent is gone: it still reads
    // kubepods through its open handles and may rightly patch until then;
    // only the restarted process, which cannot read them, must not.
    let gens: Vec<(String, Option<i64>)> = api
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.metadata.generation,
            )
        })
        .collect();
    let mut counted = None;
    while killed.is_ok() && blinded.elapsed() < Duration::from_secs(150) {
        let (u, r) = agent_restarts().await;
        if u == uid
            && r > restarts
            && let Ok(s) = agent.scrape().await
            && kubepods_errors(&s) >= 3.0
        {
            counted = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Readable again before any assertion, so a failure leaves no fault.
    node.sh(&restore).await.expect("kubepods' modes restored");
    let blind_for = blinded.elapsed();
    killed.expect("kill the agent's process");
    assert_eq!(
        kept.as_ref().ok(),
        Some(&before),
        "{n}: the running agent counted kubepods errors (its handles are open): {kept:?}"
    );
    let Some(counted) = counted else {
        panic!(
            "{n}: the restarted agent did not count 3 skipped ticks within 150 s:\n{}",
            agent.log_tail(40).await
        )
    };
    let skipped = kubepods_errors(&counted);
    assert_eq!(
        resizes(&counted, "applied"),
        0.0,
        "{n}: patched over an unreadable kubepods"
    );
    for (name, generation) in &gens {
        let p = api.get(name).await.expect("get");
        assert_eq!(
            p.metadata.generation, *generation,
            "{n}: {name} patched over an unreadable kubepods"
        );
        assert!(
            app_limit_m(&p).is_some_and(|m| m >= 200),
            "{n}: {name} below its request: {:?}",
            app_limit_m(&p)
        );
    }
    // Scanning again: the count stops rising (two scrapes 5 s apart agree).
    let mended = Instant::now();
    let mut last = kubepods_errors(&scrape(agent).await);
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = kubepods_errors(&scrape(agent).await);
        if now == last {
            break;
        }
        assert!(
            mended.elapsed() < Duration::from_secs(60),
            "{n}: kubepods errors still rising 60 s after its files were readable again ({now}):\n{}",
            agent.log_tail(40).await
        );
        last = now;
    }
    assert_eq!(
        agent_restarts().await,
        (uid, restarts + 1),
        "{n}: the agent's container restarted other than once (the kill), or its pod was replaced"
    );
    format!(
        "running agent: {} kubepods errors in 10 s; restarted agent: {skipped:.0} ticks skipped, {blind_for:.1?} unreadable in all; scanning again {:.1?} after",
        kept.map_or(-1.0, |k| k - before),
        mended.elapsed()
    )
}

/// The agent as its DaemonSet runs it (deploy/, with [`vm_agent_args`] added
/// as a user's overlay would), on every node at once:
/// 1. The kubelet stopped, then a pod opted in: the agent's resize PATCH
///    waits in the API (no `cpu.max` change, no second patch), applies once
///    the kubelet is back, and is verified, without drift.
/// 2. containerd restarted right after the agent's next PATCH (a pod opted in
///    then): the kubelet's update fails while it is down and is retried; the
///    resize applies and is verified, no drift reported, no container
///    restarted (the agent's own neither: its shim outlives containerd).
/// 3. kubepods' files unreadable while the kubelet restarts, and the agent
///    restarted then ([`unreadable_kubepods_on`]): each tick of the new
///    process counted and skipped, no patch, no limit below its request, no
///    panic, scanning resumes.
///
/// Every patch is one generation bump (no duplicates).
async fn restarts_on(c: &RealCluster, node: &NodeVm) {
    let n = node.name();
    let client = c.cp.client().await;
    let ns = c.cp.namespace(&format!("restart-{n}")).await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for name in ["kubelet-down", "containerd-down"] {
        let mut p = burner(name, n, "200m", "300m", 1);
        p["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
        create(&api, p).await;
    }
    let first = wait_running(&api, "kubelet-down", POD_START).await;
    let second = wait_running(&api, "containerd-down", POD_START).await;
    let agent = GuestAgent::daemonset_pod(node, client.clone(), Duration::from_secs(300))
        .await
        .expect("the agent's pod is Ready");
    let agent_pod = testkit::node_vm::daemonset::agent_pod(&client, n)
        .await
        .expect("list")
        .expect("agent pod");
    let agent_restarts = restart_count(&agent_pod);
    let opt_in_pod = |name: &'static str| {
        let api = api.clone();
        async move {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"headroom.dev/managed": "true"}}}),
                ),
            )
            .await
            .expect("opt in");
        }
    };

    // Pods an earlier cleanup force-deleted run until the kubelet's next
    // sync: with the kubelet stopped they would run on, and their load would
    // lower these pods instead of raising them. Wait for only these two and
    // the agent's.
    let pods = format!(
        "find {} -mindepth 1 -maxdepth 2 -type d -name '*pod[0-9a-f]*'",
        node.spec.kubepods_path()
    );
    // Bounded by the guest's clock, inside `sh`'s own 180 s.
    let alone = node
        .sh(&format!(
            "end=$(( $(date +%s) + 150 )); while [ $(date +%s) -lt $end ]; do \
               [ $({pods} | wc -l) -le 3 ] && exit 0; sleep 1; done; {pods}; exit 1"
        ))
        .await;
    if let Err(e) = alone {
        // Which pods: the API's on this node beside the cgroups that run.
        let on_node: Vec<String> = Api::<Pod>::all(client.clone())
            .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={n}")))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .map(|p| {
                        format!(
                            "{}/{} uid {}",
                            p.metadata.namespace.as_deref().unwrap_or_default(),
                            p.metadata.name.as_deref().unwrap_or_default(),
                            p.metadata.uid.as_deref().unwrap_or_default()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        panic!(
            "{n}: pod cgroups other than this test's two and the agent's still run after 150 s:\n{e:#}\nthe API's pods on {n}: {on_node:#?}"
        );
    }

    // 1. The kubelet down when the agent patches.
    node.sh("systemctl stop kubelet")
        .await
        .expect("stop kubelet");
    let stopped = Instant::now();
    opt_in_pod("kubelet-down").await;
    let raised = wait_raised_above_300m(&api, &agent, "kubelet-down").await;
    let limit = app_limit_m(&raised).expect("limit");
    // Nothing applies it while the kubelet is down, and no second patch goes.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let held = api.get("kubelet-down").await.expect("get");
    assert_eq!(
        held.metadata.generation, raised.metadata.generation,
        "{n}: a second patch while the first waits"
    );
    let got = node.pod_cpu_max(&first).await.expect("read");
    assert_eq!(
        got.containers.get("app").map(String::as_str),
        Some("30000 100000"),
        "{n}: applied with the kubelet down?"
    );
    let down_for = stopped.elapsed();
    let back = Instant::now();
    node.sh("systemctl start kubelet")
        .await
        .expect("start kubelet");
    let want = format!("{} 100000", limit * 100);
    node.wait_cpu_max(&held, "app", &want, KUBELET_APPLY)
        .await
        .expect("the resize applies after the kubelet restart");
    let s = wait_scrape(
        &agent,
        RESIZE_GRACE + Duration::from_secs(30),
        "the resize held over the kubelet restart never verified",
        |s| resizes(s, "verified") >= 1.0,
    )
    .await;
    let kubelet_converged = back.elapsed();
    assert_eq!(resizes(&s, "unverified"), 0.0, "{n}: unverified");
    no_drift_for(&agent, &ns, 10).await;

    // 2. containerd restarted right after a PATCH.
    let restarts = restart_count(&second);
    opt_in_pod("containerd-down").await;
    let raised2 = wait_raised_above_300m(&api, &agent, "containerd-down").await;
    let at = Instant::now();
    node.sh("systemctl restart containerd")
        .await
        .expect("restart containerd");
    let limit2 = app_limit_m(&raised2).expect("limit");
    node.wait_cpu_max(
        &raised2,
        "app",
        &format!("{} 100000", limit2 * 100),
        KUBELET_APPLY,
    )
    .await
    .expect("the resize applies after the containerd restart");
    wait_scrape(
        &agent,
        RESIZE_GRACE + Duration::from_secs(30),
        "the resize over the containerd restart never verified",
        |s| resizes(s, "verified") >= 2.0,
    )
    .await;
    let containerd_converged = at.elapsed();
    no_drift_for(&agent, &ns, 20).await;
    let s = scrape(&agent).await;
    assert_eq!(resizes(&s, "unverified"), 0.0, "{n}: unverified");

    let mut bumps = 0;
    for p in ["kubelet-down", "containerd-down"] {
        let pod = api.get(p).await.expect("get");
        bumps += pod.metadata.generation.unwrap_or(1) - 1;
        if p == "containerd-down" {
            assert_eq!(restart_count(&pod), restarts, "{n}: {p} restarted");
        }
    }
    let agent_after = testkit::node_vm::daemonset::agent_pod(&client, n)
        .await
        .expect("list")
        .expect("agent pod");
    assert_eq!(
        (
            agent_after.metadata.uid.as_deref(),
            restart_count(&agent_after)
        ),
        (agent_pod.metadata.uid.as_deref(), agent_restarts),
        "{n}: the agent's pod was replaced or its container restarted"
    );
    assert_eq!(
        resizes(&s, "applied"),
        bumps as f64,
        "{n}: patches applied = generation bumps (no duplicates)"
    );
    let log = agent.log_tail(2000).await;
    assert!(!log.contains("panicked"), "{n}: agent panicked:\n{log}");

    // 3. kubepods' files unreadable across a kubelet restart, and the agent
    //    restarted meanwhile.
    let blind = unreadable_kubepods_on(node, &client, &agent, &api).await;
    let log = agent.log_tail(2000).await;
    assert!(!log.contains("panicked"), "{n}: agent panicked:\n{log}");
    for l in log
        .lines()
        .filter(|l| l.contains("resized") || l.contains("pod displaced"))
    {
        eprintln!("{n} agent: {l}");
    }
    eprintln!(
        "MEASURE {n} restarts (DaemonSet agent): kubelet down {down_for:.1?}, back → verified {kubelet_converged:.1?}; containerd restart → verified {containerd_converged:.1?}; kubepods unreadable across a kubelet restart: {blind}; {bumps} patches"
    );
    cleanup(&client, &[ns.as_str()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemonset_agent_survives_kubelet_and_containerd_restarts_mid_resize() {
    let Some(c) = cluster() else { return };
    let _serial = serial(c).await;
    c.install_daemonset(&vm_agent_args())
        .await
        .expect("kubectl apply deploy/");
    futures::future::join_all(c.nodes.iter().map(|n| restarts_on(c, n))).await;
    c.uninstall_daemonset()
        .await
        .expect("kubectl delete deploy/");
}

// ---------------------------------------------------------------------------
// The static CPU manager (docs/kubelet-behaviour.md §10), on a node of its own.

/// A cluster of one node of its own, under the one lock (the shared
/// cluster's tests wait, its VMs idle meanwhile), and when it started (after
/// the lock); `None` with a SKIP line where qemu cannot run.
async fn own_node(
    spec: testkit::node_vm::NodeSpec,
) -> Option<(tokio::sync::MutexGuard<'static, ()>, RealCluster, Instant)> {
    if let Some(why) = testkit::node_vm::skip_reason() {
        eprintln!("SKIP: {why}");
        return None;
    }
    TIER_START.get_or_init(Instant::now);
    let serial = SERIAL.lock().await;
    timing("starts");
    let started = Instant::now();
    let name = spec.name.clone();
    let c = RealCluster::start(vec![spec])
        .await
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    Some((serial, c, started))
}

/// A node whose first boot cannot start its kubelet (a unit it requires,
/// `headroom-node.service`, masked on that boot's kernel command line: the
/// kubelet's start fails with result `dependency`, as it did in a run whose
/// 9p mount failed 21.8 s into the boot and whose cluster then waited its
/// whole 420 s for Ready) is found out within seconds of ssh, booted once
/// more on the clean command line, and comes up Ready: the harness's
/// [`BootFault`](testkit::node_vm::BootFault) path, end to end. (Masking the
/// mount itself does not do it: `headroom-node-setup` mounts what is missing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-tier"),
    ignore = "scripts/test --full: a boot of its own (~2 min) for a path that runs only when the emulated machine fails a boot"
)]
async fn a_node_whose_first_boot_cannot_start_its_kubelet_is_booted_again_and_comes_up() {
    let mut spec = testkit::node_vm::NodeSpec::cgroupfs("node-again", 3);
    spec.first_boot_fault = Some("systemd.mask=headroom-node.service".into());
    let Some((_serial, c, started)) = own_node(spec).await else {
        return;
    };
    let node = &c.nodes[0];
    assert_eq!(
        node.boots(),
        2,
        "booted once more after the kubelet's fault"
    );
    let cmdline = node.sh("cat /proc/cmdline").await.expect("cmdline");
    assert!(
        !cmdline.contains("systemd.mask"),
        "the second boot runs the clean command line: {cmdline}"
    );
    let kubelet = node
        .sh("systemctl is-active kubelet.service")
        .await
        .expect("kubelet state");
    assert_eq!(kubelet.trim(), "active");
    eprintln!(
        "MEASURE boot again: Ready {:.1?} after the first qemu start (cluster start {:.1?})",
        c.boot_times[0].2,
        started.elapsed()
    );
}

/// `cpuset.cpus.effective` of container `name` of `pod` on a real node.
async fn real_cpuset(node: &NodeVm, pod: &Pod, name: &str) -> String {
    let uid = pod.metadata.uid.as_deref().expect("uid");
    let dir = node.pod_cgroup(uid).await.expect("pod cgroup");
    let id = testkit::node_vm::container_ids(pod)
        .remove(name)
        .expect("container id");
    node.sh(&format!("cat {dir}/*{id}*/cpuset.cpus.effective"))
        .await
        .expect("read cpuset")
        .trim()
        .to_string()
}

/// A 3-CPU node with `cpuManagerPolicy: static` (kubeReserved 100m: CPU 0
/// stays shared) running a Guaranteed pod with 2 whole CPUs (exclusive) and a
/// managed Burstable pod with 2 busy threads: the kubelet confines the
/// Burstable pod to the one CPU left, the simulator lays out the same
/// cpusets (parity), and the agent's capacity is that pool (1000m, not
/// allocatable's 2900m), so it never raises the pod above 1000m (its default
/// ceiling, 4 × 400m, would be 1600m) while the kernel gives it at most one CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_cpu_manager_node_never_raises_a_managed_pod_above_the_shared_pool() {
    let mut spec = testkit::node_vm::NodeSpec::cgroupfs("node-static", 3)
        .with_suite(testkit::node_vm::Suite::Trixie);
    spec.cpus = 3;
    spec.static_cpu_manager = Some("100m".into());
    let Some((_serial, c, started)) = own_node(spec).await else {
        return;
    };
    let node = &c.nodes[0];
    let client = c.cp.client().await;
    let n: k8s_openapi::api::core::v1::Node = Api::all(client.clone())
        .get(node.name())
        .await
        .expect("node");
    let alloc = n
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get("cpu").cloned())
        .expect("allocatable");
    assert_eq!(alloc.0, "2900m", "3 CPUs less kubeReserved 100m");

    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = SimConfig::new("sim-static", dir.path().join("cg"));
    cfg.layout = SimLayout::Cgroupfs;
    cfg.allocatable_cpu_m = 2900;
    cfg.static_cpu_manager = Some(testkit::kubelet_sim::StaticCpuManager {
        cpus: 3,
        reserved: 1,
    });
    let sim = SimKubelet::start(client.clone(), cfg)
        .await
        .expect("sim starts");
    c.cp.wait_node_admissible("sim-static")
        .await
        .expect("sim node admissible");

    let ns = c.cp.namespace("static").await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let excl = |name: &str, node: &str| {
        let mut p = app_pod(
            name,
            node,
            json!({"cpu": "2", "memory": "32Mi"}),
            json!({"cpu": "2", "memory": "32Mi"}),
        );
        p["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
        p
    };
    for (suffix, on) in [("", node.name()), ("-sim", "sim-static")] {
        create(&api, excl(&format!("excl{suffix}"), on)).await;
        create(
            &api,
            burner(&format!("burst{suffix}"), on, "400m", "500m", 2),
        )
        .await;
    }
    let excl_pod = wait_running(&api, "excl", POD_START).await;
    let burst = wait_running(&api, "burst", POD_START).await;
    let excl_sim = wait_running(&api, "excl-sim", Duration::from_secs(60)).await;
    let burst_sim = wait_running(&api, "burst-sim", Duration::from_secs(60)).await;
    eprintln!(
        "MEASURE static node: booted and pods Running in {:.0?}",
        started.elapsed()
    );

    // The kubelet narrows the Burstable container's cpuset on its next
    // reconcile (cpuManagerReconcilePeriod, 10 s).
    let want_excl = real_cpuset(node, &excl_pod, "app").await;
    assert_eq!(
        want_excl, "1-2",
        "the lowest two CPUs past the reserved one"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut pool = real_cpuset(node, &burst, "app").await;
    while pool != "0" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        pool = real_cpuset(node, &burst, "app").await;
    }
    assert_eq!(
        pool, "0",
        "the Burstable container runs on the shared pool only"
    );
    let sim_cpuset = |p: &str| {
        std::fs::read_to_string(
            sim.container_cgroup_path(&ns, p, "app")
                .expect("sim container")
                .join("cpuset.cpus.effective"),
        )
        .expect("sim cpuset")
        .trim()
        .to_string()
    };
    assert_eq!(
        (
            sim_cpuset(excl_sim.metadata.name.as_deref().unwrap_or_default()),
            sim_cpuset(burst_sim.metadata.name.as_deref().unwrap_or_default())
        ),
        (want_excl.clone(), pool.clone()),
        "PARITY: simulator's cpusets (exclusive, shared) vs the real kubelet's"
    );

    install_agents(&c);
    let agent = GuestAgent::start(node, &vm_agent_args())
        .await
        .expect("agent starts");
    let raised = wait_pod(
        &api,
        &agent,
        "burst",
        "raise above 500m",
        Duration::from_secs(180),
        |p| app_limit_m(p).is_some_and(|m| m > 500),
    )
    .await;
    let scrape = wait_scrape(
        &agent,
        Duration::from_secs(60),
        "no shared pool in the metrics",
        |s| metric(s, "headroom_node_shared_pool_cpus", &[]) == Some(1.0),
    )
    .await;
    assert_eq!(
        metric(&scrape, "headroom_node_capacity_millicores", &[]),
        Some(1000.0),
        "capacity is the pool"
    );
    // Watch the limit for 30 s more, and what the kernel lets the pod use.
    let mut limits = vec![app_limit_m(&raised).expect("limit")];
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        limits.push(app_limit_m(&api.get("burst").await.expect("get")).expect("limit"));
    }
    let pod_dir = node
        .pod_cgroup(burst.metadata.uid.as_deref().expect("uid"))
        .await
        .expect("pod cgroup");
    let (dt, d) = cg_deltas(node, &[("burst", &pod_dir)], 10).await;
    let usage_m = d["burst"].usage_us * 1000 / dt.max(1);
    let slack = agent
        .node
        .sh("/mnt/node/bin/headroom-agent slack --interval 1s --node-allocatable 2900m")
        .await
        .expect("slack");
    eprintln!(
        "MEASURE static node: burst limits (m, every 2 s) {limits:?}; usage {usage_m}m over {dt} µs; slack:\n{slack}"
    );
    assert!(
        limits.iter().all(|m| *m <= 1000),
        "never above the 1-CPU shared pool: {limits:?}"
    );
    assert!(
        usage_m <= 1050,
        "the kernel confines the pod to its cpuset: {usage_m}m"
    );
    assert!(
        slack.contains("capacity 1000m (shared CPU pool (static CPU manager))")
            && slack.contains("shared CPU pool 0 (1 CPUs"),
        "slack names the pool: {slack}"
    );
    assert_eq!(
        real_cpuset(node, &excl_pod, "app").await,
        "1-2",
        "the exclusive CPUs stay the Guaranteed pod's"
    );
    let excl_now = api.get("excl").await.expect("get");
    assert_eq!(
        excl_now.metadata.generation, excl_pod.metadata.generation,
        "the Guaranteed pod is never patched"
    );
    agent.stop().await.expect("agent stops");
    retire_sim(&client, sim).await;
    eprintln!("MEASURE static node test: {:.0?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_installs_the_daemonset_and_every_scenario_passes_on_real_nodes() {
    let Some(c) = cluster() else { return };
    let _serial = serial(c).await;
    let archive = testkit::node_vm::agent_image().expect("scripts/build-image.sh");
    let image_id = RealCluster::archive_image_id(&archive).expect("image id");
    c.load_image(&archive, AGENT_IMAGE, &[AGENT_IMAGE_NEXT])
        .await
        .expect("import the agent image");
    c.program_kubernetes_service()
        .await
        .expect("kubernetes Service on the nodes");
    let tools = tempfile::tempdir().expect("tempdir");
    let bin = c.scenario_tools(tools.path()).expect("scenario tools");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let started = Instant::now();
    let out = tokio::process::Command::new("bash")
        .arg(RealCluster::scenario_runner())
        .env("PATH", path)
        .env("KUBECONFIG", c.cp.kubeconfig_path())
        .env("HEADROOM_NODE_SH", bin.join("node-sh"))
        .env(
            "HEADROOM_WORKERS",
            format!("{} {}", c.nodes[1].name(), c.nodes[0].name()),
        )
        .env("HEADROOM_PAUSE_IMAGE", "headroom.local/pause:1")
        .env("HEADROOM_BUSYBOX_IMAGE", BUSYBOX)
        .env("HEADROOM_IMAGE", "headroom-agent:0.1.0")
        .env("HEADROOM_IMAGE_NEXT", "headroom-agent:0.1.0-next")
        .env("HEADROOM_IMAGE_ID", &image_id)
        .env("HEADROOM_SCENARIO_TIMEOUT", "420")
        .env(
            "HEADROOM_PROMETHEUS_CRDS",
            testkit::node_vm::install::prometheus_crds().expect("prometheus-operator CRDs"),
        )
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run tests/scenarios/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    println!("MEASURE scenarios on real nodes: {:.0?}", started.elapsed());
    if !out.status.success() {
        // Leave nothing installed for the tests that follow.
        let _ = tokio::process::Command::new(bin.join("kubectl"))
            .env("KUBECONFIG", c.cp.kubeconfig_path())
            .args(["delete", "-k"])
            .arg(testkit::node_vm::repo_root().join("deploy"))
            .args(["--ignore-not-found", "--wait=true", "--timeout=300s"])
            .output()
            .await;
        let _ = tokio::process::Command::new(bin.join("kubectl"))
            .env("KUBECONFIG", c.cp.kubeconfig_path())
            .args(["delete", "namespace", "headroom-demo", "--ignore-not-found"])
            .output()
            .await;
    }
    let passes = stdout.lines().filter(|l| l.starts_with("PASS: ")).count();
    let fails: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL: ")).collect();
    assert!(
        out.status.success() && fails.is_empty(),
        "scenarios failed ({}):\n{}\nstderr:\n{stderr}",
        out.status,
        fails.join("\n")
    );
    // The runner stops at an unexpected error (set -e) before this line.
    assert!(
        stdout.contains(&format!("all {passes} scenarios passed")),
        "the runner did not finish every scenario ({passes} PASS lines)"
    );
}

#[tokio::test]
#[ignore = "helper: runs only as a child of the vm no-orphans tests"]
async fn vm_orphan_helper() {
    let Ok(mode) = std::env::var(ORPHAN_MODE) else {
        return;
    };
    let art = testkit::node_vm::Artifacts::locate().expect("artifacts");
    let cp =
        testkit::control_plane::ControlPlane::start(testkit::control_plane::ControlPlaneOptions {
            full_cluster: true,
            ..Default::default()
        })
        .await
        .expect("control plane");
    let vm =
        NodeVm::boot(&cp, testkit::node_vm::NodeSpec::cgroupfs("orphan", 9), &art).expect("boot");
    let mut pids: Vec<String> = cp.pids().iter().map(u32::to_string).collect();
    pids.push(vm.qemu_pid().expect("qemu runs").to_string());
    println!("{PIDS_LINE} {}", pids.join(" "));
    if mode == "panic" {
        // Panic only once the parent has seen the VM alive: panicking at once
        // raced the parent's "qemu is running" check (the unwind kills qemu).
        let mut go = String::new();
        let _ = std::io::stdin().read_line(&mut go);
        panic!("deliberate panic with a VM running");
    }
    std::mem::forget(vm);
    std::mem::forget(cp);
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

fn vm_orphan_check(mode: &str) {
    use std::io::{BufRead, BufReader};
    use testkit::process::{process_gone, spawn_guarded};
    if testkit::node_vm::skip_reason().is_some() {
        eprintln!(
            "SKIP: {}",
            testkit::node_vm::skip_reason().unwrap_or_default()
        );
        return;
    }
    let _serial = SERIAL.blocking_lock();
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("exe"));
    cmd.args(["vm_orphan_helper", "--exact", "--ignored", "--nocapture"])
        .env(ORPHAN_MODE, mode)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = spawn_guarded(cmd).expect("spawn helper");
    let mut go = child.stdin.take().expect("stdin");
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let pids: Vec<u32> = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix(PIDS_LINE).map(|r| {
                r.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
        })
        .expect("helper printed no pids");
    let qemu = *pids.last().expect("qemu pid");
    assert!(
        !process_gone(qemu, "qemu-system"),
        "qemu not running before the kill"
    );
    if mode == "sigkill" {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    } else {
        use std::io::Write;
        let _ = writeln!(go, "go");
    }
    drop(go);
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(60);
    while pids.iter().any(|p| !process_gone(*p, "")) {
        let alive: Vec<&u32> = pids.iter().filter(|p| !process_gone(**p, "")).collect();
        assert!(Instant::now() < deadline, "orphans after {mode}: {alive:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn no_orphaned_vm_or_controllers_when_the_test_process_is_sigkilled() {
    vm_orphan_check("sigkill");
}

#[test]
fn no_orphaned_vm_or_controllers_when_a_test_panics() {
    vm_orphan_check("panic");
}

// ---------------------------------------------------------------------------
// A node rebooted under managed pods, on a node of its own (its disk keeps its
// writes across the reboot, as a real node's does).

/// A systemd-driver trixie node with a managed busy pod the agent raised:
/// the VM reboots. The pod comes back (its container restarted once), the
/// kubelet starts it at the limit the agent set before the reboot (the new
/// container's `cpu.max`), nobody patches it meanwhile, and the agent's
/// DaemonSet pod, restarted by the kubelet, resumes: it counts the pod managed,
/// reports no drift, leaves nothing unverified, sends no patch that is not a
/// generation bump, and the pod ends at its spec limit. Before all that, an
/// agent run as a process starts while kubepods' `cpu.stat` does not parse
/// (see `start_over_unreadable_kubepods`; a mount over a host file does not
/// reach the DaemonSet's container, whose cgroup mount is private).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebooted_node_comes_back_at_the_resized_limits_and_the_agent_resumes() {
    let mut spec = testkit::node_vm::NodeSpec::kind_like("node-reboot", 4)
        .with_suite(testkit::node_vm::Suite::Trixie);
    spec.persistent_disk = true;
    let Some((_serial, c, _)) = own_node(spec).await else {
        return;
    };
    let node = &c.nodes[0];
    let n = node.name();
    node.install_agent(&static_agent_binary().expect("static agent"))
        .expect("install agent");
    let client = c.cp.client().await;
    let ns = c.cp.namespace("reboot").await;
    opt_in(&client, &ns).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&api, burner("managed", n, "200m", "300m", 1)).await;
    wait_running(&api, "managed", POD_START).await;
    // Before the reboot: kubepods unreadable for the agent's first ticks.
    let (agent, _, unreadable_converged) =
        start_over_unreadable_kubepods(node, &api, "managed").await;
    wait_scrape(
        &agent,
        RESIZE_GRACE + Duration::from_secs(30),
        "the raise before the reboot never verified",
        |s| resizes(s, "verified") >= 1.0,
    )
    .await;
    agent.stop().await.expect("agent stops");
    // From here on the agent runs as its DaemonSet's pod, as users run it.
    c.install_daemonset(&vm_agent_args())
        .await
        .expect("kubectl apply deploy/");
    let agent = GuestAgent::daemonset_pod(node, client.clone(), Duration::from_secs(300))
        .await
        .expect("the agent's pod is Ready");
    wait_scrape(
        &agent,
        Duration::from_secs(120),
        "the agent's pod never counts the pod managed",
        |s| metric(s, "headroom_pods", &[("state", "managed")]).unwrap_or(0.0) >= 1.0,
    )
    .await;
    // Whatever it decides first, settled before the reboot.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = api.get("managed").await.expect("get");
    node.wait_cpu_max(
        &before,
        "app",
        &format!("{} 100000", app_limit_m(&before).expect("limit") * 100),
        KUBELET_APPLY,
    )
    .await
    .expect("the limit before the reboot applies");
    let limit = app_limit_m(&before).expect("limit");
    let gen_before = before.metadata.generation;
    let restarts_before = restart_count(&before);
    let agent_before = testkit::node_vm::daemonset::agent_pod(&client, n)
        .await
        .expect("list")
        .expect("agent pod");
    drop(agent); // it dies with the guest

    let rebooted = Instant::now();
    let ssh = node
        .reboot(Instant::now() + Duration::from_secs(600))
        .await
        .expect("reboot");
    // What kube-proxy does on a real node when it starts again: the agent's
    // route to the API server lives in the kernel's tables.
    node.program_kubernetes_service()
        .await
        .expect("kubernetes Service after the reboot");
    // The pod comes back: a new container, running.
    let back_deadline = Instant::now() + POD_START;
    let back = loop {
        let p = api.get("managed").await.expect("get");
        let running = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            });
        if restart_count(&p) > restarts_before && running {
            break p;
        }
        assert!(
            Instant::now() < back_deadline,
            "{n}: managed not back after the reboot ({:?}); status {:?}\n{}",
            rebooted.elapsed(),
            p.status,
            node.diagnose()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let pods_back = rebooted.elapsed();
    // At the limit the agent set before the reboot, or at one its pod set
    // since (counted below: every patch after the reboot is verified).
    let want = format!("{} 100000", app_limit_m(&back).expect("limit") * 100);
    node.wait_cpu_max(&back, "app", &want, KUBELET_APPLY)
        .await
        .expect("the new container starts at its spec limit");

    // The kubelet starts the agent's pod again: nobody else does.
    let agent = GuestAgent::daemonset_pod(node, client.clone(), Duration::from_secs(600))
        .await
        .expect("the agent's pod is Ready again after the reboot");
    let agent_after = testkit::node_vm::daemonset::agent_pod(&client, n)
        .await
        .expect("list")
        .expect("agent pod");
    assert_eq!(
        agent_after.metadata.uid, agent_before.metadata.uid,
        "{n}: the agent's pod was replaced, not restarted"
    );
    assert!(
        restart_count(&agent_after) > restart_count(&agent_before),
        "{n}: the agent's container did not restart with the node"
    );
    wait_scrape(
        &agent,
        Duration::from_secs(120),
        "the pod is never counted managed after the reboot",
        |s| metric(s, "headroom_pods", &[("state", "managed")]).unwrap_or(0.0) >= 1.0,
    )
    .await;
    let resumed = rebooted.elapsed();
    no_drift_for(&agent, &ns, 20).await;
    let after = api.get("managed").await.expect("get");
    let bumps = after.metadata.generation.unwrap_or(1) - gen_before.unwrap_or(1);
    let s = wait_scrape(
        &agent,
        RESIZE_GRACE + Duration::from_secs(30),
        "a patch after the reboot never verified",
        |s| resizes(s, "verified") >= bumps as f64,
    )
    .await;
    assert_eq!(resizes(&s, "unverified"), 0.0, "{n}: unverified");
    assert_eq!(
        resizes(&s, "applied"),
        bumps as f64,
        "{n}: patches applied after the reboot = generation bumps (no duplicates)"
    );
    let got = node.pod_cpu_max(&after).await.expect("read");
    assert_eq!(
        got.containers.get("app").map(String::as_str),
        Some(format!("{} 100000", app_limit_m(&after).expect("limit") * 100).as_str()),
        "{n}: cpu.max is not the spec limit after the reboot"
    );
    let log = agent.log_tail(400).await;
    assert!(!log.contains("panicked"), "{n}: agent panicked:\n{log}");
    eprintln!(
        "MEASURE {n} kubepods readable again → raised {unreadable_converged:.1?}; reboot: ssh {ssh:.1?}, pod back (restarted, running) {pods_back:.1?}, the DaemonSet's agent counts it managed {resumed:.1?} after the reboot; limit {limit}m kept; {bumps} patches after"
    );
}
