//! `headroom-agent slack`: what Headroom sees on this node (or a fixture
//! tree), sampled twice `--interval` apart. Read-only; needs no cluster.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use headroom::cgroup::{self, CpuMax, NodeSnapshot};
use headroom::model::CgroupPodId;
use headroom::signal::usage::{self, CapacityInputs, NodeUsage, UsageBasis};
use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Root of the cgroup v2 hierarchy (a host mount or a fixture's `root/`).
    #[arg(long, default_value = "/sys/fs/cgroup", env = "HEADROOM_CGROUP_ROOT")]
    pub cgroup_root: PathBuf,
    /// The Node's allocatable CPU (e.g. `4000m`), an input to capacity.
    #[arg(long, value_parser = super::parse_allocatable, env = "HEADROOM_NODE_ALLOCATABLE")]
    pub node_allocatable: Option<u64>,
    /// Time between the two samples.
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    pub interval: Duration,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The node's pods as JSON (a PodList or one Pod): rows then name pods
    /// by namespace/name and mark the pause (sandbox) containers.
    #[arg(long, env = "HEADROOM_PODS_FILE")]
    pub pods: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let layout = cgroup::discover(&a.cgroup_root)?;
    tracing::debug!(kubepods = %layout.kubepods.display(), driver = ?layout.driver, "layout");
    let t0 = Instant::now();
    let at = || t0.elapsed().as_micros() as u64;
    let views = match &a.pods {
        Some(p) => super::plan::read_views(p)?,
        None => Vec::new(),
    };
    let mut prev = cgroup::scan(&a.cgroup_root, &layout, at()).context("first sample")?;
    std::thread::sleep(a.interval);
    let mut cur = cgroup::scan(&a.cgroup_root, &layout, at()).context("second sample")?;
    headroom::signal::mark_roles(&mut prev.pods, &views);
    headroom::signal::mark_roles(&mut cur.pods, &views);
    let names: foldhash::HashMap<&CgroupPodId, String> =
        views.iter().map(|v| (&v.cgroup_id, v.key())).collect();
    let pool = headroom::signal::shared_pool::read(&a.cgroup_root, &cur);
    let cap = CapacityInputs {
        node_allocatable_m: a.node_allocatable,
        online_cpus: usage::online_cpus_at(&a.cgroup_root),
        shared_pool_cpus: pool.as_ref().map(|p| p.cpus),
    };
    let s = usage::measure(&prev, &cur, cap);
    for e in &cur.issues {
        tracing::warn!("{e}");
    }
    if a.json {
        let mut v = report_json(&cur, &s);
        v["node"]["shared_pool"] = json!(pool);
        println!("{v}");
    } else {
        print!("{}", report_text(&cur, &s, &names));
        if let Some(p) = &pool {
            println!("{}", pool_line(p));
        }
    }
    // A tree the agent may not fully read gives an incomplete answer: say
    // so in the exit status too, not only in the text.
    Ok(if incomplete(&cur) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The shared CPU pool Burstable pods run on, one line (and one per skipped cpuset).
pub fn pool_line(p: &headroom::signal::shared_pool::SharedPool) -> String {
    let mut o = format!(
        "  shared CPU pool {} ({} CPUs; cpuset.cpus.effective of {} Burstable/BestEffort containers)",
        p.list, p.cpus, p.read
    );
    for s in &p.skipped {
        let _ = write!(o, "\n  skipped {}: {}", s.path.display(), s.why);
    }
    o
}

/// Whether pods may be missing or unread because of permissions.
pub fn incomplete(cur: &NodeSnapshot) -> bool {
    !cur.unlisted_qos.is_empty()
        || cur
            .issues
            .iter()
            .any(cgroup::CgroupError::is_permission_denied)
}

fn usage_source(s: &NodeUsage) -> &'static str {
    match s.usage_basis {
        UsageBasis::Kubepods => "kubepods cpu.stat",
        UsageBasis::PodSum => {
            "sum of pods: kubepods usage_usec went backwards (counter reset seen)"
        }
        UsageBasis::None => "none: the samples are not ordered in time",
    }
}

fn max_m(m: &Result<CpuMax, cgroup::CgroupError>) -> Option<u64> {
    m.as_ref().ok().and_then(CpuMax::millicores)
}

/// One JSON object: `node` summary and `pods`, in the snapshot's order.
pub fn report_json(cur: &NodeSnapshot, s: &NodeUsage) -> Value {
    let pods: Vec<Value> = cur
        .pods
        .iter()
        .zip(&s.pods)
        .map(|(p, u)| {
            let containers: Vec<Value> = p
                .containers
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "runtime": c.runtime,
                        "role": c.role,
                        "cgroup": c.path,
                        "cpu_max_millicores": max_m(&c.cpu_max),
                        "cpu_max_period_us": c.cpu_max.as_ref().ok().map(|m| m.period_us),
                        "error": c.cpu_max.as_ref().err().map(|e| e.to_string()),
                    })
                })
                .collect();
            let smp = p.sample.as_ref().ok();
            json!({
                "pod_id": p.id,
                // Its old name, for one release (docs/operations.md).
                "uid": p.id,
                "qos": p.qos,
                "cgroup": &*p.path,
                "cpu_max_millicores": smp.and_then(|x| x.cpu_max.millicores()),
                "cpu_max_period_us": smp.map(|x| x.cpu_max.period_us),
                "cpu_weight": smp.and_then(|x| x.weight),
                "usage_millicores": u.usage_m,
                "throttled_ratio": u.throttled_ratio,
                "containers": containers,
                "error": p.sample.as_ref().err().map(|e| e.to_string()),
            })
        })
        .collect();
    json!({
        "node": {
            "capacity_millicores": s.capacity_m,
            "capacity_source": s.capacity_source,
            "usage_millicores": s.usage_m,
            "usage_basis": s.usage_basis,
            "usage_source": usage_source(s),
            "idle_millicores": s.idle_m,
            // The name before 0.2, kept one release (it is idle CPU, not
            // the policy's slack).
            "slack_millicores": s.idle_m,
            "pressure_some_avg10": s.pressure_some_avg10,
            "pressure_full_avg10": s.pressure_full_avg10,
            "stall": s.stall,
            "kubepods_cpu_max_millicores": cur.kubepods.cpu_max.millicores(),
            "interval_us": s.interval_us,
            "driver": cur.layout.driver,
            "kubepods": cur.layout.kubepods,
        },
        "pods": pods,
        "vanished": s.vanished,
        "unlisted_qos": cur.unlisted_qos,
        "issues": cur.issues.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        "incomplete": incomplete(cur),
    })
}

fn fmt_m(m: Option<u64>) -> String {
    m.map_or_else(|| "unlimited".into(), |m| format!("{m}m"))
}

fn fmt_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// Node summary line, then one row per pod and its containers.
/// `names`: namespace/name by pod uid (empty without `--pods`: rows by uid).
#[expect(
    clippy::too_many_lines,
    reason = "one table: the node line, then a row per pod and container"
)]
pub fn report_text(
    cur: &NodeSnapshot,
    s: &NodeUsage,
    names: &foldhash::HashMap<&CgroupPodId, String>,
) -> String {
    let mut o = String::new();
    let psi = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    let _ = writeln!(
        o,
        "node: kubepods {} ({:?} driver), cpu.max {}",
        cur.layout.kubepods.display(),
        cur.layout.driver,
        fmt_m(cur.kubepods.cpu_max.millicores()),
    );
    let _ = writeln!(
        o,
        "  capacity {}m ({})  usage {}m  slack {}m  pressure some/full avg10 {}/{}  over {:.2}s, {} pods",
        s.capacity_m,
        super::plan::capacity_source(s.capacity_source),
        s.usage_m,
        s.idle_m,
        psi(s.pressure_some_avg10),
        psi(s.pressure_full_avg10),
        s.interval_us as f64 / 1e6,
        cur.pods.len(),
    );
    if let Some(st) = &s.stall {
        let _ = writeln!(
            o,
            "  cpu stall over the interval {:.1}%: own CFS throttling {:.1}%, contention {:.1}%",
            st.some_pct, st.throttling_pct, st.queued_pct
        );
    }
    let _ = writeln!(o, "  usage source: {}", usage_source(s));
    for q in &cur.unlisted_qos {
        let _ = writeln!(
            o,
            "  {} pods: NOT LISTED (directory unreadable): pod count and usage rows are incomplete",
            q.as_str()
        );
    }
    if !cur.issues.is_empty() {
        let denied = cur
            .issues
            .iter()
            .filter(|e| e.is_permission_denied())
            .count();
        let _ = writeln!(
            o,
            "  read errors: {} ({denied} permission denied)",
            cur.issues.len()
        );
        for e in &cur.issues {
            let _ = writeln!(o, "    {e}");
        }
    }
    let _ = writeln!(
        o,
        "\n{:<36}  {:<10}  {:>10}  {:>7}  {:>9}  containers (runtime:id=cpu.max)",
        if names.is_empty() { "UID" } else { "POD" },
        "QOS",
        "CPU.MAX",
        "USAGE",
        "THROTTLED"
    );
    for (p, u) in cur.pods.iter().zip(&s.pods) {
        let cpu_max = match &p.sample {
            Ok(x) => fmt_m(x.cpu_max.millicores()),
            Err(_) => "error".into(),
        };
        let containers: Vec<String> = p
            .containers
            .iter()
            .map(|c| {
                let id = c.id.get(..12).unwrap_or(&c.id);
                let rt = serde_json::to_value(c.runtime)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let m = match &c.cpu_max {
                    Ok(m) => fmt_m(m.millicores()),
                    Err(_) => "error".into(),
                };
                let conmon = match c.role {
                    cgroup::ContainerRole::Conmon => "(conmon)",
                    cgroup::ContainerRole::Sandbox => "(pause)",
                    _ => "",
                };
                format!("{rt}:{id}{conmon}={m}")
            })
            .collect();
        let _ = writeln!(
            o,
            "{:<36}  {:<10}  {:>10}  {:>7}  {:>9}  {}",
            names.get(&p.id).map_or(p.id.as_str(), String::as_str),
            p.qos.as_str(),
            cpu_max,
            fmt_opt(u.usage_m.map(|m| format!("{m}m"))),
            fmt_opt(u.throttled_ratio.map(|r| format!("{:.1}%", r * 100.0))),
            containers.join(", "),
        );
        if let Err(e) = &p.sample {
            let _ = writeln!(o, "  error: {e}");
        }
        for c in &p.containers {
            if let Err(e) = &c.cpu_max {
                let _ = writeln!(o, "  container {}: {e}", c.id);
            }
        }
    }
    o
}
