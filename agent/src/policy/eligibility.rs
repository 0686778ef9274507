//! Who is managed, and in which shape. Every pod left alone gets a reason
//! with a stable snake_case name for metrics and `explain`.

use serde::{Serialize, Serializer};

use crate::model::{ANN_ADOPT, ANN_MANAGED, Millis, PodView, Qos, ResizePolicy};

/// A wall clock for tests: 2026-07-01T12:00:00Z.
#[cfg(test)]
pub const TEST_WALL_CLOCK_S: i64 = 1_782_907_200;

/// Node-wide facts eligibility needs besides the pod.
#[derive(Debug, Clone, Copy)]
pub struct EligibilityCtx<'a> {
    /// The node this agent runs on.
    pub node_name: &'a str,
    /// The pod's namespace carries the label `headroom.dev/managed=true`.
    pub namespace_opted_in: bool,
    /// Whether the cluster admits resizes of pods with pod-level resources
    /// (`dryRun=All` probe); `None` until probed.
    pub pod_level_resize_supported: Option<bool>,
    /// The wall clock (Unix seconds), against which `headroom.dev/resume`
    /// times are read (`super::writers`).
    pub wall_clock_s: i64,
}

/// Why a pod is left alone. [`Unmanaged::reason`] is the metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unmanaged {
    /// Bound to another node (or not bound).
    OtherNode,
    /// Pod annotation `headroom.dev/managed=false`.
    OptedOut,
    /// Neither the namespace label nor the pod annotation opts in.
    NotOptedIn,
    /// Phase is not Running.
    NotRunning,
    /// Has a deletion timestamp.
    Terminating,
    /// Mirror of a static pod: the apiserver refuses its resize.
    StaticPod,
    /// Windows pod: the apiserver refuses its resize.
    Windows,
    /// Guaranteed through pod-level resources: any change flips QoS.
    PodLevelGuaranteed,
    /// Guaranteed: a limit change would change the QoS class.
    Guaranteed,
    /// BestEffort: adding a limit would change the QoS class.
    BestEffort,
    /// Another field manager changed a CPU limit in place (`resize`), and
    /// `headroom.dev/resume` does not hand it back (`super::writers`).
    OtherWriter,
    /// `PodResizePending` is true: the kubelet has not taken the last resize.
    ResizePending,
    /// `PodResizeInProgress` is true.
    ResizeInProgress,
    /// The kubelet has not yet observed the pod's latest generation.
    ResizeUnobserved,
    /// Pod-level resources, and the cluster's support was not probed yet.
    PodLevelUnknown,
    /// Pod-level resources, and the cluster refuses their resize (gate off).
    PodLevelUnsupported,
    /// No CPU limit to move, and no `headroom.dev/adopt-unlimited=true`.
    NoCpuLimit,
    /// A container whose limit would change has cpu `resizePolicy`
    /// `RestartContainer`: a resize would restart it.
    RestartPolicy,
    /// A limit to manage but no CPU request to weigh it by.
    NoCpuRequest,
}

impl Unmanaged {
    /// Every reason, for metrics that export zeros.
    pub const ALL: [Unmanaged; 19] = [
        Unmanaged::OtherNode,
        Unmanaged::OptedOut,
        Unmanaged::NotOptedIn,
        Unmanaged::NotRunning,
        Unmanaged::Terminating,
        Unmanaged::StaticPod,
        Unmanaged::Windows,
        Unmanaged::PodLevelGuaranteed,
        Unmanaged::Guaranteed,
        Unmanaged::BestEffort,
        Unmanaged::OtherWriter,
        Unmanaged::ResizePending,
        Unmanaged::ResizeInProgress,
        Unmanaged::ResizeUnobserved,
        Unmanaged::PodLevelUnknown,
        Unmanaged::PodLevelUnsupported,
        Unmanaged::NoCpuLimit,
        Unmanaged::RestartPolicy,
        Unmanaged::NoCpuRequest,
    ];

    /// Stable snake_case name (metrics label, JSON).
    /// Left alone only until the kubelet finishes a resize: the pod is
    /// otherwise managed (opted in, Running, Burstable).
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Unmanaged::ResizePending | Unmanaged::ResizeInProgress | Unmanaged::ResizeUnobserved
        )
    }

    pub fn reason(self) -> &'static str {
        match self {
            Unmanaged::OtherNode => "other_node",
            Unmanaged::OptedOut => "opted_out",
            Unmanaged::NotOptedIn => "not_opted_in",
            Unmanaged::NotRunning => "not_running",
            Unmanaged::Terminating => "terminating",
            Unmanaged::StaticPod => "static_pod",
            Unmanaged::Windows => "windows",
            Unmanaged::PodLevelGuaranteed => "pod_level_guaranteed",
            Unmanaged::Guaranteed => "guaranteed",
            Unmanaged::BestEffort => "best_effort",
            Unmanaged::OtherWriter => "other_writer",
            Unmanaged::ResizePending => "resize_pending",
            Unmanaged::ResizeInProgress => "resize_in_progress",
            Unmanaged::ResizeUnobserved => "resize_unobserved",
            Unmanaged::PodLevelUnknown => "pod_level_unknown",
            Unmanaged::PodLevelUnsupported => "pod_level_unsupported",
            Unmanaged::NoCpuLimit => "no_cpu_limit",
            Unmanaged::RestartPolicy => "restart_policy",
            Unmanaged::NoCpuRequest => "no_cpu_request",
        }
    }

    /// One line for humans (`explain`).
    pub fn describe(self) -> &'static str {
        match self {
            Unmanaged::OtherNode => "pod is bound to another node",
            Unmanaged::OptedOut => "pod annotation headroom.dev/managed=false",
            Unmanaged::NotOptedIn => {
                "neither namespace label nor pod annotation headroom.dev/managed=true"
            }
            Unmanaged::NotRunning => "pod is not Running",
            Unmanaged::Terminating => "pod is terminating",
            Unmanaged::StaticPod => "static pods cannot be resized",
            Unmanaged::Windows => "windows pods cannot be resized",
            Unmanaged::PodLevelGuaranteed => {
                "Guaranteed through pod-level resources; any CPU limit change would change QoS"
            }
            Unmanaged::Guaranteed => "Guaranteed; a CPU limit change would change QoS",
            Unmanaged::BestEffort => "BestEffort; adding a CPU limit would change QoS",
            Unmanaged::OtherWriter => {
                "another field manager changed a CPU limit in place; Headroom leaves the pod's limits to it (headroom.dev/resume hands them back)"
            }
            Unmanaged::ResizePending => "a resize is pending (PodResizePending)",
            Unmanaged::ResizeInProgress => "a resize is in progress (PodResizeInProgress)",
            Unmanaged::ResizeUnobserved => "the kubelet has not observed the latest spec yet",
            Unmanaged::PodLevelUnknown => {
                "pod-level resources; cluster support for their resize not probed yet"
            }
            Unmanaged::PodLevelUnsupported => {
                "pod-level resources; the cluster refuses their resize (InPlacePodLevelResourcesVerticalScaling off)"
            }
            Unmanaged::NoCpuLimit => {
                "no CPU limit to manage; set headroom.dev/adopt-unlimited=true to add one (one-way)"
            }
            Unmanaged::RestartPolicy => {
                "a container that would be resized has cpu resizePolicy RestartContainer"
            }
            Unmanaged::NoCpuRequest => "no CPU request to weigh the limit by",
        }
    }
}

impl std::fmt::Display for Unmanaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl Serialize for Unmanaged {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.reason())
    }
}

/// A managed pod's containers, in line up to four (an app, or an app and its
/// sidecars): asked of every pod every tick, so no list is allocated for them.
pub type ManagedContainers = smallvec::SmallVec<[ManagedContainer; 4]>;

/// A container whose CPU limit Headroom sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedContainer {
    pub name: crate::model::Name,
    /// Always > 0.
    pub request_m: Millis,
    /// `None`: unlimited now; the first patch adopts it.
    pub limit_m: Option<Millis>,
}

/// Every pod's answer to [`eligibility`] for one tick, in the order of the
/// pods it was asked for: asked once, read by the contention signal (which
/// pods are Headroom's) and by the policy round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Eligibility(Vec<Result<ManagedShape, Unmanaged>>);

impl Eligibility {
    /// Asks [`eligibility`] of each of `views`, with the node's context.
    pub fn of(
        views: &[PodView],
        node_name: &str,
        opted_in_namespaces: &foldhash::HashSet<String>,
        pod_level_resize_supported: Option<bool>,
        wall_clock_s: i64,
    ) -> Self {
        Self(
            views
                .iter()
                .map(|v| {
                    eligibility(
                        v,
                        &EligibilityCtx {
                            node_name,
                            namespace_opted_in: opted_in_namespaces.contains(&*v.namespace),
                            pod_level_resize_supported,
                            wall_clock_s,
                        },
                    )
                })
                .collect(),
        )
    }

    /// From answers already asked, in the pods' order.
    pub fn from_answers(answers: Vec<Result<ManagedShape, Unmanaged>>) -> Self {
        Self(answers)
    }

    /// The answer for the `index`-th pod.
    pub fn get(&self, index: usize) -> Option<&Result<ManagedShape, Unmanaged>> {
        self.0.get(index)
    }

    /// Whether the `index`-th pod is Headroom's this tick: eligible, or held
    /// only by a resize in flight (pending, in progress, not yet observed by
    /// the kubelet), which leaves it Headroom's once done.
    pub fn is_headrooms(&self, index: usize) -> bool {
        match self.0.get(index) {
            Some(Ok(_)) => true,
            Some(Err(u)) => u.is_transient(),
            None => false,
        }
    }
}

/// What Headroom patches for a managed pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManagedShape {
    /// Container limits (no pod-level CPU). Containers not listed have no
    /// CPU limit and are left unlimited.
    Containers(ManagedContainers),
    /// Only `spec.resources.limits.cpu`; container limits are never touched.
    PodLevel {
        /// Pod-level CPU request (> 0).
        request_m: Millis,
        /// `None`: no pod-level CPU limit yet; the first patch adopts.
        limit_m: Option<Millis>,
    },
}

impl ManagedShape {
    /// The request the managed limit is measured against.
    pub fn request_m(&self) -> Millis {
        match self {
            ManagedShape::Containers(cs) => cs.iter().map(|c| c.request_m).sum(),
            ManagedShape::PodLevel { request_m, .. } => *request_m,
        }
    }

    /// Current managed limit; `None` if any managed part is unlimited.
    pub fn current_limit_m(&self) -> Option<Millis> {
        match self {
            ManagedShape::Containers(cs) => cs.iter().map(|c| c.limit_m).sum(),
            ManagedShape::PodLevel { limit_m, .. } => *limit_m,
        }
    }
}

fn flag(pod: &PodView, key: &str) -> Option<bool> {
    let v = pod.annotation(key)?.trim();
    if v.eq_ignore_ascii_case("true") {
        Some(true)
    } else if v.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// Decides whether Headroom manages `pod`, and how.
///
/// Opt-in: namespace label or pod annotation `headroom.dev/managed=true`;
/// the pod annotation `false` wins. Adoption of unlimited containers (or of
/// a missing pod-level CPU limit) needs `headroom.dev/adopt-unlimited=true`
/// and only applies where a CPU request exists: adding a limit to a
/// container without request would make the apiserver default the request
/// to the limit.
pub fn eligibility(pod: &PodView, ctx: &EligibilityCtx<'_>) -> Result<ManagedShape, Unmanaged> {
    if pod.node_name.as_deref() != Some(ctx.node_name) {
        return Err(Unmanaged::OtherNode);
    }
    match flag(pod, ANN_MANAGED) {
        Some(false) => return Err(Unmanaged::OptedOut),
        Some(true) => {}
        None if ctx.namespace_opted_in => {}
        None => return Err(Unmanaged::NotOptedIn),
    }
    if !pod.is_running() {
        return Err(Unmanaged::NotRunning);
    }
    if pod.terminating {
        return Err(Unmanaged::Terminating);
    }
    if pod.static_pod {
        return Err(Unmanaged::StaticPod);
    }
    if pod.windows {
        return Err(Unmanaged::Windows);
    }
    let pod_level = pod.pod_resources.is_some();
    match pod.qos {
        Qos::Guaranteed if pod_level => return Err(Unmanaged::PodLevelGuaranteed),
        Qos::Guaranteed => return Err(Unmanaged::Guaranteed),
        Qos::BestEffort => return Err(Unmanaged::BestEffort),
        Qos::Burstable => {}
    }
    if pod.resize.pending.is_some() {
        return Err(Unmanaged::ResizePending);
    }
    if pod.resize.in_progress.is_some() {
        return Err(Unmanaged::ResizeInProgress);
    }
    if pod
        .resize
        .observed_generation
        .is_some_and(|g| g < pod.generation)
    {
        return Err(Unmanaged::ResizeUnobserved);
    }
    // After the resize conditions, which pass: while another writer's resize
    // is in flight the pod is held as any resizing pod is.
    if super::writers::yields_to(pod, ctx.wall_clock_s).is_some() {
        return Err(Unmanaged::OtherWriter);
    }
    // With the gate off, every resize of a pod with spec.resources is
    // refused, even a container-only one (docs/kubelet-behaviour.md §4).
    if pod_level {
        match ctx.pod_level_resize_supported {
            None => return Err(Unmanaged::PodLevelUnknown),
            Some(false) => return Err(Unmanaged::PodLevelUnsupported),
            Some(true) => {}
        }
    }
    let adopt = flag(pod, ANN_ADOPT) == Some(true);
    match pod.pod_resources {
        Some(pr) if pr.cpu_request.is_some() || pr.cpu_limit.is_some() => {
            pod_level_shape(pod, pr.cpu_request, pr.cpu_limit, adopt)
        }
        _ => container_shape(pod, adopt),
    }
}

fn pod_level_shape(
    pod: &PodView,
    request: Option<Millis>,
    limit: Option<Millis>,
    adopt: bool,
) -> Result<ManagedShape, Unmanaged> {
    if limit.is_none() && !adopt {
        return Err(Unmanaged::NoCpuLimit);
    }
    // Containers without their own limit run under the pod limit. Whether a
    // pod-level resize restarts them is not pinned down; do not risk it.
    if pod.containers.iter().any(|c| {
        c.resources.cpu_limit.is_none() && c.cpu_resize_policy == ResizePolicy::RestartContainer
    }) {
        return Err(Unmanaged::RestartPolicy);
    }
    match request {
        Some(r) if r > 0 => Ok(ManagedShape::PodLevel {
            request_m: r,
            limit_m: limit,
        }),
        _ => Err(Unmanaged::NoCpuRequest),
    }
}

fn container_shape(pod: &PodView, adopt: bool) -> Result<ManagedShape, Unmanaged> {
    let mut managed = ManagedContainers::new();
    for c in &pod.containers {
        let r = c.resources;
        let take = r.cpu_limit.is_some() || (adopt && r.cpu_request.is_some_and(|q| q > 0));
        if !take {
            continue;
        }
        if c.cpu_resize_policy == ResizePolicy::RestartContainer {
            return Err(Unmanaged::RestartPolicy);
        }
        match r.cpu_request {
            Some(q) if q > 0 => managed.push(ManagedContainer {
                name: c.name.clone(),
                request_m: q,
                limit_m: r.cpu_limit,
            }),
            _ => return Err(Unmanaged::NoCpuRequest),
        }
    }
    if managed.is_empty() {
        return Err(Unmanaged::NoCpuLimit);
    }
    Ok(ManagedShape::Containers(managed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        ANN_ADOPT, ANN_MANAGED, ANN_RESUME, LimitWriter, PodView, Qos, ResizePolicy, Resources,
    };

    /// `kubectl-patch` resized container `a`'s limit at the test clock.
    fn other_writer() -> LimitWriter {
        LimitWriter {
            manager: "kubectl-patch".into(),
            containers: vec!["a".into()],
            pod_level: false,
            at_s: Some(TEST_WALL_CLOCK_S),
        }
    }
    use crate::policy::tests::fixtures::*;

    #[test]
    fn reason_names_are_unique_snake_case() {
        let mut seen = foldhash::HashSet::default();
        for r in Unmanaged::ALL {
            let s = r.reason();
            assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{s}");
            assert!(seen.insert(s), "duplicate {s}");
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{s}\""));
        }
    }

    #[test]
    fn managed_container_pod_is_eligible() {
        let p = simple("a", 100, Some(500));
        let shape = eligibility(&p, &ctx(None)).unwrap();
        assert_eq!(shape.request_m(), 100);
        assert_eq!(shape.current_limit_m(), Some(500));
    }

    /// One change to a managed pod (`simple("a", 100, Some(500))`) and the
    /// reason it gives (`None`: still managed).
    type Change = (Option<Unmanaged>, fn(&mut PodView));

    // One row a line, so the table reads as one.
    #[rustfmt::skip]
    const ONE_CHANGE: &[Change] = &[
        (Some(Unmanaged::OtherNode), |p| p.node_name = Some("node-b".into())),
        (Some(Unmanaged::OtherNode), |p| p.node_name = None),
        (Some(Unmanaged::NotRunning), |p| p.phase = Some("Pending".into())),
        (Some(Unmanaged::Terminating), |p| p.terminating = true),
        (Some(Unmanaged::StaticPod), |p| p.static_pod = true),
        (Some(Unmanaged::Windows), |p| p.windows = true),
        (Some(Unmanaged::ResizePending), |p| p.resize.pending = Some("Infeasible".into())),
        (Some(Unmanaged::ResizeInProgress), |p| p.resize.in_progress = Some(String::new())),
        (Some(Unmanaged::ResizeUnobserved), |p| { p.generation = 3; p.resize.observed_generation = Some(2) }),
        // Another writer resized a limit: yielded to once its resize is through.
        (Some(Unmanaged::OtherWriter), |p| p.limit_writers = vec![other_writer()]),
        (Some(Unmanaged::ResizePending), |p| { p.limit_writers = vec![other_writer()]; p.resize.pending = Some("Deferred".into()) }),
        (None, |p| { p.limit_writers = vec![other_writer()]; p.annotations.insert(ANN_RESUME.into(), "2026-07-01T12:00:00Z".into()); }),
        (None, |p| { p.generation = 3; p.resize.observed_generation = Some(3) }),
        // Without adoption.
        (Some(Unmanaged::NoCpuLimit), |p| p.containers[0].resources.cpu_limit = None),
        // A container the resize would touch restarts.
        (Some(Unmanaged::RestartPolicy), |p| p.containers[0].cpu_resize_policy = ResizePolicy::RestartContainer),
    ];

    #[test]
    fn one_change_to_a_managed_pod_gives_its_reason() {
        assert_eq!(why(&simple("a", 100, Some(500))), None);
        for (i, (want, change)) in ONE_CHANGE.iter().enumerate() {
            let mut p = simple("a", 100, Some(500));
            change(&mut p);
            assert_eq!(why(&p), *want, "row {i}");
        }
    }

    #[test]
    fn unmanaged_not_opted_in_and_namespace_label_opts_in() {
        let mut p = simple("a", 100, Some(500));
        p.annotations.clear();
        assert_eq!(why(&p), Some(Unmanaged::NotOptedIn));
        let ns = EligibilityCtx {
            namespace_opted_in: true,
            ..ctx(None)
        };
        assert!(eligibility(&p, &ns).is_ok());
    }

    #[test]
    fn unmanaged_opted_out_wins_over_namespace() {
        let mut p = simple("a", 100, Some(500));
        p.annotations.insert(ANN_MANAGED.into(), "false".into());
        let ns = EligibilityCtx {
            namespace_opted_in: true,
            ..ctx(None)
        };
        assert_eq!(eligibility(&p, &ns).err(), Some(Unmanaged::OptedOut));
    }

    #[test]
    fn other_writer_comes_after_opt_in_and_qos() {
        let mut p = simple("a", 100, Some(500));
        p.limit_writers = vec![other_writer()];
        let mut out = p.clone();
        out.annotations.insert(ANN_MANAGED.into(), "false".into());
        assert_eq!(why(&out), Some(Unmanaged::OptedOut));
        let mut stopped = p.clone();
        stopped.phase = Some("Succeeded".into());
        assert_eq!(why(&stopped), Some(Unmanaged::NotRunning));
        assert!(!Unmanaged::OtherWriter.is_transient());
    }

    #[test]
    fn unmanaged_guaranteed() {
        let p = pod(
            "g",
            vec![container(
                "c",
                res(Some(500), Some(500), Some(MI), Some(MI)),
            )],
        );
        assert_eq!(p.qos, Qos::Guaranteed);
        assert_eq!(why(&p), Some(Unmanaged::Guaranteed));
    }

    #[test]
    fn unmanaged_best_effort() {
        let p = pod("be", vec![container("c", Resources::default())]);
        assert_eq!(p.qos, Qos::BestEffort);
        assert_eq!(why(&p), Some(Unmanaged::BestEffort));
    }

    #[test]
    fn adoption_manages_unlimited_containers_with_a_request() {
        let mut p = pod(
            "a",
            vec![
                container("with", res(Some(100), None, None, None)),
                container("without", Resources::default()),
            ],
        );
        p.annotations.insert(ANN_ADOPT.into(), "true".into());
        match eligibility(&p, &ctx(None)).unwrap() {
            ManagedShape::Containers(cs) => {
                assert_eq!(cs.len(), 1);
                assert_eq!(&*cs[0].name, "with");
                assert_eq!(cs[0].limit_m, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unlimited_container_is_left_alone_beside_a_limited_one() {
        let p = pod(
            "a",
            vec![
                container("lim", res(Some(100), Some(300), None, None)),
                container("free", res(Some(200), None, None, None)),
            ],
        );
        match eligibility(&p, &ctx(None)).unwrap() {
            ManagedShape::Containers(cs) => {
                assert_eq!(cs.iter().map(|c| &*c.name).collect::<Vec<_>>(), ["lim"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn restart_policy_on_an_untouched_container_is_fine() {
        let mut p = pod(
            "a",
            vec![
                container("lim", res(Some(100), Some(300), None, None)),
                container("free", res(Some(200), None, None, None)),
            ],
        );
        p.containers[1].cpu_resize_policy = ResizePolicy::RestartContainer;
        assert_eq!(why(&p), None);
    }

    #[test]
    fn unmanaged_no_cpu_request() {
        let p = pod(
            "a",
            vec![container("c", res(Some(0), Some(300), Some(MI), None))],
        );
        assert_eq!(why(&p), Some(Unmanaged::NoCpuRequest));
    }

    #[test]
    fn unmanaged_pod_level_unknown_and_unsupported() {
        let p = pod_level_a();
        assert_eq!(
            eligibility(&p, &ctx(None)).err(),
            Some(Unmanaged::PodLevelUnknown)
        );
        assert_eq!(
            eligibility(&p, &ctx(Some(false))).err(),
            Some(Unmanaged::PodLevelUnsupported)
        );
        assert_eq!(
            eligibility(&p, &ctx(Some(true))).unwrap(),
            ManagedShape::PodLevel {
                request_m: 100,
                limit_m: Some(500)
            }
        );
    }

    #[test]
    fn unmanaged_pod_level_guaranteed() {
        // docs/kubelet-behaviour.md §4 pod f: req = lim = 500m/128Mi.
        let p = pod_level(
            "f",
            res(Some(100), None, None, None),
            res(Some(500), Some(500), Some(128 * MI), Some(128 * MI)),
        );
        assert_eq!(p.qos, Qos::Guaranteed);
        assert_eq!(why(&p), Some(Unmanaged::PodLevelGuaranteed));
    }

    #[test]
    fn pod_level_without_cpu_limit_needs_adoption() {
        // docs/kubelet-behaviour.md §4 pod c: pod mem 64Mi/128Mi, filled-in pod CPU request 110m.
        let mut p = pod_level(
            "c",
            res(Some(110), None, None, None),
            res(Some(110), None, Some(64 * MI), Some(128 * MI)),
        );
        assert_eq!(why(&p), Some(Unmanaged::NoCpuLimit));
        p.annotations.insert(ANN_ADOPT.into(), "true".into());
        assert_eq!(
            eligibility(&p, &ctx(Some(true))).unwrap(),
            ManagedShape::PodLevel {
                request_m: 110,
                limit_m: None
            }
        );
    }

    #[test]
    fn pod_level_restart_policy_on_a_follower_container() {
        let mut p = pod_level_a();
        p.containers[0].cpu_resize_policy = ResizePolicy::RestartContainer;
        assert_eq!(why(&p), Some(Unmanaged::RestartPolicy));
    }
}
