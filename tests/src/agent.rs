//! The real `headroom-agent` binary as a child process of a test, pointed at
//! the harness's apiserver and a simulated node's cgroup root.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::kubelet_sim::SimKubelet;
use crate::process::spawn_guarded;

/// Removes the variables `cargo test` sets to describe the test crate
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...) from a nested cargo build.
/// Passed on, they change build-script fingerprints (ring's tracks
/// `CARGO_MANIFEST_DIR`) and cost a rebuild of ring, rustls and kube on
/// every test run, and another one for the next plain build.
pub fn clean_cargo_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if k == "CARGO"
            || k.starts_with("CARGO_PKG_")
            || matches!(
                k,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
            )
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// The workspace's debug build of `headroom-agent`, built once per test
/// process (a no-op when fresh, a rebuild when the agent changed since the
/// last `cargo test`).
pub fn agent_binary() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_agent(Profile::Debug).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// The release build of `headroom-agent` (for benchmarks): built on every
/// call, a no-op when fresh.
pub fn release_agent_binary() -> anyhow::Result<PathBuf> {
    build_agent(Profile::Release)
}

/// The binary the image ships: `scripts/static-build.sh` (the Dockerfile's
/// own build: static, musl, for this machine), built when missing or stale.
/// Footprint is measured on it, not on the glibc build: the allocator and
/// the linked text differ, and users run this one.
pub fn shipped_agent_binary() -> anyhow::Result<PathBuf> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| ws.join("target"));
    let bin = target.join("x86_64-unknown-linux-musl/release/headroom-agent");
    let mut cmd = Command::new("bash");
    let status = clean_cargo_env(&mut cmd)
        .arg(ws.join("scripts/static-build.sh"))
        .current_dir(&ws)
        .status()
        .context("running scripts/static-build.sh")?;
    if !status.success() || !bin.exists() {
        bail!("scripts/static-build.sh failed ({status})");
    }
    Ok(bin)
}

#[derive(Debug, Clone, Copy)]
enum Profile {
    Debug,
    Release,
}

/// `cargo build -p headroom-agent --bin headroom-agent` in `profile`, in the
/// workspace's target dir; the path of the binary.
fn build_agent(profile: Profile) -> anyhow::Result<PathBuf> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| ws.join("target"));
    let (flag, dir) = match profile {
        Profile::Debug => (None, "debug"),
        Profile::Release => (Some("--release"), "release"),
    };
    let bin = target.join(dir).join("headroom-agent");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    let status = clean_cargo_env(&mut cmd)
        .arg("build")
        .args(flag)
        .args(["-q", "-p", "headroom-agent", "--bin", "headroom-agent"])
        .current_dir(&ws)
        .status()
        .with_context(|| format!("running cargo build ({dir})"))?;
    if !status.success() || !bin.exists() {
        bail!("cargo build ({dir}) of headroom-agent failed ({status})");
    }
    Ok(bin)
}

/// Runs the agent with a manifest's container `args` (`NODE_NAME=node-a`,
/// no `KUBECONFIG`) on this machine, which has no host cgroup tree: it must
/// get past `what` (parsing, a policy file) and stop at cgroup discovery,
/// naming `/host/sys/fs/cgroup`.
pub fn assert_stops_at_the_host_cgroup_root(args: &[String], what: &str) {
    let out = Command::new(agent_binary().unwrap())
        .args(args)
        .env("NODE_NAME", "node-a")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("cgroup root /host/sys/fs/cgroup"),
        "agent did not get past {what}: {stderr}"
    );
}

/// A free loopback port (bound and released; good enough for tests).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Fast settings for tests: short tick, cooldown, audit and grace.
pub fn fast_args() -> Vec<String> {
    [
        "--tick",
        "200ms",
        "--raise-cooldown",
        "1s",
        "--audit-interval",
        "1s",
        "--drift-grace",
        "2s",
        "--event-interval",
        "1s",
        "--reserve",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// [`fast_args`] with some of its flags set to other values, e.g.
/// `fast_args_with(&[("--tick", "1s")])`. Panics on a flag `fast_args` does
/// not set: an override that silently adds a flag would hide a typo.
pub fn fast_args_with(overrides: &[(&str, &str)]) -> Vec<String> {
    let mut args = fast_args();
    for (flag, value) in overrides {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("fast_args does not set {flag}"));
        args[i + 1] = value.to_string();
    }
    args
}

/// [`fast_args`] with `extra` (flags, each with its value if it takes one):
/// a flag `fast_args` sets takes the new value (clap refuses a flag given
/// twice), any other is appended, e.g. `fast_args_plus(&["--dry-run"])`.
pub fn fast_args_plus(extra: &[&str]) -> Vec<String> {
    let mut args = fast_args();
    let mut it = extra.iter();
    while let Some(flag) = it.next() {
        match args.iter().position(|a| a == flag) {
            Some(at) if flag.starts_with("--") => {
                let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
                args[at + 1] = value.to_string();
            }
            _ => args.push(flag.to_string()),
        }
    }
    args
}

/// `RUST_LOG` of an agent started by a test.
pub const TEST_RUST_LOG: &str = "info,headroom=debug,headroom_agent=debug";

/// How to start `headroom-agent run`: built with [`Default`] and the
/// setters, e.g. `AgentOptions::default().node(n).cgroup_root(r)
/// .kubeconfig(k).log_dir(d).args(fast_args())`.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// The binary; `None`: the workspace's debug build ([`agent_binary`]).
    pub bin: Option<PathBuf>,
    /// `RUST_LOG`; `None`: [`TEST_RUST_LOG`].
    pub rust_log: Option<String>,
    pub kubeconfig: PathBuf,
    /// `--node-name`.
    pub node: String,
    /// `--cgroup-root`: the (simulated) node's cgroupfs.
    pub cgroup_root: PathBuf,
    /// Where the log file `agent-<node>-<port>.log` goes.
    pub log_dir: PathBuf,
    /// Flags after the fixed ones (node, cgroup root, kubeconfig, metrics address).
    pub args: Vec<String>,
}

impl AgentOptions {
    /// For the node `sim` simulates: its name and cgroup root.
    pub fn on(sim: &SimKubelet) -> Self {
        AgentOptions::default()
            .node(&sim.config().node_name)
            .cgroup_root(&sim.config().cgroup_root)
    }

    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = Some(bin.into());
        self
    }

    pub fn rust_log(mut self, filter: impl Into<String>) -> Self {
        self.rust_log = Some(filter.into());
        self
    }

    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig = path.into();
        self
    }

    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = name.into();
        self
    }

    pub fn cgroup_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.cgroup_root = root.into();
        self
    }

    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = dir.into();
        self
    }

    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }
}

pub struct AgentProcess {
    child: Option<Child>,
    pub metrics_port: u16,
    pub log_path: PathBuf,
    pub node: String,
}

impl AgentProcess {
    /// Starts `headroom-agent run` as `opts` say and waits until `/readyz`
    /// answers 200.
    pub async fn start(opts: AgentOptions) -> anyhow::Result<Self> {
        if opts.node.is_empty() || opts.kubeconfig.as_os_str().is_empty() {
            bail!("AgentOptions without a node or a kubeconfig: {opts:?}");
        }
        let bin = match opts.bin {
            Some(bin) => bin,
            None => agent_binary()?,
        };
        let node = opts.node;
        let metrics_port = free_port()?;
        let log_path = opts
            .log_dir
            .join(format!("agent-{node}-{metrics_port}.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .arg("--node-name")
            .arg(&node)
            .arg("--cgroup-root")
            .arg(&opts.cgroup_root)
            .arg("--kubeconfig")
            .arg(&opts.kubeconfig)
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(&opts.args)
            .env(
                "RUST_LOG",
                opts.rust_log.as_deref().unwrap_or(TEST_RUST_LOG),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = spawn_guarded(cmd).context("spawning headroom-agent")?;
        let mut a = AgentProcess {
            child: Some(child),
            metrics_port,
            log_path,
            node,
        };
        a.wait_ready(Duration::from_secs(60)).await?;
        Ok(a)
    }

    async fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!(
                    "agent exited ({status}) before ready:\n{}",
                    self.log_tail(40)
                );
            }
            if let Ok((200, _)) = self.get("/readyz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("agent not ready within {limit:?}:\n{}", self.log_tail(40));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET path` on the metrics port: (status, body).
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.metrics_port, path).await
    }

    /// `/metrics` text.
    pub async fn scrape(&self) -> anyhow::Result<String> {
        let (code, body) = self.get("/metrics").await?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(body)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn log_tail(&self, n: usize) -> String {
        crate::control_plane::log_tail(&self.log_path, n)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process is still running (not exited, not killed).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL at once (no shutdown path runs, as with the OOM killer or a
    /// node crash), then reap. The log file stays.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait (bounded), then SIGKILL.
    pub async fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        for _ in 0..50 {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `GET path` on `127.0.0.1:port`: (status, body), chunked bodies undone.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header end")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status code")?;
    // The server may answer chunked; undo it for the parser.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

pub(crate) fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].strip_prefix("\r\n").unwrap_or(&tail[n..]);
    }
    out
}

/// Samples of a scrape, parsed with a Prometheus text parser.
pub fn parse_metrics(text: &str) -> anyhow::Result<prometheus_parse::Scrape> {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .context("parsing /metrics")
}

/// Value of the sample `name` whose labels include all of `labels`
/// (summed when several match); `None` when no sample matches.
pub fn metric(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    let mut found = None;
    for s in scrape.samples.iter().filter(|s| s.metric == name) {
        if labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)) {
            let v = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => continue,
            };
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Pods of `ns` that have any per-pod series (a `headroom_*` sample with
/// `namespace` and `pod` labels).
pub fn pod_series(scrape: &prometheus_parse::Scrape, ns: &str) -> BTreeSet<String> {
    scrape
        .samples
        .iter()
        .filter(|x| x.metric.starts_with("headroom_") && x.labels.get("namespace") == Some(ns))
        .filter_map(|x| x.labels.get("pod").map(str::to_string))
        .collect()
}

/// Number of samples (series) in a `/metrics` text: its lines that are
/// neither comments nor blank.
pub fn series_count(text: &str) -> usize {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

/// Open file descriptors of a process (entries of `/proc/<pid>/fd`).
pub fn open_fds(pid: u32) -> std::io::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// inotify watches a process holds, over all its inotify fds (the
/// `inotify wd:` lines of `/proc/<pid>/fdinfo/<fd>`).
pub fn inotify_watches(pid: u32) -> std::io::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        let is_inotify =
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:inotify");
        if is_inotify {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))?;
            n += info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    Ok(n)
}
