//! The benefit benchmark (README "Does it help?"): one real node VM (real
//! kubelet, containerd, runc, CFS), a CPU-burning HTTP service with a tight
//! limit under a bursty open-loop load, an unmanaged neighbour that needs
//! CPU in the second burst and a Guaranteed neighbour with steady load, run
//! under six configurations in a randomised order, several repetitions:
//!
//! - `a-static`: the tight limit (request 200m, limit 300m) as declared;
//! - `b-nolimit`: the limit resized to the node's CPUs (CFS can never give
//!   more, so it is "no limit"; a resize cannot remove a limit);
//! - `c-headroom`: the agent (default policy) manages the tight limit;
//! - `d-burst`: the tight limit plus the kernel's `cpu.max.burst` written on
//!   the container's and the pod's cgroup, as koordlet does;
//! - `e-dryrun`: the agent with `--dry-run` (its own overhead, no patch);
//! - `f-declared`: the agent with `--floor declared` (never lowers the
//!   service below its declared 300m);
//! - tuning candidates named in `BENEFIT_TUNED`: the agent with the flags
//!   given, e.g. `BENEFIT_TUNED='g-cool15=--raise-cooldown 15s;h-psi5=--pressure-start 5'`
//!   (they join the configurations run; name them in `BENEFIT_CONFIGS` to
//!   run only some).
//!
//! Run by `scripts/benefit` (which builds the static service and load
//! generator and draws the charts). Environment:
//! `BENEFIT_BIN_DIR` (benefit-load), `BENEFIT_IMAGE` (service image archive),
//! `BENEFIT_OUT` (default docs/benefit), `BENEFIT_REPS` (2), `BENEFIT_SEED`,
//! `BENEFIT_CONFIGS` (comma list of the names above), `BENEFIT_TUNED`, `BENEFIT_SCHEDULE`,
//! `BENEFIT_BATCH_SCHEDULE`, `BENEFIT_GUARANTEED_SCHEDULE` (see
//! `benefit::schedule`), `BENEFIT_BURN_US` (25000), `BENEFIT_BURST_US`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use benefit::analysis;
use benefit::schedule::{self, Phase};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use testkit::agent::metric;
use testkit::node_vm::{GuestAgent, NodeSpec, NodeVm, RealCluster, container_ids};

const IMAGE: &str = "headroom.local/benefit:1";
const REQUEST_M: u64 = 200;
/// The tight limit: request × 1.5.
const LIMIT_M: u64 = 300;
const PERIOD_US: u64 = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Config {
    Static,
    NoLimit,
    Headroom,
    Burst,
    DryRun,
    Declared,
    /// A tuning candidate from `BENEFIT_TUNED` (leaked: it lives as long as
    /// the bench, and keeps `Config` `Copy`).
    Tuned(&'static Tuned),
}

/// The agent with other flags than its defaults.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Tuned {
    name: String,
    args: Vec<String>,
}

/// `name=--flag value --flag value;name=...`. Names are new (not one of
/// [`Config::ALL`]) and distinct; each candidate gives at least one flag.
fn parse_tuned(spec: &str) -> anyhow::Result<Vec<Tuned>> {
    let mut out: Vec<Tuned> = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, args) = entry
            .split_once('=')
            .with_context(|| format!("BENEFIT_TUNED: {entry:?} is not name=flags"))?;
        let name = name.trim();
        anyhow::ensure!(
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "BENEFIT_TUNED: name {name:?}: letters, digits and '-' only"
        );
        anyhow::ensure!(
            Config::ALL.iter().all(|c| c.name() != name) && out.iter().all(|t| t.name != name),
            "BENEFIT_TUNED: name {name:?} is taken"
        );
        let args: Vec<String> = args.split_whitespace().map(String::from).collect();
        anyhow::ensure!(!args.is_empty(), "BENEFIT_TUNED: {name} gives no flag");
        out.push(Tuned {
            name: name.to_string(),
            args,
        });
    }
    Ok(out)
}

impl Config {
    const ALL: [Config; 6] = [
        Config::Static,
        Config::NoLimit,
        Config::Headroom,
        Config::Burst,
        Config::DryRun,
        Config::Declared,
    ];
    fn name(self) -> &'static str {
        match self {
            Config::Static => "a-static",
            Config::NoLimit => "b-nolimit",
            Config::Headroom => "c-headroom",
            Config::Burst => "d-burst",
            Config::DryRun => "e-dryrun",
            Config::Declared => "f-declared",
            Config::Tuned(t) => &t.name,
        }
    }
    fn agent_args(self) -> Option<Vec<String>> {
        match self {
            Config::Headroom => Some(vec![]),
            Config::DryRun => Some(vec!["--dry-run".into()]),
            Config::Declared => Some(vec!["--floor".into(), "declared".into()]),
            Config::Tuned(t) => Some(t.args.clone()),
            Config::Static | Config::NoLimit | Config::Burst => None,
        }
    }
}

struct Settings {
    reps: usize,
    seed: u64,
    configs: Vec<Config>,
    svc: Vec<Phase>,
    batch: Vec<Phase>,
    guaranteed: Vec<Phase>,
    burn_us: u64,
    burst_us: u64,
    out: PathBuf,
    load_bin: PathBuf,
    image: PathBuf,
}

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| d.to_string())
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let sched = |k: &str, d: &str| {
            schedule::parse(&env_or(k, d)).map_err(|e| anyhow::anyhow!("{k}: {e}"))
        };
        let tuned: Vec<Config> = parse_tuned(&env_or("BENEFIT_TUNED", ""))?
            .into_iter()
            .map(|t| Config::Tuned(Box::leak(Box::new(t))))
            .collect();
        let known: Vec<Config> = Config::ALL.into_iter().chain(tuned).collect();
        let configs = match std::env::var("BENEFIT_CONFIGS") {
            Err(_) => known,
            Ok(list) => list
                .split(',')
                .map(|n| {
                    known
                        .iter()
                        .copied()
                        .find(|c| c.name() == n.trim())
                        .with_context(|| format!("BENEFIT_CONFIGS: unknown {n:?}"))
                })
                .collect::<anyhow::Result<_>>()?,
        };
        let seed = match std::env::var("BENEFIT_SEED") {
            Ok(s) => s.parse().context("BENEFIT_SEED")?,
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs(),
        };
        let bin = PathBuf::from(std::env::var("BENEFIT_BIN_DIR").context(
            "BENEFIT_BIN_DIR unset: run scripts/benefit, which builds the load generator",
        )?);
        let s = Settings {
            reps: env_or("BENEFIT_REPS", "2")
                .parse()
                .context("BENEFIT_REPS")?,
            seed,
            configs,
            // Quiet 50m, bursts 450m of CPU (1.5 × the 300m limit) at 25 ms
            // a request (few, large requests: each request also costs the
            // emulated guest CPU outside the burn); bursts of 25 s, long against the 2–12 s a real
            // kubelet under emulation takes to apply a resize.
            svc: sched(
                "BENEFIT_SCHEDULE",
                "quiet:10@2,burst:25@18,quiet:15@2,burst:25@18,quiet:5@2",
            )?,
            // The unmanaged neighbour needs 0.8 CPU from 7 s into the second burst.
            batch: sched(
                "BENEFIT_BATCH_SCHEDULE",
                "idle:57@0.4,demand:15@32,idle:8@0.4",
            )?,
            // The Guaranteed neighbour: steady 150m; its middle phase is the
            // batch neighbour's demand.
            guaranteed: sched(
                "BENEFIT_GUARANTEED_SCHEDULE",
                "steady:57@6,contended:15@6,steady:8@6",
            )?,
            burn_us: env_or("BENEFIT_BURN_US", "25000")
                .parse()
                .context("BENEFIT_BURN_US")?,
            // The kernel refuses a burst above the quota.
            burst_us: env_or(
                "BENEFIT_BURST_US",
                &(LIMIT_M * PERIOD_US / 1000).to_string(),
            )
            .parse()
            .context("BENEFIT_BURST_US")?,
            out: PathBuf::from(env_or(
                "BENEFIT_OUT",
                &testkit::node_vm::repo_root()
                    .join("docs/benefit")
                    .display()
                    .to_string(),
            )),
            load_bin: bin.join("benefit-load"),
            image: PathBuf::from(
                std::env::var("BENEFIT_IMAGE")
                    .context("BENEFIT_IMAGE unset: run scripts/benefit")?,
            ),
        };
        for f in [&s.load_bin, &s.image] {
            anyhow::ensure!(f.is_file(), "{} missing: run scripts/benefit", f.display());
        }
        anyhow::ensure!(s.reps >= 1 && !s.configs.is_empty(), "nothing to run");
        Ok(s)
    }
}

/// xorshift64*: a reproducible order from the printed seed.
fn shuffled<T: Clone>(items: &[T], state: &mut u64) -> Vec<T> {
    let mut v = items.to_vec();
    for i in (1..v.len()).rev() {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let j = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn service_pod(name: &str, node: &str, requests: Value, limits: Value) -> Value {
    json!({"metadata": {"name": name, "labels": {"app": name}},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "app", "image": IMAGE, "imagePullPolicy": "Never",
                        "command": ["/benefit-service", "--listen", "0.0.0.0:8080", "--workers", "4"],
                        "resources": {"requests": requests, "limits": limits}}]}})
}

async fn wait_running(api: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    let cond = await_condition(api.clone(), name, conditions::is_pod_running());
    match tokio::time::timeout(Duration::from_secs(300), cond).await {
        Ok(Ok(Some(p))) => Ok(p),
        other => bail!("{name} not Running: {other:?}"),
    }
}

/// A pod's cgroup dirs on the node: the pod's and its `app` container's.
struct Target {
    ip: String,
    pod_dir: String,
    container_dir: String,
}

async fn target(node: &NodeVm, pod: &Pod) -> anyhow::Result<Target> {
    let uid = pod.metadata.uid.as_deref().context("uid")?;
    let pod_dir = node.pod_cgroup(uid).await?;
    let id = container_ids(pod)
        .remove("app")
        .context("app container id")?;
    let container_dir = node
        .sh(&format!("ls -d {pod_dir}/*{id}*"))
        .await?
        .trim()
        .to_string();
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("pod IP")?;
    Ok(Target {
        ip,
        pod_dir,
        container_dir,
    })
}

fn limit_patch(m: u64) -> Patch<Value> {
    Patch::Strategic(json!({"spec": {"containers": [{"name": "app",
        "resources": {"limits": {"cpu": format!("{m}m")}}}]}}))
}

/// Resizes the service to `m` and waits until its container's cpu.max says so.
async fn set_limit(node: &NodeVm, api: &Api<Pod>, svc: &Target, m: u64) -> anyhow::Result<()> {
    let want = format!("{} {PERIOD_US}", m * PERIOD_US / 1000);
    let now = node
        .sh(&format!("cat {}/cpu.max", svc.container_dir))
        .await?;
    if now.trim() == want {
        return Ok(());
    }
    testkit::control_plane::resize(api, "svc", &limit_patch(m), false)
        .await
        .context("resize svc")?;
    let script = format!(
        "for i in $(seq 1 900); do [ \"$(cat {}/cpu.max)\" = '{want}' ] && exit 0; sleep 0.1; done; exit 1",
        svc.container_dir
    );
    let out = node.sh_output(&script).await?;
    anyhow::ensure!(out.status.success(), "svc cpu.max never read {want}");
    Ok(())
}

/// Writes `cpu.max.burst` on the service's container and pod cgroups.
async fn set_burst(node: &NodeVm, svc: &Target, us: u64) -> anyhow::Result<String> {
    node.sh(&format!(
        "echo {us} > {c}/cpu.max.burst && echo {us} > {p}/cpu.max.burst && \
         echo \"container $(cat {c}/cpu.max.burst) pod $(cat {p}/cpu.max.burst)\"",
        c = svc.container_dir,
        p = svc.pod_dir
    ))
    .await
    .map(|s| s.trim().to_string())
}

fn phase_list(p: &[Phase]) -> String {
    p.iter()
        .map(|p| format!("{}:{}@{}", p.name, p.duration.as_secs_f64(), p.rate_per_s))
        .collect::<Vec<_>>()
        .join(",")
}

/// The in-guest script of one run: the sampler and the three load
/// generators, started together; `done` when all have finished.
fn run_script(s: &Settings, id: &str, svc: &Target, g: &Target, b: &Target) -> String {
    let drain = 15;
    let load = |name: &str, t: &Target, p: &[Phase], conns: u32| {
        format!(
            "/mnt/node/bin/benefit-load --target {}:8080 --schedule {} --burn-us {} \
             --connections {conns} --drain-s {drain} --start-at-unix-ns $T0 --out $out/{name}.json \
             2>$out/{name}.err & pids=\"$pids $!\"\n",
            t.ip,
            phase_list(p),
            s.burn_us
        )
    };
    let mut sh = format!(
        "#!/bin/bash\nset -u\nout=/tmp/benefit/{id}\nrm -rf $out; mkdir -p $out\n\
         T0=$(( $(date +%s%N) + 4000000000 ))\necho $T0 > $out/t0\n\
         C={c}; P={p}; G={g}; B={b}\n\
         sample() {{ while [ ! -e $out/stop ]; do t=$EPOCHREALTIME; read -r cm < $C/cpu.max; \
         mapfile -t cs < $C/cpu.stat; mapfile -t ps < $P/cpu.stat; mapfile -t gs < $G/cpu.stat; \
         mapfile -t bs < $B/cpu.stat; read -r st < /proc/stat; \
         (IFS=';'; echo \"$t|$cm|${{cs[*]}}|${{ps[*]}}|${{gs[*]}}|${{bs[*]}}|$st\"); sleep 0.5; done; }}\n\
         sample > $out/samples.txt & sp=$!\npids=\n",
        c = svc.container_dir,
        p = svc.pod_dir,
        g = g.pod_dir,
        b = b.pod_dir,
    );
    sh.push_str(&load("svc", svc, &s.svc, 32));
    sh.push_str(&load("guaranteed", g, &s.guaranteed, 8));
    sh.push_str(&load("batch", b, &s.batch, 32));
    sh.push_str("wait $pids\ntouch $out/stop; wait $sp\ntouch $out/done\n");
    sh
}

/// One run's figures (a row of runs.csv).
#[derive(Clone, Debug, serde::Serialize)]
struct RunRow {
    id: String,
    config: &'static str,
    rep: usize,
    order: usize,
    svc_p50_ms: f64,
    svc_p99_ms: f64,
    svc_p999_ms: f64,
    svc_burst_p99_ms: f64,
    svc_unfinished: u64,
    svc_errors: u64,
    throttled_ratio: f64,
    throttled_s: f64,
    pod_throttled_ratio: f64,
    pod_throttled_s: f64,
    cpu_bursts: u64,
    svc_usage_m: f64,
    guaranteed_p99_ms: f64,
    guaranteed_contended_p99_ms: f64,
    batch_demand_p99_ms: f64,
    batch_demand_p50_ms: f64,
    node_util: f64,
    limit_changes: usize,
    agent_patches_raise: f64,
    agent_patches_lower: f64,
    agent_dry_run_decisions: f64,
    agent_cpu_s: f64,
    raise1_s: Option<f64>,
    raise2_s: Option<f64>,
    lower_s: Option<f64>,
    max_limit_m: u64,
    host_load_before: String,
    host_load_after: String,
    burst_setting: String,
}

fn p(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = if let Ok(i) = k.parse::<usize>() {
            &x[i]
        } else {
            &x[*k]
        };
    }
    x.as_f64().unwrap_or(f64::NAN)
}

struct Pods<'a> {
    node: &'a NodeVm,
    svc_api: Api<Pod>,
    svc: Target,
    g: Target,
    b: Target,
}

async fn agent_cpu_us(node: &NodeVm) -> u64 {
    node.sh(
        "awk '/usage_usec/ {print $2}' /sys/fs/cgroup/system.slice/headroom-agent.service/cpu.stat",
    )
    .await
    .ok()
    .and_then(|s| s.trim().parse().ok())
    .unwrap_or(0)
}

/// A file the run wrote in the guest.
async fn read_out(node: &NodeVm, id: &str, file: &str) -> anyhow::Result<String> {
    node.sh(&format!("cat /tmp/benefit/{id}/{file}")).await
}

async fn run_one(
    s: &Settings,
    pods: &Pods<'_>,
    config: Config,
    rep: usize,
    order: usize,
) -> anyhow::Result<RunRow> {
    let node = pods.node;
    let id = format!("{}-r{rep}", config.name());
    eprintln!("benefit: run {id} (#{order}), host load {}", loadavg());
    // Set up: the limit, the burst, the agent.
    let limit = if config == Config::NoLimit {
        u64::from(node.spec.cpus) * 1000
    } else {
        LIMIT_M
    };
    set_limit(node, &pods.svc_api, &pods.svc, limit).await?;
    let burst = if config == Config::Burst {
        s.burst_us
    } else {
        0
    };
    let burst_setting = set_burst(node, &pods.svc, burst).await?;
    let agent = match config.agent_args() {
        Some(args) => Some(GuestAgent::start(node, &args).await?),
        None => None,
    };
    let cpu_before = if agent.is_some() {
        agent_cpu_us(node).await
    } else {
        0
    };
    let script = run_script(s, &id, &pods.svc, &pods.g, &pods.b);
    let dir = node.share_dir().join("benefit");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{id}.sh")), script)?;
    let load_before = loadavg();
    node.sh(&format!(
        "systemctl reset-failed benefit-{id} 2>/dev/null; \
         systemd-run --unit=benefit-{id} --collect bash /mnt/node/benefit/{id}.sh"
    ))
    .await?;
    let total = schedule::total(&s.svc)
        .max(schedule::total(&s.batch))
        .max(schedule::total(&s.guaranteed));
    let deadline = Instant::now() + total + Duration::from_secs(90);
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        if node
            .sh_output(&format!("test -e /tmp/benefit/{id}/done"))
            .await?
            .status
            .success()
        {
            break;
        }
        if Instant::now() > deadline {
            let err = node
                .sh(&format!("tail -n 5 /tmp/benefit/{id}/*.err; journalctl -u benefit-{id} --no-pager | tail -n 20"))
                .await
                .unwrap_or_default();
            bail!("{id}: run never finished:\n{err}");
        }
    }
    let load_after = loadavg();
    let svc: Value =
        serde_json::from_str(&read_out(node, &id, "svc.json").await?).context("svc.json")?;
    let g: Value = serde_json::from_str(&read_out(node, &id, "guaranteed.json").await?)
        .context("guaranteed.json")?;
    let b: Value =
        serde_json::from_str(&read_out(node, &id, "batch.json").await?).context("batch.json")?;
    let (samples, bad) = analysis::parse_samples(&read_out(node, &id, "samples.txt").await?);
    if bad > 0 {
        eprintln!("benefit: {id}: {bad} sampler lines unreadable (skipped)");
    }
    let (mut raise_p, mut lower_p, mut dry) = (0.0, 0.0, 0.0);
    let mut agent_cpu_s = 0.0;
    if let Some(agent) = agent {
        let m = agent.scrape().await?;
        let r = |res: &str, dir: &str| {
            metric(
                &m,
                "headroom_resizes_total",
                &[("result", res), ("direction", dir)],
            )
            .unwrap_or(0.0)
        };
        raise_p = r("applied", "raise");
        lower_p = r("applied", "lower");
        dry = metric(&m, "headroom_resizes_total", &[("result", "dry_run")]).unwrap_or(0.0);
        agent_cpu_s = agent_cpu_us(node).await.saturating_sub(cpu_before) as f64 / 1e6;
        let log = agent.log_tail(400).await;
        std::fs::write(s.out.join(format!("raw/{id}-agent.log")), log)?;
        agent.stop().await?;
    }
    let t0: f64 = svc["start_unix_ns"]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .context("start_unix_ns")?
        / 1e9;
    let starts = schedule::phase_starts(&s.svc);
    let end = t0 + schedule::total(&s.svc).as_secs_f64();
    let w = analysis::window(&samples, t0, end).context("no samples inside the run")?;
    let bursts: Vec<(f64, f64)> = s
        .svc
        .iter()
        .zip(&starts)
        .filter(|(ph, _)| ph.name == "burst")
        .map(|(ph, st)| {
            (
                t0 + st.as_secs_f64(),
                t0 + (*st + ph.duration).as_secs_f64(),
            )
        })
        .collect();
    let raise = |i: usize| {
        bursts
            .get(i)
            .and_then(|(a, b)| analysis::first_raise_after(&samples, *a, *b, LIMIT_M))
    };
    let demand_phase = s
        .batch
        .iter()
        .position(|ph| ph.name == "demand")
        .unwrap_or(1);
    let demand_at =
        t0 + schedule::phase_starts(&s.batch)[demand_phase.min(s.batch.len() - 1)].as_secs_f64();
    let lower_s = analysis::first_lowering_after(&samples, demand_at, end);
    let burst_phases: Vec<usize> = s
        .svc
        .iter()
        .enumerate()
        .filter(|(_, ph)| ph.name == "burst")
        .map(|(i, _)| i)
        .collect();
    let burst_p99 = burst_phases
        .iter()
        .map(|i| p(&svc, &["summary", "phases", &i.to_string(), "p99_ms"]))
        .fold(f64::NAN, f64::max);
    // Timeline CSV of this run (relative to the schedule's start).
    let mut csv =
        String::from("t_s,svc_rate,limit_m,usage_m,throttled_pct,guaranteed_m,batch_m,node_util\n");
    for r in analysis::timeline(&samples, t0) {
        let rate = rate_at(&s.svc, r.t);
        let _ = writeln!(
            csv,
            "{:.2},{rate},{},{:.0},{:.1},{:.0},{:.0},{:.3}",
            r.t,
            r.limit_m
                .map(|m| m.to_string())
                .unwrap_or_else(|| "max".into()),
            r.usage_m,
            r.throttled_pct,
            r.guaranteed_m,
            r.batch_m,
            r.node_util
        );
    }
    std::fs::write(s.out.join(format!("raw/{id}-timeline.csv")), csv)?;
    let summary_only = |v: &Value| {
        json!({"all": v["summary"]["all"], "phases": v["summary"]["phases"],
        "errors": v["summary"]["errors"], "unfinished": v["summary"]["unfinished"],
        "seconds_p99_ms": v["summary"]["seconds"].as_array().map(|a| a.iter().map(|x| x["p99_ms"].clone()).collect::<Vec<_>>())})
    };
    std::fs::write(
        s.out.join(format!("raw/{id}-latency.json")),
        serde_json::to_string_pretty(
            &json!({"svc": summary_only(&svc), "guaranteed": summary_only(&g), "batch": summary_only(&b)}),
        )?,
    )?;
    let max_limit_m = samples
        .iter()
        .filter(|x| x.t >= t0 && x.t <= end)
        .filter_map(analysis::limit_m)
        .max()
        .unwrap_or(0);
    Ok(RunRow {
        id,
        config: config.name(),
        rep,
        order,
        svc_p50_ms: p(&svc, &["summary", "all", "p50_ms"]),
        svc_p99_ms: p(&svc, &["summary", "all", "p99_ms"]),
        svc_p999_ms: p(&svc, &["summary", "all", "p999_ms"]),
        svc_burst_p99_ms: burst_p99,
        svc_unfinished: svc["summary"]["unfinished"].as_u64().unwrap_or(0),
        svc_errors: svc["summary"]["errors"].as_u64().unwrap_or(0),
        throttled_ratio: w.throttled_ratio,
        throttled_s: w.throttled_s,
        pod_throttled_ratio: w.pod_throttled_ratio,
        pod_throttled_s: w.pod_throttled_s,
        cpu_bursts: w.bursts,
        svc_usage_m: w.usage_m,
        guaranteed_p99_ms: p(&g, &["summary", "all", "p99_ms"]),
        guaranteed_contended_p99_ms: p(&g, &["summary", "phases", "1", "p99_ms"]),
        batch_demand_p99_ms: p(
            &b,
            &["summary", "phases", &demand_phase.to_string(), "p99_ms"],
        ),
        batch_demand_p50_ms: p(
            &b,
            &["summary", "phases", &demand_phase.to_string(), "p50_ms"],
        ),
        node_util: w.node_util,
        limit_changes: w.limit_changes,
        agent_patches_raise: raise_p,
        agent_patches_lower: lower_p,
        agent_dry_run_decisions: dry,
        agent_cpu_s,
        raise1_s: raise(0),
        raise2_s: raise(1),
        lower_s,
        max_limit_m,
        host_load_before: load_before,
        host_load_after: load_after,
        burst_setting,
    })
}

/// Requests per second the schedule asks for at `t` s from its start.
fn rate_at(phases: &[Phase], t: f64) -> f64 {
    let mut at = 0.0;
    for ph in phases {
        let end = at + ph.duration.as_secs_f64();
        if t >= at && t < end {
            return ph.rate_per_s;
        }
        at = end;
    }
    0.0
}

fn csv_field(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => format!("\"{s}\""),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.4}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn write_runs_csv(path: &Path, rows: &[RunRow]) -> anyhow::Result<()> {
    let vals: Vec<Value> = rows
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    let Some(Value::Object(first)) = vals.first() else {
        return Ok(());
    };
    let keys: Vec<String> = first.keys().cloned().collect();
    let mut out = keys.join(",") + "\n";
    for v in &vals {
        let line: Vec<String> = keys.iter().map(|k| csv_field(&v[k])).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    std::fs::write(path, out)?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Medians per configuration, and the neighbours against the static
/// configuration's (their baseline: the service never exceeds its limit).
fn summarise(rows: &[RunRow]) -> Value {
    let mut by: BTreeMap<&str, Vec<&RunRow>> = BTreeMap::new();
    for r in rows {
        by.entry(r.config).or_default().push(r);
    }
    let med = |rs: &[&RunRow], f: fn(&RunRow) -> f64| median(rs.iter().map(|r| f(r)).collect());
    let base = by.get("a-static").cloned().unwrap_or_default();
    let base_g = med(&base, |r| r.guaranteed_contended_p99_ms);
    let base_b = med(&base, |r| r.batch_demand_p99_ms);
    let base_svc = med(&base, |r| r.svc_p99_ms);
    let base_thr = med(&base, |r| r.throttled_ratio);
    let mut out = serde_json::Map::new();
    for (c, rs) in &by {
        let rel = |x: Option<f64>, b: Option<f64>| match (x, b) {
            (Some(x), Some(b)) if b > 0.0 => Some(100.0 * (x / b - 1.0)),
            _ => None,
        };
        let svc_p99 = med(rs, |r| r.svc_p99_ms);
        let thr = med(rs, |r| r.throttled_ratio);
        let g = med(rs, |r| r.guaranteed_contended_p99_ms);
        let b = med(rs, |r| r.batch_demand_p99_ms);
        out.insert(
            c.to_string(),
            json!({
                "runs": rs.len(),
                "svc_p50_ms": med(rs, |r| r.svc_p50_ms),
                "svc_p99_ms": svc_p99,
                "svc_p999_ms": med(rs, |r| r.svc_p999_ms),
                "svc_p99_vs_static_pct": rel(svc_p99, base_svc),
                "throttled_ratio": thr,
                "throttled_ratio_vs_static_pct": rel(thr, base_thr),
                "throttled_s": med(rs, |r| r.throttled_s),
                "pod_throttled_ratio": med(rs, |r| r.pod_throttled_ratio),
                "guaranteed_contended_p99_ms": g,
                "guaranteed_vs_baseline_pct": rel(g, base_g),
                "batch_demand_p99_ms": b,
                "batch_vs_baseline_pct": rel(b, base_b),
                "node_util": med(rs, |r| r.node_util),
                "limit_changes": med(rs, |r| r.limit_changes as f64),
                "agent_cpu_s": med(rs, |r| r.agent_cpu_s),
                "raise1_s": median(rs.iter().filter_map(|r| r.raise1_s).collect()),
                "raise2_s": median(rs.iter().filter_map(|r| r.raise2_s).collect()),
                "lower_s": median(rs.iter().filter_map(|r| r.lower_s).collect()),
                "max_limit_m": med(rs, |r| r.max_limit_m as f64),
            }),
        );
    }
    Value::Object(out)
}

async fn bench(s: Settings) -> anyhow::Result<()> {
    let started = Instant::now();
    let load_start = loadavg();
    std::fs::create_dir_all(s.out.join("raw"))?;
    let agent_bin = testkit::node_vm::static_agent_binary()?;
    let c = RealCluster::start(vec![NodeSpec::kind_like("node-systemd", 1)]).await?;
    let node = &c.nodes[0];
    node.install_agent(&agent_bin)?;
    std::fs::copy(&s.load_bin, node.share_dir().join("bin/benefit-load"))?;
    c.load_image(&s.image, IMAGE, &[]).await?;
    let client = c.cp.client().await;
    let svc_ns = c.cp.namespace("benefit-svc").await;
    let nb_ns = c.cp.namespace("benefit-neighbours").await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            &svc_ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"headroom.dev/managed": "true"}}})),
        )
        .await?;
    let svc_api: Api<Pod> = Api::namespaced(client.clone(), &svc_ns);
    let nb_api: Api<Pod> = Api::namespaced(client.clone(), &nb_ns);
    let create = |api: &Api<Pod>, v: Value| {
        let api = api.clone();
        async move {
            let p: Pod = serde_json::from_value(v)?;
            api.create(&PostParams::default(), &p).await?;
            anyhow::Ok(())
        }
    };
    create(
        &svc_api,
        service_pod(
            "svc",
            node.name(),
            json!({"cpu": format!("{REQUEST_M}m"), "memory": "32Mi"}),
            json!({"cpu": format!("{LIMIT_M}m"), "memory": "64Mi"}),
        ),
    )
    .await?;
    create(
        &nb_api,
        service_pod(
            "guaranteed",
            node.name(),
            json!({"cpu": "400m", "memory": "32Mi"}),
            json!({"cpu": "400m", "memory": "32Mi"}),
        ),
    )
    .await?;
    create(
        &nb_api,
        service_pod(
            "batch",
            node.name(),
            json!({"cpu": "100m", "memory": "32Mi"}),
            json!({}),
        ),
    )
    .await?;
    let svc = wait_running(&svc_api, "svc").await?;
    let g = wait_running(&nb_api, "guaranteed").await?;
    let b = wait_running(&nb_api, "batch").await?;
    let pods = Pods {
        node,
        svc_api: svc_api.clone(),
        svc: target(node, &svc).await?,
        g: target(node, &g).await?,
        b: target(node, &b).await?,
    };
    for t in [&pods.svc, &pods.g, &pods.b] {
        node.sh(&format!(
            "for i in $(seq 1 60); do (exec 3<>/dev/tcp/{}/8080 && printf 'GET /healthz HTTP/1.1\\r\\n\\r\\n' >&3 && head -c 15 <&3) 2>/dev/null | grep -q 200 && exit 0; sleep 1; done; exit 1",
            t.ip
        ))
        .await
        .with_context(|| format!("service at {} never answered", t.ip))?;
    }
    let kernel = node.sh("uname -r").await.unwrap_or_default();
    let ready_at = started.elapsed();
    eprintln!(
        "benefit: node ready with pods after {ready_at:.0?}; seed {}; kernel {}",
        s.seed,
        kernel.trim()
    );
    let mut state = s.seed | 1;
    let mut rows = Vec::new();
    let mut order = 0;
    let mut plan = Vec::new();
    for rep in 0..s.reps {
        for cfg in shuffled(&s.configs, &mut state) {
            plan.push((rep, cfg));
        }
    }
    for (rep, cfg) in &plan {
        order += 1;
        let row = run_one(&s, &pods, *cfg, *rep, order).await?;
        eprintln!(
            "benefit: {}: svc p50 {:.0} p99 {:.0} p99.9 {:.0} ms; throttled {:.1} % ({:.1} s); guaranteed p99 {:.0} ms; batch p99 {:.0} ms; node {:.0} %; limit changes {}; raise {:?}/{:?} s, lower {:?} s",
            row.id,
            row.svc_p50_ms,
            row.svc_p99_ms,
            row.svc_p999_ms,
            100.0 * row.throttled_ratio,
            row.throttled_s,
            row.guaranteed_contended_p99_ms,
            row.batch_demand_p99_ms,
            100.0 * row.node_util,
            row.limit_changes,
            row.raise1_s,
            row.raise2_s,
            row.lower_s
        );
        rows.push(row);
        // Written after every run, so an interrupted run keeps what it had.
        write_runs_csv(&s.out.join("runs.csv"), &rows)?;
        let summary = summarise(&rows);
        std::fs::write(
            s.out.join("summary.json"),
            serde_json::to_string_pretty(&summary)? + "\n",
        )?;
        let meta = json!({
            "seed": s.seed,
            "reps": s.reps,
            "order": plan.iter().map(|(r, c)| format!("{}-r{r}", c.name())).collect::<Vec<_>>(),
            "schedule": {"svc": phase_list(&s.svc), "batch": phase_list(&s.batch), "guaranteed": phase_list(&s.guaranteed)},
            // The flags of each tuning candidate, for the table's labels.
            "tuned": s.configs.iter().filter_map(|c| match c {
                Config::Tuned(t) => Some((t.name.clone(), json!(t.args.join(" ")))),
                _ => None,
            }).collect::<serde_json::Map<_, _>>(),
            "burn_us": s.burn_us,
            "burst_us": s.burst_us,
            "request_m": REQUEST_M,
            "limit_m": LIMIT_M,
            "node": {"name": node.name(), "cpus": node.spec.cpus, "driver": node.spec.driver.as_str(), "kernel": kernel.trim()},
            "boot_ready_s": c.boot_times.first().map(|b| b.2.as_secs_f64()),
            "setup_s": ready_at.as_secs_f64(),
            "total_s": started.elapsed().as_secs_f64(),
            "host_loadavg_start": load_start,
            "host_loadavg_end": loadavg(),
            "host_cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        });
        std::fs::write(
            s.out.join("meta.json"),
            serde_json::to_string_pretty(&meta)? + "\n",
        )?;
    }
    eprintln!(
        "benefit: done in {:.0?}; {}",
        started.elapsed(),
        serde_json::to_string_pretty(&summarise(&rows))?
    );
    Ok(())
}

fn main() {
    // `cargo bench` passes --bench; nothing else is taken from the command line.
    let s = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("benefit: {e:#}");
            std::process::exit(2);
        }
    };
    if let Some(why) = testkit::node_vm::skip_reason() {
        eprintln!("benefit: cannot run: {why}");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(bench(s)) {
        eprintln!("benefit: FAILED: {e:#}");
        std::process::exit(1);
    }
}
