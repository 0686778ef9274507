//! Who waits for CPU, per cgroup: the contention signal.
//!
//! kubepods `cpu.pressure some` mixes three things the kernel (≥ 5.13) keeps
//! apart per cgroup (docs/kubelet-behaviour.md §8):
//! - a cgroup's own threads queued behind each other: `some` without `full`;
//! - its tasks throttled by its own `cpu.max`: `full` (and `some`);
//! - its tasks displaced by other cgroups' tasks: `full` beyond its own
//!   throttling.
//!
//! Only the last is someone else waiting for CPU Headroom lent out, and even
//! that is owed only when the node had no idle CPU to give: CFS shares a busy
//! CPU by `cpu.weight`, which follows the request, so a pod within its
//! request gets its share whatever a neighbour's limit is; a limit changes
//! what anyone else gets only when the node is short. While the node has
//! idle CPU, a neighbour's `full` is wake-up latency that a lowering cannot
//! buy back: the CPU taken goes idle and becomes the managed pod's queue
//! (the benefit bench, 2026-12-04: 22 lowerings made with 260–560m idle, none
//! left its neighbour waiting less). So a pod is owed only when it used less
//! than its request, was displaced past its threshold, and the node's free
//! CPU ([`Contention::free_m`]: idle, less what managed pods' own quotas
//! held back) was less than what it waited for, or than the reserve. A
//! pod above its request is owed nothing: CFS already gives it its weighted
//! share of the surplus, with or without a managed pod's limit. A managed
//! pod's own queueing or throttling never lowers it, and nothing is owed
//! while no managed pod uses more than its request: their limits hold
//! nobody back then, and lowering them would only cap their next burst.
//! Whether a lowering bought anything is checked afterwards ([`effect`]).
//!
//! Reading is tiered: per-pod `cpu.pressure` only while the kubepods
//! aggregate shows a stall ([`Gate`]); a calm node reads no pod's pressure.
//! Pure: the caller reads the files.

use foldhash::{HashMap, HashSet};

use serde::Serialize;

use crate::cgroup::{CgroupSample, NodeSnapshot, PodCgroup, Pressure};
use crate::model::{CgroupPodId, Millis, PodView};
use crate::policy::Eligibility;
use crate::signal::usage::NodeUsage;

/// kubepods stall (Δ`some total` / interval) at or above which per-pod
/// pressure is read. Any pod task that waits is a kubepods task that waits,
/// so below this no pod was displaced by more than about this share of wall
/// time; 0.5 % of wall is half the smallest displacement that can count
/// ([`MIN_DISPLACED_M`] on one CPU).
pub const GATE_PCT: f64 = 0.5;

/// The least displacement (millicores of CPU a pod waited for) recorded:
/// a wake-up that waited a few ms is scheduling, not contention.
pub const MIN_DISPLACED_M: Millis = 10;

/// The least displacement that is owed, whatever the pod's request: 5 % of
/// one CPU. Below it a pod's `full` is the node's own noise: on the emulated
/// real nodes a single-threaded pod beside pods within their requests reads
/// `full` at 2–5 % of wall (the benefit bench's neighbours under the static
/// limit), and a 100m pod's 10 % (10m) is crossed by a single late wake-up
/// — the benefit bench lowered the service at the start of its burst for a
/// 37m wait of its 100m neighbour.
pub const MIN_OWED_M: Millis = 50;

/// Decides, from kubepods alone, whether this tick reads pods' pressure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gate {
    prev_some_us: Option<u64>,
    prev_at_us: u64,
}

impl Gate {
    /// From the previous snapshot's kubepods (none: first tick, open).
    pub fn after(prev: Option<&NodeSnapshot>) -> Gate {
        Gate {
            prev_some_us: prev.and_then(|p| p.kubepods.pressure.map(|ps| ps.some.total_us)),
            prev_at_us: prev.map_or(0, |p| p.at_us),
        }
    }

    /// Whether kubepods stalled at least [`GATE_PCT`] of the time since the
    /// previous snapshot. Open when it cannot tell (no PSI before, counter
    /// reset): a missed displacement costs more than a few reads.
    pub fn open(&self, kubepods_now: &CgroupSample, at_us: u64) -> bool {
        let (Some(prev), Some(now)) = (self.prev_some_us, kubepods_now.pressure) else {
            return true;
        };
        let dt = at_us.saturating_sub(self.prev_at_us);
        match now.some.total_us.checked_sub(prev) {
            Some(d) if dt > 0 => d as f64 * 100.0 / dt as f64 >= GATE_PCT,
            _ => true,
        }
    }
}

pub mod effect;
mod judging;

use judging::Judging;

/// One pod that waited for CPU other cgroups held.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Displaced {
    /// Its cgroup's pod id. Serialized as `pod_id` (and `uid`, its old
    /// name, for one release).
    #[serde(flatten, serialize_with = "CgroupPodId::serialize_keys")]
    pub id: CgroupPodId,
    /// Δ`full` over the interval, µs (wall time): every wait of all its
    /// runnable tasks at once, its own throttling included.
    pub waited_us: u64,
    /// Its own throttled time over the interval, µs ([`PodUsage::throttled_us`]).
    ///
    /// [`PodUsage::throttled_us`]: crate::signal::usage::PodUsage::throttled_us
    pub throttled_us: u64,
    /// Δ`full` beyond its own throttling over the interval, µs (wall time).
    pub displaced_us: u64,
    /// CPU it waited for, millicores: `displaced_us` as a rate, times the
    /// CPUs its request spans (a pod's `full` is averaged over the CPUs it
    /// runs on, so a pod on two CPUs displaced on both reads half of what it
    /// lost).
    pub displaced_m: Millis,
    pub usage_m: Millis,
    pub request_m: Millis,
    /// Used less than its request: what it waited for was its own.
    pub within_request: bool,
    /// The node's free CPU ([`Contention::free_m`]) was less than what it
    /// waited for, or less than the reserve (`free < max(reserve,
    /// displaced)`): it could not have had the CPU from idle.
    pub short: bool,
    /// It waited at least twice its threshold this interval: a wait that
    /// counts at once (a smaller one counts when it shows twice in a row).
    pub strong: bool,
    /// What it is owed, once past the threshold, within its request and
    /// short: `min(request − usage, displaced)`; else 0.
    pub deficit_m: Millis,
}

impl Displaced {
    /// Whether what it waited for is owed, and why not, in a few words
    /// (`plan`, `explain`).
    pub fn verdict(&self) -> String {
        if self.deficit_m > 0 {
            format!("short of CPU within its request: owed {}m", self.deficit_m)
        } else if !self.within_request {
            "above its request: owed nothing (CFS shares the surplus by weight)".to_string()
        } else if !self.short {
            "free CPU beside it: wake-up latency, owed nothing".to_string()
        } else {
            "under its threshold, or no managed pod bursts: owed nothing".to_string()
        }
    }
}

/// The contention of one interval.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Contention {
    /// kubepods Δ`some` / interval, percent (everything that waited).
    pub some_pct: f64,
    /// Σ pods' own throttled time / interval, percent (display only).
    pub throttling_pct: f64,
    /// Whether per-pod pressure was compared this interval (both snapshots
    /// read it).
    pub per_pod: bool,
    /// Pods displaced past [`MIN_DISPLACED_M`], largest first.
    pub displaced: Vec<Displaced>,
    /// Σ (usage − request) over managed pods above their requests: what
    /// they hold that lowering them can give back. Below
    /// [`MIN_DISPLACED_M`] nobody is owed.
    pub managed_burst_m: Millis,
    /// Σ deficit of the pods that count: CPU managed pods give back.
    pub demand_m: Millis,
    /// Idle CPU pods could have had this interval, less the CPU managed
    /// pods' own quotas held back, millicores ([`free_m`]).
    pub free_m: Millis,
}

impl Contention {
    /// Pods that count (within their request, past the threshold).
    pub fn owed(&self) -> impl Iterator<Item = &Displaced> {
        self.displaced.iter().filter(|d| d.deficit_m > 0)
    }
}

/// Attribution settings (from the policy config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// A pod within its request counts once it waited for at least this
    /// percent of its request (`pressure_start_pct`).
    pub min_pct_of_request: f64,
    /// CPUs of the node: bounds how many CPUs a request spans.
    pub cpus: u64,
    /// The policy's reserve: free CPU below it is no idle CPU at all.
    pub reserve_m: Millis,
}

/// Idle CPU the pods could have had over the interval, less what managed
/// pods' own quotas held back, millicores.
///
/// Idle is [`NodeUsage::pods_idle_m`]: `capacity − kubepods usage`, and at
/// most what the whole machine left idle where the root cgroup says (the
/// node's own processes take CPU kubepods does not see).
///
/// A managed pod throttled by its `cpu.max` runs on every CPU at the start
/// of each period and leaves them idle once its quota is spent, so the
/// interval's average idle hides that its neighbours waited while it ran.
/// Its throttled time (summed over CPUs, so CPU time its runnable tasks
/// were held) is CPU it would have used: that idle is its own, not the
/// node's, and is taken off. An unthrottled pod leaves no such idle.
pub fn free_m(slack: &NodeUsage, managed: &HashSet<&CgroupPodId>) -> Millis {
    let dt = slack.interval_us;
    if dt == 0 {
        return 0;
    }
    let idle = slack.pods_idle_m();
    let held_back: u64 = slack
        .pods
        .iter()
        .filter(|p| managed.contains(&p.id))
        .filter_map(|p| p.throttled_us)
        .map(|us| (u128::from(us) * 1000 / u128::from(dt)).min(u128::from(u64::MAX)) as u64)
        .fold(0, u64::saturating_add);
    idle.saturating_sub(held_back)
}

fn full_us(p: &Pressure) -> Option<u64> {
    p.full.map(|f| f.total_us)
}

fn pod_pressure(p: &PodCgroup) -> Option<Pressure> {
    p.sample.as_ref().ok()?.pressure
}

/// Cgroup ids of the pods Headroom manages, as [`attribute`] takes them:
/// those [`Eligibility::is_headrooms`] says are Headroom's this tick, the
/// ones held only by a resize in flight included. A managed pod waiting for
/// its own resize to apply is still Headroom's: its burst is one a lowering
/// can take back, and its throttling leaves idle that is its own, not free
/// ([`free_m`]). (Until 2026-12-06, when a neighbour above its request was
/// still owed a share, two managed busy pods on the real nodes, each resize
/// taking tens of seconds to apply there, lowered each other in turn.)
pub fn managed<'a>(views: &'a [PodView], eligible: &Eligibility) -> HashSet<&'a CgroupPodId> {
    // Sized once: a set grown by a filter's inserts rehashes log(n) times.
    let mut set = HashSet::with_capacity_and_hasher(views.len(), Default::default());
    set.extend(
        views
            .iter()
            .enumerate()
            .filter(|&(i, _)| eligible.is_headrooms(i))
            .map(|(_, v)| &v.cgroup_id),
    );
    set
}

/// Cgroup pod id → CPU request of each pod, as [`attribute`] takes them.
pub fn requests(views: &[PodView]) -> HashMap<&CgroupPodId, Millis> {
    views
        .iter()
        .map(|v| (&v.cgroup_id, v.cpu_request()))
        .collect()
}

/// The least wait, per interval, that a pod requesting `request_m` is owed
/// for: `min_pct_of_request` of its request (`pressure_start_pct`), never
/// below [`MIN_OWED_M`].
pub fn owed_threshold_m(request_m: Millis, min_pct_of_request: f64) -> Millis {
    ((request_m as f64 * min_pct_of_request / 100.0).ceil() as Millis).max(MIN_OWED_M)
}

/// Attributes the interval's stall to pods. `requests` maps a cgroup id → the pod's
/// CPU request (pods not in it, e.g. not in the watch cache yet, count as
/// requesting nothing); `managed` holds the cgroup ids of the pods Headroom manages;
/// `earlier` is the previous interval's attribution (empty on the first).
///
/// A wait past the threshold counts at once when it is at least twice the
/// threshold; a smaller one only when the pod also waited past the
/// threshold the interval before. One marginal interval is the node's
/// noise as often as not: in the benefit bench a single 63–65m wait of the
/// 500m neighbour, at the start of the service's burst, cut the service
/// from 800m to 430m, and the raise cooldown held it there through the
/// burst; a neighbour that really wants its request waits every interval.
pub fn attribute(
    prev: &NodeSnapshot,
    cur: &NodeSnapshot,
    slack: &NodeUsage,
    requests: &HashMap<&CgroupPodId, Millis>,
    managed: &HashSet<&CgroupPodId>,
    earlier: &Contention,
    t: Thresholds,
) -> Contention {
    let dt = slack.interval_us;
    let mut out = Contention {
        some_pct: slack.stall.map_or(0.0, |s| s.some_pct),
        throttling_pct: slack.stall.map_or(0.0, |s| s.throttling_pct),
        ..Contention::default()
    };
    if dt == 0 {
        return out;
    }
    let request_of = |id: &CgroupPodId| requests.get(id).copied().unwrap_or(0);
    out.managed_burst_m = slack
        .pods
        .iter()
        .filter(|p| managed.contains(&p.id))
        .map(|p| p.usage_m.unwrap_or(0).saturating_sub(request_of(&p.id)))
        .sum();
    out.free_m = free_m(slack, managed);
    let managed_hold = out.managed_burst_m >= MIN_DISPLACED_M;
    let waited_before: HashMap<&CgroupPodId, Millis> = earlier
        .displaced
        .iter()
        .map(|d| (&d.id, d.displaced_m))
        .collect();
    let before: HashMap<&CgroupPodId, Pressure> = prev
        .pods
        .iter()
        .filter_map(|p| Some((&p.id, pod_pressure(p)?)))
        .collect();
    for (cg, usage) in cur.pods.iter().zip(&slack.pods) {
        debug_assert_eq!(cg.id, usage.id);
        let (Some(now), Some(then)) = (pod_pressure(cg), before.get(&cg.id)) else {
            continue;
        };
        out.per_pod = true;
        let Some(waited) = full_us(&now)
            .zip(full_us(then))
            .and_then(|(now, then)| now.checked_sub(then))
        else {
            continue; // no `full` line, or a counter reset: the cgroup was recreated
        };
        let judging = Judging {
            interval_us: dt,
            request_m: request_of(&cg.id),
            waited_before_m: waited_before.get(&cg.id).copied(),
            limit_m: cg.sample.as_ref().ok().and_then(|s| s.cpu_max.millicores()),
            managed_hold,
            free_m: out.free_m,
            t,
        };
        out.displaced.extend(judging.judge(&cg.id, waited, usage));
    }
    out.displaced
        .sort_by(|a, b| b.displaced_m.cmp(&a.displaced_m).then(a.id.cmp(&b.id)));
    out.demand_m = out.owed().map(|d| d.deficit_m).sum();
    out
}

/// The demand managed pods give back, held across ticks: it rises at once
/// (the first interval that shows a displaced pod lowers), and falls with
/// time constant `window_s` (`contention_window_s`), so the tick after a
/// lowering, when the neighbour no longer waits, does not hand the CPU
/// straight back. The neighbour's usage, now unhindered, keeps the slack
/// down from then on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HeldDemand {
    value: f64,
}

impl HeldDemand {
    pub fn update(&mut self, demand_m: Millis, dt_us: u64, window_s: f64) -> Millis {
        let e = (-(dt_us as f64 / 1e6) / window_s.max(1e-3)).exp();
        let decayed = self.value * e;
        self.value = decayed.max(demand_m as f64);
        if !self.value.is_finite() {
            self.value = 0.0;
        }
        // Below one millicore is nothing.
        if self.value < 1.0 {
            self.value = 0.0;
        }
        self.value as Millis
    }

    pub fn value(&self) -> Millis {
        self.value as Millis
    }
}

#[cfg(test)]
mod tests;
