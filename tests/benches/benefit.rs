//! The benefit benchmark (docs/benefit.md): one real node VM (real
//! kubelet, containerd, runc, CFS), a CPU-burning HTTP service with a tight
//! limit under a bursty open-loop load, and two neighbours the agent does
//! not manage (their namespace is not opted in):
//!
//! - the *within-request neighbour* (`within`): a Burstable pod, request
//!   500m, no CPU limit, under a steady 150m (6 req/s × 25 ms) all run: its
//!   demand stays below its request (checked at start from its schedule),
//!   so any CPU it waits for is CPU it is owed;
//! - the *unmanaged batch neighbour* (`batch`): request 100m, no limit,
//!   needs 0.8 CPU (far above its request) from 7 s into the second burst
//!   for 15 s.
//!
//! Six configurations in a randomised order, `BENEFIT_REPS` (3) repetitions:
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
//!   given, e.g. `BENEFIT_TUNED='g-cool15=--raise-cooldown 15s;h-window2=--contention-window 2s'`
//!   (they join the configurations run; name them in `BENEFIT_CONFIGS` to
//!   run only some).
//!
//! What a run records (runs.csv, a row a run; raw/ per run):
//!
//! - the service's latency, throttled ratio (container `cpu.stat`), limit
//!   changes and the agent's reaction times;
//! - the within-request neighbour's p99 (whole run, and its `contended`
//!   phase: while the batch neighbour needs its CPU) and its pod cgroup's
//!   `cpu.pressure` `full` stall: Δ`total` over the run and over the
//!   contended phase as % of wall time (it has no CPU limit, so none of it
//!   is its own throttling), from the in-guest sampler;
//! - the batch neighbour's p99 while it needs its CPU;
//! - **false lowerings**: every lowering of the service the agent logged
//!   (`resized … old=Xm new=Ym` with Y < X in raw/<run>-agent.log) is put
//!   against the sampler. From the last sample at or before 3 s ahead of
//!   the log line to the last sample at or before it (their span, ≈ 3 s), a
//!   neighbour was *displaced* when its pod's `full` total grew by more
//!   than 10 % of its request-equivalent, request × span (150 ms in 3 s for
//!   the 500m neighbour, 30 ms for the batch pod's 100m). A lowering made
//!   while no neighbour was displaced is false. Lowerings the samples do
//!   not cover (less than 3 s of samples before them, or the last sample
//!   more than 1.5 s old) are counted as unjudged, not as false.
//!   raw/<run>-lowerings.csv lists each with the agent's reason and the
//!   neighbours' `full` growth (`benefit::analysis::check_lowering`).
//!
//! summary.json, per configuration: medians over the repetitions, and the
//! median against (a) static (and against (b) for the service's p99 and the
//! batch neighbour's) as a ratio of the medians with a 95 % percentile
//! bootstrap interval: 2000 resamples, each side's repetitions resampled
//! with replacement, fixed seed (`benefit::stats`); the within-request
//! neighbour's `full` against (a) as a difference of medians, in points.
//!
//! Baseline check: before anything is overwritten, the static (a) service
//! p99 median is read from the committed summary.json (`BENEFIT_BASELINE`,
//! which scripts/benefit fills from `git show HEAD:<out>/summary.json`; when
//! unset, `<out>/summary.json` if present). When this run's (a) median lies
//! outside [0.5×, 2×] of it (a much busier or quieter host), the run is not
//! aborted: meta.json gets `"flagged": true` and the figures, and the table
//! (scripts/lib/benefit_table.py) opens with a warning line.
//!
//! Run by `scripts/benefit` (which builds the static service and load
//! generator and draws the charts). Environment:
//! `BENEFIT_BIN_DIR` (benefit-load), `BENEFIT_IMAGE` (service image archive),
//! `BENEFIT_OUT` (default docs/benefit), `BENEFIT_REPS` (3), `BENEFIT_SEED`,
//! `BENEFIT_CONFIGS` (comma list of the names above), `BENEFIT_TUNED`,
//! `BENEFIT_BASELINE` (a summary.json; empty: no check), `BENEFIT_SCHEDULE`,
//! `BENEFIT_BATCH_SCHEDULE`, `BENEFIT_WITHIN_SCHEDULE` (see `benefit::schedule`;
//! the within-request neighbour's must stay at or below its request),
//! `BENEFIT_BURN_US` (25000), `BENEFIT_BURST_US`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use benefit::analysis::{self, Neighbour};
use benefit::schedule::{self, Phase};
use benefit::summary::{self, Baseline, RunRow};
use benefit::{agent_log, stats};
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
/// The within-request neighbour's CPU request (no CPU limit).
const WITHIN_REQUEST_M: u64 = 500;
/// The batch neighbour's CPU request (no limit).
const BATCH_REQUEST_M: u64 = 100;

/// The neighbours a lowering of the service is judged against.
const NEIGHBOURS: [Neighbour; 2] = [
    Neighbour {
        name: "within",
        request_m: WITHIN_REQUEST_M,
        pressure: |s| s.within_pressure,
    },
    Neighbour {
        name: "batch",
        request_m: BATCH_REQUEST_M,
        pressure: |s| s.batch_pressure,
    },
];

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
    within: Vec<Phase>,
    burn_us: u64,
    burst_us: u64,
    out: PathBuf,
    load_bin: PathBuf,
    image: PathBuf,
    baseline: Option<Baseline>,
}

/// The committed summary's (a) service p99 median: `BENEFIT_BASELINE` (a
/// summary.json; empty: none), else `out`/summary.json before it is
/// overwritten. `BENEFIT_BASELINE_FROM` names where it came from.
fn read_baseline(out: &Path) -> Option<Baseline> {
    let path = match std::env::var("BENEFIT_BASELINE") {
        Ok(p) if p.trim().is_empty() => return None,
        Ok(p) => PathBuf::from(p),
        Err(_) => out.join("summary.json"),
    };
    Baseline::from_summary(
        &std::fs::read_to_string(&path).ok()?,
        std::env::var("BENEFIT_BASELINE_FROM").unwrap_or_else(|_| path.display().to_string()),
    )
}

/// Highest CPU a schedule asks for, in millicores, at `burn_us` a request.
fn peak_demand_m(phases: &[Phase], burn_us: u64) -> f64 {
    phases
        .iter()
        .map(|p| p.rate_per_s * burn_us as f64 / 1000.0)
        .fold(0.0, f64::max)
}

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| d.to_string())
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let sched = |k: &str, d: &str| {
            schedule::parse(&env_or(k, d)).map_err(|e| anyhow::anyhow!("{k}: {e}"))
        };
        anyhow::ensure!(
            std::env::var_os("BENEFIT_GUARANTEED_SCHEDULE").is_none(),
            "BENEFIT_GUARANTEED_SCHEDULE is gone: the Guaranteed neighbour is now the \
             within-request neighbour, BENEFIT_WITHIN_SCHEDULE"
        );
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
        let out = PathBuf::from(env_or(
            "BENEFIT_OUT",
            &testkit::node_vm::repo_root()
                .join("docs/benefit")
                .display()
                .to_string(),
        ));
        let bin = PathBuf::from(std::env::var("BENEFIT_BIN_DIR").context(
            "BENEFIT_BIN_DIR unset: run scripts/benefit, which builds the load generator",
        )?);
        let s = Settings {
            reps: env_or("BENEFIT_REPS", "3")
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
            // The within-request neighbour: steady 150m, below its 500m
            // request all run; its `contended` phase is the batch
            // neighbour's demand.
            within: sched(
                "BENEFIT_WITHIN_SCHEDULE",
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
            out: out.clone(),
            load_bin: bin.join("benefit-load"),
            image: PathBuf::from(
                std::env::var("BENEFIT_IMAGE")
                    .context("BENEFIT_IMAGE unset: run scripts/benefit")?,
            ),
            baseline: read_baseline(&out),
        };
        let peak = peak_demand_m(&s.within, s.burn_us);
        anyhow::ensure!(
            peak <= WITHIN_REQUEST_M as f64,
            "BENEFIT_WITHIN_SCHEDULE asks {peak:.0}m at {} µs a request: above the \
             within-request neighbour's {WITHIN_REQUEST_M}m request",
            s.burn_us
        );
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

/// The in-guest script of one run: the sampler (its line:
/// `benefit::analysis`) and the three load generators, started together;
/// `done` when all have finished.
fn run_script(s: &Settings, id: &str, svc: &Target, w: &Target, b: &Target) -> String {
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
         C={c}; P={p}; W={w}; B={b}\n\
         sample() {{ while [ ! -e $out/stop ]; do t=$EPOCHREALTIME; read -r cm < $C/cpu.max; \
         mapfile -t cs < $C/cpu.stat; mapfile -t ps < $P/cpu.stat; mapfile -t ws < $W/cpu.stat; \
         mapfile -t bs < $B/cpu.stat; read -r st < /proc/stat; \
         mapfile -t wp < $W/cpu.pressure; mapfile -t bp < $B/cpu.pressure; \
         (IFS=';'; echo \"$t|$cm|${{cs[*]}}|${{ps[*]}}|${{ws[*]}}|${{bs[*]}}|$st|${{wp[*]}}|${{bp[*]}}\"); \
         sleep 0.5; done; }}\n\
         sample > $out/samples.txt & sp=$!\npids=\n",
        c = svc.container_dir,
        p = svc.pod_dir,
        w = w.pod_dir,
        b = b.pod_dir,
    );
    sh.push_str(&load("svc", svc, &s.svc, 32));
    sh.push_str(&load("within", w, &s.within, 8));
    sh.push_str(&load("batch", b, &s.batch, 32));
    sh.push_str("wait $pids\ntouch $out/stop; wait $sp\ntouch $out/done\n");
    sh
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
    within: Target,
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
    let script = run_script(s, &id, &pods.svc, &pods.within, &pods.b);
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
        .max(schedule::total(&s.within));
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
    let w: Value =
        serde_json::from_str(&read_out(node, &id, "within.json").await?).context("within.json")?;
    let b: Value =
        serde_json::from_str(&read_out(node, &id, "batch.json").await?).context("batch.json")?;
    let (samples, bad) = analysis::parse_samples(&read_out(node, &id, "samples.txt").await?);
    if bad > 0 {
        eprintln!("benefit: {id}: {bad} sampler lines unreadable (skipped)");
    }
    let (mut raise_p, mut lower_p, mut dry) = (0.0, 0.0, 0.0);
    let mut agent_cpu_s = 0.0;
    let mut resizes = Vec::new();
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
        // The unit's journal holds every run's; this run's lines follow
        // its last `Started` line (`agent_log::last_start`).
        let log = agent.log_tail(3000).await;
        let this_run = agent_log::last_start(&log);
        resizes = agent_log::resizes(this_run);
        std::fs::write(s.out.join(format!("raw/{id}-agent.log")), this_run)?;
        agent.stop().await?;
    }
    let t0: f64 = svc["start_unix_ns"]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .context("start_unix_ns")?
        / 1e9;
    let starts = schedule::phase_starts(&s.svc);
    let end = t0 + schedule::total(&s.svc).as_secs_f64();
    let win = analysis::window(&samples, t0, end).context("no samples inside the run")?;
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
    // The within-request neighbour's contended phase (the batch demand).
    let contended_phase = s
        .within
        .iter()
        .position(|ph| ph.name == "contended")
        .unwrap_or(1)
        .min(s.within.len() - 1);
    let contended_from = t0 + schedule::phase_starts(&s.within)[contended_phase].as_secs_f64();
    let contended_to = contended_from + s.within[contended_phase].duration.as_secs_f64();
    let within_stall = analysis::stall(&samples, t0, end, |x| x.within_pressure);
    let within_contended_stall = analysis::stall(&samples, contended_from, contended_to, |x| {
        x.within_pressure
    });
    let batch_stall = analysis::stall(&samples, t0, end, |x| x.batch_pressure);
    let within_usage_m = {
        let inside: Vec<&analysis::Sample> =
            samples.iter().filter(|x| x.t >= t0 && x.t <= end).collect();
        match (inside.first(), inside.last()) {
            (Some(a), Some(b)) if b.t > a.t => {
                b.within.usage_us.saturating_sub(a.within.usage_us) as f64 / 1e3 / (b.t - a.t)
            }
            _ => f64::NAN,
        }
    };
    // The agent's lowerings of the service, each against the neighbours'
    // stalls before it.
    let mut lowerings_csv =
        String::from("t_s,old_m,new_m,why,span_s,within_full_ms,batch_full_ms,verdict\n");
    let (mut svc_lowerings, mut false_lowerings, mut unjudged_lowerings) = (0, 0, 0);
    for r in resizes
        .iter()
        .filter(|r| r.of_pod("svc") && r.is_lowering())
    {
        let check = analysis::check_lowering(&samples, r.t, &NEIGHBOURS);
        svc_lowerings += 1;
        let verdict = if !check.judged() {
            unjudged_lowerings += 1;
            "unjudged".to_string()
        } else if check.is_false() {
            false_lowerings += 1;
            "false".to_string()
        } else {
            format!("displaced:{}", check.displaced.join("+"))
        };
        let full = |n: &str| {
            check
                .full_ms
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| format!("{v:.0}"))
                .unwrap_or_default()
        };
        let _ = writeln!(
            lowerings_csv,
            "{:.2},{},{},{},{},{},{},{verdict}",
            r.t - t0,
            r.old_m,
            r.new_m,
            agent_log::LowerWhy::of(&r.why).as_str(),
            check.span_s.map(|x| format!("{x:.2}")).unwrap_or_default(),
            full("within"),
            full("batch"),
        );
    }
    if svc_lowerings > 0 {
        std::fs::write(s.out.join(format!("raw/{id}-lowerings.csv")), lowerings_csv)?;
    }
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
    let mut csv = String::from(
        "t_s,svc_rate,limit_m,usage_m,throttled_pct,within_m,within_full_pct,batch_m,batch_full_pct,node_util\n",
    );
    for r in analysis::timeline(&samples, t0) {
        let rate = rate_at(&s.svc, r.t);
        let _ = writeln!(
            csv,
            "{:.2},{rate},{},{:.0},{:.1},{:.0},{:.1},{:.0},{:.1},{:.3}",
            r.t,
            r.limit_m
                .map(|m| m.to_string())
                .unwrap_or_else(|| "max".into()),
            r.usage_m,
            r.throttled_pct,
            r.within_m,
            r.within_full_pct,
            r.batch_m,
            r.batch_full_pct,
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
            &json!({"svc": summary_only(&svc), "within": summary_only(&w), "batch": summary_only(&b)}),
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
        config: config.name().to_string(),
        rep,
        order,
        svc_p50_ms: p(&svc, &["summary", "all", "p50_ms"]),
        svc_p99_ms: p(&svc, &["summary", "all", "p99_ms"]),
        svc_p999_ms: p(&svc, &["summary", "all", "p999_ms"]),
        svc_burst_p99_ms: burst_p99,
        svc_unfinished: svc["summary"]["unfinished"].as_u64().unwrap_or(0),
        svc_errors: svc["summary"]["errors"].as_u64().unwrap_or(0),
        throttled_ratio: win.throttled_ratio,
        throttled_s: win.throttled_s,
        pod_throttled_ratio: win.pod_throttled_ratio,
        pod_throttled_s: win.pod_throttled_s,
        cpu_bursts: win.bursts,
        svc_usage_m: win.usage_m,
        within_p99_ms: p(&w, &["summary", "all", "p99_ms"]),
        within_contended_p99_ms: p(
            &w,
            &["summary", "phases", &contended_phase.to_string(), "p99_ms"],
        ),
        within_usage_m,
        within_some_pct: within_stall.map_or(f64::NAN, |x| x.some_pct),
        within_full_pct: within_stall.map_or(f64::NAN, |x| x.full_pct),
        within_contended_full_pct: within_contended_stall.map_or(f64::NAN, |x| x.full_pct),
        batch_demand_p99_ms: p(
            &b,
            &["summary", "phases", &demand_phase.to_string(), "p99_ms"],
        ),
        batch_demand_p50_ms: p(
            &b,
            &["summary", "phases", &demand_phase.to_string(), "p50_ms"],
        ),
        batch_full_pct: batch_stall.map_or(f64::NAN, |x| x.full_pct),
        node_util: win.node_util,
        limit_changes: win.limit_changes,
        svc_lowerings,
        false_lowerings,
        unjudged_lowerings,
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
    // Burstable, no CPU limit: its steady load stays below its request.
    create(
        &nb_api,
        service_pod(
            "within",
            node.name(),
            json!({"cpu": format!("{WITHIN_REQUEST_M}m"), "memory": "32Mi"}),
            json!({}),
        ),
    )
    .await?;
    create(
        &nb_api,
        service_pod(
            "batch",
            node.name(),
            json!({"cpu": format!("{BATCH_REQUEST_M}m"), "memory": "32Mi"}),
            json!({}),
        ),
    )
    .await?;
    let svc = wait_running(&svc_api, "svc").await?;
    let within = wait_running(&nb_api, "within").await?;
    let b = wait_running(&nb_api, "batch").await?;
    let pods = Pods {
        node,
        svc_api: svc_api.clone(),
        svc: target(node, &svc).await?,
        within: target(node, &within).await?,
        b: target(node, &b).await?,
    };
    for t in [&pods.svc, &pods.within, &pods.b] {
        node.sh(&format!(
            "for i in $(seq 1 60); do (exec 3<>/dev/tcp/{}/8080 && printf 'GET /healthz HTTP/1.1\\r\\n\\r\\n' >&3 && head -c 15 <&3) 2>/dev/null | grep -q 200 && exit 0; sleep 1; done; exit 1",
            t.ip
        ))
        .await
        .with_context(|| format!("service at {} never answered", t.ip))?;
    }
    let kernel = node.sh("uname -r").await.unwrap_or_default();
    let ready_at = started.elapsed();
    match &s.baseline {
        Some(b) => eprintln!(
            "benefit: baseline: (a) service p99 {:.0} ms from {}",
            b.svc_p99_ms, b.from
        ),
        None => eprintln!("benefit: no committed baseline to check (a) against"),
    }
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
            "benefit: {}: svc p50 {:.0} p99 {:.0} p99.9 {:.0} ms; throttled {:.1} % ({:.1} s); within p99 {:.0} ms, full {:.1} %; batch p99 {:.0} ms; node {:.0} %; limit changes {}; lowerings {} ({} false, {} unjudged); raise {:?}/{:?} s, lower {:?} s",
            row.id,
            row.svc_p50_ms,
            row.svc_p99_ms,
            row.svc_p999_ms,
            100.0 * row.throttled_ratio,
            row.throttled_s,
            row.within_p99_ms,
            row.within_full_pct,
            row.batch_demand_p99_ms,
            100.0 * row.node_util,
            row.limit_changes,
            row.svc_lowerings,
            row.false_lowerings,
            row.unjudged_lowerings,
            row.raise1_s,
            row.raise2_s,
            row.lower_s
        );
        rows.push(row);
        // Written after every run, so an interrupted run keeps what it had.
        std::fs::write(s.out.join("runs.csv"), summary::runs_csv(&rows)?)?;
        let summary = summary::summarise(&rows);
        std::fs::write(
            s.out.join("summary.json"),
            serde_json::to_string_pretty(&summary)? + "\n",
        )?;
        let (baseline, flagged) = summary::baseline_check(s.baseline.as_ref(), &rows);
        let meta = json!({
            "seed": s.seed,
            "reps": s.reps,
            "order": plan.iter().map(|(r, c)| format!("{}-r{r}", c.name())).collect::<Vec<_>>(),
            "schedule": {"svc": phase_list(&s.svc), "batch": phase_list(&s.batch), "within": phase_list(&s.within)},
            // The flags of each tuning candidate, for the table's labels.
            "tuned": s.configs.iter().filter_map(|c| match c {
                Config::Tuned(t) => Some((t.name.clone(), json!(t.args.join(" ")))),
                _ => None,
            }).collect::<serde_json::Map<_, _>>(),
            "burn_us": s.burn_us,
            "burst_us": s.burst_us,
            "request_m": REQUEST_M,
            "limit_m": LIMIT_M,
            "within_request_m": WITHIN_REQUEST_M,
            "batch_request_m": BATCH_REQUEST_M,
            "bootstrap": {"resamples": stats::RESAMPLES, "seed": stats::SEED, "level": stats::LEVEL},
            "false_lowering": {"lookback_s": analysis::LOOKBACK_S, "displaced_share": analysis::DISPLACED_SHARE,
                "max_sample_gap_s": analysis::MAX_SAMPLE_GAP_S},
            // The committed (a) service p99 and this run's; `flagged` when
            // this run's lies outside its range (not comparable).
            "baseline": baseline,
            "flagged": flagged,
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
        serde_json::to_string_pretty(&summary::summarise(&rows))?
    );
    if let (baseline, true) = summary::baseline_check(s.baseline.as_ref(), &rows) {
        eprintln!(
            "benefit: WARNING: flagged: the static (a) service p99 median lies outside [0.5×, 2×] \
             of the committed one ({baseline}); meta.json says so and the table opens with a warning"
        );
    }
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
