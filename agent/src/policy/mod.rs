//! The policy: pure functions from pods, samples and config to CPU limit
//! targets and patch plans. No I/O, no clock (time comes in as seconds).
//!
//! Public API (all plain data):
//!
//! ```text
//! Eligibility::of(&[PodView], node_name, &opted_in_namespaces, pod_level_supported, wall_clock_s)
//!     // each pod's eligibility(&PodView, &EligibilityCtx), asked once per tick
//! decide_with(&NodeInputs, &[PodInput], &Eligibility, &PolicyConfig) -> (NodeDecision, Vec<Decision>)
//! decide(&NodeInputs, &[PodInput], &PolicyConfig)   // asks eligibility itself (tests, benches)
//! plan(&NodeDecision, &[Decision], |uid| Option<&LastPatch>, now_s, &mut TokenBucket, &PolicyConfig)
//!     -> PlanOutcome { patches: Vec<PatchPlan>, held: Vec<Hold> }
//! LastPatch::after(&PatchPlan, now_s, prev: Option<&LastPatch>, &PolicyConfig)
//!     // caller records a patch the apiserver accepted
//! TokenBucket::new(rate_per_s, burst).try_take(now_s) -> bool
//! ```
//!
//! Round: capacity `C`, kubepods usage `K`, managed pods' usage `u_i` and
//! whole-pod requests `r_i` give the real slack
//! `S = C − reserve − (K − Σu_i) − Σ min(u_i, r_i) − owed`, where `owed` is
//! the CPU pods within their requests waited for while others held it and
//! the node had less free CPU than that (`crate::signal::contention`: per-pod PSI
//! `full` beyond their own throttling; never a managed pod's own queueing
//! or throttling). `S` is water-filled over managed pods by request, each
//! between its floor and its ceiling, in whole quanta (`target = request +
//! k·quantum`, floors and ceilings excepted). A pod lowered for a pod short
//! of CPU is capped lower still while that pod still needs what the lowering
//! bought ([`PodInput::held_at_m`], from the lowering's claim,
//! `crate::signal::contention::effect`): it fills only up to the limit the
//! lowering set (never below its floor), so the CPU taken is not handed back
//! at the raise cooldown, whatever the slack. Container-level pods split
//! their target over managed containers by request. [`plan`] turns targets
//! into patches: raises past a dead band and after a cooldown, lowerings at
//! once, all under a node-wide token bucket.

pub mod bucket;
pub mod config;
pub mod eligibility;
pub mod floors;
pub mod hysteresis;
pub mod slack_formula;
pub mod split;
pub mod waterfill;
pub mod writers;

#[cfg(test)]
mod tests;

use serde::Serialize;

use crate::model::{DeclaredLimits, Millis, PodView, Uid};

pub use bucket::TokenBucket;
pub use config::{ConfigError, FloorMode, PolicyConfig};
pub use eligibility::{
    Eligibility, EligibilityCtx, ManagedContainer, ManagedShape, Unmanaged, eligibility,
};
pub use floors::Floor;
pub use hysteresis::{
    Direction, Hold, HoldReason, LastPatch, PatchKind, PatchPlan, PlanOutcome, plan,
};
pub use writers::Yielded;

/// Node-wide inputs of one round.
#[derive(Debug, Clone, Copy)]
pub struct NodeInputs<'a> {
    pub node_name: &'a str,
    /// Capacity for pods `C` (min of kubepods `cpu.max`, allocatable, online CPUs).
    pub capacity_m: Millis,
    /// kubepods CPU usage over the last interval.
    pub kubepods_usage_m: Millis,
    /// Who waited for CPU, and what displaced pods are owed.
    pub contention: slack_formula::ContentionInputs,
    /// Cluster admits resizes of pods with pod-level resources; `None` = not probed.
    pub pod_level_resize_supported: Option<bool>,
    /// The wall clock (Unix seconds): `headroom.dev/resume` times are read
    /// against it ([`writers`]).
    pub wall_clock_s: i64,
}

/// One pod of the node with its samples.
#[derive(Debug, Clone, Copy)]
pub struct PodInput<'a> {
    pub pod: &'a PodView,
    /// The namespace has the label `headroom.dev/managed=true`.
    pub namespace_opted_in: bool,
    /// Pod cgroup CPU usage over the last interval.
    pub usage_m: Millis,
    /// Throttled fraction of CFS periods of the pod cgroup (0..1).
    pub throttled_ratio: f64,
    /// Floor learned from an apiserver refusal, if any.
    pub extra_floor_m: Option<Millis>,
    /// Limits the workload declares, as the caller knows them (seen before
    /// Headroom changed them, or the owner's pod template). Ignored while
    /// the pod's limits are not Headroom's (they are the declared ones).
    pub declared: Option<&'a DeclaredLimits>,
    /// The limit a lowering made for a pod short of CPU holds this pod to
    /// while that pod still needs what it bought
    /// (`crate::signal::contention::effect`): no raise above it, whatever the
    /// slack says, so the CPU taken is not handed back at the cooldown.
    pub held_at_m: Option<Millis>,
}

/// What Headroom patches for a managed pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Container CPU limits.
    Containers,
    /// `spec.resources.limits.cpu`.
    Pod,
}

/// Per-container part of a container-level decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerDecision {
    pub name: crate::model::Name,
    pub request_m: Millis,
    /// `None`: unlimited (adoption).
    pub current_limit_m: Option<Millis>,
    pub target_m: Millis,
}

/// The policy's view of one pod (for `explain`, metrics and [`plan`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub namespace: crate::model::Name,
    pub name: crate::model::Name,
    pub uid: Uid,
    /// Request the managed limit is measured against (managed containers'
    /// requests, or the pod-level request); for unmanaged pods the pod's
    /// whole CPU request.
    pub request_m: Millis,
    pub usage_m: Millis,
    pub verdict: Verdict,
}

/// Managed with its plan, or left alone with the reason.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Managed(ManagedDecision),
    Unmanaged {
        reason: Unmanaged,
        /// With [`Unmanaged::OtherWriter`] (or a transient hold of a pod
        /// that yields): who changed its limits, and when.
        yielded: Option<Yielded>,
    },
}

/// A managed pod's container targets of one round.
pub type ContainerDecisions = smallvec::SmallVec<[ContainerDecision; 4]>;

/// How a managed pod's limit is set this round.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedDecision {
    pub level: Level,
    pub floor: Floor,
    pub ceiling_m: Millis,
    /// The managed limit the workload declares, which the default ceiling
    /// never goes below; `None` when it declares none (adoption).
    pub declared_limit_m: Option<Millis>,
    /// The limit a lowering for a pod short of CPU holds it to
    /// ([`PodInput::held_at_m`]), never below the floor.
    pub held_at_m: Option<Millis>,
    /// Current managed limit; `None` when unlimited.
    pub current_limit_m: Option<Millis>,
    /// `target − request`: this pod's share of the slack.
    pub share_m: Millis,
    pub target_m: Millis,
    /// Container split (container-level pods only), in line up to four
    /// (see [`eligibility::ManagedContainers`]).
    pub containers: ContainerDecisions,
}

impl Decision {
    /// The plan, if managed.
    pub fn managed(&self) -> Option<&ManagedDecision> {
        match &self.verdict {
            Verdict::Managed(m) => Some(m),
            Verdict::Unmanaged { .. } => None,
        }
    }

    pub fn is_managed(&self) -> bool {
        self.managed().is_some()
    }

    /// Why the pod is left alone (`None` when managed).
    pub fn reason(&self) -> Option<Unmanaged> {
        match &self.verdict {
            Verdict::Managed(_) => None,
            Verdict::Unmanaged { reason, .. } => Some(*reason),
        }
    }

    /// Who Headroom yields the pod's limits to, if it does.
    pub fn yielded(&self) -> Option<&Yielded> {
        match &self.verdict {
            Verdict::Managed(_) => None,
            Verdict::Unmanaged { yielded, .. } => yielded.as_ref(),
        }
    }

    /// Floor value, if managed.
    pub fn floor_m(&self) -> Option<Millis> {
        self.managed().map(|m| m.floor.floor_m)
    }

    pub fn ceiling_m(&self) -> Option<Millis> {
        self.managed().map(|m| m.ceiling_m)
    }

    pub fn target_m(&self) -> Option<Millis> {
        self.managed().map(|m| m.target_m)
    }

    /// Current managed limit; `None` when unlimited or unmanaged.
    pub fn current_limit_m(&self) -> Option<Millis> {
        self.managed().and_then(|m| m.current_limit_m)
    }
}

/// `explain --json` shows a decision flat, every field of a managed pod
/// present (`null` when unmanaged), as it always has.
impl Serialize for Decision {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Flat<'a> {
            namespace: &'a str,
            name: &'a str,
            uid: &'a Uid,
            managed: bool,
            reason: Option<Unmanaged>,
            yielded: Option<&'a Yielded>,
            level: Option<Level>,
            request_m: Millis,
            usage_m: Millis,
            floor: Option<Floor>,
            ceiling_m: Option<Millis>,
            declared_limit_m: Option<Millis>,
            #[serde(skip_serializing_if = "Option::is_none")]
            held_at_m: Option<Millis>,
            current_limit_m: Option<Millis>,
            share_m: Millis,
            target_m: Option<Millis>,
            containers: &'a [ContainerDecision],
        }
        let m = self.managed();
        Flat {
            namespace: &self.namespace,
            name: &self.name,
            uid: &self.uid,
            managed: m.is_some(),
            reason: self.reason(),
            yielded: self.yielded(),
            level: m.map(|m| m.level),
            request_m: self.request_m,
            usage_m: self.usage_m,
            floor: m.map(|m| m.floor),
            ceiling_m: self.ceiling_m(),
            declared_limit_m: m.and_then(|m| m.declared_limit_m),
            held_at_m: m.and_then(|m| m.held_at_m),
            current_limit_m: self.current_limit_m(),
            share_m: m.map_or(0, |m| m.share_m),
            target_m: self.target_m(),
            containers: m.map_or(&[], |m| &m.containers),
        }
        .serialize(s)
    }
}

/// The node's slack figures of one round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDecision {
    pub capacity_m: Millis,
    pub reserve_m: Millis,
    /// kubepods usage.
    pub usage_m: Millis,
    /// Usage not from managed pods.
    pub other_usage_m: Millis,
    /// Σ min(u_i, r_i) over managed pods.
    pub managed_within_request_m: Millis,
    /// Slack before what displaced pods are owed (may be negative).
    pub raw_slack_m: i64,
    pub contention: slack_formula::ContentionInputs,
    /// Slack handed out: `max(raw − owed, 0)`.
    pub slack_m: Millis,
    pub managed_pods: usize,
    /// Σ(target − request) over managed pods.
    pub allocated_m: Millis,
}

impl NodeDecision {
    /// Pods within their requests wait for CPU: lowerings skip most of
    /// their dead band.
    pub fn under_pressure(&self) -> bool {
        self.contention.demand_m > 0
    }
}

/// The managed limit the workload declares. While the pod's limits are not
/// Headroom's, they are the declared ones. Once Headroom set them: what the
/// caller knows (`known`); if it knows nothing (a pod with no owner after an
/// agent restart), the current limit, so an idle node never lowers it.
pub fn declared_limit(
    pod: &PodView,
    shape: &ManagedShape,
    known: Option<&DeclaredLimits>,
) -> Option<Millis> {
    if pod.limits_set_by_headroom && known.is_none() {
        return shape.current_limit_m();
    }
    known_declared_limit(pod, shape, known)
}

/// The managed limit the workload declares where it is known: the pod's own
/// while they are not Headroom's, else what the caller knows; `None` when
/// neither says (no stand-in).
pub fn known_declared_limit(
    pod: &PodView,
    shape: &ManagedShape,
    known: Option<&DeclaredLimits>,
) -> Option<Millis> {
    if pod.limits_set_by_headroom {
        let declared = known?;
        return match shape {
            ManagedShape::Containers(cs) => declared.total_of(cs.iter().map(|c| &*c.name)),
            ManagedShape::PodLevel { .. } => declared.pod,
        };
    }
    match shape {
        ManagedShape::Containers(cs) => pod.own_limits_total_of(cs.iter().map(|c| &*c.name)),
        ManagedShape::PodLevel { .. } => pod.pod_resources.and_then(|r| r.cpu_limit),
    }
}

struct Managed {
    index: usize,
    shape: ManagedShape,
    floor: Floor,
    ceiling_m: Millis,
}

/// [`decide_with`], asking [`eligibility`] of each pod first: for callers
/// that have not asked it this tick (tests, benches).
pub fn decide(
    node: &NodeInputs<'_>,
    pods: &[PodInput<'_>],
    cfg: &PolicyConfig,
) -> (NodeDecision, Vec<Decision>) {
    let eligible = Eligibility::from_answers(
        pods.iter()
            .map(|p| eligibility(p.pod, &ctx_of(node, p)))
            .collect(),
    );
    decide_with(node, pods, &eligible, cfg)
}

fn ctx_of<'a>(node: &NodeInputs<'a>, p: &PodInput<'_>) -> EligibilityCtx<'a> {
    EligibilityCtx {
        node_name: node.node_name,
        namespace_opted_in: p.namespace_opted_in,
        pod_level_resize_supported: node.pod_level_resize_supported,
        wall_clock_s: node.wall_clock_s,
    }
}

/// One decision round over the pods of this node. Decisions come back in
/// the order of `pods`. Ties in the water-filling go to the smaller uid, so
/// the result does not depend on the order of `pods`.
///
/// The steps, as the module docs give them: each pod's verdict
/// (`verdicts`), the node's slack (`slack_of`), the slack water-filled over
/// the managed pods and split over their containers (`fill`).
pub fn decide_with(
    node: &NodeInputs<'_>,
    pods: &[PodInput<'_>],
    eligible: &Eligibility,
    cfg: &PolicyConfig,
) -> (NodeDecision, Vec<Decision>) {
    let q = cfg.quantum_m.max(1);
    let (mut decisions, managed) = verdicts(node, pods, eligible, cfg, q);
    let (raw, slack_m) = slack_of(node, pods, &decisions, &managed, cfg);
    let allocated = fill(pods, &mut decisions, &managed, slack_m, q);
    let node_decision = NodeDecision {
        capacity_m: node.capacity_m,
        reserve_m: cfg.reserve_m,
        usage_m: node.kubepods_usage_m,
        other_usage_m: raw.other_usage_m,
        managed_within_request_m: raw.managed_within_request_m,
        raw_slack_m: raw.raw_slack_m,
        contention: node.contention,
        slack_m,
        managed_pods: managed.len(),
        allocated_m: allocated,
    };
    (node_decision, decisions)
}

/// Each pod's decision, in the order of `pods`: managed with its floor,
/// ceiling and hold (its target still the floor, until [`fill`]), or left
/// alone with the reason; and the managed ones, for the later steps.
fn verdicts(
    node: &NodeInputs<'_>,
    pods: &[PodInput<'_>],
    eligible: &Eligibility,
    cfg: &PolicyConfig,
    q: Millis,
) -> (Vec<Decision>, Vec<Managed>) {
    let mut decisions = Vec::with_capacity(pods.len());
    let mut managed = Vec::with_capacity(pods.len());
    for (index, p) in pods.iter().enumerate() {
        let pod = p.pod;
        let asked;
        let answer = match eligible.get(index) {
            Some(a) => a,
            None => {
                // Not asked for this pod (a caller's slip): ask now rather
                // than decide on no answer.
                asked = eligibility(pod, &ctx_of(node, p));
                &asked
            }
        };
        let (request_m, verdict) = match answer.clone() {
            Err(reason) => (pod.cpu_request(), unmanaged(pod, reason, node.wall_clock_s)),
            Ok(shape) => {
                let request = shape.request_m();
                let (plan, m) = managed_plan(node, p, index, shape, cfg, q);
                managed.push(m);
                (request, Verdict::Managed(plan))
            }
        };
        decisions.push(Decision {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            request_m,
            usage_m: p.usage_m,
            verdict,
        });
    }
    (decisions, managed)
}

/// The verdict of a pod left alone for `reason`, with the writer it yields
/// to, if any.
fn unmanaged(pod: &PodView, reason: Unmanaged, wall_clock_s: i64) -> Verdict {
    // A pod held only while a resize goes through (another writer's next
    // one, say) still yields to that writer: its pause goes on, so no
    // second Event when the resize is done.
    let yielded = (reason == Unmanaged::OtherWriter || reason.is_transient())
        .then(|| Yielded::of(pod, wall_clock_s))
        .flatten();
    Verdict::Unmanaged { reason, yielded }
}

/// A managed pod's (the `index`th of the round's) plan before the
/// water-filling: its floor (lifted to the declared limit with
/// [`FloorMode::Declared`]), its ceiling, the limit a lowering holds it to;
/// its target is the floor until [`fill`].
fn managed_plan(
    node: &NodeInputs<'_>,
    p: &PodInput<'_>,
    index: usize,
    shape: ManagedShape,
    cfg: &PolicyConfig,
    q: Millis,
) -> (ManagedDecision, Managed) {
    let pod = p.pod;
    let request = shape.request_m();
    let mut floor = floors::floor(pod, &shape, q, p.extra_floor_m);
    if cfg.floor == FloorMode::Declared {
        let known = known_declared_limit(pod, &shape, p.declared);
        floor = floors::lift_to_declared(floor, known);
    }
    let declared_m = declared_limit(pod, &shape, p.declared);
    let ceiling_m = floors::ceiling(
        pod,
        request,
        floor.floor_m,
        cfg.ceiling_factor,
        node.capacity_m,
        declared_m,
    );
    let plan = ManagedDecision {
        level: match shape {
            ManagedShape::Containers(_) => Level::Containers,
            ManagedShape::PodLevel { .. } => Level::Pod,
        },
        floor,
        ceiling_m,
        declared_limit_m: declared_m,
        held_at_m: p.held_at_m.map(|h| h.max(floor.floor_m)),
        current_limit_m: shape.current_limit_m(),
        // Water-filled by `fill`, once every pod is known.
        share_m: 0,
        target_m: floor.floor_m,
        containers: ContainerDecisions::new(),
    };
    let m = Managed {
        index,
        shape,
        floor,
        ceiling_m,
    };
    (plan, m)
}

/// The node's raw slack over the managed pods (and those held only while a
/// resize is in flight), and the slack left to hand out once displaced pods
/// are owed what they waited for.
fn slack_of(
    node: &NodeInputs<'_>,
    pods: &[PodInput<'_>],
    decisions: &[Decision],
    managed: &[Managed],
    cfg: &PolicyConfig,
) -> (slack_formula::RawSlack, Millis) {
    // Pods held only while a resize is in flight stay in the slack
    // accounting as managed: moving their burst into "other" usage for those
    // ticks would shrink everyone's slack and make the node oscillate.
    let usages: Vec<slack_formula::ManagedUsage> = managed
        .iter()
        .map(|m| m.index)
        .chain(
            decisions
                .iter()
                .enumerate()
                .filter(|(_, d)| d.reason().is_some_and(Unmanaged::is_transient))
                .map(|(i, _)| i),
        )
        .map(|i| {
            let p = &pods[i];
            slack_formula::ManagedUsage {
                usage_m: p.usage_m,
                request_m: p.pod.cpu_request(),
            }
        })
        .collect();
    let raw = slack_formula::raw_slack(
        node.capacity_m,
        cfg.reserve_m,
        node.kubepods_usage_m,
        &usages,
    );
    let slack_m = slack_formula::after_demand(
        &raw,
        node.contention.demand_m,
        node.contention.displaced_pods > 0,
    );
    (raw, slack_m)
}

/// Water-fills `slack_m` over the managed pods in uid order, each between
/// its floor and its ceiling (or its hold, if lower), sets their targets
/// and shares and splits container-level targets over the containers;
/// returns Σ share.
fn fill(
    pods: &[PodInput<'_>],
    decisions: &mut [Decision],
    managed: &[Managed],
    slack_m: Millis,
    q: Millis,
) -> Millis {
    // Fill in uid order so ties do not depend on the caller's order.
    let mut order: Vec<usize> = (0..managed.len()).collect();
    order.sort_by(|&a, &b| {
        pods[managed[a].index]
            .pod
            .uid
            .cmp(&pods[managed[b].index].pod.uid)
    });
    // A pod a lowering holds fills only up to where it is held: the CPU
    // taken stays with the pod it was taken for.
    let items: Vec<waterfill::FillItem> = order
        .iter()
        .map(|&k| {
            let held = decisions[managed[k].index]
                .managed()
                .and_then(|m| m.held_at_m);
            waterfill::FillItem {
                request_m: decisions[managed[k].index].request_m,
                floor_m: managed[k].floor.floor_m,
                ceiling_m: held.map_or(managed[k].ceiling_m, |h| h.min(managed[k].ceiling_m)),
            }
        })
        .collect();
    let targets = waterfill::fill(&items, slack_m, q);

    let mut allocated: Millis = 0;
    for (&k, target) in order.iter().zip(targets) {
        let m = &managed[k];
        let d = &mut decisions[m.index];
        let Verdict::Managed(plan) = &mut d.verdict else {
            continue; // every pod of `managed` has a managed verdict
        };
        plan.target_m = target;
        plan.share_m = target.saturating_sub(d.request_m);
        allocated = allocated.saturating_add(plan.share_m);
        if let ManagedShape::Containers(cs) = &m.shape {
            plan.containers = split_containers(cs, target, q);
        }
    }
    allocated
}

/// A container-level pod's `target` split over its managed containers by
/// request.
fn split_containers(cs: &[ManagedContainer], target: Millis, q: Millis) -> ContainerDecisions {
    let requests: split::Parts = cs.iter().map(|c| c.request_m).collect();
    let parts = split::split(target, &requests, q);
    cs.iter()
        .zip(parts)
        .map(|(c, t)| ContainerDecision {
            name: c.name.clone(),
            request_m: c.request_m,
            current_limit_m: c.limit_m,
            target_m: t,
        })
        .collect()
}
