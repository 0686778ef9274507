//! Plain data that flows between layers. The kube layer turns a `Pod` into a
//! [`PodView`] (`crate::kube::view`); policy, verification and metrics read
//! only these types, so tests can build them by hand and no layer needs the
//! API types of another.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// CPU in millicores.
pub type Millis = u64;

/// A pod's (or its owner's) `metadata.uid`: the key of what the agent
/// remembers about an API object (a name can be reused by a new object; a
/// uid cannot). Distinct from [`CgroupPodId`], the id the kubelet names the
/// pod's cgroup after: the two differ for a static pod, so a map keyed by
/// one cannot be read with the other. Prints, debugs and serializes as the
/// bare string, so logs and `explain` output read as before.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uid(Arc<str>);

/// The pod id in a pod cgroup's name (`pod<id>`, systemd's `_` undone): the
/// key of everything read from cgroupfs. For an API pod it is its
/// `metadata.uid`, except for a static pod's mirror, whose cgroup is named
/// after the static pod's config hash ([`PodView::cgroup_id`], set by
/// `kube::view::cgroup_pod_id`, the one conversion).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupPodId(Arc<str>);

/// The parts both key types share: built from a string on purpose, read as
/// one with `as_str`, never compared with a bare string or with each other.
/// Shared (`Arc<str>`): every tick copies each pod's keys into its maps and
/// snapshots, and a copy is then a count, not an allocation.
macro_rules! string_key {
    ($t:ident) => {
        impl $t {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $t {
            fn from(s: String) -> Self {
                Self(s.into())
            }
        }

        impl From<&str> for $t {
            fn from(s: &str) -> Self {
                Self(s.into())
            }
        }

        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}
string_key!(Uid);
string_key!(CgroupPodId);

impl CgroupPodId {
    /// Serialises the id (a field with `#[serde(flatten, serialize_with)]`)
    /// as `pod_id`, and as `uid` too, the name it had before the two key
    /// types, for one release: `slack --json` and `plan --json` readers
    /// move to `pod_id`, then `uid` goes (docs/operations.md).
    pub fn serialize_keys<S: serde::Serializer>(id: &Self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("pod_id", id)?;
        m.serialize_entry("uid", id)?;
        m.end()
    }
}

/// A name read from the API (namespace, pod, container) and copied into
/// every tick's decisions, plans and labels: shared, so a copy is a count,
/// not an allocation.
pub type Name = Arc<str>;

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
/// Pod annotation: an RFC 3339 time (e.g. `2026-07-01T12:00:00Z`). CPU limits
/// other field managers changed in place at or before it are Headroom's to
/// manage again (`policy::writers`); a later change pauses it again.
pub const ANN_RESUME: &str = "headroom.dev/resume";

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
    pub name: Name,
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
    pub namespace: Name,
    pub name: Name,
    pub uid: Uid,
    /// The id the kubelet names this pod's cgroup after: `uid`, or a static
    /// pod's config hash. Joins with anything read from cgroupfs use it.
    pub cgroup_id: CgroupPodId,
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
    /// Field managers other than [`FIELD_MANAGER`] that changed a CPU limit
    /// of this pod in place (`managedFields` of subresource `resize`).
    pub limit_writers: Vec<LimitWriter>,
    /// Controller owner (`ownerReferences[controller=true]`), whose pod
    /// template holds the limits the workload declares.
    pub owner: Option<OwnerRef>,
}

/// Which cgroup of a pod: verification compares it, metrics label it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Pod,
    /// A container cgroup, by container name.
    Container(String),
}

impl Target {
    /// The container name, `""` for the pod cgroup (a metric label value).
    pub fn container(&self) -> &str {
        match self {
            Target::Pod => "",
            Target::Container(n) => n,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pod => f.write_str("pod cgroup"),
            Target::Container(n) => write!(f, "container {n}"),
        }
    }
}

/// A field manager other than [`FIELD_MANAGER`] whose `managedFields` entry
/// of subresource `resize` owns CPU limits of the pod: it changed them in
/// place (a pod's limits change only through `resize` once it exists; the
/// creator's entry has no subresource).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitWriter {
    pub manager: String,
    /// The limits its entry owns: container names (apps and sidecars), and
    /// `pod_level` for `spec.resources.limits.cpu`.
    pub containers: Vec<String>,
    pub pod_level: bool,
    /// The entry's `time` (Unix seconds): the writer's latest change through
    /// `resize`; `None` when the entry has none.
    pub at_s: Option<i64>,
}

/// A pod's controller, as its `ownerReferences` name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OwnerRef {
    pub kind: String,
    pub name: String,
    pub uid: Uid,
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
                .map(|c| (c.name.to_string(), c.resources.cpu_limit))
                .collect(),
            pod: v.pod_resources.and_then(|r| r.cpu_limit),
        }
    }

    /// Whether these are the limits in `v`'s spec as they are now (what
    /// [`Self::of`] would make), told in place: asked of every Burstable pod
    /// every tick, it makes no map.
    pub fn is_of(&self, v: &PodView) -> bool {
        self.pod == v.pod_resources.and_then(|r| r.cpu_limit)
            && self.containers.len() == v.containers.len()
            && v.containers
                .iter()
                .all(|c| self.containers.get(&*c.name) == Some(&c.resources.cpu_limit))
    }

    /// Sum of the declared limits of `names`; `None` if one has none (or is
    /// not in the template: an injected sidecar).
    pub fn total_of<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Option<Millis> {
        limits_total(names, |n| self.containers.get(n).copied())
    }
}

/// The one rule of a declared total: the sum of what `limit_of` says of each
/// of `names`, `None` when a name is not there (`None`) or has no limit
/// (`Some(None)`).
fn limits_total<'a>(
    names: impl IntoIterator<Item = &'a str>,
    limit_of: impl Fn(&str) -> Option<Option<Millis>>,
) -> Option<Millis> {
    names.into_iter().map(|n| limit_of(n).flatten()).sum()
}

impl PodView {
    /// [`DeclaredLimits::total_of`] of this pod's own spec as it is now,
    /// read in place (the policy asks it per pod per tick: no map is made).
    pub fn own_limits_total_of<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Option<Millis> {
        limits_total(names, |n| {
            self.containers
                .iter()
                .find(|c| &*c.name == n)
                .map(|c| c.resources.cpu_limit)
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup pod id is written as `pod_id` and, for one release, as
    /// `uid`, beside the struct's other fields.
    #[test]
    fn a_cgroup_pod_id_serialises_under_both_keys() {
        #[derive(serde::Serialize)]
        struct Row {
            #[serde(flatten, serialize_with = "CgroupPodId::serialize_keys")]
            id: CgroupPodId,
            usage_m: u64,
        }
        let v = serde_json::to_value(Row {
            id: CgroupPodId::from("abc-1"),
            usage_m: 5,
        })
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"pod_id": "abc-1", "uid": "abc-1", "usage_m": 5})
        );
    }

    /// The in-place total and the map's agree: limited containers sum, a
    /// container without a limit or not in the spec leaves it unknown.
    #[test]
    fn own_limits_total_reads_as_the_declared_limits_map_does() {
        use crate::testkit::{PodBuilder, container, cpu};
        let pod = PodBuilder::new("ns", "p", "u")
            .containers(vec![
                container("a", cpu(Some(100), Some(300))),
                container("b", cpu(Some(100), Some(200))),
                container("free", cpu(Some(100), None)),
            ])
            .build();
        let map = DeclaredLimits::of(&pod);
        for names in [
            &["a"][..],
            &["a", "b"],
            &["a", "free"],
            &["a", "sidecar"],
            &[],
        ] {
            let own = pod.own_limits_total_of(names.iter().copied());
            assert_eq!(own, map.total_of(names.iter().copied()), "{names:?}");
        }
        assert_eq!(pod.own_limits_total_of(["a", "b"]), Some(500));
        assert_eq!(pod.own_limits_total_of(["a", "free"]), None);
        assert_eq!(pod.own_limits_total_of(["sidecar"]), None);
    }

    /// `is_of` says what comparing with a fresh `of` says: equal for the
    /// spec it was made from, unequal after any limit, the pod-level limit,
    /// or the set of containers changed.
    #[test]
    fn declared_limits_are_told_in_place_as_a_fresh_map_tells_them() {
        use crate::testkit::{PodBuilder, container, cpu};
        let base = PodBuilder::new("ns", "p", "u")
            .containers(vec![
                container("a", cpu(Some(100), Some(300))),
                container("free", cpu(Some(100), None)),
            ])
            .build();
        let d = DeclaredLimits::of(&base);
        let mut raised = base.clone();
        raised.containers[0].resources.cpu_limit = Some(400);
        let mut limited = base.clone();
        limited.containers[1].resources.cpu_limit = Some(50);
        let mut fewer = base.clone();
        fewer.containers.pop();
        let mut more = base.clone();
        more.containers
            .push(container("b", cpu(Some(100), Some(300))));
        let mut renamed = base.clone();
        renamed.containers[1].name = "other".into();
        let mut pod_level = base.clone();
        pod_level.pod_resources = Some(cpu(Some(200), Some(600)));
        for (what, v) in [
            ("same", &base),
            ("raised", &raised),
            ("limited", &limited),
            ("fewer", &fewer),
            ("more", &more),
            ("renamed", &renamed),
            ("pod-level", &pod_level),
        ] {
            assert_eq!(d.is_of(v), DeclaredLimits::of(v) == d, "{what}");
        }
        assert!(d.is_of(&base));
        assert!(!d.is_of(&raised));
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
