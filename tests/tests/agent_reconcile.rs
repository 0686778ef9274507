//! The reconciler end to end (issue 4): a real kube-apiserver, two simulated
//! nodes each with its own `headroom-agent` process, and the outcomes checked
//! from the apiserver side (pod specs, `metadata.generation`, managedFields).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tempfile::TempDir;
use testkit::agent::{AgentProcess, fast_args, metric, parse_metrics};
use testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use testkit::kubelet_sim::{Fault, SimConfig, SimKubelet};

const WAIT: Duration = Duration::from_secs(60);

struct Node {
    name: String,
    sim: SimKubelet,
    agent: Option<AgentProcess>,
}

struct Cluster {
    cp: &'static ControlPlane,
    client: Client,
    ns: String,
    nodes: Vec<Node>,
    dir: TempDir,
}

impl Cluster {
    /// `agents[i]`: extra args for node i's agent, `None` for no agent.
    async fn start(
        cp: &'static ControlPlane,
        prefix: &str,
        agents: &[Option<Vec<String>>],
    ) -> Cluster {
        Self::start_with(cp, prefix, agents, |_| {}).await
    }

    /// [`Cluster::start`] with each node's simulator config tuned.
    async fn start_with(
        cp: &'static ControlPlane,
        prefix: &str,
        agents: &[Option<Vec<String>>],
        tune: impl Fn(&mut SimConfig),
    ) -> Cluster {
        let client = cp.client().await;
        let ns = cp.namespace(prefix).await;
        opt_in(&client, &ns).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut nodes = Vec::new();
        for (i, extra) in agents.iter().enumerate() {
            let name = format!("{ns}-n{i}");
            let root = dir.path().join(format!("cg{i}"));
            let mut cfg = SimConfig::new(&name, &root);
            cfg.resize_delay = Duration::from_millis(100);
            cfg.status_delay = Duration::from_millis(100);
            tune(&mut cfg);
            let sim = SimKubelet::start(client.clone(), cfg)
                .await
                .expect("sim starts");
            cp.wait_node_admissible(&name)
                .await
                .expect("node admissible");
            let agent = match extra {
                Some(extra) => {
                    let args = with_overrides(fast_args(), extra);
                    Some(
                        AgentProcess::start(cp.kubeconfig_path(), &name, &root, dir.path(), &args)
                            .await
                            .expect("agent starts"),
                    )
                }
                None => None,
            };
            nodes.push(Node { name, sim, agent });
        }
        Cluster {
            cp,
            client,
            ns,
            nodes,
            dir,
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create(&self, pod: Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).expect("pod json");
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod")
    }

    async fn get(&self, name: &str) -> Pod {
        self.pods().get(name).await.expect("get pod")
    }

    async fn generations(&self, names: &[&str]) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for n in names {
            out.push((n.to_string(), generation(&self.get(n).await)));
        }
        out
    }

    fn agent(&self, i: usize) -> &AgentProcess {
        self.nodes[i].agent.as_ref().expect("agent")
    }

    /// Polls until `f(pod)` holds; panics with the agent log otherwise.
    async fn wait_for(&self, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Duration {
        let t0 = Instant::now();
        loop {
            let p = self.get(name).await;
            if f(&p) {
                return t0.elapsed();
            }
            if t0.elapsed() > WAIT {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .filter_map(|n| n.agent.as_ref())
                    .map(|a| a.log_tail(30))
                    .collect();
                panic!(
                    "{name}: {what} not reached in {WAIT:?}; pod: {}\nagent logs:\n{}",
                    summary(&p),
                    logs.join("\n---\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until pod `name` is Running with container statuses.
    async fn wait_running(&self, name: &str) {
        self.wait_for(name, "Running", |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|c| !c.is_empty())
        })
        .await;
    }
}

/// `base` flag/value pairs with `extra`'s: a flag already in `base` takes
/// the new value (clap refuses a flag given twice), others are appended.
fn with_overrides(mut base: Vec<String>, extra: &[String]) -> Vec<String> {
    let mut it = extra.iter();
    while let Some(flag) = it.next() {
        let value = it.next();
        match (base.iter().position(|b| b == flag), value) {
            (Some(at), Some(v)) if flag.starts_with("--") => base[at + 1] = v.clone(),
            _ => base.extend(std::iter::once(flag).chain(value).cloned()),
        }
    }
    base
}

async fn opt_in(client: &Client, ns: &str) {
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"headroom.dev/managed": "true"}}})),
        )
        .await
        .expect("label namespace");
}

fn summary(p: &Pod) -> String {
    let spec = p.spec.as_ref().map(|s| {
        s.containers
            .iter()
            .map(|c| {
                format!(
                    "{}={:?}",
                    c.name,
                    c.resources.as_ref().and_then(|r| r.limits.as_ref())
                )
            })
            .collect::<Vec<_>>()
    });
    format!(
        "gen={:?} limits={spec:?} conditions={:?}",
        p.metadata.generation,
        p.status.as_ref().and_then(|s| s.conditions.clone())
    )
}

/// A Burstable pod: CPU request and (optional) limit, memory request only.
fn burstable(name: &str, node: &str, req: &str, lim: Option<&str>) -> Value {
    let mut res = json!({"requests": {"cpu": req, "memory": "64Mi"}});
    if let Some(l) = lim {
        res["limits"] = json!({"cpu": l});
    }
    json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": res}]}
    })
}

fn cpu_limit(p: &Pod, container: &str) -> Option<String> {
    let c = p
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?;
    c.resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("cpu")
        .map(|q| q.0.clone())
}

fn cpu_limit_m(p: &Pod, container: &str) -> Option<u64> {
    cpu_limit(p, container).and_then(|q| headroom::quantity::cpu_millis(&q).ok())
}

fn pod_limit_m(p: &Pod) -> Option<u64> {
    let q = p
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("cpu")?;
    headroom::quantity::cpu_millis(&q.0).ok()
}

fn has_pending(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "PodResizePending" && c.status == "True")
        })
}

fn generation(p: &Pod) -> i64 {
    p.metadata.generation.unwrap_or(0)
}

/// Whether the agent's field manager ever wrote this pod.
fn touched_by_agent(p: &Pod) -> bool {
    p.metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some("headroom-agent"))
}

fn cpu_request(p: &Pod, container: &str) -> Option<String> {
    let c = p
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?;
    c.resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("cpu")
        .map(|q| q.0.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_node_raises_limits_to_their_ceilings() {
    let c = Cluster::start(ControlPlane::shared(), "idle", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    c.create(burstable("a", &node, "250m", Some("300m"))).await;
    c.create(burstable("b", &node, "100m", Some("150m"))).await;
    // Ceiling = request × 4 (default).
    c.wait_for("a", "limit 1000m", |p| cpu_limit_m(p, "app") == Some(1000))
        .await;
    c.wait_for("b", "limit 400m", |p| cpu_limit_m(p, "app") == Some(400))
        .await;
    let a = c.get("a").await;
    assert_eq!(
        cpu_request(&a, "app").as_deref(),
        Some("250m"),
        "requests untouched"
    );
    let mem = a.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()
        .get("memory")
        .cloned();
    assert_eq!(
        mem.map(|q| q.0),
        Some("64Mi".to_string()),
        "memory untouched"
    );
    assert_eq!(
        a.status.as_ref().and_then(|s| s.qos_class.as_deref()),
        Some("Burstable")
    );
}

/// Pod `m` (200m request, 250m declared) raised to its 800m ceiling on an
/// idle node, then an unmanaged filler that wants all 4 CPUs.
async fn raise_then_fill(c: &Cluster) {
    let node = c.nodes[0].name.clone();
    c.create(burstable("m", &node, "200m", Some("250m"))).await;
    c.wait_for("m", "raised to 800m", |p| {
        cpu_limit_m(p, "app") == Some(800)
    })
    .await;
    let mut filler = burstable("filler", &node, "100m", None);
    filler["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    c.create(filler).await;
    c.wait_running("filler").await;
    c.nodes[0].sim.set_demand(&c.ns, "filler", 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_brings_limits_back_to_requests() {
    let c = Cluster::start(ControlPlane::shared(), "full", &[Some(vec![])]).await;
    raise_then_fill(&c).await;
    let took = c
        .wait_for("m", "lowered to the request", |p| {
            cpu_limit_m(p, "app") == Some(200)
        })
        .await;
    eprintln!("measured: load change → limit back at request in {took:?}");
    assert_eq!(
        cpu_limit(&c.get("filler").await, "app"),
        None,
        "opted-out pod keeps no limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_with_floor_declared_brings_limits_back_to_their_declared_limits() {
    // A long raise cooldown: the lowering's floor is under test, not how a
    // single idle-looking tick of the simulator raises the pod again.
    let args: Vec<String> = ["--floor", "declared", "--raise-cooldown", "60s"]
        .map(String::from)
        .into();
    let c = Cluster::start(ControlPlane::shared(), "fulldecl", &[Some(args)]).await;
    raise_then_fill(&c).await;
    // With the default floor the same node lowers it to 200m (the test above);
    // here it stops at the 250m the pod declares, and stays there.
    c.wait_for("m", "lowered to the declared 250m", |p| {
        cpu_limit_m(p, "app") == Some(250)
    })
    .await;
    let before = generation(&c.get("m").await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = c.get("m").await;
    assert_eq!(
        cpu_limit_m(&p, "app"),
        Some(250),
        "{}\n{}",
        summary(&p),
        c.agent(0).log_tail(40)
    );
    assert_eq!(
        generation(&p),
        before,
        "patched again after reaching its floor:\n{}",
        c.agent(0).log_tail(40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pressure_spike_from_unmanaged_pods_shrinks_managed_limits_promptly() {
    let c = Cluster::start(ControlPlane::shared(), "spike", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    c.create(burstable("m1", &node, "200m", Some("300m"))).await;
    c.create(burstable("m2", &node, "200m", Some("300m"))).await;
    let mut noisy = burstable("noisy", &node, "500m", None);
    noisy["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    c.create(noisy).await;
    c.wait_running("noisy").await;
    c.nodes[0].sim.set_demand(&c.ns, "m1", 150);
    c.nodes[0].sim.set_demand(&c.ns, "m2", 150);
    c.wait_for("m1", "raised to 800m", |p| {
        cpu_limit_m(p, "app") == Some(800)
    })
    .await;
    c.wait_for("m2", "raised to 800m", |p| {
        cpu_limit_m(p, "app") == Some(800)
    })
    .await;
    // The unmanaged pod demands twice the node: contention and PSI.
    c.nodes[0].sim.set_demand(&c.ns, "noisy", 8000);
    let took = c
        .wait_for("m1", "shrunk", |p| {
            cpu_limit_m(p, "app").is_some_and(|m| m < 800)
        })
        .await;
    eprintln!("measured: spike → first lowering patch visible after {took:?}");
    c.wait_for("m1", "at request", |p| cpu_limit_m(p, "app") == Some(200))
        .await;
    c.wait_for("m2", "at request", |p| cpu_limit_m(p, "app") == Some(200))
        .await;
    let s = parse_metrics(&c.agent(0).scrape().await.unwrap()).unwrap();
    let pressure = metric(&s, "headroom_node_pressure_some_ratio", &[]).unwrap_or(0.0);
    eprintln!("measured: kubepods PSI some avg10 ratio after spike {pressure:.3}");
}

/// A pod throttled at its own limit on a node with idle CPU makes kubepods
/// PSI `some` high (the kernel counts throttled tasks as stalled: the
/// simulator does too, as the real node showed). That stall is the pod's
/// own quota, not contention: the pod must be raised to its ceiling and
/// stay there, with a bounded number of patches. As in the first real run
/// that went wrong, the pod burns at its limit for a while before the agent
/// may manage it (kubepods avg10 is high by then), on a 2-CPU node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_throttled_at_its_own_limit_on_an_idle_node_is_not_lowered_by_its_own_stall() {
    let c = Cluster::start_with(ControlPlane::shared(), "ownstall", &[Some(vec![])], |cfg| {
        cfg.allocatable_cpu_m = 2000;
    })
    .await;
    let node = c.nodes[0].name.clone();
    let mut spec = burstable("burner", &node, "200m", Some("300m"));
    spec["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    c.create(spec).await;
    c.wait_running("burner").await;
    // A single-threaded busy loop: wants a whole CPU, more than any limit
    // it will get, so it stays throttled (and stalled) all along.
    c.nodes[0].sim.set_demand(&c.ns, "burner", 1000);
    let kp = c.nodes[0].sim.kubepods_path();
    let avg10 = || -> f64 {
        std::fs::read_to_string(kp.join("cpu.pressure"))
            .ok()
            .and_then(|t| {
                t.split_whitespace()
                    .find_map(|w| w.strip_prefix("avg10="))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0.0)
    };
    let t0 = std::time::Instant::now();
    while avg10() < 30.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "kubepods avg10 never rose: {}",
            avg10()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "measured: kubepods some avg10 {:.1}% when the pod opts in",
        avg10()
    );
    c.pods()
        .patch(
            "burner",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"headroom.dev/managed": null}}})),
        )
        .await
        .expect("opt in");
    c.wait_for("burner", "raised to its ceiling 800m", |p| {
        cpu_limit_m(p, "app") == Some(800)
    })
    .await;
    // 40 ticks of 200 ms, more than the 1 s raise cooldown many times over.
    let mut lowest = 800;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Some(m) = cpu_limit_m(&c.get("burner").await, "app") {
            lowest = lowest.min(m);
        }
    }
    assert_eq!(lowest, 800, "lowered for its own throttling");
    assert!(
        generation(&c.get("burner").await) <= 2,
        "more than one patch: {}",
        generation(&c.get("burner").await)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_of_one_node_never_patches_pods_of_another() {
    // Node 0: a live agent. Node 1: no agent at all.
    let c = Cluster::start(ControlPlane::shared(), "scope", &[Some(vec![]), None]).await;
    let (n0, n1) = (c.nodes[0].name.clone(), c.nodes[1].name.clone());
    c.create(burstable("mine", &n0, "100m", Some("150m"))).await;
    c.create(burstable("theirs", &n1, "100m", Some("150m")))
        .await;
    c.wait_running("theirs").await;
    let before = c.get("theirs").await;
    c.wait_for("mine", "raised", |p| cpu_limit_m(p, "app") == Some(400))
        .await;
    // Several more ticks, then look at node 1's pod from the apiserver.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = c.get("theirs").await;
    assert_eq!(
        generation(&after),
        generation(&before),
        "generation of the other node's pod changed"
    );
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert!(
        !touched_by_agent(&after),
        "the agent's field manager wrote the other node's pod"
    );
    assert!(
        touched_by_agent(&c.get("mine").await),
        "own pod is written by the agent's field manager"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_must_be_left_alone_are_never_patched() {
    let c = Cluster::start(ControlPlane::shared(), "alone", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    let guaranteed = json!({"metadata": {"name": "guaranteed"}, "spec": {"nodeName": node, "containers": [{"name": "app", "image": "pause",
        "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}}]}});
    let besteffort = json!({"metadata": {"name": "besteffort"}, "spec": {"nodeName": node, "containers": [{"name": "app", "image": "pause"}]}});
    let mut opted_out = burstable("opted-out", &node, "100m", Some("150m"));
    opted_out["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    let mut restart = burstable("restart", &node, "100m", Some("150m"));
    restart["spec"]["containers"][0]["resizePolicy"] =
        json!([{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]);
    // Terminating and pending pods start opted out, so the agent cannot
    // patch them before they are in that state; the opt-out is lifted below.
    let hold = json!({"headroom.dev/managed": "false"});
    let mut terminating = burstable("terminating", &node, "100m", Some("150m"));
    terminating["metadata"]["finalizers"] = json!(["headroom.test/hold"]);
    terminating["metadata"]["annotations"] = hold.clone();
    let mut pending = burstable("pending", &node, "100m", Some("150m"));
    pending["metadata"]["annotations"] = hold.clone();
    // Resizing: a user's resize the kubelet acknowledges but never finishes.
    let mut resizing = burstable("resizing", &node, "100m", Some("150m"));
    resizing["metadata"]["annotations"] = hold;
    c.nodes[0]
        .sim
        .set_fault(&c.ns, "resizing", Fault::NeverApply);
    for p in [
        guaranteed,
        besteffort,
        opted_out,
        restart,
        terminating,
        pending,
        resizing,
    ] {
        c.create(p).await;
    }
    for n in [
        "guaranteed",
        "besteffort",
        "opted-out",
        "restart",
        "terminating",
        "pending",
        "resizing",
    ] {
        c.wait_running(n).await;
    }
    c.pods()
        .patch_subresource(
            "resize",
            "resizing",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "200m"}}}]}})),
        )
        .await
        .expect("user resize");
    c.wait_for("resizing", "PodResizeInProgress", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "PodResizeInProgress" && c.status == "True")
            })
    })
    .await;
    // Terminating: deleted but held by a finalizer.
    c.pods()
        .delete("terminating", &DeleteParams::default())
        .await
        .expect("delete");
    // Pending: the kubelet reports an earlier resize it cannot admit.
    let cond = json!({"status": {"conditions": [{"type": "PodResizePending", "status": "True", "reason": "Infeasible",
        "message": "Node didn't have enough capacity", "observedGeneration": 1}]}});
    c.pods()
        .patch_status("pending", &PatchParams::default(), &Patch::Strategic(cond))
        .await
        .expect("pending condition");
    c.wait_for("pending", "PodResizePending", has_pending).await;
    let lift = Patch::Merge(json!({"metadata": {"annotations": {"headroom.dev/managed": null}}}));
    for n in ["terminating", "pending", "resizing"] {
        c.pods()
            .patch(n, &PatchParams::default(), &lift)
            .await
            .expect("lift opt-out");
    }
    let before = c
        .generations(&[
            "guaranteed",
            "besteffort",
            "opted-out",
            "restart",
            "terminating",
            "pending",
            "resizing",
        ])
        .await;
    // A managed control pod proves the agent is acting meanwhile.
    c.create(burstable("control", &node, "100m", Some("150m")))
        .await;
    c.wait_for("control", "raised", |p| cpu_limit_m(p, "app") == Some(400))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (n, g) in before {
        let p = c.get(&n).await;
        assert_eq!(generation(&p), g, "{n} was patched");
        assert!(
            !touched_by_agent(&p),
            "{n} carries the agent's field manager: {:?}\n{}",
            p.metadata.managed_fields,
            c.agent(0)
                .log()
                .lines()
                .filter(|l| l.contains(n.as_str()))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    // The test only means something if the conditions held throughout.
    assert!(
        has_pending(&c.get("pending").await),
        "PodResizePending vanished during the test"
    );
    let s = parse_metrics(&c.agent(0).scrape().await.unwrap()).unwrap();
    for reason in [
        "guaranteed",
        "best_effort",
        "opted_out",
        "restart_policy",
        "terminating",
        "resize_pending",
        "resize_in_progress",
    ] {
        assert!(
            metric(
                &s,
                "headroom_pods",
                &[("state", "unmanaged"), ("reason", reason)]
            )
            .unwrap_or(0.0)
                >= 1.0,
            "no unmanaged pod counted with reason {reason}"
        );
    }
    // Let the finalizer go so the namespace can be cleaned.
    let _ = c
        .pods()
        .patch(
            "terminating",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
}

/// docs/kubelet-behaviour.md §4 pod e: req cpu 100m / mem 128Mi, lim cpu 500m / mem 128Mi.
fn pod_level_e(name: &str, node: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"nodeName": node,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m"}}}]}})
}

/// docs/kubelet-behaviour.md §4 pod b: pod req 100m/64Mi lim 500m/128Mi; container req 100m lim 400m.
fn pod_level_b(name: &str, node: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"nodeName": node,
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "400m"}}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_level_pods_are_managed_through_the_pod_limit_and_never_refused() {
    let c = Cluster::start(ControlPlane::shared(), "podlvl", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    c.create(pod_level_e("e", &node)).await;
    c.create(pod_level_b("b", &node)).await;
    // Idle: the ceiling is request × 4 = 400m, but never below the pod-level
    // limit the pods declare (500m): nothing is lowered (issue 15).
    c.wait_running("e").await;
    c.wait_running("b").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in ["e", "b"] {
        let p = c.get(n).await;
        assert_eq!(pod_limit_m(&p), Some(500), "{n}: declared limit kept");
        assert!(!touched_by_agent(&p), "{n}: no resize on an idle node");
    }
    assert_eq!(
        cpu_limit(&c.get("b").await, "c").as_deref(),
        Some("400m"),
        "container limit of a pod-level pod untouched"
    );
    assert_eq!(
        cpu_limit(&c.get("e").await, "c"),
        None,
        "no container limit added to a pod-level pod"
    );
    // Fill the node: e must stay strictly above its request (QoS), b at its container's limit.
    let mut filler = burstable("filler", &node, "100m", None);
    filler["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    c.create(filler).await;
    c.wait_running("filler").await;
    c.nodes[0].sim.set_demand(&c.ns, "filler", 4000);
    c.wait_for("e", "pod limit at its QoS floor", |p| {
        pod_limit_m(p) == Some(110)
    })
    .await;
    c.wait_for("b", "pod limit at the container limit", |p| {
        pod_limit_m(p) == Some(400)
    })
    .await;
    let e = c.get("e").await;
    assert_eq!(
        e.status.as_ref().and_then(|s| s.qos_class.as_deref()),
        Some("Burstable")
    );
    let s = parse_metrics(&c.agent(0).scrape().await.unwrap()).unwrap();
    assert_eq!(
        metric(&s, "headroom_resizes_total", &[("result", "refused")]).unwrap_or(0.0),
        0.0,
        "a patch was refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_level_pods_are_unmanaged_with_a_reason_when_the_gate_is_off() {
    let cp = ControlPlane::shared_with(
        "gate-off",
        ControlPlaneOptions::default().with_gate("InPlacePodLevelResourcesVerticalScaling", false),
    );
    let c = Cluster::start(cp, "gateoff", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    c.create(pod_level_e("e", &node)).await;
    c.create(burstable("control", &node, "100m", Some("150m")))
        .await;
    c.wait_running("e").await;
    c.wait_for("control", "raised", |p| cpu_limit_m(p, "app") == Some(400))
        .await;
    let t0 = Instant::now();
    loop {
        let s = parse_metrics(&c.agent(0).scrape().await.unwrap()).unwrap();
        if metric(
            &s,
            "headroom_pods",
            &[("state", "unmanaged"), ("reason", "pod_level_unsupported")],
        ) == Some(1.0)
        {
            break;
        }
        assert!(
            t0.elapsed() < WAIT,
            "pod-level pod not reported unmanaged(pod_level_unsupported):\n{}",
            c.agent(0).log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let e = c.get("e").await;
    assert_eq!(generation(&e), 1, "pod-level pod patched with the gate off");
    assert_eq!(pod_limit_m(&e), Some(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_load_after_convergence_sends_no_more_patches() {
    let c = Cluster::start(ControlPlane::shared(), "steady", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    for (n, d) in [("s1", 80), ("s2", 150), ("s3", 300)] {
        c.create(burstable(n, &node, "100m", Some("150m"))).await;
        c.nodes[0].sim.set_demand(&c.ns, n, d);
    }
    for n in ["s1", "s2", "s3"] {
        c.wait_for(n, "raised", |p| cpu_limit_m(p, "app") == Some(400))
            .await;
    }
    // Converged: count patches (generation bumps) over a window of 20 s,
    // 100 ticks of the agent.
    let before = c.generations(&["s1", "s2", "s3"]).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after = c.generations(&["s1", "s2", "s3"]).await;
    let patches: i64 = after.iter().zip(&before).map(|(a, b)| a.1 - b.1).sum();
    eprintln!("measured: {patches} patches for 3 pods in 20 s of steady load after convergence");
    assert_eq!(
        patches, 0,
        "patches under steady load: before {before:?} after {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_the_agent_converges_without_extra_patches() {
    let mut c = Cluster::start(ControlPlane::shared(), "restart", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    c.create(burstable("r1", &node, "100m", Some("150m"))).await;
    c.create(burstable("r2", &node, "250m", Some("300m"))).await;
    c.wait_for("r1", "raised", |p| cpu_limit_m(p, "app") == Some(400))
        .await;
    c.wait_for("r2", "raised", |p| cpu_limit_m(p, "app") == Some(1000))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = (
        generation(&c.get("r1").await),
        generation(&c.get("r2").await),
    );
    let root = c.nodes[0].sim.config().cgroup_root.clone();
    if let Some(mut a) = c.nodes[0].agent.take() {
        a.stop().await;
    }
    let a = AgentProcess::start(
        c.cp.kubeconfig_path(),
        &node,
        &root,
        c.dir.path(),
        &fast_args(),
    )
    .await
    .expect("restart");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = (
        generation(&c.get("r1").await),
        generation(&c.get("r2").await),
    );
    assert_eq!(
        before,
        after,
        "restarted agent patched converged pods:\n{}",
        a.log_tail(20)
    );
    c.nodes[0].agent = Some(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_patches_nothing() {
    let c = Cluster::start(
        ControlPlane::shared(),
        "dryrun",
        &[Some(vec!["--dry-run".into()])],
    )
    .await;
    let node = c.nodes[0].name.clone();
    c.create(burstable("d", &node, "100m", Some("150m"))).await;
    c.wait_running("d").await;
    let t0 = Instant::now();
    while !c.agent(0).log().contains("dry-run: would resize") {
        assert!(
            t0.elapsed() < WAIT,
            "no dry-run decision logged:\n{}",
            c.agent(0).log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = c.get("d").await;
    assert_eq!(generation(&p), 1);
    assert_eq!(cpu_limit(&p, "app").as_deref(), Some("150m"));
    assert!(!touched_by_agent(&p));
    let s = parse_metrics(&c.agent(0).scrape().await.unwrap()).unwrap();
    assert!(metric(&s, "headroom_resizes_total", &[("result", "dry_run")]).unwrap_or(0.0) >= 1.0);
    assert_eq!(
        metric(&s, "headroom_resizes_total", &[("result", "applied")]).unwrap_or(0.0),
        0.0
    );
}

/// `headroom-agent explain` as a user runs it on a node.
fn explain(c: &Cluster, pod: &str) -> Value {
    let bin = testkit::agent::agent_binary().expect("agent binary");
    let root = c.nodes[0].sim.config().cgroup_root.clone();
    let out = std::process::Command::new(bin)
        .args([
            "explain",
            &format!("{}/{pod}", c.ns),
            "--json",
            "--interval",
            "300ms",
        ])
        .arg("--kubeconfig")
        .arg(c.cp.kubeconfig_path())
        .arg("--cgroup-root")
        .arg(&root)
        .output()
        .expect("run explain");
    assert!(
        out.status.success(),
        "explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain --json prints one JSON object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_why_a_pod_is_managed_or_not_and_its_figures() {
    let c = Cluster::start(ControlPlane::shared(), "explain", &[None]).await;
    let node = c.nodes[0].name.clone();
    c.create(burstable("managed", &node, "250m", Some("300m")))
        .await;
    let mut out = burstable("out", &node, "100m", Some("150m"));
    out["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    c.create(out).await;
    c.wait_running("managed").await;
    c.wait_running("out").await;

    let m = explain(&c, "managed");
    assert_eq!(m["pod"]["managed"], json!(true), "{m:#}");
    assert_eq!(m["reason"], Value::Null);
    assert_eq!(m["pod"]["request_m"], json!(250));
    assert_eq!(m["pod"]["current_limit_m"], json!(300));
    assert_eq!(m["pod"]["ceiling_m"], json!(1000), "request × 4");
    assert_eq!(
        m["pod"]["target_m"],
        json!(1000),
        "idle node: target at the ceiling"
    );
    assert_eq!(
        m["node"]["capacity_m"],
        json!(4000),
        "capacity from the Node's allocatable"
    );
    assert!(
        m["node"]["slack_m"].as_u64().is_some_and(|s| s >= 750),
        "{m:#}"
    );

    let o = explain(&c, "out");
    assert_eq!(o["pod"]["managed"], json!(false));
    assert_eq!(o["reason"], json!("opted_out"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_survives_a_dead_apiserver_without_panicking_or_patching() {
    // A control plane of its own, so killing its apiserver harms no other test.
    let cp: &'static ControlPlane = Box::leak(Box::new(
        ControlPlane::start(ControlPlaneOptions::default())
            .await
            .expect("control plane"),
    ));
    let c = Cluster::start(cp, "dead", &[Some(vec![])]).await;
    let node = c.nodes[0].name.clone();
    c.create(burstable("d", &node, "100m", Some("150m"))).await;
    c.wait_for("d", "raised", |p| cpu_limit_m(p, "app") == Some(400))
        .await;
    let mut filler = burstable("filler", &node, "100m", None);
    filler["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    c.create(filler).await;
    c.wait_running("filler").await;
    let agent = c.agent(0);
    let before = parse_metrics(&agent.scrape().await.unwrap()).unwrap();
    let applied_before =
        metric(&before, "headroom_resizes_total", &[("result", "applied")]).unwrap_or(0.0);

    std::process::Command::new("kill")
        .arg("-KILL")
        .arg(cp.apiserver_pid().to_string())
        .status()
        .unwrap();
    // Load changes while the apiserver is gone: the agent wants to lower,
    // cannot, and must neither crash nor spin.
    c.nodes[0].sim.set_demand(&c.ns, "filler", 4000);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (code, _) = agent.get("/healthz").await.expect("agent still serves");
    assert_eq!(code, 200);
    let after = parse_metrics(&agent.scrape().await.unwrap()).unwrap();
    assert_eq!(
        metric(&after, "headroom_resizes_total", &[("result", "applied")]).unwrap_or(0.0),
        applied_before,
        "nothing can be applied without an apiserver"
    );
    let log = agent.log();
    assert!(
        !log.contains("panicked"),
        "agent panicked:\n{}",
        agent.log_tail(30)
    );
    assert!(
        log.contains("watch error"),
        "the outage is logged:\n{}",
        agent.log_tail(30)
    );
    // Bounded effort: at most a handful of failed patch attempts in 8 s
    // (per-pod backoff with jitter), never one per tick (40 ticks).
    let errors = metric(&after, "headroom_patch_errors_total", &[]).unwrap_or(0.0);
    assert!(
        errors <= 8.0,
        "{errors} failed patches in 8 s: a retry storm"
    );
}
