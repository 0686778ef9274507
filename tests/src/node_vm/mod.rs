//! Real nodes: Debian VMs under QEMU (TCG) running a real kubelet v1.37,
//! containerd and runc on a real Linux kernel with cgroup v2, joined to the
//! test control plane on the host's loopback.
//!
//! - The control plane stays on the host (native speed, one for every node,
//!   and the same harness as the other tiers); guests reach it through a
//!   QEMU guest forward at `10.0.2.100:6443`. kube-controller-manager and
//!   kube-scheduler run too ([`ControlPlaneOptions::full_cluster`]).
//! - One image for every node (`tests/node-vm/build.sh`); each node's config
//!   (kubelet config, driver, certificates) arrives at boot through a 9p share.
//! - VMs are spawned with [`crate::process::spawn_guarded`]: they die with
//!   the test binary however it ends.
//!
//! Environment: `HEADROOM_CACHE_DIR` as for the control plane,
//! `HEADROOM_NODE_READY_TIMEOUT_SECS` (default 420), `HEADROOM_KEEP_VM_DIR=1`,
//! `HEADROOM_NODE_SUITES` (which Debian suite each shared node boots, see
//! [`RealCluster::two_node_specs`]).

pub mod config;
pub mod daemonset;
pub mod egress;
pub mod footprint;
pub mod guest;
pub mod health;
pub mod install;
pub mod qemu;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::control_plane::{ControlPlane, ControlPlaneOptions, log_tail};
use crate::process::{kill_at_exit, spawn_guarded};
pub use config::{CgroupDriver, NodeSpec, Suite};
pub use guest::{GuestAgent, NodeVersions, PodCpuMax, container_ids};

/// The agent's metrics port inside a guest, forwarded to a host port.
pub const GUEST_AGENT_PORT: u16 = 9100;

/// Built artifacts: the VM image of each suite built, and the read-only host share.
#[derive(Clone, Debug)]
pub struct Artifacts {
    pub images: Vec<(Suite, PathBuf)>,
    pub share_dir: PathBuf,
}

fn cache_dir() -> PathBuf {
    crate::control_plane::bin_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".cache"))
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The `main` of a bench on the node VMs (`cargo bench` passes `--bench`;
/// nothing else is read from the command line): settings from the
/// environment (exit 2 on a bad one), exit 2 where the tier cannot run
/// ([`skip_reason`]), else `bench` on a 2-thread runtime (exit 1 when it
/// fails). `name` prefixes every line it prints.
pub fn bench_main<S, Fut>(name: &str, settings: anyhow::Result<S>, bench: impl FnOnce(S) -> Fut)
where
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let s = match settings {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            std::process::exit(2);
        }
    };
    if let Some(why) = skip_reason() {
        eprintln!("{name}: cannot run: {why}");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(bench(s)) {
        eprintln!("{name}: FAILED: {e:#}");
        std::process::exit(1);
    }
}

/// Why the real-node tier cannot run here, if it cannot: only a machine
/// without qemu at all skips. Everything else is a failure.
pub fn skip_reason() -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("qemu-system-x86_64").is_file()))
        .unwrap_or(false);
    (!found).then(|| {
        "qemu-system-x86_64 is not installed (tests/node-vm/build.sh installs it)".to_string()
    })
}

impl Artifacts {
    /// The artifacts `tests/node-vm/build.sh` made: the share and the image
    /// of every suite named by `node-vm/current-<suite>`; an error says to
    /// run it. A suite not built is an error only when a node asks for it
    /// ([`Artifacts::image_dir`]).
    pub fn locate() -> anyhow::Result<Artifacts> {
        let version = Command::new("qemu-system-x86_64")
            .arg("--version")
            .output()
            .context("running qemu-system-x86_64 --version")?;
        qemu::check_qemu_version(&String::from_utf8_lossy(&version.stdout))
            .map_err(|e| anyhow::anyhow!(e))?;
        let root = cache_dir().join("node-vm");
        let share_dir = root.join("share");
        for f in [
            share_dir.join("bin/kubelet"),
            share_dir.join("images/pause.tar"),
        ] {
            if !f.is_file() {
                bail!("{} missing: run tests/node-vm/build.sh", f.display());
            }
        }
        let mut images = Vec::new();
        for suite in Suite::ALL {
            let current = root.join(format!("current-{}", suite.as_str()));
            let Ok(dir) = std::fs::read_to_string(&current) else {
                continue;
            };
            let image_dir = PathBuf::from(dir.trim());
            for f in ["disk.img", "vmlinuz", "initrd.img", "id_ed25519"] {
                if !image_dir.join(f).is_file() {
                    bail!(
                        "{} missing: run tests/node-vm/build.sh",
                        image_dir.join(f).display()
                    );
                }
            }
            images.push((suite, image_dir));
        }
        Ok(Artifacts { images, share_dir })
    }

    /// The image directory of `suite`, or an error saying how to build it.
    pub fn image_dir(&self, suite: Suite) -> anyhow::Result<&Path> {
        self.images
            .iter()
            .find(|(s, _)| *s == suite)
            .map(|(_, d)| d.as_path())
            .with_context(|| {
                format!(
                    "no {} node image (node-vm/current-{} missing): run tests/node-vm/build.sh",
                    suite.as_str(),
                    suite.as_str()
                )
            })
    }
}

/// The static (musl) agent, built by `scripts/static-build.sh` (a no-op when fresh).
pub fn static_agent_binary() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let repo = repo_root();
            let mut cmd = Command::new("bash");
            let status = crate::agent::clean_cargo_env(&mut cmd)
                .arg(repo.join("scripts/static-build.sh"))
                .stdout(Stdio::null())
                .status()
                .map_err(|e| format!("running scripts/static-build.sh: {e}"))?;
            if !status.success() {
                return Err(format!("scripts/static-build.sh failed ({status})"));
            }
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo.join("target"));
            Ok(target.join("x86_64-unknown-linux-musl/release/headroom-agent"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The agent's image as a Docker archive, built by `scripts/build-image.sh`
/// from the static binary (a no-op when fresh): `$HEADROOM_CACHE_DIR/images/headroom-agent.tar`.
pub fn agent_image() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = cache_dir().join("images/headroom-agent.tar");
            let mut cmd = Command::new("bash");
            let status = crate::agent::clean_cargo_env(&mut cmd)
                .arg(repo_root().join("scripts/build-image.sh"))
                .arg("--out")
                .arg(&out)
                .stdout(Stdio::null())
                .status()
                .map_err(|e| format!("running scripts/build-image.sh: {e}"))?;
            if !status.success() {
                return Err(format!("scripts/build-image.sh failed ({status})"));
            }
            Ok(out)
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One booted node VM.
pub struct NodeVm {
    pub spec: NodeSpec,
    dir: PathBuf,
    qemu: Mutex<Option<Child>>,
    /// qemu's command line, kept for a reboot.
    launch: qemu::VmLaunch,
    ssh_port: u16,
    agent_port: u16,
    ssh_key: PathBuf,
    booted_at: Instant,
    /// Boots so far: 1, or 2 after a [`BootFault`] (or a reboot).
    boots: std::sync::atomic::AtomicU32,
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Starts qemu with `launch`, its output appended to `dir/qemu.log`.
fn spawn_qemu(launch: &qemu::VmLaunch, dir: &Path) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("qemu.log"))?;
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(launch.args())
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        // qemu's snapshot overlay goes to TMPDIR: keep it with the VM.
        .env("TMPDIR", dir);
    spawn_guarded(cmd).context("spawning qemu-system-x86_64")
}

impl NodeVm {
    /// Writes this node's config share and starts qemu. Does not wait.
    pub fn boot(cp: &ControlPlane, spec: NodeSpec, art: &Artifacts) -> anyhow::Result<NodeVm> {
        let image_dir = art.image_dir(spec.suite)?.to_path_buf();
        let dir = tempfile::Builder::new()
            .prefix(&format!("headroom-vm-{}-", spec.name))
            .tempdir()?
            .keep();
        let share = dir.join("node");
        let k8s = share.join("etc/kubernetes");
        write(&share.join("node.env"), &config::node_env(&spec))?;
        write(&k8s.join("ca.crt"), cp.ca_pem())?;
        let (cert, key) =
            cp.client_cert(&format!("system:node:{}", spec.name), &["system:nodes"])?;
        write(&k8s.join("kubelet.crt"), &cert)?;
        write(&k8s.join("kubelet.key"), &key)?;
        write(
            &k8s.join("kubelet.kubeconfig"),
            &config::guest_kubeconfig(
                &format!("system:node:{}", spec.name),
                "/etc/kubernetes/kubelet.crt",
                "/etc/kubernetes/kubelet.key",
            ),
        )?;
        // The agent run as a process in the guest authenticates as admin;
        // the DaemonSet install uses its own ServiceAccount instead.
        let (cert, key) = cp.client_cert(crate::certs::ADMIN_CN, &[crate::certs::ADMIN_GROUP])?;
        write(&k8s.join("admin.crt"), &cert)?;
        write(&k8s.join("admin.key"), &key)?;
        write(
            &k8s.join("admin.kubeconfig"),
            &config::guest_kubeconfig(
                crate::certs::ADMIN_CN,
                "/etc/kubernetes/admin.crt",
                "/etc/kubernetes/admin.key",
            ),
        )?;
        write(&k8s.join("kubelet.yaml"), &config::kubelet_config(&spec))?;
        // The kubelet's staticPodPath, copied into the guest's /etc, empty.
        std::fs::create_dir_all(share.join(config::STATIC_POD_PATH.trim_start_matches('/')))?;
        write(
            &share.join("etc/containerd/config.toml"),
            &config::containerd_config(&spec),
        )?;
        write(
            &share.join("etc/cni/net.d/10-headroom.conflist"),
            &config::cni_config(&spec),
        )?;
        std::fs::create_dir_all(share.join("bin"))?;
        std::fs::create_dir_all(share.join("images"))?;

        let ssh_port = free_port()?;
        let agent_port = free_port()?;
        let mut launch = qemu::VmLaunch {
            name: spec.name.clone(),
            cpus: spec.cpus,
            memory_mib: spec.memory_mib,
            kernel: image_dir.join("vmlinuz"),
            initrd: image_dir.join("initrd.img"),
            disk: image_dir.join("disk.img"),
            overlay: None,
            host_share: art.share_dir.clone(),
            node_share: share,
            console_log: dir.join("console.log"),
            qmp_socket: health::qmp_socket(&dir),
            host_forwards: vec![(ssh_port, 22), (agent_port, GUEST_AGENT_PORT)],
            apiserver_port: cp.port(),
            extra_append: String::new(),
        };
        if spec.persistent_disk {
            let overlay = dir.join("disk.qcow2");
            let out = Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
                .arg(&launch.disk)
                .arg(&overlay)
                .output()
                .context("running qemu-img")?;
            if !out.status.success() {
                bail!(
                    "qemu-img create {}: {}",
                    overlay.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            launch.overlay = Some(overlay);
        }
        let first = qemu::VmLaunch {
            extra_append: spec.first_boot_fault.clone().unwrap_or_default(),
            ..launch.clone()
        };
        let child = spawn_qemu(&first, &dir)?;
        health::register(&spec.name, &dir);
        Ok(NodeVm {
            spec,
            dir,
            qemu: Mutex::new(Some(child)),
            launch,
            ssh_port,
            agent_port,
            ssh_key: image_dir.join("id_ed25519"),
            booted_at: Instant::now(),
            boots: 1.into(),
        })
    }

    /// Boots of this node so far (1 unless it was booted again or rebooted).
    pub fn boots(&self) -> u32 {
        self.boots.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The running qemu's pid (a reboot starts another); `None` once killed.
    pub fn qemu_pid(&self) -> Option<u32> {
        self.qemu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// Reboots the guest and waits for ssh; returns the time from the
    /// reboot to ssh. qemu runs with `-no-reboot`, so the guest's reset
    /// ends it; it is started again with the same command line, ports and
    /// disk overlay (the node needs `persistent_disk`: a throwaway snapshot
    /// would come back as a new, empty node). The first boot's console is
    /// kept as `console-before-reboot.log`.
    pub async fn reboot(&self, deadline: Instant) -> anyhow::Result<Duration> {
        anyhow::ensure!(
            self.launch.overlay.is_some(),
            "{}: a reboot needs a persistent disk (NodeSpec::persistent_disk)",
            self.spec.name
        );
        let at = Instant::now();
        // The session ends with the guest: its exit status says nothing.
        let _ = self.sh_output("systemctl reboot").await;
        loop {
            let exited = {
                let mut q = self.qemu.lock().unwrap_or_else(|p| p.into_inner());
                match q.as_mut() {
                    Some(c) => c.try_wait()?.is_some(),
                    None => bail!("{}: qemu was killed", self.spec.name),
                }
            };
            if exited {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: qemu still runs {:?} after `systemctl reboot`\n{}",
                    self.spec.name,
                    at.elapsed(),
                    self.diagnose()
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        eprintln!(
            "MEASURE {} reboot: the guest went down {:.1?} after `systemctl reboot`",
            self.spec.name,
            at.elapsed()
        );
        let console = self.dir.join("console.log");
        let _ = std::fs::rename(&console, self.dir.join("console-before-reboot.log"));
        let child = spawn_qemu(&self.launch, &self.dir)?;
        *self.qemu.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.boots
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.wait_ssh(deadline).await?;
        Ok(at.elapsed())
    }

    /// Host directory shared read-only at /mnt/node in the guest: files put
    /// here appear there (e.g. `bin/headroom-agent`).
    pub fn share_dir(&self) -> PathBuf {
        self.dir.join("node")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Host loopback port forwarded to the agent's metrics port in the guest.
    pub fn agent_port(&self) -> u16 {
        self.agent_port
    }

    /// vCPU state (or qemu not answering), the host's disk, memory and load, the console's tail.
    pub fn diagnose(&self) -> String {
        health::diagnose(&self.spec.name, &self.dir)
    }

    pub fn console_tail(&self, n: usize) -> String {
        log_tail(&self.dir.join("console.log"), n)
    }

    /// ssh options every session to this guest shares: its key and port, no
    /// host-key bookkeeping, never a prompt, the shared control socket.
    fn ssh_args(&self) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = vec!["-i".into(), self.ssh_key.clone().into()];
        for s in [
            "-p",
            &self.ssh_port.to_string(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "-o",
            "ServerAliveInterval=15",
            "-o",
        ] {
            a.push(s.into());
        }
        a.push(format!("ControlPath={}", self.dir.join("ssh.sock").display()).into());
        a
    }

    fn ssh_command(&self, remote: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ssh");
        cmd.args(self.ssh_args())
            .args(["-o", "ConnectTimeout=20"])
            .args(["root@127.0.0.1", remote])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `remote` (a shell command line) in the guest; fails on a non-zero exit.
    pub async fn sh(&self, remote: &str) -> anyhow::Result<String> {
        let out = self.sh_output(remote).await?;
        // 255 is ssh's own failure (no connection, no banner): say why the
        // node does not answer, not only that it does not.
        if out.status.code() == Some(255) {
            bail!(
                "on {}: `{remote}`: ssh failed: {}\n{}",
                self.spec.name,
                String::from_utf8_lossy(&out.stderr).trim(),
                self.diagnose()
            );
        }
        if !out.status.success() {
            bail!(
                "on {}: `{remote}` exited {}: {}{}",
                self.spec.name,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `remote` in the guest and returns its output whatever the exit.
    pub async fn sh_output(&self, remote: &str) -> anyhow::Result<Output> {
        let out = tokio::time::timeout(Duration::from_secs(180), self.ssh_command(remote).output())
            .await
            .map_err(|_| {
                anyhow!(
                    "on {}: `{remote}` timed out\n{}",
                    self.spec.name,
                    self.diagnose()
                )
            })?
            .with_context(|| format!("running ssh to {}", self.spec.name))?;
        Ok(out)
    }

    /// The guest kernel's failure on the console, as a boot fault.
    fn kernel_fault(&self) -> Option<BootFault> {
        let console = std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default();
        let line = health::kernel_failure(&console)?;
        Some(BootFault(format!(
            "{}: the guest kernel failed {:.0?} into its boot, before ssh came up: {line}\nconsole:\n{}",
            self.spec.name,
            self.booted_at.elapsed(),
            self.console_tail(30)
        )))
    }

    /// The kubelet that will not start this boot: not running, no start job
    /// queued for it (a unit it requires failed: the host share's 9p mount
    /// failed 21.8 s into one boot, 2026-12-07, and the cluster waited its
    /// whole 420 s for Ready), as a boot fault.
    async fn kubelet_fault(&self) -> Option<BootFault> {
        let out = self
            .sh("echo $(systemctl is-active kubelet.service) \
                 $(systemctl list-jobs --no-legend --plain kubelet.service | wc -l)")
            .await
            .ok()?;
        if !kubelet_dead(&out) {
            return None;
        }
        // The units it needs, not the boot's warnings (kernel noise): a mount
        // that failed and was mounted again later by headroom-node-setup is
        // no longer a failed unit, but its journal and the kubelet's
        // "Dependency failed" say what happened.
        let why = self
            .sh("systemctl --failed --no-legend --plain; \
                 journalctl -b --no-pager -o short-monotonic -u kubelet.service \
                 -u mnt-host.mount -u mnt-node.mount -u headroom-node.service \
                 -u containerd.service -u headroom-images.service | tail -n 20")
            .await
            .unwrap_or_else(|e| format!("<systemctl: {e:#}>"));
        Some(BootFault(format!(
            "{}: the kubelet will not start this boot ({}; no start job queued); failed units, and the journal of the units it needs:\n{why}",
            self.spec.name,
            out.trim()
        )))
    }

    /// Kills qemu and boots the same launch again, the first boot's console
    /// kept beside (`console-first-boot.log`). A snapshot disk starts clean.
    fn boot_again(&self) -> anyhow::Result<()> {
        self.kill();
        let _ = std::fs::rename(
            self.dir.join("console.log"),
            self.dir.join("console-first-boot.log"),
        );
        // A master connection to the first boot's guest is gone with it.
        let _ = std::fs::remove_file(self.dir.join("ssh.sock"));
        let child = spawn_qemu(&self.launch, &self.dir)?;
        *self.qemu.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.boots
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// ssh, then Node Ready, by `deadline`; a [`BootFault`] boots the node
    /// once more, with a deadline of its own. Returns (ssh, Ready) after
    /// qemu first started.
    async fn come_up(
        &self,
        client: &kube::Client,
        deadline: Instant,
    ) -> anyhow::Result<(Duration, Duration)> {
        let first = async {
            let ssh = self.wait_ssh(deadline).await?;
            self.wait_ready(client, deadline).await?;
            Ok::<_, anyhow::Error>(ssh)
        }
        .await;
        let ssh = match first {
            Ok(ssh) => ssh,
            Err(e) => {
                let Some(fault) = e.downcast_ref::<BootFault>() else {
                    return Err(e);
                };
                eprintln!(
                    "BOOT AGAIN {}: a fault of the emulated machine, not of the node under test:\n{fault}",
                    self.spec.name
                );
                self.boot_again()?;
                let deadline = Instant::now() + ready_timeout();
                let ssh = self
                    .wait_ssh(deadline)
                    .await
                    .context("the second boot (one fault already)")?;
                self.wait_ready(client, deadline)
                    .await
                    .context("the second boot (one fault already)")?;
                ssh
            }
        };
        Ok((ssh, self.booted_at.elapsed()))
    }

    fn check_alive(&self) -> anyhow::Result<()> {
        let mut q = self.qemu.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(child) = q.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!(
                "qemu for {} exited ({status}); qemu log:\n{}\nconsole:\n{}",
                self.spec.name,
                log_tail(&self.dir.join("qemu.log"), 20),
                self.console_tail(40)
            );
        }
        Ok(())
    }

    /// Waits for ssh, then holds a master connection every later command reuses.
    /// A guest kernel that failed before ssh came up (a panic, an oops, a
    /// stall on the console) fails at once, as a [`BootFault`].
    pub async fn wait_ssh(&self, deadline: Instant) -> anyhow::Result<Duration> {
        loop {
            if let Err(e) = self.check_alive() {
                return Err(self.kernel_fault().map_or(e, anyhow::Error::new));
            }
            if let Ok(out) = self.sh_output("true").await
                && out.status.success()
            {
                break;
            }
            if let Some(fault) = self.kernel_fault() {
                return Err(anyhow::Error::new(fault));
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: no ssh after {:?}; console:\n{}",
                    self.spec.name,
                    self.booted_at.elapsed(),
                    self.console_tail(60)
                );
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let up = self.booted_at.elapsed();
        let mut master = std::process::Command::new("ssh");
        master
            .args(self.ssh_args())
            .args(["-o", "ControlMaster=yes"])
            .args(["-N", "root@127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let master = spawn_guarded(master)?;
        kill_at_exit(vec![master.id()], None);
        std::mem::forget(master);
        self.check_cfs_bandwidth_key().await?;
        Ok(up)
    }

    /// Fails at once on a guest whose CFS bandwidth key is not held on from
    /// boot (an image from before headroom-cfs-bandwidth-key, or the unit
    /// failed): on such a guest the first pod with a CPU limit patches the
    /// scheduler's code under emulation, which can panic or livelock it
    /// minutes later (docs/development.md, "Guest kernels under emulation").
    async fn check_cfs_bandwidth_key(&self) -> anyhow::Result<()> {
        let max = self
            .sh("cat /sys/fs/cgroup/headroom-cfs-bandwidth-key/cpu.max 2>&1 || true")
            .await?;
        if !cfs_key_pinned(&max) {
            bail!(
                "{}: the CFS bandwidth key is not pinned on (cpu.max of \
                 /sys/fs/cgroup/headroom-cfs-bandwidth-key: {:?}); rebuild the \
                 node image (tests/node-vm/build-rootfs.sh)",
                self.spec.name,
                max.trim()
            );
        }
        Ok(())
    }

    /// Waits for the Node object to be Ready.
    pub async fn wait_ready(&self, client: &kube::Client, deadline: Instant) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let mut poll = 0u32;
        loop {
            self.check_alive()?;
            poll += 1;
            // Every 10 s: a kubelet that will not start fails now, not at
            // the deadline.
            if poll.is_multiple_of(5)
                && let Some(fault) = self.kubelet_fault().await
            {
                return Err(anyhow::Error::new(fault));
            }
            if let Ok(Some(node)) = nodes.get_opt(&self.spec.name).await {
                let ready = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .map(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                    .unwrap_or(false);
                if ready {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let journal = self
                    .sh("journalctl -u kubelet -u containerd -u headroom-node -u headroom-images --no-pager -o short-monotonic \
                         | grep -E ' E[0-9]{4} |level=error|Failed|failed' | grep -v 'FLAG:' | tail -n 25; \
                         journalctl -u kubelet --no-pager | tail -n 8")
                    .await
                    .unwrap_or_else(|e| format!("<journal: {e:#}>"));
                bail!(
                    "{}: Node not Ready after {:?}; journal:\n{journal}",
                    self.spec.name,
                    self.booted_at.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Kills qemu now (the snapshot disk is thrown away).
    pub fn kill(&self) {
        let mut q = self.qemu.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut c) = q.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NodeVm {
    fn drop(&mut self) {
        self.kill();
        health::unregister(&self.dir);
        if std::env::var_os("HEADROOM_KEEP_VM_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A boot that failed for a reason of the emulated machine, not of the node
/// under test: the guest kernel failed before ssh came up, or the kubelet
/// will not start because a unit it requires failed at boot. Another boot of
/// the same image came up each time; [`RealCluster::start`] tries one.
#[derive(Debug)]
pub struct BootFault(pub String);

impl std::fmt::Display for BootFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BootFault {}

/// `systemctl is-active kubelet.service` and the count of its queued jobs:
/// stopped (inactive or failed) with no start job queued.
fn kubelet_dead(state_and_jobs: &str) -> bool {
    let mut f = state_and_jobs.split_whitespace();
    matches!(
        (f.next(), f.next().map(str::parse::<u32>)),
        (Some("inactive" | "failed"), Some(Ok(0)))
    )
}

/// A `cpu.max` that holds a quota ("<quota> <period>"), not "max" and not an
/// error message: the key is on while this cgroup exists.
fn cfs_key_pinned(cpu_max: &str) -> bool {
    let mut f = cpu_max.split_whitespace();
    matches!(
        (f.next().map(str::parse::<u64>), f.next().map(str::parse::<u64>), f.next()),
        (Some(Ok(q)), Some(Ok(p)), None) if q > 0 && p > 0
    )
}

fn ready_timeout() -> Duration {
    Duration::from_secs(
        std::env::var("HEADROOM_NODE_READY_TIMEOUT_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(420),
    )
}

/// A control plane with kube-controller-manager and kube-scheduler, and node VMs.
pub struct RealCluster {
    pub cp: ControlPlane,
    /// The API server's route to pod IPs (pod proxy), through each VM.
    pub egress: egress::EgressProxy,
    pub nodes: Vec<NodeVm>,
    /// qemu start → ssh, and → Node Ready, per node.
    pub boot_times: Vec<(String, Duration, Duration)>,
}

impl RealCluster {
    /// Starts the control plane, boots `specs` in parallel and waits until every
    /// node is Ready.
    pub async fn start(specs: Vec<NodeSpec>) -> anyhow::Result<RealCluster> {
        let art = Artifacts::locate()?;
        let egress_dir = tempfile::Builder::new()
            .prefix("headroom-egress-")
            .tempdir()?
            .keep();
        kill_at_exit(vec![], Some(egress_dir.clone()));
        let egress = egress::EgressProxy::start(&egress_dir.join("egress.sock"))?;
        let egress_config = egress_dir.join("egress-selector.yaml");
        write(&egress_config, &egress.apiserver_config())?;
        let cp = ControlPlane::start(ControlPlaneOptions {
            full_cluster: true,
            extra_args: vec![format!(
                "--egress-selector-config-file={}",
                egress_config.display()
            )],
            ..ControlPlaneOptions::default()
        })
        .await?;
        let mut nodes = Vec::new();
        for spec in specs {
            let node = NodeVm::boot(&cp, spec, &art)?;
            egress.add_route(&node.spec.pod_cidr, node.ssh_args())?;
            nodes.push(node);
        }
        let deadline = Instant::now() + ready_timeout();
        let client = cp.client().await;
        let waits = nodes.iter().map(|n| {
            let client = client.clone();
            async move {
                let (ssh, ready) = n.come_up(&client, deadline).await?;
                Ok::<_, anyhow::Error>((n.name().to_string(), ssh, ready))
            }
        });
        let results = futures::future::join_all(waits).await;
        let errors: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(|e| format!("{e:#}")))
            .collect();
        if !errors.is_empty() {
            bail!("{}", errors.join("\n\n"));
        }
        let boot_times: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
        for (name, ssh, ready) in &boot_times {
            eprintln!("real node {name}: ssh after {ssh:.1?}, Ready after {ready:.1?}");
        }
        Ok(RealCluster {
            cp,
            egress,
            nodes,
            boot_times,
        })
    }

    /// The two nodes the project promises to work on: systemd driver under a
    /// kind-like `/kubelet` cgroupRoot on Debian trixie (Linux 6.12,
    /// containerd 1.7, systemd 257: what current production nodes run), and
    /// the cgroupfs driver on Debian bookworm (Linux 6.1, containerd 1.6).
    /// Every test runs on both, so both kernels pass every real-node test at
    /// no extra cost; `HEADROOM_NODE_SUITES=node-systemd=bookworm,node-cgroupfs=trixie`
    /// swaps them (`scripts/test --full` runs the tier both ways, so a
    /// difference can be told apart from the driver's).
    pub fn two_node_specs() -> anyhow::Result<Vec<NodeSpec>> {
        let mut specs = vec![
            NodeSpec::kind_like("node-systemd", 1).with_suite(Suite::Trixie),
            NodeSpec::cgroupfs("node-cgroupfs", 2).with_suite(Suite::Bookworm),
        ];
        let text = std::env::var("HEADROOM_NODE_SUITES").unwrap_or_default();
        for (node, suite) in config::suite_overrides(&text).map_err(|e| anyhow!(e))? {
            let spec = specs
                .iter_mut()
                .find(|s| s.name == node)
                .with_context(|| format!("HEADROOM_NODE_SUITES names no node {node:?}"))?;
            spec.suite = suite;
        }
        Ok(specs)
    }

    /// One cluster shared by every test of a test binary, started on first
    /// use on a thread and runtime of its own (like the shared control plane).
    /// `Err` carries the reason (a skip or a failure) for every caller.
    pub fn shared() -> Result<&'static RealCluster, String> {
        static SHARED: OnceLock<Result<RealCluster, String>> = OnceLock::new();
        let res = SHARED.get_or_init(|| {
            if let Some(why) = skip_reason() {
                return Err(format!("SKIP: {why}"));
            }
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async { RealCluster::start(RealCluster::two_node_specs()?).await })
                    .map_err(|e| format!("{e:#}"))
            })
            .join()
            .unwrap_or_else(|_| Err("real cluster start-up thread panicked".into()))
            .map(|mut c| {
                c.leak_to_exit();
                c
            })
        });
        res.as_ref().map_err(|e| e.clone())
    }

    fn leak_to_exit(&mut self) {
        let pids: Vec<u32> = self.nodes.iter().filter_map(NodeVm::qemu_pid).collect();
        let keep = std::env::var_os("HEADROOM_KEEP_VM_DIR").is_some();
        for n in &self.nodes {
            kill_at_exit(vec![], (!keep).then(|| n.dir.clone()));
        }
        kill_at_exit(pids, None);
    }

    pub fn node(&self, name: &str) -> &NodeVm {
        self.nodes
            .iter()
            .find(|n| n.name() == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }
}

#[cfg(test)]
mod cfs_key_tests {
    use super::{cfs_key_pinned, kubelet_dead};

    #[test]
    fn a_kubelet_is_dead_only_when_stopped_with_no_start_job_queued() {
        assert!(kubelet_dead("inactive 0\n"));
        assert!(kubelet_dead("failed 0"));
        // Queued behind containerd or the image import: it will start.
        assert!(!kubelet_dead("inactive 1"));
        assert!(!kubelet_dead("activating 0"));
        assert!(!kubelet_dead("active 0"));
        // Between two restarts (Restart=always).
        assert!(!kubelet_dead("activating 1"));
        // ssh printed nothing useful: not a verdict.
        assert!(!kubelet_dead(""));
        assert!(!kubelet_dead("inactive"));
        assert!(!kubelet_dead("inactive x"));
    }

    #[test]
    fn a_quota_pins_the_key_and_max_or_an_error_does_not() {
        assert!(cfs_key_pinned("100000000 100000\n"));
        assert!(!cfs_key_pinned("max 100000\n"));
        assert!(!cfs_key_pinned(
            "cat: /sys/fs/cgroup/headroom-cfs-bandwidth-key/cpu.max: No such file or directory\n"
        ));
        assert!(!cfs_key_pinned(""));
        assert!(!cfs_key_pinned("0 100000"));
        assert!(!cfs_key_pinned("100000 100000 extra"));
    }
}
