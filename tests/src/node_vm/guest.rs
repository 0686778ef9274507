//! What tests do inside a node VM: read the real cgroup files the kubelet and
//! runc wrote, write them out of band, and run the agent as a process.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;

use super::{GUEST_AGENT_PORT, NodeVm};
use crate::agent::http_get;

/// `cpu.max` of a pod's cgroup and of each of its container cgroups, by
/// container name (the sandbox's own cgroup under `"<sandbox>"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCpuMax {
    pub pod: String,
    pub containers: BTreeMap<String, String>,
}

/// Container ids of a pod by name (`containerd://<id>` → `<id>`), app,
/// init and sidecar containers alike.
pub fn container_ids(pod: &Pod) -> BTreeMap<String, String> {
    let status = pod.status.as_ref();
    let lists = [
        status.and_then(|s| s.container_statuses.as_ref()),
        status.and_then(|s| s.init_container_statuses.as_ref()),
    ];
    lists
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|c| {
            let id = c.container_id.as_deref()?;
            Some((c.name.clone(), id.split("://").nth(1)?.to_string()))
        })
        .collect()
}

/// Versions of what a node runs ([`NodeVm::versions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeVersions {
    pub kernel: String,
    pub containerd: String,
    pub runc: String,
    pub systemd: String,
}

impl std::fmt::Display for NodeVersions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Linux {}, containerd {}, runc {}, systemd {}",
            self.kernel, self.containerd, self.runc, self.systemd
        )
    }
}

impl NodeVm {
    /// Path (under /sys/fs/cgroup) of the cgroup of the pod with `uid`.
    pub async fn pod_cgroup(&self, uid: &str) -> anyhow::Result<String> {
        let under = uid.replace('-', "_");
        let out = self
            .sh(&format!(
                "find /sys/fs/cgroup -mindepth 2 -maxdepth 6 -type d \
                 \\( -name 'pod{uid}' -o -name '*-pod{under}.slice' \\) -print -quit"
            ))
            .await?;
        let dir = out.trim();
        if dir.is_empty() {
            bail!("{}: no cgroup for pod {uid}", self.name());
        }
        Ok(dir.to_string())
    }

    /// `cpu.max` of the pod's cgroup and its containers' (running ones).
    pub async fn pod_cpu_max(&self, pod: &Pod) -> anyhow::Result<PodCpuMax> {
        let uid = pod.metadata.uid.as_deref().context("pod has no uid")?;
        let dir = self.pod_cgroup(uid).await?;
        let out = self
            .sh(&format!(
                "cd {dir} && echo \". $(cat cpu.max)\" && for c in */; do \
                 [ -f \"$c/cpu.max\" ] && echo \"${{c%/}} $(cat $c/cpu.max)\"; done; true"
            ))
            .await?;
        let ids = container_ids(pod);
        let mut res = PodCpuMax {
            pod: String::new(),
            containers: BTreeMap::new(),
        };
        for line in out.lines() {
            let Some((name, value)) = line.split_once(' ') else {
                continue;
            };
            if name == "." {
                res.pod = value.to_string();
                continue;
            }
            let container = ids
                .iter()
                .find(|(_, id)| name.contains(id.as_str()))
                .map(|(n, _)| n.clone())
                .unwrap_or_else(|| "<sandbox>".to_string());
            res.containers.insert(container, value.to_string());
        }
        Ok(res)
    }

    /// Polls the container's `cpu.max` until it equals `want`; returns when.
    pub async fn wait_cpu_max(
        &self,
        pod: &Pod,
        container: &str,
        want: &str,
        timeout: Duration,
    ) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + timeout;
        let uid = pod.metadata.uid.as_deref().context("pod has no uid")?;
        let dir = self.pod_cgroup(uid).await?;
        let id = container_ids(pod)
            .remove(container)
            .with_context(|| format!("no container {container}"))?;
        // One ssh session polls in the guest (10 ms steps) and prints once:
        // ssh round trips under emulation would blur the timing.
        let script = format!(
            "for i in $(seq 1 {n}); do for d in {dir}/*{id}*; do \
             [ \"$(cat $d/cpu.max)\" = '{want}' ] && exit 0; done; sleep 0.01; done; exit 1",
            n = timeout.as_millis() / 10
        );
        let out = self.sh_output(&script).await?;
        let at = Instant::now();
        if !out.status.success() || at > deadline + Duration::from_secs(30) {
            bail!("{}: {container} cpu.max never read {want:?}", self.name());
        }
        Ok(at)
    }

    /// What the node runs, as the guest reports it:
    /// `(kernel, containerd, runc, systemd)` versions.
    pub async fn versions(&self) -> anyhow::Result<NodeVersions> {
        let out = self
            .sh("uname -r; containerd --version | awk '{print $3}'; \
                 runc --version | awk 'NR==1 {print $3}'; systemctl --version | awk 'NR==1 {print $2}'")
            .await?;
        let l: Vec<&str> = out.lines().map(str::trim).collect();
        if l.len() < 4 || l.iter().any(|s| s.is_empty()) {
            bail!("{}: versions not read: {out:?}", self.name());
        }
        Ok(NodeVersions {
            kernel: l[0].to_string(),
            containerd: l[1].trim_start_matches('v').to_string(),
            runc: l[2].to_string(),
            systemd: l[3].to_string(),
        })
    }

    /// Copies the static agent into this node's share (/mnt/node/bin).
    pub fn install_agent(&self, binary: &std::path::Path) -> anyhow::Result<()> {
        let dst = self.share_dir().join("bin/headroom-agent");
        let tmp = dst.with_extension("tmp");
        std::fs::copy(binary, &tmp)?;
        std::fs::rename(&tmp, &dst)?;
        Ok(())
    }
}

/// The transient systemd unit the guest agent runs as (one per node).
const GUEST_AGENT_UNIT: &str = "headroom-agent";

/// The agent on one node: `headroom-agent run` as a transient systemd unit
/// in the guest ([`GuestAgent::start`]), or the DaemonSet's pod there
/// ([`GuestAgent::daemonset_pod`]).
pub struct GuestAgent<'a> {
    pub node: &'a NodeVm,
    runs: Runs,
}

enum Runs {
    Unit(String),
    /// The pod on the node, found afresh at each call (a reboot keeps the
    /// pod, a deleted one is replaced); the client reaches the API server.
    Pod(kube::Client),
}

impl<'a> GuestAgent<'a> {
    /// Starts the agent (installed with [`NodeVm::install_agent`]) with
    /// `args` after the node name, kubeconfig and metrics address, and
    /// waits until `/healthz` answers.
    pub async fn start(node: &'a NodeVm, args: &[String]) -> anyhow::Result<GuestAgent<'a>> {
        let unit = GUEST_AGENT_UNIT.to_string();
        Self::stop_any(node).await?;
        let mut cmd = format!(
            "systemd-run --unit={unit} --collect -E RUST_LOG=info,headroom=debug \
             /mnt/node/bin/headroom-agent run --node-name {} \
             --kubeconfig /etc/kubernetes/admin.kubeconfig --metrics-addr 0.0.0.0:{GUEST_AGENT_PORT}",
            node.name()
        );
        for a in args {
            cmd.push(' ');
            cmd.push_str(&shell_quote(a));
        }
        node.sh(&cmd).await?;
        let agent = GuestAgent {
            node,
            runs: Runs::Unit(unit),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok((200, _)) = agent.get("/healthz").await {
                return Ok(agent);
            }
            if Instant::now() > deadline {
                bail!(
                    "agent on {} never answered /healthz:\n{}",
                    node.name(),
                    agent.log_tail(40).await
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The agent pod of the DaemonSet on `node` (installed with
    /// [`super::RealCluster::install_daemonset`]), once it is Ready.
    pub async fn daemonset_pod(
        node: &'a NodeVm,
        client: kube::Client,
        within: Duration,
    ) -> anyhow::Result<GuestAgent<'a>> {
        super::daemonset::agent_pod_ready(&client, node.name(), within).await?;
        Ok(GuestAgent {
            node,
            runs: Runs::Pod(client),
        })
    }

    /// The systemd unit it runs as (`None`: the DaemonSet's pod).
    pub fn unit(&self) -> Option<&str> {
        match &self.runs {
            Runs::Unit(u) => Some(u),
            Runs::Pod(_) => None,
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        match &self.runs {
            Runs::Unit(_) => http_get(self.node.agent_port(), path).await,
            Runs::Pod(client) => super::daemonset::proxy_get(client, self.node.name(), path).await,
        }
    }

    pub async fn scrape(&self) -> anyhow::Result<prometheus_parse::Scrape> {
        let (code, body) = self.get("/metrics").await?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        crate::agent::parse_metrics(&body)
    }

    pub async fn log_tail(&self, n: usize) -> String {
        match &self.runs {
            Runs::Unit(unit) => self
                .node
                .sh(&format!(
                    "journalctl -u {unit} --no-pager -o cat | tail -n {n}"
                ))
                .await
                .unwrap_or_else(|e| format!("<journal: {e:#}>")),
            Runs::Pod(client) => super::daemonset::log_tail(client, self.node, n).await,
        }
    }

    /// Stops the agent unit on `node` if one is running (an earlier `start`,
    /// or a test that failed before its own `stop`); fails only when the node
    /// cannot be reached.
    pub async fn stop_any(node: &NodeVm) -> anyhow::Result<()> {
        node.sh(&format!(
            "systemctl stop {GUEST_AGENT_UNIT} 2>/dev/null; \
             systemctl reset-failed {GUEST_AGENT_UNIT} 2>/dev/null; true"
        ))
        .await
        .map(|_| ())
    }

    /// Stops the unit; the DaemonSet's pod runs on until it is uninstalled.
    pub async fn stop(self) -> anyhow::Result<()> {
        match &self.runs {
            Runs::Unit(unit) => self
                .node
                .sh(&format!("systemctl stop {unit}"))
                .await
                .map(|_| ()),
            Runs::Pod(_) => Ok(()),
        }
    }
}

fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./=:,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
