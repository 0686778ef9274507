//! `headroom-agent explain NAMESPACE/POD`: one decision round, as the agent
//! would compute it now, shown for one pod of this node. Stateless: floors
//! learned from refusals and cooldowns live only in the running agent.

use foldhash::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use headroom::cgroup;
use headroom::model::PodView;
use headroom::policy::{Level, Verdict};
use headroom::quantity;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::ListParams;

use super::{parse_allocatable, parse_duration, parse_node_name};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pod, as NAMESPACE/NAME (a DNS-1123 label / subdomain).
    pub pod: String,
    /// This node; default: the pod's own node (run it on that node).
    #[arg(long, env = "NODE_NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,
    /// Root of the cgroup v2 hierarchy (the host's, or a mount of it).
    #[arg(long, default_value = "/sys/fs/cgroup", env = "HEADROOM_CGROUP_ROOT")]
    pub cgroup_root: PathBuf,
    /// Kubeconfig file; default: in-cluster config, then `KUBECONFIG`/`~/.kube/config`.
    #[arg(long, env = "HEADROOM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Time between the two cgroup samples.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Policy config file, as for `run`.
    #[arg(long, env = "HEADROOM_CONFIG")]
    pub config: Option<PathBuf>,
    /// The Node's allocatable CPU (e.g. `4000m`) if the Node cannot be read.
    #[arg(long, value_parser = parse_allocatable, env = "HEADROOM_NODE_ALLOCATABLE")]
    pub node_allocatable: Option<u64>,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(explain(a))
}

#[expect(
    clippy::too_many_lines,
    reason = "one pod's whole story, printed in the order the agent decides"
)]
async fn explain(a: Args) -> anyhow::Result<ExitCode> {
    // Validated before use: both parts go into an API path.
    let (ns, name) = headroom::names::pod_ref(&a.pod)?;
    let policy = super::run::load_policy_file(a.config.as_ref())?;
    policy.validate()?;
    let client = super::run::client(a.kubeconfig.as_ref()).await?;
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading pod {ns}/{name}"))?;
    let pod_node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let node_name = match (a.node_name.clone(), pod_node) {
        (Some(n), Some(p)) if n != p => {
            bail!("pod {ns}/{name} runs on node {p}, not on {n}: explain it on its own node")
        }
        (_, Some(p)) => p,
        (_, None) => bail!("pod {ns}/{name} is not bound to a node"),
    };
    let layout = cgroup::discover(&a.cgroup_root)
        .with_context(|| format!("cgroup root {}", a.cgroup_root.display()))?;
    let lp = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
    let pods = Api::<Pod>::all(client.clone()).list(&lp).await?;
    let views: Vec<PodView> = pods
        .items
        .iter()
        .filter_map(|p| PodView::try_from(p).ok())
        .collect();
    let allocatable = Api::<Node>::all(client.clone())
        .get_opt(&node_name)
        .await?
        .and_then(|n| {
            n.status?
                .allocatable?
                .get("cpu")
                .and_then(|q| quantity::cpu_millis(&q.0).ok())
        })
        .or(a.node_allocatable);
    let opted: HashSet<String> = Api::<Namespace>::all(client)
        .list(&ListParams::default().labels(&format!("{}=true", headroom::model::ANN_MANAGED)))
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();

    let t0 = Instant::now();
    let prev = cgroup::scan(&a.cgroup_root, &layout, 0)?;
    tokio::time::sleep(a.interval).await;
    let cur = cgroup::scan(&a.cgroup_root, &layout, t0.elapsed().as_micros() as u64)?;
    let (_, round) = headroom::reconcile::stateless::stateless_round(
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
    let Some(d) = round
        .decisions
        .iter()
        .find(|d| &*d.namespace == ns && &*d.name == name)
    else {
        bail!("pod {ns}/{name} is not readable as a pod of node {node_name}");
    };
    if a.json {
        let out = serde_json::json!({ "node": round.node, "pod": d, "reason": d.reason().map(|r| r.reason()) });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let m = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{v}m"));
    println!("pod {ns}/{name} on node {node_name}");
    match &d.verdict {
        Verdict::Managed(m) => println!(
            "  managed:        yes ({})",
            match m.level {
                Level::Pod => "pod-level limit",
                Level::Containers => "container limits",
            }
        ),
        Verdict::Unmanaged { reason: r, .. } => {
            println!("  managed:        no — {} ({})", r.reason(), r.describe());
        }
    }
    if let Some(y) = d.yielded() {
        println!("  other writer:   {}", y.describe());
        println!(
            "                  to hand the limits back: kubectl annotate pod -n {ns} {name} --overwrite {}=$(date -u +%Y-%m-%dT%H:%M:%SZ)",
            headroom::model::ANN_RESUME
        );
    }
    println!("  request:        {}m", d.request_m);
    println!("  usage:          {}m", d.usage_m);
    println!("  floor:          {}", m(d.floor_m()));
    println!("  ceiling:        {}", m(d.ceiling_m()));
    println!(
        "  current limit:  {}",
        if d.is_managed() {
            m(d.current_limit_m()).replace('-', "unlimited")
        } else {
            "-".into()
        }
    );
    let (share_m, containers) = d
        .managed()
        .map_or((0, &[][..]), |p| (p.share_m, &p.containers[..]));
    println!("  share of slack: {share_m}m");
    println!("  target:         {}", m(d.target_m()));
    for c in containers {
        println!(
            "    container {}: request {}m, limit {}, target {}m",
            c.name,
            c.request_m,
            m(c.current_limit_m),
            c.target_m
        );
    }
    let n = &round.node;
    println!(
        "node: capacity {}m, usage {}m (other {}m), reserve {}m, raw slack {}m, cpu stall {:.1}% (own throttling {:.1}%), free {}m, {} pod(s) short of CPU and owed, owed {}m, slack {}m over {} managed pods",
        n.capacity_m,
        n.usage_m,
        n.other_usage_m,
        n.reserve_m,
        n.raw_slack_m,
        n.contention.some_pct,
        n.contention.throttling_pct,
        n.contention.free_m,
        n.contention.displaced_pods,
        n.contention.demand_m,
        n.slack_m,
        n.managed_pods
    );
    // Who waited, and whether a lowering would be for them: stateless, so
    // what earlier lowerings bought is in the agent's log and Events
    // (`lowering checked`, HeadroomLoweringHelped / HeadroomLoweringUndone /
    // HeadroomLoweringNeedChanged).
    for w in &round.waited {
        println!(
            "waited: pod cgroup id {} waited for {}m (usage {}m, request {}m): {}",
            w.id,
            w.displaced_m,
            w.usage_m,
            w.request_m,
            w.verdict()
        );
    }
    Ok(ExitCode::SUCCESS)
}
