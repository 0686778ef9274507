//! Pod → [`PodView`]: the one place the API's `Pod` is read into the plain
//! data the other layers use. Quantities become integers, sidecars join the
//! app containers, resize conditions and `managedFields` are summarised.

use foldhash::HashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

use crate::model::{
    CgroupPodId, ContainerKind, ContainerSpec, ContainerState, DeclaredLimits, FIELD_MANAGER,
    LimitWriter, Millis, OwnerRef, PodView, Qos, ResizePolicy, ResizeState, Resources, Uid,
    compute_qos,
};
use crate::quantity;

impl TryFrom<&Pod> for PodView {
    type Error = ViewError;

    fn try_from(pod: &Pod) -> Result<Self, ViewError> {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref().ok_or(ViewError::Missing("spec"))?;
        let status = pod.status.as_ref();
        let mut containers = Vec::with_capacity(spec.containers.len());
        for (i, c) in spec.containers.iter().enumerate() {
            containers.push(container_spec(c, ContainerKind::App, &|| {
                format!("spec.containers[{i}].resources")
            })?);
        }
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            if c.restart_policy.as_deref() == Some("Always") {
                containers.push(container_spec(c, ContainerKind::Sidecar, &|| {
                    format!("spec.initContainers[{i}].resources")
                })?);
            }
        }
        let pod_resources = spec
            .resources
            .as_ref()
            .map(|r| resources(Some(r), &|| "spec.resources".to_string()))
            .transpose()?
            .filter(|r| *r != Resources::default());
        let overhead_cpu = q_cpu(spec.overhead.as_ref(), &|| "spec.overhead".to_string())?;
        let mut statuses = Vec::new();
        for s in status.into_iter().flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        }) {
            statuses.push(container_state(s)?);
        }
        let resize = resize_state(status);
        let qos = match status.and_then(|s| s.qos_class.as_deref()) {
            Some("Guaranteed") => Qos::Guaranteed,
            Some("BestEffort") => Qos::BestEffort,
            Some("Burstable") => Qos::Burstable,
            _ => compute_qos(&containers, pod_resources.as_ref()),
        };
        let annotations = meta.annotations.clone().unwrap_or_default();
        let namespace = meta
            .namespace
            .clone()
            .ok_or(ViewError::Missing("metadata.namespace"))?;
        let name = meta
            .name
            .clone()
            .ok_or(ViewError::Missing("metadata.name"))?;
        let uid = Uid::from(meta.uid.clone().ok_or(ViewError::Missing("metadata.uid"))?);
        Ok(PodView {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.clone(),
            cgroup_id: cgroup_pod_id(&uid, &annotations),
            node_name: spec.node_name.clone(),
            generation: meta.generation.unwrap_or(0),
            resource_version: meta.resource_version.clone(),
            phase: status.and_then(|s| s.phase.clone()),
            terminating: meta.deletion_timestamp.is_some(),
            static_pod: annotations.contains_key(MIRROR_ANNOTATION),
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
            limit_writers: limit_writers(meta.managed_fields.as_deref().unwrap_or_default()),
            owner: meta
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| OwnerRef {
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: Uid::from(o.uid.as_str()),
                }),
        })
    }
}

/// Resize progress from the pod's status: its `observedGeneration` and the
/// `PodResizePending` / `PodResizeInProgress` conditions that are true.
fn resize_state(status: Option<&k8s_openapi::api::core::v1::PodStatus>) -> ResizeState {
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
    resize
}

/// The id the kubelet names a pod's cgroup after. A static pod's mirror
/// carries its config hash in `kubernetes.io/config.mirror` and has a uid of
/// its own from the apiserver; the kubelet runs the static pod, whose uid *is*
/// that hash, so its cgroup is `pod<hash>`. Every other pod's cgroup is named
/// after its `metadata.uid`.
pub fn cgroup_pod_id(uid: &Uid, annotations: &BTreeMap<String, String>) -> CgroupPodId {
    match annotations.get(MIRROR_ANNOTATION) {
        Some(hash) if !hash.is_empty() => CgroupPodId::from(hash.as_str()),
        _ => CgroupPodId::from(uid.as_str()),
    }
}

/// Set by the kubelet on a static pod's mirror: the static pod's config hash.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

impl DeclaredLimits {
    /// The limits of a pod template's spec (an owner's `spec.template.spec`).
    pub fn of_spec(spec: &PodSpec) -> Result<Self, ViewError> {
        let mut containers = BTreeMap::new();
        for (i, c) in spec.containers.iter().enumerate() {
            let r = resources(c.resources.as_ref(), &|| {
                format!("template.spec.containers[{i}]")
            })?;
            containers.insert(c.name.clone(), r.cpu_limit);
        }
        for (i, c) in spec.init_containers.iter().flatten().enumerate() {
            if c.restart_policy.as_deref() == Some("Always") {
                let r = resources(c.resources.as_ref(), &|| {
                    format!("template.spec.initContainers[{i}]")
                })?;
                containers.insert(c.name.clone(), r.cpu_limit);
            }
        }
        let pod = resources(spec.resources.as_ref(), &|| {
            "template.spec.resources".to_string()
        })?
        .cpu_limit;
        Ok(Self { containers, pod })
    }
}

/// Whether `managedFields` give [`FIELD_MANAGER`] a CPU limit of the pod
/// (container or pod level). A manager that writes a field later takes it
/// over, so a user's own resize after Headroom's makes this false again.
pub fn limits_set_by_headroom(fields: &[ManagedFieldsEntry]) -> bool {
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

/// The CPU limits a `managedFields` entry's `fieldsV1` owns: container
/// names (`f:containers` and `f:initContainers`, keyed `k:{"name":…}`) and
/// whether it owns the pod-level one (`f:spec.f:resources.f:limits.f:cpu`).
fn owned_cpu_limits(fields: &serde_json::Value) -> (Vec<String>, bool) {
    fn limits_cpu(r: Option<&serde_json::Value>) -> bool {
        r.and_then(|r| r.get("f:limits"))
            .and_then(|l| l.get("f:cpu"))
            .is_some()
    }
    let Some(spec) = fields.get("f:spec") else {
        return (Vec::new(), false);
    };
    let mut names = Vec::new();
    for list in ["f:containers", "f:initContainers"] {
        let Some(serde_json::Value::Object(m)) = spec.get(list) else {
            continue;
        };
        for (key, c) in m {
            if !limits_cpu(c.get("f:resources")) {
                continue;
            }
            let name = key
                .strip_prefix("k:")
                .and_then(|k| serde_json::from_str::<serde_json::Value>(k).ok())
                .and_then(|k| k.get("name").and_then(|n| n.as_str()).map(str::to_string));
            if let Some(n) = name {
                names.push(n);
            }
        }
    }
    names.sort_unstable();
    (names, limits_cpu(spec.get("f:resources")))
}

/// The entry as a [`LimitWriter`]: a field manager other than
/// [`FIELD_MANAGER`] whose entry of subresource `resize` owns a CPU limit
/// of the pod. It changed that limit in place: the apiserver gives a
/// changed field to the manager that changed it, so an entry owns only what
/// its writer set last.
pub fn limit_writer(e: &ManagedFieldsEntry) -> Option<LimitWriter> {
    if e.manager.as_deref() == Some(FIELD_MANAGER) || e.subresource.as_deref() != Some("resize") {
        return None;
    }
    let (containers, pod_level) = owned_cpu_limits(&e.fields_v1.as_ref()?.0);
    (!containers.is_empty() || pod_level).then(|| LimitWriter {
        manager: e.manager.clone().unwrap_or_default(),
        containers,
        pod_level,
        at_s: e.time.as_ref().map(|t| t.0.as_second()),
    })
}

/// Every [`limit_writer`] among a pod's `managedFields`.
pub fn limit_writers(fields: &[ManagedFieldsEntry]) -> Vec<LimitWriter> {
    fields.iter().filter_map(limit_writer).collect()
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

type Quantities = BTreeMap<String, Quantity>;

/// `map[key]` parsed by `parse`; an error names `<field>.<key>`.
/// `field` names the quantity only in an error: built on failure, not for
/// every quantity of every pod each tick.
fn quantity_of(
    map: Option<&Quantities>,
    field: &dyn Fn() -> String,
    key: &str,
    parse: fn(&str) -> Result<u64, quantity::QuantityError>,
) -> Result<Option<u64>, ViewError> {
    map.and_then(|m| m.get(key))
        .map(|q| {
            parse(&q.0).map_err(|source| ViewError::Quantity {
                field: format!("{}.{key}", field()),
                source,
            })
        })
        .transpose()
}

fn q_cpu(
    map: Option<&Quantities>,
    field: &dyn Fn() -> String,
) -> Result<Option<Millis>, ViewError> {
    quantity_of(map, field, "cpu", quantity::cpu_millis)
}

fn q_mem(map: Option<&Quantities>, field: &dyn Fn() -> String) -> Result<Option<u64>, ViewError> {
    quantity_of(map, field, "memory", quantity::bytes)
}

/// Converts a `ResourceRequirements` to integers. As the apiserver does, a
/// limit with no request means request = limit. `field` names it in an
/// error only (see [`quantity_of`]).
pub fn resources(
    r: Option<&ResourceRequirements>,
    field: &dyn Fn() -> String,
) -> Result<Resources, ViewError> {
    let Some(r) = r else {
        return Ok(Resources::default());
    };
    let limits = || format!("{}.limits", field());
    let requests = || format!("{}.requests", field());
    let cpu_limit = q_cpu(r.limits.as_ref(), &limits)?;
    let mem_limit = q_mem(r.limits.as_ref(), &limits)?;
    let cpu_request = q_cpu(r.requests.as_ref(), &requests)?.or(cpu_limit);
    let mem_request = q_mem(r.requests.as_ref(), &requests)?.or(mem_limit);
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
    field: &dyn Fn() -> String,
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
        name: c.name.as_str().into(),
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
    let field = |part: &str| format!("status.containerStatuses[{}].{part}", s.name);
    let allocated = match &s.allocated_resources {
        Some(a) => Some(Resources {
            cpu_request: q_cpu(Some(a), &|| field("allocatedResources"))?,
            mem_request: q_mem(Some(a), &|| field("allocatedResources"))?,
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
            .map(|r| resources(Some(r), &|| field("resources")))
            .transpose()?,
        allocated,
    })
}

/// This node's pods as [`PodView`]s, kept from tick to tick. While the
/// watch cache holds the same object for every pod of the node (no event
/// changed one: a new `resourceVersion` always comes as a new object) and
/// none came or went, the same list is handed out again: nothing read,
/// nothing allocated. When one did, the list is made anew, with the
/// unchanged pods' views copied and only the changed ones read from their
/// `Pod` (a view is a function of the object). A relist replaces every
/// object, so the list is read whole once after one.
#[derive(Debug, Default)]
pub struct Views {
    list: Arc<Vec<PodView>>,
    /// uid → the object read (kept, so its identity stays its own), and the
    /// view's place in `list` (`None`: not readable as a view).
    /// By the Pod object's `metadata.uid` as the API has it (looked up
    /// without a copy each tick; no [`Uid`] exists before the view).
    seen: HashMap<String, (Arc<Pod>, Option<usize>)>,
}

impl Views {
    /// The views of the pods of `pods` on `node`, in their order. Each pod
    /// of the node that cannot be read is passed to `unreadable` when the
    /// list is made anew; a list handed out again has the same unreadable
    /// pods as last time.
    pub fn refresh(
        &mut self,
        pods: &[Arc<Pod>],
        node: &str,
        mut unreadable: impl FnMut(&Pod, &ViewError),
    ) -> Arc<Vec<PodView>> {
        let on_node =
            |p: &&Arc<Pod>| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
        let mut n = 0;
        let same = pods.iter().filter(on_node).all(|p| {
            n += 1;
            let uid = p.metadata.uid.as_deref().unwrap_or("");
            self.seen.get(uid).is_some_and(|(o, _)| Arc::ptr_eq(o, p))
        }) && n == self.seen.len();
        if same {
            return Arc::clone(&self.list);
        }
        let old = std::mem::take(&mut self.seen);
        let mut list = Vec::with_capacity(n);
        for p in pods.iter().filter(on_node) {
            let view = match old.get(p.metadata.uid.as_deref().unwrap_or("")) {
                Some((o, Some(i))) if Arc::ptr_eq(o, p) => Ok(self.list[*i].clone()),
                _ => PodView::try_from(p.as_ref()),
            };
            let at = match view {
                Ok(v) => {
                    list.push(v);
                    Some(list.len() - 1)
                }
                Err(e) => {
                    unreadable(p, &e);
                    None
                }
            };
            self.seen.insert(uid(p), (Arc::clone(p), at));
        }
        self.list = Arc::new(list);
        Arc::clone(&self.list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_pods_cgroup_is_named_after_its_config_hash_every_other_after_its_uid() {
        let mirror = pod(serde_json::json!({
            "metadata": {"name": "etcd-cp", "namespace": "kube-system", "uid": "api-uid",
                         "annotations": {"kubernetes.io/config.mirror": "0f3c9a",
                                         "kubernetes.io/config.hash": "0f3c9a"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "etcd", "image": "x"}]}
        }));
        let v = PodView::try_from(&mirror).unwrap();
        assert_eq!(v.uid.as_str(), "api-uid");
        assert_eq!(v.cgroup_id.as_str(), "0f3c9a");
        assert!(v.static_pod);

        let plain = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-7",
                         "annotations": {"kubernetes.io/config.mirror": ""}},
            "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "x"}]}
        }));
        let v = PodView::try_from(&plain).unwrap();
        assert_eq!(v.cgroup_id.as_str(), "u-7");
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("pod json")
    }

    fn on_node(name: &str, uid: &str, rv: &str, node: &str) -> Arc<Pod> {
        Arc::new(pod(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                "requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}]},
            "status": {"phase": "Running"}
        })))
    }

    /// Unchanged pods: the same list again (nothing read or allocated). A
    /// pod the cache holds a new object of is read again, the others' views
    /// kept;
    /// a pod gone leaves the list; another node's pod never enters it; an
    /// unreadable pod is reported when the list is made.
    #[test]
    fn views_are_reused_while_the_cache_holds_the_same_objects() {
        let mut v = Views::default();
        let mut pods = vec![
            on_node("a", "u-a", "1", "n1"),
            on_node("b", "u-b", "1", "n1"),
            on_node("x", "u-x", "1", "n2"),
        ];
        let none = |_: &Pod, e: &ViewError| panic!("unexpected unreadable pod: {e}");
        let first = v.refresh(&pods, "n1", none);
        assert_eq!(
            first.iter().map(|p| &*p.name).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let again = v.refresh(&pods, "n1", none);
        assert!(
            Arc::ptr_eq(&first, &again),
            "nothing changed: the same list"
        );
        let mut b2 = (*on_node("b", "u-b", "2", "n1")).clone();
        b2.metadata.labels = Some([("k".to_string(), "v".to_string())].into());
        pods[1] = Arc::new(b2);
        let changed = v.refresh(&pods, "n1", none);
        assert!(!Arc::ptr_eq(&first, &changed));
        assert_eq!(changed[0], first[0]);
        assert_eq!(changed[1].resource_version.as_deref(), Some("2"));
        pods.remove(0);
        let gone = v.refresh(&pods, "n1", none);
        assert_eq!(gone.iter().map(|p| &*p.name).collect::<Vec<_>>(), ["b"]);
        let mut bad = (*on_node("c", "u-c", "1", "n1")).clone();
        bad.spec.as_mut().unwrap().containers[0].resources =
            Some(serde_json::from_value(serde_json::json!({"limits": {"cpu": "lots"}})).unwrap());
        pods.push(Arc::new(bad));
        let mut seen = Vec::new();
        let with_bad = v.refresh(&pods, "n1", |p, _| seen.push(p.metadata.name.clone()));
        assert_eq!(seen, [Some("c".to_string())]);
        assert_eq!(with_bad.len(), 1);
        let mut again = 0;
        let still = v.refresh(&pods, "n1", |_, _| again += 1);
        assert!(
            Arc::ptr_eq(&with_bad, &still) && again == 0,
            "unchanged: not read again"
        );
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

    /// A `managedFields` entry owning `fields`.
    fn entry(
        manager: &str,
        subresource: Option<&str>,
        fields: serde_json::Value,
    ) -> serde_json::Value {
        let mut e = serde_json::json!({"manager": manager, "operation": "Update",
            "time": "2026-07-01T12:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields});
        if let Some(s) = subresource {
            e["subresource"] = s.into();
        }
        e
    }

    fn container_fields(name: &str, what: serde_json::Value) -> serde_json::Value {
        serde_json::json!({format!("k:{{\"name\":\"{name}\"}}"): {"f:resources": what}})
    }

    #[test]
    fn limit_writers_are_other_managers_owning_a_cpu_limit_through_resize() {
        let cpu_limit = || serde_json::json!({"f:limits": {"f:cpu": {}}});
        let fields = serde_json::json!({"f:spec": {
            "f:containers": container_fields("app", cpu_limit()),
            "f:initContainers": container_fields("side", cpu_limit())}});
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "managedFields": [
                // The creator: the declared limits, not an in-place change.
                entry("kube-controller-manager", None, fields.clone()),
                // Headroom's own.
                entry(FIELD_MANAGER, Some("resize"), fields.clone()),
                // VPA with controlledValues: RequestsOnly owns requests only.
                entry("vpa-requests", Some("resize"), serde_json::json!({"f:spec": {
                    "f:containers": container_fields("app", serde_json::json!({"f:requests": {"f:cpu": {}}}))}})),
                // Memory limits are not Headroom's concern.
                entry("mem", Some("resize"), serde_json::json!({"f:spec": {
                    "f:containers": container_fields("app", serde_json::json!({"f:limits": {"f:memory": {}}}))}})),
                entry("vpa-updater", Some("resize"), fields),
                entry("kubectl-patch", Some("resize"), serde_json::json!({"f:spec": {
                    "f:resources": {"f:limits": {"f:cpu": {}}}}})),
            ]},
            "spec": {"containers": [{"name": "app"}]}
        }));
        let v = PodView::try_from(&p).unwrap();
        assert_eq!(
            v.limit_writers,
            [
                LimitWriter {
                    manager: "vpa-updater".into(),
                    containers: vec!["app".into(), "side".into()],
                    pod_level: false,
                    at_s: Some(1_782_907_200),
                },
                LimitWriter {
                    manager: "kubectl-patch".into(),
                    containers: vec![],
                    pod_level: true,
                    at_s: Some(1_782_907_200),
                },
            ]
        );
        assert!(v.limits_set_by_headroom);
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
}
