//! Policy-side slack arithmetic: real slack with the own-burst correction,
//! less what pods displaced within their requests are owed.

use crate::model::Millis;

/// One managed pod's share of the slack formula.
#[derive(Debug, Clone, Copy)]
pub struct ManagedUsage {
    pub usage_m: Millis,
    /// The pod's whole CPU request (all containers).
    pub request_m: Millis,
}

/// Slack before damping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSlack {
    /// kubepods usage minus the managed pods' usage, at least 0.
    pub other_usage_m: Millis,
    /// Σ min(u_i, r_i) over managed pods.
    pub managed_within_request_m: Millis,
    /// Σ max(u_i − r_i, 0) over managed pods: the burst they use now.
    pub managed_burst_m: Millis,
    /// `C − reserve − U_other − Σ min(u_i, r_i)`; may be negative.
    pub raw_slack_m: i64,
}

/// `S = C − reserve − U_other − Σ_managed min(u_i, r_i)`: a managed pod's
/// burst above its request is available to it again, so its own burst does
/// not shrink its limit (no oscillation).
pub fn raw_slack(
    capacity_m: Millis,
    reserve_m: Millis,
    kubepods_usage_m: Millis,
    managed: &[ManagedUsage],
) -> RawSlack {
    let managed_usage: Millis = managed.iter().map(|m| m.usage_m).sum();
    let within: Millis = managed.iter().map(|m| m.usage_m.min(m.request_m)).sum();
    let burst: Millis = managed
        .iter()
        .map(|m| m.usage_m.saturating_sub(m.request_m))
        .sum();
    let other = kubepods_usage_m.saturating_sub(managed_usage);
    let raw =
        i128::from(capacity_m) - i128::from(reserve_m) - i128::from(other) - i128::from(within);
    RawSlack {
        other_usage_m: other,
        managed_within_request_m: within,
        managed_burst_m: burst,
        raw_slack_m: raw.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
    }
}

/// The round's contention: plain figures from [`crate::signal::contention`].
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct ContentionInputs {
    /// kubepods PSI `some` over the last interval: everything that waited,
    /// a pod's own threads and throttling included (display only).
    pub some_pct: f64,
    /// The part of it the pods' own CFS throttling explains (display only).
    pub throttling_pct: f64,
    /// Pods owed CPU this interval that no lowering was made for yet: each
    /// displaced within its request on a node short of CPU
    /// (`crate::signal::contention::Displaced::deficit_m`).
    pub displaced_pods: usize,
    /// CPU owed to them, held across ticks: what managed pods give back.
    pub demand_m: Millis,
    /// Idle CPU pods could have had, less what managed pods' own quotas
    /// held back (`crate::signal::contention::free_m`).
    pub free_m: Millis,
}

/// Slack after what displaced pods are owed, never negative.
///
/// Only displacement of a pod within its request takes slack back: a
/// managed pod's own queued threads or its own throttling read as `some`
/// (and throttling as `full`) but nobody else waits for the CPU it would
/// be denied. While a pod waits this interval (`waiting_now`), the slack is
/// also at most the burst managed pods use now less what is owed: a pod
/// within its request that waits proves the node full, whatever the
/// usage-based slack says (CPU the node's own processes use is not in it),
/// so managed pods must come down by what is owed from where they are, not
/// from a slack that was never there. What is still held after the waiting
/// stopped only shrinks the slack: a pod that starts bursting then must not
/// be sent to its floor for a neighbour that no longer waits.
pub fn after_demand(raw: &RawSlack, demand_m: Millis, waiting_now: bool) -> Millis {
    let demand = i64::try_from(demand_m).unwrap_or(i64::MAX);
    let slack = raw.raw_slack_m.saturating_sub(demand).max(0) as Millis;
    if demand_m == 0 || !waiting_now {
        return slack;
    }
    slack.min(raw.managed_burst_m.saturating_sub(demand_m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mu(usage_m: Millis, request_m: Millis) -> ManagedUsage {
        ManagedUsage { usage_m, request_m }
    }

    #[test]
    fn own_burst_does_not_eat_slack() {
        // 4 cores, reserve 100m, kubepods 1500m: managed pod uses 1200m on a
        // 200m request, others use 300m.
        let s = raw_slack(4000, 100, 1500, &[mu(1200, 200)]);
        assert_eq!(s.other_usage_m, 300);
        assert_eq!(s.managed_within_request_m, 200);
        assert_eq!(s.raw_slack_m, 4000 - 100 - 300 - 200);
    }

    #[test]
    fn full_node_gives_negative_raw_slack_and_zero_damped() {
        let s = raw_slack(1000, 100, 2000, &[]);
        assert_eq!(s.raw_slack_m, -1100);
        assert_eq!(after_demand(&s, 0, false), 0);
    }

    #[test]
    fn managed_usage_above_kubepods_clamps_other_to_zero() {
        let s = raw_slack(1000, 0, 100, &[mu(300, 500)]);
        assert_eq!(s.other_usage_m, 0);
        assert_eq!(s.raw_slack_m, 700);
    }

    fn raw(raw_slack_m: i64, managed_burst_m: Millis) -> RawSlack {
        RawSlack {
            other_usage_m: 0,
            managed_within_request_m: 0,
            managed_burst_m,
            raw_slack_m,
        }
    }

    #[test]
    fn demand_is_taken_from_the_slack_down_to_zero() {
        assert_eq!(after_demand(&raw(1000, 2000), 300, true), 700);
        assert_eq!(after_demand(&raw(1000, 0), 0, false), 1000);
        assert_eq!(after_demand(&raw(200, 2000), 300, true), 0);
        assert_eq!(after_demand(&raw(-50, 0), 0, false), 0);
        assert_eq!(
            after_demand(&raw(i64::MAX, Millis::MAX), Millis::MAX, true),
            0
        );
    }

    #[test]
    fn while_someone_is_owed_managed_pods_come_down_from_their_burst() {
        // The usage-based slack says 743m (the node's own processes use CPU
        // it does not see); the managed pods burst 120m above their requests
        // and a neighbour within its request is owed 143m: no slack at all.
        assert_eq!(after_demand(&raw(743, 120), 143, true), 0);
        // Owed 100m of a 400m burst: 300m left, below the raw 743 − 100.
        assert_eq!(after_demand(&raw(743, 400), 100, true), 300);
        // Nobody owed: the burst does not bound the slack.
        assert_eq!(after_demand(&raw(743, 0), 0, false), 743);
        // Still held, nobody waiting now (on the real node a pod that had
        // just opted in went to its floor for 27m held): only shrinks it.
        assert_eq!(after_demand(&raw(1700, 0), 27, false), 1673);
    }
}
