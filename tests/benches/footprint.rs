//! Footprint (issue 5) and reaction latency (issue 4) of the SHIPPED agent
//! (the image's static musl binary, `scripts/static-build.sh`)
//! against a real kube-apiserver and a simulated kubelet. A benchmark that
//! prints figures; it asserts nothing about time.
//!
//! Run: `cargo bench -p headroom-tests --bench footprint`
//!
//! The soak (issue 12) runs only when asked for:
//! `FOOTPRINT_PARTS=soak cargo bench -p headroom-tests --bench footprint`.
//! 250 pods with churn (pods deleted and replaced under new names, demands
//! redrawn) for `SOAK_MINUTES`; every 30 s a row of the agent's RSS, open
//! fds, threads, inotify watches and metric series; then whether per-pod
//! series outlive their pods (an error if they do), and the series count
//! once all pods but a few are deleted.
//!
//! Environment (all optional): `FOOTPRINT_AGENT` = the agent binary to
//! measure (default: the shipped one, built), `FOOTPRINT_PARTS` = `footprint,latency` (which
//! parts to run; also `soak`), `FOOTPRINT_WINDOW_S` = sampling window (60),
//! `LATENCY_REPS` = repetitions per tick setting (5), `SOAK_MINUTES` = churn
//! duration of the soak (15).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testkit::agent::{
    AgentOptions, AgentProcess, fast_args_with, inotify_watches, metric, open_fds, parse_metrics,
    pod_series, series_count, shipped_agent_binary,
};
use testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use testkit::kubelet_sim::{SimConfig, SimKubelet};
use testkit::workload::{
    Churn, FOOTPRINT_MIX, Kind, Spec, container, create_all, mix, opt_in, pod, pod_names, res,
    wait_running,
};

const CMD: &str = "cargo bench -p headroom-tests --bench footprint";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Parts run by default; `soak` (15 minutes and more) only when asked.
const DEFAULT_PARTS: &str = "footprint,latency";

fn part_enabled(part: &str) -> bool {
    std::env::var("FOOTPRINT_PARTS")
        .unwrap_or_else(|_| DEFAULT_PARTS.to_string())
        .split(',')
        .any(|p| p.trim() == part)
}

/// Filesystems the footprint part measures on (`FOOTPRINT_FS`, default
/// both): `tmpfs`, the simulated tree alone (every file open + read + close:
/// handles cannot be kept on files replaced by rename), and `cgroup2`, the
/// same tree with each cgroup's `cpu.stat` and `cpu.pressure` the kernel's
/// (`KernelCounters`), so the agent keeps them open and re-reads them with
/// `pread`, as on a node.
fn filesystems() -> Vec<String> {
    std::env::var("FOOTPRINT_FS")
        .unwrap_or_else(|_| "tmpfs,cgroup2".into())
        .split(',')
        .map(|f| f.trim().to_string())
        .filter(|f| !f.is_empty())
        .collect()
}

/// Where the bench makes its real cgroups: a cgroup2 mount it may write.
const CGROUP2_BASES: [&str; 2] = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];

fn cgroup2_base() -> Option<PathBuf> {
    CGROUP2_BASES
        .iter()
        .map(PathBuf::from)
        .find(|p| headroom::cgroup::read::is_cgroup2(p))
}

/// Before any thread: a mount namespace of the bench's own (mounts private,
/// so the bind mounts of `KernelCounters` never reach the host and go with
/// the bench's processes, whatever ends them), and the cgroups of earlier
/// benches that did not end cleanly removed.
fn private_mounts() -> anyhow::Result<()> {
    // SAFETY: no other thread runs yet; plain syscalls with static arguments.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            bail!("unshare(CLONE_NEWNS): {}", std::io::Error::last_os_error());
        }
        if libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            bail!("making / private: {}", std::io::Error::last_os_error());
        }
    }
    if let Some(base) = cgroup2_base()
        && let Ok(rd) = std::fs::read_dir(&base)
    {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix("headroom-footprint-") else {
                continue;
            };
            let pid = pid.split('-').next().unwrap_or("");
            if !Path::new("/proc").join(pid).exists() {
                println!("removing a stale bench cgroup tree: {}", e.path().display());
                testkit::kubelet_sim::cgroup_writer::rmdir_tree(&e.path());
            }
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if part_enabled("footprint") && filesystems().iter().any(|f| f == "cgroup2") {
        private_mounts()?;
    }
    // The simulated cgroup trees (and the simulator's staging area beside
    // them: the same filesystem, so counters are replaced by rename without
    // an inotify event in the tree, as on cgroupfs) live in memory, as
    // cgroupfs does, not on a disk shared with builds.
    if std::env::var_os("TMPDIR").is_none() && Path::new("/dev/shm").is_dir() {
        // SAFETY: no other thread runs yet (the runtime starts below).
        unsafe { std::env::set_var("TMPDIR", "/dev/shm") };
    }
    // The simulated kubelet's warnings (`RUST_LOG` to change): a bench whose
    // node stalls must say so beside its figures.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    // What users run: the image's static (musl) binary, unless
    // `FOOTPRINT_AGENT=<agent binary>` names another (an A/B of builds).
    let bin = match std::env::var_os("FOOTPRINT_AGENT") {
        Some(p) => PathBuf::from(p),
        None => shipped_agent_binary()?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
        let dir = tempfile::tempdir()?;
        println!("# {CMD}");
        println!("agent binary: {}", bin.display());
        if part_enabled("footprint") {
            footprint(&cp, &bin, dir.path()).await?;
        }
        if part_enabled("latency") {
            for tick in ["200ms", "1s"] {
                latency(&cp, &bin, dir.path(), tick).await?;
            }
        }
        if part_enabled("soak") {
            soak(&cp, &bin, dir.path()).await?;
        }
        Ok(())
    })
}

/// Options of the release agent on a bench node: `RUST_LOG=info`, the
/// agent's default flags unless `.args(..)` says otherwise.
fn bench_agent(bin: &Path, cp: &ControlPlane, sim: &SimKubelet, dir: &Path) -> AgentOptions {
    AgentOptions::on(sim)
        .bin(bin)
        .rust_log("info")
        .kubeconfig(cp.kubeconfig_path())
        .log_dir(dir)
}

// ---------------------------------------------------------------- pods

/// Sum of `metadata.generation` over the namespace: moves with every patch.
async fn generation_sum(api: &Api<Pod>) -> anyhow::Result<i64> {
    let pods = api.list(&ListParams::default()).await?;
    Ok(pods
        .items
        .iter()
        .map(|p| p.metadata.generation.unwrap_or(0))
        .sum())
}

// ---------------------------------------------------------------- /proc

#[derive(Clone, Copy, Debug)]
struct ProcSample {
    at: Instant,
    cpu_ticks: u64,
    /// The kernel's share of `cpu_ticks` (syscalls: opens, reads, closes).
    sys_ticks: u64,
    rss_kib: u64,
    hwm_kib: u64,
    threads: i64,
    syscr: u64,
    rchar: u64,
}

fn proc_sample(pid: u32) -> anyhow::Result<ProcSample> {
    let p = procfs::process::Process::new(pid as i32)?;
    let stat = p.stat()?;
    let status = p.status()?;
    let io = p.io()?;
    Ok(ProcSample {
        at: Instant::now(),
        cpu_ticks: stat.utime + stat.stime,
        sys_ticks: stat.stime,
        rss_kib: status.vmrss.unwrap_or(0),
        hwm_kib: status.vmhwm.unwrap_or(0),
        threads: stat.num_threads,
        syscr: io.syscr,
        rchar: io.rchar,
    })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Average CPU of the process between two samples, in millicores.
fn millicores(a: &ProcSample, b: &ProcSample) -> f64 {
    let cpu_s = (b.cpu_ticks - a.cpu_ticks) as f64 / procfs::ticks_per_second() as f64;
    cpu_s / (b.at - a.at).as_secs_f64() * 1000.0
}

/// Where the agent's CPU goes: a `perf` software-clock profile of 15 s
/// (this host has no hardware counters), by shared object and symbol. The
/// release binary is stripped, so its own code shows as one entry; libc
/// (malloc, memcpy) and the kernel (open, read, close paths) are named.
async fn perf_profile(pid: u32, dir: &Path) {
    let data = dir.join("perf.data");
    let rec = tokio::process::Command::new("perf")
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-F",
            "997",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(&data)
        .args(["--", "sleep", "15"])
        .output()
        .await;
    match rec {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            println!(
                "perf record failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            println!("perf not run: {e}");
            return;
        }
    }
    for sort in ["dso", "dso,sym"] {
        let rep = tokio::process::Command::new("perf")
            .args([
                "report",
                "--stdio",
                "-q",
                "--percent-limit",
                "1",
                "--sort",
                sort,
                "-i",
            ])
            .arg(&data)
            .output()
            .await;
        if let Ok(o) = rep {
            println!(
                "perf report --sort {sort} (cpu-clock, 15 s, ≥ 1 %):\n{}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
    }
}

/// `strace -c -f` of the agent for 10 s, printed (`what`: the window).
async fn strace_c(pid: u32, what: &str) {
    let out = tokio::process::Command::new("timeout")
        .args([
            "-s",
            "INT",
            "10",
            "strace",
            "-c",
            "-f",
            "-p",
            &pid.to_string(),
        ])
        .output()
        .await;
    match out {
        Ok(o) => println!(
            "strace -c -f -p <agent> for 10 s ({what}):\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => println!("strace not run: {e}"),
    }
}

/// `millicores` split into user and kernel time.
fn user_kernel_millicores(a: &ProcSample, b: &ProcSample) -> (f64, f64) {
    let per_s = |t: u64| t as f64 / procfs::ticks_per_second() as f64 / (b.at - a.at).as_secs_f64();
    let sys = per_s(b.sys_ticks - a.sys_ticks) * 1000.0;
    (millicores(a, b) - sys, sys)
}

/// `_sum` and `_count` of a histogram in a scrape.
fn histogram(s: &prometheus_parse::Scrape, name: &str) -> (f64, f64) {
    // prometheus-parse keeps `_sum` and `_count` as untyped samples.
    (
        metric(s, &format!("{name}_sum"), &[]).unwrap_or(f64::NAN),
        metric(s, &format!("{name}_count"), &[]).unwrap_or(f64::NAN),
    )
}

/// Counts files named `file` under `root`.
fn count_files(root: &Path, file: &str) -> usize {
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name() == file {
                n += 1;
            }
        }
    }
    n
}

/// The agent caps capacity at the CPUs of its cgroup root
/// (`cpuset.cpus.effective`, else the host's): make them the sim node's, so
/// a 2-CPU build machine does not shrink a 16-CPU simulated node.
fn host_cpus(root: &Path, n: u64) -> anyhow::Result<()> {
    std::fs::write(root.join("cpuset.cpus.effective"), format!("0-{}\n", n - 1))
        .context("writing cpuset.cpus.effective")
}

/// The bench node: an opted-in namespace and a simulated 16-CPU node (1 s
/// tick) with the footprint mix created, its demands set, all Running.
struct MixNode {
    ns: String,
    node: String,
    root: PathBuf,
    sim: SimKubelet,
    api: Api<Pod>,
    specs: Vec<Spec>,
    /// Time to create the pods, then until all were Running.
    created: Duration,
    up: Duration,
    /// The kernel's counters in the tree (`cgroup2`); dropped last, after
    /// the simulator: unmounts and removes the real cgroups.
    kernel: Option<testkit::kubelet_sim::cgroup_writer::KernelCounters>,
}

async fn mix_node(cp: &ControlPlane, dir: &Path, name: &str) -> anyhow::Result<MixNode> {
    mix_node_of(cp, dir, name, &FOOTPRINT_MIX).await
}

/// [`FOOTPRINT_MIX`] scaled to `n` pods (the same shares; managed 1-container
/// pods take the rounding).
fn scaled_mix(n: usize) -> Vec<(Kind, usize)> {
    let base: usize = FOOTPRINT_MIX.iter().map(|(_, c)| c).sum();
    let mut out: Vec<(Kind, usize)> = FOOTPRINT_MIX
        .iter()
        .map(|&(k, c)| (k, (c * n + base / 2) / base))
        .collect();
    let sum: usize = out.iter().map(|(_, c)| c).sum();
    out[0].1 = (out[0].1 + n).saturating_sub(sum);
    out
}

async fn mix_node_of(
    cp: &ControlPlane,
    dir: &Path,
    name: &str,
    counts: &[(Kind, usize)],
) -> anyhow::Result<MixNode> {
    mix_node_on(cp, dir, name, counts, false).await
}

/// [`mix_node_of`]; with `kernel`, on the kernel's counters (see
/// [`filesystems`]).
async fn mix_node_on(
    cp: &ControlPlane,
    dir: &Path,
    name: &str,
    counts: &[(Kind, usize)],
    kernel: bool,
) -> anyhow::Result<MixNode> {
    let client = cp.client().await;
    let ns = cp.namespace(name).await;
    opt_in(&client, &ns).await?;
    let node = format!("{ns}-node");
    let root = dir.join(format!("cg-{name}"));
    let kernel = if kernel {
        let base = cgroup2_base()
            .context("no cgroup2 mount for FOOTPRINT_FS=cgroup2")?
            .join(format!("headroom-footprint-{}-{name}", std::process::id()));
        Some(
            testkit::kubelet_sim::cgroup_writer::KernelCounters::new(&root, &base)
                .with_context(|| format!("real cgroups under {}", base.display()))?,
        )
    } else {
        None
    };
    let mut cfg = SimConfig::new(&node, &root);
    cfg.allocatable_cpu_m = 16_000;
    cfg.allocatable_memory = "64Gi".into();
    cfg.tick = Duration::from_secs(1);
    let sim = SimKubelet::start(client.clone(), cfg).await?;
    host_cpus(&root, 16)?;
    cp.wait_node_admissible(&node).await?;
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let specs = mix(&node, counts);
    for s in &specs {
        sim.set_demand(&ns, &s.name, s.demand_m);
    }
    let t0 = Instant::now();
    create_all(&api, specs.iter().map(|s| s.body.clone()).collect()).await?;
    let created = t0.elapsed();
    let up = wait_running(&api, specs.len(), Duration::from_secs(300)).await?;
    Ok(MixNode {
        ns,
        node,
        root,
        sim,
        api,
        specs,
        created,
        up,
        kernel,
    })
}

// ---------------------------------------------------------------- 1. footprint

/// The floor: a thread reading only the files of one calm tick (kubepods'
/// `cpu.stat` and `cpu.pressure` and each managed pod's `cpu.stat`), once a
/// second, on its own CPU clock, the cheapest way: each file kept open and
/// re-read with one `pread` at offset 0 ([`FloorKind::Kept`]), or, as a
/// reader of files replaced by rename must, `openat(O_NOFOLLOW|O_NONBLOCK)`,
/// `fstat`, one `read`, `close` ([`FloorKind::Open`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum FloorKind {
    Kept,
    Open,
}

struct Floor {
    files: std::sync::Arc<std::sync::Mutex<Vec<PathBuf>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Duration, u64, u64)>,
}

impl Floor {
    fn start(files: Vec<PathBuf>, kind: FloorKind) -> Floor {
        use std::io::Read;
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        use std::sync::atomic::Ordering;
        let files = std::sync::Arc::new(std::sync::Mutex::new(files));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (f, st) = (files.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let t0 = benefit::burn::thread_cpu_time();
            let mut buf = [0u8; 4096];
            let (mut reads, mut ticks) = (0u64, 0u64);
            let mut next = Instant::now();
            let open = |p: &Path| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(p)
                    .ok()
                    .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
            };
            let mut kept: std::collections::HashMap<PathBuf, std::fs::File> =
                std::collections::HashMap::new();
            let mut list = Vec::new();
            while !st.load(Ordering::Relaxed) {
                {
                    let cur = f.lock().unwrap();
                    if *cur != list {
                        list.clone_from(&cur);
                        let live: std::collections::HashSet<&PathBuf> = list.iter().collect();
                        kept.retain(|p, _| live.contains(p));
                    }
                }
                for p in &list {
                    if kind == FloorKind::Open {
                        if let Some(mut file) = open(p) {
                            reads += u64::from(file.read(&mut buf).is_ok());
                        }
                        continue;
                    }
                    if !kept.contains_key(p)
                        && let Some(file) = open(p)
                    {
                        kept.insert(p.clone(), file);
                    }
                    if let Some(file) = kept.get(p) {
                        reads += u64::from(file.read_at(&mut buf, 0).is_ok());
                    }
                }
                ticks += 1;
                next += Duration::from_secs(1);
                while Instant::now() < next && !st.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            (benefit::burn::thread_cpu_time() - t0, reads, ticks)
        });
        Floor {
            files,
            stop,
            thread,
        }
    }

    /// CPU time used, files read, ticks.
    fn stop(self) -> (Duration, u64, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The files the agent reads on a calm tick: kubepods' counters and the
/// `cpu.stat` of each live managed pod (found in the tree by its uid).
async fn floor_files(
    root: &Path,
    api: &Api<Pod>,
    managed: &BTreeSet<String>,
) -> anyhow::Result<Vec<PathBuf>> {
    let layout = headroom::cgroup::discover(root).context("sim tree layout")?;
    let kp = root.join(&layout.kubepods);
    let mut out = vec![kp.join("cpu.stat"), kp.join("cpu.pressure")];
    let uids: BTreeSet<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| managed.contains(p.metadata.name.as_deref().unwrap_or("")))
        .filter_map(|p| p.metadata.uid.clone())
        .flat_map(|u| [u.replace('-', "_"), u])
        .collect();
    let mut stack = vec![kp];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            // `kubepods-burstable-pod<uid>.slice` (systemd), `pod<uid>`
            // (cgroupfs); QoS directories are walked into, pods are not.
            let name = e.file_name().to_string_lossy().into_owned();
            match name
                .rsplit_once("pod")
                .map(|(_, r)| r.trim_end_matches(".slice"))
            {
                Some(uid) if uid.len() >= 32 => {
                    if uids.contains(uid) {
                        out.push(e.path().join("cpu.stat"));
                    }
                }
                _ => stack.push(e.path()),
            }
        }
    }
    Ok(out)
}

/// kubepods' `cpu.pressure` `some total` (µs) in the sim tree.
fn kubepods_some_us(root: &Path) -> Option<u64> {
    let layout = headroom::cgroup::discover(root).ok()?;
    let b = headroom::cgroup::read::read(&root.join(layout.kubepods).join("cpu.pressure")).ok()?;
    Some(headroom::cgroup::parse::pressure(&b).ok()?.some.total_us)
}

/// CPU over consecutive slices of a window: (mean, min, max) millicores.
struct Spread {
    mean: f64,
    min: f64,
    max: f64,
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} m ({:.1}–{:.1})", self.mean, self.min, self.max)
    }
}

fn spread_of(samples: &[ProcSample]) -> Spread {
    let per: Vec<f64> = samples
        .windows(2)
        .map(|w| millicores(&w[0], &w[1]))
        .collect();
    let first = samples.first().copied();
    let last = samples.last().copied();
    Spread {
        mean: first
            .zip(last)
            .map_or(f64::NAN, |(a, b)| millicores(&a, &b)),
        min: per.iter().copied().fold(f64::INFINITY, f64::min),
        max: per.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }
}

/// One agent's figures on one node.
struct Row {
    pods: usize,
    label: String,
    steady: Spread,
    churn: Spread,
    fs: String,
    /// Kept handles + `pread` (the floor the ratio is taken to).
    floor_steady_m: f64,
    floor_churn_m: f64,
    /// open + fstat + read + close.
    floor_open_steady_m: f64,
    floor_open_churn_m: f64,
    floor_files: f64,
    fds: usize,
    rss_steady_mib: f64,
    rss_churn_mib: f64,
    reads_per_tick: f64,
    scan_ms: f64,
}

/// Footprint at each pod count (`FOOTPRINT_PODS`, default 110,250,500):
/// each node's agent steady, then under churn, beside the floor; with
/// `FOOTPRINT_BASELINE=<agent binary>` that agent first, on the same node,
/// through the same windows. At 250 pods the new agent is also profiled
/// (`strace -c`, `perf`) and watched with the simulator stopped.
async fn footprint(cp: &ControlPlane, bin: &Path, dir: &Path) -> anyhow::Result<()> {
    let counts: Vec<usize> = std::env::var("FOOTPRINT_PODS")
        .unwrap_or_else(|_| "110,250,500".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let baseline = std::env::var_os("FOOTPRINT_BASELINE").map(PathBuf::from);
    let mut rows = Vec::new();
    for n in counts {
        for fs in filesystems() {
            let counts = scaled_mix(n);
            let kernel = fs == "cgroup2";
            let mut node =
                mix_node_on(cp, dir, &format!("fp{n}{}", &fs[..3]), &counts, kernel).await?;
            println!(
                "\n== footprint on {fs}: {n} pods {counts:?}, node 16 CPUs, sim tick 1 s; created \
                 in {:.1?}, all Running after {:.1?} more; cgroup tree: {} cpu.stat files, {} \
                 cpu.max files",
                node.created,
                node.up,
                count_files(&node.root, "cpu.stat"),
                count_files(&node.root, "cpu.max")
            );
            let mut churn = Churn::new(
                node.api.clone(),
                &node.ns,
                &node.node,
                &node.specs,
                0x5eed_0028,
            );
            if let Some(b) = &baseline {
                let (row, mut agent) =
                    measure(cp, &mut node, &mut churn, b, "baseline", false, dir).await?;
                agent.stop().await;
                rows.push(row);
            }
            let profile = n == 250;
            let (row, mut agent) =
                measure(cp, &mut node, &mut churn, bin, "this", profile, dir).await?;
            rows.push(row);
            if profile && !kernel {
                sim_stopped(node, &mut agent).await?;
            } else {
                node.sim.stop().await;
                drop(node.kernel);
            }
            agent.stop().await;
        }
    }
    println!(
        "\n== footprint summary (CPU: mean over the window (min–max of {}-s slices); floor: the \
         same files once a second on its own thread CPU clock, kept open and re-read with pread \
         (×floor is to it), and open+fstat+read+close (floor-o))",
        SLICE.as_secs()
    );
    println!(
        "{:>5} {:>8} {:>9} {:>22} {:>22} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>5}",
        "pods",
        "fs",
        "agent",
        "steady",
        "churn",
        "floor",
        "floor-c",
        "floor-o",
        "fl-o-c",
        "×floor",
        "×fl-c",
        "files/t",
        "rd-sc/t",
        "RSS MiB",
        "RSS-c",
        "scan ms",
        "fds",
        ""
    );
    for r in &rows {
        println!(
            "{:>5} {:>8} {:>9} {:>22} {:>22} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.0} {:>7.0} {:>7.1} {:>7.1} {:>7.2} {:>7} {:>5}",
            r.pods,
            r.fs,
            r.label,
            r.steady.to_string(),
            r.churn.to_string(),
            r.floor_steady_m,
            r.floor_churn_m,
            r.floor_open_steady_m,
            r.floor_open_churn_m,
            r.steady.mean / r.floor_steady_m,
            r.churn.mean / r.floor_churn_m,
            r.floor_files,
            r.reads_per_tick,
            r.rss_steady_mib,
            r.rss_churn_mib,
            r.scan_ms,
            r.fds,
            ""
        );
    }
    for fs in filesystems() {
        let this: Vec<&Row> = rows
            .iter()
            .filter(|r| r.label == "this" && r.fs == fs)
            .collect();
        if let (Some(a), Some(b)) = (this.first(), this.last())
            && b.pods > a.pods
        {
            let per = |f: &dyn Fn(&Row) -> f64| (f(b) - f(a)) / (b.pods - a.pods) as f64 * 100.0;
            println!(
                "slope on {fs} ({} → {} pods), per 100 pods: steady {:+.2} m, churn {:+.2} m, \
                 floor {:+.2} m, RSS {:+.2} MiB",
                a.pods,
                b.pods,
                per(&|r| r.steady.mean),
                per(&|r| r.churn.mean),
                per(&|r| r.floor_steady_m),
                per(&|r| r.rss_steady_mib)
            );
        }
    }
    Ok(())
}

/// Length of the slices a window's CPU range is taken over.
const SLICE: Duration = Duration::from_secs(10);

/// Samples `pid` every second for `window`; every `SLICE` a sample is kept
/// for the range. `each` runs once a second (churn steps).
async fn window_samples(pid: u32, window: Duration) -> anyhow::Result<(Vec<ProcSample>, u64)> {
    let a = proc_sample(pid)?;
    let mut out = vec![a];
    let mut peak = a.rss_kib;
    let mut next = a.at + SLICE;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let b = proc_sample(pid)?;
        peak = peak.max(b.rss_kib);
        if b.at >= next {
            out.push(b);
            next += SLICE;
        }
        if b.at - a.at >= window {
            if out.last().is_some_and(|l| l.at != b.at) {
                out.push(b);
            }
            return Ok((out, peak));
        }
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "one bench sequence, read top to bottom"
)]
async fn measure(
    cp: &ControlPlane,
    node: &mut MixNode,
    churn: &mut Churn,
    bin: &Path,
    label: &str,
    profile: bool,
    dir: &Path,
) -> anyhow::Result<(Row, AgentProcess)> {
    let fs = if node.kernel.is_some() {
        "cgroup2"
    } else {
        "tmpfs"
    };
    let window = Duration::from_secs(env_u64("FOOTPRINT_WINDOW_S", 60));
    let (sim, api) = (&node.sim, &node.api);
    // Default flags: tick 1 s, audit 30 s, reserve 100m.
    let agent = AgentProcess::start(bench_agent(bin, cp, sim, dir)).await?;
    let pid = agent.pid().context("agent pid")?;
    let started = Instant::now();
    let first = proc_sample(pid)?;
    println!(
        "-- {label} agent on {fs} ({}): ready, RSS {:.1} MiB, threads {}",
        bin.display(),
        mib(first.rss_kib),
        first.threads
    );

    // Converged = no generation bump for `quiet` (bounded).
    let quiet = Duration::from_secs(20);
    let bound = Duration::from_secs(300);
    let mut last = generation_sum(api).await?;
    let initial = last;
    let mut last_change = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let g = generation_sum(api).await?;
        if g != last {
            last = g;
            last_change = Instant::now();
        }
        if last_change.elapsed() >= quiet {
            break;
        }
        if started.elapsed() > bound {
            println!("WARNING: still patching after {bound:?}; sampling anyway");
            break;
        }
    }
    let conv = proc_sample(pid)?;
    println!(
        "converged: {} patches, last one {:.1?} after start; CPU during convergence {:.1} m",
        last - initial,
        last_change - started,
        millicores(&first, &conv)
    );

    // Steady, beside the floor.
    let files = floor_files(&node.root, api, &churn.live_managed()).await?;
    let nfiles = files.len();
    let m0 = parse_metrics(&agent.scrape().await?)?;
    let floor = Floor::start(files.clone(), FloorKind::Kept);
    let floor_open = Floor::start(files, FloorKind::Open);
    let some0 = kubepods_some_us(&node.root);
    let (steady, rss_steady) = window_samples(pid, window).await?;
    let some1 = kubepods_some_us(&node.root);
    let (floor_cpu, floor_reads, floor_ticks) = floor.stop();
    let (floor_open_cpu, _, _) = floor_open.stop();
    let fds = open_fds(pid).unwrap_or(0);
    let m1 = parse_metrics(&agent.scrape().await?)?;
    let (a, b) = (steady[0], *steady.last().context("samples")?);
    let secs = (b.at - a.at).as_secs_f64();
    let floor_steady_m = floor_cpu.as_secs_f64() / secs * 1000.0;
    let floor_open_steady_m = floor_open_cpu.as_secs_f64() / secs * 1000.0;
    let (user_m, kernel_m) = user_kernel_millicores(&a, &b);
    let reads_per_tick = (b.syscr - a.syscr) as f64 / secs;
    let (s0, c0) = histogram(&m0, "headroom_scan_duration_seconds");
    let (s1, c1) = histogram(&m1, "headroom_scan_duration_seconds");
    let scan_ms = (s1 - s0) / (c1 - c0) * 1000.0;
    let g_end = generation_sum(api).await?;
    println!(
        "steady {secs:.0} s: CPU {} (user {user_m:.2}, kernel {kernel_m:.2}), RSS peak {:.1} MiB, \
         VmHWM {:.1} MiB, threads {}, patches {}, {reads_per_tick:.0} read syscalls/tick, \
         {:.0} KiB read/tick, scan mean {scan_ms:.2} ms, {fds} fds open; floor kept+pread \
         {floor_steady_m:.2} m, open+read+close {floor_open_steady_m:.2} m ({nfiles} files, \
         {floor_reads} reads in {floor_ticks} ticks)",
        spread_of(&steady),
        mib(rss_steady),
        mib(b.hwm_kib),
        b.threads,
        g_end - last,
        (b.rchar - a.rchar) as f64 / 1024.0 / secs
    );
    let managed = metric(&m1, "headroom_pods", &[("state", "managed")]).unwrap_or(f64::NAN);
    println!(
        "headroom_pods{{state=managed}} = {managed}; kubepods stall (Δsome) {:.2} % of the \
         window (the contention gate opens at {} %)",
        some0
            .zip(some1)
            .map_or(f64::NAN, |(a, b)| (b - a) as f64 / secs / 1e4),
        headroom::signal::contention::GATE_PCT
    );

    if profile {
        strace_c(pid, "steady, sim writing every 1 s").await;
        perf_profile(pid, dir).await;
    }

    // Under churn (the soak's cadence), beside the floor (its list follows
    // the live managed pods).
    let files = floor_files(&node.root, api, &churn.live_managed()).await?;
    let floor = Floor::start(files.clone(), FloorKind::Kept);
    let floor_open = Floor::start(files, FloorKind::Open);
    let g0 = generation_sum(api).await?;
    let a = proc_sample(pid)?;
    let mut samples = vec![a];
    let mut peak = a.rss_kib;
    let mut next = a.at + SLICE;
    // Where churn's CPU goes (at the profiled pod count): the same
    // `strace -c` and `perf` as the steady window's, taken while it churns.
    let churn_profile = profile.then(|| {
        let dir = dir.to_path_buf();
        tokio::spawn(async move {
            strace_c(pid, "under churn").await;
            perf_profile(pid, &dir).await;
        })
    });
    let mut steps = tokio::time::interval(SOAK_STEP);
    steps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        steps.tick().await;
        churn.step(sim, SOAK_REPLACE, SOAK_RELOAD).await?;
        let files = floor_files(&node.root, api, &churn.live_managed()).await?;
        floor_open.files.lock().unwrap().clone_from(&files);
        *floor.files.lock().unwrap() = files;
        let b = proc_sample(pid)?;
        peak = peak.max(b.rss_kib);
        if b.at >= next {
            samples.push(b);
            next += SLICE;
        }
        if b.at - a.at >= window {
            if samples.last().is_some_and(|l| l.at != b.at) {
                samples.push(b);
            }
            break;
        }
    }
    let (floor_cpu, _, _) = floor.stop();
    let (floor_open_cpu, _, _) = floor_open.stop();
    if let Some(p) = churn_profile {
        let _ = p.await;
    }
    // Back to the mix's own demands, so the next agent on this node starts
    // from the same calm state (redrawn demands above the limits throttle
    // pods, and throttled tasks stall kubepods: the contention gate opens).
    for (name, kind) in churn.live() {
        sim.set_demand(&node.ns, name, kind.demand_m());
    }
    let b = *samples.last().context("samples")?;
    let csecs = (b.at - a.at).as_secs_f64();
    let floor_churn_m = floor_cpu.as_secs_f64() / csecs * 1000.0;
    let floor_open_churn_m = floor_open_cpu.as_secs_f64() / csecs * 1000.0;
    let m2 = parse_metrics(&agent.scrape().await?)?;
    let (cuser_m, ckernel_m) = user_kernel_millicores(&a, &b);
    println!(
        "churn {csecs:.0} s (every {SOAK_STEP:?} {SOAK_REPLACE} pods replaced, {SOAK_RELOAD} \
         demands redrawn): CPU {} (user {cuser_m:.2}, kernel {ckernel_m:.2}), RSS peak {:.1} MiB, patches {}, {:.0} read syscalls/tick; \
         floor kept+pread {floor_churn_m:.2} m, open+read+close {floor_open_churn_m:.2} m; \
         scan errors {}",
        spread_of(&samples),
        mib(peak),
        generation_sum(api).await? - g0,
        (b.syscr - a.syscr) as f64 / csecs,
        metric(&m2, "headroom_scan_errors_total", &[]).unwrap_or(0.0)
    );

    let row = Row {
        pods: node.specs.len(),
        label: label.to_string(),
        fs: fs.to_string(),
        steady: spread_of(&steady),
        churn: spread_of(&samples),
        floor_steady_m,
        floor_churn_m,
        floor_open_steady_m,
        floor_open_churn_m,
        floor_files: nfiles as f64,
        fds,
        rss_steady_mib: mib(rss_steady),
        rss_churn_mib: mib(peak),
        reads_per_tick,
        scan_ms,
    };
    Ok((row, agent))
}

/// The simulator stopped: its counters freeze, so every pod reads 0 usage
/// and the node all slack; and nothing applies a resize. What the agent
/// does then, and what it costs.
async fn sim_stopped(node: MixNode, agent: &mut AgentProcess) -> anyhow::Result<()> {
    let api = &node.api;
    let pid = agent.pid().context("agent pid")?;
    node.sim.stop().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let g0 = generation_sum(api).await?;
    let ma = parse_metrics(&agent.scrape().await?)?;
    let a = proc_sample(pid)?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let b = proc_sample(pid)?;
    let mb = parse_metrics(&agent.scrape().await?)?;
    let d = |name: &str, labels: &[(&str, &str)]| {
        metric(&mb, name, labels).unwrap_or(0.0) - metric(&ma, name, labels).unwrap_or(0.0)
    };
    println!(
        "sim stopped (counters frozen, no resize applied): CPU {:.2} m over {:.0?}, \
         {:.0} read syscalls/tick, patches {}, resizes applied {} / verified {} / \
         unverified {}",
        millicores(&a, &b),
        b.at - a.at,
        (b.syscr - a.syscr) as f64 / (b.at - a.at).as_secs_f64(),
        generation_sum(api).await? - g0,
        d("headroom_resizes_total", &[("result", "applied")]),
        d("headroom_resizes_total", &[("result", "verified")]),
        d("headroom_resizes_total", &[("result", "unverified")]),
    );
    Ok(())
}

// ---------------------------------------------------------------- 2. latency

/// One watched change of a pod: when it arrived, name, generation, app limit.
type Seen = (Instant, String, i64, Option<u64>);

/// Limit (m) from which a managed pod of the latency setup counts as raised
/// (ceiling 800m; the agent caps capacity at the host's online CPUs).
const RAISED: u64 = 600;

async fn latency(cp: &ControlPlane, bin: &Path, dir: &Path, tick: &str) -> anyhow::Result<()> {
    let reps = env_u64("LATENCY_REPS", 5);
    let client = cp.client().await;
    let ns = cp.namespace(&format!("latency-{tick}")).await;
    opt_in(&client, &ns).await?;
    let node = format!("{ns}-node");
    let root = dir.join(format!("cg-latency-{tick}"));
    let sim = SimKubelet::start(client.clone(), SimConfig::new(&node, &root)).await?;
    host_cpus(&root, 4)?;
    cp.wait_node_admissible(&node).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let managed = ["m1", "m2", "m3"];
    let mut bodies: Vec<Value> = managed
        .iter()
        .map(|n| {
            pod(
                n,
                &node,
                vec![container("app", res("200m", Some("300m")))],
                None,
            )
        })
        .collect();
    bodies.push(pod(
        "filler",
        &node,
        vec![container("app", res("100m", None))],
        Some(json!({"headroom.dev/managed": "false"})),
    ));
    for n in managed {
        sim.set_demand(&ns, n, 100);
    }
    sim.set_demand(&ns, "filler", 0);
    create_all(&api, bodies).await?;
    wait_running(&api, 4, Duration::from_secs(60)).await?;

    // Watch first, so no change is missed.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Seen>();
    let wapi = api.clone();
    let watch = tokio::spawn(async move {
        let mut s = watcher(wapi, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(p)) = s.next().await {
            let name = p.metadata.name.clone().unwrap_or_default();
            let g = p.metadata.generation.unwrap_or(0);
            if tx
                .send((
                    Instant::now(),
                    name,
                    g,
                    testkit::scenario::pod::cpu_limit_m(&p, "app"),
                ))
                .is_err()
            {
                break;
            }
        }
    });

    let args = fast_args_with(&[("--tick", tick)]);
    let mut agent = AgentProcess::start(bench_agent(bin, cp, &sim, dir).args(&args)).await?;
    println!(
        "\n== reaction latency, --tick {tick} (other flags: {}), 3 managed pods req 200m \
         lim 300m (ceiling 800m), node 4 CPUs, sim tick 100 ms",
        args.join(" ")
    );

    let mut state: BTreeMap<String, (i64, Option<u64>)> = BTreeMap::new();
    let mut took = Vec::new();
    for rep in 0..reps {
        // Idle: wait until every managed pod is raised near its ceiling
        // (the dead band may stop short of it) and no patch came for 3 s.
        sim.set_demand(&ns, "filler", 0);
        let raised = |st: &BTreeMap<String, (i64, Option<u64>)>| {
            managed.iter().all(|n| {
                st.get(*n)
                    .is_some_and(|(_, l)| l.is_some_and(|l| l >= RAISED))
            })
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = if raised(&state) {
                Duration::from_secs(3).min(left)
            } else {
                left
            };
            match tokio::time::timeout(wait, rx.recv()).await {
                Ok(Some((_, n, g, l))) => {
                    state.insert(n, (g, l));
                }
                Err(_) if raised(&state) => break,
                _ => bail!(
                    "rep {rep}: managed pods not raised to ≥ {RAISED}m: {state:?}\n{}",
                    agent.log_tail(20)
                ),
            }
        }
        let base: BTreeMap<String, (i64, u64)> = managed
            .iter()
            .map(|n| {
                let (g, l) = state.get(*n).cloned().unwrap_or((0, None));
                (n.to_string(), (g, l.unwrap_or(0)))
            })
            .collect();

        // Spike: the unmanaged pod wants the whole node.
        let t0 = Instant::now();
        sim.set_demand(&ns, "filler", 4000);
        let deadline = t0 + Duration::from_secs(120);
        let hit = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, rx.recv()).await {
                Ok(Some((at, n, g, l))) => {
                    let lowered = base
                        .get(&n)
                        .is_some_and(|(bg, bl)| g > *bg && l.is_some_and(|l| l < *bl));
                    state.insert(n.clone(), (g, l));
                    if lowered {
                        break (at - t0, n, l);
                    }
                }
                _ => bail!(
                    "rep {rep}: no lowering within 120 s\n{}",
                    agent.log_tail(20)
                ),
            }
        };
        println!(
            "rep {rep}: first lowering patch ({} → {}m) seen after {} ms",
            hit.1,
            hit.2.unwrap_or(0),
            hit.0.as_millis()
        );
        took.push(hit.0);
    }
    took.sort();
    if let (Some(med), Some(max)) = (took.get(took.len() / 2), took.last()) {
        println!(
            "--tick {tick}: set_demand → first lowering patch: median {} ms, max {} ms \
             over {} reps",
            med.as_millis(),
            max.as_millis(),
            took.len()
        );
    }
    if let Some(pid) = agent.pid() {
        let p = proc_sample(pid)?;
        println!(
            "agent with 4 pods: RSS {:.1} MiB, VmHWM {:.1} MiB",
            mib(p.rss_kib),
            mib(p.hwm_kib)
        );
    }
    watch.abort();
    agent.stop().await;
    sim.stop().await;
    Ok(())
}

// ---------------------------------------------------------------- 3. soak

/// Churn cadence of the soak: every `SOAK_STEP`, `SOAK_REPLACE` pods are
/// deleted and as many created under new names, and `SOAK_RELOAD` pods get a
/// new demand.
const SOAK_STEP: Duration = Duration::from_secs(5);
const SOAK_REPLACE: usize = 5;
const SOAK_RELOAD: usize = 10;
/// A row every 30 s; the first 2 minutes are warm-up (initial convergence).
const SOAK_ROW: Duration = Duration::from_secs(30);
const SOAK_WARMUP: Duration = Duration::from_secs(120);

/// One row of the soak table.
#[derive(Clone, Debug)]
struct SoakRow {
    t: Duration,
    /// Average CPU since the previous row, millicores.
    cpu_m: f64,
    rss_kib: u64,
    fds: usize,
    threads: i64,
    watches: usize,
    /// Samples in /metrics.
    series: usize,
    /// Pods with per-pod series.
    series_pods: usize,
    /// Pods the apiserver lists in the namespace (terminating included).
    pods: usize,
    created: usize,
    deleted: usize,
    applied: f64,
    verified: f64,
}

impl SoakRow {
    const HEADER: &str = "    t  CPU m  RSS MiB  fds  thr  inotify  series  series-pods  pods  created  deleted  applied  verified";

    fn print(&self) {
        println!(
            "{:>5.0} {:>6.1} {:>8.1} {:>4} {:>4} {:>8} {:>7} {:>12} {:>5} {:>8} {:>8} {:>8} {:>9}",
            self.t.as_secs_f64(),
            self.cpu_m,
            mib(self.rss_kib),
            self.fds,
            self.threads,
            self.watches,
            self.series,
            self.series_pods,
            self.pods,
            self.created,
            self.deleted,
            self.applied,
            self.verified
        );
    }
}

/// Samples the agent, its /metrics and the apiserver's pods; `prev` is the
/// previous /proc sample (for CPU), replaced by this one.
async fn soak_row(
    agent: &mut AgentProcess,
    api: &Api<Pod>,
    ns: &str,
    churn: &Churn,
    t0: Instant,
    prev: &mut ProcSample,
) -> anyhow::Result<SoakRow> {
    if !agent.is_running() {
        bail!("agent exited during the soak:\n{}", agent.log_tail(40));
    }
    let pid = agent.pid().context("agent pid")?;
    // fds first: the scrape's own connection is not counted.
    let fds = open_fds(pid)?;
    let watches = inotify_watches(pid)?;
    let p = proc_sample(pid)?;
    let text = agent.scrape().await?;
    let s = parse_metrics(&text)?;
    let row = SoakRow {
        t: t0.elapsed(),
        cpu_m: millicores(prev, &p),
        rss_kib: p.rss_kib,
        fds,
        threads: p.threads,
        watches,
        series: series_count(&text),
        series_pods: pod_series(&s, ns).len(),
        pods: pod_names(api).await?.len(),
        created: churn.created,
        deleted: churn.deleted,
        applied: metric(&s, "headroom_resizes_total", &[("result", "applied")]).unwrap_or(0.0),
        verified: metric(&s, "headroom_resizes_total", &[("result", "verified")]).unwrap_or(0.0),
    };
    *prev = p;
    Ok(row)
}

/// min, max, first, last of `f` over `rows`.
fn spread<T: Copy + PartialOrd>(rows: &[SoakRow], f: impl Fn(&SoakRow) -> T) -> (T, T, T, T) {
    let v: Vec<T> = rows.iter().map(f).collect();
    let mut min = v[0];
    let mut max = v[0];
    for &x in &v {
        if x < min {
            min = x;
        }
        if x > max {
            max = x;
        }
    }
    (min, max, v[0], v[v.len() - 1])
}

/// Per-pod series (samples) whose pod the apiserver does not list, and
/// those pods.
fn stale_series(
    s: &prometheus_parse::Scrape,
    ns: &str,
    listed: &BTreeSet<String>,
) -> (usize, BTreeSet<String>) {
    let mut n = 0;
    let mut pods = BTreeSet::new();
    for x in s
        .samples
        .iter()
        .filter(|x| x.metric.starts_with("headroom_") && x.labels.get("namespace") == Some(ns))
    {
        if let Some(p) = x.labels.get("pod")
            && !listed.contains(p)
        {
            n += 1;
            pods.insert(p.to_string());
        }
    }
    (n, pods)
}

async fn soak(cp: &ControlPlane, bin: &Path, dir: &Path) -> anyhow::Result<()> {
    let minutes = env_u64("SOAK_MINUTES", 15);
    let MixNode {
        ns,
        node,
        sim,
        api,
        specs,
        ..
    } = mix_node(cp, dir, "soak").await?;
    let total = specs.len();
    let mut agent = AgentProcess::start(bench_agent(bin, cp, &sim, dir)).await?;
    let pid = agent.pid().context("agent pid")?;
    println!(
        "\n== soak: {total} pods (footprint mix), node 16 CPUs, sim tick 1 s, agent default \
         flags; churn for {minutes} min: every {SOAK_STEP:?} {SOAK_REPLACE} pods deleted and \
         {SOAK_REPLACE} created under new names, {SOAK_RELOAD} demands redrawn \
         (0..=3× request for managed pods, 0..=1000m for opted-out ones); a row every \
         {SOAK_ROW:?}, the first {SOAK_WARMUP:?} warm-up"
    );
    println!("{}", SoakRow::HEADER);

    let mut churn = Churn::new(api.clone(), &ns, &node, &specs, 0x5eed_0012);
    let t0 = Instant::now();
    let mut prev = proc_sample(pid)?;
    let mut rows = Vec::new();
    let row = soak_row(&mut agent, &api, &ns, &churn, t0, &mut prev).await?;
    row.print();
    rows.push(row);
    let run = Duration::from_secs(minutes * 60);
    let mut steps = tokio::time::interval(SOAK_STEP);
    steps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_row = t0 + SOAK_ROW;
    while t0.elapsed() < run {
        steps.tick().await;
        churn.step(&sim, SOAK_REPLACE, SOAK_RELOAD).await?;
        if Instant::now() >= next_row {
            next_row += SOAK_ROW;
            let row = soak_row(&mut agent, &api, &ns, &churn, t0, &mut prev).await?;
            row.print();
            rows.push(row);
        }
    }
    let churned = t0.elapsed();

    // Churn stops; the last deletions are confirmed, the agent ticks on.
    let settle_t0 = Instant::now();
    let (stale, stale_pods, listed) = loop {
        let listed = pod_names(&api).await?;
        let s = parse_metrics(&agent.scrape().await?)?;
        let (n, pods) = stale_series(&s, &ns, &listed);
        let deletions_done = churn.gone().iter().all(|g| !listed.contains(g));
        if (deletions_done && n == 0) || settle_t0.elapsed() > Duration::from_secs(180) {
            break (n, pods, listed);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let settled = settle_t0.elapsed();
    let row = soak_row(&mut agent, &api, &ns, &churn, t0, &mut prev).await?;
    row.print();
    rows.push(row);

    // All pods but 2 of each kind deleted: the series count goes back down.
    let series_before = rows.last().map_or(0, |r| r.series);
    churn.delete_all_but(2).await?;
    let keep: BTreeSet<String> = churn.live().map(|(n, _)| n.to_string()).collect();
    println!(
        "-- churn stopped; all but {} pods deleted ({} per-pod series pods and {} series before)",
        keep.len(),
        rows.last().map_or(0, |r| r.series_pods),
        series_before
    );
    let down_t0 = Instant::now();
    let mut down = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let row = soak_row(&mut agent, &api, &ns, &churn, t0, &mut prev).await?;
        row.print();
        let done = row.pods == keep.len()
            && row.series_pods == churn.live_managed().len()
            && down
                .last()
                .is_some_and(|r: &SoakRow| r.series == row.series && r.fds == row.fds);
        down.push(row);
        if done || down_t0.elapsed() > Duration::from_secs(180) {
            break;
        }
    }
    let down_took = down_t0.elapsed();
    let s_end = parse_metrics(&agent.scrape().await?)?;
    let (stale_end, stale_end_pods, _) = {
        let listed = pod_names(&api).await?;
        let (n, p) = stale_series(&s_end, &ns, &listed);
        (n, p, listed)
    };

    // Summary.
    let steady: Vec<SoakRow> = rows
        .iter()
        .filter(|r| r.t >= SOAK_WARMUP && r.t <= churned)
        .cloned()
        .collect();
    let last = rows.last().cloned().context("no rows")?;
    let mins = churned.as_secs_f64() / 60.0;
    println!(
        "\n== soak summary ({:.1} min of churn, rows after the {:.0} s warm-up: {})",
        mins,
        SOAK_WARMUP.as_secs_f64(),
        steady.len()
    );
    if !steady.is_empty() {
        let (lo, hi, first, end) = spread(&steady, |r| r.rss_kib);
        println!(
            "RSS MiB: first {:.1}, last {:.1}, min {:.1}, max {:.1} (VmHWM {:.1})",
            mib(first),
            mib(end),
            mib(lo),
            mib(hi),
            mib(prev.hwm_kib)
        );
        let (lo, hi, first, end) = spread(&steady, |r| r.fds);
        println!("open fds: first {first}, last {end}, min {lo}, max {hi}");
        let (lo, hi, first, end) = spread(&steady, |r| r.threads);
        println!("threads: first {first}, last {end}, min {lo}, max {hi}");
        let (lo, hi, first, end) = spread(&steady, |r| r.watches);
        println!("inotify watches: first {first}, last {end}, min {lo}, max {hi}");
        let (lo, hi, first, end) = spread(&steady, |r| r.series);
        println!("/metrics series: first {first}, last {end}, min {lo}, max {hi}");
        let (lo, hi, first, end) = spread(&steady, |r| r.series_pods);
        println!("pods with per-pod series: first {first}, last {end}, min {lo}, max {hi}");
        let cpu: f64 = steady.iter().map(|r| r.cpu_m).sum::<f64>() / steady.len() as f64;
        println!("CPU: {cpu:.1} millicores avg over the rows");
    }
    println!(
        "churn: {} pods created and {} deleted by churn ({:.1}/min each), {} demands \
         redrawn; patches applied {}, verified {} ({:.1}/min applied)",
        last.created,
        last.deleted,
        last.created as f64 / mins,
        churn.demand_changes,
        last.applied,
        last.verified,
        last.applied / mins
    );
    let errors = metric(&s_end, "headroom_patch_errors_total", &[]).unwrap_or(0.0);
    let unverified = metric(
        &s_end,
        "headroom_resizes_total",
        &[("result", "unverified")],
    )
    .unwrap_or(0.0);
    println!("patch errors {errors}, unverified resizes {unverified}");
    println!(
        "per-pod series for pods that no longer exist: {stale} (after the churn stopped and a \
         settle of {settled:.1?}; {} pods listed){}",
        listed.len(),
        if stale_pods.is_empty() {
            String::new()
        } else {
            format!(": {stale_pods:?}")
        }
    );
    if let Some(b) = down.last() {
        println!(
            "after deleting all but {} pods: /metrics series {} → {} ({down_took:.0?} later), \
             pods with per-pod series {} → {}, fds {} → {}, RSS {:.1} → {:.1} MiB; stale series \
             at the end: {stale_end}",
            keep.len(),
            series_before,
            b.series,
            last.series_pods,
            b.series_pods,
            last.fds,
            b.fds,
            mib(last.rss_kib),
            mib(b.rss_kib)
        );
    }
    let panicked = agent.log().contains("panicked");
    println!("agent alive: {}, panicked: {panicked}", agent.is_running());
    agent.stop().await;
    sim.stop().await;
    if stale > 0 || stale_end > 0 {
        bail!(
            "per-pod series outlived their pods: {stale} after the churn ({stale_pods:?}), \
             {stale_end} after the bulk deletion ({stale_end_pods:?})"
        );
    }
    if panicked {
        bail!("the agent panicked");
    }
    Ok(())
}
