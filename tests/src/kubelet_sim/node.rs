//! The simulated node itself: its Node object and the cgroup tree above the pods
//! (root, kubepods and the QoS cgroups).

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::SimConfig;
use super::cgroup_writer::{ensure_cgroup, write_atomic};
use super::layout::SimQos;
use super::plan::{cpu_max_line, cpu_weight};

/// The node's InternalIP, also the pods' `hostIP`.
pub(crate) const HOST_IP: &str = "10.0.0.1";

pub(crate) fn now_time() -> Value {
    serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now())).unwrap_or(Value::Null)
}

/// `rel` under the simulated cgroup root.
pub(crate) fn abs(cfg: &SimConfig, rel: &Path) -> PathBuf {
    cfg.cgroup_root.join(rel)
}

/// How often the node's Lease is renewed, as a real kubelet does (every
/// 10 s, for a 40 s lease).
pub(crate) const LEASE_RENEW: std::time::Duration = std::time::Duration::from_secs(10);

/// Renews the node's Lease in `kube-node-lease`. Without it the node
/// lifecycle controller marks the Node unreachable ~50 s after registration,
/// and the taint eviction deletes its pods 300 s later: a simulated node
/// that lives longer than that (real-node parity tests wait minutes for
/// the VMs' pods) loses its pods.
pub(crate) async fn renew_lease(client: &Client, cfg: &SimConfig) -> anyhow::Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew = serde_json::to_value(MicroTime(k8s_openapi::jiff::Timestamp::now()))?;
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": cfg.node_name},
        "spec": {"holderIdentity": cfg.node_name, "leaseDurationSeconds": 40,
                 "renewTime": renew},
    });
    leases
        .patch(
            &cfg.node_name,
            &PatchParams::apply("headroom-sim-kubelet").force(),
            &Patch::Apply(&lease),
        )
        .await?;
    Ok(())
}

pub(crate) async fn register_node(client: &Client, cfg: &SimConfig) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": cfg.node_name, "labels": {
            "kubernetes.io/hostname": cfg.node_name, "kubernetes.io/os": "linux"}},
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let res = json!({"cpu": format!("{}m", cfg.allocatable_cpu_m),
                     "memory": cfg.allocatable_memory, "pods": "110"});
    let now = now_time();
    let status = json!({"status": {
        "capacity": res, "allocatable": res,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "simulated kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "declaredFeatures": cfg.declared_features,
        "addresses": [{"type": "InternalIP", "address": HOST_IP},
                      {"type": "Hostname", "address": cfg.node_name}],
    }});
    nodes
        .patch_status(
            &cfg.node_name,
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    Ok(())
}

/// The cgroup root, kubepods (and its ancestors) and the QoS cgroups.
pub(crate) fn write_node_tree(cfg: &SimConfig) -> std::io::Result<()> {
    std::fs::create_dir_all(&cfg.cgroup_root)?;
    write_atomic(
        &cfg.cgroup_root,
        "cgroup.controllers",
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    )?;
    write_atomic(
        &cfg.cgroup_root,
        "cgroup.subtree_control",
        "cpu memory pids\n",
    )?;
    let cpus = online_cpus(cfg);
    write_atomic(
        &cfg.cgroup_root,
        "cpuset.cpus.effective",
        &format!("0-{}\n", cpus - 1),
    )?;
    let max = cpu_max_line(None, cfg.period_us);
    let kubepods = cfg.layout.kubepods_dir();
    for dir in cfg.layout.kubepods_ancestry() {
        let weight = if dir == kubepods {
            cpu_weight(cfg.allocatable_cpu_m)
        } else {
            100
        };
        ensure_cgroup(&abs(cfg, &dir), &max, weight, cfg.write_mode)?;
    }
    for qos in [SimQos::Burstable, SimQos::BestEffort] {
        ensure_cgroup(&abs(cfg, &cfg.layout.qos_dir(qos)), &max, 1, cfg.write_mode)?;
    }
    Ok(())
}

/// The host's online CPUs as the root cgroup lists them: as many as the
/// node's allocatable needs (a real host has at least that many).
pub(crate) fn online_cpus(cfg: &SimConfig) -> u64 {
    if let Some(m) = cfg.static_cpu_manager {
        return u64::from(m.cpus.max(1));
    }
    cfg.allocatable_cpu_m.div_ceil(1000).max(1)
}
