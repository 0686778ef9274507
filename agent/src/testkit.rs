//! Builders of the plain model values, for unit tests, benches and the
//! integration tests (cargo feature `test-kit`; always on under `cfg(test)`).
//! The one place a whole [`PodView`] is spelled out: a new field is added
//! here, not in every test.
//!
//! ```
//! use headroom::testkit::{PodBuilder, container, cpu};
//! let p = PodBuilder::new("ns", "web", "uid-web")
//!     .node("node-a")
//!     .containers(vec![container("app", cpu(Some(100), Some(500)))])
//!     .managed()
//!     .qos_from_spec()
//!     .build();
//! assert_eq!(p.cpu_request(), 100);
//! ```

pub mod calm_node;
pub mod cgroup_tree;

use std::collections::BTreeMap;

use crate::model::{
    ANN_MANAGED, ContainerKind, ContainerSpec, ContainerState, Millis, PodView, Qos, ResizePolicy,
    ResizeState, Resources, compute_qos,
};
use crate::policy::PodInput;

/// A `resources` stanza with CPU and memory.
pub const fn resources(
    cpu_request: Option<Millis>,
    cpu_limit: Option<Millis>,
    mem_request: Option<u64>,
    mem_limit: Option<u64>,
) -> Resources {
    Resources {
        cpu_request,
        cpu_limit,
        mem_request,
        mem_limit,
    }
}

/// A `resources` stanza with CPU only.
pub const fn cpu(request: Option<Millis>, limit: Option<Millis>) -> Resources {
    resources(request, limit, None, None)
}

/// An app container whose CPU resize needs no restart.
pub fn container(name: &str, resources: Resources) -> ContainerSpec {
    ContainerSpec {
        name: name.into(),
        kind: ContainerKind::App,
        resources,
        cpu_resize_policy: ResizePolicy::NotRequired,
    }
}

/// A sidecar (an init container with `restartPolicy: Always`).
pub fn sidecar(name: &str, resources: Resources) -> ContainerSpec {
    ContainerSpec {
        kind: ContainerKind::Sidecar,
        ..container(name, resources)
    }
}

/// A [`PodView`] under construction: starts as a Running Burstable pod of
/// generation 1 with no node, no containers and no annotations.
#[derive(Debug, Clone)]
pub struct PodBuilder(PodView);

impl From<PodView> for PodBuilder {
    /// Goes on from an existing view.
    fn from(view: PodView) -> Self {
        PodBuilder(view)
    }
}

impl PodBuilder {
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        PodBuilder(PodView {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            cgroup_id: uid.into(),
            node_name: None,
            generation: 1,
            resource_version: None,
            phase: Some("Running".into()),
            terminating: false,
            static_pod: false,
            windows: false,
            qos: Qos::Burstable,
            containers: Vec::new(),
            pod_resources: None,
            overhead_cpu: None,
            statuses: Vec::new(),
            resize: ResizeState::default(),
            annotations: BTreeMap::new(),
            limits_set_by_headroom: false,
            limit_writers: Vec::new(),
            owner: None,
        })
    }

    pub fn node(mut self, node: &str) -> Self {
        self.0.node_name = Some(node.to_string());
        self
    }

    pub fn containers(mut self, containers: Vec<ContainerSpec>) -> Self {
        self.0.containers = containers;
        self
    }

    /// `spec.resources` (pod-level), or none.
    pub fn pod_resources(mut self, r: Option<Resources>) -> Self {
        self.0.pod_resources = r;
        self
    }

    pub fn overhead_cpu(mut self, m: Option<Millis>) -> Self {
        self.0.overhead_cpu = m;
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .annotations
            .insert(key.to_string(), value.to_string());
        // As the view is built from a Pod: the mirror annotation names the cgroup.
        self.0.cgroup_id = crate::kube::view::cgroup_pod_id(&self.0.uid, &self.0.annotations);
        self.0.static_pod = self
            .0
            .annotations
            .contains_key(crate::kube::view::MIRROR_ANNOTATION);
        self
    }

    /// Opted in by its own annotation.
    pub fn managed(self) -> Self {
        self.annotation(ANN_MANAGED, "true")
    }

    /// One running status per container (as the containers are now), with
    /// the runtime and the id `id(index, container)` gives.
    pub fn running(mut self, runtime: &str, id: impl Fn(usize, &ContainerSpec) -> String) -> Self {
        self.0.statuses = self
            .0
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| ContainerState {
                name: c.name.to_string(),
                container_id: Some(id(i, c)),
                runtime: Some(runtime.to_string()),
                running: true,
                ..Default::default()
            })
            .collect();
        self
    }

    /// The kubelet has seen generation `g` (status and resize conditions).
    pub fn observed_generation(mut self, g: i64) -> Self {
        self.0.resize.observed_generation = Some(g);
        self
    }

    /// The QoS class the apiserver computes from the spec as it is now.
    pub fn qos_from_spec(mut self) -> Self {
        self.0.qos = compute_qos(&self.0.containers, self.0.pod_resources.as_ref());
        self
    }

    pub fn build(self) -> PodView {
        self.0
    }
}

/// A pod's input to a policy round: its usage, no throttling, no learned
/// floor, no known declaration, its namespace not opted in.
pub fn pod_input(pod: &PodView, usage_m: Millis) -> PodInput<'_> {
    PodInput {
        pod,
        namespace_opted_in: false,
        usage_m,
        throttled_ratio: 0.0,
        extra_floor_m: None,
        declared: None,
        held_at_m: None,
    }
}
