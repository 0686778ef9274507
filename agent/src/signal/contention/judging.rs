//! One pod's wait, judged ([`Judging::judge`]): how much of it others
//! displaced it, and what it is owed.

use super::{Displaced, MIN_DISPLACED_M, Thresholds, owed_threshold_m};
use crate::model::{CgroupPodId, Millis};
use crate::signal::usage::PodUsage;

/// What [`attribute`](super::attribute) knows of one pod beside its wait:
/// its request, its limit, what it waited for the interval before, and the
/// node's state this interval.
pub(super) struct Judging {
    pub(super) interval_us: u64,
    pub(super) request_m: Millis,
    /// What it waited for the interval before (`None`: nothing recorded).
    pub(super) waited_before_m: Option<Millis>,
    /// Its `cpu.max` as millicores (`None`: unlimited or unread).
    pub(super) limit_m: Option<Millis>,
    /// Managed pods burst above their requests: there is CPU to take back.
    pub(super) managed_hold: bool,
    pub(super) free_m: Millis,
    pub(super) t: Thresholds,
}

impl Judging {
    /// The pod `id` waited `waited` µs (Δ`full`) with `usage` this
    /// interval: how much of that others displaced it, and what it is owed;
    /// `None` when that cannot be told or is less than [`MIN_DISPLACED_M`].
    pub(super) fn judge(
        &self,
        id: &CgroupPodId,
        waited: u64,
        usage: &PodUsage,
    ) -> Option<Displaced> {
        // A pod whose usage or own throttling is unknown this interval (new,
        // counter reset, a file unread) is not attributed: an unknown usage
        // read as 0 would make it "within its request", and unknown
        // throttling read as 0 would count its own quota as displacement.
        let (Some(usage_m), Some(throttled_us)) = (usage.usage_m, usage.throttled_us) else {
            return None;
        };
        let displaced_us = waited.saturating_sub(throttled_us);
        let request_m = self.request_m;
        let spans = request_m.div_ceil(1000).clamp(1, self.t.cpus.max(1));
        let mut displaced_m = ((u128::from(displaced_us) * 1000 / u128::from(self.interval_us))
            as Millis)
            .saturating_mul(spans);
        // Nobody displaced a pod from CPU its own limit would not have let it
        // use: a pod at its limit got all of it. Its `full` beyond the
        // throttled time it reports is its own quota still: with a quota on
        // both the pod and its container (the systemd driver sets both) each
        // level's period timer runs at its own phase, so the time its tasks
        // are held is the union of both levels' throttling, more than either
        // counter. On Linux 6.12 a lone 1-thread pod at its 300m limit read
        // `full` 700 ms a second and at most 600 ms throttled at either level.
        if let Some(limit_m) = self.limit_m {
            displaced_m = displaced_m.min(limit_m.saturating_sub(usage_m));
        }
        if displaced_m < MIN_DISPLACED_M {
            return None;
        }
        let within_request = usage_m < request_m;
        let threshold = owed_threshold_m(request_m, self.t.min_pct_of_request);
        let again = self.waited_before_m.is_some_and(|m| m >= threshold);
        let strong = displaced_m >= 2 * threshold;
        let past = displaced_m >= threshold && (strong || again);
        // Short: the free CPU could not have served what it waited for,
        // or was below the reserve (no idle CPU at all). With more free
        // than both, its wait was wake-up latency beside idle CPU, which no
        // lowering buys back.
        let short = self.free_m < self.t.reserve_m.max(displaced_m);
        let deficit_m = if past && self.managed_hold && within_request && short {
            (request_m - usage_m).min(displaced_m)
        } else {
            0
        };
        // Less than 1 % of a CPU is not worth a patch: the agent's own pod
        // (10m request) waking on a busy node was owed 1–4m every few
        // seconds, and each time the managed pods were cut to their current
        // use for it, then raised again.
        let deficit_m = if deficit_m < MIN_DISPLACED_M {
            0
        } else {
            deficit_m
        };
        Some(Displaced {
            id: id.clone(),
            waited_us: waited,
            throttled_us,
            displaced_us,
            displaced_m,
            usage_m,
            request_m,
            within_request,
            short,
            strong,
            deficit_m,
        })
    }
}
