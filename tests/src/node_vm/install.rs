//! What installing Headroom the way users do (`kubectl apply -k deploy/`)
//! needs from the VM cluster: the agent's image in every node's containerd,
//! the `kubernetes` Service reachable from pods, `kubectl`, and a way for
//! the shared scenario runner (tests/scenarios/run.sh) to run a command on a
//! node.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{RealCluster, repo_root};

/// The Service IP kube-apiserver gives the `kubernetes` Service (first
/// address of `--service-cluster-ip-range`), and where guests reach the
/// API server.
const KUBERNETES_SERVICE: &str = "10.96.0.1:443";

/// `kubectl` built by tests/control-plane/build.sh, the control plane's version.
pub fn kubectl() -> anyhow::Result<PathBuf> {
    let cp = crate::control_plane::bin_dir();
    let version = std::env::var("HEADROOM_APISERVER_VERSION")
        .unwrap_or_else(|_| crate::control_plane::DEFAULT_APISERVER_VERSION.to_string());
    let path = cp.join(format!("kubectl-{version}"));
    anyhow::ensure!(
        path.is_file(),
        "{} not found: run tests/control-plane/build.sh",
        path.display()
    );
    Ok(path)
}

/// The prometheus-operator CRDs (PodMonitor, PrometheusRule) fetched by
/// tests/control-plane/build.sh from the project's published Go module.
pub fn prometheus_crds() -> anyhow::Result<PathBuf> {
    let version = std::env::var("HEADROOM_PROMETHEUS_OPERATOR_VERSION")
        .unwrap_or_else(|_| "v0.94.0".to_string());
    let dir = crate::control_plane::bin_dir()
        .parent()
        .context("cache dir")?
        .join(format!("crds/prometheus-operator-{version}"));
    anyhow::ensure!(
        dir.join("monitoring.coreos.com_podmonitors.yaml").is_file(),
        "{} has no CRDs: run tests/control-plane/build.sh",
        dir.display()
    );
    Ok(dir)
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl RealCluster {
    /// Imports a Docker archive into every node's containerd (the namespace
    /// the kubelet uses) and adds `extra_tags` (full references) to the
    /// image named `image`.
    pub async fn load_image(
        &self,
        archive: &Path,
        image: &str,
        extra_tags: &[&str],
    ) -> anyhow::Result<()> {
        for node in &self.nodes {
            let dir = node.dir.join("node/images");
            std::fs::create_dir_all(&dir)?;
            let name = archive
                .file_name()
                .context("archive has no file name")?
                .to_string_lossy()
                .into_owned();
            std::fs::copy(archive, dir.join(&name))
                .with_context(|| format!("copying {} to {}", archive.display(), dir.display()))?;
            let mut cmd = format!("ctr -n k8s.io images import /mnt/node/images/{name} >/dev/null");
            for t in extra_tags {
                cmd.push_str(&format!(
                    " && ctr -n k8s.io images tag --force {image} {t} >/dev/null"
                ));
            }
            node.sh(&cmd).await?;
        }
        Ok(())
    }

    /// The image ID (config digest) of a Docker archive: what containerd's
    /// CRI reports as a container's `imageID` for an image imported without
    /// a registry digest.
    pub fn archive_image_id(archive: &Path) -> anyhow::Result<String> {
        let out = std::process::Command::new("tar")
            .arg("-xOf")
            .arg(archive)
            .arg("manifest.json")
            .output()?;
        anyhow::ensure!(out.status.success(), "tar: {out:?}");
        let m: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let config = m[0]["Config"].as_str().context("manifest has no Config")?;
        Ok(format!(
            "sha256:{}",
            config
                .trim_end_matches(".json")
                .trim_start_matches("blobs/sha256/")
        ))
    }

    /// The VMs run no kube-proxy: program, on every node, the one rule it
    /// would for the only Service the agent uses — `kubernetes`
    /// (10.96.0.1:443) to the API server's guest address — and masquerade
    /// pod traffic leaving the node (the bridge CNI is set up without it).
    pub async fn program_kubernetes_service(&self) -> anyhow::Result<()> {
        for node in &self.nodes {
            node.program_kubernetes_service().await?;
        }
        Ok(())
    }

    /// Writes `dir/node-sh` (`node-sh NODE 'shell line'` runs the line as
    /// root on that node over ssh) and `dir/kubectl`; returns `dir`, to put
    /// first on PATH for the scenario runner.
    pub fn scenario_tools(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let mut script = String::from("#!/bin/sh\n# node-sh NODE 'shell line'\ncase \"$1\" in\n");
        for node in &self.nodes {
            let args: Vec<String> = node
                .ssh_args()
                .iter()
                .map(|a| sh_quote(&a.to_string_lossy()))
                .collect();
            script.push_str(&format!(
                "  {}) exec ssh {} -o ConnectTimeout=20 root@127.0.0.1 \"$2\" ;;\n",
                node.name(),
                args.join(" ")
            ));
        }
        script.push_str("  *) echo \"node-sh: no node $1\" >&2; exit 2 ;;\nesac\n");
        let path = dir.join("node-sh");
        std::fs::write(&path, script)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        let link = dir.join("kubectl");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(kubectl()?, &link)?;
        Ok(dir.to_path_buf())
    }

    /// tests/scenarios/run.sh, the runner kind and the VM cluster share.
    pub fn scenario_runner() -> PathBuf {
        repo_root().join("tests/scenarios/run.sh")
    }
}

impl super::NodeVm {
    /// [`RealCluster::program_kubernetes_service`] on this node alone (after
    /// a reboot: the rules live in the kernel, as kube-proxy's do).
    pub async fn program_kubernetes_service(&self) -> anyhow::Result<()> {
        let (ip, port) = KUBERNETES_SERVICE
            .split_once(':')
            .context("service address")?;
        let to = format!(
            "{}:{}",
            crate::certs::GUEST_APISERVER_IP,
            super::config::GUEST_APISERVER_PORT
        );
        let cidr = &self.spec.pod_cidr;
        self.sh(&format!(
            "sysctl -qw net.ipv4.ip_forward=1 && \
             dnat='-d {ip}/32 -p tcp --dport {port} -j DNAT --to-destination {to}' && \
             {{ iptables -t nat -C PREROUTING $dnat 2>/dev/null || iptables -t nat -A PREROUTING $dnat; }} && \
             masq='-s {cidr} ! -d {cidr} -j MASQUERADE' && \
             {{ iptables -t nat -C POSTROUTING $masq 2>/dev/null || iptables -t nat -A POSTROUTING $masq; }}"
        ))
        .await?;
        Ok(())
    }
}
