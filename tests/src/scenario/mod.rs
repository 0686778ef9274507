//! One setup for the tests that run the agent against simulated nodes: a
//! fresh namespace (opted in), simulated nodes (`kubelet_sim`), each with
//! or without an agent process, and the waits such a test does, all on
//! [`wait_until`].
//!
//! ```ignore
//! let s = Scenario::builder("idle").sim(quick_kubelet).agent(fast_args()).start().await;
//! s.create(burstable("a", s.node(), "250m", Some("300m"))).await;
//! s.wait_pod("a", "limit 1000m", |p| cpu_limit_m(p, "app") == Some(1000)).await;
//! ```

pub mod pod;
mod wait;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use prometheus_parse::Scrape;
use serde_json::Value;
use tempfile::TempDir;

pub use wait::{Check, TimedOut, poll_period, wait_until};

use crate::agent::{AgentOptions, AgentProcess, parse_metrics};
use crate::control_plane::ControlPlane;
use crate::kubelet_sim::{SimConfig, SimKubelet};
use crate::workload::opt_in;

/// Bound of every wait of a [`Scenario`]: generous for a loaded 2-core machine.
pub const WAIT: Duration = Duration::from_secs(60);

/// A kubelet that resizes and reports in 100 ms each (the simulator's
/// default is 200 ms): `builder.sim(quick_kubelet)`.
pub fn quick_kubelet(cfg: &mut SimConfig) {
    cfg.resize_delay = Duration::from_millis(100);
    cfg.status_delay = Duration::from_millis(100);
}

/// What [`Scenario::builder`] sets up; see its methods for the defaults.
pub struct ScenarioBuilder<'a> {
    cp: &'a ControlPlane,
    prefix: String,
    nodes: usize,
    sim: SimConfig,
    opt_in: bool,
    agents: BTreeMap<usize, Vec<String>>,
}

impl<'a> ScenarioBuilder<'a> {
    /// Another control plane than the shared one (e.g. one a test may break).
    pub fn control_plane<'b>(self, cp: &'b ControlPlane) -> ScenarioBuilder<'b> {
        ScenarioBuilder {
            cp,
            prefix: self.prefix,
            nodes: self.nodes,
            sim: self.sim,
            opt_in: self.opt_in,
            agents: self.agents,
        }
    }

    /// `n` simulated nodes (default 1), named `<namespace>-n<i>`.
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// Tunes every node's simulator config (the simulator's defaults
    /// otherwise); the node name and cgroup root are set per node after.
    pub fn sim(mut self, tune: impl FnOnce(&mut SimConfig)) -> Self {
        tune(&mut self.sim);
        self
    }

    /// An agent on node 0 with `args` (e.g. [`crate::agent::fast_args`]).
    pub fn agent(self, args: Vec<String>) -> Self {
        self.agent_on(0, args)
    }

    /// An agent on node `i` with `args`; nodes without one have none.
    pub fn agent_on(mut self, i: usize, args: Vec<String>) -> Self {
        self.agents.insert(i, args);
        self
    }

    /// Leaves the namespace without the `headroom.dev/managed=true` label.
    pub fn not_opted_in(mut self) -> Self {
        self.opt_in = false;
        self
    }

    /// Creates the namespace, starts the nodes one after another (each
    /// admissible before the next), then their agents, each ready.
    pub async fn start(self) -> Scenario<'a> {
        let cp = self.cp;
        let client = cp.client().await;
        let ns = cp.namespace(&self.prefix).await;
        if self.opt_in {
            opt_in(&client, &ns).await.expect("label namespace");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Scenario {
            cp,
            client,
            ns,
            nodes: Vec::new(),
            dir,
            retired: Vec::new(),
        };
        for i in 0..self.nodes {
            let mut cfg = self.sim.clone();
            cfg.node_name = format!("{}-n{i}", s.ns);
            cfg.cgroup_root = s.dir.path().join(format!("cg{i}"));
            // Static pods go in the scenario's namespace unless their
            // manifest names one (the kubelet's default is `default`).
            for sp in &mut cfg.static_pods {
                if sp.manifest["metadata"]["namespace"].is_null() {
                    sp.manifest["metadata"]["namespace"] = s.ns.clone().into();
                }
            }
            let name = cfg.node_name.clone();
            let sim = SimKubelet::start(s.client.clone(), cfg)
                .await
                .expect("sim starts");
            cp.wait_node_admissible(&name)
                .await
                .expect("node admissible");
            s.nodes.push(SimNode {
                name,
                sim,
                agent: None,
            });
            if let Some(args) = self.agents.get(&i) {
                s.start_agent(i, args.clone()).await;
            }
        }
        s
    }
}

/// One simulated node of a [`Scenario`] and its agent, if it runs one.
pub struct SimNode {
    pub name: String,
    pub sim: SimKubelet,
    pub agent: Option<AgentProcess>,
}

/// A namespace, simulated nodes and their agents; see the module docs.
pub struct Scenario<'a> {
    pub cp: &'a ControlPlane,
    pub client: Client,
    pub ns: String,
    pub nodes: Vec<SimNode>,
    /// Cgroup roots (`cg<i>`) and agent logs.
    pub dir: TempDir,
    /// Agents stopped or killed by the test, kept for their logs.
    retired: Vec<AgentProcess>,
}

impl Scenario<'static> {
    /// A scenario on the shared control plane: one node, the simulator's
    /// defaults, no agent, an opted-in namespace `<prefix>-<n>`.
    pub fn builder(prefix: &str) -> ScenarioBuilder<'static> {
        ScenarioBuilder {
            cp: ControlPlane::shared(),
            prefix: prefix.to_string(),
            nodes: 1,
            sim: SimConfig::new("", ""),
            opt_in: true,
            agents: BTreeMap::new(),
        }
    }
}

impl Scenario<'_> {
    /// Node 0's name.
    pub fn node(&self) -> &str {
        &self.nodes[0].name
    }

    /// Node 0's simulator.
    pub fn sim(&self) -> &SimKubelet {
        &self.nodes[0].sim
    }

    /// Node 0's agent; panics if it runs none.
    pub fn agent(&self) -> &AgentProcess {
        self.agent_on(0)
    }

    /// Node `i`'s agent; panics if it runs none.
    pub fn agent_on(&self, i: usize) -> &AgentProcess {
        self.nodes[i].agent.as_ref().expect("an agent on the node")
    }

    /// Node 0's agent, to stop or probe it; panics if it runs none.
    pub fn agent_mut(&mut self) -> &mut AgentProcess {
        self.nodes[0].agent.as_mut().expect("an agent on the node")
    }

    /// How node `i`'s agent starts: this control plane's admin kubeconfig,
    /// logs in [`Scenario::dir`], no flags yet.
    pub fn agent_options(&self, i: usize) -> AgentOptions {
        AgentOptions::on(&self.nodes[i].sim)
            .kubeconfig(self.cp.kubeconfig_path())
            .log_dir(self.dir.path())
    }

    /// Starts an agent on node `i` with `args`, ready, in place of the
    /// one there (killed if still running, kept for its log).
    pub async fn start_agent(&mut self, i: usize, args: Vec<String>) {
        let opts = self.agent_options(i).args(args);
        self.start_agent_with(i, opts).await;
    }

    /// [`Scenario::start_agent`] with options of the test's own.
    pub async fn start_agent_with(&mut self, i: usize, opts: AgentOptions) {
        let agent = AgentProcess::start(opts).await.expect("agent starts");
        if let Some(mut old) = self.nodes[i].agent.replace(agent) {
            old.kill();
            self.retired.push(old);
        }
    }

    /// SIGTERM to node `i`'s agent (bounded wait, then SIGKILL).
    pub async fn stop_agent(&mut self, i: usize) {
        if let Some(mut a) = self.nodes[i].agent.take() {
            a.stop().await;
            self.retired.push(a);
        }
    }

    /// SIGKILL to node `i`'s agent: no shutdown path runs.
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut a) = self.nodes[i].agent.take() {
            a.kill();
            self.retired.push(a);
        }
    }

    /// SIGTERM to every agent, then stops every simulator and waits for it.
    pub async fn stop(mut self) {
        for i in 0..self.nodes.len() {
            self.stop_agent(i).await;
        }
        for n in self.nodes.drain(..) {
            n.sim.stop().await;
        }
    }

    /// Every agent this scenario started: the retired ones, then the running.
    pub fn all_agents(&self) -> impl Iterator<Item = &AgentProcess> {
        self.retired
            .iter()
            .chain(self.nodes.iter().filter_map(|n| n.agent.as_ref()))
    }

    /// The tails of every agent's log, for a failure message.
    pub fn logs(&self) -> String {
        let retired = self
            .retired
            .iter()
            .map(|a| format!("(stopped agent)\n{}", a.log_tail(25)));
        let running = self
            .nodes
            .iter()
            .filter_map(|n| n.agent.as_ref())
            .map(|a| a.log_tail(40));
        retired.chain(running).collect::<Vec<_>>().join("\n---\n")
    }

    /// Panics with `what` and the agents' logs.
    pub fn fail(&self, what: impl std::fmt::Display) -> ! {
        panic!("{what}\nagent logs:\n{}", self.logs())
    }

    /// Every running agent is alive and no agent of this scenario panicked.
    pub fn assert_no_panic(&mut self) {
        for n in &mut self.nodes {
            if let Some(a) = n.agent.as_mut() {
                assert!(a.is_running(), "agent exited:\n{}", a.log_tail(40));
            }
        }
        for a in self.all_agents() {
            assert!(
                !a.log().contains("panicked"),
                "agent panicked:\n{}",
                a.log_tail(40)
            );
        }
    }

    /// [`wait_until`] with [`WAIT`]; on timeout, fails with the agents' logs.
    pub async fn wait<T, C, F, Fut>(&self, what: &str, check: F) -> (T, Duration)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = C>,
        C: Check<T>,
    {
        match wait_until(what, WAIT, check).await {
            Ok(done) => done,
            Err(t) => self.fail(t),
        }
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Resizes container "app"'s CPU limit to `limit` through the `resize`
    /// subresource as field manager `manager` (the agent, VPA's updater, a
    /// person's kubectl), so `managedFields` records who wrote it.
    pub async fn resize_as(&self, name: &str, manager: &str, limit: &str) -> kube::Result<Pod> {
        self.pods()
            .patch_subresource(
                "resize",
                name,
                &kube::api::PatchParams {
                    field_manager: Some(manager.into()),
                    ..Default::default()
                },
                &kube::api::Patch::Strategic(serde_json::json!({"spec": {"containers": [
                    {"name": "app", "resources": {"limits": {"cpu": limit}}}]}})),
            )
            .await
    }

    /// Creates a pod from its JSON body in the scenario's namespace.
    pub async fn create(&self, pod: Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).expect("pod json");
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create pod")
    }

    pub async fn get(&self, name: &str) -> Pod {
        self.pods().get(name).await.expect("get pod")
    }

    /// `(name, metadata.generation)` of each pod.
    pub async fn generations(&self, names: &[&str]) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for n in names {
            out.push((n.to_string(), pod::generation(&self.get(n).await)));
        }
        out
    }

    /// Polls pod `name` until `f` holds (a failed get counts as "not yet");
    /// returns how long it took.
    pub async fn wait_pod(&self, name: &str, what: &str, f: impl Fn(&Pod) -> bool) -> Duration {
        let (pods, f) = (self.pods(), &f);
        let what = format!("{name}: {what}");
        let check = || {
            let pods = pods.clone();
            async move {
                match pods.get(name).await {
                    Ok(p) if f(&p) => Ok(()),
                    Ok(p) => Err(pod::summary(&p)),
                    Err(e) => Err(format!("get: {e}")),
                }
            }
        };
        self.wait(&what, check).await.1
    }

    /// Waits until pod `name` is Running with container statuses.
    pub async fn wait_running(&self, name: &str) {
        self.wait_pod(name, "Running", pod::is_running).await;
    }

    /// Node 0's agent's `/metrics`, parsed.
    pub async fn scrape(&self) -> Scrape {
        let text = self.agent().scrape().await.expect("scrape /metrics");
        parse_metrics(&text).expect("parse /metrics")
    }

    /// Polls node 0's `/metrics` until `f` holds (a failed scrape counts as
    /// "not yet"); returns that scrape and the wait.
    pub async fn wait_metrics(
        &self,
        what: &str,
        f: impl Fn(&Scrape) -> bool,
    ) -> (Scrape, Duration) {
        let (agent, f) = (self.agent(), &f);
        self.wait(what, || async move {
            let text = agent.scrape().await.map_err(|e| format!("scrape: {e:#}"))?;
            let s = parse_metrics(&text).expect("parse /metrics");
            if f(&s) { Ok(s) } else { Err(String::new()) }
        })
        .await
    }

    /// events.k8s.io/v1 Events regarding pod `name` with `reason`.
    pub async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    /// Waits for at least one such Event; returns them all.
    pub async fn wait_events(&self, name: &str, reason: &str) -> Vec<Event> {
        let what = format!("{reason} Event on {name}");
        let check = || async {
            let evs = self.events(name, reason).await;
            (!evs.is_empty()).then_some(evs)
        };
        self.wait(&what, check).await.0
    }

    /// `cpu.max` of `container` of pod `name` on node 0, as on disk.
    pub fn cpu_max(&self, name: &str, container: &str) -> Option<String> {
        let dir = self
            .sim()
            .container_cgroup_path(&self.ns, name, container)?;
        std::fs::read_to_string(dir.join("cpu.max"))
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// Waits until that `cpu.max` reads `want`.
    pub async fn wait_cpu_max(&self, name: &str, container: &str, want: &str) {
        let what = format!("{name}/{container}: cpu.max {want:?}");
        let check = || async {
            match self.cpu_max(name, container) {
                Some(got) if got == want => Ok(()),
                got => Err(format!("is {got:?}")),
            }
        };
        self.wait(&what, check).await;
    }
}
