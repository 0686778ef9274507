//! The agent as users run it on the VM nodes: the DaemonSet of `deploy/`
//! (`kubectl apply`), its image imported into each node's containerd, its
//! pods reached through the API server's pod proxy (what `kubectl port-forward`
//! and Prometheus' `kubernetes_sd` see, not a port of the VM).

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use super::{NodeVm, RealCluster, repo_root};

/// The namespace deploy/ installs the agent in.
pub const NAMESPACE: &str = "headroom-system";
/// The agent's DaemonSet in deploy/.
const DAEMONSET: &str = "headroom-agent";
/// The agent pods' labels in deploy/.
const SELECTOR: &str = "app.kubernetes.io/name=headroom,app.kubernetes.io/component=agent";
/// The image deploy/ names, as containerd stores an imported Docker archive.
const IMAGE: &str = "docker.io/library/headroom-agent:0.1.0";
/// The metrics port deploy/ gives the agent container.
const METRICS_PORT: u16 = 9464;

async fn kubectl(c: &RealCluster, args: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::new(super::install::kubectl()?);
    cmd.env("KUBECONFIG", c.cp.kubeconfig_path())
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("kubectl")?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().context("kubectl stdin")?;
        pipe.write_all(input).await?;
        drop(pipe);
    }
    let out = tokio::time::timeout(Duration::from_secs(360), child.wait_with_output())
        .await
        .context("kubectl timed out")??;
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// deploy/ as `kubectl kustomize` renders it, with `extra_args` appended to
/// the agent container's args (what a user's overlay does to tune a flag)
/// and `RUST_LOG` set to the tests' level.
async fn rendered(c: &RealCluster, extra_args: &[String]) -> anyhow::Result<Vec<u8>> {
    let deploy = repo_root().join("deploy");
    let yaml = kubectl(c, &["kustomize", &deploy.to_string_lossy()], None).await?;
    let json = kubectl(
        c,
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        Some(yaml.as_bytes()),
    )
    .await?;
    // One JSON object per manifest, one after the other.
    let mut items = serde_json::Deserializer::from_str(&json)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()?;
    let ds = items
        .iter_mut()
        .find(|o| o["kind"] == "DaemonSet")
        .context("deploy/ has no DaemonSet")?;
    let agent = &mut ds["spec"]["template"]["spec"]["containers"][0];
    let args = agent["args"]
        .as_array_mut()
        .context("the agent container has args")?;
    args.extend(extra_args.iter().map(|a| Value::from(a.as_str())));
    // The tests read its decisions' figures, logged at debug level.
    agent["env"]
        .as_array_mut()
        .context("the agent container has env")?
        .push(serde_json::json!({"name": "RUST_LOG", "value": crate::agent::TEST_RUST_LOG}));
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    Ok(serde_json::to_vec(&list)?)
}

impl RealCluster {
    /// Installs the agent as users do: its image (scripts/build-image.sh) in
    /// every node's containerd, the `kubernetes` Service programmed on every
    /// node, `kubectl apply` of deploy/ with `extra_args` added to the
    /// agent's; returns once the agent pod on every node is Ready.
    pub async fn install_daemonset(&self, extra_args: &[String]) -> anyhow::Result<()> {
        let archive = super::agent_image()?;
        self.load_image(&archive, IMAGE, &[]).await?;
        self.program_kubernetes_service().await?;
        let manifests = rendered(self, extra_args).await?;
        kubectl(self, &["apply", "-f", "-"], Some(&manifests)).await?;
        let client = self.cp.client().await;
        for node in &self.nodes {
            agent_pod_ready(&client, node.name(), Duration::from_secs(300)).await?;
        }
        Ok(())
    }

    /// Deletes the agent's DaemonSet and returns once its pods are gone from
    /// the API and their containers from every node. The rest of deploy/
    /// (namespace, RBAC, admission policy) stays: the next `kubectl apply -k
    /// deploy/` finds it unchanged, and a namespace deletion, which waits on
    /// every API group and each kubelet, twice outlasted 300 s after a full
    /// tier (never alone).
    /// Pods not gone within 3 minutes are printed with their nodes'
    /// containers, then force-deleted (the kubelet kills what it no longer
    /// knows); it fails if a container is still running a minute later.
    pub async fn uninstall_daemonset(&self) -> anyhow::Result<()> {
        // The query below must see the agent while it runs, or its "gone"
        // would prove nothing.
        for node in &self.nodes {
            let running = self.agent_containers(node).await?;
            if running.trim().is_empty() {
                bail!(
                    "no running agent container found on {}: {running}",
                    node.name()
                );
            }
        }
        self.remove_daemonset().await
    }

    /// [`Self::uninstall_daemonset`] without first checking that an agent
    /// runs on every node: for what a test that failed with the DaemonSet
    /// installed left behind (nothing to do if it is not there).
    pub async fn remove_daemonset(&self) -> anyhow::Result<()> {
        kubectl(
            self,
            &[
                "-n",
                NAMESPACE,
                "delete",
                "daemonset",
                DAEMONSET,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        )
        .await?;
        let client = self.cp.client().await;
        let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
        let lp = ListParams::default().labels(SELECTOR);
        let deadline = Instant::now() + Duration::from_secs(180);
        let ours: Vec<&str> = self.nodes.iter().map(|n| n.name()).collect();
        let on_ours = |p: &Pod| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| ours.contains(&n))
        };
        loop {
            let (left, elsewhere): (Vec<Pod>, Vec<Pod>) =
                pods.list(&lp).await?.items.into_iter().partition(on_ours);
            // On a node no kubelet of this cluster runs (a simulated one a
            // test registered): nobody would ever end it.
            for p in &elsewhere {
                let name = p.metadata.name.as_deref().unwrap_or_default();
                let force = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                let _ = pods.delete(name, &force).await;
            }
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                let mut what: Vec<String> = left.iter().map(describe).collect();
                for node in &self.nodes {
                    what.push(format!(
                        "{} containers:\n{}",
                        node.name(),
                        self.agent_containers(node)
                            .await
                            .unwrap_or_else(|e| format!("{e:#}"))
                    ));
                }
                eprintln!(
                    "WARN: agent pods not gone 180 s after their DaemonSet was deleted; force-deleting:\n{}",
                    what.join("\n")
                );
                let force = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                for p in &left {
                    let name = p.metadata.name.as_deref().unwrap_or_default();
                    let _ = pods.delete(name, &force).await;
                }
                break;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for node in &self.nodes {
            loop {
                let running = self.agent_containers(node).await?;
                if running.trim().is_empty() {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "an agent container still runs on {} after its pod was deleted:\n{running}",
                        node.name()
                    );
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
        Ok(())
    }

    /// The running tasks of containerd's containers of the agent's namespace
    /// on `node` (`ctr`: the node image has no crictl), one per line.
    async fn agent_containers(&self, node: &NodeVm) -> anyhow::Result<String> {
        let ns_label = format!("labels.\\\"io.kubernetes.pod.namespace\\\"=={NAMESPACE}");
        node.sh(&format!(
            "for c in $(ctr -n k8s.io containers ls -q \"{ns_label}\"); do \
               ctr -n k8s.io tasks ls | awk -v c=\"$c\" '$1 == c && $3 == \"RUNNING\"'; done"
        ))
        .await
    }
}

/// A pod left behind: where, since when deleted, and its containers' states.
fn describe(p: &Pod) -> String {
    let spec_node = p.spec.as_ref().and_then(|s| s.node_name.clone());
    let status = p.status.as_ref();
    format!(
        "pod {} on {:?}: deleted at {:?}, phase {:?}, containers {:?}",
        p.metadata.name.as_deref().unwrap_or_default(),
        spec_node,
        p.metadata.deletion_timestamp,
        status.and_then(|s| s.phase.clone()),
        status
            .and_then(|s| s.container_statuses.as_ref())
            .map(|cs| cs
                .iter()
                .map(|c| (c.name.clone(), c.state.clone()))
                .collect::<Vec<_>>()),
    )
}

/// The agent pod on `node`, if any (the DaemonSet keeps one per node).
pub async fn agent_pod(client: &kube::Client, node: &str) -> anyhow::Result<Option<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let lp = ListParams::default()
        .labels(SELECTOR)
        .fields(&format!("spec.nodeName={node}"));
    Ok(pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none()))
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the agent pod on `node` is Ready (its `/readyz` answered the
/// kubelet's probe); returns its name.
pub async fn agent_pod_ready(
    client: &kube::Client,
    node: &str,
    within: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        let pod = agent_pod(client, node).await.ok().flatten();
        if let Some(p) = pod.as_ref().filter(|p| is_ready(p)) {
            return Ok(p.metadata.name.clone().unwrap_or_default());
        }
        if Instant::now() > deadline {
            bail!(
                "the agent pod on {node} is not Ready after {within:?}: {:?}",
                pod.and_then(|p| p.status)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// GET `path` of the agent pod on `node` through the API server's pod proxy.
pub async fn proxy_get(
    client: &kube::Client,
    node: &str,
    path: &str,
) -> anyhow::Result<(u16, String)> {
    let pod = agent_pod(client, node)
        .await?
        .with_context(|| format!("no agent pod on {node}"))?;
    let name = pod.metadata.name.unwrap_or_default();
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{NAMESPACE}/pods/{name}:{METRICS_PORT}/proxy{path}"
    ))
    .body(kube::client::Body::empty())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), client.send(req))
        .await
        .context("pod proxy timed out")??;
    let code = resp.status().as_u16();
    let body = resp.into_body().collect_bytes().await?;
    Ok((code, String::from_utf8_lossy(&body).into_owned()))
}

/// The last `n` lines the agent pod on `node` logged, across its
/// container's restarts: read from the node's files (`/var/log/pods`), since
/// the API server fetches logs from the kubelet, which a fault may have
/// stopped.
pub async fn log_tail(client: &kube::Client, node: &NodeVm, n: usize) -> String {
    let Ok(Some(pod)) = agent_pod(client, node.name()).await else {
        return format!("<no agent pod on {}>", node.name());
    };
    let name = pod.metadata.name.unwrap_or_default();
    let uid = pod.metadata.uid.unwrap_or_default();
    node.sh(&format!(
        "cd /var/log/pods/{NAMESPACE}_{name}_{uid}/agent && cat $(ls -v *.log) | tail -n {n}"
    ))
    .await
    .unwrap_or_else(|e| format!("<logs of {name} on {}: {e:#}>", node.name()))
}
