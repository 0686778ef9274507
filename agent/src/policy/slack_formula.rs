//! Policy-side slack arithmetic: real slack with the own-burst correction,
//! and pressure damping that tells contention from self-inflicted throttling.

use crate::model::Millis;

use super::config::PolicyConfig;

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
    let other = kubepods_usage_m.saturating_sub(managed_usage);
    let raw =
        i128::from(capacity_m) - i128::from(reserve_m) - i128::from(other) - i128::from(within);
    RawSlack {
        other_usage_m: other,
        managed_within_request_m: within,
        raw_slack_m: raw.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
    }
}

/// kubepods CPU stall of the round, percent of wall time: plain figures
/// from the slack layer (`crate::node_slack::Stall`).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct StallInputs {
    /// PSI `some` stall over the last interval.
    pub some_pct: f64,
    /// The part of it the pods' own CFS throttling explains.
    pub throttling_pct: f64,
    /// Contention, the rest, smoothed over a few seconds: what damps.
    pub contention_pct: f64,
}

/// Damping factor from contention (percent): 1 below `pressure_start_pct`,
/// falling linearly to 0 at `pressure_full_pct`.
///
/// Contention excludes stall from CFS throttling: the kernel counts a
/// throttled task as stalled, so a pod throttled at its own limit on an idle
/// node would otherwise read as a full node and be lowered to its floor by
/// its own throttling.
pub fn damping(contention_pct: f64, cfg: &PolicyConfig) -> f64 {
    let c = if contention_pct.is_finite() {
        contention_pct
    } else {
        0.0
    };
    if c < cfg.pressure_start_pct {
        return 1.0;
    }
    let span = cfg.pressure_full_pct - cfg.pressure_start_pct;
    let x = if span > 0.0 {
        (c - cfg.pressure_start_pct) / span
    } else {
        1.0
    };
    (1.0 - x).clamp(0.0, 1.0)
}

/// Slack after damping, never negative.
pub fn damped(raw_slack_m: i64, factor: f64) -> Millis {
    if raw_slack_m <= 0 {
        return 0;
    }
    let f = if factor.is_finite() {
        factor.clamp(0.0, 1.0)
    } else {
        0.0
    };
    (raw_slack_m as f64 * f) as Millis
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
        assert_eq!(damped(s.raw_slack_m, 1.0), 0);
    }

    #[test]
    fn managed_usage_above_kubepods_clamps_other_to_zero() {
        let s = raw_slack(1000, 0, 100, &[mu(300, 500)]);
        assert_eq!(s.other_usage_m, 0);
        assert_eq!(s.raw_slack_m, 700);
    }

    #[test]
    fn low_contention_is_not_damped() {
        assert_eq!(damping(5.0, &PolicyConfig::default()), 1.0);
        assert_eq!(damping(f64::NAN, &PolicyConfig::default()), 1.0);
    }

    #[test]
    fn contention_is_damped_linearly() {
        let cfg = PolicyConfig::default();
        assert!((damping(25.0, &cfg) - 0.5).abs() < 1e-9);
        assert_eq!(damping(40.0, &cfg), 0.0);
        assert_eq!(damping(90.0, &cfg), 0.0);
    }

    #[test]
    fn damped_scales_and_rounds_down() {
        assert_eq!(damped(1001, 0.5), 500);
        assert_eq!(damped(1000, f64::NAN), 0);
    }
}
