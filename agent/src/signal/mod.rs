//! The node's signal between two cgroup snapshots: what the pods used, how
//! much CPU the node has and has idle ([`usage`], narrowed by the static CPU
//! manager's [`shared_pool`]), and who waited for CPU others held and is
//! owed it ([`contention`], with what each lowering made for a wait bought,
//! [`contention::effect`]). Pure but for `shared_pool::read*` and
//! `usage::online_cpus_at`, which read cpuset files through `crate::cgroup`.

pub mod contention;
pub mod shared_pool;
pub mod usage;

use foldhash::{HashMap, HashSet};

use crate::cgroup::{self, NodeSnapshot, PodCgroup};
use crate::model::{CgroupPodId, PodView};
use contention::{Contention, Thresholds};
use usage::{CapacityInputs, NodeUsage};

/// What one interval between two snapshots tells: the node's usage and
/// capacity, and who waited for CPU. The agent's tick and the `plan`,
/// `explain` commands read it through [`between`] alone, so the two cannot
/// drift apart.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    pub usage: NodeUsage,
    pub contention: Contention,
}

/// What [`between`] needs besides the two snapshots and the pods.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub capacity: CapacityInputs,
    pub thresholds: Thresholds,
    /// The previous interval's attribution: a marginal wait counts only when
    /// it shows twice in a row. Empty for a one-interval reading.
    pub earlier: &'a Contention,
    /// An earlier snapshot that read every pod (the last full scan): a pod
    /// `prev` did not read takes its usage since then
    /// ([`usage::measure_with`]).
    pub older: Option<&'a NodeSnapshot>,
}

/// The signal between `prev` and `cur` for `views`, of which `managed` are
/// Headroom's this tick ([`contention::managed`] of the tick's eligibility:
/// the tick has it already, having chosen by it which pods to read). A
/// counter that went backwards shows in `usage.usage_basis`; the caller
/// decides whether to use such an interval (the agent skips it).
pub fn between(
    prev: &NodeSnapshot,
    cur: &NodeSnapshot,
    views: &[PodView],
    managed: &HashSet<&CgroupPodId>,
    inputs: Inputs<'_>,
) -> Signal {
    let usage = usage::measure_with(prev, cur, inputs.capacity, inputs.older);
    let contention = contention::attribute(
        prev,
        cur,
        &usage,
        &contention::requests(views),
        managed,
        inputs.earlier,
        inputs.thresholds,
    );
    Signal { usage, contention }
}

/// Marks app vs sandbox container cgroups from the container ids in each
/// pod's status (a pod is matched to its cgroup by [`PodView::cgroup_id`]).
pub fn mark_roles(pods: &mut [PodCgroup], views: &[PodView]) {
    let by_id: HashMap<&CgroupPodId, &PodView> = views.iter().map(|v| (&v.cgroup_id, v)).collect();
    for cg in pods {
        if cg.containers.is_empty() {
            continue; // a light tick's pod: nothing to mark
        }
        if let Some(v) = by_id.get(&cg.id) {
            cgroup::mark_roles(cg, |id| {
                v.statuses
                    .iter()
                    .any(|s| s.container_id.as_deref() == Some(id))
            });
        }
    }
}
