//! `headroom-agent plan`: the agent's decision for every pod of a node, from
//! files only — a cgroup tree sampled twice (or two recorded samples) and the
//! node's pods and Node as JSON. Runs the same code as `run` (scan, slack,
//! `decide_round`, `policy::plan`) with no cluster and no memory: every pod
//! is seen for the first time, as after an agent start.

use foldhash::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use headroom::cgroup;
use headroom::model::{CgroupPodId, PodView, Uid};
use headroom::policy::{Decision, PatchPlan, TokenBucket};
use headroom::reconcile::Round;
use headroom::signal::usage::{CapacitySource, NodeUsage, booked_request};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::{parse_allocatable, parse_duration, parse_node_name};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Root of the cgroup v2 hierarchy (a host mount or a fixture's `root/`): the first sample.
    #[arg(long, default_value = "/sys/fs/cgroup", env = "HEADROOM_CGROUP_ROOT")]
    pub cgroup_root: PathBuf,
    /// A second, recorded sample of the same tree taken `--interval` after
    /// `--cgroup-root` (a fixture's `later/`); without it the tree at
    /// `--cgroup-root` is sampled again after `--interval`.
    #[arg(long, env = "HEADROOM_LATER_ROOT")]
    pub later: Option<PathBuf>,
    /// Time between the two samples.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// The node's pods as JSON: a PodList (`kubectl get pods -o json
    /// --field-selector spec.nodeName=N`) or one Pod.
    #[arg(long, env = "HEADROOM_PODS_FILE")]
    pub pods: PathBuf,
    /// The Node as JSON (`kubectl get node N -o json`): its name and allocatable CPU.
    #[arg(long, env = "HEADROOM_NODE_FILE")]
    pub node: Option<PathBuf>,
    /// This node's name; default: the name in `--node`.
    #[arg(long, env = "NODE_NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,
    /// The Node's allocatable CPU (e.g. `4000m`) when `--node` gives none.
    #[arg(long, value_parser = parse_allocatable, env = "HEADROOM_NODE_ALLOCATABLE")]
    pub node_allocatable: Option<u64>,
    /// A namespace labelled `headroom.dev/managed=true` (repeat for more;
    /// pods can also opt in with the annotation).
    #[arg(long = "opted-in-namespace", value_name = "NAMESPACE")]
    pub opted_in: Vec<String>,
    /// Policy config file (TOML, or JSON by extension), as for `run`.
    #[arg(long, env = "HEADROOM_CONFIG")]
    pub config: Option<PathBuf>,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let policy = super::run::load_policy_file(a.config.as_ref())?;
    policy.validate()?;
    let pods = read_pods(&a.pods)?;
    let node: Option<Node> = a.node.as_ref().map(|p| read_json(p)).transpose()?;
    let node_name = a
        .node_name
        .clone()
        .or_else(|| node.as_ref().and_then(|n| n.metadata.name.clone()))
        .context("no node name: give --node-name or --node")?;
    let allocatable = node
        .as_ref()
        .and_then(|n| n.status.as_ref()?.allocatable.as_ref()?.get("cpu").cloned())
        .map(|q| {
            headroom::quantity::cpu_millis(&q.0).with_context(|| "Node allocatable cpu".to_string())
        })
        .transpose()?
        .or(a.node_allocatable);
    let mut views = Vec::new();
    for p in &pods {
        match PodView::try_from(p) {
            Ok(v) if v.node_name.as_deref() == Some(node_name.as_str()) => views.push(v),
            Ok(_) => {}
            Err(e) => tracing::warn!(pod = ?p.metadata.name, error = %e, "skipping unreadable pod"),
        }
    }

    // The error names the root already.
    let layout = cgroup::discover(&a.cgroup_root)?;
    let interval_us = a.interval.as_micros() as u64;
    let (prev, cur) = match &a.later {
        Some(later) => {
            let later_layout = cgroup::discover(later)?;
            (
                cgroup::scan(&a.cgroup_root, &layout, 0).context("first sample")?,
                cgroup::scan(later, &later_layout, interval_us).context("second sample")?,
            )
        }
        None => {
            let t0 = Instant::now();
            let prev = cgroup::scan(&a.cgroup_root, &layout, 0).context("first sample")?;
            std::thread::sleep(a.interval);
            let at = t0.elapsed().as_micros() as u64;
            (
                prev,
                cgroup::scan(&a.cgroup_root, &layout, at).context("second sample")?,
            )
        }
    };
    let opted: HashSet<String> = a.opted_in.iter().cloned().collect();
    let (s, round) = headroom::reconcile::stateless::stateless_round(
        &headroom::reconcile::stateless::Node {
            name: &node_name,
            views: &views,
            allocatable_m: allocatable,
            opted_in_namespaces: &opted,
        },
        prev,
        cur,
        &a.cgroup_root,
        &policy,
    );
    let mut bucket = TokenBucket::from_config(&policy);
    let outcome = headroom::policy::plan(
        &round.node,
        &round.decisions,
        |_| None,
        0.0,
        &mut bucket,
        &policy,
    );
    let report = Report::new(&node_name, &views, allocatable, &s, &round, &outcome);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        print!("{}", report.text());
    }
    Ok(ExitCode::SUCCESS)
}

/// The pod's CPU limit: pod-level, else the sum of its containers' when
/// every one has a limit; `None` when some container is unlimited.
fn spec_limit(v: &PodView) -> Option<u64> {
    v.pod_resources
        .and_then(|r| r.cpu_limit)
        .or_else(|| v.containers.iter().map(|c| c.resources.cpu_limit).sum())
}

fn read_json<T: serde::de::DeserializeOwned>(p: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

/// The pods of a `--pods` file as views; unreadable ones are logged and skipped.
pub fn read_views(p: &Path) -> anyhow::Result<Vec<PodView>> {
    let mut out = Vec::new();
    for pod in read_pods(p)? {
        match PodView::try_from(&pod) {
            Ok(v) => out.push(v),
            Err(e) => {
                tracing::warn!(pod = ?pod.metadata.name, error = %e, "skipping unreadable pod")
            }
        }
    }
    Ok(out)
}

/// A PodList's items, or one Pod.
fn read_pods(p: &Path) -> anyhow::Result<Vec<Pod>> {
    let v: Value = read_json(p)?;
    let items = match v.get("items") {
        Some(items) => items.clone(),
        None => Value::Array(vec![v]),
    };
    serde_json::from_value(items).with_context(|| format!("parsing the pods of {}", p.display()))
}

struct Report<'a> {
    node_name: &'a str,
    /// QoS class by pod uid, from the pods' status.
    qos: HashMap<Uid, &'static str>,
    /// The pod's CPU limit from its spec, by uid (`None`: unlimited).
    limits: HashMap<Uid, Option<u64>>,
    /// The pod's usage over the interval, by uid (read from its cgroup).
    usage: HashMap<Uid, u64>,
    /// `namespace/name` by cgroup id: who a wait read from a cgroup was.
    keys: HashMap<CgroupPodId, String>,
    slack: &'a NodeUsage,
    round: &'a Round,
    patches: &'a [PatchPlan],
    held: &'a [headroom::policy::Hold],
    booked_slack: Option<i64>,
}

fn m(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v}m"))
}

pub fn capacity_source(c: CapacitySource) -> &'static str {
    match c {
        CapacitySource::KubepodsCpuMax => "kubepods cpu.max",
        CapacitySource::NodeAllocatable => "Node allocatable",
        CapacitySource::OnlineCpus => "CPUs in cpuset.cpus.effective",
        CapacitySource::SharedPool => "shared CPU pool (static CPU manager)",
        CapacitySource::Unknown => "unknown",
    }
}

impl<'a> Report<'a> {
    /// What the report prints of `views`, joined with the round's figures.
    fn new(
        node_name: &'a str,
        views: &[PodView],
        allocatable: Option<u64>,
        s: &'a NodeUsage,
        round: &'a Round,
        outcome: &'a headroom::policy::PlanOutcome,
    ) -> Self {
        let booked: u64 = views
            .iter()
            .filter(|v| !v.terminating)
            .map(booked_request)
            .sum();
        let booked_slack = allocatable.map(|a| a as i64 - booked as i64);
        let qos = views
            .iter()
            .map(|v| (v.uid.clone(), v.qos.as_str()))
            .collect();
        let limits = views
            .iter()
            .map(|v| (v.uid.clone(), spec_limit(v)))
            .collect();
        let by_id: HashMap<&CgroupPodId, u64> = s
            .pods
            .iter()
            .filter_map(|p| Some((&p.id, p.usage_m?)))
            .collect();
        let usage = views
            .iter()
            .filter_map(|v| Some((v.uid.clone(), *by_id.get(&v.cgroup_id)?)))
            .collect();
        let keys = views
            .iter()
            .map(|v| (v.cgroup_id.clone(), v.key()))
            .collect();
        Report {
            node_name,
            qos,
            limits,
            usage,
            keys,
            slack: s,
            round,
            patches: &outcome.patches,
            held: &outcome.held,
            booked_slack,
        }
    }
}

impl Report<'_> {
    /// What happens to a pod: the patch, the hold, or nothing.
    fn decision(&self, d: &Decision) -> (String, String) {
        if let Some(p) = self.patches.iter().find(|p| p.uid == d.uid) {
            let verb = match (p.old_total_m, p.direction) {
                (None, _) => "adopt",
                (_, headroom::policy::Direction::Raise) => "raise",
                (_, headroom::policy::Direction::Lower) => "lower",
            };
            return (verb.into(), p.why.clone());
        }
        if let Some(h) = self.held.iter().find(|h| h.uid == d.uid) {
            return (
                "hold".into(),
                format!(
                    "{}: {} → {} held ({})",
                    h.reason.as_str(),
                    m(h.current_m),
                    m(Some(h.target_m)),
                    match h.reason {
                        headroom::policy::HoldReason::DeadBand => "step inside the dead band",
                        headroom::policy::HoldReason::Cooldown => "raised too recently",
                        headroom::policy::HoldReason::RateLimited => "node-wide patch rate",
                    }
                ),
            );
        }
        if let Some(y) = d.yielded() {
            return ("leave".into(), format!("not managed: {}", y.describe()));
        }
        match d.reason() {
            Some(r) => ("leave".into(), format!("not managed: {}", r.describe())),
            None => ("keep".into(), "limit is at its target".into()),
        }
    }

    fn usage_of(&self, d: &Decision) -> Option<u64> {
        self.usage.get(&d.uid).copied()
    }

    fn qos_of(&self, d: &Decision) -> &'static str {
        self.qos.get(&d.uid).copied().unwrap_or("-")
    }

    /// One pod that waited for CPU others held, and whether that is owed.
    fn waited(&self, w: &headroom::signal::contention::Displaced, free_m: u64) -> String {
        let key = self
            .keys
            .get(&w.id)
            .map_or_else(|| w.id.to_string(), Clone::clone);
        let what = format!(
            "waited: {key} waited for {}m (usage {}m, request {}m; node free {free_m}m)",
            w.displaced_m, w.usage_m, w.request_m
        );
        format!("{what}: {}", w.verdict())
    }

    fn text(&self) -> String {
        let s = self.slack;
        let n = &self.round.node;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "node {}: capacity {}m ({}), usage {}m over {:.1}s, real slack {}m, booked slack {}",
            self.node_name,
            s.capacity_m,
            capacity_source(s.capacity_source),
            s.usage_m,
            s.interval_us as f64 / 1e6,
            n.slack_m,
            self.booked_slack
                .map_or_else(|| "-".into(), |b| format!("{b}m")),
        );
        let _ = writeln!(
            o,
            "  real slack = capacity {}m − reserve {}m − other usage {}m − managed usage within requests {}m − owed to {} displaced pod(s) {}m",
            n.capacity_m,
            n.reserve_m,
            n.other_usage_m,
            n.managed_within_request_m,
            n.contention.displaced_pods,
            n.contention.demand_m,
        );
        for w in &self.round.waited {
            let _ = writeln!(o, "  {}", self.waited(w, n.contention.free_m));
        }
        let mut decisions: Vec<&Decision> = self.round.decisions.iter().collect();
        decisions.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        let keys: Vec<String> = decisions
            .iter()
            .map(|d| format!("{}/{}", d.namespace, d.name))
            .collect();
        let w = keys.iter().map(String::len).max().unwrap_or(0).max(3);
        let mw = decisions
            .iter()
            .map(|d| d.reason().map_or(3, |r| r.reason().len()))
            .max()
            .unwrap_or(0)
            .max(7);
        let _ = writeln!(
            o,
            "\n{:<w$}  {:<10}  {:<mw$}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  DECISION",
            "POD", "QOS", "MANAGED", "REQUEST", "LIMIT", "USAGE", "FLOOR", "CEILING", "TARGET"
        );
        let mut reasons = Vec::new();
        for (d, key) in decisions.iter().zip(&keys) {
            let (verb, why) = self.decision(d);
            let managed = match d.reason() {
                None => "yes".to_string(),
                Some(r) => r.reason().to_string(),
            };
            let limit = self
                .limits
                .get(&d.uid)
                .copied()
                .flatten()
                .map_or_else(|| "none".into(), |v| format!("{v}m"));
            let _ = writeln!(
                o,
                "{:<w$}  {:<10}  {:<mw$}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {:>7}  {}",
                key,
                self.qos_of(d),
                managed,
                format!("{}m", d.request_m),
                limit,
                m(self.usage_of(d)),
                m(d.floor_m()),
                m(d.ceiling_m()),
                m(d.target_m()),
                verb,
            );
            reasons.push(format!("  {key}: {why}"));
        }
        let _ = writeln!(o, "\nwhy:");
        for r in reasons {
            let _ = writeln!(o, "{r}");
        }
        o
    }

    fn json(&self) -> Value {
        let pods: Vec<Value> = self
            .round
            .decisions
            .iter()
            .map(|d| {
                let (verb, why) = self.decision(d);
                json!({
                    "namespace": d.namespace,
                    "name": d.name,
                    "uid": d.uid,
                    "qos": self.qos_of(d),
                    "managed": d.is_managed(),
                    "unmanaged_reason": d.reason().map(|r| r.reason()),
                    "yielded_to": d.yielded(),
                    "request_millicores": d.request_m,
                    "limit_millicores": d.current_limit_m(),
                    "declared_limit_millicores": d.managed().and_then(|m| m.declared_limit_m),
                    "usage_millicores": self.usage_of(d),
                    "floor_millicores": d.floor_m(),
                    "ceiling_millicores": d.ceiling_m(),
                    "target_millicores": d.target_m(),
                    "decision": verb,
                    "why": why,
                })
            })
            .collect();
        let s = self.slack;
        json!({
            "node": {
                "name": self.node_name,
                "capacity_millicores": s.capacity_m,
                "capacity_source": s.capacity_source,
                "usage_millicores": s.usage_m,
                "interval_us": s.interval_us,
                "real_slack_millicores": self.round.node.slack_m,
                "booked_slack_millicores": self.booked_slack,
                "decision": self.round.node,
            },
            "pods": pods,
            "patches": self.patches,
        })
    }
}
