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
    /// Throttled fraction of CFS periods over the last interval (0..1).
    pub throttled_ratio: f64,
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

/// How pressure affected the slack.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Damping {
    /// Multiplier in [0, 1] applied to the slack.
    pub factor: f64,
    /// Pressure was at or above the start threshold but put down to the
    /// managed pods' own throttling, so it was ignored.
    pub explained_by_throttling: bool,
}

/// Damping factor from kubepods `cpu.pressure` some avg10 (percent).
///
/// CPU PSI also rises with CFS throttling. When a managed pod is throttled
/// while the node still has idle CPU (usage below `explained_usage_frac` of
/// capacity), the stall is its own quota, not contention: no damping.
/// Otherwise the slack is scaled linearly from 1 at `pressure_start_pct` to
/// 0 at `pressure_full_pct`.
pub fn damping(
    pressure_some_avg10: f64,
    capacity_m: Millis,
    kubepods_usage_m: Millis,
    managed: &[ManagedUsage],
    cfg: &PolicyConfig,
) -> Damping {
    let psi = if pressure_some_avg10.is_finite() {
        pressure_some_avg10
    } else {
        0.0
    };
    if psi < cfg.pressure_start_pct {
        return Damping {
            factor: 1.0,
            explained_by_throttling: false,
        };
    }
    let throttled = managed
        .iter()
        .any(|m| m.throttled_ratio >= cfg.throttled_ratio_min);
    let idle_left = (kubepods_usage_m as f64) < cfg.explained_usage_frac * capacity_m as f64;
    if throttled && idle_left {
        return Damping {
            factor: 1.0,
            explained_by_throttling: true,
        };
    }
    let span = cfg.pressure_full_pct - cfg.pressure_start_pct;
    let x = if span > 0.0 {
        (psi - cfg.pressure_start_pct) / span
    } else {
        1.0
    };
    Damping {
        factor: (1.0 - x).clamp(0.0, 1.0),
        explained_by_throttling: false,
    }
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

    fn mu(usage_m: Millis, request_m: Millis, throttled_ratio: f64) -> ManagedUsage {
        ManagedUsage {
            usage_m,
            request_m,
            throttled_ratio,
        }
    }

    #[test]
    fn own_burst_does_not_eat_slack() {
        // 4 cores, reserve 100m, kubepods 1500m: managed pod uses 1200m on a
        // 200m request, others use 300m.
        let s = raw_slack(4000, 100, 1500, &[mu(1200, 200, 0.0)]);
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
        let s = raw_slack(1000, 0, 100, &[mu(300, 500, 0.0)]);
        assert_eq!(s.other_usage_m, 0);
        assert_eq!(s.raw_slack_m, 700);
    }

    #[test]
    fn low_pressure_is_not_damped() {
        let d = damping(5.0, 4000, 3900, &[], &PolicyConfig::default());
        assert_eq!(d.factor, 1.0);
        assert!(!d.explained_by_throttling);
    }

    #[test]
    fn contention_pressure_is_damped_linearly() {
        let cfg = PolicyConfig::default();
        let d = damping(25.0, 4000, 3950, &[], &cfg);
        assert!((d.factor - 0.5).abs() < 1e-9);
        assert_eq!(damping(40.0, 4000, 3950, &[], &cfg).factor, 0.0);
        assert_eq!(damping(90.0, 4000, 3950, &[], &cfg).factor, 0.0);
    }

    #[test]
    fn pressure_from_own_throttling_on_idle_node_is_explained() {
        let d = damping(
            30.0,
            4000,
            1000,
            &[mu(200, 100, 0.6)],
            &PolicyConfig::default(),
        );
        assert_eq!(d.factor, 1.0);
        assert!(d.explained_by_throttling);
    }

    #[test]
    fn throttling_on_busy_node_does_not_explain_pressure() {
        let d = damping(
            25.0,
            4000,
            3900,
            &[mu(200, 100, 0.6)],
            &PolicyConfig::default(),
        );
        assert!((d.factor - 0.5).abs() < 1e-9);
        assert!(!d.explained_by_throttling);
    }

    #[test]
    fn pressure_without_throttling_on_idle_node_is_damped() {
        let d = damping(
            40.0,
            4000,
            1000,
            &[mu(50, 100, 0.0)],
            &PolicyConfig::default(),
        );
        assert_eq!(d.factor, 0.0);
    }

    #[test]
    fn damped_scales_and_rounds_down() {
        assert_eq!(damped(1001, 0.5), 500);
        assert_eq!(damped(1000, f64::NAN), 0);
    }
}
