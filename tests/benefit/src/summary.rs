//! A benefit run's rows (runs.csv) and what summary.json and meta.json
//! make of them: medians per scenario and configuration, the medians
//! against (a) static and (b) no limit with bootstrap intervals
//! ([`crate::stats`]), each goal met or not ([`goals`]), and the static
//! baseline against the committed one.
//!
//! summary.json ([`summarise_matrix`]): `{"format": 2, "scenarios": {S:
//! {CONFIG: …}}, "parties": {S: …}, "goals": {S: [Goal…]}, "goals_met": {S:
//! {"met", "of", "not_assessed"}}}`. A summary.json from before the matrix
//! is `{CONFIG: …}` (one scenario, `mixed`); [`Baseline::from_summary`]
//! reads both.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::matrix::{self, Parties};
use crate::stats::{self, Interval};

/// The configuration every ratio is against, and the baseline's.
pub const STATIC: &str = "a-static";
/// The "no limit" configuration.
pub const NO_LIMIT: &str = "b-nolimit";
/// The peers a user would run instead (issue 48): the kernel's
/// `cpu.max.burst` alone, and Koordinator's koordlet with CPU Burst.
pub const BURST: &str = "d-burst";
pub const KOORDLET: &str = "k-koordlet";

/// [`RunRow::agent`]: no agent runs.
pub const AGENT_NONE: &str = "none";
/// The agent runs and patches.
pub const AGENT_PATCH: &str = "patch";
/// The agent runs with `--dry-run`.
pub const AGENT_DRY_RUN: &str = "dry_run";
/// The agent patches beside koordlet on the same services (`x-coexist`):
/// not a contender, no goals.
pub const AGENT_BESIDE_KOORDLET: &str = "beside_koordlet";

/// The committed static (a) figure a run's is checked against.
#[derive(Clone, Debug, PartialEq)]
pub struct Baseline {
    /// Where it was read (shown in meta.json).
    pub from: String,
    pub svc_p99_ms: f64,
}

impl Baseline {
    /// The (a) service p99 median of a summary.json (of its
    /// [`matrix::BASELINE`] scenario; a summary from before the matrix has
    /// only that one); `None` without one.
    pub fn from_summary(text: &str, from: String) -> Option<Baseline> {
        let v: Value = serde_json::from_str(text).ok()?;
        let svc_p99_ms = v["scenarios"][matrix::BASELINE][STATIC]["svc_p99_ms"]
            .as_f64()
            .or_else(|| v[STATIC]["svc_p99_ms"].as_f64())?;
        Some(Baseline { from, svc_p99_ms })
    }
}

/// One run's figures (a row of runs.csv).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunRow {
    pub id: String,
    /// The scenario ([`crate::matrix`]); empty in rows from before the matrix.
    pub scenario: String,
    pub config: String,
    /// The agent in this configuration: [`AGENT_NONE`], [`AGENT_PATCH`] or
    /// [`AGENT_DRY_RUN`].
    pub agent: String,
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
    /// The second managed service (`pair`; NaN elsewhere).
    pub svc2_p50_ms: f64,
    pub svc2_p99_ms: f64,
    pub svc2_p999_ms: f64,
    pub svc2_throttled_ratio: f64,
    pub svc2_usage_m: f64,
    /// The within-request neighbour: p99 over the run and its contended
    /// phase(s), usage over the run and over its contended phase(s), and
    /// its pod's cpu.pressure stalls (% of wall). NaN where it gets no load.
    pub within_p99_ms: f64,
    pub within_contended_p99_ms: f64,
    pub within_usage_m: f64,
    pub within_contended_usage_m: f64,
    pub within_some_pct: f64,
    pub within_full_pct: f64,
    pub within_contended_full_pct: f64,
    pub batch_demand_p99_ms: f64,
    pub batch_demand_p50_ms: f64,
    pub batch_full_pct: f64,
    pub node_util: f64,
    pub limit_changes: usize,
    /// The agent's lowerings of the managed services (its log), those made
    /// while no neighbour was displaced, and those the samples do not cover.
    pub svc_lowerings: usize,
    pub false_lowerings: usize,
    pub unjudged_lowerings: usize,
    /// The agent's checked lowerings (`lowering checked … effect=`, a line
    /// per pod lowered): those that helped the pod owed, those that bought
    /// nothing, those it could not judge, and any other verdict.
    pub lowerings_helped: usize,
    pub lowerings_no_effect: usize,
    pub lowerings_check_unjudged: usize,
    pub lowerings_checked_other: usize,
    /// The agent's applied patches (`resized` lines) of each service, and
    /// the most it sent one service within one burst window.
    pub svc_patches: usize,
    pub svc2_patches: usize,
    pub max_patches_per_burst: usize,
    /// Each service's patches per burst, e.g. `svc:2/1;svc2:1/1`.
    pub patches_per_burst: String,
    /// `flicker`: the episodes of the within-request neighbour's need in
    /// the schedule (`matrix::episodes`), the most patches of one service
    /// within one episode, and each service's patches per episode, e.g.
    /// `svc:1/0/2/1` (0, 0 and empty in the other scenarios).
    pub episodes: usize,
    pub max_patches_per_episode: usize,
    pub patches_per_episode: String,
    /// The agent began yielding a pod to another writer (a run with any is
    /// refused by the bench: it measured nothing).
    pub yields: usize,
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
    /// (k) koordlet: its `cfs quota success` lines for the services, and
    /// the service container's and pod's `cpu.max.burst` at the run's end
    /// (`benefit::koordlet`; 0 in other configurations).
    pub koordlet_quota_writes: usize,
    pub koordlet_burst_us: u64,
    pub koordlet_pod_burst_us: u64,
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
        // The matrix's figures (the second service, the neighbour's CPU
        // in its contended phase, the agent's checks and patches), merged in.
        let more = json!({
            "within_contended_usage_m": med(rs, |r| r.within_contended_usage_m),
            "svc2_p50_ms": med(rs, |r| r.svc2_p50_ms),
            "svc2_p99_ms": med(rs, |r| r.svc2_p99_ms),
            "svc2_p99_interval": stats::bootstrap_median(&vals(rs, |r| r.svc2_p99_ms), n, seed),
            "svc2_p999_ms": med(rs, |r| r.svc2_p999_ms),
            "svc2_throttled_ratio": med(rs, |r| r.svc2_throttled_ratio),
            "lowerings_helped": total(|r| r.lowerings_helped),
            "lowerings_no_effect": total(|r| r.lowerings_no_effect),
            "lowerings_check_unjudged": total(|r| r.lowerings_check_unjudged),
            "lowerings_checked_other": total(|r| r.lowerings_checked_other),
            "max_patches_per_burst": rs.iter().map(|r| r.max_patches_per_burst).max(),
            "max_patches_per_episode": rs.iter().map(|r| r.max_patches_per_episode).max(),
            "episodes": rs.iter().map(|r| r.episodes).max(),
            "yields": total(|r| r.yields),
        });
        let mut v = json!({
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
                    "within_contended_usage": ratio(rs, a, |r| r.within_contended_usage_m),
                    "svc2_p99": ratio(rs, a, |r| r.svc2_p99_ms),
                    "within_full_pp": diff(rs, a, |r| r.within_full_pct),
                    "within_contended_full_pp": diff(rs, a, |r| r.within_contended_full_pct),
                    "batch_demand_p99": ratio(rs, a, |r| r.batch_demand_p99_ms),
                },
                "vs_nolimit": {
                    "svc_p99": ratio(rs, b, |r| r.svc_p99_ms),
                    "svc2_p99": ratio(rs, b, |r| r.svc2_p99_ms),
                    "batch_demand_p99": ratio(rs, b, |r| r.batch_demand_p99_ms),
                },
        });
        if let (Value::Object(v), Value::Object(more)) = (&mut v, more) {
            v.extend(more);
        }
        out.insert(c.to_string(), v);
    }
    Value::Object(out)
}

/// Goal thresholds (docs/benefit.md). A managed service's p99 at most its
/// p99 under (a) static.
pub const SVC_P99_VS_STATIC_MAX: f64 = 1.0;
/// A managed service's p99 at most 2 × its p99 under (b) no limit.
pub const SVC_P99_VS_NOLIMIT_MAX: f64 = 2.0;
/// The within-request neighbour's p99 at most 1.1 × its p99 under (a).
pub const WITHIN_P99_VS_STATIC_MAX: f64 = 1.10;
/// The CPU the within-request neighbour got over its contended phase(s) at
/// least this share of what it got under (a): never below, with 3 % for
/// the noise of a steady load's sampling (its usage over a 15 s phase moves
/// by a few millicores between repetitions of the same configuration).
pub const WITHIN_USAGE_VS_STATIC_MIN: f64 = 0.97;
/// The batch neighbour's p99 while it needs CPU at most its p99 under (b).
pub const BATCH_P99_VS_NOLIMIT_MAX: f64 = 1.0;
/// Against a peer ((d), (k)): a managed service's p99 at most its p99
/// under the peer.
pub const PEER_SVC_P99_MAX: f64 = 1.0;
/// Against a peer: a neighbour's p99 (the within-request and the batch
/// one) at most 1.1 × its p99 under the peer, the tolerance of the
/// within-request neighbour's goal against (a); its CPU uses
/// [`WITHIN_USAGE_VS_STATIC_MIN`].
pub const PEER_NEIGHBOUR_P99_MAX: f64 = 1.10;
/// Checked lowerings that bought the pod owed nothing, in any run.
pub const NO_EFFECT_MAX: f64 = 0.0;
/// Patches of one managed pod within one burst window, in any run.
pub const PATCHES_PER_BURST_MAX: f64 = 3.0;
/// `flicker`: patches of one managed pod within one episode of the
/// within-request neighbour's need (`matrix::episodes`), in any run: a
/// lowering when the need comes and a raise when it has gone, no more
/// (issue 47).
pub const PATCHES_PER_EPISODE_MAX: f64 = 2.0;
/// Lowerings made while no neighbour was displaced, in any run.
pub const FALSE_LOWERINGS_MAX: f64 = 0.0;
/// (e) `--dry-run`: its p99 within ±10 % of (a)'s (or its interval holds
/// (a)'s median).
pub const DRYRUN_P99_TOLERANCE: f64 = 0.10;

/// How a goal's figure is judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The median (a ratio of medians) at most the threshold; its 95 %
    /// interval is shown, and said to cross the threshold when it does.
    MedianAtMost,
    /// The median at least the threshold.
    MedianAtLeast,
    /// A count: no run above the threshold (the worst run decides).
    EveryRunAtMost,
    /// (e) `--dry-run` against (a): the ratio of the medians within
    /// ±threshold of 1, or (e)'s p99 interval holds (a)'s median.
    LikeStatic,
}

/// One goal of one configuration in one scenario.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Goal {
    pub config: String,
    /// Whose figure: `svc`, `svc2`, `within`, `batch`, `agent`.
    pub party: &'static str,
    /// Stable name, e.g. `p99_vs_static`.
    pub id: &'static str,
    /// What it asks, for the table.
    pub text: String,
    pub rule: Rule,
    pub threshold: f64,
    /// The median (a ratio of medians for the `Median…` and `LikeStatic`
    /// rules, the median of the runs' counts for `EveryRunAtMost`) and its
    /// 95 % bootstrap interval; `None` without a figure.
    pub value: Option<Interval>,
    /// `EveryRunAtMost`: the worst run's count.
    pub worst: Option<f64>,
    /// Repetitions of this configuration.
    pub runs: usize,
    /// `None`: not assessed (no figure: its baseline configuration or the
    /// party is missing).
    pub met: Option<bool>,
    /// The interval lies on both sides of the threshold.
    pub crosses: bool,
}

impl Goal {
    fn new(
        config: &str,
        party: &'static str,
        id: &'static str,
        text: String,
        rule: Rule,
        threshold: f64,
        runs: usize,
    ) -> Goal {
        Goal {
            config: config.to_string(),
            party,
            id,
            text,
            rule,
            threshold,
            value: None,
            worst: None,
            runs,
            met: None,
            crosses: false,
        }
    }

    /// Judged by the median of `value` against the threshold.
    fn median(mut self, value: Option<Interval>) -> Goal {
        let t = self.threshold;
        self.value = value;
        self.met = value.map(|i| match self.rule {
            Rule::MedianAtLeast => i.point >= t,
            _ => i.point <= t,
        });
        self.crosses = value.is_some_and(|i| i.lo < i.hi && i.lo <= t && t <= i.hi);
        self
    }

    /// Judged by the worst of the runs' `counts`.
    fn every_run(mut self, counts: &[f64]) -> Goal {
        self.value = stats::bootstrap_median(counts, stats::RESAMPLES, stats::SEED);
        self.worst = counts
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .reduce(f64::max);
        self.met = self.worst.map(|w| w <= self.threshold);
        self.crosses = self
            .value
            .is_some_and(|i| i.lo <= self.threshold && self.threshold < i.hi);
        self
    }
}

/// A run's figure a goal reads.
type Figure = fn(&RunRow) -> f64;

fn values(rs: &[&RunRow], f: Figure) -> Vec<f64> {
    rs.iter().map(|r| f(r)).collect()
}

fn ratio_of(rs: &[&RunRow], base: &[&RunRow], f: Figure) -> Option<Interval> {
    stats::bootstrap_ratio(
        &values(rs, f),
        &values(base, f),
        stats::RESAMPLES,
        stats::SEED,
    )
}

/// The goals of one scenario's runs (`rows`, all of that scenario), per
/// configuration in name order:
///
/// - each configuration whose agent patches ([`AGENT_PATCH`]): each managed
///   service's p99 at most its p99 under (a) and, where `parties.vs_nolimit`,
///   at most 2 × its p99 under (b); the within-request neighbour's p99 at
///   most 1.1 × and its CPU over its contended phase(s) at least 0.97 × its
///   figure under (a); the batch neighbour's p99 at most its p99 under
///   (b); against each peer in the run, (k) koordlet and (d)
///   `cpu.max.burst` ([`peer_goals`]), no party worse off; no run with a
///   checked lowering that bought nothing, with more than
///   3 patches of one service in one burst (where `parties.episodes`, the
///   neighbour's need coming and going: more than 2 in one episode of that
///   need), or with a false lowering;
/// - each `--dry-run` configuration: its p99 like (a)'s.
///
/// A party the scenario does not have has no goal; a figure without its
/// baseline configuration in the run is not assessed (`met: None`).
pub fn goals(rows: &[RunRow], parties: Parties) -> Vec<Goal> {
    let mut by: BTreeMap<&str, Vec<&RunRow>> = BTreeMap::new();
    for r in rows {
        by.entry(r.config.as_str()).or_default().push(r);
    }
    let none = Vec::new();
    let a = by.get(STATIC).unwrap_or(&none);
    let b = by.get(NO_LIMIT).unwrap_or(&none);
    let mut out = Vec::new();
    for (c, rs) in &by {
        let n = rs.len();
        if rs.iter().any(|r| r.agent == AGENT_DRY_RUN) {
            let ratio = ratio_of(rs, a, |r| r.svc_p99_ms);
            let ci = stats::bootstrap_median(
                &values(rs, |r| r.svc_p99_ms),
                stats::RESAMPLES,
                stats::SEED,
            );
            let base = stats::median(&values(a, |r| r.svc_p99_ms));
            let mut g = Goal::new(
                c,
                "svc",
                "dry_run_like_static",
                "`--dry-run` indistinguishable from (a) (the service's p99)".into(),
                Rule::LikeStatic,
                DRYRUN_P99_TOLERANCE,
                n,
            );
            g.value = ratio;
            g.met = ratio.map(|i| {
                (i.point - 1.0).abs() <= DRYRUN_P99_TOLERANCE
                    || matches!((ci, base), (Some(ci), Some(m)) if ci.contains(m))
            });
            out.push(g);
            continue;
        }
        if !rs.iter().any(|r| r.agent == AGENT_PATCH) {
            continue;
        }
        for (party, who, f) in services(parties) {
            out.push(
                Goal::new(
                    c,
                    party,
                    "p99_vs_static",
                    format!("{who}'s p99 never worse than under (a)"),
                    Rule::MedianAtMost,
                    SVC_P99_VS_STATIC_MAX,
                    n,
                )
                .median(ratio_of(rs, a, f)),
            );
            if parties.vs_nolimit {
                out.push(
                    Goal::new(
                        c,
                        party,
                        "p99_vs_nolimit",
                        format!("{who}'s p99 within 2× of (b) no limit"),
                        Rule::MedianAtMost,
                        SVC_P99_VS_NOLIMIT_MAX,
                        n,
                    )
                    .median(ratio_of(rs, b, f)),
                );
            }
        }
        if parties.within {
            out.push(
                Goal::new(
                    c,
                    "within",
                    "p99_vs_static",
                    "within-request neighbour's p99 at most +10 % against (a)".into(),
                    Rule::MedianAtMost,
                    WITHIN_P99_VS_STATIC_MAX,
                    n,
                )
                .median(ratio_of(rs, a, |r| r.within_p99_ms)),
            );
            out.push(
                Goal::new(c, "within", "usage_vs_static", "within-request neighbour's CPU over its contended phase never below (a)'s (3 % tolerance)".into(), Rule::MedianAtLeast, WITHIN_USAGE_VS_STATIC_MIN, n)
                    .median(ratio_of(rs, a, |r| r.within_contended_usage_m)),
            );
        }
        if parties.batch {
            out.push(
                Goal::new(
                    c,
                    "batch",
                    "p99_vs_nolimit",
                    "unmanaged batch neighbour's p99 no worse than under (b) (while it needs CPU)"
                        .into(),
                    Rule::MedianAtMost,
                    BATCH_P99_VS_NOLIMIT_MAX,
                    n,
                )
                .median(ratio_of(rs, b, |r| r.batch_demand_p99_ms)),
            );
        }
        out.extend(peer_goals(c, rs, &by, parties));
        let counts =
            |f: fn(&RunRow) -> usize| -> Vec<f64> { rs.iter().map(|r| f(r) as f64).collect() };
        out.push(
            Goal::new(c, "agent", "no_effect_lowerings", "0 lowerings that bought the pod owed nothing (`lowering checked … effect=no_effect`)".into(), Rule::EveryRunAtMost, NO_EFFECT_MAX, n)
                .every_run(&counts(|r| r.lowerings_no_effect)),
        );
        // Where the neighbour's need comes and goes, a burst holds many
        // episodes of it: the patches are held per episode instead.
        out.push(if parties.episodes {
            Goal::new(
                c,
                "agent",
                "patches_per_episode",
                "at most 2 patches of a managed pod per episode of the within-request \
                 neighbour's need"
                    .into(),
                Rule::EveryRunAtMost,
                PATCHES_PER_EPISODE_MAX,
                n,
            )
            .every_run(&counts(|r| r.max_patches_per_episode))
        } else {
            Goal::new(
                c,
                "agent",
                "patches_per_burst",
                "at most 3 patches of a managed pod per burst".into(),
                Rule::EveryRunAtMost,
                PATCHES_PER_BURST_MAX,
                n,
            )
            .every_run(&counts(|r| r.max_patches_per_burst))
        });
        out.push(
            Goal::new(
                c,
                "agent",
                "false_lowerings",
                "0 false lowerings (no neighbour displaced in the 3 s before)".into(),
                Rule::EveryRunAtMost,
                FALSE_LOWERINGS_MAX,
                n,
            )
            .every_run(&counts(|r| r.false_lowerings)),
        );
    }
    out
}

/// The managed services of a scenario: (party, who, its p99).
fn services(parties: Parties) -> Vec<(&'static str, &'static str, Figure)> {
    let mut out: Vec<(&'static str, &'static str, Figure)> =
        vec![("svc", "service", |r| r.svc_p99_ms)];
    if parties.svc2 {
        out.push(("svc2", "second service", |r| r.svc2_p99_ms));
    }
    out
}

/// A peer a user would run instead of Headroom, and the ids of the goals
/// against it.
struct Peer {
    config: &'static str,
    /// As a goal's text names it.
    name: &'static str,
    p99_id: &'static str,
    usage_id: &'static str,
}

const PEERS: [Peer; 2] = [
    Peer {
        config: KOORDLET,
        name: "(k) koordlet",
        p99_id: "p99_vs_koordlet",
        usage_id: "usage_vs_koordlet",
    },
    Peer {
        config: BURST,
        name: "(d) `cpu.max.burst`",
        p99_id: "p99_vs_burst",
        usage_id: "usage_vs_burst",
    },
];

/// The goals of a Headroom configuration `c` (its runs `rs`) against each
/// peer with runs in `by`: each managed service's p99 at most its p99 under
/// the peer, and no neighbour worse off than under it — the within-request
/// neighbour's p99 at most 1.1 × and its CPU over its contended phase(s) at
/// least 0.97 × the peer's, the batch neighbour's p99 at most 1.1 × the
/// peer's. A peer without runs adds no goal: it is not asked for by
/// default, and a goal against nothing would read as missed.
fn peer_goals(
    c: &str,
    rs: &[&RunRow],
    by: &BTreeMap<&str, Vec<&RunRow>>,
    parties: Parties,
) -> Vec<Goal> {
    let n = rs.len();
    let mut out = Vec::new();
    for peer in &PEERS {
        let Some(p) = by.get(peer.config) else {
            continue;
        };
        for (party, who, f) in services(parties) {
            out.push(
                Goal::new(
                    c,
                    party,
                    peer.p99_id,
                    format!("{who}'s p99 no worse than under {}", peer.name),
                    Rule::MedianAtMost,
                    PEER_SVC_P99_MAX,
                    n,
                )
                .median(ratio_of(rs, p, f)),
            );
        }
        if parties.within {
            out.push(
                Goal::new(
                    c,
                    "within",
                    peer.p99_id,
                    format!(
                        "within-request neighbour's p99 at most +10 % against {}",
                        peer.name
                    ),
                    Rule::MedianAtMost,
                    PEER_NEIGHBOUR_P99_MAX,
                    n,
                )
                .median(ratio_of(rs, p, |r| r.within_p99_ms)),
            );
            out.push(
                Goal::new(
                    c,
                    "within",
                    peer.usage_id,
                    format!(
                        "within-request neighbour's CPU over its contended phase never below {}'s \
                         (3 % tolerance)",
                        peer.name
                    ),
                    Rule::MedianAtLeast,
                    WITHIN_USAGE_VS_STATIC_MIN,
                    n,
                )
                .median(ratio_of(rs, p, |r| r.within_contended_usage_m)),
            );
        }
        if parties.batch {
            out.push(
                Goal::new(
                    c,
                    "batch",
                    peer.p99_id,
                    format!(
                        "unmanaged batch neighbour's p99 at most +10 % against {} (while it needs CPU)",
                        peer.name
                    ),
                    Rule::MedianAtMost,
                    PEER_NEIGHBOUR_P99_MAX,
                    n,
                )
                .median(ratio_of(rs, p, |r| r.batch_demand_p99_ms)),
            );
        }
    }
    out
}

/// Goals met, of those assessed, and those not assessed.
pub fn goals_met(goals: &[Goal]) -> Value {
    let met = goals.iter().filter(|g| g.met == Some(true)).count();
    let of = goals.iter().filter(|g| g.met.is_some()).count();
    json!({"met": met, "of": of, "not_assessed": goals.len() - of})
}

/// summary.json of a matrix run: per scenario (in the order given, those
/// with runs), [`summarise`] of its rows, its parties, its [`goals`] and
/// how many are met.
pub fn summarise_matrix(rows: &[RunRow], scenarios: &[(&str, Parties)]) -> Value {
    let (mut sc, mut parties, mut goal_map, mut met) = (
        serde_json::Map::new(),
        serde_json::Map::new(),
        serde_json::Map::new(),
        serde_json::Map::new(),
    );
    for (name, p) in scenarios {
        let rs: Vec<RunRow> = rows
            .iter()
            .filter(|r| r.scenario == *name)
            .cloned()
            .collect();
        if rs.is_empty() {
            continue;
        }
        let g = goals(&rs, *p);
        sc.insert(name.to_string(), summarise(&rs));
        parties.insert(name.to_string(), json!(p));
        met.insert(name.to_string(), goals_met(&g));
        goal_map.insert(name.to_string(), json!(g));
    }
    json!({
        "format": 2,
        "baseline_scenario": matrix::BASELINE,
        "scenarios": sc,
        "parties": parties,
        "goals": goal_map,
        "goals_met": met,
    })
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
            .filter(|r| r.scenario.is_empty() || r.scenario == matrix::BASELINE)
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

    const ALL: Parties = Parties {
        svc2: false,
        within: true,
        batch: true,
        vs_nolimit: true,
        episodes: false,
    };

    /// One scenario's runs: (a), (b), (c) patching, (e) dry run, 3 each.
    /// (c): p99 half of (a)'s and 3 × (b)'s; within p99 +5 % and its CPU
    /// 0.99 × (a)'s; batch 1.5 × (b)'s; one no-effect lowering in one run;
    /// at most 2 patches a burst. (e): p99 like (a)'s.
    fn matrix_rows(scenario: &str) -> Vec<RunRow> {
        let mut v = Vec::new();
        for rep in 0..3 {
            let r = rep as f64;
            let base = |config: &str, agent: &str| RunRow {
                id: format!("{scenario}-{config}-r{rep}"),
                scenario: scenario.into(),
                config: config.into(),
                agent: agent.into(),
                rep,
                within_p99_ms: 100.0 + r,
                within_contended_usage_m: 150.0,
                batch_demand_p99_ms: 1000.0,
                svc2_p99_ms: f64::NAN,
                ..RunRow::default()
            };
            v.push(RunRow {
                svc_p99_ms: 10_000.0 + 10.0 * r,
                svc2_p99_ms: 12_000.0 + 10.0 * r,
                ..base(STATIC, AGENT_NONE)
            });
            v.push(RunRow {
                svc_p99_ms: 1_000.0 + r,
                svc2_p99_ms: 1_100.0 + r,
                ..base(NO_LIMIT, AGENT_NONE)
            });
            v.push(RunRow {
                svc_p99_ms: 3_000.0 + r,
                svc2_p99_ms: 13_000.0 + r,
                within_p99_ms: 105.0 + r,
                within_contended_usage_m: 148.5,
                batch_demand_p99_ms: 1500.0,
                lowerings_helped: 2,
                lowerings_no_effect: usize::from(rep == 2),
                max_patches_per_burst: 2,
                ..base("c-headroom", AGENT_PATCH)
            });
            v.push(RunRow {
                svc_p99_ms: 10_500.0 + r,
                ..base("e-dryrun", AGENT_DRY_RUN)
            });
        }
        v
    }

    fn goal<'a>(g: &'a [Goal], config: &str, party: &str, id: &str) -> &'a Goal {
        g.iter()
            .find(|x| x.config == config && x.party == party && x.id == id)
            .unwrap_or_else(|| panic!("no goal {config} {party} {id} in {g:#?}"))
    }

    #[test]
    fn goals_of_a_patching_configuration_each_met_or_not() {
        let g = goals(&matrix_rows("mixed"), ALL);
        let c = |party, id| goal(&g, "c-headroom", party, id);
        // p99 0.3 × (a)'s: met; 3 × (b)'s: not met.
        let vs_a = c("svc", "p99_vs_static");
        assert_eq!(vs_a.met, Some(true));
        assert!((vs_a.value.unwrap().point - 3001.0 / 10_010.0).abs() < 1e-12);
        assert_eq!(vs_a.rule, Rule::MedianAtMost);
        assert_eq!(vs_a.runs, 3);
        assert_eq!(c("svc", "p99_vs_nolimit").met, Some(false));
        // Within p99 106/101: +5 %, met; its CPU 0.99 × (a)'s: met (≥ 0.97).
        assert_eq!(c("within", "p99_vs_static").met, Some(true));
        let usage = c("within", "usage_vs_static");
        assert_eq!((usage.met, usage.rule), (Some(true), Rule::MedianAtLeast));
        assert!((usage.value.unwrap().point - 0.99).abs() < 1e-12);
        assert_eq!(c("batch", "p99_vs_nolimit").met, Some(false));
        // One run with a no-effect lowering: the worst run decides.
        let ne = c("agent", "no_effect_lowerings");
        assert_eq!((ne.met, ne.worst), (Some(false), Some(1.0)));
        assert_eq!(ne.value.unwrap().point, 0.0);
        assert_eq!(c("agent", "patches_per_burst").met, Some(true));
        assert_eq!(c("agent", "false_lowerings").met, Some(true));
        // No second service in this scenario, and no goal for (a) or (b).
        assert!(g.iter().all(|x| x.party != "svc2"));
        assert!(g.iter().all(|x| x.config != STATIC && x.config != NO_LIMIT));
        // (e): p99 +5 % of (a)'s: like it.
        let e = goal(&g, "e-dryrun", "svc", "dry_run_like_static");
        assert_eq!(e.met, Some(true));
        assert_eq!(g.iter().filter(|x| x.config == "e-dryrun").count(), 1);
        assert_eq!(goals_met(&g), json!({"met": 6, "of": 9, "not_assessed": 0}));
    }

    #[test]
    fn a_median_met_whose_interval_crosses_says_so() {
        let mut rows = matrix_rows("mixed");
        // (c) within usage 140, 150, 160 against (a)'s 150: median 1.0,
        // interval from 0.93 to 1.07.
        for r in rows.iter_mut().filter(|r| r.config == "c-headroom") {
            r.within_contended_usage_m = 140.0 + 10.0 * r.rep as f64;
        }
        let g = goals(&rows, ALL);
        let u = goal(&g, "c-headroom", "within", "usage_vs_static");
        assert_eq!(u.met, Some(true));
        assert!(u.crosses, "{u:?}");
        assert!(!goal(&g, "c-headroom", "svc", "p99_vs_static").crosses);
        // And a usage 0.9 × (a)'s is not met.
        for r in rows.iter_mut().filter(|r| r.config == "c-headroom") {
            r.within_contended_usage_m = 135.0;
        }
        let g = goals(&rows, ALL);
        assert_eq!(
            goal(&g, "c-headroom", "within", "usage_vs_static").met,
            Some(false)
        );
    }

    #[test]
    fn the_parties_decide_which_goals_a_scenario_has() {
        let pair = Parties {
            svc2: true,
            within: true,
            batch: false,
            vs_nolimit: true,
            episodes: false,
        };
        let g = goals(&matrix_rows("pair"), pair);
        // svc2: 13,001 against (a)'s 12,010: worse, not met.
        assert_eq!(
            goal(&g, "c-headroom", "svc2", "p99_vs_static").met,
            Some(false)
        );
        assert_eq!(
            goal(&g, "c-headroom", "svc2", "p99_vs_nolimit").met,
            Some(false)
        );
        assert!(g.iter().all(|x| x.party != "batch"));
        // short: no goal against (b) for the services; the batch's stays.
        let short = Parties {
            vs_nolimit: false,
            ..ALL
        };
        let g = goals(&matrix_rows("short"), short);
        assert!(
            g.iter()
                .all(|x| x.id != "p99_vs_nolimit" || x.party == "batch")
        );
        goal(&g, "c-headroom", "batch", "p99_vs_nolimit");
        // alone: the service and the agent only.
        let alone = Parties {
            svc2: false,
            within: false,
            batch: false,
            vs_nolimit: true,
            episodes: false,
        };
        let g = goals(&matrix_rows("alone"), alone);
        let parties: Vec<&str> = g
            .iter()
            .filter(|x| x.config == "c-headroom")
            .map(|x| x.party)
            .collect();
        assert_eq!(parties, ["svc", "svc", "agent", "agent", "agent"]);
    }

    const FLICKER: Parties = Parties {
        svc2: false,
        within: true,
        batch: true,
        vs_nolimit: false,
        episodes: true,
    };

    /// `flicker`'s runs: `matrix_rows` with 5 episodes a run and (c) patching
    /// each service at most twice in one.
    fn flicker_rows() -> Vec<RunRow> {
        matrix_rows("flicker")
            .into_iter()
            .map(|r| RunRow {
                episodes: 5,
                max_patches_per_episode: if r.agent == AGENT_PATCH { 2 } else { 0 },
                ..r
            })
            .collect()
    }

    fn set_c(rows: &mut [RunRow], f: impl Fn(&mut RunRow)) {
        for r in rows.iter_mut().filter(|r| r.config == "c-headroom") {
            f(r);
        }
    }

    #[test]
    fn flicker_holds_patches_per_episode_not_per_burst() {
        let g = goals(&flicker_rows(), FLICKER);
        let ep = goal(&g, "c-headroom", "agent", "patches_per_episode");
        assert_eq!((ep.met, ep.worst), (Some(true), Some(2.0)));
        assert_eq!((ep.rule, ep.threshold), (Rule::EveryRunAtMost, 2.0));
        assert!(g.iter().all(|x| x.id != "patches_per_burst"), "{g:#?}");
        // A third patch in one episode of one run: not met.
        let mut rows = flicker_rows();
        set_c(&mut rows, |r| {
            r.max_patches_per_episode = if r.rep == 1 { 3 } else { 1 };
        });
        let g = goals(&rows, FLICKER);
        let ep = goal(&g, "c-headroom", "agent", "patches_per_episode");
        assert_eq!((ep.met, ep.worst), (Some(false), Some(3.0)));
        // Many patches per burst are no matter here (one burst, many
        // episodes), and the other scenarios keep theirs per burst.
        let mut rows = flicker_rows();
        set_c(&mut rows, |r| r.max_patches_per_burst = 10);
        assert_eq!(
            goals_met(&goals(&rows, FLICKER)),
            goals_met(&goals(&flicker_rows(), FLICKER))
        );
        // (c): 7 goals (batch against (b) and the no-effect lowering not
        // met, as in `matrix_rows`), (e): 1.
        assert_eq!(
            goals_met(&goals(&rows, FLICKER)),
            json!({"met": 6, "of": 8, "not_assessed": 0})
        );
        let g = goals(&flicker_rows(), ALL);
        assert!(g.iter().all(|x| x.id != "patches_per_episode"));
        // The summary keeps the worst run's count and the episodes.
        let s = summarise_matrix(&rows, &[("flicker", FLICKER)]);
        let c = &s["scenarios"]["flicker"]["c-headroom"];
        assert_eq!(
            (&c["max_patches_per_episode"], &c["episodes"]),
            (&json!(2), &json!(5))
        );
        assert_eq!(s["parties"]["flicker"]["episodes"], true);
    }

    #[test]
    fn flicker_nobody_worse_off_than_under_static() {
        // The short node: no goal against (b) for the service; the service
        // at most (a)'s p99, the within-request neighbour's p99 at most
        // 1.1 × (a)'s and its CPU over its need at least 0.97 × (a)'s.
        let g = goals(&flicker_rows(), FLICKER);
        assert!(
            g.iter()
                .all(|x| x.id != "p99_vs_nolimit" || x.party == "batch")
        );
        let ids: Vec<(&str, &str)> = g
            .iter()
            .filter(|x| x.config == "c-headroom")
            .map(|x| (x.party, x.id))
            .collect();
        assert_eq!(
            ids,
            [
                ("svc", "p99_vs_static"),
                ("within", "p99_vs_static"),
                ("within", "usage_vs_static"),
                ("batch", "p99_vs_nolimit"),
                ("agent", "no_effect_lowerings"),
                ("agent", "patches_per_episode"),
                ("agent", "false_lowerings"),
            ]
        );
        let met = |rows: &[RunRow], party: &str, id: &str| {
            goal(&goals(rows, FLICKER), "c-headroom", party, id).met
        };
        // The within-request neighbour's p99 (a)'s 100, 101, 102: median
        // 101. (c) 110–112: 111/101 = 1.099, met; 113/101 = 1.119, not.
        let mut rows = flicker_rows();
        set_c(&mut rows, |r| r.within_p99_ms = 110.0 + r.rep as f64);
        assert_eq!(met(&rows, "within", "p99_vs_static"), Some(true));
        set_c(&mut rows, |r| r.within_p99_ms = 112.0 + r.rep as f64);
        assert_eq!(met(&rows, "within", "p99_vs_static"), Some(false));
        // Its CPU over its episodes: 0.99 × (a)'s met, 0.95 × not.
        assert_eq!(met(&rows, "within", "usage_vs_static"), Some(true));
        set_c(&mut rows, |r| r.within_contended_usage_m = 142.5);
        assert_eq!(met(&rows, "within", "usage_vs_static"), Some(false));
        // The service: 0.3 × (a)'s p99 met; 1.06 × not.
        assert_eq!(met(&rows, "svc", "p99_vs_static"), Some(true));
        set_c(&mut rows, |r| r.svc_p99_ms = 10_600.0 + r.rep as f64);
        assert_eq!(met(&rows, "svc", "p99_vs_static"), Some(false));
    }

    /// (k) and (d) beside `matrix_rows`' (c), 3 runs each. (k): the
    /// service's p99 2,000 (c's 3,000: worse), the second's 14,000 (c's
    /// 13,000: better), the within-request neighbour's p99 as (a)'s (c's
    /// +5 %) and its CPU 160m (c's 148.5m: 0.93×), the batch pod's p99
    /// 1,400 (c's 1,500: +7 %). (d): the service's p99 4,000.
    fn rows_with_peers(scenario: &str) -> Vec<RunRow> {
        let mut v = matrix_rows(scenario);
        for rep in 0..3 {
            let r = rep as f64;
            let base = |config: &str| RunRow {
                id: format!("{scenario}-{config}-r{rep}"),
                scenario: scenario.into(),
                config: config.into(),
                agent: AGENT_NONE.into(),
                rep,
                within_p99_ms: 100.0 + r,
                within_contended_usage_m: 160.0,
                batch_demand_p99_ms: 1400.0,
                ..RunRow::default()
            };
            v.push(RunRow {
                svc_p99_ms: 2_000.0 + r,
                svc2_p99_ms: 14_000.0 + r,
                ..base(KOORDLET)
            });
            v.push(RunRow {
                svc_p99_ms: 4_000.0 + r,
                svc2_p99_ms: 13_000.0 + r,
                within_contended_usage_m: 148.5,
                batch_demand_p99_ms: 1500.0,
                ..base(BURST)
            });
        }
        v
    }

    #[test]
    fn against_koordlet_and_burst_each_party_no_worse_off() {
        let all = Parties { svc2: true, ..ALL };
        let g = goals(&rows_with_peers("pair"), all);
        let c = |party, id| goal(&g, "c-headroom", party, id).met;
        // (k): the service 3,001 / 2,001 = 1.5×, not met; the second
        // 13,001 / 14,001, met; the within-request p99 +5 %, met (≤ +10 %);
        // its CPU 0.93×, not met (≥ 0.97×); the batch +7 %, met.
        assert_eq!(c("svc", "p99_vs_koordlet"), Some(false));
        assert_eq!(c("svc2", "p99_vs_koordlet"), Some(true));
        assert_eq!(c("within", "p99_vs_koordlet"), Some(true));
        assert_eq!(c("within", "usage_vs_koordlet"), Some(false));
        assert_eq!(c("batch", "p99_vs_koordlet"), Some(true));
        let k = goal(&g, "c-headroom", "svc", "p99_vs_koordlet");
        assert!((k.value.unwrap().point - 3_001.0 / 2_001.0).abs() < 1e-12);
        assert_eq!((k.rule, k.threshold), (Rule::MedianAtMost, 1.0));
        // (d): the service 3,001 / 4,001, met; the second the same p99, met
        // (at most, not below); the neighbours as under (c).
        assert_eq!(c("svc", "p99_vs_burst"), Some(true));
        assert_eq!(c("svc2", "p99_vs_burst"), Some(true));
        assert_eq!(c("within", "usage_vs_burst"), Some(true));
        assert_eq!(c("batch", "p99_vs_burst"), Some(true));
        // The peers and the dry run get no goal against a peer.
        assert!(g.iter().all(|x| x.config != KOORDLET && x.config != BURST));
        assert!(
            g.iter()
                .filter(|x| x.config == "e-dryrun")
                .all(|x| x.id == "dry_run_like_static")
        );
        // Without (k)'s runs, no goal against it: none counts as missed.
        let no_k: Vec<RunRow> = rows_with_peers("pair")
            .into_iter()
            .filter(|r| r.config != KOORDLET)
            .collect();
        let g = goals(&no_k, all);
        assert!(g.iter().all(|x| !x.id.ends_with("_vs_koordlet")));
        assert_eq!(
            g.iter().filter(|x| x.id.ends_with("_vs_burst")).count(),
            5,
            "{g:#?}"
        );
        // A scenario without the neighbours: the services' goals alone.
        let alone = Parties {
            svc2: false,
            within: false,
            batch: false,
            vs_nolimit: true,
            episodes: false,
        };
        let g = goals(&rows_with_peers("alone"), alone);
        let ids: Vec<(&str, &str)> = g
            .iter()
            .filter(|x| x.id.ends_with("_vs_koordlet") || x.id.ends_with("_vs_burst"))
            .map(|x| (x.party, x.id))
            .collect();
        assert_eq!(ids, [("svc", "p99_vs_koordlet"), ("svc", "p99_vs_burst")]);
    }

    #[test]
    fn without_its_baseline_configuration_a_goal_is_not_assessed() {
        let rows: Vec<RunRow> = matrix_rows("mixed")
            .into_iter()
            .filter(|r| r.config != NO_LIMIT)
            .collect();
        let g = goals(&rows, ALL);
        let nb = goal(&g, "c-headroom", "svc", "p99_vs_nolimit");
        assert_eq!((nb.met, nb.value), (None, None));
        assert_eq!(
            goal(&g, "c-headroom", "svc", "p99_vs_static").met,
            Some(true)
        );
        assert_eq!(goals_met(&g)["not_assessed"], 2);
        // Without (a), (e) is not assessed either.
        let rows: Vec<RunRow> = matrix_rows("mixed")
            .into_iter()
            .filter(|r| r.config != STATIC)
            .collect();
        assert_eq!(
            goal(&goals(&rows, ALL), "e-dryrun", "svc", "dry_run_like_static").met,
            None
        );
    }

    #[test]
    fn a_dry_run_far_from_static_is_not_like_it() {
        let mut rows = matrix_rows("mixed");
        for r in rows.iter_mut().filter(|r| r.config == "e-dryrun") {
            r.svc_p99_ms *= 1.5;
        }
        let g = goals(&rows, ALL);
        assert_eq!(
            goal(&g, "e-dryrun", "svc", "dry_run_like_static").met,
            Some(false)
        );
    }

    #[test]
    fn the_matrix_summary_per_scenario_with_goals_and_the_baseline_of_mixed() {
        let mut rows = matrix_rows("mixed");
        rows.extend(matrix_rows("alone"));
        for r in rows
            .iter_mut()
            .filter(|r| r.scenario == "alone" && r.config == STATIC)
        {
            r.svc_p99_ms = 1.0;
        }
        let alone = Parties {
            within: false,
            batch: false,
            ..ALL
        };
        let s = summarise_matrix(&rows, &[("mixed", ALL), ("short", ALL), ("alone", alone)]);
        assert_eq!(s["format"], 2);
        assert_eq!(s["scenarios"]["mixed"]["c-headroom"]["svc_p99_ms"], 3001.0);
        assert_eq!(
            s["scenarios"]["mixed"]["c-headroom"]["lowerings_no_effect"],
            1
        );
        assert_eq!(
            s["scenarios"]["mixed"]["c-headroom"]["max_patches_per_burst"],
            2
        );
        assert_eq!(s["scenarios"]["alone"]["a-static"]["svc_p99_ms"], 1.0);
        // No runs of `short`: no entry.
        assert_eq!(s["scenarios"]["short"], Value::Null);
        assert_eq!(s["goals_met"]["mixed"]["of"], 9);
        // alone: (c) 2 service goals + 3 agent goals, (e) 1.
        assert_eq!(s["goals"]["alone"].as_array().unwrap().len(), 6);
        assert_eq!(s["parties"]["alone"]["within"], false);
        // The baseline is mixed's (a), in the new format and the old.
        let base = Baseline::from_summary(&s.to_string(), "x".into()).unwrap();
        assert_eq!(base.svc_p99_ms, 10_010.0);
        let (meta, _) = baseline_check(Some(&base), &rows);
        assert_eq!(meta["svc_p99_ms"], 10_010.0);
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
