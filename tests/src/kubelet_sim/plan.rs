//! What the kubelet would write for a pod spec (docs/kubelet-behaviour.md §2 and §4): container and
//! pod `cpu.max` quotas and `cpu.weight`. Pure: no I/O, no apiserver.

use std::collections::BTreeMap;

use headroom::quantity::{QuantityError, cpu_millis};
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use super::layout::SimQos;

/// Smallest CFS quota the kubelet writes (µs): a limit under 10m is enforced as 10m.
pub const MIN_QUOTA_US: u64 = 1000;

/// Raw resource quantities as written in a spec (`"cpu" -> "500m"`).
pub type Quantities = BTreeMap<String, String>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    App,
    /// Init container with `restartPolicy: Always`: runs next to the app containers.
    Sidecar,
    /// Ordinary init container: ran to completion before the app started, no cgroup left.
    Init,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    pub name: String,
    pub kind: ContainerKind,
    pub requests: Quantities,
    pub limits: Quantities,
    pub request_m: Option<u64>,
    pub limit_m: Option<u64>,
}

/// The resource-relevant part of a pod spec; two plans compare equal when the kubelet
/// would have nothing to resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    pub qos: SimQos,
    pub containers: Vec<ContainerPlan>,
    pub pod_requests: Option<Quantities>,
    pub pod_limits: Option<Quantities>,
    pub pod_request_m: Option<u64>,
    pub pod_limit_m: Option<u64>,
    pub overhead_m: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("pod has no spec")]
    NoSpec,
    #[error("bad quantity in pod spec: {0}")]
    Quantity(#[from] QuantityError),
}

fn quantities(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Quantities {
    map.map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

fn cpu_of(q: &Quantities) -> Result<Option<u64>, QuantityError> {
    q.get("cpu").map(|v| cpu_millis(v)).transpose()
}

fn container_plan(c: &Container, kind: ContainerKind) -> Result<ContainerPlan, PlanError> {
    let res = c.resources.as_ref();
    let requests = quantities(res.and_then(|r| r.requests.as_ref()));
    let limits = quantities(res.and_then(|r| r.limits.as_ref()));
    Ok(ContainerPlan {
        name: c.name.clone(),
        kind,
        request_m: cpu_of(&requests)?,
        limit_m: cpu_of(&limits)?,
        requests,
        limits,
    })
}

/// QoS from the spec, for when `status.qosClass` is not there yet (simplified rules:
/// cpu and memory only).
fn derive_qos(containers: &[ContainerPlan], pod: Option<&ResourceRequirements>) -> SimQos {
    let sets: Vec<(Quantities, Quantities)> = match pod {
        Some(r) => vec![(
            quantities(r.requests.as_ref()),
            quantities(r.limits.as_ref()),
        )],
        None => containers
            .iter()
            .map(|c| (c.requests.clone(), c.limits.clone()))
            .collect(),
    };
    let any = sets.iter().any(|(r, l)| !r.is_empty() || !l.is_empty());
    if !any {
        return SimQos::BestEffort;
    }
    let guaranteed = sets.iter().all(|(req, lim)| {
        ["cpu", "memory"].iter().all(|k| match lim.get(*k) {
            Some(l) => req.get(*k).is_none_or(|r| r == l),
            None => false,
        })
    });
    if guaranteed {
        SimQos::Guaranteed
    } else {
        SimQos::Burstable
    }
}

impl PodPlan {
    pub fn from_pod(pod: &Pod) -> Result<PodPlan, PlanError> {
        let spec = pod.spec.as_ref().ok_or(PlanError::NoSpec)?;
        let mut containers = Vec::new();
        for c in spec.init_containers.iter().flatten() {
            let kind = if c.restart_policy.as_deref() == Some("Always") {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            containers.push(container_plan(c, kind)?);
        }
        for c in &spec.containers {
            containers.push(container_plan(c, ContainerKind::App)?);
        }
        let pod_res = spec.resources.as_ref();
        let pod_requests = pod_res.map(|r| quantities(r.requests.as_ref()));
        let pod_limits = pod_res.map(|r| quantities(r.limits.as_ref()));
        let overhead = quantities(spec.overhead.as_ref());
        let qos = pod
            .status
            .as_ref()
            .and_then(|s| s.qos_class.as_deref())
            .and_then(SimQos::parse)
            .unwrap_or_else(|| derive_qos(&containers, pod_res));
        Ok(PodPlan {
            qos,
            pod_request_m: pod_requests.as_ref().map(cpu_of).transpose()?.flatten(),
            pod_limit_m: pod_limits.as_ref().map(cpu_of).transpose()?.flatten(),
            overhead_m: cpu_of(&overhead)?.unwrap_or(0),
            pod_requests,
            pod_limits,
            containers,
        })
    }

    /// Containers that have a cgroup while the pod runs (apps and sidecars).
    pub fn running(&self) -> impl Iterator<Item = &ContainerPlan> {
        self.containers
            .iter()
            .filter(|c| c.kind != ContainerKind::Init)
    }

    pub fn container(&self, name: &str) -> Option<&ContainerPlan> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// Effective CPU limit of a container's cgroup in millicores (None = unlimited):
    /// its own limit, else the pod-level limit.
    pub fn container_limit_m(&self, c: &ContainerPlan) -> Option<u64> {
        c.limit_m.or(self.pod_limit_m)
    }

    /// Pod cgroup CPU limit in millicores, overhead included (None = `max`).
    pub fn pod_limit_total_m(&self) -> Option<u64> {
        if self.qos == SimQos::BestEffort {
            return None;
        }
        if let Some(l) = self.pod_limit_m {
            return Some(l + self.overhead_m);
        }
        if self.containers.iter().any(|c| c.limit_m.is_none()) {
            return None;
        }
        // Like the kubelet's PodLimits: apps and sidecars run together; an ordinary
        // init container ran alone next to the sidecars started before it.
        let lim = |c: &ContainerPlan| c.limit_m.unwrap_or(0);
        let mut sidecars = 0u64;
        let mut init_peak = 0u64;
        for c in &self.containers {
            match c.kind {
                ContainerKind::Sidecar => sidecars += lim(c),
                ContainerKind::Init => init_peak = init_peak.max(sidecars + lim(c)),
                ContainerKind::App => {}
            }
        }
        let apps: u64 = self
            .containers
            .iter()
            .filter(|c| c.kind == ContainerKind::App)
            .map(lim)
            .sum();
        Some((apps + sidecars).max(init_peak) + self.overhead_m)
    }

    /// Pod CPU request in millicores (pod-level, else the sum), overhead included.
    pub fn pod_request_total_m(&self) -> u64 {
        let sum = self
            .pod_request_m
            .unwrap_or_else(|| self.running().filter_map(|c| c.request_m).sum());
        sum + self.overhead_m
    }
}

/// `cpu.max` content for a limit in millicores.
pub fn cpu_max_line(limit_m: Option<u64>, period_us: u64) -> String {
    match limit_m {
        Some(m) => format!("{} {period_us}", quota_us(m, period_us)),
        None => format!("max {period_us}"),
    }
}

/// `cpu.max` of a cgroup whose quota went through systemd: the kubelet hands
/// `CPUQuotaPerSecUSec` rounded up to 10 ms per second, so a 15m limit reads
/// `2000 100000` on a systemd pod slice (measured on a real kubelet v1.37.2,
/// docs/kubelet-behaviour.md §2).
pub fn cpu_max_line_systemd(limit_m: Option<u64>, period_us: u64) -> String {
    match limit_m {
        Some(m) => {
            let per_sec = quota_us(m, period_us).saturating_mul(1_000_000) / period_us.max(1);
            let rounded = per_sec.div_ceil(10_000).saturating_mul(10_000);
            format!(
                "{} {period_us}",
                rounded.saturating_mul(period_us) / 1_000_000
            )
        }
        None => format!("max {period_us}"),
    }
}

/// The kubelet's MilliCPUToQuota: integer division, never under 1000 µs.
pub fn quota_us(limit_m: u64, period_us: u64) -> u64 {
    (limit_m.saturating_mul(period_us) / 1000).max(MIN_QUOTA_US)
}

/// `cpu.weight` from a request via shares and runc's linear shares→weight
/// conversion. Other runc versions map differently (docs/kubelet-behaviour.md §2); agents must read it.
pub fn cpu_weight(request_m: u64) -> u64 {
    let shares = (request_m.saturating_mul(1024) / 1000).clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> PodPlan {
        let pod: Pod = serde_json::from_value(json).expect("pod json");
        PodPlan::from_pod(&pod).expect("plan")
    }

    fn c(name: &str, req: Option<&str>, lim: Option<&str>) -> serde_json::Value {
        let mut r = serde_json::Map::new();
        if let Some(q) = req {
            r.insert("requests".into(), serde_json::json!({"cpu": q}));
        }
        if let Some(q) = lim {
            r.insert("limits".into(), serde_json::json!({"cpu": q}));
        }
        serde_json::json!({"name": name, "image": "x", "resources": r})
    }

    #[test]
    fn quota_has_a_floor_and_divides_down() {
        assert_eq!(quota_us(5, 100_000), 1000);
        assert_eq!(quota_us(101, 100_000), 10_100);
        assert_eq!(cpu_max_line(Some(500), 100_000), "50000 100000");
        assert_eq!(cpu_max_line(None, 50_000), "max 50000");
        assert_eq!(cpu_max_line_systemd(Some(15), 100_000), "2000 100000");
        assert_eq!(cpu_max_line_systemd(Some(5), 100_000), "1000 100000");
        assert_eq!(cpu_max_line_systemd(Some(500), 100_000), "50000 100000");
        assert_eq!(cpu_max_line_systemd(None, 100_000), "max 100000");
    }

    #[test]
    fn pod_quota_sums_limits_sidecars_and_overhead() {
        let p = pod(serde_json::json!({"spec": {
            "containers": [c("a", Some("100m"), Some("300m")), c("b", None, Some("200m"))],
            "initContainers": [
                {"name": "s", "image": "x", "restartPolicy": "Always",
                 "resources": {"limits": {"cpu": "100m"}}},
                {"name": "i", "image": "x", "resources": {"limits": {"cpu": "900m"}}}
            ],
            "overhead": {"cpu": "50m"}
        }, "status": {"qosClass": "Burstable"}}));
        // init "i" ran with sidecar "s": 1000m beats apps + sidecar (600m).
        assert_eq!(p.pod_limit_total_m(), Some(1050));
        assert_eq!(p.running().count(), 3);
    }

    #[test]
    fn one_unlimited_container_leaves_the_pod_unlimited() {
        let p = pod(serde_json::json!({"spec": {
            "containers": [c("a", Some("100m"), Some("300m")), c("b", Some("100m"), None)]
        }}));
        assert_eq!(p.qos, SimQos::Burstable);
        assert_eq!(p.pod_limit_total_m(), None);
        assert_eq!(p.container_limit_m(p.container("b").expect("b")), None);
    }

    #[test]
    fn pod_level_limit_caps_pod_and_unlimited_containers() {
        let p = pod(serde_json::json!({"spec": {
            "containers": [c("a", Some("100m"), None), c("b", None, Some("400m"))],
            "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}},
            "overhead": {"cpu": "20m"}
        }, "status": {"qosClass": "Burstable"}}));
        assert_eq!(p.pod_limit_total_m(), Some(520));
        assert_eq!(p.container_limit_m(p.container("a").expect("a")), Some(500));
        assert_eq!(p.container_limit_m(p.container("b").expect("b")), Some(400));
        assert_eq!(p.pod_request_total_m(), 120);
    }

    #[test]
    fn weight_follows_runc_linear_mapping() {
        assert_eq!(cpu_weight(0), 1);
        assert_eq!(cpu_weight(1000), 39);
        assert_eq!(cpu_weight(256_000), 10_000);
    }

    #[test]
    fn qos_falls_back_to_spec() {
        let g = pod(serde_json::json!({"spec": {"containers": [
            {"name": "a", "image": "x", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
        ]}}));
        assert_eq!(g.qos, SimQos::Guaranteed);
        let b = pod(serde_json::json!({"spec": {"containers": [{"name": "a", "image": "x"}]}}));
        assert_eq!(b.qos, SimQos::BestEffort);
    }
}
