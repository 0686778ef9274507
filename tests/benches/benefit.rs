//! The benefit benchmark (docs/benefit.md): one real node VM (real
//! kubelet, containerd, runc, CFS), a CPU-burning HTTP service with a tight
//! limit (request 200m, limit 300m; Headroom's ceiling request × 4 = 800m)
//! under a bursty open-loop load, beside neighbours the agent does not
//! manage (their namespace is not opted in):
//!
//! - the *within-request neighbour* (`within`): a Burstable pod, request
//!   500m, no CPU limit; its demand stays at or below its request (checked
//!   at start from its schedules), so any CPU it waits for is CPU it is
//!   owed;
//! - the *unmanaged batch neighbour* (`batch`): request 100m, no limit,
//!   needs 0.8 CPU (far above its request) for 15 s.
//!
//! **A matrix** (`benefit::matrix`): every configuration under every
//! scenario, `BENEFIT_REPS` (3) repetitions; each repetition is a block
//! holding every (scenario, configuration) once, in an order shuffled from
//! `BENEFIT_SEED` (printed, and kept in meta.json). The scenarios (80 s of
//! schedule each):
//!
//! - `mixed`: the service bursting to 450m (1.5 × its limit) for 25 s twice,
//!   the within-request neighbour at a steady 150m, the batch neighbour's
//!   0.8 CPU from 7 s into the second burst (the bench's one scenario
//!   before the matrix, unchanged);
//! - `short`: the node short of CPU: the within-request neighbour at 450m
//!   (90 % of its request) all run, the service's bursts at 800m (its
//!   ceiling), the batch neighbour as in `mixed`;
//! - `alone`: the service alone (bursts as in `mixed`); the neighbours' pods
//!   exist but get no load;
//! - `pair`: a second managed service `svc2` of the same shape, with its own
//!   load generator, bursting together with the first (as in `mixed`),
//!   beside the within-request neighbour at 150m (no batch load). `svc2` is
//!   created before each `pair` run and deleted after it (Running and
//!   answering first), so the other scenarios' agent sees one managed pod,
//!   as before the matrix. Both services get the same configuration;
//! - `flicker` (issue 47): the node short as in `short` for 70 s (the
//!   service bursting to its ceiling, the batch neighbour's 0.8 CPU all
//!   through the burst), while the within-request neighbour's need (450m)
//!   comes and goes: on 8, 3, 2, 6, 8, 2 s, off 6, 7, 4, 2, 8, 4 s between,
//!   from 10 s in (a fixed pattern drawn from 2–8 s,
//!   `benefit::matrix::flicker_within`, and why it is irregular). Each need
//!   and the pause after it is one *episode*; the agent's patches of the
//!   service are counted per episode, not per burst.
//!
//! The configurations (default `a-static,b-nolimit,c-headroom,d-burst,e-dryrun,k-koordlet`,
//! plus any `BENEFIT_TUNED` candidates; `BENEFIT_CONFIGS` names others):
//!
//! - `a-static`: the tight limit as declared;
//! - `b-nolimit`: the limit resized to the node's CPUs (CFS can never give
//!   more, so it is "no limit"; a resize cannot remove a limit);
//! - `c-headroom`: the agent (default policy) manages the tight limit;
//! - `d-burst`: the tight limit plus the kernel's `cpu.max.burst` written on
//!   the container's and the pod's cgroup, as koordlet does;
//! - `e-dryrun`: the agent with `--dry-run` (its own overhead, no patch);
//! - `f-declared`: the agent with `--floor declared` (never lowers the
//!   service below its declared 300m);
//! - `k-koordlet`: Koordinator's koordlet (`benefit::koordlet`, built by
//!   tests/koordlet/build.sh) as a transient unit in the guest with CPU
//!   Burst `auto` from a hand-written NodeSLO (its CRDs and RBAC applied,
//!   a token of its ServiceAccount), no Headroom; started fresh for each run
//!   once the bench has reset the limit, stopped after, its writes undone
//!   (`cpu.max.burst` 0, `cpu.max` as the kubelet left it). Its
//!   `cpuBurstPercent` is the default 1000 unless the guest's kernel refuses
//!   that burst (it does: above the quota, EINVAL), then the highest it
//!   takes (100). **A (k) run in which koordlet wrote nothing to the
//!   service's cgroups while the service was throttled fails the bench**
//!   (`benefit::koordlet::refusal`);
//! - `x-coexist` (on request): Headroom and koordlet both on the same
//!   services, koordlet started first — what a user running both would
//!   see. No goals and no refusal: the run writes what the agent said (its
//!   drift, verification and yield lines, its drift and resize samples)
//!   to raw/<run>-coexist.txt (docs/coexistence.md);
//! - tuning candidates named in `BENEFIT_TUNED`: the agent with the flags
//!   given, e.g. `BENEFIT_TUNED='g-cool15=--raise-cooldown 15s;h-window2=--contention-window 2s'`.
//!
//! **Handing the service back between runs.** A run resets each service's
//! limit in place (the `resize` subresource) to its configuration's; since
//! the agent's coexistence rule (docs/coexistence.md) that resize is
//! *another writer's* and the agent would leave the pod alone (log:
//! `yielding to another writer`). So before the agent starts, each managed
//! pod gets `headroom.dev/resume` = a time at or after every resize of it so
//! far (the latest `resize` entry of its `managedFields`, or now if later),
//! as a user hands limits back; the limit in place (300m) becomes its
//! declared limit again. Chosen over recreating the pods between runs:
//! cheap (no pod start on the emulated node, same pod IPs and cgroups), and
//! it is the documented way back. **A run that measured nothing fails the
//! bench** (error, no summary row, meta.json `failed`, so no table): in an
//! agent configuration, the agent logged `yielding to another writer`; or
//! a configuration whose agent patches made no patch at all although the
//! service bursts above its limit; or its metrics count patches its log
//! has no `resized` line for (the log format changed under the analysis).
//!
//! What a run records (runs.csv, a row a run; raw/<scenario>-<config>-r<rep>-* per run):
//!
//! - each service's latency; the first's throttled ratio (container
//!   `cpu.stat`), limit changes and the agent's reaction times, the
//!   second's throttled ratio and usage;
//! - the within-request neighbour's p99 (whole run, and its `contended`
//!   phases: the batch neighbour's demand, in `pair` the bursts, in
//!   `flicker` its needs), the CPU
//!   it got (pod `cpu.stat` `usage_usec`) over the run and over its
//!   contended phases, and its pod cgroup's `cpu.pressure` `full` stall
//!   over the same (it has no CPU limit, so none of it is its own
//!   throttling), from the in-guest sampler;
//! - the batch neighbour's p99 while it needs its CPU;
//! - from the agent's log (raw/<run>-agent.log): its checked lowerings
//!   (`lowering checked … effect=helped|no_effect|unjudged`), its patches of each
//!   service and the most within one burst window of the schedule; in
//!   `flicker`, within one episode of the within-request neighbour's need
//!   (from the start of a need to the end of the pause after it,
//!   `benefit::matrix::episodes`; a patch is timed by its `resized` log
//!   line). raw/<run>-patches.csv lists every patch of a service with the
//!   burst and the episode it counts to;
//! - **false lowerings**: every lowering of a managed service the agent
//!   logged (`resized … old=Xm new=Ym` with Y < X) is put against the
//!   sampler. From the last sample at or before 3 s ahead of the log line to
//!   the last sample at or before it (their span, ≈ 3 s), a neighbour was
//!   *displaced* when its pod's `full` total grew by more than 10 % of its
//!   request-equivalent, request × span (150 ms in 3 s for the 500m
//!   neighbour, 30 ms for the batch pod's 100m). A lowering made while no
//!   neighbour was displaced is false. Lowerings the samples do not cover
//!   (less than 3 s of samples before them, or the last sample more than
//!   1.5 s old) are counted as unjudged, not as false.
//!   raw/<run>-lowerings.csv lists each with the agent's reason and the
//!   neighbours' `full` growth (`benefit::analysis::check_lowering`).
//!
//! summary.json (`benefit::summary::summarise_matrix`), per scenario and
//! configuration: medians over the repetitions, and the medians against (a)
//! static and (b) no limit as ratios of the medians with a 95 % percentile
//! bootstrap interval: 2000 resamples, each side's repetitions resampled
//! with replacement, fixed seed (`benefit::stats`); then each goal of each
//! party met or not (`benefit::summary::goals`: a ratio goal by its median,
//! a count by its worst run), and per scenario how many are met.
//! scripts/lib/benefit_table.py makes table.md and headline.md of them.
//!
//! Baseline check: before anything is overwritten, the static (a) service
//! p99 median of `mixed` is read from the committed summary.json
//! (`BENEFIT_BASELINE`, which scripts/benefit fills from `git show
//! HEAD:<out>/summary.json`; when unset, `<out>/summary.json` if present; a
//! summary from before the matrix is read as `mixed`'s). When this run's
//! (a) median of `mixed` lies outside [0.5×, 2×] of it (a much busier or
//! quieter host), the run is not aborted: meta.json gets `"flagged": true`
//! and the figures, and the table opens with a warning line.
//!
//! Wall time: a run is ~100 s (80 s of schedule, 4 s lead-in, up to 15 s of
//! drain, set-up; a `pair` run ~20 s more for its second pod), so the full
//! matrix, 5 scenarios × 5 configurations × 3 repetitions = 75 runs, is
//! ~130 min (48 runs of 4 configurations without `flicker` took 1 h 23 min
//! on 2026-12-06), plus ~1 min of VM boot and pod setup;
//! `BENEFIT_MATRIX=quick` (25 runs) ~45 min; (k) adds 15 runs (~27 min), 5
//! (~9 min) to the quick one. `flicker` adds 12 runs (~20 min) to the full matrix, 4 (~7
//! min) to the quick one; `BENEFIT_SCENARIOS` leaves it out.
//!
//! Run by `scripts/benefit` (which builds the static service and load
//! generator and draws the charts). Environment:
//! `BENEFIT_BIN_DIR` (benefit-load), `BENEFIT_IMAGE` (service image archive),
//! `BENEFIT_OUT` (default docs/benefit), `BENEFIT_SCENARIOS` (comma list of
//! `mixed,short,alone,pair,flicker`; default all), `BENEFIT_MATRIX` (`quick`: one
//! repetition of each, whatever `BENEFIT_REPS` says; `full`, the default:
//! `BENEFIT_REPS`), `BENEFIT_REPS` (3), `BENEFIT_SEED`, `BENEFIT_CONFIGS`
//! (comma list of the names above), `BENEFIT_TUNED`, `BENEFIT_BASELINE` (a
//! summary.json; empty: no check); `mixed`'s schedules `BENEFIT_SCHEDULE`,
//! `BENEFIT_BATCH_SCHEDULE`, `BENEFIT_WITHIN_SCHEDULE` (see
//! `benefit::schedule`; the other scenarios' are `benefit::matrix`'s; a
//! within-request neighbour's must stay at or below its request);
//! `BENEFIT_BURN_US` (25000), `BENEFIT_BURST_US`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use benefit::analysis::{self, Neighbour, Sample};
use benefit::matrix::{self, Scenario};
use benefit::schedule::Phase;
use benefit::summary::{self, Baseline, RunRow};
use benefit::{agent_log, stats};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use testkit::agent::metric;
use testkit::node_vm::{GuestAgent, NodeSpec, NodeVm, RealCluster, container_ids};

const IMAGE: &str = "headroom.local/benefit:1";
const REQUEST_M: u64 = 200;
/// The tight limit: request × 1.5.
const LIMIT_M: u64 = 300;
/// Headroom's default ceiling: request × 4.
const CEILING_M: u64 = 4 * REQUEST_M;
const PERIOD_US: u64 = 100_000;
/// The within-request neighbour's CPU request (no CPU limit).
const WITHIN_REQUEST_M: u64 = 500;
/// The batch neighbour's CPU request (no limit).
const BATCH_REQUEST_M: u64 = 100;
/// The managed services' pod names (`svc2` in `pair` only).
const SVC: &str = "svc";
const SVC2: &str = "svc2";
/// Seconds a run takes beyond its schedule (lead-in, drain, set-up), for
/// the estimate printed at start; a `pair` run adds its second pod's.
const RUN_OVERHEAD_S: f64 = 20.0;
const PAIR_OVERHEAD_S: f64 = 20.0;

/// The neighbours a lowering of a service is judged against.
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
    /// Koordinator's koordlet, CPU Burst `auto` (`benefit::koordlet`).
    Koordlet,
    /// Headroom and koordlet both, on the same services: what a user
    /// running both would see (docs/coexistence.md). Not a contender: no
    /// goals, no refusal; its run reports what the agent said.
    Coexist,
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
    const ALL: [Config; 8] = [
        Config::Static,
        Config::NoLimit,
        Config::Headroom,
        Config::Burst,
        Config::DryRun,
        Config::Declared,
        Config::Koordlet,
        Config::Coexist,
    ];
    /// Run when `BENEFIT_CONFIGS` is unset (with any tuning candidates).
    /// (d) and (k) are the peers the goals hold Headroom against (issue 48).
    const DEFAULT: [Config; 6] = [
        Config::Static,
        Config::NoLimit,
        Config::Headroom,
        Config::Burst,
        Config::DryRun,
        Config::Koordlet,
    ];
    fn name(self) -> &'static str {
        match self {
            Config::Static => "a-static",
            Config::NoLimit => "b-nolimit",
            Config::Headroom => "c-headroom",
            Config::Burst => "d-burst",
            Config::DryRun => "e-dryrun",
            Config::Declared => "f-declared",
            Config::Koordlet => "k-koordlet",
            Config::Coexist => "x-coexist",
            Config::Tuned(t) => &t.name,
        }
    }
    fn agent_args(self) -> Option<Vec<String>> {
        match self {
            Config::Headroom | Config::Coexist => Some(vec![]),
            Config::DryRun => Some(vec!["--dry-run".into()]),
            Config::Declared => Some(vec!["--floor".into(), "declared".into()]),
            Config::Tuned(t) => Some(t.args.clone()),
            Config::Static | Config::NoLimit | Config::Burst | Config::Koordlet => None,
        }
    }
    /// `summary::AGENT_*`: no agent, one that patches, one in `--dry-run`,
    /// one beside koordlet.
    fn agent_mode(self) -> &'static str {
        if self == Config::Coexist {
            return summary::AGENT_BESIDE_KOORDLET;
        }
        match self.agent_args() {
            None => summary::AGENT_NONE,
            Some(a) if a.iter().any(|f| f == "--dry-run") => summary::AGENT_DRY_RUN,
            Some(_) => summary::AGENT_PATCH,
        }
    }
}

struct Settings {
    reps: usize,
    matrix: String,
    seed: u64,
    configs: Vec<Config>,
    scenarios: Vec<Scenario>,
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

fn env_or(k: &str, d: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| d.to_string())
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        anyhow::ensure!(
            std::env::var_os("BENEFIT_GUARANTEED_SCHEDULE").is_none(),
            "BENEFIT_GUARANTEED_SCHEDULE is gone: the Guaranteed neighbour is now the \
             within-request neighbour, BENEFIT_WITHIN_SCHEDULE"
        );
        let tuned: Vec<Config> = parse_tuned(&env_or("BENEFIT_TUNED", ""))?
            .into_iter()
            .map(|t| Config::Tuned(Box::leak(Box::new(t))))
            .collect();
        let known: Vec<Config> = Config::ALL.into_iter().chain(tuned.clone()).collect();
        let configs = match std::env::var("BENEFIT_CONFIGS") {
            Err(_) => Config::DEFAULT.into_iter().chain(tuned).collect(),
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
        let matrix_env = std::env::var("BENEFIT_MATRIX").ok();
        let reps = matrix::reps(
            matrix_env.as_deref(),
            std::env::var("BENEFIT_REPS").ok().as_deref(),
        )
        .map_err(anyhow::Error::msg)?;
        let (svc, within, batch) = (
            env_or("BENEFIT_SCHEDULE", matrix::MIXED_SVC),
            env_or("BENEFIT_WITHIN_SCHEDULE", matrix::MIXED_WITHIN),
            env_or("BENEFIT_BATCH_SCHEDULE", matrix::MIXED_BATCH),
        );
        let mixed = matrix::MixedSchedules {
            svc: &svc,
            within: &within,
            batch: &batch,
        };
        let scenarios = matrix::scenario_names(std::env::var("BENEFIT_SCENARIOS").ok().as_deref())
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .map(|n| matrix::scenario(n, mixed))
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?;
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
            reps,
            matrix: matrix_env.unwrap_or_else(|| "full".into()),
            seed,
            configs,
            scenarios,
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
        for sc in &s.scenarios {
            if let Some(w) = &sc.within {
                let peak = matrix::peak_demand_m(w, s.burn_us);
                anyhow::ensure!(
                    peak <= WITHIN_REQUEST_M as f64,
                    "{}: the within-request neighbour asks {peak:.0}m at {} µs a request: \
                     above its {WITHIN_REQUEST_M}m request",
                    sc.name,
                    s.burn_us
                );
            }
            if matches!(sc.name, "short" | "flicker") {
                let peak = matrix::peak_demand_m(&sc.svc, s.burn_us);
                anyhow::ensure!(
                    peak >= CEILING_M as f64,
                    "{}: the service bursts to {peak:.0}m at {} µs a request: below its \
                     {CEILING_M}m ceiling, so the node is not short",
                    sc.name,
                    s.burn_us
                );
            }
        }
        for f in [&s.load_bin, &s.image] {
            anyhow::ensure!(f.is_file(), "{} missing: run scripts/benefit", f.display());
        }
        anyhow::ensure!(
            s.reps >= 1 && !s.configs.is_empty() && !s.scenarios.is_empty(),
            "nothing to run"
        );
        Ok(s)
    }

    /// Runs and estimated wall time of the plan, in minutes.
    fn estimate(&self) -> (usize, f64) {
        let per_rep: f64 = self
            .scenarios
            .iter()
            .map(|sc| {
                let one = sc.total().as_secs_f64()
                    + RUN_OVERHEAD_S
                    + if sc.svc2.is_some() {
                        PAIR_OVERHEAD_S
                    } else {
                        0.0
                    };
                one * self.configs.len() as f64
            })
            .sum();
        (
            self.scenarios.len() * self.configs.len() * self.reps,
            per_rep * self.reps as f64 / 60.0,
        )
    }
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

/// A managed service: request 200m, limit 300m.
fn managed_pod(name: &str, node: &str) -> Value {
    service_pod(
        name,
        node,
        json!({"cpu": format!("{REQUEST_M}m"), "memory": "32Mi"}),
        json!({"cpu": format!("{LIMIT_M}m"), "memory": "64Mi"}),
    )
}

async fn create(api: &Api<Pod>, v: Value) -> anyhow::Result<()> {
    let p: Pod = serde_json::from_value(v)?;
    api.create(&PostParams::default(), &p).await?;
    Ok(())
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
    uid: String,
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
        uid: uid.to_string(),
        ip,
        pod_dir,
        container_dir,
    })
}

/// Waits until the service at `t` answers `/healthz` (up to 60 s).
async fn wait_answering(node: &NodeVm, t: &Target) -> anyhow::Result<()> {
    node.sh(&format!(
        "for i in $(seq 1 60); do (exec 3<>/dev/tcp/{}/8080 && printf 'GET /healthz HTTP/1.1\\r\\n\\r\\n' >&3 && head -c 15 <&3) 2>/dev/null | grep -q 200 && exit 0; sleep 1; done; exit 1",
        t.ip
    ))
    .await
    .with_context(|| format!("service at {} never answered", t.ip))?;
    Ok(())
}

fn limit_patch(m: u64) -> Patch<Value> {
    Patch::Strategic(json!({"spec": {"containers": [{"name": "app",
        "resources": {"limits": {"cpu": format!("{m}m")}}}]}}))
}

/// A CPU quantity in millicores (`300m`, `2`, `1.5`).
fn quantity_m(q: &str) -> Option<u64> {
    match q.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => q.parse::<f64>().ok().map(|c| (c * 1000.0).round() as u64),
    }
}

/// The `app` container's CPU limit in the pod's spec.
fn spec_limit_m(pod: &Pod) -> Option<u64> {
    let c = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == "app")?;
    quantity_m(&c.resources.as_ref()?.limits.as_ref()?.get("cpu")?.0)
}

/// Resizes the managed pod `name` to `m` (unless its spec says so already)
/// and waits until its container's cpu.max does.
async fn set_limit(
    node: &NodeVm,
    api: &Api<Pod>,
    name: &str,
    t: &Target,
    m: u64,
) -> anyhow::Result<()> {
    let want = format!("{} {PERIOD_US}", m * PERIOD_US / 1000);
    if spec_limit_m(&api.get(name).await?) != Some(m) {
        testkit::control_plane::resize(api, name, &limit_patch(m), false)
            .await
            .with_context(|| format!("resize {name}"))?;
    }
    let script = format!(
        "for i in $(seq 1 900); do [ \"$(cat {}/cpu.max)\" = '{want}' ] && exit 0; sleep 0.1; done; exit 1",
        t.container_dir
    );
    let out = node.sh_output(&script).await?;
    anyhow::ensure!(out.status.success(), "{name} cpu.max never read {want}");
    Ok(())
}

/// Hands the managed pod `name` back to Headroom as a user would
/// (docs/coexistence.md, "Handing the limits back"): `headroom.dev/resume`
/// set to the latest time any `resize` of it was made (its `managedFields`,
/// the API server's clock) or now, whichever is later, in whole seconds (a
/// change at or before the time is covered; `managedFields` times are whole
/// seconds). The bench's own resize between runs is then no other writer's
/// and the agent manages the pod from the limit in place. Returns the time.
async fn hand_back(api: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    let pod = api.get(name).await?;
    let latest = pod
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref() == Some("resize"))
        .filter_map(|m| m.time.as_ref().map(|t| t.0))
        .max();
    let now = Timestamp::now();
    let at = latest.map_or(now, |l| l.max(now));
    let at = Timestamp::from_second(at.as_second())?.to_string();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"headroom.dev/resume": at}}})),
    )
    .await
    .with_context(|| format!("annotate {name} headroom.dev/resume"))?;
    Ok(at)
}

/// Writes `cpu.max.burst` on a service's container and pod cgroups.
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

/// Configuration (k)'s set-up on the bench's cluster (once, when (k) runs):
/// what meta.json records of it.
#[derive(Debug, serde::Serialize)]
struct KoordletSetup {
    version: &'static str,
    flags: Vec<String>,
    /// `cpuBurstPercent` in the NodeSLO: the default (1000) unless the
    /// kernel refused the burst it gives, then the highest it accepts.
    cpu_burst_percent: u64,
    node_slo: Value,
    /// What the guest's kernel said to the default burst (limit × 1000 %)
    /// and to the one used, written by hand on the service's container
    /// before koordlet ever ran.
    default_burst_us: u64,
    default_burst: String,
    used_burst_us: u64,
    used_burst: String,
}

const KOORDLET_NS: &str = benefit::koordlet::NAMESPACE;
const KOORDLET_SA: &str = benefit::koordlet::SERVICE_ACCOUNT;
const KOORDLET_UNIT: &str = "koordlet";
const KOORDLET_KUBECONFIG: &str = "/mnt/node/koordlet/kubeconfig";

fn koordlet_cache() -> (PathBuf, PathBuf) {
    let bin = testkit::control_plane::bin_dir();
    let crds = bin
        .parent()
        .map(|c| c.join(format!("crds/koordinator-{}", benefit::koordlet::VERSION)))
        .unwrap_or_default();
    (
        bin.join(format!("koordlet-{}", benefit::koordlet::VERSION)),
        crds,
    )
}

/// Writes `us` to `file` in the guest: `accepted`, or the shell's error
/// (the kernel's errno). Leaves `reset` there after.
async fn try_write(node: &NodeVm, file: &str, us: u64, reset: u64) -> anyhow::Result<String> {
    Ok(node
        .sh(&format!(
            "if out=$(echo {us} 2>&1 > {file}); then echo accepted; \
             else echo \"refused: $out\"; fi; echo {reset} > {file}"
        ))
        .await?
        .trim()
        .to_string())
}

/// Puts koordlet beside the bench's node as its users do, without
/// koord-manager: its CRDs (NodeSLO, NodeMetric, NodeResourceTopology) and
/// RBAC on the control plane, a NodeSLO named after the node with CPU Burst
/// `auto` (the node-wide opt-in every pod with a CPU limit gets: here the
/// services; the neighbours have none), a ServiceAccount token kubeconfig
/// and the binary in the node's share. First checks on the guest's kernel
/// the default burst (limit × 1000 %), which cgroup v2 refuses above the
/// quota (koordinator#2326).
async fn install_koordlet(
    c: &RealCluster,
    node: &NodeVm,
    svc: &Target,
) -> anyhow::Result<KoordletSetup> {
    use benefit::koordlet as k;
    let (bin, crds) = koordlet_cache();
    anyhow::ensure!(
        bin.is_file() && crds.join("rbac-koordlet.yaml").is_file(),
        "{} or its CRDs missing: run tests/koordlet/build.sh",
        bin.display()
    );
    let dst = node.share_dir().join("bin/koordlet");
    std::fs::copy(&bin, dst.with_extension("tmp"))?;
    std::fs::rename(dst.with_extension("tmp"), &dst)?;

    // The kernel and the default burst.
    let quota: u64 = node
        .sh(&format!("cut -d' ' -f1 {}/cpu.max", svc.container_dir))
        .await?
        .trim()
        .parse()
        .context("the service's cpu.max quota")?;
    let file = format!("{}/cpu.max.burst", svc.container_dir);
    let default_burst_us = k::burst_us(LIMIT_M, k::CPU_BURST_PERCENT_DEFAULT);
    let default_burst = try_write(node, &file, default_burst_us, 0).await?;
    let percent = if default_burst == "accepted" {
        k::CPU_BURST_PERCENT_DEFAULT
    } else {
        k::highest_accepted_percent(LIMIT_M, quota)
    };
    let used_burst_us = k::burst_us(LIMIT_M, percent);
    let used_burst = try_write(node, &file, used_burst_us, 0).await?;
    anyhow::ensure!(
        used_burst == "accepted",
        "the kernel refused cpu.max.burst {used_burst_us} beside quota {quota}: {used_burst}"
    );
    eprintln!(
        "benefit: koordlet: cpu.max.burst {default_burst_us} (the default 1000 % of {LIMIT_M}m) \
         beside quota {quota}: {default_burst}; cpuBurstPercent {percent} \
         ({used_burst_us}): {used_burst}"
    );

    let client = c.cp.client().await;
    let mut objs = Vec::new();
    for f in [
        "slo.koordinator.sh_nodeslos.yaml",
        "slo.koordinator.sh_nodemetrics.yaml",
        "topology.node.k8s.io_noderesourcetopologies.yaml",
    ] {
        objs.extend(testkit::manifests::parse_docs(&std::fs::read_to_string(
            crds.join(f),
        )?)?);
    }
    testkit::manifests::apply_all(&client, &objs, "headroom-bench").await?;
    let crd_api =
        Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(
            client.clone(),
        );
    for name in [
        "nodeslos.slo.koordinator.sh",
        "nodemetrics.slo.koordinator.sh",
        "noderesourcetopologies.topology.node.k8s.io",
    ] {
        let mut ok = false;
        for _ in 0..300 {
            if let Ok(c) = crd_api.get(name).await
                && c.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::ensure!(ok, "CRD {name} not established");
    }
    let rbac = k::rbac(testkit::manifests::parse_docs(&std::fs::read_to_string(
        crds.join("rbac-koordlet.yaml"),
    )?)?);
    testkit::manifests::apply_all(&client, &rbac, "headroom-bench").await?;
    let node_slo = k::node_slo(node.name(), percent);
    testkit::manifests::apply_all(&client, std::slice::from_ref(&node_slo), "headroom-bench")
        .await?;

    // A token of its ServiceAccount, as the DaemonSet's pod would mount.
    let tr: k8s_openapi::api::authentication::v1::TokenRequest =
        serde_json::from_value(json!({"spec": {"expirationSeconds": 86400}}))?;
    let token =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), KOORDLET_NS)
            .create_token_request(KOORDLET_SA, &PostParams::default(), &tr)
            .await?
            .status
            .context("TokenRequest without a status")?
            .token;
    let token = token.context("TokenRequest status without a token")?;
    let server = format!(
        "https://{}:{}",
        testkit::certs::GUEST_APISERVER_IP,
        testkit::node_vm::config::GUEST_APISERVER_PORT
    );
    let kubeconfig = testkit::certs::Kubeconfig {
        server: &server,
        ca: "/etc/kubernetes/ca.crt",
        user: KOORDLET_SA,
        auth: testkit::certs::KubeconfigAuth::Token(&token),
        namespace: None,
    }
    .yaml();
    let dir = node.share_dir().join("koordlet");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("kubeconfig"), kubeconfig)?;
    Ok(KoordletSetup {
        version: k::VERSION,
        flags: k::flags(),
        cpu_burst_percent: percent,
        node_slo,
        default_burst_us,
        default_burst,
        used_burst_us,
        used_burst,
    })
}

/// koordlet running for one (k) run: started with a fresh TSDB, and what
/// it found the service's cgroups at, to undo its writes after.
struct KoordletRun {
    /// The guest's clock at its start (Unix s), for its journal.
    since: u64,
    /// `(file, value)` the kubelet left: the service's `cpu.max`, pod's
    /// and container's.
    cpu_max: Vec<(String, String)>,
}

/// Stops koordlet's unit if it runs (every run's set-up: no koordlet while
/// another configuration runs).
async fn koordlet_stop(node: &NodeVm) -> anyhow::Result<()> {
    node.sh(&format!(
        "systemctl stop {KOORDLET_UNIT} 2>/dev/null; systemctl reset-failed {KOORDLET_UNIT} 2>/dev/null; true"
    ))
    .await
    .map(|_| ())
}

/// Starts koordlet as a transient unit in the guest (as Headroom's agent
/// runs in this bench) and waits until it has written the burst it should
/// on the service's container and pod: its CPU Burst loop runs.
async fn koordlet_start(
    node: &NodeVm,
    svcs: &[(&str, &Target)],
    setup: &KoordletSetup,
) -> anyhow::Result<KoordletRun> {
    koordlet_stop(node).await?;
    let mut cpu_max = Vec::new();
    for (_, t) in svcs {
        for dir in [&t.pod_dir, &t.container_dir] {
            let f = format!("{dir}/cpu.max");
            let v = node.sh(&format!("cat {f}")).await?.trim().to_string();
            cpu_max.push((f, v));
        }
    }
    let since: u64 = node.sh("date +%s").await?.trim().parse()?;
    let mut cmd = format!(
        "rm -rf /var/lib/koordlet; mkdir -p /var/lib/koordlet/tsdb \
         /var/lib/koordlet/prediction-checkpoints /var/run/koordlet /etc/runtime/hookserver.d && \
         systemd-run --unit={KOORDLET_UNIT} --collect -E NODE_NAME={} -E agent_mode=hostMode \
         /mnt/node/bin/koordlet --kubeconfig={KOORDLET_KUBECONFIG}",
        node.name()
    );
    for f in &setup.flags {
        cmd.push(' ');
        cmd.push_str(f);
    }
    node.sh(&cmd).await?;
    let want = setup.used_burst_us;
    let files: Vec<String> = svcs
        .iter()
        .flat_map(|(_, t)| {
            [
                format!("{}/cpu.max.burst", t.container_dir),
                format!("{}/cpu.max.burst", t.pod_dir),
            ]
        })
        .collect();
    let script = format!(
        "for i in $(seq 1 480); do ok=1; for f in {}; do [ \"$(cat $f)\" = {want} ] || ok=; done; \
         [ -n \"$ok\" ] && exit 0; systemctl is-active -q {KOORDLET_UNIT} || exit 2; sleep 0.5; done; exit 1",
        files.join(" ")
    );
    let out = node.sh_output(&script).await?;
    if !out.status.success() {
        let log = node
            .sh(&format!(
                "journalctl -u {KOORDLET_UNIT} --since @{since} --no-pager -o cat | tail -n 40"
            ))
            .await
            .unwrap_or_default();
        let _ = koordlet_stop(node).await;
        bail!(
            "koordlet never wrote cpu.max.burst {want} on the service's container and pod \
             within 240 s (exit {:?}); its log:\n{log}",
            out.status.code()
        );
    }
    Ok(KoordletRun { since, cpu_max })
}

/// Stops koordlet and undoes its writes: `cpu.max.burst` 0, `cpu.max` as the
/// kubelet left it (containers first: a pod's quota may not fall below a
/// child's burst). Returns its journal since its start.
async fn koordlet_finish(
    node: &NodeVm,
    svcs: &[(&str, &Target)],
    run: KoordletRun,
) -> anyhow::Result<String> {
    let log = node
        .sh(&format!(
            "journalctl -u {KOORDLET_UNIT} --since @{} --no-pager -o cat",
            run.since
        ))
        .await
        .unwrap_or_default();
    koordlet_stop(node).await?;
    for (_, t) in svcs {
        set_burst(node, t, 0).await?;
    }
    let mut restore: Vec<&(String, String)> = run.cpu_max.iter().collect();
    restore.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    for (f, v) in restore {
        node.sh(&format!("echo '{v}' > {f} && [ \"$(cat {f})\" = '{v}' ]"))
            .await
            .with_context(|| format!("restoring {f} to {v}"))?;
    }
    Ok(log)
}

/// The samples of a scrape that say what the agent made of another
/// writer's cgroup writes, one `name{labels} value` a line.
fn coexistence_samples(m: &prometheus_parse::Scrape) -> String {
    let mut out = String::new();
    for x in m.samples.iter().filter(|x| {
        [
            "headroom_cgroup_drift",
            "headroom_cgroup_drift_events_total",
            "headroom_resizes_total",
            "headroom_patch_errors_total",
        ]
        .contains(&x.metric.as_str())
    }) {
        let v = match x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        let _ = writeln!(out, "{}{{{}}} {v}", x.metric, x.labels);
    }
    out
}

/// (x) Headroom beside koordlet: what the agent said (its log's drift,
/// verification and yield lines; its drift and resize samples) and how
/// many quota changes koordlet logged, into raw/<run>-coexist.txt and one
/// line of the bench's log. Nothing is judged: it is what a user running
/// both would see (docs/coexistence.md).
fn report_coexistence(
    s: &Settings,
    id: &str,
    log: &str,
    samples: &str,
    koordlet_writes: usize,
) -> anyhow::Result<()> {
    let c = agent_log::coexistence(log);
    let line = format!(
        "{id}: beside koordlet ({koordlet_writes} quota changes logged): drift {} (cleared {}), \
         Headroom's resizes verified {} / unverified {} / overtaken {}, yields {}",
        c.drifts, c.drifts_cleared, c.verified, c.unverified, c.overtaken, c.yields
    );
    eprintln!("benefit: {line}");
    let text = format!(
        "{line}\nfirst drift line: {}\n\nsamples at the end:\n{samples}",
        c.first_drift.as_deref().unwrap_or("-")
    );
    std::fs::write(s.out.join(format!("raw/{id}-coexist.txt")), text)?;
    Ok(())
}

fn phase_list(p: &[Phase]) -> String {
    p.iter()
        .map(|p| format!("{}:{}@{}", p.name, p.duration.as_secs_f64(), p.rate_per_s))
        .collect::<Vec<_>>()
        .join(",")
}

/// The in-guest script of one run: the sampler (its line:
/// `benefit::analysis`; with `svc2`, its container's `cpu.max` and
/// `cpu.stat` too) and a load generator for each pod the scenario loads,
/// started together; `done` when all have finished.
fn run_script(
    s: &Settings,
    sc: &Scenario,
    id: &str,
    pods: &Pods<'_>,
    svc2: Option<&Target>,
) -> String {
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
    let (read2, field2) = match svc2 {
        Some(_) => (
            " read -r cm2 < $C2/cpu.max; mapfile -t cs2 < $C2/cpu.stat;",
            "|$cm2|${cs2[*]}",
        ),
        None => ("", ""),
    };
    let mut sh = format!(
        "#!/bin/bash\nset -u\nout=/tmp/benefit/{id}\nrm -rf $out; mkdir -p $out\n\
         T0=$(( $(date +%s%N) + 4000000000 ))\necho $T0 > $out/t0\n\
         C={c}; P={p}; W={w}; B={b}; C2={c2}\n\
         sample() {{ while [ ! -e $out/stop ]; do t=$EPOCHREALTIME; read -r cm < $C/cpu.max; \
         mapfile -t cs < $C/cpu.stat; mapfile -t ps < $P/cpu.stat; mapfile -t ws < $W/cpu.stat; \
         mapfile -t bs < $B/cpu.stat; read -r st < /proc/stat; \
         mapfile -t wp < $W/cpu.pressure; mapfile -t bp < $B/cpu.pressure;{read2} \
         (IFS=';'; echo \"$t|$cm|${{cs[*]}}|${{ps[*]}}|${{ws[*]}}|${{bs[*]}}|$st|${{wp[*]}}|${{bp[*]}}{field2}\"); \
         sleep 0.5; done; }}\n\
         sample > $out/samples.txt & sp=$!\npids=\n",
        c = pods.svc.container_dir,
        p = pods.svc.pod_dir,
        w = pods.within.pod_dir,
        b = pods.b.pod_dir,
        c2 = svc2.map_or("none", |t| t.container_dir.as_str()),
    );
    sh.push_str(&load("svc", &pods.svc, &sc.svc, 32));
    if let (Some(t), Some(p)) = (svc2, &sc.svc2) {
        sh.push_str(&load("svc2", t, p, 32));
    }
    if let Some(p) = &sc.within {
        sh.push_str(&load("within", &pods.within, p, 8));
    }
    if let Some(p) = &sc.batch {
        sh.push_str(&load("batch", &pods.b, p, 32));
    }
    sh.push_str("wait $pids\ntouch $out/stop; wait $sp\ntouch $out/done\n");
    sh
}

/// The number at `path` of a load generator's JSON (NaN without it).
fn p(v: Option<&Value>, path: &[&str]) -> f64 {
    let Some(mut x) = v else {
        return f64::NAN;
    };
    for k in path {
        x = if let Ok(i) = k.parse::<usize>() {
            &x[i]
        } else {
            &x[*k]
        };
    }
    x.as_f64().unwrap_or(f64::NAN)
}

/// The highest p99 of the phases `phases` (NaN without any).
fn phases_p99(v: Option<&Value>, phases: &[usize]) -> f64 {
    phases
        .iter()
        .map(|i| p(v, &["summary", "phases", &i.to_string(), "p99_ms"]))
        .fold(f64::NAN, f64::max)
}

struct Pods<'a> {
    node: &'a NodeVm,
    svc_api: Api<Pod>,
    svc: Target,
    within: Target,
    b: Target,
    /// Configuration (k)'s set-up, when it runs.
    koordlet: Option<KoordletSetup>,
}

impl Pods<'_> {
    /// Creates the second managed service (`pair`), waits until it runs
    /// and answers.
    async fn create_svc2(&self) -> anyhow::Result<Target> {
        create(&self.svc_api, managed_pod(SVC2, self.node.name())).await?;
        let pod = wait_running(&self.svc_api, SVC2).await?;
        let t = target(self.node, &pod).await?;
        wait_answering(self.node, &t).await?;
        Ok(t)
    }

    /// Deletes the second managed service and waits until it is gone.
    async fn delete_svc2(&self, t: &Target) -> anyhow::Result<()> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        self.svc_api.delete(SVC2, &dp).await?;
        let gone = await_condition(self.svc_api.clone(), SVC2, conditions::is_deleted(&t.uid));
        match tokio::time::timeout(Duration::from_secs(180), gone).await {
            Ok(Ok(_)) => Ok(()),
            other => bail!("{SVC2} not deleted: {other:?}"),
        }
    }
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

/// A load generator's JSON of the run.
async fn read_json(node: &NodeVm, id: &str, name: &str) -> anyhow::Result<Value> {
    serde_json::from_str(&read_out(node, id, &format!("{name}.json")).await?)
        .with_context(|| format!("{id}: {name}.json"))
}

/// One run of the plan. `pair` runs create the second service first and
/// delete it after, whatever the run's outcome.
async fn run_one(
    s: &Settings,
    pods: &Pods<'_>,
    sc: &Scenario,
    config: Config,
    rep: usize,
    order: usize,
) -> anyhow::Result<RunRow> {
    let id = format!("{}-{}-r{rep}", sc.name, config.name());
    eprintln!("benefit: run {id} (#{order}), host load {}", loadavg());
    let svc2 = match sc.svc2 {
        Some(_) => Some(pods.create_svc2().await.context("create svc2")?),
        None => None,
    };
    let row = measure(s, pods, sc, config, rep, order, id, svc2.as_ref()).await;
    if let Some(t) = &svc2 {
        match pods.delete_svc2(t).await {
            Err(e) if row.is_ok() => return Err(e),
            Err(e) => eprintln!("benefit: {e:#}"),
            Ok(()) => {}
        }
    }
    row
}

/// Why a run measured nothing, if it did (`agent_log::refusal`; the bench
/// then fails).
fn refuse(
    id: &str,
    config: Config,
    sc: &Scenario,
    burn_us: u64,
    log: &str,
    managed_patches: usize,
    metric_patches: f64,
) -> Option<String> {
    let peak = matrix::peak_demand_m(&sc.svc, burn_us);
    let why = agent_log::refusal(
        log,
        config.agent_mode() == summary::AGENT_PATCH,
        peak > LIMIT_M as f64,
        managed_patches,
        metric_patches,
    )?;
    Some(match why {
        agent_log::Refusal::Yielded { lines, first } => format!(
            "{id}: the agent yielded to another writer ({lines} line(s); first: {first}): the \
             handover (headroom.dev/resume) did not cover the bench's resize, so the agent \
             managed nothing; see raw/{id}-agent.log"
        ),
        agent_log::Refusal::NoPatch => format!(
            "{id}: the agent made no patch although the service bursts to {peak:.0}m, above \
             its {LIMIT_M}m limit: the run measured nothing; see raw/{id}-agent.log"
        ),
        agent_log::Refusal::LogUnread { metric_patches } => format!(
            "{id}: the agent's metrics count {metric_patches} patches but its log has no \
             `resized pod=` line for a service: has the log format changed? see \
             raw/{id}-agent.log"
        ),
    })
}

/// The patches of service `name` in each of `windows`: the most in one,
/// and `name:n1/n2/…` for the run's line.
fn patches_per_window(
    resizes: &[agent_log::Resize],
    name: &str,
    windows: &[(f64, f64)],
) -> (usize, String) {
    let counts = agent_log::patches_per_burst(resizes, name, windows);
    let line = counts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("/");
    (
        counts.iter().copied().max().unwrap_or(0),
        format!("{name}:{line}"),
    )
}

#[expect(clippy::too_many_arguments, reason = "one run's settings")]
async fn measure(
    s: &Settings,
    pods: &Pods<'_>,
    sc: &Scenario,
    config: Config,
    rep: usize,
    order: usize,
    id: String,
    svc2: Option<&Target>,
) -> anyhow::Result<RunRow> {
    let node = pods.node;
    let mut managed: Vec<(&str, &Target)> = vec![(SVC, &pods.svc)];
    if let Some(t) = svc2 {
        managed.push((SVC2, t));
    }
    // Set up: the limits, the bursts, the agent.
    let limit = if config == Config::NoLimit {
        u64::from(node.spec.cpus) * 1000
    } else {
        LIMIT_M
    };
    let burst = if config == Config::Burst {
        s.burst_us
    } else {
        0
    };
    let mut burst_setting = Vec::new();
    for (name, t) in &managed {
        set_limit(node, &pods.svc_api, name, t, limit).await?;
        let b = set_burst(node, t, burst).await?;
        burst_setting.push(if *name == SVC {
            b
        } else {
            format!("{name} {b}")
        });
    }
    let burst_setting = burst_setting.join("; ");
    // No koordlet but in (k) and (x); no Headroom in (k) (it has no agent
    // args). In (x) koordlet starts first: the agent finds its writes.
    koordlet_stop(node).await?;
    let koordlet = match (config, &pods.koordlet) {
        (Config::Koordlet | Config::Coexist, Some(setup)) => {
            Some(koordlet_start(node, &managed, setup).await?)
        }
        (Config::Koordlet | Config::Coexist, None) => bail!("{id}: koordlet was not set up"),
        _ => None,
    };
    let agent = match config.agent_args() {
        Some(args) => {
            for (name, _) in &managed {
                let at = hand_back(&pods.svc_api, name).await?;
                eprintln!("benefit: {id}: {name} handed back (headroom.dev/resume={at})");
            }
            Some(GuestAgent::start(node, &args).await?)
        }
        None => None,
    };
    let cpu_before = if agent.is_some() {
        agent_cpu_us(node).await
    } else {
        0
    };
    let script = run_script(s, sc, &id, pods, svc2);
    let dir = node.share_dir().join("benefit");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{id}.sh")), script)?;
    let load_before = loadavg();
    node.sh(&format!(
        "systemctl reset-failed benefit-{id} 2>/dev/null; \
         systemd-run --unit=benefit-{id} --collect bash /mnt/node/benefit/{id}.sh"
    ))
    .await?;
    let deadline = Instant::now() + sc.total() + Duration::from_secs(90);
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
    let svc = read_json(node, &id, "svc").await?;
    let v2 = match svc2 {
        Some(_) => Some(read_json(node, &id, "svc2").await?),
        None => None,
    };
    let w = match sc.within {
        Some(_) => Some(read_json(node, &id, "within").await?),
        None => None,
    };
    let b = match sc.batch {
        Some(_) => Some(read_json(node, &id, "batch").await?),
        None => None,
    };
    let (samples, bad) = analysis::parse_samples(&read_out(node, &id, "samples.txt").await?);
    if bad > 0 {
        eprintln!("benefit: {id}: {bad} sampler lines unreadable (skipped)");
    }
    let (mut raise_p, mut lower_p, mut dry) = (0.0, 0.0, 0.0);
    let mut agent_cpu_s = 0.0;
    let mut log = String::new();
    let mut metrics_text = String::new();
    if let Some(agent) = agent {
        let m = agent.scrape().await?;
        metrics_text = coexistence_samples(&m);
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
        let tail = agent.log_tail(20_000).await;
        log = agent_log::last_start(&tail).to_string();
        std::fs::write(s.out.join(format!("raw/{id}-agent.log")), &log)?;
        agent.stop().await?;
    }
    // (k): what koordlet left on the services' cgroups, its log; then it
    // stops and its writes are undone.
    let (mut koordlet_burst_us, mut koordlet_pod_burst_us, mut koordlet_log) = (0, 0, None);
    if let Some(run) = koordlet {
        let read = |f: String| async move {
            node.sh(&format!("cat {f}"))
                .await
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        koordlet_burst_us = read(format!("{}/cpu.max.burst", pods.svc.container_dir)).await;
        koordlet_pod_burst_us = read(format!("{}/cpu.max.burst", pods.svc.pod_dir)).await;
        let klog = koordlet_finish(node, &managed, run).await?;
        std::fs::write(s.out.join(format!("raw/{id}-koordlet.log")), &klog)?;
        koordlet_log = Some(klog);
    }
    let koordlet_writes = koordlet_log
        .as_deref()
        .map(benefit::koordlet::quota_writes)
        .unwrap_or_default();
    let resizes = agent_log::resizes(&log);
    let is_managed = |r: &agent_log::Resize| managed.iter().any(|(n, _)| r.of_pod(n));
    let managed_patches = resizes.iter().filter(|r| is_managed(r)).count();
    if config == Config::Coexist {
        report_coexistence(s, &id, &log, &metrics_text, koordlet_writes.len())?;
    } else if config.agent_args().is_some()
        && let Some(why) = refuse(
            &id,
            config,
            sc,
            s.burn_us,
            &log,
            managed_patches,
            raise_p + lower_p,
        )
    {
        bail!(why);
    }
    let checks = agent_log::effect_counts(&agent_log::lowering_checks(&log));
    let t0: f64 = svc["start_unix_ns"]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .context("start_unix_ns")?
        / 1e9;
    let end = t0 + sc.total().as_secs_f64();
    let abs = |w: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        w.into_iter().map(|(a, b)| (t0 + a, t0 + b)).collect()
    };
    let win = analysis::window(&samples, t0, end).context("no samples inside the run")?;
    if config == Config::Koordlet {
        let writes = benefit::koordlet::Writes {
            samples_above_limit: samples
                .iter()
                .filter(|x| x.t >= t0 && x.t <= end)
                .filter(|x| analysis::limit_m(x).is_some_and(|m| m > LIMIT_M))
                .count(),
            container_burst_us: koordlet_burst_us,
            pod_burst_us: koordlet_pod_burst_us,
            log_quota_writes: koordlet_writes.iter().filter(|w| w.of_pod(SVC)).count(),
        };
        eprintln!("benefit: {id}: koordlet wrote {writes:?}");
        if let Some(why) = benefit::koordlet::refusal(win.throttled_s, &writes) {
            bail!("{id}: {why}; see raw/{id}-koordlet.log");
        }
    }
    let bursts = abs(matrix::phase_windows(&sc.svc, "burst"));
    let raise = |i: usize| {
        bursts
            .get(i)
            .and_then(|(a, b)| analysis::first_raise_after(&samples, *a, *b, LIMIT_M))
    };
    // The batch neighbour's demand: when it starts, the first lowering after.
    let demand = sc.batch.as_ref().map_or((Vec::new(), Vec::new()), |bp| {
        (
            matrix::phase_indices(bp, "demand"),
            abs(matrix::phase_windows(bp, "demand")),
        )
    });
    let lower_s = demand
        .1
        .first()
        .and_then(|(from, _)| analysis::first_lowering_after(&samples, *from, end));
    // The within-request neighbour's contended phases (the batch demand,
    // or both services' bursts); without any, the whole run.
    let (contended_idx, contended) = match &sc.within {
        Some(wp) => (
            matrix::phase_indices(wp, matrix::CONTENDED),
            abs(matrix::phase_windows(wp, matrix::CONTENDED)),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let contended = if contended.is_empty() {
        vec![(t0, end)]
    } else {
        contended
    };
    let whole = [(t0, end)];
    let within_usage = |ws: &[(f64, f64)]| {
        analysis::usage_m(&samples, ws, |x| Some(x.within.usage_us)).unwrap_or(f64::NAN)
    };
    // `full` µs a second / 10 = % of wall.
    let full_pct = |ws: &[(f64, f64)], f: fn(&Sample) -> u64| {
        analysis::usage_m(&samples, ws, |x| Some(f(x))).map_or(f64::NAN, |ms| ms / 10.0)
    };
    let within_stall = analysis::stall(&samples, t0, end, |x| x.within_pressure);
    // The agent's lowerings of the services, each against the neighbours'
    // stalls before it.
    let mut lowerings_csv =
        String::from("t_s,old_m,new_m,why,span_s,within_full_ms,batch_full_ms,verdict,pod\n");
    let (mut svc_lowerings, mut false_lowerings, mut unjudged_lowerings) = (0, 0, 0);
    for r in resizes.iter().filter(|r| is_managed(r) && r.is_lowering()) {
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
            "{:.2},{},{},{},{},{},{},{verdict},{}",
            r.t - t0,
            r.old_m,
            r.new_m,
            agent_log::LowerWhy::of(&r.why).as_str(),
            check.span_s.map(|x| format!("{x:.2}")).unwrap_or_default(),
            full("within"),
            full("batch"),
            r.pod,
        );
    }
    if svc_lowerings > 0 {
        std::fs::write(s.out.join(format!("raw/{id}-lowerings.csv")), lowerings_csv)?;
    }
    // Patches of each service per burst window of its schedule.
    let mut per_burst = Vec::new();
    let mut max_patches_per_burst = 0;
    for (name, _) in &managed {
        let sched = if *name == SVC2 {
            sc.svc2.as_deref().unwrap_or(&sc.svc)
        } else {
            &sc.svc
        };
        let windows = abs(matrix::phase_windows(sched, "burst"));
        let (most, line) = patches_per_window(&resizes, name, &windows);
        max_patches_per_burst = max_patches_per_burst.max(most);
        per_burst.push(line);
    }
    // `flicker`: the patches of each service per episode of the
    // within-request neighbour's need (`matrix::episodes`: a need and the
    // pause after it).
    let episodes = match &sc.within {
        Some(wp) if sc.episodes => abs(matrix::episodes(wp, matrix::CONTENDED)),
        _ => Vec::new(),
    };
    let mut per_episode = Vec::new();
    let mut max_patches_per_episode = 0;
    if !episodes.is_empty() {
        for (name, _) in &managed {
            let (most, line) = patches_per_window(&resizes, name, &episodes);
            max_patches_per_episode = max_patches_per_episode.max(most);
            per_episode.push(line);
        }
    }
    // Every patch of a managed service, with the burst and the episode it
    // counts to (1-based; empty: none).
    let within_window = |ws: &[(f64, f64)], t: f64| {
        ws.iter()
            .position(|(a, b)| t >= *a && t < *b)
            .map(|i| (i + 1).to_string())
            .unwrap_or_default()
    };
    let mut patches_csv = String::from("t_s,pod,old_m,new_m,burst,episode\n");
    for r in resizes.iter().filter(|r| is_managed(r)) {
        let _ = writeln!(
            patches_csv,
            "{:.2},{},{},{},{},{}",
            r.t - t0,
            r.pod,
            r.old_m,
            r.new_m,
            within_window(&bursts, r.t),
            within_window(&episodes, r.t),
        );
    }
    if managed_patches > 0 {
        std::fs::write(s.out.join(format!("raw/{id}-patches.csv")), patches_csv)?;
    }
    let burst_p99 = phases_p99(Some(&svc), &matrix::phase_indices(&sc.svc, "burst"));
    // Timeline CSV of this run (relative to the schedule's start).
    let mut csv = String::from(
        "t_s,svc_rate,limit_m,usage_m,throttled_pct,within_m,within_full_pct,batch_m,batch_full_pct,node_util,svc2_limit_m,svc2_usage_m\n",
    );
    for r in analysis::timeline(&samples, t0) {
        let rate = rate_at(&sc.svc, r.t);
        let svc2_limit = match (svc2, r.svc2_limit_m) {
            (None, _) => String::new(),
            (Some(_), Some(m)) => m.to_string(),
            (Some(_), None) => "max".into(),
        };
        let svc2_usage = if r.svc2_usage_m.is_finite() {
            format!("{:.0}", r.svc2_usage_m)
        } else {
            String::new()
        };
        let _ = writeln!(
            csv,
            "{:.2},{rate},{},{:.0},{:.1},{:.0},{:.1},{:.0},{:.1},{:.3},{svc2_limit},{svc2_usage}",
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
    let summary_only = |v: Option<&Value>| {
        v.map_or(Value::Null, |v| {
            json!({"all": v["summary"]["all"], "phases": v["summary"]["phases"],
            "errors": v["summary"]["errors"], "unfinished": v["summary"]["unfinished"],
            "seconds_p99_ms": v["summary"]["seconds"].as_array().map(|a| a.iter().map(|x| x["p99_ms"].clone()).collect::<Vec<_>>())})
        })
    };
    std::fs::write(
        s.out.join(format!("raw/{id}-latency.json")),
        serde_json::to_string_pretty(&json!({
            "svc": summary_only(Some(&svc)), "svc2": summary_only(v2.as_ref()),
            "within": summary_only(w.as_ref()), "batch": summary_only(b.as_ref())
        }))?,
    )?;
    let max_limit_m = samples
        .iter()
        .filter(|x| x.t >= t0 && x.t <= end)
        .filter_map(analysis::limit_m)
        .max()
        .unwrap_or(0);
    let svc2_win = analysis::cpu_window(&samples, t0, end, |x| x.svc2.map(|m| m.container));
    Ok(RunRow {
        scenario: sc.name.to_string(),
        config: config.name().to_string(),
        agent: config.agent_mode().to_string(),
        rep,
        order,
        svc_p50_ms: p(Some(&svc), &["summary", "all", "p50_ms"]),
        svc_p99_ms: p(Some(&svc), &["summary", "all", "p99_ms"]),
        svc_p999_ms: p(Some(&svc), &["summary", "all", "p999_ms"]),
        svc_burst_p99_ms: burst_p99,
        svc_unfinished: svc["summary"]["unfinished"].as_u64().unwrap_or(0),
        svc_errors: svc["summary"]["errors"].as_u64().unwrap_or(0),
        throttled_ratio: win.throttled_ratio,
        throttled_s: win.throttled_s,
        pod_throttled_ratio: win.pod_throttled_ratio,
        pod_throttled_s: win.pod_throttled_s,
        cpu_bursts: win.bursts,
        svc_usage_m: win.usage_m,
        svc2_p50_ms: p(v2.as_ref(), &["summary", "all", "p50_ms"]),
        svc2_p99_ms: p(v2.as_ref(), &["summary", "all", "p99_ms"]),
        svc2_p999_ms: p(v2.as_ref(), &["summary", "all", "p999_ms"]),
        svc2_throttled_ratio: svc2_win.map_or(f64::NAN, |x| x.throttled_ratio),
        svc2_usage_m: svc2_win.map_or(f64::NAN, |x| x.usage_m),
        within_p99_ms: p(w.as_ref(), &["summary", "all", "p99_ms"]),
        within_contended_p99_ms: phases_p99(w.as_ref(), &contended_idx),
        within_usage_m: within_usage(&whole),
        within_contended_usage_m: within_usage(&contended),
        within_some_pct: within_stall.map_or(f64::NAN, |x| x.some_pct),
        within_full_pct: within_stall.map_or(f64::NAN, |x| x.full_pct),
        within_contended_full_pct: full_pct(&contended, |x| x.within_pressure.full_us),
        batch_demand_p99_ms: phases_p99(b.as_ref(), &demand.0),
        batch_demand_p50_ms: demand.0.first().map_or(f64::NAN, |i| {
            p(b.as_ref(), &["summary", "phases", &i.to_string(), "p50_ms"])
        }),
        batch_full_pct: full_pct(&whole, |x| x.batch_pressure.full_us),
        node_util: win.node_util,
        limit_changes: win.limit_changes,
        svc_lowerings,
        false_lowerings,
        unjudged_lowerings,
        lowerings_helped: checks.helped,
        lowerings_no_effect: checks.no_effect,
        lowerings_check_unjudged: checks.unjudged,
        lowerings_checked_other: checks.other,
        svc_patches: resizes.iter().filter(|r| r.of_pod(SVC)).count(),
        svc2_patches: resizes.iter().filter(|r| r.of_pod(SVC2)).count(),
        max_patches_per_burst,
        patches_per_burst: per_burst.join(";"),
        episodes: episodes.len(),
        max_patches_per_episode,
        patches_per_episode: per_episode.join(";"),
        yields: agent_log::yield_lines(&log).len(),
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
        koordlet_quota_writes: koordlet_writes
            .iter()
            .filter(|w| managed.iter().any(|(n, _)| w.of_pod(n)))
            .count(),
        koordlet_burst_us,
        koordlet_pod_burst_us,
        id,
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

/// What meta.json says of the run so far (`failed`: why the bench stopped).
#[expect(clippy::too_many_arguments, reason = "the run's facts")]
fn meta(
    s: &Settings,
    plan: &[matrix::Planned<Config>],
    rows: &[RunRow],
    node: &NodeVm,
    kernel: &str,
    boot_ready_s: Option<f64>,
    setup_s: f64,
    started: Instant,
    load_start: &str,
    failed: Option<&str>,
    koordlet: Option<&KoordletSetup>,
) -> Value {
    let (baseline, flagged) = summary::baseline_check(s.baseline.as_ref(), rows);
    let (runs, estimate_min) = s.estimate();
    json!({
        "seed": s.seed,
        "reps": s.reps,
        "matrix": s.matrix,
        "runs_planned": runs,
        "estimate_min": estimate_min,
        "order": plan.iter().map(|r| format!("{}-{}-r{}", s.scenarios[r.scenario].name, r.config.name(), r.rep)).collect::<Vec<_>>(),
        "configs": s.configs.iter().map(|c| c.name()).collect::<Vec<_>>(),
        "scenario_names": s.scenarios.iter().map(|sc| sc.name).collect::<Vec<_>>(),
        "scenarios": s.scenarios.iter().map(|sc| (sc.name.to_string(), json!({
            "about": sc.about,
            "parties": sc.parties(),
            // `flicker`: the episodes of the within-request neighbour's need,
            // [from, to) s from the schedule's start.
            "episodes": sc.within.as_deref().filter(|_| sc.episodes)
                .map(|w| matrix::episodes(w, matrix::CONTENDED)),
            "schedule": {
                "svc": phase_list(&sc.svc),
                "svc2": sc.svc2.as_deref().map(phase_list),
                "within": sc.within.as_deref().map(phase_list),
                "batch": sc.batch.as_deref().map(phase_list),
            },
        }))).collect::<serde_json::Map<_, _>>(),
        // The flags of each tuning candidate, for the table's labels.
        "tuned": s.configs.iter().filter_map(|c| match c {
            Config::Tuned(t) => Some((t.name.clone(), json!(t.args.join(" ")))),
            _ => None,
        }).collect::<serde_json::Map<_, _>>(),
        "burn_us": s.burn_us,
        "burst_us": s.burst_us,
        "request_m": REQUEST_M,
        "limit_m": LIMIT_M,
        "ceiling_m": CEILING_M,
        "within_request_m": WITHIN_REQUEST_M,
        "batch_request_m": BATCH_REQUEST_M,
        "bootstrap": {"resamples": stats::RESAMPLES, "seed": stats::SEED, "level": stats::LEVEL},
        "false_lowering": {"lookback_s": analysis::LOOKBACK_S, "displaced_share": analysis::DISPLACED_SHARE,
            "max_sample_gap_s": analysis::MAX_SAMPLE_GAP_S},
        "goal_thresholds": {
            "svc_p99_vs_static_max": summary::SVC_P99_VS_STATIC_MAX,
            "svc_p99_vs_nolimit_max": summary::SVC_P99_VS_NOLIMIT_MAX,
            "within_p99_vs_static_max": summary::WITHIN_P99_VS_STATIC_MAX,
            "within_usage_vs_static_min": summary::WITHIN_USAGE_VS_STATIC_MIN,
            "batch_p99_vs_nolimit_max": summary::BATCH_P99_VS_NOLIMIT_MAX,
            "no_effect_max": summary::NO_EFFECT_MAX,
            "patches_per_burst_max": summary::PATCHES_PER_BURST_MAX,
            "patches_per_episode_max": summary::PATCHES_PER_EPISODE_MAX,
            "false_lowerings_max": summary::FALSE_LOWERINGS_MAX,
            "dryrun_p99_tolerance": summary::DRYRUN_P99_TOLERANCE,
        },
        // The committed (a) service p99 of `mixed` and this run's; `flagged`
        // when this run's lies outside its range (not comparable).
        "baseline": baseline,
        "flagged": flagged,
        // Why the bench stopped without a result (a run that measured nothing).
        "failed": failed,
        // (k): koordlet's version, flags, NodeSLO and what the kernel said
        // to its default burst.
        "koordlet": koordlet,
        "node": {"name": node.name(), "cpus": node.spec.cpus, "driver": node.spec.driver.as_str(), "cgroup_root": node.spec.cgroup_root, "kernel": kernel.trim()},
        "boot_ready_s": boot_ready_s,
        "setup_s": setup_s,
        "total_s": started.elapsed().as_secs_f64(),
        "host_loadavg_start": load_start,
        "host_loadavg_end": loadavg(),
        "host_cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    })
}

async fn bench(s: Settings) -> anyhow::Result<()> {
    let started = Instant::now();
    let load_start = loadavg();
    std::fs::create_dir_all(s.out.join("raw"))?;
    let agent_bin = testkit::node_vm::static_agent_binary()?;
    // The systemd driver without a cgroupRoot (kubeadm's layout,
    // kubepods.slice at the root): koordlet's paths are fixed to it.
    let c = RealCluster::start(vec![NodeSpec {
        cgroup_root: None,
        ..NodeSpec::kind_like("node-systemd", 1)
    }])
    .await?;
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
    create(&svc_api, managed_pod(SVC, node.name())).await?;
    // Burstable, no CPU limit: its load stays at or below its request.
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
    let svc = wait_running(&svc_api, SVC).await?;
    let within = wait_running(&nb_api, "within").await?;
    let b = wait_running(&nb_api, "batch").await?;
    let mut pods = Pods {
        node,
        svc_api: svc_api.clone(),
        svc: target(node, &svc).await?,
        within: target(node, &within).await?,
        b: target(node, &b).await?,
        koordlet: None,
    };
    for t in [&pods.svc, &pods.within, &pods.b] {
        wait_answering(node, t).await?;
    }
    if s.configs.contains(&Config::Koordlet) || s.configs.contains(&Config::Coexist) {
        pods.koordlet = Some(install_koordlet(&c, node, &pods.svc).await?);
    }
    let pods = pods;
    let kernel = node.sh("uname -r").await.unwrap_or_default();
    let ready_at = started.elapsed();
    match &s.baseline {
        Some(b) => eprintln!(
            "benefit: baseline: (a) service p99 {:.0} ms of {} from {}",
            b.svc_p99_ms,
            matrix::BASELINE,
            b.from
        ),
        None => eprintln!("benefit: no committed baseline to check (a) against"),
    }
    let plan = matrix::plan(s.scenarios.len(), &s.configs, s.reps, s.seed);
    let (runs, estimate_min) = s.estimate();
    eprintln!(
        "benefit: node ready with pods after {ready_at:.0?}; seed {}; kernel {}; {runs} runs \
         ({} scenario(s) × {} configuration(s) × {} repetition(s)), ~{estimate_min:.0} min",
        s.seed,
        kernel.trim(),
        s.scenarios.len(),
        s.configs.len(),
        s.reps
    );
    let boot_ready_s = c.boot_times.first().map(|b| b.2.as_secs_f64());
    let parties: Vec<(&str, matrix::Parties)> = s
        .scenarios
        .iter()
        .map(|sc| (sc.name, sc.parties()))
        .collect();
    let write_meta = |rows: &[RunRow], failed: Option<&str>| -> anyhow::Result<()> {
        let m = meta(
            &s,
            &plan,
            rows,
            node,
            &kernel,
            boot_ready_s,
            ready_at.as_secs_f64(),
            started,
            &load_start,
            failed,
            pods.koordlet.as_ref(),
        );
        std::fs::write(
            s.out.join("meta.json"),
            serde_json::to_string_pretty(&m)? + "\n",
        )?;
        Ok(())
    };
    let mut rows = Vec::new();
    for (i, run) in plan.iter().enumerate() {
        let sc = &s.scenarios[run.scenario];
        let row = match run_one(&s, &pods, sc, run.config, run.rep, i + 1).await {
            Ok(row) => row,
            Err(e) => {
                let why = format!("{e:#}");
                write_meta(&rows, Some(&why))?;
                bail!("{why}\nbenefit: no table: meta.json records why (`failed`)");
            }
        };
        eprintln!(
            "benefit: {}: svc p50 {:.0} p99 {:.0} p99.9 {:.0} ms{}; throttled {:.1} % ({:.1} s); within p99 {:.0} ms, CPU {:.0}m contended, full {:.1} %; batch p99 {:.0} ms; node {:.0} %; limit changes {}; patches {}+{} (per burst {}{}); lowerings {} ({} false, {} unjudged; checked: {} helped, {} no effect); raise {:?}/{:?} s, lower {:?} s",
            row.id,
            row.svc_p50_ms,
            row.svc_p99_ms,
            row.svc_p999_ms,
            if row.svc2_p99_ms.is_finite() {
                format!(", svc2 p99 {:.0} ms", row.svc2_p99_ms)
            } else {
                String::new()
            },
            100.0 * row.throttled_ratio,
            row.throttled_s,
            row.within_p99_ms,
            row.within_contended_usage_m,
            row.within_full_pct,
            row.batch_demand_p99_ms,
            100.0 * row.node_util,
            row.limit_changes,
            row.svc_patches,
            row.svc2_patches,
            row.patches_per_burst,
            if row.episodes > 0 {
                format!(", per episode {}", row.patches_per_episode)
            } else {
                String::new()
            },
            row.svc_lowerings,
            row.false_lowerings,
            row.unjudged_lowerings,
            row.lowerings_helped,
            row.lowerings_no_effect,
            row.raise1_s,
            row.raise2_s,
            row.lower_s
        );
        rows.push(row);
        // Written after every run, so an interrupted run keeps what it had.
        std::fs::write(s.out.join("runs.csv"), summary::runs_csv(&rows)?)?;
        let summary = summary::summarise_matrix(&rows, &parties);
        std::fs::write(
            s.out.join("summary.json"),
            serde_json::to_string_pretty(&summary)? + "\n",
        )?;
        write_meta(&rows, None)?;
    }
    let summary = summary::summarise_matrix(&rows, &parties);
    eprintln!(
        "benefit: done in {:.0?}; goals met per scenario: {}",
        started.elapsed(),
        summary["goals_met"]
    );
    if let (baseline, true) = summary::baseline_check(s.baseline.as_ref(), &rows) {
        eprintln!(
            "benefit: WARNING: flagged: the static (a) service p99 median of {} lies outside \
             [0.5×, 2×] of the committed one ({baseline}); meta.json says so and the table \
             opens with a warning",
            matrix::BASELINE
        );
    }
    Ok(())
}

fn main() {
    testkit::node_vm::bench_main("benefit", Settings::from_env(), bench);
}
