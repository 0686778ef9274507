//! One stateless decision round on two samples of a node's cgroups, as the
//! agent's first tick after a start computes it: the same signal pipeline
//! ([`signal::between`]) and policy round ([`decide_round`]) as every tick of
//! `run`, with nothing remembered: no learned floors, no declared limits, no
//! earlier interval (a marginal wait has none to repeat), pod-level support
//! unknown, what pods short of CPU are owed not held. What `plan` and
//! `explain` print.

use foldhash::HashSet;
use std::path::Path;

use super::round::{Owed, Round, decide_round};
use crate::cgroup::NodeSnapshot;
use crate::model::{Millis, PodView};
use crate::policy::{Eligibility, PolicyConfig};
use crate::signal::contention::{Contention, Thresholds};
use crate::signal::usage::{self, CapacityInputs, NodeUsage};
use crate::signal::{self, Signal, shared_pool};

/// The node as `plan` sees it: its name, its pods, and how much CPU it has.
pub struct Node<'a> {
    pub name: &'a str,
    pub views: &'a [PodView],
    /// The Node's allocatable CPU, when known.
    pub allocatable_m: Option<Millis>,
    /// Namespaces labelled `headroom.dev/managed=true`.
    pub opted_in_namespaces: &'a HashSet<String>,
}

/// The round on `prev` → `cur`; CPUs and the shared pool are read under
/// `cgroup_root`.
pub fn stateless_round(
    node: &Node<'_>,
    mut prev: NodeSnapshot,
    mut cur: NodeSnapshot,
    cgroup_root: &Path,
    policy: &PolicyConfig,
) -> (NodeUsage, Round) {
    let cpus = usage::online_cpus_at(cgroup_root);
    let pool = shared_pool::read(cgroup_root, &cur);
    let capacity = CapacityInputs {
        node_allocatable_m: node.allocatable_m,
        online_cpus: cpus,
        shared_pool_cpus: pool.map(|p| p.cpus),
    };
    round_between(node, &mut prev, &mut cur, capacity, cpus, policy)
}

/// [`stateless_round`] with the capacity given: the pure part.
pub fn round_between(
    node: &Node<'_>,
    prev: &mut NodeSnapshot,
    cur: &mut NodeSnapshot,
    capacity: CapacityInputs,
    cpus: u64,
    policy: &PolicyConfig,
) -> (NodeUsage, Round) {
    signal::mark_roles(&mut prev.pods, node.views);
    signal::mark_roles(&mut cur.pods, node.views);
    let wall_clock_s = crate::policy::writers::wall_clock_s();
    let eligible = Eligibility::of(
        node.views,
        node.name,
        node.opted_in_namespaces,
        None,
        wall_clock_s,
    );
    let Signal { usage, contention } = signal::between(
        prev,
        cur,
        node.views,
        &signal::contention::managed(node.views, &eligible),
        signal::Inputs {
            capacity,
            thresholds: Thresholds {
                min_pct_of_request: policy.pressure_start_pct,
                cpus,
                reserve_m: policy.reserve_m,
            },
            earlier: &Contention::default(),
            older: None,
        },
    );
    let round = decide_round(
        node.name,
        node.views,
        &eligible,
        &usage,
        &contention,
        Owed::of(&contention),
        node.opted_in_namespaces,
        |_| Default::default(),
        None,
        wall_clock_s,
        policy,
    );
    (usage, round)
}
