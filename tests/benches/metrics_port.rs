//! Memory of the RELEASE agent under connection floods on its metrics port:
//! RSS at rest, after 20,000 connection attempts, with 5,000 connections
//! held open, and after they are gone; and whether `/healthz` still answers
//! while they are held. Side by side for every binary given, so a build
//! from before the connection limits can be compared with the current one
//! in one run. Prints figures; asserts nothing.
//!
//! Run: `scripts/bench-metrics-port` (builds the before/after binaries), or
//! `cargo bench -p headroom-tests --bench metrics_port` for the current
//! build alone. Environment: `METRICS_PORT_BINARIES` = `label=path,...`
//! (default: `current=<release build>`), `METRICS_PORT_ATTEMPTS` (20000),
//! `METRICS_PORT_HELD` (5000).
//!
//! No apiserver is needed: the agent serves its port before its pod watch
//! syncs, and here it is pointed at a closed port, so it never syncs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CMD: &str = "cargo bench -p headroom-tests --bench metrics_port";
/// Half a request head: what a slow or hostile client leaves open.
const PARTIAL: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn binaries() -> anyhow::Result<Vec<(String, PathBuf)>> {
    match std::env::var("METRICS_PORT_BINARIES") {
        Ok(v) => v
            .split(',')
            .map(|kv| {
                let (k, p) = kv
                    .split_once('=')
                    .context("METRICS_PORT_BINARIES: label=path")?;
                Ok((k.to_string(), PathBuf::from(p)))
            })
            .collect(),
        Err(_) => Ok(vec![(
            "current".into(),
            testkit::agent::release_agent_binary()?,
        )]),
    }
}

fn rss_kib(pid: u32) -> (u64, u64) {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.status())
        .map(|s| (s.vmrss.unwrap_or(0), s.vmhwm.unwrap_or(0)))
        .unwrap_or((0, 0))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

struct Agent {
    child: Child,
    port: u16,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(bin: &Path, dir: &Path) -> anyhow::Result<Agent> {
    let port = testkit::agent::free_port()?;
    let kubeconfig = dir.join("dead.kubeconfig");
    // A server nobody listens on: the watch retries, the port is served.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n\
         users:\n- name: u\n  user:\n    token: x\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
         current-context: c\n",
    )?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cgroup-fixtures/kind/root");
    let child = Command::new(bin)
        .args(["run", "--node-name", "bench", "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--cgroup-root")
        .arg(root)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Agent { child, port })
}

/// `GET path` with a deadline: the status code, or why there is none.
async fn get(port: u16, path: &str, limit: Duration) -> Result<u16, String> {
    let exchange = async {
        let mut s = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&buf);
        text.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| {
                format!(
                    "no status in {:?}",
                    text.chars().take(40).collect::<String>()
                )
            })
    };
    tokio::time::timeout(limit, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {limit:?}")))
}

async fn wait_healthy(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if get(port, "/healthz", Duration::from_secs(1)).await == Ok(200) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("agent not healthy within 30 s")
}

/// Opens a connection and sends half a request head; `None` if refused.
async fn open_partial(port: u16) -> Option<TcpStream> {
    let mut s = tokio::time::timeout(
        Duration::from_secs(5),
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .ok()?
    .ok()?;
    s.write_all(PARTIAL).await.ok()?;
    Some(s)
}

/// `n` connections, `batch` at a time; keeps the ones that opened.
async fn open_many(port: u16, n: usize, batch: usize) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    let mut left = n;
    while left > 0 {
        let k = left.min(batch);
        let opened = futures::future::join_all((0..k).map(|_| open_partial(port))).await;
        out.extend(opened.into_iter().flatten());
        left -= k;
    }
    out
}

/// Of `conns`, how many the server has not closed (non-blocking reads:
/// nothing to read means open).
fn still_open(conns: &[TcpStream]) -> usize {
    let mut b = [0u8; 1];
    conns
        .iter()
        .filter(
            |s| matches!(s.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        )
        .count()
}

#[derive(Default)]
struct Row {
    rest: u64,
    after_attempts: u64,
    held: u64,
    held_open: usize,
    healthz: String,
    released: u64,
    hwm: u64,
}

async fn measure(bin: &Path, dir: &Path, attempts: usize, held: usize) -> anyhow::Result<Row> {
    let a = start(bin, dir)?;
    let pid = a.child.id();
    wait_healthy(a.port).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut row = Row {
        rest: rss_kib(pid).0,
        ..Default::default()
    };
    // Churn: open, half a head, close; 500 at a time.
    let mut left = attempts;
    while left > 0 {
        let k = left.min(500);
        drop(open_many(a.port, k, k).await);
        left -= k;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    row.after_attempts = rss_kib(pid).0;
    // Held: all open at once.
    let conns = open_many(a.port, held, 250).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    row.held = rss_kib(pid).0;
    // The kubelet's probe timeout is 1 s by default.
    row.healthz = match get(a.port, "/healthz", Duration::from_secs(1)).await {
        Ok(code) => code.to_string(),
        Err(e) => e,
    };
    row.held_open = still_open(&conns);
    drop(conns);
    tokio::time::sleep(Duration::from_secs(3)).await;
    (row.released, row.hwm) = rss_kib(pid);
    Ok(row)
}

fn main() -> anyhow::Result<()> {
    let bins = binaries()?;
    let attempts = env_usize("METRICS_PORT_ATTEMPTS", 20_000);
    let held = env_usize("METRICS_PORT_HELD", 5_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    println!("# {CMD}  ({attempts} attempts, {held} held)");
    let mut rows = Vec::new();
    for (label, bin) in &bins {
        println!("measuring {label}: {}", bin.display());
        rows.push((
            label,
            rt.block_on(measure(bin, dir.path(), attempts, held))?,
        ));
    }
    println!(
        "\n| binary | RSS at rest | after {attempts} attempts | {held} held | held open by the agent | /healthz while held | after release | peak |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, r) in rows {
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} | {} |",
            mib(r.rest),
            mib(r.after_attempts),
            mib(r.held),
            r.held_open,
            r.healthz,
            mib(r.released),
            mib(r.hwm)
        );
    }
    Ok(())
}
