//! One decision round from observations: pure glue between the slack
//! measurement and the policy, shared by `run` and `explain`.

use foldhash::{HashMap, HashSet};

use serde::Serialize;

use crate::model::{CgroupPodId, DeclaredLimits, Millis, PodView, Uid};
use crate::policy::{
    self, Decision, Eligibility, NodeDecision, NodeInputs, PodInput, PolicyConfig,
};
use crate::signal::contention::Contention;
use crate::signal::usage::NodeUsage;

/// What the agent remembers of a pod that the round reads (nothing on a
/// first round, or in `explain`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Known<'a> {
    /// Floor learned from an apiserver refusal.
    pub learned_floor_m: Option<Millis>,
    /// Limits the workload declares.
    pub declared: Option<&'a DeclaredLimits>,
    /// The limit a lowering for a pod short of CPU holds it to.
    pub held_at_m: Option<Millis>,
}

/// What the round takes back for pods short of CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owed {
    /// Held across ticks ([`crate::signal::contention::HeldDemand`]).
    pub demand_m: Millis,
    /// Pods owed this interval that no lowering was made for yet: while
    /// there are some, the managed pods come down from their burst.
    pub fresh_pods: usize,
}

impl Owed {
    /// One interval's attribution as it stands (no claims, nothing held):
    /// what `plan` and `explain` show.
    pub fn of(c: &Contention) -> Owed {
        Owed {
            demand_m: c.demand_m,
            fresh_pods: c.owed().count(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub node: NodeDecision,
    pub decisions: Vec<Decision>,
    /// The pods that waited for CPU others held this interval, owed or not
    /// (whether each was within its request and short of CPU), largest
    /// first: what `plan` and `explain` say a lowering was for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waited: Vec<crate::signal::contention::Displaced>,
}

/// Runs the policy over this node's pods (`eligible`: each one's
/// eligibility this tick, in their order) with the measured slack;
/// `contention` says who waited this interval, `owed` what pods short of
/// CPU are owed as the caller holds it ([`crate::signal::contention::HeldDemand`])
/// and how many of them no lowering was made for yet
/// ([`crate::signal::contention::effect::Claims::fresh`]); `known` what the caller
/// remembers of each pod.
#[allow(clippy::too_many_arguments)]
pub fn decide_round<'a>(
    node_name: &str,
    views: &[PodView],
    eligible: &Eligibility,
    slack: &NodeUsage,
    contention: &Contention,
    owed: Owed,
    opted_in_namespaces: &HashSet<String>,
    known: impl Fn(&Uid) -> Known<'a>,
    pod_level_supported: Option<bool>,
    wall_clock_s: i64,
    cfg: &PolicyConfig,
) -> Round {
    let usage: HashMap<&CgroupPodId, (Millis, f64)> = slack
        .pods
        .iter()
        .map(|p| {
            (
                &p.id,
                (p.usage_m.unwrap_or(0), p.throttled_ratio.unwrap_or(0.0)),
            )
        })
        .collect();
    let inputs: Vec<PodInput<'_>> = views
        .iter()
        .map(|v| {
            let (usage_m, throttled_ratio) = usage.get(&v.cgroup_id).copied().unwrap_or((0, 0.0));
            let known = known(&v.uid);
            PodInput {
                pod: v,
                namespace_opted_in: opted_in_namespaces.contains(&*v.namespace),
                usage_m,
                throttled_ratio,
                extra_floor_m: known.learned_floor_m,
                declared: known.declared,
                held_at_m: known.held_at_m,
            }
        })
        .collect();
    let node = NodeInputs {
        node_name,
        capacity_m: slack.capacity_m,
        kubepods_usage_m: slack.usage_m,
        contention: policy::slack_formula::ContentionInputs {
            some_pct: contention.some_pct,
            throttling_pct: contention.throttling_pct,
            displaced_pods: owed.fresh_pods,
            demand_m: owed.demand_m,
            free_m: contention.free_m,
        },
        pod_level_resize_supported: pod_level_supported,
        wall_clock_s,
    };
    let (node, decisions) = policy::decide_with(&node, &inputs, eligible, cfg);
    Round {
        node,
        decisions,
        waited: contention.displaced.clone(),
    }
}
