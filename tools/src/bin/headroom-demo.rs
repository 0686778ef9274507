//! `scripts/demo`: Headroom deciding and acting with no cluster to set up.
//! Starts the test kit's real etcd + kube-apiserver, a simulated kubelet (one
//! 4-CPU node whose cgroup files it writes) and the real agent; opts in two
//! pods, changes the load over `--duration`, and prints a live table of each
//! pod's usage and limit and the node's real slack, once a second. Writes the
//! series as CSV for the chart (scripts/demo draws it with matplotlib).
//!
//!     headroom-demo [--duration SECS] [--csv PATH]

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use testkit::agent::{AgentOptions, AgentProcess, fast_args_with, metric, parse_metrics};
use testkit::control_plane::ControlPlane;
use testkit::kubelet_sim::{SimConfig, SimKubelet};

/// The opted-in pods: (name, request, limit).
const MANAGED: [(&str, &str, &str); 2] = [("web", "500m", "600m"), ("api", "250m", "300m")];
/// A pod that is not opted in and fills the node in the middle phase.
const NEIGHBOUR: &str = "batch";

struct Args {
    duration: Duration,
    csv: PathBuf,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        duration: Duration::from_secs(60),
        csv: PathBuf::from("target/demo/demo.csv"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--duration" => {
                let s: u64 = v
                    .parse()
                    .with_context(|| format!("--duration {v:?}: seconds"))?;
                if !(9..=600).contains(&s) {
                    bail!("--duration must be 9 to 600 seconds (three phases of at least 3 s)");
                }
                a.duration = Duration::from_secs(s);
            }
            "--csv" => a.csv = PathBuf::from(v),
            _ => bail!("unknown flag {flag} (--duration SECS, --csv PATH)"),
        }
    }
    Ok(a)
}

/// Load of each pod in each third of the run: idle neighbour (limits open
/// up), busy neighbour (they fall back toward the requests), idle again.
fn demand(phase: usize, pod: &str) -> u64 {
    match (phase, pod) {
        (_, "web") => 580,
        (_, "api") => 290,
        (1, NEIGHBOUR) => 3600,
        _ => 0,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    eprintln!("starting etcd + kube-apiserver, a simulated 4-CPU node and the agent…");
    let cp = tokio::task::spawn_blocking(ControlPlane::shared).await?;
    let client = cp.client().await;
    let ns = cp.namespace("demo").await;
    testkit::workload::opt_in(&client, &ns).await?;
    let dir = tempfile::tempdir()?;
    let node = format!("{ns}-node");
    let root = dir.path().join("cgroup");
    let sim = SimKubelet::start(client.clone(), SimConfig::new(&node, &root)).await?;
    cp.wait_node_admissible(&node).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, req, lim) in MANAGED {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": req, "memory": "64Mi"}, "limits": {"cpu": lim}}}]}
        }))?;
        pods.create(&PostParams::default(), &p).await?;
    }
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": NEIGHBOUR, "annotations": {"headroom.dev/managed": "false"}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}]}
    }))?;
    pods.create(&PostParams::default(), &p).await?;
    // The agent as deployed, but a faster tick and cooldown so a minute shows
    // every phase.
    let agent_args = fast_args_with(&[("--reserve", "100m"), ("--raise-cooldown", "3s")]);
    let opts = AgentOptions::on(&sim)
        .kubeconfig(cp.kubeconfig_path())
        .log_dir(dir.path())
        .args(agent_args);
    let agent = AgentProcess::start(opts).await?;

    if let Some(parent) = a.csv.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut csv =
        std::fs::File::create(&a.csv).with_context(|| format!("creating {}", a.csv.display()))?;
    writeln!(csv, "t_s,pod,usage_m,limit_m,real_slack_m")?;
    let tty = std::io::stdout().is_terminal();
    let t0 = Instant::now();
    let mut phase = usize::MAX;
    let mut rows: Vec<String> = Vec::new();
    while t0.elapsed() < a.duration {
        let p = ((t0.elapsed().as_secs_f64() / a.duration.as_secs_f64()) * 3.0) as usize;
        if p != phase {
            phase = p.min(2);
            for name in MANAGED.iter().map(|m| m.0).chain([NEIGHBOUR]) {
                sim.set_demand(&ns, name, demand(phase, name));
            }
        }
        let scrape = agent
            .scrape()
            .await
            .ok()
            .and_then(|t| parse_metrics(&t).ok());
        let gauge = |name: &str, pod: Option<&str>| {
            let scrape = scrape.as_ref()?;
            match pod {
                Some(p) => metric(scrape, name, &[("namespace", &ns), ("pod", p)]),
                None => metric(scrape, name, &[]),
            }
        };
        let slack = gauge("headroom_node_real_slack_millicores", None);
        let t = t0.elapsed().as_secs_f64();
        let mut line = format!(
            "{:>5.1}s  {:<34}  slack {:>6}",
            t,
            [
                "neighbour idle: limits open up",
                "neighbour busy (3.6 CPUs): limits fall back",
                "neighbour idle again: limits open up"
            ][phase],
            slack.map_or("-".into(), |s| format!("{s:.0}m")),
        );
        for (name, _, _) in MANAGED {
            let pod = pods.get(name).await?;
            let lim = testkit::workload::container_limit_m(&pod);
            let usage = gauge("headroom_pod_cpu_usage_millicores", Some(name));
            line += &format!(
                "  {name} {:>5} / {:>5}",
                usage.map_or("-".into(), |u| format!("{u:.0}m")),
                lim.map_or("-".into(), |l| format!("{l}m")),
            );
            writeln!(
                csv,
                "{t:.1},{name},{},{},{}",
                usage.map_or(String::new(), |u| format!("{u:.0}")),
                lim.map_or(String::new(), |l| l.to_string()),
                slack.map_or(String::new(), |s| format!("{s:.0}")),
            )?;
        }
        if tty {
            // A live table: redraw the last rows in place.
            rows.push(line);
            let shown = &rows[rows.len().saturating_sub(15)..];
            print!(
                "\x1b[H\x1b[2J   time  phase                               real slack  pod usage / limit\n{}\n",
                shown.join("\n")
            );
        } else {
            println!("{line}");
        }
        std::io::stdout().flush()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let log = agent.log();
    let resized: Vec<&str> = log.lines().filter(|l| l.contains(" resized")).collect();
    println!("\nthe agent's resizes ({}):", resized.len());
    for l in &resized {
        println!("  {}", l.split_once("resized").map_or(*l, |x| x.1).trim());
    }
    println!("series: {}", a.csv.display());
    Ok(())
}
