//! The real VPA updater (k8s.io/autoscaler/vertical-pod-autoscaler
//! `pkg/updater`, built and cached by `tests/vpa/build.sh`) against the test
//! apiserver: its CRDs, a VerticalPodAutoscaler object whose recommendation
//! the test writes into its status (no recommender runs), and the updater
//! process with its log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::control_plane::{ControlPlane, bin_dir};
use crate::manifests::{apply_all, parse_docs};
use crate::process::spawn_guarded;

/// The VPA release `tests/vpa/build.sh` builds by default.
pub const VPA_VERSION: &str = "v1.8.1";

fn version() -> String {
    std::env::var("HEADROOM_VPA_VERSION").unwrap_or_else(|_| VPA_VERSION.to_string())
}

/// The cached updater binary.
pub fn updater_binary() -> anyhow::Result<PathBuf> {
    let p = bin_dir().join(format!("vpa-updater-{}", version()));
    if !p.is_file() {
        bail!("{} not found: run tests/vpa/build.sh", p.display());
    }
    Ok(p)
}

/// The VPA CRDs from the same module (VerticalPodAutoscaler and its
/// checkpoints), as the release publishes them.
pub fn crds() -> anyhow::Result<Vec<Value>> {
    let p = bin_dir()
        .parent()
        .context("cache dir")?
        .join(format!("crds/vpa-{}/vpa-v1-crd-gen.yaml", version()));
    let text = std::fs::read_to_string(&p)
        .with_context(|| format!("{} (tests/vpa/build.sh fetches it)", p.display()))?;
    parse_docs(&text)
}

/// Installs the CRDs (server-side apply: a no-op when another test did) and
/// waits until the API serves VerticalPodAutoscalers.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    apply_all(client, &crds()?, "headroom-tests").await?;
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for _ in 0..300 {
        if let Ok(c) = api.get("verticalpodautoscalers.autoscaling.k8s.io").await
            && c.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("VerticalPodAutoscaler CRD not established")
}

/// `autoscaling.k8s.io/v1` VerticalPodAutoscaler.
pub fn vpa_resource() -> ApiResource {
    ApiResource {
        group: "autoscaling.k8s.io".into(),
        version: "v1".into(),
        api_version: "autoscaling.k8s.io/v1".into(),
        kind: "VerticalPodAutoscaler".into(),
        plural: "verticalpodautoscalers".into(),
    }
}

pub fn vpas(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &vpa_resource())
}

/// A VPA on Deployment `target` in `mode` (e.g. `InPlaceOrRecreate`) for
/// container `app`'s CPU, with `controlled_values` (`RequestsAndLimits` or
/// `RequestsOnly`); `minReplicas: 1` so a one-replica workload is updated.
pub fn vpa(name: &str, target: &str, mode: &str, controlled_values: &str) -> Value {
    json!({
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "updatePolicy": {"updateMode": mode, "minReplicas": 1},
            "resourcePolicy": {"containerPolicies": [{
                "containerName": "app",
                "controlledResources": ["cpu"],
                "controlledValues": controlled_values
            }]}
        }
    })
}

pub async fn create_vpa(client: &Client, ns: &str, body: Value) -> anyhow::Result<()> {
    let obj: DynamicObject = serde_json::from_value(body)?;
    vpas(client, ns)
        .create(&PostParams::default(), &obj)
        .await
        .context("create VerticalPodAutoscaler")?;
    Ok(())
}

/// Writes the recommender's part: container `app`'s CPU target (and its
/// bounds, the same value, so any other request is outside them).
pub async fn recommend(client: &Client, ns: &str, name: &str, cpu: &str) -> anyhow::Result<()> {
    let rec = json!({"cpu": cpu});
    let status = json!({"status": {
        "recommendation": {"containerRecommendations": [{
            "containerName": "app",
            "target": rec, "lowerBound": rec, "upperBound": rec, "uncappedTarget": rec
        }]},
        "conditions": [{"type": "RecommendationProvided", "status": "True",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }});
    vpas(client, ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .context("write the VPA's recommendation")?;
    Ok(())
}

/// A Deployment `name` (one replica of container `app`, `req`/`lim` CPU) and
/// its ReplicaSet `<name>-rs` as the controller-manager would leave them
/// (none runs here, so neither creates pods); returns the ownerReferences a
/// pod of that ReplicaSet carries. The VPA updater resolves a pod's
/// controller through them to the VPA's target.
pub async fn deployment(
    client: &Client,
    ns: &str,
    name: &str,
    container: &Value,
) -> anyhow::Result<Value> {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    let labels = json!({"app": name});
    let template = json!({"metadata": {"labels": labels}, "spec": {"containers": [container]}});
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}
    }))?;
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &d)
        .await
        .context("create deployment")?;
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-rs"), "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                 "uid": d.metadata.uid, "controller": true}]},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}
    }))?;
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &rs)
        .await
        .context("create replicaset")?;
    Ok(
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-rs"),
               "uid": rs.metadata.uid, "controller": true}]),
    )
}

/// The updater process; killed on drop.
pub struct Updater {
    child: Child,
    pub log_path: PathBuf,
}

impl Updater {
    /// Starts the updater on namespace `ns` only, every `interval`, with
    /// `extra` flags. It runs as `<dir>/updater` (a link to the cached
    /// binary): the apiserver names its field manager after the program, so
    /// its resizes show as manager `updater`, as in a VPA release.
    pub fn start(
        cp: &ControlPlane,
        ns: &str,
        dir: &Path,
        interval: Duration,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let link = dir.join("updater");
        if !link.exists() {
            std::os::unix::fs::symlink(updater_binary()?, &link)?;
        }
        let log_path = dir.join(format!("vpa-updater-{ns}.log"));
        let log = std::fs::File::create(&log_path)?;
        let port = crate::agent::free_port()?;
        let mut cmd = Command::new(&link);
        cmd.arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
            .arg(format!("--vpa-object-namespace={ns}"))
            .arg(format!("--updater-interval={}ms", interval.as_millis()))
            // No admission controller runs (its status lease would be stale).
            .arg("--use-admission-controller-status=false")
            .arg(format!("--address=127.0.0.1:{port}"))
            // Logs each resize patch it sends ("In-place patched pod /resize ...").
            .arg("--v=4")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = spawn_guarded(cmd).context("spawning the VPA updater")?;
        Ok(Self { child, log_path })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn log_tail(&self, n: usize) -> String {
        crate::control_plane::log_tail(&self.log_path, n)
    }

    /// Resize patches the updater logged sending for pod `name`.
    pub fn resizes_of(&self, name: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("In-place patched pod /resize subresource"))
            .filter(|l| l.contains(&format!("/{name}\"")))
            .count()
    }

    /// Evictions the updater logged for pod `name` (its fallback when an
    /// in-place update fails).
    pub fn evictions_of(&self, name: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| l.contains("Evicting pod") && l.contains(&format!("/{name}\"")))
            .count()
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Updater {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
