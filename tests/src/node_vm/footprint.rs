//! A process's own cost inside a node VM, read from the guest's `/proc`
//! (for tests/benches/footprint_vm.rs): CPU time, read syscalls, RSS, and
//! the guest's load around it; and the floor program
//! (tests/tools/footprint-floor) built and run as a unit of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use super::{NodeVm, repo_root};

/// One reading of a guest process and of the guest, taken in one ssh session.
#[derive(Clone, Debug, Default)]
pub struct ProcSample {
    /// Guest `/proc/uptime`, seconds.
    pub uptime_s: f64,
    /// utime + stime of the process (all its threads), in clock ticks.
    pub cpu_ticks: u64,
    /// The guest's `CLK_TCK`.
    pub clk_tck: u64,
    /// `/proc/<pid>/io` `syscr`: read syscalls (`read`, `pread`, …) so far.
    pub syscr: u64,
    /// `VmRSS`, KiB.
    pub rss_kib: u64,
    pub threads: u64,
    pub fds: u64,
    /// The guest's CPUs, busy (all but idle and iowait) and in all, ticks.
    pub guest_busy: u64,
    pub guest_total: u64,
    /// The guest's `/proc/loadavg`, first three fields.
    pub loadavg: String,
}

impl ProcSample {
    /// Millicores the process used from `self` to `later`.
    pub fn millicores_to(&self, later: &ProcSample) -> f64 {
        let secs = later.uptime_s - self.uptime_s;
        let cpu = later.cpu_ticks.saturating_sub(self.cpu_ticks) as f64 / self.clk_tck as f64;
        cpu / secs * 1000.0
    }

    /// Read syscalls a second from `self` to `later`.
    pub fn reads_per_s_to(&self, later: &ProcSample) -> f64 {
        later.syscr.saturating_sub(self.syscr) as f64 / (later.uptime_s - self.uptime_s)
    }

    /// The guest's CPUs busy from `self` to `later`, % of all of them.
    pub fn guest_busy_pct_to(&self, later: &ProcSample) -> f64 {
        let total = later.guest_total.saturating_sub(self.guest_total).max(1);
        100.0 * later.guest_busy.saturating_sub(self.guest_busy) as f64 / total as f64
    }
}

/// Parses [`NodeVm::proc_sample`]'s output: `key value…` lines.
pub fn parse_sample(text: &str) -> anyhow::Result<ProcSample> {
    let mut s = ProcSample::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let num = |v: &str| v.trim().parse::<u64>().with_context(|| format!("{line:?}"));
        match key {
            "uptime" => {
                s.uptime_s = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .parse()
                    .with_context(|| format!("{line:?}"))?
            }
            // After the `(comm)`: field 3 (state) is [0], utime (14) [11], stime (15) [12].
            "stat" => {
                let after = rest.rsplit_once(") ").context("stat without (comm)")?.1;
                let f: Vec<&str> = after.split_whitespace().collect();
                anyhow::ensure!(f.len() > 12, "short stat {line:?}");
                s.cpu_ticks = num(f[11])? + num(f[12])?;
            }
            "clk_tck" => s.clk_tck = num(rest)?,
            "syscr" => s.syscr = num(rest)?,
            "VmRSS:" => s.rss_kib = num(rest.trim().trim_end_matches("kB"))?,
            "Threads:" => s.threads = num(rest)?,
            "fds" => s.fds = num(rest)?,
            // `cpu user nice system idle iowait irq softirq steal …`
            "cpu" => {
                let f: Vec<u64> = rest
                    .split_whitespace()
                    .map(|v| v.parse().unwrap_or(0))
                    .collect();
                anyhow::ensure!(f.len() >= 5, "short /proc/stat {line:?}");
                s.guest_total = f.iter().take(8).sum();
                s.guest_busy = s.guest_total - f[3] - f[4];
            }
            "loadavg" => {
                s.loadavg = rest
                    .split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" ")
            }
            _ => continue,
        }
        seen += 1;
    }
    anyhow::ensure!(
        seen >= 9 && s.clk_tck > 0,
        "incomplete sample ({seen} fields):\n{text}"
    );
    Ok(s)
}

impl NodeVm {
    /// The main pid of systemd unit `unit` in the guest; an error when it
    /// does not run.
    pub async fn unit_pid(&self, unit: &str) -> anyhow::Result<u32> {
        let out = self
            .sh(&format!("systemctl show -P MainPID {unit}"))
            .await?;
        match out.trim().parse::<u32>() {
            Ok(pid) if pid > 0 => Ok(pid),
            _ => bail!("{}: unit {unit} has no running process", self.name()),
        }
    }

    /// [`ProcSample`] of guest process `pid`, one ssh session.
    pub async fn proc_sample(&self, pid: u32) -> anyhow::Result<ProcSample> {
        let out = self
            .sh(&format!(
                "cd /proc/{pid} && echo \"stat $(cat stat)\" && grep -E '^(VmRSS|Threads):' status \
                 && sed -n 's/^syscr: /syscr /p' io && echo \"fds $(ls fd | wc -l)\" \
                 && echo \"clk_tck $(getconf CLK_TCK)\" && head -n 1 /proc/stat \
                 && echo \"loadavg $(cat /proc/loadavg)\" && echo \"uptime $(cat /proc/uptime)\""
            ))
            .await?;
        parse_sample(&out).with_context(|| format!("{}: pid {pid}", self.name()))
    }
}

/// The floor's modes: kept handles + `pread`, or open + read + close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorMode {
    Kept,
    Open,
}

impl FloorMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FloorMode::Kept => "kept",
            FloorMode::Open => "open",
        }
    }
}

/// Builds tests/tools/footprint-floor (std only) for the guest: a static
/// musl binary, with `rustc` alone (no crate to resolve), into the target
/// directory. Needs the `x86_64-unknown-linux-musl` target, which
/// scripts/static-build.sh installs.
pub fn build_floor() -> anyhow::Result<PathBuf> {
    let repo = repo_root();
    let src = repo.join("tests/tools/footprint-floor/main.rs");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"));
    let out = target.join("footprint-floor/footprint-floor");
    std::fs::create_dir_all(out.parent().context("out dir")?)?;
    let o = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .args([
            "--edition=2024",
            "--target=x86_64-unknown-linux-musl",
            "-Copt-level=s",
            "-Cpanic=abort",
            "-Cstrip=symbols",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .output()
        .context("running rustc")?;
    if !o.status.success() {
        bail!(
            "building {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(out)
}

/// The floor's systemd unit in the guest.
pub const FLOOR_UNIT: &str = "headroom-footprint-floor";

impl NodeVm {
    /// Copies the floor binary and the managed pods' uids into the share
    /// (`/mnt/node/footprint/`).
    pub fn install_floor(&self, binary: &Path, uids: &[String]) -> anyhow::Result<()> {
        let dir = self.share_dir().join("footprint");
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(binary, dir.join("footprint-floor"))?;
        std::fs::write(dir.join("uids"), uids.join("\n") + "\n")?;
        Ok(())
    }

    /// Starts the floor (installed by [`NodeVm::install_floor`]) as a
    /// transient unit on `kubepods` (absolute path); returns its pid and
    /// the line it printed (how many files a tick).
    pub async fn start_floor(
        &self,
        mode: FloorMode,
        kubepods: &str,
    ) -> anyhow::Result<(u32, String)> {
        self.stop_floor().await?;
        self.sh(&format!(
            "systemd-run --unit={FLOOR_UNIT} --collect \
             /mnt/node/footprint/footprint-floor {} {kubepods} /mnt/node/footprint/uids",
            mode.as_str()
        ))
        .await?;
        for _ in 0..30 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let log = self
                .sh(&format!(
                    "journalctl -u {FLOOR_UNIT} --no-pager -o cat | tail -n 5"
                ))
                .await?;
            if let Some(line) = log.lines().find(|l| l.contains("files a tick")) {
                let pid = self.unit_pid(FLOOR_UNIT).await?;
                return Ok((pid, line.to_string()));
            }
            if log.contains("footprint-floor: ") {
                bail!("{}: the floor failed:\n{log}", self.name());
            }
        }
        bail!("{}: the floor printed nothing in 30 s", self.name())
    }

    /// Stops the floor unit if it runs.
    pub async fn stop_floor(&self) -> anyhow::Result<()> {
        self.sh(&format!(
            "systemctl stop {FLOOR_UNIT} 2>/dev/null; systemctl reset-failed {FLOOR_UNIT} 2>/dev/null; true"
        ))
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_parses_and_gives_millicores() {
        let a = parse_sample(
            "stat 412 (headroom-agent) S 1 412 412 0 -1 4194560 900 0 0 0 150 50 0 0 20 0 3 0 9 1 2\n\
             VmRSS:\t   12000 kB\nThreads:\t3\nsyscr 1000\nfds 17\nclk_tck 100\n\
             cpu  100 0 100 700 100 0 0 0 0 0\nloadavg 0.50 0.40 0.30 2/100 999\n\
             uptime 100.00 150.00\n",
        )
        .unwrap();
        assert_eq!(
            (a.cpu_ticks, a.rss_kib, a.threads, a.fds),
            (200, 12000, 3, 17)
        );
        assert_eq!(
            (a.guest_busy, a.guest_total, a.loadavg.as_str()),
            (200, 1000, "0.50 0.40 0.30")
        );
        let mut b = a.clone();
        b.uptime_s = 160.0;
        b.cpu_ticks = 206;
        b.syscr = 1600;
        b.guest_busy = 300;
        b.guest_total = 1500;
        assert!((a.millicores_to(&b) - 1.0).abs() < 1e-9);
        assert!((a.reads_per_s_to(&b) - 10.0).abs() < 1e-9);
        assert!((a.guest_busy_pct_to(&b) - 20.0).abs() < 1e-9);
        assert!(parse_sample("uptime 1.0 2.0\n").is_err());
    }
}
