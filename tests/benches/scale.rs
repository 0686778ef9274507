//! Fleet scale (issue 16): what N Headroom agents cost one real
//! kube-apiserver, next to a central design that watches every pod of the
//! cluster, and what a restart of all agents at once does. A benchmark that
//! prints figures; it asserts nothing about time.
//!
//! Run: `cargo bench -p headroom-tests --bench scale`
//!
//! One control plane (etcd + kube-apiserver 1.37 on loopback); N simulated
//! nodes, each a `SimKubelet` in this process (its own pod watch on
//! `spec.nodeName`, cgroup tree, status patches) with `SCALE_PODS` pods of
//! the footprint mix, and for each node a real RELEASE `headroom-agent`
//! process with default flags (tick 1 s), its own client certificate (user
//! `scale-agent-<i>`) and its own byte-counting relay in front of the
//! apiserver. For each N (ascending; nodes are added, never removed) three
//! configurations, each measured steady and under churn:
//!
//! - `sims`: the simulated kubelets and the churn driver alone (baseline);
//! - `central`: plus ONE client with an unfiltered pod watch (kube-runtime's
//!   watcher + reflector, as a VPA-style controller keeps all pods);
//! - `agents`: plus N agents (started all at once: the cold-start burst).
//!
//! Churn: every `SCALE_CHURN_EVERY_S` each node gets 1 pod deleted and
//! replaced under a new name and 2 pods a new CPU demand (the agents then
//! patch limits; the sims apply them and patch status).
//!
//! Measured: the apiserver's and etcd's CPU (/proc utime+stime) and RSS;
//! per-client requests by verb and resource from the apiserver's audit log
//! (policy: `Metadata` for the agents' and the central watcher's groups
//! only, so sims and driver are not counted); watches held (audit, and the
//! `apiserver_longrunning_requests` gauge); bytes received per client
//! counted at the client side of its relay (TLS bytes); lists served from
//! the watch cache vs from etcd (`apiserver_storage_list_total` by its
//! `storage` label); the tick rate the agents sustain
//! (`headroom_scan_duration_seconds_count`). At the largest N the agents
//! are then all restarted at once (a rollout stampede): peak requests per
//! second, time until all are ready, until the last request of the burst.
//!
//! Environment (all optional): `SCALE_N` = node counts (`1,10,25,50,100`),
//! `SCALE_PODS` = pods per node (10), `SCALE_WINDOW_S` = each measuring
//! window (15), `SCALE_CHURN_EVERY_S` (10), `SCALE_PARTS` = `curve,stampede`
//! (also `reaction`: part 4, one node with the footprint's 250 pods among
//! `SCALE_REACTION_NODES` = 50 nodes with agents, `SCALE_REACTION_REPS` =
//! 10 load changes, alternately filling and freeing the node).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use testkit::agent::{AgentOptions, AgentProcess, metric, parse_metrics, release_agent_binary};
use testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use testkit::kubelet_sim::{SimConfig, SimKubelet};
use testkit::scale::audit::{Tail, Tally, policy_yaml};
use testkit::scale::fit;
use testkit::scale::proxy::{Counters, Relay};
use testkit::scale::{markdown_table, quantile, scaled_mix, sig3};
use testkit::workload::{Churn, FOOTPRINT_MIX, Kind, Spec, create_all, mix, opt_in, wait_running};

const CMD: &str = "cargo bench -p headroom-tests --bench scale";
const AGENT_GROUP: &str = "headroom:scale-agents";
const CENTRAL_GROUP: &str = "headroom:scale-central";
const CENTRAL_USER: &str = "scale-central";
/// The extrapolation target.
const FLEET_NODES: f64 = 5000.0;
const FLEET_PODS_PER_NODE: f64 = 110.0;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn part_enabled(part: &str) -> bool {
    std::env::var("SCALE_PARTS")
        .unwrap_or_else(|_| "curve,stampede".into())
        .split(',')
        .any(|p| p.trim() == part)
}

fn is_agent(u: &str) -> bool {
    u.starts_with("scale-agent-")
}

fn is_central(u: &str) -> bool {
    u == CENTRAL_USER
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

struct Settings {
    ns: Vec<usize>,
    pods: usize,
    window: Duration,
    churn_every: Duration,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let list = std::env::var("SCALE_N").unwrap_or_else(|_| "1,10,25,50,100".into());
        let mut ns = Vec::new();
        for x in list.split(',') {
            let n: usize = x
                .trim()
                .parse()
                .with_context(|| format!("SCALE_N: {x:?} is not a count"))?;
            if n == 0 {
                bail!("SCALE_N: 0 nodes");
            }
            ns.push(n);
        }
        ns.sort_unstable();
        ns.dedup();
        Ok(Settings {
            ns,
            pods: env_u64("SCALE_PODS", 10) as usize,
            window: Duration::from_secs(env_u64("SCALE_WINDOW_S", 15)),
            churn_every: Duration::from_secs(env_u64("SCALE_CHURN_EVERY_S", 10).max(1)),
        })
    }
}

fn main() -> anyhow::Result<()> {
    let set = Settings::from_env()?;
    let bin = release_agent_binary()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let policy = dir.path().join("audit-policy.yaml");
        std::fs::write(&policy, policy_yaml(&[AGENT_GROUP, CENTRAL_GROUP]))?;
        let audit_log = dir.path().join("audit.log");
        let opts = ControlPlaneOptions {
            extra_args: vec![
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", audit_log.display()),
                "--audit-log-maxsize=0".into(),
            ],
            ..Default::default()
        };
        let cp = ControlPlane::start(opts).await?;
        println!("# {CMD}");
        println!(
            "agent binary: {}; apiserver {}; SCALE_N={:?} SCALE_PODS={} SCALE_WINDOW_S={} \
             SCALE_CHURN_EVERY_S={}",
            bin.display(),
            cp.apiserver_version(),
            set.ns,
            set.pods,
            set.window.as_secs(),
            set.churn_every.as_secs()
        );
        let client = cp.client().await;
        bind_groups(&client).await?;
        let mut bench = Bench {
            client,
            cp: &cp,
            bin,
            dir: dir.path().to_path_buf(),
            set,
            nodes: Vec::new(),
            agents: Vec::new(),
            tally: Tally::default(),
            tail: Tail::new(&audit_log),
        };
        let t0 = Instant::now();
        if part_enabled("curve") || part_enabled("stampede") {
            bench.curve().await?;
        }
        if part_enabled("reaction") {
            bench.reaction().await?;
        }
        println!("\nbench took {:.1?}", t0.elapsed());
        Ok(())
    })
}

// ---------------------------------------------------------------- /proc

#[derive(Clone, Copy, Debug)]
struct Proc {
    at: Instant,
    cpu_ticks: u64,
    rss_kib: u64,
}

fn proc_of(pid: u32) -> anyhow::Result<Proc> {
    let p = procfs::process::Process::new(pid as i32)?;
    let stat = p.stat()?;
    Ok(Proc {
        at: Instant::now(),
        cpu_ticks: stat.utime + stat.stime,
        rss_kib: p.status()?.vmrss.unwrap_or(0),
    })
}

fn millicores(a: &Proc, b: &Proc) -> f64 {
    let cpu_s = b.cpu_ticks.saturating_sub(a.cpu_ticks) as f64 / procfs::ticks_per_second() as f64;
    cpu_s / (b.at - a.at).as_secs_f64().max(1e-9) * 1000.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

// ---------------------------------------------------------------- nodes

/// Binds the measured clients' groups to cluster-admin (what they may do is
/// not what this bench measures; the chart's ClusterRole is narrower).
async fn bind_groups(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let crb: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "headroom-scale-bench"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": AGENT_GROUP},
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": CENTRAL_GROUP}
        ]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&Default::default(), &crb)
        .await
        .context("creating the bench's ClusterRoleBinding")?;
    Ok(())
}

/// A kubeconfig for `user` in `group` (bound to cluster-admin by
/// [`bind_groups`]) whose server is the relay at `port`.
fn client_kubeconfig(
    cp: &ControlPlane,
    dir: &Path,
    user: &str,
    group: &str,
    port: u16,
) -> anyhow::Result<PathBuf> {
    // One group only: the harness's certificates keep a single O=.
    let (cert, key) = cp.client_cert(user, &[group])?;
    let ca = dir.join("ca.pem");
    if !ca.exists() {
        std::fs::write(&ca, cp.ca_pem())?;
    }
    let cert_p = dir.join(format!("{user}.crt"));
    let key_p = dir.join(format!("{user}.key"));
    std::fs::write(&cert_p, cert)?;
    std::fs::write(&key_p, key)?;
    let path = dir.join(format!("{user}.kubeconfig"));
    let kubeconfig = testkit::certs::Kubeconfig {
        server: &format!("https://127.0.0.1:{port}"),
        ca: &ca.display().to_string(),
        user,
        auth: testkit::certs::KubeconfigAuth::Cert {
            cert: &cert_p.display().to_string(),
            key: &key_p.display().to_string(),
        },
        namespace: None,
    };
    std::fs::write(&path, kubeconfig.yaml())?;
    Ok(path)
}

/// One simulated node: its namespace (opted in), kubelet, churn, and the
/// relay and identity its agent uses.
struct SimNode {
    ns: String,
    node: String,
    root: PathBuf,
    sim: SimKubelet,
    churn: Churn,
    relay: Relay,
    kubeconfig: PathBuf,
}

// ---------------------------------------------------------------- windows

/// The apiserver and etcd at one moment.
struct Sample {
    wall_us: i64,
    api: Proc,
    etcd: Proc,
    me: Proc,
    metrics: prometheus_parse::Scrape,
}

/// What one measuring window saw.
#[derive(Clone, Debug, Default)]
struct Window {
    secs: f64,
    api_cpu_m: f64,
    api_rss_mib: f64,
    etcd_cpu_m: f64,
    /// The bench process (sims, driver, relays, central watcher).
    bench_cpu_m: f64,
    /// All requests the apiserver counted (`apiserver_request_total`), /min.
    api_req_per_min: f64,
    /// Requests of the measured clients (audit), by key, per minute.
    req_per_min: BTreeMap<String, f64>,
    /// Bytes the measured clients received, per minute (all of them).
    rx_per_min: f64,
    /// Watches the measured clients hold at the window's end (audit).
    watches: usize,
    /// `apiserver_longrunning_requests{verb=WATCH}` at the end (everyone).
    watch_gauge: f64,
    /// Agents only: scans per second per agent (min, median).
    ticks: Option<(f64, f64)>,
    /// Agents only: their total CPU, millicores.
    agents_cpu_m: f64,
    agents_rss_mib: f64,
}

impl Window {
    fn total_req_per_min(&self) -> f64 {
        self.req_per_min.values().sum()
    }
}

fn watch_gauge(s: &prometheus_parse::Scrape) -> f64 {
    metric(s, "apiserver_longrunning_requests", &[("verb", "WATCH")]).unwrap_or(f64::NAN)
}

fn requests_total(s: &prometheus_parse::Scrape) -> f64 {
    metric(s, "apiserver_request_total", &[]).unwrap_or(0.0)
}

/// Pod lists served from the watch cache and from etcd so far. Since 1.37,
/// `apiserver_storage_list_total` counts both, told apart by its `storage`
/// label (`watchcache` / `etcd`), and the older `apiserver_cache_list_total`
/// is deprecated (hidden); before, the storage metric counted etcd only.
fn pod_lists(s: &prometheus_parse::Scrape) -> (f64, f64) {
    let pods = |x: &&prometheus_parse::Sample| x.labels.get("resource") == Some("pods");
    let old_cache: f64 = s
        .samples
        .iter()
        .filter(|x| x.metric == "apiserver_cache_list_total")
        .filter(pods)
        .map(value)
        .sum();
    let storage = |backend: Option<&str>| -> f64 {
        s.samples
            .iter()
            .filter(|x| x.metric == "apiserver_storage_list_total")
            .filter(pods)
            .filter(|x| x.labels.get("storage") == backend)
            .map(value)
            .sum()
    };
    let cache = old_cache + storage(Some("watchcache"));
    let etcd = storage(Some("etcd")) + storage(None);
    (cache, etcd)
}

fn value(x: &prometheus_parse::Sample) -> f64 {
    match x.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => v,
        _ => 0.0,
    }
}

/// Which clients a window measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Measured {
    Sims,
    Central,
    Agents,
}

struct Bench<'a> {
    cp: &'a ControlPlane,
    client: Client,
    bin: PathBuf,
    dir: PathBuf,
    set: Settings,
    nodes: Vec<SimNode>,
    agents: Vec<AgentProcess>,
    tally: Tally,
    tail: Tail,
}

/// One row of the N curve.
struct Point {
    n: usize,
    sims: (Window, Window),
    central: (Window, Window),
    agents: (Window, Window),
    central_list_bytes: f64,
    central_ready: Duration,
    cold: Startup,
}

/// A start of all agents at once.
#[derive(Clone, Debug, Default)]
struct Startup {
    n: usize,
    all_ready: Duration,
    /// From the start until the last agent request of the burst.
    last_request: Duration,
    peak_rps: u64,
    /// The first seconds' request counts.
    per_second: Vec<u64>,
    requests: BTreeMap<String, u64>,
    rx_bytes: f64,
    cache_lists: f64,
    storage_lists: f64,
    api_cpu_m: f64,
    api_rss_peak_mib: f64,
}

impl Bench<'_> {
    /// The release agent for `node` through its relay (`kubeconfig`),
    /// `RUST_LOG=info`, default flags.
    fn agent_options(&self, kubeconfig: &Path, node: &str, root: &Path) -> AgentOptions {
        AgentOptions::default()
            .bin(&self.bin)
            .rust_log("info")
            .kubeconfig(kubeconfig)
            .node(node)
            .cgroup_root(root)
            .log_dir(&self.dir)
    }

    async fn sample(&self) -> anyhow::Result<Sample> {
        // A reused connection the apiserver just closed fails one request
        // ("connection closed before message completed"): retry, bounded.
        let mut tries = 0;
        let text = loop {
            let req = http::Request::get("/metrics").body(Vec::new())?;
            match self.client.request_text(req).await {
                Ok(t) => break t,
                Err(e) if tries < 3 => {
                    tries += 1;
                    eprintln!("scraping the apiserver failed ({e}); retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        Ok(Sample {
            wall_us: now_us(),
            api: proc_of(self.cp.apiserver_pid())?,
            etcd: proc_of(self.cp.etcd_pid())?,
            me: proc_of(std::process::id())?,
            metrics: parse_metrics(&text)?,
        })
    }

    /// Adds simulated nodes (pods created and Running) up to `n`.
    async fn grow(&mut self, n: usize) -> anyhow::Result<()> {
        let t0 = Instant::now();
        let before = self.nodes.len();
        let mut pods = 0;
        while self.nodes.len() < n {
            let i = self.nodes.len();
            let ns = self.cp.try_namespace(&format!("scale-{i}")).await?;
            opt_in(&self.client, &ns).await?;
            let node = format!("scale-node-{i}");
            let root = self.dir.join(format!("cg-{i}"));
            let mut cfg = SimConfig::new(&node, &root);
            cfg.tick = Duration::from_secs(1);
            let sim = SimKubelet::start(self.client.clone(), cfg).await?;
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            let specs = mix(&node, &scaled_mix(self.set.pods));
            for s in &specs {
                sim.set_demand(&ns, &s.name, s.demand_m);
            }
            create_all(&api, specs.iter().map(|s| s.body.clone()).collect()).await?;
            pods += specs.len();
            let relay = Relay::start(self.cp.port()).await?;
            let kubeconfig = client_kubeconfig(
                self.cp,
                &self.dir,
                &format!("scale-agent-{i}"),
                AGENT_GROUP,
                relay.port,
            )?;
            let churn = Churn::new(api, &ns, &node, &specs, 0x5ca1e + i as u64);
            self.nodes.push(SimNode {
                ns,
                node,
                root,
                sim,
                churn,
                relay,
                kubeconfig,
            });
        }
        // The resize admission plugin must know the last Node (they were
        // registered in order) before an agent patches.
        if let Some(last) = self.nodes.last() {
            self.cp.wait_node_admissible(&last.node).await?;
        }
        for nd in &self.nodes[before..] {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &nd.ns);
            wait_running(&api, self.set.pods, Duration::from_secs(300)).await?;
        }
        println!(
            "  nodes {before} → {n}: {pods} pods created and Running in {:.1?}",
            t0.elapsed()
        );
        Ok(())
    }

    /// One churn round on every node at once.
    async fn churn_step(&mut self) -> anyhow::Result<()> {
        let steps = self.nodes.iter_mut().map(|nd| nd.churn.step(&nd.sim, 1, 2));
        // A failed request of the driver is logged, not fatal: the next
        // round goes on (the figures are per window, not per request).
        for r in futures::future::join_all(steps).await {
            if let Err(e) = r {
                eprintln!("churn step failed: {e:#}");
            }
        }
        Ok(())
    }

    /// Measures one window of `self.set.window`, churning if asked.
    async fn window(
        &mut self,
        measured: Measured,
        churn: bool,
        central: Option<Arc<Counters>>,
    ) -> anyhow::Result<Window> {
        let central_rx = central.as_deref();
        let rx = |b: &Bench, c: Option<&Counters>| -> f64 {
            match measured {
                Measured::Agents => b
                    .nodes
                    .iter()
                    .map(|n| n.relay.counters.received() as f64)
                    .sum(),
                Measured::Central => c.map_or(0.0, |c| c.received() as f64),
                Measured::Sims => 0.0,
            }
        };
        let agent_pids: Vec<u32> = self.agents.iter().filter_map(|a| a.pid()).collect();
        let scans0 = self.agent_scans().await;
        let a0: Vec<Proc> = agent_pids.iter().filter_map(|p| proc_of(*p).ok()).collect();
        let s0 = self.sample().await?;
        let rx0 = rx(self, central_rx);
        let t0 = Instant::now();
        let mut next = t0;
        while t0.elapsed() < self.set.window {
            if churn && Instant::now() >= next {
                next += self.set.churn_every;
                self.churn_step().await?;
            }
            let left = self.set.window.saturating_sub(t0.elapsed());
            let wait = if churn {
                next.saturating_duration_since(Instant::now()).min(left)
            } else {
                left
            };
            tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
        }
        let s1 = self.sample().await?;
        let rx1 = rx(self, central_rx);
        let a1: Vec<Proc> = agent_pids.iter().filter_map(|p| proc_of(*p).ok()).collect();
        let scans1 = self.agent_scans().await;
        self.tail.read_into(&mut self.tally)?;
        let secs = (s1.api.at - s0.api.at).as_secs_f64();
        let per_min = 60.0 / secs;
        let who: fn(&str) -> bool = match measured {
            Measured::Agents => is_agent,
            Measured::Central => is_central,
            Measured::Sims => |_| false,
        };
        let req_per_min = self
            .tally
            .counts(who, s0.wall_us, s1.wall_us)
            .into_iter()
            .map(|(k, v)| (k, v as f64 * per_min))
            .collect();
        let ticks = (measured == Measured::Agents && !scans0.is_empty()).then(|| {
            let rates: Vec<f64> = scans0
                .iter()
                .zip(&scans1)
                .map(|((a, ta), (b, tb))| (b - a) / (*tb - *ta).as_secs_f64())
                .collect();
            let min = rates.iter().cloned().fold(f64::INFINITY, f64::min);
            (min, quantile(&rates, 0.5).unwrap_or(f64::NAN))
        });
        Ok(Window {
            secs,
            api_cpu_m: millicores(&s0.api, &s1.api),
            api_rss_mib: mib(s1.api.rss_kib),
            etcd_cpu_m: millicores(&s0.etcd, &s1.etcd),
            bench_cpu_m: millicores(&s0.me, &s1.me),
            api_req_per_min: (requests_total(&s1.metrics) - requests_total(&s0.metrics)) * per_min,
            req_per_min,
            rx_per_min: (rx1 - rx0) * per_min,
            watches: self.tally.open_watches(who),
            watch_gauge: watch_gauge(&s1.metrics),
            ticks,
            agents_cpu_m: a0.iter().zip(&a1).map(|(a, b)| millicores(a, b)).sum(),
            agents_rss_mib: a1.iter().map(|p| mib(p.rss_kib)).sum(),
        })
    }

    /// `headroom_scan_duration_seconds_count` of every running agent, with
    /// when it was scraped: the scrapes are one after the other, so at large
    /// N they span seconds and each agent's rate needs its own interval.
    async fn agent_scans(&self) -> Vec<(f64, Instant)> {
        let mut out = Vec::new();
        for a in &self.agents {
            let v = match a.scrape().await.ok().and_then(|t| parse_metrics(&t).ok()) {
                Some(s) => metric(&s, "headroom_scan_duration_seconds_count", &[]).unwrap_or(0.0),
                None => f64::NAN,
            };
            out.push((v, Instant::now()));
        }
        out
    }

    /// Starts an agent on every node at once; returns when all are ready
    /// and their requests have been quiet for 10 s (bounded).
    async fn start_agents(&mut self) -> anyhow::Result<Startup> {
        let s0 = self.sample().await?;
        let rx0: f64 = self
            .nodes
            .iter()
            .map(|n| n.relay.counters.received() as f64)
            .sum();
        let t0 = Instant::now();
        let starts = self
            .nodes
            .iter()
            .map(|nd| AgentProcess::start(self.agent_options(&nd.kubeconfig, &nd.node, &nd.root)));
        let mut agents = Vec::new();
        for r in futures::future::join_all(starts).await {
            agents.push(r?);
        }
        let all_ready = t0.elapsed();
        self.agents = agents;
        // Quiet: no agent request for 10 s (their watches stay open).
        let mut peak_rss = s0.api.rss_kib;
        let bound = Instant::now() + Duration::from_secs(180);
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            peak_rss = peak_rss.max(proc_of(self.cp.apiserver_pid())?.rss_kib);
            self.tail.read_into(&mut self.tally)?;
            let last = self
                .tally
                .last(is_agent, s0.wall_us, i64::MAX)
                .unwrap_or(s0.wall_us);
            if now_us() - last >= 10_000_000 || Instant::now() > bound {
                break;
            }
        }
        let s1 = self.sample().await?;
        let rx1: f64 = self
            .nodes
            .iter()
            .map(|n| n.relay.counters.received() as f64)
            .sum();
        let last = self
            .tally
            .last(is_agent, s0.wall_us, s1.wall_us)
            .unwrap_or(s0.wall_us);
        let per_second = self.tally.per_second(is_agent, s0.wall_us, last + 1);
        let (c0, st0) = pod_lists(&s0.metrics);
        let (c1, st1) = pod_lists(&s1.metrics);
        Ok(Startup {
            n: self.nodes.len(),
            all_ready,
            last_request: Duration::from_micros((last - s0.wall_us).max(0) as u64),
            peak_rps: per_second.iter().copied().max().unwrap_or(0),
            per_second,
            requests: self.tally.counts(is_agent, s0.wall_us, s1.wall_us),
            rx_bytes: rx1 - rx0,
            cache_lists: c1 - c0,
            storage_lists: st1 - st0,
            api_cpu_m: millicores(&s0.api, &s1.api),
            api_rss_peak_mib: mib(peak_rss),
        })
    }

    /// SIGTERM to every agent at once, then waits for all to exit.
    async fn stop_agents(&mut self) {
        let agents = std::mem::take(&mut self.agents);
        futures::future::join_all(agents.into_iter().map(|mut a| async move {
            a.stop().await;
        }))
        .await;
    }

    async fn curve(&mut self) -> anyhow::Result<()> {
        let ns = self.set.ns.clone();
        let mut points = Vec::new();
        for &n in &ns {
            println!("\n== N = {n} nodes × {} pods", self.set.pods);
            self.grow(n).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            let sims = (
                self.window(Measured::Sims, false, None).await?,
                self.window(Measured::Sims, true, None).await?,
            );
            print_window("sims", "steady", &sims.0);
            print_window("sims", "churn", &sims.1);

            let (relay, central_list_bytes, central_ready, stop_central) =
                self.start_central().await?;
            let c = Some(relay.counters.clone());
            let central = (
                self.window(Measured::Central, false, c.clone()).await?,
                self.window(Measured::Central, true, c).await?,
            );
            stop_central.abort();
            drop(relay);
            print_window("central", "steady", &central.0);
            print_window("central", "churn", &central.1);
            tokio::time::sleep(Duration::from_secs(3)).await;

            let cold = self.start_agents().await?;
            print_startup("cold start", &cold);
            let agents = (
                self.window(Measured::Agents, false, None).await?,
                self.window(Measured::Agents, true, None).await?,
            );
            print_window("agents", "steady", &agents.0);
            print_window("agents", "churn", &agents.1);
            if n == *ns.last().unwrap_or(&0) && part_enabled("stampede") {
                // Converged again after the churn, then all restart at once.
                tokio::time::sleep(Duration::from_secs(10)).await;
                self.stop_agents().await;
                let restart = self.start_agents().await?;
                print_startup("ROLLOUT (all agents restarted at once)", &restart);
                print_rollout(&restart, self.set.pods);
            }
            self.stop_agents().await;
            points.push(Point {
                n,
                sims,
                central,
                agents,
                central_list_bytes,
                central_ready,
                cold,
            });
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        report(&points, self.set.pods, self.set.churn_every);
        Ok(())
    }

    /// The central design's watch: one client, every pod of the cluster,
    /// through its own relay. Returns the relay, bytes of the initial list,
    /// time to the synced store, and the watch task.
    async fn start_central(
        &mut self,
    ) -> anyhow::Result<(Relay, f64, Duration, tokio::task::JoinHandle<()>)> {
        let relay = Relay::start(self.cp.port()).await?;
        let kc = client_kubeconfig(self.cp, &self.dir, CENTRAL_USER, CENTRAL_GROUP, relay.port)?;
        let cfg = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(&kc)?,
            &KubeConfigOptions::default(),
        )
        .await?;
        let client = Client::try_from(cfg)?;
        let (store, writer) = reflector::store::<Pod>();
        // resourceVersion=0 lists, as client-go informers and the agents do.
        let stream = watcher(
            Api::<Pod>::all(client),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .reflect(writer);
        let t0 = Instant::now();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while stream.next().await.is_some() {}
        });
        store.wait_until_ready().await?;
        let ready = t0.elapsed();
        let list_bytes = relay.counters.received() as f64;
        println!(
            "  central watch: {} pods cached after {ready:.1?}, initial list {:.0} KiB",
            store.state().len(),
            list_bytes / 1024.0
        );
        Ok((relay, list_bytes, ready, task))
    }
}

// ---------------------------------------------------------------- 4. reaction

/// `latency_ms` of the agent's `resize verified in cpu.max` line for
/// `pod` (`ns/name`) at `generation`, from its text log.
fn verified_ms(log: &str, pod: &str, generation: i64) -> Option<f64> {
    let pod_f = format!("pod={pod} ");
    let gen_f = format!("generation={generation} ");
    log.lines()
        .filter(|l| l.contains("resize verified in cpu.max"))
        .filter(|l| l.contains(&pod_f) && l.contains(&gen_f))
        .find_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("latency_ms="))
                .and_then(|v| v.parse().ok())
        })
}

/// Reads pod generations from `rx` into `gens` until none changed for
/// `quiet` (at most `bound`); returns how long that took.
async fn wait_quiet(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Instant, String, i64)>,
    gens: &mut BTreeMap<String, i64>,
    quiet: Duration,
    bound: Duration,
) -> Duration {
    let t0 = Instant::now();
    let mut last_change = Instant::now();
    while last_change.elapsed() < quiet && t0.elapsed() < bound {
        if let Ok(Some((_, n, g))) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await
            && gens.insert(n, g) != Some(g)
        {
            last_change = Instant::now();
        }
    }
    t0.elapsed()
}

impl Bench<'_> {
    /// Part 4: a node with the footprint's 250 pods among `SCALE_REACTION_NODES`
    /// (50) nodes with agents on one apiserver, the others churning; load
    /// change → first patch (seen by a watch in this process), and the
    /// agent's own patch → verified latency.
    async fn reaction(&mut self) -> anyhow::Result<()> {
        let total = env_u64("SCALE_REACTION_NODES", 50).max(1) as usize;
        let reps = env_u64("SCALE_REACTION_REPS", 10).max(1) as usize;
        let others = total - 1;
        if self.nodes.len() < others {
            self.grow(others).await?;
        }
        let ns = self.cp.try_namespace("scale-hot").await?;
        opt_in(&self.client, &ns).await?;
        let node = "scale-hot-node".to_string();
        let root = self.dir.join("cg-hot");
        let mut cfg = SimConfig::new(&node, &root);
        cfg.allocatable_cpu_m = 16_000;
        cfg.allocatable_memory = "64Gi".into();
        cfg.tick = Duration::from_secs(1);
        let (resize_delay, status_delay) = (cfg.resize_delay, cfg.status_delay);
        let sim = SimKubelet::start(self.client.clone(), cfg).await?;
        self.cp.wait_node_admissible(&node).await?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let specs = mix(&node, &FOOTPRINT_MIX);
        for s in &specs {
            sim.set_demand(&ns, &s.name, s.demand_m);
        }
        create_all(&api, specs.iter().map(|s| s.body.clone()).collect()).await?;
        wait_running(&api, specs.len(), Duration::from_secs(300)).await?;
        let relay = Relay::start(self.cp.port()).await?;
        let kc = client_kubeconfig(
            self.cp,
            &self.dir,
            "scale-agent-hot",
            AGENT_GROUP,
            relay.port,
        )?;

        // Watch first, so no patch is missed: (seen at, pod, generation).
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, String, i64)>();
        let wapi = api.clone();
        let watch = tokio::spawn(async move {
            let mut s = watcher(wapi, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(p)) = s.next().await {
                let name = p.metadata.name.clone().unwrap_or_default();
                let g = p.metadata.generation.unwrap_or(0);
                if tx.send((Instant::now(), name, g)).is_err() {
                    break;
                }
            }
        });

        let starts = self.nodes[..others]
            .iter()
            .map(|nd| (&nd.kubeconfig, &nd.node, &nd.root))
            .chain(std::iter::once((&kc, &node, &root)))
            .map(|(kc, node, root)| AgentProcess::start(self.agent_options(kc, node, root)));
        let mut agents = Vec::new();
        for r in futures::future::join_all(starts).await {
            agents.push(r?);
        }
        let hot = agents.pop().context("hot agent")?;
        println!(
            "\n== reaction under scale: 1 node with {} pods (footprint mix, 16 CPUs) + {others} \
             nodes × {} pods, all {total} with agents (default flags, tick 1 s), the {others} \
             churning every {}s; sim tick 1 s, resize delay {resize_delay:?}, status delay \
             {status_delay:?}; {reps} reps",
            specs.len(),
            self.set.pods,
            self.set.churn_every.as_secs()
        );

        // The others churn in the background for the whole part.
        let mut busy: Vec<SimNode> = self.nodes.drain(..others).collect();
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let every = self.set.churn_every;
        let churner = tokio::spawn(async move {
            loop {
                let steps = busy.iter_mut().map(|nd| nd.churn.step(&nd.sim, 1, 2));
                for r in futures::future::join_all(steps).await {
                    if let Err(e) = r {
                        eprintln!("churn step failed: {e:#}");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop_rx.changed() => break,
                }
            }
            busy
        });

        // Converged: no patch on the hot node for 15 s (bounded).
        let mut gens: BTreeMap<String, i64> = BTreeMap::new();
        let took = wait_quiet(
            &mut rx,
            &mut gens,
            Duration::from_secs(15),
            Duration::from_secs(300),
        )
        .await;
        println!(
            "  hot node converged after {took:.1?} ({} pods patched at least once)",
            gens.values().filter(|g| **g > 1).count()
        );

        // Each rep changes the node's load: even reps fill it (the 15
        // opted-out pods to 1 CPU each: demand above the 16 CPUs), odd reps
        // free it again (steady demands). The reaction is the first patch of
        // any managed pod after the change (a lowering, then a raise); it is
        // then followed to verified in the agent's log. Between reps the node
        // settles (no patch for 5 s, bounded).
        let managed: BTreeSet<&str> = specs
            .iter()
            .filter(|s| s.kind.managed())
            .map(|s| s.name.as_str())
            .collect();
        let fillers: Vec<&Spec> = specs.iter().filter(|s| s.kind == Kind::OptedOut).collect();
        let mut first_patch = [Vec::new(), Vec::new()];
        let mut verified = Vec::new();
        let mut missed = 0;
        for rep in 0..reps {
            while let Ok((_, n, g)) = rx.try_recv() {
                gens.insert(n, g);
            }
            let fill = rep % 2 == 0;
            let t = Instant::now();
            for f in &fillers {
                sim.set_demand(&ns, &f.name, if fill { 1000 } else { f.demand_m });
            }
            let hit = loop {
                let left = Duration::from_secs(60).saturating_sub(t.elapsed());
                match tokio::time::timeout(left, rx.recv()).await {
                    Ok(Some((at, n, g))) => {
                        let before = gens.insert(n.clone(), g).unwrap_or(1);
                        if managed.contains(n.as_str()) && g > before {
                            break Some((at - t, n, g));
                        }
                    }
                    _ => break None,
                }
            };
            match hit {
                Some((took, pod, g)) => {
                    first_patch[usize::from(!fill)].push(took.as_secs_f64() * 1000.0);
                    // The agent verifies within a few of its ticks.
                    let bound = Instant::now() + Duration::from_secs(30);
                    loop {
                        if let Some(ms) = verified_ms(&hot.log(), &format!("{ns}/{pod}"), g) {
                            verified.push(ms);
                            break;
                        }
                        if Instant::now() > bound {
                            println!("  rep {rep}: {pod} generation {g} not verified within 30 s");
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                None => {
                    missed += 1;
                    println!("  rep {rep}: no managed pod patched within 60 s");
                }
            }
            wait_quiet(
                &mut rx,
                &mut gens,
                Duration::from_secs(5),
                Duration::from_secs(90),
            )
            .await;
        }
        let q = |v: &[f64], x: f64| quantile(v, x).map_or("n/a".into(), |v| format!("{v:.0}"));
        for (i, what) in ["node filled → first lowering", "node freed → first raise"]
            .iter()
            .enumerate()
        {
            println!(
                "  {what} (the patch seen by a watch): p50 {} ms, p99 {} ms, max {} ms over {} reps",
                q(&first_patch[i], 0.5),
                q(&first_patch[i], 0.99),
                q(&first_patch[i], 1.0),
                first_patch[i].len()
            );
        }
        let first_patch: Vec<f64> = first_patch.concat();
        let q = |v: &[f64], x: f64| quantile(v, x).map_or("n/a".into(), |v| format!("{v:.0}"));
        println!(
            "  load change → first patch (set_demand → the patch seen by a watch): p50 {} ms, \
             p99 {} ms, max {} ms over {} reps ({missed} without a patch in 60 s)",
            q(&first_patch, 0.5),
            q(&first_patch, 0.99),
            q(&first_patch, 1.0),
            first_patch.len()
        );
        println!(
            "  patch → verified in cpu.max (the agent's latency_ms; sim resize delay \
             {resize_delay:?} + status delay {status_delay:?}): p50 {} ms, p99 {} ms, max {} ms \
             over {} reps",
            q(&verified, 0.5),
            q(&verified, 0.99),
            q(&verified, 1.0),
            verified.len()
        );
        let _ = stop_tx.send(true);
        let mut busy = churner.await?;
        busy.append(&mut self.nodes);
        self.nodes = busy;
        watch.abort();
        let mut all = agents;
        all.push(hot);
        futures::future::join_all(all.into_iter().map(|mut a| async move { a.stop().await })).await;
        sim.stop().await;
        drop(relay);
        Ok(())
    }
}

// ---------------------------------------------------------------- printing

fn fmt_reqs(m: &BTreeMap<String, f64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {}", sig3(*v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_window(what: &str, kind: &str, w: &Window) {
    println!(
        "  {what:<7} {kind:<6} {:.0} s: apiserver CPU {:.1} m, RSS {:.0} MiB; etcd CPU {:.1} m; \
         bench process {:.0} m; all requests {:.0}/min; watches open (gauge, everyone) {}",
        w.secs,
        w.api_cpu_m,
        w.api_rss_mib,
        w.etcd_cpu_m,
        w.bench_cpu_m,
        w.api_req_per_min,
        w.watch_gauge
    );
    if what != "sims" {
        println!(
            "          measured clients: {} watches held; requests/min {}; received {:.1} KiB/min",
            w.watches,
            fmt_reqs(&w.req_per_min),
            w.rx_per_min / 1024.0
        );
    }
    if let Some((min, med)) = w.ticks {
        println!(
            "          agents: scans/s per agent min {min:.2} median {med:.2} (tick 1 s); their \
             CPU {:.0} m total, RSS {:.0} MiB total",
            w.agents_cpu_m, w.agents_rss_mib
        );
    }
}

fn print_startup(what: &str, s: &Startup) {
    let head: Vec<String> = s.per_second.iter().take(20).map(u64::to_string).collect();
    println!(
        "  {what}: {} agents ready after {:.1?}; last request of the burst at {:.1?}; peak {} \
         requests/s; per second: [{}{}]",
        s.n,
        s.all_ready,
        s.last_request,
        s.peak_rps,
        head.join(" "),
        if s.per_second.len() > 20 { " …" } else { "" }
    );
    println!(
        "          requests: {}; received {:.0} KiB ({:.1} KiB per agent); pod lists served \
         from the watch cache {}, from etcd {}; apiserver CPU {:.0} m avg, RSS peak {:.0} MiB",
        s.requests
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        s.rx_bytes / 1024.0,
        s.rx_bytes / 1024.0 / s.n.max(1) as f64,
        s.cache_lists,
        s.storage_lists,
        s.api_cpu_m,
        s.api_rss_peak_mib
    );
}

fn print_rollout(s: &Startup, pods: usize) {
    let per_agent = s.rx_bytes / s.n.max(1) as f64;
    let at_fleet = per_agent / pods.max(1) as f64 * FLEET_PODS_PER_NODE * FLEET_NODES;
    println!(
        "          extrapolated to {FLEET_NODES} agents × {FLEET_PODS_PER_NODE} pods restarted at \
         once: {:.0} requests in the burst ({:.1} per agent, measured), {:.0} MiB received in \
         all (bytes per pod measured, scaled); the chart's rollout is maxUnavailable: 1, one \
         node at a time",
        s.requests.values().sum::<u64>() as f64 / s.n.max(1) as f64 * FLEET_NODES,
        s.requests.values().sum::<u64>() as f64 / s.n.max(1) as f64,
        at_fleet / 1024.0 / 1024.0
    );
}

/// The curve table, the fits and the extrapolation next to the central design.
fn report(points: &[Point], pods: usize, churn_every: Duration) {
    println!(
        "\n== Scale: apiserver cost of N agents ({pods} pods per node; churn every {}s per node: \
         1 pod replaced, 2 demands changed). Added = this configuration minus the sims-only \
         baseline of the same N and load. MEASURED.",
        churn_every.as_secs()
    );
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let n = p.n as f64;
            let (ag_s, ag_c) = &p.agents;
            vec![
                p.n.to_string(),
                format!("{:.0} / {:.0}", p.sims.0.api_cpu_m, p.sims.1.api_cpu_m),
                format!(
                    "{:.1} / {:.1}",
                    ag_s.api_cpu_m - p.sims.0.api_cpu_m,
                    ag_c.api_cpu_m - p.sims.1.api_cpu_m
                ),
                format!(
                    "{:.1} / {:.1}",
                    p.central.0.api_cpu_m - p.sims.0.api_cpu_m,
                    p.central.1.api_cpu_m - p.sims.1.api_cpu_m
                ),
                format!(
                    "{:.0} / {:+.0}",
                    p.sims.1.api_rss_mib,
                    ag_c.api_rss_mib - p.sims.1.api_rss_mib
                ),
                format!("{}", ag_s.watches),
                format!(
                    "{} / {}",
                    sig3(ag_s.total_req_per_min() / n),
                    sig3(ag_c.total_req_per_min() / n)
                ),
                format!(
                    "{} / {}",
                    sig3(ag_s.rx_per_min / n / 1024.0),
                    sig3(ag_c.rx_per_min / n / 1024.0)
                ),
                format!(
                    "{} / {}",
                    sig3(p.central.0.rx_per_min / 1024.0),
                    sig3(p.central.1.rx_per_min / 1024.0)
                ),
                match ag_c.ticks {
                    Some((min, med)) => format!("{min:.2} / {med:.2}"),
                    None => "n/a".into(),
                },
                format!("{:.0}", ag_c.agents_cpu_m),
            ]
        })
        .collect();
    println!(
        "{}",
        markdown_table(
            &[
                "N",
                "apiserver CPU m, sims only (steady / churn)",
                "added by N agents, m (steady / churn)",
                "added by the central watch, m (steady / churn)",
                "apiserver RSS MiB (sims, churn) / added by agents",
                "watches held by agents",
                "requests/min per agent (steady / churn)",
                "KiB/min received per agent (steady / churn)",
                "KiB/min received by the central watch (steady / churn)",
                "scans/s per agent under churn (min / median)",
                "agents' own CPU m (sum, churn)",
            ],
            &rows
        )
    );
    // Requests per agent by kind, under churn, at the largest N.
    if let Some(p) = points.last() {
        let n = p.n as f64;
        let per: BTreeMap<String, f64> = p
            .agents
            .1
            .req_per_min
            .iter()
            .map(|(k, v)| (k.clone(), v / n))
            .collect();
        println!(
            "requests/min per agent under churn at N={}: {}; central watch under churn: {}",
            p.n,
            fmt_reqs(&per),
            fmt_reqs(&p.central.1.req_per_min)
        );
    }
    extrapolate(points, pods);
}

/// Fits `y(N)` over the points and prints it at the fleet size.
/// A series of the N curve: its row name and its figure at each point.
type Series = (&'static str, fn(&Point) -> f64);

fn fit_at(name: &str, pts: &[(f64, f64)]) -> f64 {
    match fit::line(pts) {
        Ok(l) => {
            let exp = fit::power(pts)
                .map(|p| format!("{:.2}", p.exponent))
                .unwrap_or_else(|_| "n/a".into());
            println!(
                "fit {name}: {:.3} + {:.4}·N (r² {:.3}; log-log exponent {exp}) → {:.0} at N={FLEET_NODES}",
                l.intercept,
                l.slope,
                l.r2,
                l.at(FLEET_NODES)
            );
            l.at(FLEET_NODES)
        }
        Err(e) => {
            println!("fit {name}: {e}");
            f64::NAN
        }
    }
}

fn extrapolate(points: &[Point], pods: usize) {
    println!(
        "\n== Extrapolation to {FLEET_NODES} nodes × {FLEET_PODS_PER_NODE} pods (EXTRAPOLATED from \
         the measured curve: least-squares lines over N; per-pod figures scaled from {pods} to \
         {FLEET_PODS_PER_NODE} pods per node; churn per node as measured)"
    );
    let pts = |f: &dyn Fn(&Point) -> f64| -> Vec<(f64, f64)> {
        points.iter().map(|p| (p.n as f64, f(p))).collect()
    };
    // Fitted in this order (each prints its row).
    let series: [Series; 9] = [
        ("apiserver CPU added by agents, steady (m)", |p| {
            p.agents.0.api_cpu_m - p.sims.0.api_cpu_m
        }),
        ("apiserver CPU added by agents, churn (m)", |p| {
            p.agents.1.api_cpu_m - p.sims.1.api_cpu_m
        }),
        (
            "apiserver CPU added by the central watch, steady (m)",
            |p| p.central.0.api_cpu_m - p.sims.0.api_cpu_m,
        ),
        ("apiserver CPU added by the central watch, churn (m)", |p| {
            p.central.1.api_cpu_m - p.sims.1.api_cpu_m
        }),
        ("apiserver RSS added by agents (MiB)", |p| {
            p.agents.0.api_rss_mib - p.sims.0.api_rss_mib
        }),
        ("apiserver RSS added by the central watch (MiB)", |p| {
            p.central.0.api_rss_mib - p.sims.0.api_rss_mib
        }),
        ("KiB/min received by all agents, churn", |p| {
            p.agents.1.rx_per_min / 1024.0
        }),
        ("KiB/min received by the central watch, churn", |p| {
            p.central.1.rx_per_min / 1024.0
        }),
        ("requests/min of all agents, churn", |p| {
            p.agents.1.total_req_per_min()
        }),
    ];
    let [
        ag_cpu_s,
        ag_cpu_c,
        ce_cpu_s,
        ce_cpu_c,
        ag_rss,
        ce_rss,
        ag_rx,
        ce_rx,
        ag_req,
    ] = series.map(|(name, f)| fit_at(name, &pts(&f)));
    let Some(last) = points.last() else { return };
    let n = last.n as f64;
    let scale_pods = FLEET_PODS_PER_NODE / pods.max(1) as f64;
    let ag_list_kib = last.cold.rx_bytes / n / 1024.0 * scale_pods;
    let ce_list_mib =
        last.central_list_bytes / (n * pods as f64) * FLEET_NODES * FLEET_PODS_PER_NODE
            / 1024.0
            / 1024.0;
    let ce_ready_s =
        last.central_ready.as_secs_f64() / (n * pods as f64) * FLEET_NODES * FLEET_PODS_PER_NODE;
    let rows = vec![
        vec![
            "watches held".into(),
            format!("{} (3 per agent)", last.agents.0.watches),
            format!("{:.0}", last.agents.0.watches as f64 / n * FLEET_NODES),
            format!("{}", last.central.0.watches),
            format!("{}", last.central.0.watches),
        ],
        vec![
            "apiserver CPU added, steady / churn (m)".into(),
            format!(
                "{:.0} / {:.0}",
                last.agents.0.api_cpu_m - last.sims.0.api_cpu_m,
                last.agents.1.api_cpu_m - last.sims.1.api_cpu_m
            ),
            format!("{:.0} / {:.0}", ag_cpu_s, ag_cpu_c),
            format!(
                "{:.0} / {:.0}",
                last.central.0.api_cpu_m - last.sims.0.api_cpu_m,
                last.central.1.api_cpu_m - last.sims.1.api_cpu_m
            ),
            format!("{:.0} / {:.0}", ce_cpu_s, ce_cpu_c),
        ],
        vec![
            "apiserver RSS added (MiB)".into(),
            format!(
                "{:+.0}",
                last.agents.0.api_rss_mib - last.sims.0.api_rss_mib
            ),
            format!("{ag_rss:.0}"),
            format!(
                "{:+.0}",
                last.central.0.api_rss_mib - last.sims.0.api_rss_mib
            ),
            format!("{ce_rss:.0}"),
        ],
        vec![
            "requests/min, churn (all clients of the design)".into(),
            sig3(last.agents.1.total_req_per_min()),
            sig3(ag_req),
            sig3(last.central.1.total_req_per_min()),
            "1 watch (+ re-lists)".into(),
        ],
        vec![
            "KiB/min received under churn (all clients)".into(),
            sig3(last.agents.1.rx_per_min / 1024.0),
            sig3(ag_rx),
            sig3(last.central.1.rx_per_min / 1024.0),
            sig3(ce_rx),
        ],
        vec![
            "largest single client's stream, KiB/min under churn".into(),
            sig3(last.agents.1.rx_per_min / n / 1024.0),
            sig3(last.agents.1.rx_per_min / n / 1024.0),
            sig3(last.central.1.rx_per_min / 1024.0),
            sig3(ce_rx),
        ],
        vec![
            "initial list on (re)start, per client".into(),
            format!("{:.0} KiB", last.cold.rx_bytes / n / 1024.0),
            format!("{ag_list_kib:.0} KiB"),
            format!("{:.0} KiB", last.central_list_bytes / 1024.0),
            format!(
                "{ce_list_mib:.0} MiB (one client), ~{ce_ready_s:.0} s to sync at the measured rate"
            ),
        ],
    ];
    println!(
        "{}",
        markdown_table(
            &[
                "figure",
                &format!("agents, N={} (measured)", last.n),
                &format!("agents, {FLEET_NODES}×{FLEET_PODS_PER_NODE} (extrapolated)"),
                &format!("central watch, N={} (measured)", last.n),
                &format!("central watch, {FLEET_NODES}×{FLEET_PODS_PER_NODE} (extrapolated)"),
            ],
            &rows
        )
    );
}
