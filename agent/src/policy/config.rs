//! Tunables of the policy. Every field has a default, so a config file (TOML
//! or JSON) need only name what it changes; unknown keys are an error so a
//! typo does not silently fall back to a default.

use serde::{Deserialize, Serialize};

/// Policy tunables. Defaults are in the field docs and in [`Default`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// CPU (millicores) never handed out as slack: room for the kubelet,
    /// the runtime and sampling error. Range 0–64000, default `100`.
    pub reserve_m: u64,
    /// Default ceiling of a pod's limit as a multiple of its CPU request.
    /// The pod annotation `headroom.dev/ceiling` overrides it; a ceiling is
    /// never above node capacity. Range 1–64, default `4.0`.
    pub ceiling_factor: f64,
    /// Granularity of targets (millicores): a target is the request plus a
    /// whole number of quanta (floors and ceilings excepted). Range 1–100,
    /// default `10` (the kubelet enforces 10m steps anyway).
    pub quantum_m: u64,
    /// A raise is sent only if it is at least this percent of the current
    /// limit... Range 0–100, default `10.0`.
    pub raise_dead_band_pct: f64,
    /// ...and at least this many millicores. Range 0–10000, default `50`.
    pub raise_dead_band_m: u64,
    /// Same dead band for a lowering (not applied under pressure, above the
    /// ceiling, or when the target is the floor). Range 0–100, default `10.0`.
    pub lower_dead_band_pct: f64,
    /// Millicore part of the lowering dead band. Range 0–10000, default `50`.
    pub lower_dead_band_m: u64,
    /// Seconds after any patch of a pod before it may be raised again;
    /// doubled from a pod's second raise in a row that a lowering undid
    /// quickly, up to 8 × (`policy::hysteresis::raise_cooldown_s`).
    /// Lowerings have no cooldown. Range 0–86400, default `15` (docs/benefit.md,
    /// "Tuning": 60 kept a service at its floor for the rest
    /// of a burst after its neighbour's demand ended).
    pub raise_cooldown_s: f64,
    /// A pod within its CPU request counts as displaced, and is owed the
    /// CPU it waited for, once that CPU (its `cpu.pressure` `full` beyond its
    /// own throttling) reaches this percent of its request
    /// (`crate::signal::contention`). Range 0–99, default `10.0`.
    pub pressure_start_pct: f64,
    /// Time constant (seconds) over which what displaced pods are owed is
    /// released once they stop waiting; it is taken at once when they start.
    /// Shorter hands CPU back sooner, longer rides out a neighbour's pauses.
    /// Also the quiet window (at least 1 s): a pod whose lowering bought
    /// nothing is owed nothing more until it has gone this long without
    /// being displaced (`crate::signal::contention::effect`).
    /// Range 0.5–60, default `5`.
    pub contention_window_s: f64,
    /// Node-wide patch rate (token bucket refill, patches per second).
    /// Range 0.01–100, default `5.0`.
    pub patch_rate_per_s: f64,
    /// Token bucket size: patches that may go out at once. Range 1–1000,
    /// default `10`.
    pub patch_burst: u32,
    /// The lowest limit Headroom sets: `request` (default; as the node fills,
    /// limits fall back to the requests) or `declared` (never below the limit
    /// the workload declares: Headroom only lends idle CPU above it).
    pub floor: FloorMode,
}

/// What a managed limit falls back to as the node fills.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FloorMode {
    /// The managed containers' requests (the pod-level request): a pod gives
    /// back everything above what it booked.
    #[default]
    Request,
    /// The limit the workload declares, where it declares one (pods adopted
    /// without a limit fall back to their requests): under contention a pod
    /// is never worse off than without Headroom, nor are its neighbours.
    Declared,
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
            raise_cooldown_s: 15.0,
            pressure_start_pct: 10.0,
            contention_window_s: 5.0,
            patch_rate_per_s: 5.0,
            patch_burst: 10,
            floor: FloorMode::Request,
        }
    }
}

impl std::str::FromStr for FloorMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "request" => Ok(FloorMode::Request),
            "declared" => Ok(FloorMode::Declared),
            _ => Err(format!("{s:?}: expected request or declared")),
        }
    }
}

/// A config value outside its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid policy config: {field} = {value} is out of range: must be {range}")]
pub struct ConfigError {
    pub field: &'static str,
    pub value: String,
    /// The accepted range, in words (also in `--help` and docs/design.md).
    pub range: &'static str,
}

/// Accepted ranges. Wide enough for any real node, narrow enough that no
/// value can make the arithmetic degenerate (e.g. a 1e308 ceiling factor,
/// or a quantum so large that every ceiling rounds down to the request).
pub mod range {
    pub const RESERVE_M: (u64, u64) = (0, 64_000);
    pub const CEILING_FACTOR: (f64, f64) = (1.0, 64.0);
    pub const QUANTUM_M: (u64, u64) = (1, 100);
    pub const DEAD_BAND_PCT: (f64, f64) = (0.0, 100.0);
    pub const DEAD_BAND_M: (u64, u64) = (0, 10_000);
    pub const RAISE_COOLDOWN_S: (f64, f64) = (0.0, 86_400.0);
    pub const PRESSURE_PCT: (f64, f64) = (0.0, 100.0);
    pub const CONTENTION_WINDOW_S: (f64, f64) = (0.5, 60.0);
    pub const PATCH_RATE_PER_S: (f64, f64) = (0.01, 100.0);
    pub const PATCH_BURST: (u32, u32) = (1, 1000);
}

fn within<T: PartialOrd + std::fmt::Debug + Copy>(
    v: T,
    (lo, hi): (T, T),
    field: &'static str,
    range: &'static str,
) -> Result<(), ConfigError> {
    // Written so NaN fails: every comparison with NaN is false.
    if v >= lo && v <= hi {
        Ok(())
    } else {
        Err(ConfigError {
            field,
            // Debug: `1e308`, not 309 digits.
            value: format!("{v:?}"),
            range,
        })
    }
}

impl PolicyConfig {
    /// Rejects values outside their range (NaN and infinities included).
    pub fn validate(&self) -> Result<(), ConfigError> {
        use range::*;
        within(
            self.reserve_m,
            RESERVE_M,
            "reserve_m",
            "between 0 and 64000 (millicores)",
        )?;
        within(
            self.ceiling_factor,
            CEILING_FACTOR,
            "ceiling_factor",
            "between 1 and 64",
        )?;
        within(
            self.quantum_m,
            QUANTUM_M,
            "quantum_m",
            "between 1 and 100 (millicores)",
        )?;
        let pct = "between 0 and 100 (percent)";
        let band_m = "between 0 and 10000 (millicores)";
        within(
            self.raise_dead_band_pct,
            DEAD_BAND_PCT,
            "raise_dead_band_pct",
            pct,
        )?;
        within(
            self.raise_dead_band_m,
            DEAD_BAND_M,
            "raise_dead_band_m",
            band_m,
        )?;
        within(
            self.lower_dead_band_pct,
            DEAD_BAND_PCT,
            "lower_dead_band_pct",
            pct,
        )?;
        within(
            self.lower_dead_band_m,
            DEAD_BAND_M,
            "lower_dead_band_m",
            band_m,
        )?;
        within(
            self.raise_cooldown_s,
            RAISE_COOLDOWN_S,
            "raise_cooldown_s",
            "between 0 and 86400 (seconds)",
        )?;
        within(
            self.pressure_start_pct,
            (PRESSURE_PCT.0, PRESSURE_PCT.1 - 1.0),
            "pressure_start_pct",
            "between 0 and 99 (percent)",
        )?;
        within(
            self.contention_window_s,
            CONTENTION_WINDOW_S,
            "contention_window_s",
            "between 0.5 and 60 (seconds)",
        )?;
        within(
            self.patch_rate_per_s,
            PATCH_RATE_PER_S,
            "patch_rate_per_s",
            "between 0.01 and 100 (patches per second)",
        )?;
        within(
            self.patch_burst,
            PATCH_BURST,
            "patch_burst",
            "between 1 and 1000",
        )
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

    /// A change to the defaults.
    type Change = fn(&mut PolicyConfig);

    /// The defaults with one change.
    fn with(change: Change) -> PolicyConfig {
        let mut c = PolicyConfig::default();
        change(&mut c);
        c
    }

    #[test]
    fn bad_values_are_rejected() {
        let zero_q = with(|c| c.quantum_m = 0);
        assert_eq!(zero_q.validate().unwrap_err().field, "quantum_m");
        let nan = with(|c| c.ceiling_factor = f64::NAN);
        assert_eq!(nan.validate().unwrap_err().field, "ceiling_factor");
        let pressure = with(|c| c.pressure_start_pct = 99.5);
        assert_eq!(pressure.validate().unwrap_err().field, "pressure_start_pct");
    }

    #[test]
    fn out_of_range_values_are_rejected_with_the_range() {
        // One row a line, so the table reads as one.
        #[rustfmt::skip]
        let cases: [(Change, &str, &str); 10] = [
            (|c| c.ceiling_factor = 1e308, "ceiling_factor", "between 1 and 64"),
            (|c| c.quantum_m = 1000, "quantum_m", "between 1 and 100"),
            (|c| c.reserve_m = u64::MAX, "reserve_m", "between 0 and 64000"),
            (|c| c.raise_dead_band_pct = 1e9, "raise_dead_band_pct", "between 0 and 100"),
            (|c| c.lower_dead_band_m = 1 << 40, "lower_dead_band_m", "between 0 and 10000"),
            (|c| c.raise_cooldown_s = f64::INFINITY, "raise_cooldown_s", "between 0 and 86400"),
            (|c| c.contention_window_s = 0.0, "contention_window_s", "between 0.5 and 60"),
            (|c| c.contention_window_s = f64::NAN, "contention_window_s", "between 0.5 and 60"),
            (|c| c.patch_rate_per_s = 1e-300, "patch_rate_per_s", "between 0.01 and 100"),
            (|c| c.patch_burst = u32::MAX, "patch_burst", "between 1 and 1000"),
        ];
        for (change, field, range) in cases {
            let e = with(change).validate().unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.to_string().contains(range), "{e}");
        }
        let e = with(|c| c.ceiling_factor = 1e308).validate().unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid policy config: ceiling_factor = 1e308 is out of range: must be between 1 and 64"
        );
        // The ends of each range are accepted.
        let edges = PolicyConfig {
            reserve_m: 64_000,
            ceiling_factor: 64.0,
            quantum_m: 100,
            raise_dead_band_pct: 100.0,
            raise_dead_band_m: 10_000,
            lower_dead_band_pct: 0.0,
            lower_dead_band_m: 0,
            raise_cooldown_s: 86_400.0,
            pressure_start_pct: 99.0,
            contention_window_s: 60.0,
            patch_rate_per_s: 0.01,
            patch_burst: 1000,
            floor: FloorMode::Declared,
        };
        assert_eq!(edges.validate(), Ok(()));
    }

    #[test]
    fn floor_mode_parses_from_the_config_file_and_refuses_other_words() {
        let c: PolicyConfig = toml::from_str("floor = \"declared\"").unwrap();
        assert_eq!(c.floor, FloorMode::Declared);
        let c: PolicyConfig = serde_json::from_str(r#"{"floor": "request"}"#).unwrap();
        assert_eq!(c.floor, FloorMode::Request);
        assert!(serde_json::from_str::<PolicyConfig>(r#"{"floor": "limit"}"#).is_err());
        assert_eq!("declared".parse::<FloorMode>(), Ok(FloorMode::Declared));
        assert!("Declared".parse::<FloorMode>().is_err());
    }
}
