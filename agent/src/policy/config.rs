//! Tunables of the policy. Every field has a default, so a config file (TOML
//! or JSON) need only name what it changes; unknown keys are an error so a
//! typo does not silently fall back to a default.

use serde::{Deserialize, Serialize};

/// Policy tunables. Defaults are in the field docs and in [`Default`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// CPU (millicores) never handed out as slack: room for the kubelet,
    /// the runtime and sampling error. Default `100`.
    pub reserve_m: u64,
    /// Default ceiling of a pod's limit as a multiple of its CPU request.
    /// The pod annotation `headroom.dev/ceiling` overrides it; a ceiling is
    /// never above node capacity. Default `4.0`.
    pub ceiling_factor: f64,
    /// Granularity of targets (millicores): a target is the request plus a
    /// whole number of quanta (floors excepted). Default `10` (the kubelet
    /// enforces 10m steps anyway).
    pub quantum_m: u64,
    /// A raise is sent only if it is at least this percent of the current
    /// limit... Default `10.0`.
    pub raise_dead_band_pct: f64,
    /// ...and at least this many millicores. Default `50`.
    pub raise_dead_band_m: u64,
    /// Same dead band for a lowering (not applied under pressure, above the
    /// ceiling, or when the target is the floor). Default `10.0`.
    pub lower_dead_band_pct: f64,
    /// Millicore part of the lowering dead band. Default `50`.
    pub lower_dead_band_m: u64,
    /// Seconds after any patch of a pod before it may be raised again.
    /// Lowerings have no cooldown. Default `60`.
    pub raise_cooldown_s: f64,
    /// kubepods CPU pressure (`some avg10`, percent) where damping of the
    /// slack starts. Default `10.0`.
    pub pressure_start_pct: f64,
    /// Pressure at which the slack is damped to zero (limits fall to their
    /// floors). Default `40.0`.
    pub pressure_full_pct: f64,
    /// Pressure counts as explained by the managed pods' own throttling (and
    /// is not damped) when some managed pod is throttled and node usage is
    /// below this fraction of capacity: with idle CPU on the node the stall
    /// comes from CFS quotas, not contention. Default `0.9`.
    pub explained_usage_frac: f64,
    /// Throttled fraction of CFS periods (0..1) from which a managed pod
    /// counts as throttled. Default `0.05`.
    pub throttled_ratio_min: f64,
    /// Node-wide patch rate (token bucket refill, patches per second).
    /// Default `5.0`.
    pub patch_rate_per_s: f64,
    /// Token bucket size: patches that may go out at once. Default `10`.
    pub patch_burst: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            reserve_m: 100,
            ceiling_factor: 4.0,
            quantum_m: 10,
            raise_dead_band_pct: 10.0,
            raise_dead_band_m: 50,
            lower_dead_band_pct: 10.0,
            lower_dead_band_m: 50,
            raise_cooldown_s: 60.0,
            pressure_start_pct: 10.0,
            pressure_full_pct: 40.0,
            explained_usage_frac: 0.9,
            throttled_ratio_min: 0.05,
            patch_rate_per_s: 5.0,
            patch_burst: 10,
        }
    }
}

/// A config value outside its domain.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid policy config: {field} {problem}")]
pub struct ConfigError {
    pub field: &'static str,
    pub problem: &'static str,
}

fn check(ok: bool, field: &'static str, problem: &'static str) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError { field, problem })
    }
}

impl PolicyConfig {
    /// Rejects values the policy cannot work with (NaN, zero quantum, ...).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let finite_nonneg = |x: f64| x.is_finite() && x >= 0.0;
        check(self.quantum_m > 0, "quantum_m", "must be > 0")?;
        check(
            self.ceiling_factor.is_finite() && self.ceiling_factor >= 1.0,
            "ceiling_factor",
            "must be >= 1",
        )?;
        check(
            finite_nonneg(self.raise_dead_band_pct),
            "raise_dead_band_pct",
            "must be >= 0",
        )?;
        check(
            finite_nonneg(self.lower_dead_band_pct),
            "lower_dead_band_pct",
            "must be >= 0",
        )?;
        check(
            finite_nonneg(self.raise_cooldown_s),
            "raise_cooldown_s",
            "must be >= 0",
        )?;
        check(
            finite_nonneg(self.pressure_start_pct),
            "pressure_start_pct",
            "must be >= 0",
        )?;
        check(
            self.pressure_full_pct.is_finite() && self.pressure_full_pct > self.pressure_start_pct,
            "pressure_full_pct",
            "must be > pressure_start_pct",
        )?;
        check(
            (0.0..=1.0).contains(&self.explained_usage_frac),
            "explained_usage_frac",
            "must be in [0, 1]",
        )?;
        check(
            (0.0..=1.0).contains(&self.throttled_ratio_min),
            "throttled_ratio_min",
            "must be in [0, 1]",
        )?;
        check(
            self.patch_rate_per_s.is_finite() && self.patch_rate_per_s > 0.0,
            "patch_rate_per_s",
            "must be > 0",
        )?;
        check(self.patch_burst >= 1, "patch_burst", "must be >= 1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert_eq!(PolicyConfig::default().validate(), Ok(()));
    }

    #[test]
    fn partial_json_keeps_other_defaults() {
        let c: PolicyConfig = serde_json::from_str(r#"{"reserve_m": 250}"#).unwrap();
        assert_eq!(c.reserve_m, 250);
        assert_eq!(c.quantum_m, 10);
        assert_eq!(c.ceiling_factor, 4.0);
    }

    #[test]
    fn unknown_key_is_rejected() {
        assert!(serde_json::from_str::<PolicyConfig>(r#"{"reserve": 1}"#).is_err());
    }

    #[test]
    fn bad_values_are_rejected() {
        let zero_q = PolicyConfig {
            quantum_m: 0,
            ..Default::default()
        };
        assert_eq!(zero_q.validate().unwrap_err().field, "quantum_m");
        let nan = PolicyConfig {
            ceiling_factor: f64::NAN,
            ..Default::default()
        };
        assert_eq!(nan.validate().unwrap_err().field, "ceiling_factor");
        let inverted = PolicyConfig {
            pressure_full_pct: 5.0,
            ..Default::default()
        };
        assert_eq!(inverted.validate().unwrap_err().field, "pressure_full_pct");
    }
}
