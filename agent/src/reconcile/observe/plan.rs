//! Reading the cgroup tree: what a light tick reads of each pod
//! ([`read_plan`]), the read itself on the blocking pool, and what an owed
//! pod under a lowering claim reads as each interval ([`claim_sample`]).

use foldhash::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::super::Agent;
use super::{MIN_SCAN_DEADLINE, TickError};
use crate::cgroup::read::Handles;
use crate::cgroup::{Depth, NodeSnapshot, Scanner};
use crate::kube::events::EventApi;
use crate::kube::pods::PodApi;
use crate::model::{CgroupPodId, Millis, PodView, Qos, Uid};
use crate::signal::contention::effect::{self, HoldEnded, Judged};
use crate::signal::contention::{Contention, Gate};
use crate::signal::usage::NodeUsage;

/// What a light tick reads of one pod ([`read_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Everything (a resize in flight).
    Full,
    /// Its `cpu.stat` and `cpu.pressure` every tick, whatever the gate (a
    /// pod a lowering claim follows).
    Watched,
    /// Its `cpu.stat` every tick (a managed pod); everything contention
    /// needs while kubepods stalls.
    Usage,
    /// Everything contention needs while kubepods stalls; else nothing.
    WhenStalled,
    /// Nothing (BestEffort).
    Nothing,
}

impl<P: PodApi, E: EventApi> Agent<P, E> {
    /// Runs the scan on the blocking pool: a read that blocks (a hung
    /// filesystem) must not stall the runtime thread that also serves
    /// `/healthz`. A scan past its deadline fails the tick and is left to
    /// finish alone; none is started beside it.
    pub(super) async fn read_tree(
        &mut self,
        full: bool,
        at_us: u64,
        managed: &HashSet<&CgroupPodId>,
        claimed: &HashSet<&CgroupPodId>,
        resizing: &HashSet<&CgroupPodId>,
        unseen: Vec<(CgroupPodId, Qos)>,
    ) -> Result<NodeSnapshot, TickError> {
        let deadline = self.settings.tick.max(MIN_SCAN_DEADLINE);
        if let Some(h) = &self.scan.stuck {
            if !h.is_finished() {
                return Err(TickError::Timeout(deadline));
            }
            self.scan.stuck = None; // its snapshot is stale: read afresh
        }
        let root = &self.settings.cgroup_root;
        let scanner = self
            .scan
            .scanner
            .get_or_insert_with(|| {
                Arc::new(Mutex::new(Scanner::new(root, Handles::for_root(root))))
            })
            .clone();
        let layout = self.layout.clone();
        let index = if full { None } else { self.scan.index.clone() };
        let plan = index
            .as_deref()
            .map(|index| read_plan(index, managed, claimed, resizing))
            .unwrap_or_default();
        let gate = Gate::after(self.scan.prev.as_ref());
        let mut task = tokio::task::spawn_blocking(move || {
            let mut scanner = scanner
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match index {
                Some(index) => {
                    let mut plan = plan.into_iter();
                    scanner.rescan_finding(&index, at_us, &unseen, |_, kubepods| {
                        match plan.next() {
                            Some(Want::Full) => Depth::Full,
                            Some(Want::Watched) => Depth::StatPressure,
                            Some(Want::Nothing) | None => Depth::Skip,
                            Some(_) if gate.open(kubepods, at_us) => Depth::StatPressure,
                            Some(Want::Usage) => Depth::Stat,
                            Some(Want::WhenStalled) => Depth::Skip,
                        }
                    })
                }
                None => scanner.scan(&layout, at_us),
            }
        });
        match tokio::time::timeout(deadline, &mut task).await {
            Ok(joined) => joined?.map_err(TickError::from),
            Err(_) => {
                self.scan.stuck = Some(task);
                Err(TickError::Timeout(deadline))
            }
        }
    }

    /// One interval of every open lowering claim ([`effect`]): the owed
    /// pod's usage and wait this interval, where both were read (`snaps`:
    /// the previous and this snapshot); the verdicts due.
    pub(super) fn step_claims(
        &mut self,
        now: Duration,
        views: &[PodView],
        snaps: (&NodeSnapshot, &NodeSnapshot),
        slack: &NodeUsage,
        contention: &Contention,
    ) -> Vec<Judged> {
        // Most ticks have no claim: no sets to build.
        if self.scan.claims.is_idle() {
            return Vec::new();
        }
        let live: HashSet<&CgroupPodId> = views.iter().map(|v| &v.cgroup_id).collect();
        // Pods still Headroom's to hold: on the node, and no other writer's
        // resize of their limits since (which Headroom yields to).
        let wall_clock_s = crate::policy::writers::wall_clock_s();
        let held: HashSet<&Uid> = views
            .iter()
            .filter(|v| crate::policy::writers::yields_to(v, wall_clock_s).is_none())
            .map(|v| &v.uid)
            .collect();
        let interval = effect::Interval {
            now,
            free_m: contention.free_m,
            quiet: Duration::from_secs_f64(self.settings.policy.contention_window_s.max(1.0)),
            owed_gone: &|id| !live.contains(id),
            lowered_released: &|uid| !held.contains(uid),
        };
        let stepped = self
            .scan
            .claims
            .step(&interval, |id| claim_sample(id, snaps, slack, contention));
        if !stepped.ended.is_empty() {
            log_holds_ended(&stepped.ended, &self.scan.claims.holds(), views);
        }
        stepped.judged
    }
}

/// One line per managed pod a lowering's hold (the limit a lowering that
/// helped, or one still checked, keeps it under) let go this interval, and
/// why: when the raise it barred may come, and from what, is then in the
/// log. `held`: what other claims still hold each pod to.
fn log_holds_ended(ended: &[HoldEnded], held: &foldhash::HashMap<&Uid, Millis>, views: &[PodView]) {
    let name = |found: Option<&PodView>, id: &dyn std::fmt::Display| {
        found.map_or_else(|| id.to_string(), |v| format!("{}/{}", v.namespace, v.name))
    };
    for e in ended {
        let owed = name(views.iter().find(|v| v.cgroup_id == e.owed), &e.owed);
        for l in &e.lowered {
            let pod = name(views.iter().find(|v| v.uid == l.uid), &l.uid);
            tracing::info!(
                pod = %pod,
                reason = %e.why.as_str(),
                held_m = l.to_m,
                now_held_m = held.get(&l.uid).map_or(-1, |m| *m as i64),
                owed = %owed,
                "lowering hold ended"
            );
        }
    }
}

/// What a light tick reads of each pod of `index`, in its order;
/// `resizing`: the pods with a resize in flight.
///
/// The policy needs the usage (and own throttling) of the pods it
/// manages, every tick; a pod in a resize is read in full, so its
/// `cpu.max` shows when the kubelet applied it. Every other pod's
/// counters, its pressure and the limited containers' throttling only
/// matter to who-waits-for-whom (`contention`), which has nothing to
/// attribute while kubepods does not stall ([`Gate`]): those are read
/// only then (and on every full scan). BestEffort pods have no quota to
/// throttle and no request to be owed: never.
fn read_plan(
    index: &NodeSnapshot,
    managed: &HashSet<&CgroupPodId>,
    claimed: &HashSet<&CgroupPodId>,
    resizing: &HashSet<&CgroupPodId>,
) -> Vec<Want> {
    index
        .pods
        .iter()
        .map(|p| {
            if resizing.contains(&p.id) {
                Want::Full
            } else if claimed.contains(&p.id) {
                Want::Watched
            } else if p.qos == Qos::BestEffort {
                Want::Nothing
            } else if managed.contains(&p.id) {
                Want::Usage
            } else {
                Want::WhenStalled
            }
        })
        .collect()
}

/// The owed pod `id`'s sample for its lowering claim this interval, or
/// `None` when it was not read: its usage and own throttling known, and its
/// `cpu.pressure` `full` in both snapshots (`snaps`), so that a pod missing
/// from `contention.displaced` really waited less than
/// [`MIN_DISPLACED_M`](crate::signal::contention::MIN_DISPLACED_M) (read
/// as 0) rather than went unread.
fn claim_sample(
    id: &CgroupPodId,
    (prev, cur): (&NodeSnapshot, &NodeSnapshot),
    slack: &NodeUsage,
    contention: &Contention,
) -> Option<effect::Sample> {
    let usage = slack.pods.iter().find(|p| &p.id == id)?;
    let (usage_m, _) = (usage.usage_m?, usage.throttled_us?);
    let full_read = |s: &NodeSnapshot| {
        s.pods
            .iter()
            .find(|p| &p.id == id)
            .and_then(|p| p.sample.as_ref().ok())
            .and_then(|s| s.pressure)
            .and_then(|p| p.full)
            .is_some()
    };
    if !full_read(prev) || !full_read(cur) {
        return None;
    }
    let displaced_m = contention
        .displaced
        .iter()
        .find(|d| &d.id == id)
        .map_or(0, |d| d.displaced_m);
    Some(effect::Sample {
        usage_m,
        displaced_m,
    })
}
