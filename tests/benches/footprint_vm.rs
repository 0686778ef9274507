//! The agent's own CPU on a real node (issue 40), against a floor in the same
//! VM, as a ratio: the node VMs run under QEMU software emulation, which
//! inflates every absolute figure, so only the ratio to a floor measured on
//! the same node in the same run says anything.
//!
//! One node VM (real kubelet v1.37, containerd, runc, Linux with cgroup v2;
//! the control plane on the host), `FOOTPRINT_VM_PODS` Burstable pods the
//! agent manages (namespace opted in; `sleep` in the locally built busybox
//! image, `hostNetwork` so no pod sandbox needs a network namespace; request
//! 10m, limit 40m = the default ceiling, so an idle node needs no resize),
//! beside 2 Guaranteed and 2 BestEffort pods it must leave alone. Then, in
//! `FOOTPRINT_VM_REPS` repetitions, each in an order shuffled from
//! `FOOTPRINT_VM_SEED`, one at a time, never two together:
//!
//! - `agent`: `FOOTPRINT_AGENT` (default: scripts/static-build.sh's binary),
//!   `headroom-agent run` as a unit in the guest with the real-node tier's
//!   arguments (`FOOTPRINT_VM_AGENT_ARGS` replaces them), started afresh,
//!   converged (its `headroom_resizes_total{result="applied"}` unchanged for
//!   20 s and every managed pod counted managed), then measured;
//! - `baseline`: the same with `FOOTPRINT_BASELINE`, when set;
//! - a variant, when `FOOTPRINT_VM_VARIANT=name=--flag value …` is set:
//!   `FOOTPRINT_AGENT` with those flags set over the others (e.g.
//!   `audit30=--audit-interval 30s`, the agent's default audit);
//! - `floor-kept`: tests/tools/footprint-floor: the files a calm tick reads
//!   (kubepods' `cpu.stat` and `cpu.pressure`, each managed pod's `cpu.stat`,
//!   found by the floor in the guest's tree) once a second, each kept open and
//!   re-read with one `pread` at offset 0;
//! - `floor-open`: the same files opened, `fstat`ed, read once and closed
//!   every second.
//!
//! Each is measured over `FOOTPRINT_VM_WINDOW_S` (60) from the guest's
//! `/proc/<pid>`: CPU (`stat` utime + stime, all threads; the guest counts
//! in 10 ms ticks), read syscalls (`io` `syscr`), RSS (`status` `VmRSS`);
//! and the guest's CPUs busy over the window and its load average. No scrape
//! of the agent during the window. The table gives medians and min–max over
//! the repetitions, and the ratios of the agents' medians to the floors'.
//!
//! Environment (all optional): `FOOTPRINT_VM_PODS` (50; at most 106: the
//! kubelet's maxPods is 110), `FOOTPRINT_VM_WINDOW_S` (60), `FOOTPRINT_VM_REPS`
//! (3), `FOOTPRINT_VM_SEED`, `FOOTPRINT_VM_DRIVER` (`systemd`: node-systemd,
//! Debian trixie, Linux 6.12, `/kubelet` cgroupRoot; or `cgroupfs`:
//! node-cgroupfs, bookworm, Linux 6.1), `FOOTPRINT_AGENT`, `FOOTPRINT_BASELINE`,
//! `FOOTPRINT_VM_AGENT_ARGS` (space-separated), `FOOTPRINT_VM_VARIANT`, and the real-node tier's
//! (`HEADROOM_CACHE_DIR`, …).
//!
//! Run: `cargo bench -p headroom-tests --features real-nodes --bench footprint_vm`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};
use testkit::agent::metric;
use testkit::node_vm::footprint::{FloorMode, ProcSample, build_floor};
use testkit::node_vm::{CgroupDriver, GuestAgent, NodeSpec, NodeVm, RealCluster, Suite};

const BUSYBOX: &str = "headroom.local/busybox:1";
/// The kubelet's `maxPods` on the VM nodes, less the 4 unmanaged pods.
const MAX_MANAGED: usize = 106;
/// Converged: no applied resize for this long.
const QUIET: Duration = Duration::from_secs(20);
/// A started agent that has not converged by then is measured anyway (said).
const CONVERGE_BOUND: Duration = Duration::from_secs(600);
/// Pods not all Running by then fail the bench.
const POD_START: Duration = Duration::from_secs(2400);

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> anyhow::Result<T> {
    match std::env::var(k) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{k}={v:?}: not a valid value")),
        _ => Ok(d),
    }
}

/// The real-node tier's agent arguments (tests/tests/real_node.rs `vm_agent_args`).
const VM_AGENT_ARGS: &str = "--tick 1s --raise-cooldown 5s --audit-interval 5s \
                             --drift-grace 180s --event-interval 5s";

#[derive(Clone, Debug)]
enum What {
    Agent {
        name: &'static str,
        bin: PathBuf,
        args: Vec<String>,
    },
    Floor(FloorMode),
}

impl What {
    fn name(&self) -> &'static str {
        match self {
            What::Agent { name, .. } => name,
            What::Floor(FloorMode::Kept) => "floor-kept",
            What::Floor(FloorMode::Open) => "floor-open",
        }
    }
}

struct Settings {
    pods: usize,
    window: Duration,
    reps: usize,
    seed: u64,
    driver: CgroupDriver,
    agent_args: Vec<String>,
    whats: Vec<What>,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let pods: usize = env_or("FOOTPRINT_VM_PODS", 50)?;
        anyhow::ensure!(
            (1..=MAX_MANAGED).contains(&pods),
            "FOOTPRINT_VM_PODS={pods}: 1 to {MAX_MANAGED} (the kubelet's maxPods is 110, 4 pods are unmanaged)"
        );
        let driver = match env_or("FOOTPRINT_VM_DRIVER", "systemd".to_string())?.as_str() {
            "systemd" => CgroupDriver::Systemd,
            "cgroupfs" => CgroupDriver::Cgroupfs,
            d => bail!("FOOTPRINT_VM_DRIVER={d:?}: systemd or cgroupfs"),
        };
        let seed = match std::env::var("FOOTPRINT_VM_SEED") {
            Ok(s) => s.parse().context("FOOTPRINT_VM_SEED")?,
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs(),
        };
        let agent = match std::env::var("FOOTPRINT_AGENT") {
            Ok(p) if !p.is_empty() => PathBuf::from(p),
            _ => testkit::node_vm::static_agent_binary()?,
        };
        let args: Vec<String> = env_or("FOOTPRINT_VM_AGENT_ARGS", VM_AGENT_ARGS.to_string())?
            .split_whitespace()
            .map(String::from)
            .collect();
        let mut whats = vec![What::Agent {
            name: "agent",
            bin: agent.clone(),
            args: args.clone(),
        }];
        if let Ok(p) = std::env::var("FOOTPRINT_BASELINE")
            && !p.is_empty()
        {
            whats.push(What::Agent {
                name: "baseline",
                bin: PathBuf::from(p),
                args: args.clone(),
            });
        }
        if let Ok(v) = std::env::var("FOOTPRINT_VM_VARIANT")
            && !v.trim().is_empty()
        {
            let (name, flags) = v
                .split_once('=')
                .context("FOOTPRINT_VM_VARIANT: not name=--flag value …")?;
            whats.push(What::Agent {
                name: Box::leak(name.trim().to_string().into_boxed_str()),
                bin: agent,
                args: override_flags(&args, flags)?,
            });
        }
        for w in &whats {
            if let What::Agent { name, bin, .. } = w {
                anyhow::ensure!(bin.is_file(), "{name} binary {} missing", bin.display());
            }
        }
        whats.push(What::Floor(FloorMode::Kept));
        whats.push(What::Floor(FloorMode::Open));
        Ok(Settings {
            pods,
            window: Duration::from_secs(env_or("FOOTPRINT_VM_WINDOW_S", 60)?),
            reps: env_or("FOOTPRINT_VM_REPS", 3)?,
            seed,
            driver,
            agent_args: args,
            whats,
        })
    }

    fn spec(&self) -> NodeSpec {
        let spec = match self.driver {
            CgroupDriver::Systemd => {
                NodeSpec::kind_like("node-systemd", 1).with_suite(Suite::Trixie)
            }
            CgroupDriver::Cgroupfs => {
                NodeSpec::cgroupfs("node-cgroupfs", 2).with_suite(Suite::Bookworm)
            }
        };
        // A containerd shim and two processes a pod: room beyond the tier's 2.5 GiB.
        NodeSpec {
            memory_mib: 2560.max(1536 + 24 * (self.pods as u32 + 4)),
            ..spec
        }
    }
}

/// `base` (`--flag value` pairs) with each flag of `flags` set to its value
/// there (clap refuses a flag given twice), or added.
fn override_flags(base: &[String], flags: &str) -> anyhow::Result<Vec<String>> {
    let mut out = base.to_vec();
    let f: Vec<&str> = flags.split_whitespace().collect();
    anyhow::ensure!(
        f.len().is_multiple_of(2) && !f.is_empty(),
        "FOOTPRINT_VM_VARIANT: {flags:?} is not `--flag value` pairs"
    );
    for pair in f.chunks(2) {
        match out.iter().position(|a| a == pair[0]) {
            Some(i) if i + 1 < out.len() => out[i + 1] = pair[1].to_string(),
            _ => out.extend([pair[0].to_string(), pair[1].to_string()]),
        }
    }
    Ok(out)
}

/// xorshift64*: the repetitions' order, reproducible from the printed seed.
fn shuffle<T>(v: &mut [T], state: &mut u64) {
    for i in (1..v.len()).rev() {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        v.swap(i, (r % (i as u64 + 1)) as usize);
    }
}

fn pod(name: &str, node: &str, resources: Value) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": false, "hostNetwork": true,
                    "containers": [{"name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                                    "command": ["/bin/sleep", "1000000"],
                                    "resources": resources}]}})
}

/// The managed pods (`m-NNN`) and the four the agent must leave alone.
fn pod_bodies(n: usize, node: &str) -> Vec<Value> {
    let mut out: Vec<Value> = (0..n)
        .map(|i| {
            pod(
                &format!("m-{i:03}"),
                node,
                json!({"requests": {"cpu": "10m"}, "limits": {"cpu": "40m"}}),
            )
        })
        .collect();
    for i in 0..2 {
        let g = json!({"cpu": "20m", "memory": "16Mi"});
        out.push(pod(
            &format!("guaranteed-{i}"),
            node,
            json!({"requests": g, "limits": g}),
        ));
        out.push(pod(&format!("besteffort-{i}"), node, json!({})));
    }
    out
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits until every pod of `api` runs; prints progress each minute; fails
/// when none started for 10 minutes or all are not up by [`POD_START`].
async fn wait_all_running(api: &Api<Pod>, node: &NodeVm, total: usize) -> anyhow::Result<()> {
    let start = Instant::now();
    let (mut best, mut progress_at, mut said) = (0, Instant::now(), Instant::now());
    loop {
        let pods = api.list(&ListParams::default()).await?.items;
        let up = pods.iter().filter(|p| running(p)).count();
        if up == total {
            return Ok(());
        }
        if up > best {
            (best, progress_at) = (up, Instant::now());
        }
        if said.elapsed() >= Duration::from_secs(60) {
            eprintln!(
                "footprint-vm: {up}/{total} pods Running after {:.0?}",
                start.elapsed()
            );
            said = Instant::now();
        }
        if progress_at.elapsed() > Duration::from_secs(600) || start.elapsed() > POD_START {
            bail!(
                "{up}/{total} pods Running after {:.0?} (none more for {:.0?})\n{}",
                start.elapsed(),
                progress_at.elapsed(),
                node.diagnose()
            );
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// One measured window of one process.
#[derive(Clone, Debug)]
struct Run {
    what: &'static str,
    rep: usize,
    millicores: f64,
    reads_per_s: f64,
    rss_mib: f64,
    fds: u64,
    threads: u64,
    guest_busy_pct: f64,
    guest_load: String,
    host_load: String,
    /// Agent: start → converged, and patches applied meanwhile / in the window.
    converge_s: Option<f64>,
    patches: Option<(f64, f64)>,
    /// Floor: its own line (files a tick).
    note: String,
}

fn host_load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn applied(s: &prometheus_parse::Scrape) -> f64 {
    metric(s, "headroom_resizes_total", &[("result", "applied")]).unwrap_or(0.0)
}

/// Samples `pid` over the window; the CPU, reads and RSS of a [`Run`].
async fn window(
    node: &NodeVm,
    pid: u32,
    window: Duration,
) -> anyhow::Result<(ProcSample, ProcSample)> {
    let a = node.proc_sample(pid).await?;
    tokio::time::sleep(window).await;
    let b = node.proc_sample(pid).await?;
    Ok((a, b))
}

fn run_of(what: &'static str, rep: usize, (a, b): (ProcSample, ProcSample), note: String) -> Run {
    Run {
        what,
        rep,
        millicores: a.millicores_to(&b),
        reads_per_s: a.reads_per_s_to(&b),
        rss_mib: b.rss_kib as f64 / 1024.0,
        fds: b.fds,
        threads: b.threads,
        guest_busy_pct: a.guest_busy_pct_to(&b),
        guest_load: b.loadavg,
        host_load: host_load(),
        converge_s: None,
        patches: None,
        note,
    }
}

async fn measure_agent(
    s: &Settings,
    node: &NodeVm,
    name: &'static str,
    bin: &std::path::Path,
    args: &[String],
    rep: usize,
) -> anyhow::Result<Run> {
    node.install_agent(bin)?;
    let started = Instant::now();
    let agent = GuestAgent::start(node, args).await?;
    let res = async {
        let pid = node.unit_pid(agent.unit().context("agent unit")?).await?;
        let first = applied(&agent.scrape().await?);
        let (mut last, mut last_change) = (first, Instant::now());
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let m = agent.scrape().await?;
            let a = applied(&m);
            if a != last {
                (last, last_change) = (a, Instant::now());
            }
            let managed = metric(&m, "headroom_pods", &[("state", "managed")]).unwrap_or(0.0);
            if last_change.elapsed() >= QUIET && managed as usize == s.pods {
                break;
            }
            if started.elapsed() > CONVERGE_BOUND {
                eprintln!(
                    "footprint-vm: WARNING: {name} not converged after {CONVERGE_BOUND:?} \
                     ({managed} pods managed, last patch {:.0?} ago); measuring anyway",
                    last_change.elapsed()
                );
                break;
            }
        }
        let converge_s = started.elapsed().as_secs_f64();
        let samples = window(node, pid, s.window).await?;
        let end = applied(&agent.scrape().await?);
        let mut run = run_of(name, rep, samples, bin.display().to_string());
        run.converge_s = Some(converge_s);
        run.patches = Some((last - first, end - last));
        anyhow::Ok(run)
    }
    .await;
    let res = match res {
        Ok(r) => Ok(r),
        Err(e) => Err(e.context(format!("{name}:\n{}", agent.log_tail(30).await))),
    };
    agent.stop().await?;
    res
}

async fn measure_floor(
    s: &Settings,
    node: &NodeVm,
    mode: FloorMode,
    name: &'static str,
    rep: usize,
) -> anyhow::Result<Run> {
    let (pid, line) = node.start_floor(mode, &node.spec.kubepods_path()).await?;
    let samples = window(node, pid, s.window).await;
    node.stop_floor().await?;
    Ok(run_of(name, rep, samples?, line))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Summary {
    what: &'static str,
    m: f64,
    lo: f64,
    hi: f64,
    reads: f64,
    rss: f64,
    busy: f64,
}

fn summarise(runs: &[Run], what: &'static str) -> Option<Summary> {
    let of: Vec<&Run> = runs.iter().filter(|r| r.what == what).collect();
    if of.is_empty() {
        return None;
    }
    let col = |f: fn(&Run) -> f64| of.iter().map(|r| f(r)).collect::<Vec<f64>>();
    let mut m = col(|r| r.millicores);
    let med = median(&mut m);
    Some(Summary {
        what,
        m: med,
        lo: m[0],
        hi: m[m.len() - 1],
        reads: median(&mut col(|r| r.reads_per_s)),
        rss: median(&mut col(|r| r.rss_mib)),
        busy: median(&mut col(|r| r.guest_busy_pct)),
    })
}

fn print_table(s: &Settings, runs: &[Run], head: &str) {
    println!("\n{head}");
    println!("\nper run (in the order run):");
    println!(
        "  {:<10} {:>3} {:>9} {:>8} {:>8} {:>4} {:>3} {:>7} {:>16} {:>16} {:>9} {:>9}  note",
        "what",
        "rep",
        "CPU m",
        "reads/s",
        "RSS MiB",
        "fds",
        "thr",
        "guest%",
        "guest load",
        "host load",
        "conv s",
        "patches"
    );
    for r in runs {
        println!(
            "  {:<10} {:>3} {:>9.2} {:>8.1} {:>8.1} {:>4} {:>3} {:>7.1} {:>16} {:>16} {:>9} {:>9}  {}",
            r.what,
            r.rep + 1,
            r.millicores,
            r.reads_per_s,
            r.rss_mib,
            r.fds,
            r.threads,
            r.guest_busy_pct,
            r.guest_load,
            r.host_load,
            r.converge_s.map(|c| format!("{c:.0}")).unwrap_or_default(),
            r.patches
                .map(|(c, w)| format!("{c:.0}+{w:.0}"))
                .unwrap_or_default(),
            r.note
        );
    }
    let sums: Vec<Summary> = s
        .whats
        .iter()
        .filter_map(|w| summarise(runs, w.name()))
        .collect();
    let floor = |n: &str| sums.iter().find(|x| x.what == n).map(|x| x.m);
    let (kept, open) = (floor("floor-kept"), floor("floor-open"));
    let ratio = |m: f64, f: Option<f64>| match f {
        Some(f) if f > 0.0 => format!("{:.2}×", m / f),
        _ => "-".into(),
    };
    println!(
        "\n| pods | what | CPU m, median (min–max) | ÷ floor-kept | ÷ floor-open | read syscalls/s | RSS MiB | guest CPUs busy % |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for x in &sums {
        println!(
            "| {} | {} | {:.2} ({:.2}–{:.2}) | {} | {} | {:.0} | {:.1} | {:.1} |",
            s.pods,
            x.what,
            x.m,
            x.lo,
            x.hi,
            ratio(x.m, kept),
            ratio(x.m, open),
            x.reads,
            x.rss,
            x.busy
        );
    }
}

async fn cleanup(c: &RealCluster, ns: &str) {
    let node = &c.nodes[0];
    let _ = GuestAgent::stop_any(node).await;
    let _ = node.stop_floor().await;
    let api: Api<Pod> = Api::namespaced(c.cp.client().await, ns);
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let _ = api.delete_collection(&force, &ListParams::default()).await;
    eprintln!("footprint-vm: pods of {ns} deleted; the VM goes down with the bench");
}

async fn bench(s: Settings) -> anyhow::Result<()> {
    let started = Instant::now();
    let floor_bin = build_floor()?;
    let others = std::process::Command::new("pgrep")
        .args(["-c", "qemu-system"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    eprintln!(
        "footprint-vm: {} managed pods, window {:?}, {} reps, seed {}, host load {}, qemu already running: {}",
        s.pods,
        s.window,
        s.reps,
        s.seed,
        host_load(),
        others
    );
    let c = RealCluster::start(vec![s.spec()]).await?;
    let booted = started.elapsed();
    let node = &c.nodes[0];
    let client = c.cp.client().await;
    let ns = c.cp.try_namespace("footprint-vm").await?;
    let res = measure(&s, node, &client, &ns, &floor_bin, booted, started).await;
    cleanup(&c, &ns).await;
    res
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    s: &Settings,
    node: &NodeVm,
    client: &kube::Client,
    ns: &str,
    floor_bin: &std::path::Path,
    booted: Duration,
    started: Instant,
) -> anyhow::Result<()> {
    let versions = node.versions().await?;
    testkit::workload::opt_in(client, ns).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let t = Instant::now();
    let total = s.pods + 4;
    testkit::workload::create_all(&api, pod_bodies(s.pods, node.name())).await?;
    wait_all_running(&api, node, total).await?;
    let created = t.elapsed();
    eprintln!(
        "footprint-vm: {total} pods Running {created:.0?} after creation ({:.1} s a pod)",
        created.as_secs_f64() / total as f64
    );
    let uids: Vec<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("m-"))
        })
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    node.install_floor(floor_bin, &uids)?;
    let mut order_state = s.seed | 1;
    let mut runs = Vec::new();
    let t_measure = Instant::now();
    for rep in 0..s.reps {
        let mut order = s.whats.clone();
        shuffle(&mut order, &mut order_state);
        for w in order {
            let run = match &w {
                What::Agent { name, bin, args } => {
                    measure_agent(s, node, name, bin, args, rep).await?
                }
                What::Floor(mode) => measure_floor(s, node, *mode, w.name(), rep).await?,
            };
            eprintln!(
                "footprint-vm: rep {} {}: {:.2} m, {:.1} reads/s, RSS {:.1} MiB, guest busy {:.1} % (load {}), host load {}",
                rep + 1,
                run.what,
                run.millicores,
                run.reads_per_s,
                run.rss_mib,
                run.guest_busy_pct,
                run.guest_load,
                run.host_load
            );
            runs.push(run);
        }
    }
    let variants: String = s
        .whats
        .iter()
        .filter_map(|w| match w {
            What::Agent { name, args, .. } if *args != s.agent_args => {
                Some(format!("; {name}: args `{}`", args.join(" ")))
            }
            _ => None,
        })
        .collect();
    let head = format!(
        "footprint-vm: node {} ({} driver, kubepods {}; {}; {} vCPUs, {} MiB, QEMU TCG), \
         {} managed pods + 2 Guaranteed + 2 BestEffort, window {:?}, {} reps, seed {}, agent args `{}`{variants}\n\
         cold boot to Ready {:.0?}; {} pods Running {:.0?} after creation; measuring {:.0?}; total {:.0?}",
        node.name(),
        node.spec.driver.as_str(),
        node.spec.kubepods_path(),
        versions,
        node.spec.cpus,
        node.spec.memory_mib,
        s.pods,
        s.window,
        s.reps,
        s.seed,
        s.agent_args.join(" "),
        booted,
        total,
        created,
        t_measure.elapsed(),
        started.elapsed()
    );
    print_table(s, &runs, &head);
    Ok(())
}

fn main() {
    testkit::node_vm::bench_main("footprint-vm", Settings::from_env(), bench);
}
