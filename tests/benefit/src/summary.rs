//! A benefit run's rows (runs.csv) and what summary.json and meta.json
//! make of them: medians per configuration, the medians against (a) static
//! and (b) no limit with bootstrap intervals ([`crate::stats`]), and the
//! static baseline against the committed one.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::stats;

/// The configuration every ratio is against, and the baseline's.
pub const STATIC: &str = "a-static";
/// The "no limit" configuration.
pub const NO_LIMIT: &str = "b-nolimit";

/// The committed static (a) figure a run's is checked against.
#[derive(Clone, Debug, PartialEq)]
pub struct Baseline {
    /// Where it was read (shown in meta.json).
    pub from: String,
    pub svc_p99_ms: f64,
}

impl Baseline {
    /// The (a) service p99 median of a summary.json; `None` without one.
    pub fn from_summary(text: &str, from: String) -> Option<Baseline> {
        let v: Value = serde_json::from_str(text).ok()?;
        let svc_p99_ms = v[STATIC]["svc_p99_ms"].as_f64()?;
        Some(Baseline { from, svc_p99_ms })
    }
}

/// One run's figures (a row of runs.csv).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunRow {
    pub id: String,
    pub config: String,
    pub rep: usize,
    pub order: usize,
    pub svc_p50_ms: f64,
    pub svc_p99_ms: f64,
    pub svc_p999_ms: f64,
    pub svc_burst_p99_ms: f64,
    pub svc_unfinished: u64,
    pub svc_errors: u64,
    pub throttled_ratio: f64,
    pub throttled_s: f64,
    pub pod_throttled_ratio: f64,
    pub pod_throttled_s: f64,
    pub cpu_bursts: u64,
    pub svc_usage_m: f64,
    /// The within-request neighbour: p99 over the run and its contended
    /// phase, usage, and its pod's cpu.pressure stalls (% of wall).
    pub within_p99_ms: f64,
    pub within_contended_p99_ms: f64,
    pub within_usage_m: f64,
    pub within_some_pct: f64,
    pub within_full_pct: f64,
    pub within_contended_full_pct: f64,
    pub batch_demand_p99_ms: f64,
    pub batch_demand_p50_ms: f64,
    pub batch_full_pct: f64,
    pub node_util: f64,
    pub limit_changes: usize,
    /// The agent's lowerings of the service (its log), those made while no
    /// neighbour was displaced, and those the samples do not cover.
    pub svc_lowerings: usize,
    pub false_lowerings: usize,
    pub unjudged_lowerings: usize,
    pub agent_patches_raise: f64,
    pub agent_patches_lower: f64,
    pub agent_dry_run_decisions: f64,
    pub agent_cpu_s: f64,
    pub raise1_s: Option<f64>,
    pub raise2_s: Option<f64>,
    pub lower_s: Option<f64>,
    pub max_limit_m: u64,
    pub host_load_before: String,
    pub host_load_after: String,
    pub burst_setting: String,
}

fn csv_field(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => format!("\"{s}\""),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.4}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// runs.csv: a header of the row's fields, a line a run (NaN and `None`
/// empty, strings quoted).
pub fn runs_csv(rows: &[RunRow]) -> Result<String, serde_json::Error> {
    let vals: Vec<Value> = rows
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    let Some(Value::Object(first)) = vals.first() else {
        return Ok(String::new());
    };
    let keys: Vec<String> = first.keys().cloned().collect();
    let mut out = keys.join(",") + "\n";
    for v in &vals {
        let line: Vec<String> = keys.iter().map(|k| csv_field(&v[k])).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    Ok(out)
}

fn median_of(v: Vec<f64>) -> Option<f64> {
    stats::median(&v)
}

/// Medians per configuration; against (a) static (the neighbours'
/// baseline: the service never exceeds its limit) and (b) no limit, the
/// ratio of the medians with its 95 % bootstrap interval (`benefit::stats`);
/// the within-request neighbour's `full` as a difference in points.
pub fn summarise(rows: &[RunRow]) -> Value {
    let mut by: BTreeMap<&str, Vec<&RunRow>> = BTreeMap::new();
    for r in rows {
        by.entry(r.config.as_str()).or_default().push(r);
    }
    let vals =
        |rs: &[&RunRow], f: fn(&RunRow) -> f64| -> Vec<f64> { rs.iter().map(|r| f(r)).collect() };
    let med = |rs: &[&RunRow], f: fn(&RunRow) -> f64| median_of(vals(rs, f));
    let none = Vec::new();
    let a = by.get(STATIC).unwrap_or(&none);
    let b = by.get(NO_LIMIT).unwrap_or(&none);
    let (n, seed) = (stats::RESAMPLES, stats::SEED);
    let ratio = |rs: &[&RunRow], base: &[&RunRow], f: fn(&RunRow) -> f64| {
        json!(stats::bootstrap_ratio(
            &vals(rs, f),
            &vals(base, f),
            n,
            seed
        ))
    };
    let diff = |rs: &[&RunRow], base: &[&RunRow], f: fn(&RunRow) -> f64| {
        json!(stats::bootstrap_diff(&vals(rs, f), &vals(base, f), n, seed))
    };
    let mut out = serde_json::Map::new();
    for (c, rs) in &by {
        let total = |f: fn(&RunRow) -> usize| rs.iter().map(|r| f(r)).sum::<usize>();
        out.insert(
            c.to_string(),
            json!({
                "runs": rs.len(),
                "svc_p50_ms": med(rs, |r| r.svc_p50_ms),
                "svc_p99_ms": med(rs, |r| r.svc_p99_ms),
                "svc_p99_interval": stats::bootstrap_median(&vals(rs, |r| r.svc_p99_ms), n, seed),
                "svc_p999_ms": med(rs, |r| r.svc_p999_ms),
                "throttled_ratio": med(rs, |r| r.throttled_ratio),
                "throttled_s": med(rs, |r| r.throttled_s),
                "pod_throttled_ratio": med(rs, |r| r.pod_throttled_ratio),
                "within_p99_ms": med(rs, |r| r.within_p99_ms),
                "within_contended_p99_ms": med(rs, |r| r.within_contended_p99_ms),
                "within_usage_m": med(rs, |r| r.within_usage_m),
                "within_full_pct": med(rs, |r| r.within_full_pct),
                "within_contended_full_pct": med(rs, |r| r.within_contended_full_pct),
                "batch_demand_p99_ms": med(rs, |r| r.batch_demand_p99_ms),
                "batch_full_pct": med(rs, |r| r.batch_full_pct),
                "node_util": med(rs, |r| r.node_util),
                "limit_changes": med(rs, |r| r.limit_changes as f64),
                "svc_lowerings": total(|r| r.svc_lowerings),
                "false_lowerings": total(|r| r.false_lowerings),
                "unjudged_lowerings": total(|r| r.unjudged_lowerings),
                "agent_cpu_s": med(rs, |r| r.agent_cpu_s),
                "raise1_s": median_of(rs.iter().filter_map(|r| r.raise1_s).collect()),
                "raise2_s": median_of(rs.iter().filter_map(|r| r.raise2_s).collect()),
                "lower_s": median_of(rs.iter().filter_map(|r| r.lower_s).collect()),
                "max_limit_m": med(rs, |r| r.max_limit_m as f64),
                // Ratios of medians (point, lo, hi); null without a baseline.
                "vs_static": {
                    "svc_p99": ratio(rs, a, |r| r.svc_p99_ms),
                    "throttled_ratio": ratio(rs, a, |r| r.throttled_ratio),
                    "within_p99": ratio(rs, a, |r| r.within_p99_ms),
                    "within_contended_p99": ratio(rs, a, |r| r.within_contended_p99_ms),
                    "within_full_pp": diff(rs, a, |r| r.within_full_pct),
                    "within_contended_full_pp": diff(rs, a, |r| r.within_contended_full_pct),
                    "batch_demand_p99": ratio(rs, a, |r| r.batch_demand_p99_ms),
                },
                "vs_nolimit": {
                    "svc_p99": ratio(rs, b, |r| r.svc_p99_ms),
                    "batch_demand_p99": ratio(rs, b, |r| r.batch_demand_p99_ms),
                },
            }),
        );
    }
    Value::Object(out)
}

/// This run's (a) against the committed baseline (meta.json's `baseline`;
/// `null` without one) and whether it is flagged.
pub fn baseline_check(base: Option<&Baseline>, rows: &[RunRow]) -> (Value, bool) {
    let Some(base) = base else {
        return (Value::Null, false);
    };
    let new = median_of(
        rows.iter()
            .filter(|r| r.config == STATIC)
            .map(|r| r.svc_p99_ms)
            .collect(),
    );
    let flagged = new.is_some_and(|n| stats::outside_baseline(n, base.svc_p99_ms));
    let (lo, hi) = stats::BASELINE_RANGE;
    (
        json!({
            "from": base.from,
            "committed_svc_p99_ms": base.svc_p99_ms,
            "svc_p99_ms": new,
            "ratio": new.map(|n| n / base.svc_p99_ms),
            "range": [lo, hi],
        }),
        flagged,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        config: &str,
        rep: usize,
        svc_p99: f64,
        within_full: f64,
        lowerings: (usize, usize),
    ) -> RunRow {
        RunRow {
            id: format!("{config}-r{rep}"),
            config: config.to_string(),
            rep,
            svc_p99_ms: svc_p99,
            throttled_ratio: svc_p99 / 30_000.0,
            within_p99_ms: 100.0 + rep as f64,
            within_full_pct: within_full,
            batch_demand_p99_ms: 1000.0,
            svc_lowerings: lowerings.0,
            false_lowerings: lowerings.1,
            raise1_s: (config != STATIC).then_some(0.5),
            ..RunRow::default()
        }
    }

    fn rows() -> Vec<RunRow> {
        let mut v = Vec::new();
        for rep in 0..3 {
            let r = rep as f64;
            v.push(row(STATIC, rep, 18_000.0 + 100.0 * r, 0.5, (0, 0)));
            v.push(row(NO_LIMIT, rep, 200.0 + 10.0 * r, 0.5, (0, 0)));
            v.push(row(
                "c-headroom",
                rep,
                400.0 + 50.0 * r,
                0.5 + r,
                (2, usize::from(rep == 1)),
            ));
        }
        v
    }

    #[test]
    fn medians_totals_and_ratios_against_static_and_no_limit() {
        let s = summarise(&rows());
        let c = &s["c-headroom"];
        assert_eq!(c["runs"], 3);
        assert_eq!(c["svc_p99_ms"], 450.0);
        assert_eq!(c["svc_lowerings"], 6);
        assert_eq!(c["false_lowerings"], 1);
        assert_eq!(c["raise1_s"], 0.5);
        let vs_a = &c["vs_static"]["svc_p99"];
        assert!((vs_a["point"].as_f64().unwrap() - 450.0 / 18_100.0).abs() < 1e-12);
        assert!(vs_a["lo"].as_f64().unwrap() <= vs_a["point"].as_f64().unwrap());
        assert!(vs_a["hi"].as_f64().unwrap() >= vs_a["point"].as_f64().unwrap());
        let vs_b = &c["vs_nolimit"]["svc_p99"]["point"];
        assert!((vs_b.as_f64().unwrap() - 450.0 / 210.0).abs() < 1e-12);
        // full: a difference of medians (1.5 - 0.5), in points.
        assert_eq!(c["vs_static"]["within_full_pp"]["point"], 1.0);
        let ci = &c["svc_p99_interval"];
        assert_eq!(
            (ci["lo"].as_f64(), ci["hi"].as_f64()),
            (Some(400.0), Some(500.0))
        );
        // (a) against itself: a ratio of 1.
        assert_eq!(s[STATIC]["vs_static"]["svc_p99"]["point"], 1.0);
        assert_eq!(s[STATIC]["raise1_s"], Value::Null);
    }

    #[test]
    fn no_baseline_configuration_no_ratio() {
        let only_c: Vec<RunRow> = rows()
            .into_iter()
            .filter(|r| r.config == "c-headroom")
            .collect();
        let s = summarise(&only_c);
        assert_eq!(s["c-headroom"]["vs_static"]["svc_p99"], Value::Null);
        assert_eq!(
            s["c-headroom"]["vs_nolimit"]["batch_demand_p99"],
            Value::Null
        );
    }

    #[test]
    fn runs_csv_has_a_sorted_header_and_empty_missing_values() {
        let mut r = rows();
        r[0].within_full_pct = f64::NAN;
        let csv = runs_csv(&r[..2]).unwrap();
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let mut sorted = header.clone();
        sorted.sort_unstable();
        assert_eq!(header, sorted);
        let first: Vec<&str> = lines.next().unwrap().split(',').collect();
        let at = |k: &str| first[header.iter().position(|h| *h == k).unwrap()];
        assert_eq!(at("config"), "\"a-static\"");
        assert_eq!(at("within_full_pct"), "");
        assert_eq!(at("raise1_s"), "");
        assert_eq!(at("svc_p99_ms"), "18000.0000");
        assert_eq!(at("false_lowerings"), "0");
        assert_eq!(runs_csv(&[]).unwrap(), "");
    }

    #[test]
    fn the_baseline_check_flags_a_static_p99_out_of_range() {
        let committed = r#"{"a-static": {"svc_p99_ms": 18423.8}, "c-headroom": {}}"#;
        let base = Baseline::from_summary(committed, "git HEAD".into()).unwrap();
        assert_eq!(base.svc_p99_ms, 18423.8);
        assert_eq!(Baseline::from_summary("{}", String::new()), None);
        assert_eq!(Baseline::from_summary("", String::new()), None);
        let (meta, flagged) = baseline_check(Some(&base), &rows());
        assert!(!flagged);
        assert_eq!(meta["svc_p99_ms"], 18_100.0);
        assert_eq!(meta["from"], "git HEAD");
        let quiet: Vec<RunRow> = rows()
            .into_iter()
            .map(|mut r| {
                r.svc_p99_ms /= 3.0;
                r
            })
            .collect();
        assert!(baseline_check(Some(&base), &quiet).1);
        assert_eq!(baseline_check(None, &quiet), (Value::Null, false));
        // No (a) run yet: nothing to flag.
        let (meta, flagged) = baseline_check(Some(&base), &[]);
        assert!(!flagged);
        assert_eq!(meta["svc_p99_ms"], Value::Null);
    }
}
