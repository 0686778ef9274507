//! Plain data that flows between layers. The kube layer turns a `Pod` into a
//! [`PodView`]; policy and verification read only these types, so tests can
//! build them by hand and no layer needs the API types of another.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, ResourceRequirements};

use crate::quantity;

/// CPU in millicores.
pub type Millis = u64;

/// Prefix of every Headroom annotation and label.
pub const PREFIX: &str = "headroom.dev/";
/// Pod annotation or namespace label `headroom.dev/managed`: `"true"` opts in;
/// on a pod, `"false"` opts out and wins over a namespace opt-in.
pub const ANN_MANAGED: &str = "headroom.dev/managed";
/// Pod annotation: CPU ceiling for the pod's limit (a quantity, e.g. `"2"`).
pub const ANN_CEILING: &str = "headroom.dev/ceiling";
/// Pod annotation `"true"`: Headroom may add CPU limits to containers that have
/// none. One-way: the apiserver refuses to remove a limit once added.
pub const ANN_ADOPT: &str = "headroom.dev/adopt-unlimited";
/// Field manager of every resize the agent sends; `managedFields` entries of
/// this manager tell which CPU limits Headroom (not the workload) last set.
pub const FIELD_MANAGER: &str = "headroom-agent";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        }
    }
}

/// CPU and memory of one `resources` stanza, as integers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request: Option<Millis>,
    pub cpu_limit: Option<Millis>,
    pub mem_request: Option<u64>,
    pub mem_limit: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizePolicy {
    NotRequired,
    RestartContainer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// `spec.containers[]`
    App,
    /// `spec.initContainers[]` with `restartPolicy: Always`
    Sidecar,
}

/// A container that lives as long as the pod (app or sidecar).
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpec {
    pub name: String,
    pub kind: ContainerKind,
    pub resources: Resources,
    pub cpu_resize_policy: ResizePolicy,
}

/// What the kubelet reported for one container.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContainerState {
    pub name: String,
    /// The part after `://` of `containerID`.
    pub container_id: Option<String>,
    /// The part before `://` (`containerd`, `cri-o`, `docker`).
    pub runtime: Option<String>,
    pub running: bool,
    /// `status.containerStatuses[].resources` (read back from the runtime).
    pub resources: Option<Resources>,
    /// `status.containerStatuses[].allocatedResources` (requests only).
    pub allocated: Option<Resources>,
}

/// Resize progress as the kubelet reports it in pod conditions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResizeState {
    /// `PodResizePending` reason (`Deferred`/`Infeasible`), if the condition is true.
    pub pending: Option<String>,
    /// `PodResizeInProgress` is true; `Some(reason)` (may be empty, or `Error`).
    pub in_progress: Option<String>,
    /// Highest `observedGeneration` among the status and the resize conditions.
    pub observed_generation: Option<i64>,
}

/// Everything Headroom needs to know about one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node_name: Option<String>,
    pub generation: i64,
    pub resource_version: Option<String>,
    pub phase: Option<String>,
    pub terminating: bool,
    /// Mirror pod of a static pod: the apiserver refuses its resize.
    pub static_pod: bool,
    pub windows: bool,
    pub qos: Qos,
    /// App containers followed by sidecars.
    pub containers: Vec<ContainerSpec>,
    /// `spec.resources` (pod-level resources), if set.
    pub pod_resources: Option<Resources>,
    /// `spec.overhead.cpu`.
    pub overhead_cpu: Option<Millis>,
    pub statuses: Vec<ContainerState>,
    pub resize: ResizeState,
    pub annotations: BTreeMap<String, String>,
    /// `managedFields` name [`FIELD_MANAGER`] as the owner of a CPU limit:
    /// the spec's limits are Headroom's, not the ones the workload declared.
    pub limits_set_by_headroom: bool,
    /// Controller owner (`ownerReferences[controller=true]`), whose pod
    /// template holds the limits the workload declares.
    pub owner: Option<OwnerRef>,
}

/// A pod's controller, as its `ownerReferences` name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerRef {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

/// CPU limits the workload itself declares (before Headroom changed any):
/// per container, and the pod-level one. `None` = no limit declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclaredLimits {
    pub containers: BTreeMap<String, Option<Millis>>,
    pub pod: Option<Millis>,
}

impl DeclaredLimits {
    /// The limits in a pod's spec as they are now.
    pub fn of(v: &PodView) -> Self {
        Self {
            containers: v
                .containers
                .iter()
                .map(|c| (c.name.clone(), c.resources.cpu_limit))
                .collect(),
            pod: v.pod_resources.and_then(|r| r.cpu_limit),
        }
    }

    /// The limits of a pod template's spec (an owner's `spec.template.spec`).
    pub fn of_spec(spec: &k8s_openapi::api::core::v1::PodSpec) -> Result<Self, ViewError> {
        let mut containers = BTreeMap::new();
        for (i, c) in spec.containers.iter().enumerate() {
            let r = resources(
                c.resources.as_ref(),
                &format!("template.spec.containers[{i}]"),
            )?;
            containers.insert(c.name.clone(), r.cpu_limit);
        }
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            if c.restart_policy.as_deref() == Some("Always") {
                let f = format!("template.spec.initContainers[{i}]");
                let r = resources(c.resources.as_ref(), &f)?;
                containers.insert(c.name.clone(), r.cpu_limit);
            }
        }
        let pod = resources(spec.resources.as_ref(), "template.spec.resources")?.cpu_limit;
        Ok(Self { containers, pod })
    }

    /// Sum of the declared limits of `names`; `None` if one has none (or is
    /// not in the template: an injected sidecar).
    pub fn total_of<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Option<Millis> {
        names
            .into_iter()
            .map(|n| self.containers.get(n).copied().flatten())
            .sum()
    }
}

/// Whether `managedFields` give [`FIELD_MANAGER`] a CPU limit of the pod
/// (container or pod level). A manager that writes a field later takes it
/// over, so a user's own resize after Headroom's makes this false again.
pub fn limits_set_by_headroom(
    fields: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
) -> bool {
    fn owns_cpu_limit(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(m) => m
                .iter()
                .any(|(k, v)| (k == "f:limits" && v.get("f:cpu").is_some()) || owns_cpu_limit(v)),
            _ => false,
        }
    }
    fields.iter().any(|e| {
        e.manager.as_deref() == Some(FIELD_MANAGER)
            && e.fields_v1.as_ref().is_some_and(|f| owns_cpu_limit(&f.0))
    })
}

impl PodView {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    pub fn is_running(&self) -> bool {
        self.phase.as_deref() == Some("Running")
    }

    pub fn status_of(&self, container: &str) -> Option<&ContainerState> {
        self.statuses.iter().find(|s| s.name == container)
    }

    /// Sum of container CPU requests (the pod's effective request when there
    /// is no pod-level request).
    pub fn container_cpu_requests(&self) -> Millis {
        self.containers
            .iter()
            .map(|c| c.resources.cpu_request.unwrap_or(0))
            .sum()
    }

    /// The pod's CPU request: pod-level if set, else the sum of containers'.
    pub fn cpu_request(&self) -> Millis {
        self.pod_resources
            .and_then(|r| r.cpu_request)
            .unwrap_or_else(|| self.container_cpu_requests())
    }
}

/// Errors that make a Pod unusable as a [`PodView`].
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ViewError {
    #[error("pod has no {0}")]
    Missing(&'static str),
    #[error("{field}: {source}")]
    Quantity {
        field: String,
        source: quantity::QuantityError,
    },
}

fn q_cpu(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    field: &str,
) -> Result<Option<Millis>, ViewError> {
    map.and_then(|m| m.get("cpu"))
        .map(|q| {
            quantity::cpu_millis(&q.0).map_err(|source| ViewError::Quantity {
                field: format!("{field}.cpu"),
                source,
            })
        })
        .transpose()
}

fn q_mem(
    map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    field: &str,
) -> Result<Option<u64>, ViewError> {
    map.and_then(|m| m.get("memory"))
        .map(|q| {
            quantity::bytes(&q.0).map_err(|source| ViewError::Quantity {
                field: format!("{field}.memory"),
                source,
            })
        })
        .transpose()
}

/// Converts a `ResourceRequirements` to integers. As the apiserver does, a
/// limit with no request means request = limit.
pub fn resources(r: Option<&ResourceRequirements>, field: &str) -> Result<Resources, ViewError> {
    let Some(r) = r else {
        return Ok(Resources::default());
    };
    let cpu_limit = q_cpu(r.limits.as_ref(), &format!("{field}.limits"))?;
    let mem_limit = q_mem(r.limits.as_ref(), &format!("{field}.limits"))?;
    let cpu_request = q_cpu(r.requests.as_ref(), &format!("{field}.requests"))?.or(cpu_limit);
    let mem_request = q_mem(r.requests.as_ref(), &format!("{field}.requests"))?.or(mem_limit);
    Ok(Resources {
        cpu_request,
        cpu_limit,
        mem_request,
        mem_limit,
    })
}

fn container_spec(
    c: &Container,
    kind: ContainerKind,
    field: &str,
) -> Result<ContainerSpec, ViewError> {
    let cpu_resize_policy = c
        .resize_policy
        .iter()
        .flatten()
        .find(|p| p.resource_name == "cpu")
        .map(|p| match p.restart_policy.as_str() {
            "RestartContainer" => ResizePolicy::RestartContainer,
            _ => ResizePolicy::NotRequired,
        })
        .unwrap_or(ResizePolicy::NotRequired);
    Ok(ContainerSpec {
        name: c.name.clone(),
        kind,
        resources: resources(c.resources.as_ref(), field)?,
        cpu_resize_policy,
    })
}

fn container_state(s: &ContainerStatus) -> Result<ContainerState, ViewError> {
    let (runtime, container_id) = match s
        .container_id
        .as_deref()
        .and_then(|id| id.split_once("://"))
    {
        Some((rt, id)) if !id.is_empty() => (Some(rt.to_string()), Some(id.to_string())),
        _ => (None, None),
    };
    let field = format!("status.containerStatuses[{}]", s.name);
    let allocated = match &s.allocated_resources {
        Some(a) => Some(Resources {
            cpu_request: q_cpu(Some(a), &format!("{field}.allocatedResources"))?,
            mem_request: q_mem(Some(a), &format!("{field}.allocatedResources"))?,
            ..Default::default()
        }),
        None => None,
    };
    Ok(ContainerState {
        name: s.name.clone(),
        container_id,
        runtime,
        running: s.state.as_ref().is_some_and(|st| st.running.is_some()),
        resources: s
            .resources
            .as_ref()
            .map(|r| resources(Some(r), &format!("{field}.resources")))
            .transpose()?,
        allocated,
    })
}

/// QoS from the spec, as the apiserver computes it (used when
/// `status.qosClass` is absent).
pub fn compute_qos(containers: &[ContainerSpec], pod: Option<&Resources>) -> Qos {
    if let Some(p) = pod.filter(|p| {
        p.cpu_request.is_some()
            || p.mem_request.is_some()
            || p.cpu_limit.is_some()
            || p.mem_limit.is_some()
    }) {
        let g = p.cpu_limit.is_some()
            && p.mem_limit.is_some()
            && p.cpu_request == p.cpu_limit
            && p.mem_request == p.mem_limit;
        return if g { Qos::Guaranteed } else { Qos::Burstable };
    }
    let any = containers.iter().any(|c| {
        let r = &c.resources;
        r.cpu_request.is_some()
            || r.cpu_limit.is_some()
            || r.mem_request.is_some()
            || r.mem_limit.is_some()
    });
    if !any {
        return Qos::BestEffort;
    }
    let all_g = containers.iter().all(|c| {
        let r = &c.resources;
        r.cpu_limit.is_some()
            && r.mem_limit.is_some()
            && r.cpu_request == r.cpu_limit
            && r.mem_request == r.mem_limit
    });
    if all_g {
        Qos::Guaranteed
    } else {
        Qos::Burstable
    }
}

impl TryFrom<&Pod> for PodView {
    type Error = ViewError;

    fn try_from(pod: &Pod) -> Result<Self, ViewError> {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref().ok_or(ViewError::Missing("spec"))?;
        let status = pod.status.as_ref();
        let mut containers = Vec::with_capacity(spec.containers.len());
        for (i, c) in spec.containers.iter().enumerate() {
            containers.push(container_spec(
                c,
                ContainerKind::App,
                &format!("spec.containers[{i}].resources"),
            )?);
        }
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            if c.restart_policy.as_deref() == Some("Always") {
                containers.push(container_spec(
                    c,
                    ContainerKind::Sidecar,
                    &format!("spec.initContainers[{i}].resources"),
                )?);
            }
        }
        let pod_resources = spec
            .resources
            .as_ref()
            .map(|r| resources(Some(r), "spec.resources"))
            .transpose()?
            .filter(|r| *r != Resources::default());
        let overhead_cpu = q_cpu(spec.overhead.as_ref(), "spec.overhead")?;
        let mut statuses = Vec::new();
        for s in status.into_iter().flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        }) {
            statuses.push(container_state(s)?);
        }
        let mut resize = ResizeState {
            observed_generation: status.and_then(|s| s.observed_generation),
            ..Default::default()
        };
        for c in status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
        {
            if c.status != "True" {
                continue;
            }
            match c.type_.as_str() {
                "PodResizePending" => resize.pending = Some(c.reason.clone().unwrap_or_default()),
                "PodResizeInProgress" => {
                    resize.in_progress = Some(c.reason.clone().unwrap_or_default())
                }
                _ => continue,
            }
            resize.observed_generation = resize.observed_generation.max(c.observed_generation);
        }
        let qos = match status.and_then(|s| s.qos_class.as_deref()) {
            Some("Guaranteed") => Qos::Guaranteed,
            Some("BestEffort") => Qos::BestEffort,
            Some("Burstable") => Qos::Burstable,
            _ => compute_qos(&containers, pod_resources.as_ref()),
        };
        let annotations = meta.annotations.clone().unwrap_or_default();
        Ok(PodView {
            namespace: meta
                .namespace
                .clone()
                .ok_or(ViewError::Missing("metadata.namespace"))?,
            name: meta
                .name
                .clone()
                .ok_or(ViewError::Missing("metadata.name"))?,
            uid: meta.uid.clone().ok_or(ViewError::Missing("metadata.uid"))?,
            node_name: spec.node_name.clone(),
            generation: meta.generation.unwrap_or(0),
            resource_version: meta.resource_version.clone(),
            phase: status.and_then(|s| s.phase.clone()),
            terminating: meta.deletion_timestamp.is_some(),
            static_pod: annotations.contains_key("kubernetes.io/config.mirror"),
            windows: spec.os.as_ref().is_some_and(|o| o.name == "windows"),
            qos,
            containers,
            pod_resources,
            overhead_cpu,
            statuses,
            resize,
            annotations,
            limits_set_by_headroom: limits_set_by_headroom(
                meta.managed_fields.as_deref().unwrap_or_default(),
            ),
            owner: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| OwnerRef {
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod json")
    }

    #[test]
    fn converts_containers_sidecars_pod_level_status_and_conditions() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "generation": 3,
                         "annotations": {"headroom.dev/managed": "true"}},
            "spec": {
                "nodeName": "n1",
                "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}},
                "overhead": {"cpu": "50m"},
                "initContainers": [
                    {"name": "init", "image": "x"},
                    {"name": "side", "image": "x", "restartPolicy": "Always",
                     "resources": {"limits": {"cpu": "200m"}}}
                ],
                "containers": [{"name": "app", "image": "x",
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "RestartContainer"}],
                    "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}]
            },
            "status": {
                "phase": "Running", "qosClass": "Burstable", "observedGeneration": 2,
                "conditions": [
                    {"type": "PodResizeInProgress", "status": "True", "observedGeneration": 3},
                    {"type": "PodResizePending", "status": "False"}
                ],
                "containerStatuses": [{"name": "app", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                    "containerID": "containerd://abc", "state": {"running": {}},
                    "allocatedResources": {"cpu": "250m"},
                    "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "300m"}}}]
            }
        }));
        let v = PodView::try_from(&p).unwrap();
        assert_eq!(v.key(), "ns/p");
        assert_eq!(
            v.containers.len(),
            2,
            "app + sidecar; ordinary init containers are not pod-lifetime"
        );
        assert_eq!(v.containers[1].kind, ContainerKind::Sidecar);
        assert_eq!(
            v.containers[1].resources.cpu_request,
            Some(200),
            "a limit without request means request = limit"
        );
        assert_eq!(
            v.containers[0].cpu_resize_policy,
            ResizePolicy::RestartContainer
        );
        assert_eq!(v.pod_resources.and_then(|r| r.cpu_limit), Some(500));
        assert_eq!(v.cpu_request(), 100, "pod-level request wins");
        assert_eq!(v.overhead_cpu, Some(50));
        assert_eq!(v.resize.in_progress.as_deref(), Some(""));
        assert_eq!(v.resize.pending, None, "a False condition is not pending");
        assert_eq!(v.resize.observed_generation, Some(3));
        let s = v.status_of("app").unwrap();
        assert_eq!(
            (s.runtime.as_deref(), s.container_id.as_deref()),
            (Some("containerd"), Some("abc"))
        );
        assert!(s.running);
        assert_eq!(s.resources.and_then(|r| r.cpu_limit), Some(300));
        assert_eq!(s.allocated.and_then(|r| r.cpu_request), Some(250));
    }

    #[test]
    fn a_bad_quantity_is_a_typed_error_naming_the_field() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "lots"}}}]}
        }));
        let e = PodView::try_from(&p).unwrap_err();
        assert!(
            e.to_string()
                .contains("spec.containers[0].resources.limits.cpu"),
            "{e}"
        );
    }

    #[test]
    fn missing_identity_is_an_error_not_a_panic() {
        let p = pod(serde_json::json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        assert_eq!(
            PodView::try_from(&p).unwrap_err(),
            ViewError::Missing("metadata.namespace")
        );
    }

    #[test]
    fn qos_is_computed_when_status_lacks_it() {
        let c = |req: Option<u64>, lim: Option<u64>| ContainerSpec {
            name: "c".into(),
            kind: ContainerKind::App,
            resources: Resources {
                cpu_request: req,
                cpu_limit: lim,
                mem_request: lim.map(|_| 1),
                mem_limit: lim.map(|_| 1),
            },
            cpu_resize_policy: ResizePolicy::NotRequired,
        };
        assert_eq!(compute_qos(&[c(None, None)], None), Qos::BestEffort);
        assert_eq!(
            compute_qos(&[c(Some(100), Some(100))], None),
            Qos::Guaranteed
        );
        assert_eq!(
            compute_qos(&[c(Some(100), Some(200))], None),
            Qos::Burstable
        );
    }
}
