//! `headroom-agent run`: the node agent. Watches this node's pods, resizes
//! the managed ones every tick, verifies and audits cgroups, serves metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use headroom::cgroup;
use headroom::kube::watch;
use headroom::metrics::{self, Metrics, Readiness};
use headroom::policy::{FloorMode, PolicyConfig};
use headroom::reconcile::{Agent, Settings};
use headroom::verify::{CgroupWatch, WatchEvent, dirs_to_watch, watch_key};

use super::{parse_allocatable, parse_cpu, parse_duration, parse_node_name, parse_tick};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// This node's name: only pods with `spec.nodeName` equal to it are ever
    /// watched or patched. A DNS-1123 subdomain, as the apiserver names nodes.
    #[arg(long, env = "NODE_NAME", value_parser = parse_node_name)]
    pub node_name: String,
    /// cgroup v2 root as mounted in the agent's container.
    #[arg(long, default_value = "/sys/fs/cgroup", env = "HEADROOM_CGROUP_ROOT")]
    pub cgroup_root: PathBuf,
    /// kubeconfig file; default: $KUBECONFIG, ~/.kube/config, then in-cluster.
    #[arg(long, env = "HEADROOM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Sampling and decision period, 100ms to 24h.
    #[arg(long, default_value = "1s", value_parser = parse_tick)]
    pub tick: Duration,
    /// Compute and log every decision; patch nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = metrics::DEFAULT_ADDR)]
    pub metrics_addr: SocketAddr,
    /// Policy config file (TOML, or JSON if it ends in .json); flags below win.
    #[arg(long, env = "HEADROOM_CONFIG")]
    pub config: Option<PathBuf>,
    /// Allocatable CPU to assume until the Node object is read (more than 0).
    #[arg(long, value_parser = parse_allocatable, env = "HEADROOM_NODE_ALLOCATABLE")]
    pub node_allocatable: Option<u64>,
    /// Full audit of every pod's cpu.max (also on inotify events).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub audit_interval: Duration,
    /// How long a mismatch (or an unverified resize) may last before it is drift.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drift_grace: Duration,
    /// Minimum time between two Events of the same reason on one pod.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub event_interval: Duration,
    /// CPU never handed out as slack, 0 to 64 CPUs [default: 100m].
    #[arg(long, value_parser = parse_cpu)]
    pub reserve: Option<u64>,
    /// Default ceiling as a multiple of the request, 1 to 64 [default: 4].
    #[arg(long)]
    pub ceiling_factor: Option<f64>,
    /// Wait after a patch before a pod may be raised again (doubled for a pod
    /// whose raises keep being undone, up to 8×), up to 24h [default: 15s].
    #[arg(long, value_parser = parse_duration)]
    pub raise_cooldown: Option<Duration>,
    /// Node-wide patches per second, 0.01 to 100 [default: 5].
    #[arg(long)]
    pub patch_rate: Option<f64>,
    /// CPU a pod within its request must have waited for, while other pods
    /// held it, before it is owed that CPU: percent of its request, 0 to 99
    /// [default: 10].
    #[arg(long)]
    pub pressure_start: Option<f64>,
    /// How fast what displaced pods are owed is released once they stop
    /// waiting (time constant), 0.5s to 60s [default: 5s].
    #[arg(long, value_parser = parse_duration)]
    pub contention_window: Option<Duration>,
    /// Lowest limit set as the node fills: `request`, or `declared` (never below
    /// the limit the workload declares) [default: request].
    #[arg(long, value_parser = parse_floor)]
    pub floor: Option<FloorMode>,
    /// /readyz answers 503 after this many ticks in a row fail to read the
    /// cgroup tree (unusable kubepods files, a scan that hangs).
    #[arg(long, default_value_t = metrics::DEFAULT_UNREADY_AFTER, value_parser = clap::value_parser!(u32).range(1..))]
    pub unready_after_failed_ticks: u32,
}

/// The policy config file (TOML, or JSON when it ends in `.json`), or the
/// defaults without one. Shared by `run` and `explain`.
fn parse_floor(s: &str) -> Result<FloorMode, String> {
    s.parse()
}

pub fn load_policy_file(path: Option<&PathBuf>) -> anyhow::Result<PolicyConfig> {
    let Some(p) = path else {
        return Ok(PolicyConfig::default());
    };
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let cfg = if p.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
    } else {
        toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?
    };
    Ok(cfg)
}

/// The policy config: file, then flags.
pub fn policy_config(a: &Args) -> anyhow::Result<PolicyConfig> {
    let mut cfg = load_policy_file(a.config.as_ref())?;
    if let Some(v) = a.reserve {
        cfg.reserve_m = v;
    }
    if let Some(v) = a.ceiling_factor {
        cfg.ceiling_factor = v;
    }
    if let Some(v) = a.raise_cooldown {
        cfg.raise_cooldown_s = v.as_secs_f64();
    }
    if let Some(v) = a.patch_rate {
        cfg.patch_rate_per_s = v;
    }
    if let Some(v) = a.pressure_start {
        cfg.pressure_start_pct = v;
    }
    if let Some(v) = a.contention_window {
        cfg.contention_window_s = v.as_secs_f64();
    }
    if let Some(v) = a.floor {
        cfg.floor = v;
    }
    cfg.validate()?;
    Ok(cfg)
}

pub async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    Ok(kube::Client::try_from(config)?)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let policy = policy_config(&a)?;
    // One thread: the agent's work is a few file reads and API calls a
    // second; a single-threaded runtime keeps its footprint small.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(a, policy))
}

/// The soft open-file limit raised to the hard one, before the scanner
/// sizes its kept handles from it ([`cgroup::read::fd_budget`]).
fn raise_fd_limit() {
    let budget = cgroup::read::fd_budget;
    match cgroup::read::raise_fd_limit() {
        Ok((from, to)) => tracing::info!(
            soft_from = from,
            soft = to,
            kept_handles_at_most = budget(),
            "open-file limit"
        ),
        Err(e) => tracing::warn!(
            error = %e,
            kept_handles_at_most = budget(),
            "open-file limit not raised"
        ),
    }
}

async fn run_async(a: Args, policy: PolicyConfig) -> anyhow::Result<ExitCode> {
    let layout = cgroup::discover(&a.cgroup_root)
        .with_context(|| format!("cgroup root {} is not usable", a.cgroup_root.display()))?;
    tracing::info!(node = %a.node_name, root = %a.cgroup_root.display(), driver = ?layout.driver,
        kubepods = %layout.kubepods.display(), dry_run = a.dry_run, "starting");
    raise_fd_limit();
    let client = client(a.kubeconfig.as_ref()).await?;
    let metrics = Arc::new(Metrics::new(env!("CARGO_PKG_VERSION")));
    let readiness = Arc::new(Readiness::new(a.unready_after_failed_ticks));
    let listener = metrics::bind(a.metrics_addr)
        .await
        .with_context(|| format!("binding metrics address {}", a.metrics_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics /healthz /readyz");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut server_stop = stop_rx.clone();
    let server = tokio::spawn(metrics::serve_listener(
        listener,
        metrics.clone(),
        readiness.clone(),
        async move {
            let _ = server_stop.wait_for(|s| *s).await;
        },
    ));

    let (caches, tasks) = watch::start(client.clone(), &a.node_name);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    tokio::select! {
        () = caches.wait_ready() => readiness.set_pods_synced(),
        () = &mut shutdown => return Ok(ExitCode::SUCCESS),
    }
    tracing::info!(pods = caches.pods().len(), "pod watch synced");

    let settings = Settings {
        node_name: a.node_name.clone(),
        cgroup_root: a.cgroup_root.clone(),
        tick: a.tick,
        dry_run: a.dry_run,
        policy,
        node_allocatable_m: a.node_allocatable,
        audit_interval: a.audit_interval,
        drift_grace: a.drift_grace,
        event_interval: a.event_interval,
    };
    let mut agent = Agent::with_client(settings, layout, caches, client, metrics);
    let mut inotify = match CgroupWatch::new(&a.cgroup_root) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(error = %e, "inotify unavailable; drift audits run on the interval only");
            None
        }
    };
    let mut ticker = tokio::time::interval(a.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watched_key = usize::MAX;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                agent.tick().await;
                readiness.tick_done(agent.last_tick_ok());
                if let Some(snap) = agent.snapshot() {
                    readiness.set_first_scan_done();
                    // Re-sync watches when pod or container cgroups came or went.
                    let key = watch_key(&snap.pods);
                    if let Some(w) = inotify.as_mut() && key != watched_key {
                        watched_key = key;
                        for (dir, e) in w.sync(dirs_to_watch(snap)) {
                            tracing::debug!(dir = %dir.display(), error = %e, "cannot watch");
                        }
                    }
                }
            }
            ev = next_watch_event(&mut inotify) => match ev {
                Some(Ok(WatchEvent::CpuMaxChanged(path))) => {
                    tracing::debug!(path = %path.display(), "cpu.max written: audit at next tick");
                    agent.request_audit();
                }
                Some(Ok(WatchEvent::Overflow)) => agent.request_audit(),
                Some(Ok(WatchEvent::Created(_) | WatchEvent::Removed(_))) => watched_key = usize::MAX,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "inotify failed; falling back to interval audits");
                    inotify = None;
                }
                None => inotify = None,
            },
            () = &mut shutdown => break,
        }
    }
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    for t in tasks {
        t.abort();
    }
    let _ = server.await;
    Ok(ExitCode::SUCCESS)
}

async fn next_watch_event(w: &mut Option<CgroupWatch>) -> Option<std::io::Result<WatchEvent>> {
    match w {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_file_in_toml_or_json_and_typos_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let toml_path = d.path().join("p.toml");
        std::fs::write(&toml_path, "reserve_m = 250\nceiling_factor = 2.5\n").unwrap();
        let cfg = load_policy_file(Some(&toml_path)).unwrap();
        assert_eq!((cfg.reserve_m, cfg.ceiling_factor), (250, 2.5));
        assert_eq!(
            cfg.quantum_m,
            PolicyConfig::default().quantum_m,
            "unnamed keys keep defaults"
        );
        let json_path = d.path().join("p.json");
        std::fs::write(&json_path, r#"{"raise_cooldown_s": 5}"#).unwrap();
        assert_eq!(
            load_policy_file(Some(&json_path)).unwrap().raise_cooldown_s,
            5.0
        );
        let typo = d.path().join("typo.toml");
        std::fs::write(&typo, "reserv_m = 1\n").unwrap();
        assert!(
            load_policy_file(Some(&typo)).is_err(),
            "an unknown key must not fall back to a default"
        );
        assert_eq!(load_policy_file(None).unwrap(), PolicyConfig::default());
    }
}
