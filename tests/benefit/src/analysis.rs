//! What the orchestrator makes of the in-guest sampler's lines: throttling
//! and usage from `cpu.stat` deltas, node utilisation from `/proc/stat`,
//! the neighbours' `cpu.pressure` stalls, when the limit was raised or
//! lowered, and whether an agent lowering came while a neighbour was
//! displaced. Pure functions over parsed samples.
//!
//! Sampler line (one per ~0.5 s, fields split by `|`):
//! `EPOCHREALTIME|cpu.max of the service container|container cpu.stat|
//! service pod cpu.stat|within-request neighbour pod cpu.stat|batch pod cpu.stat|
//! /proc/stat cpu line|within-request neighbour pod cpu.pressure|batch pod cpu.pressure`,
//! each cpu.stat and cpu.pressure as its lines joined by `;`. With a second
//! managed service (the `pair` scenario) two more fields follow: its
//! container's `cpu.max` and `cpu.stat` ([`FIELDS_PAIR`]).

use std::collections::BTreeMap;

/// The `cpu.stat` counters the benchmark reads (µs and counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStat {
    pub usage_us: u64,
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_us: u64,
    pub nr_bursts: u64,
    pub burst_us: u64,
}

/// The `total=` stall counters of a `cpu.pressure` file (µs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    pub some_us: u64,
    pub full_us: u64,
}

/// `some avg10=… total=N;full avg10=… total=M` (a missing line reads 0).
pub fn parse_pressure(s: &str) -> Pressure {
    let mut p = Pressure::default();
    for line in s.split(';') {
        let mut it = line.split_whitespace();
        let kind = it.next();
        let total = it
            .find_map(|kv| kv.strip_prefix("total="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        match kind {
            Some("some") => p.some_us = total,
            Some("full") => p.full_us = total,
            _ => {}
        }
    }
    p
}

/// One sampler line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Wall time, Unix seconds.
    pub t: f64,
    /// Container `cpu.max` quota in µs per period (`None` = `max`).
    pub quota_us: Option<u64>,
    pub period_us: u64,
    pub container: CpuStat,
    pub pod: CpuStat,
    /// The within-request neighbour's pod.
    pub within: CpuStat,
    pub batch: CpuStat,
    /// `/proc/stat` busy and total jiffies.
    pub node_busy: u64,
    pub node_total: u64,
    pub within_pressure: Pressure,
    pub batch_pressure: Pressure,
    /// The second managed service's container (`pair` only).
    pub svc2: Option<Managed>,
}

/// A managed service container's `cpu.max` and `cpu.stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Managed {
    /// Quota in µs per period (`None` = `max`).
    pub quota_us: Option<u64>,
    pub period_us: u64,
    pub container: CpuStat,
}

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("sampler line has {0} fields, want {FIELDS}")]
    Fields(usize),
    #[error("bad {0} in sampler line: {1:?}")]
    Field(&'static str, String),
}

pub fn parse_cpu_stat(s: &str) -> CpuStat {
    let kv: BTreeMap<&str, u64> = s
        .split(';')
        .filter_map(|p| {
            let (k, v) = p.trim().split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect();
    let g = |k: &str| kv.get(k).copied().unwrap_or(0);
    CpuStat {
        usage_us: g("usage_usec"),
        nr_periods: g("nr_periods"),
        nr_throttled: g("nr_throttled"),
        throttled_us: g("throttled_usec"),
        nr_bursts: g("nr_bursts"),
        burst_us: g("burst_usec"),
    }
}

/// `cpu  user nice system idle iowait irq softirq steal ...` → (busy, total).
fn parse_proc_stat(s: &str) -> Option<(u64, u64)> {
    let mut it = s.split_whitespace();
    if it.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = it.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v[4];
    Some((total - idle, total))
}

/// Fields of a sampler line.
pub const FIELDS: usize = 9;
/// Fields of a sampler line with a second managed service.
pub const FIELDS_PAIR: usize = 11;

/// `QUOTA PERIOD` of a `cpu.max` (`QUOTA` may be `max`).
fn parse_cpu_max(v: &str) -> Option<(Option<u64>, u64)> {
    let (q, p) = v.trim().split_once(' ')?;
    let quota = match q {
        "max" => None,
        q => Some(q.parse().ok()?),
    };
    Some((quota, p.trim().parse().ok()?))
}

pub fn parse_sample(line: &str) -> Result<Sample, SampleError> {
    let f: Vec<&str> = line.trim_end().split('|').collect();
    if f.len() != FIELDS && f.len() != FIELDS_PAIR {
        return Err(SampleError::Fields(f.len()));
    }
    let bad = |what, v: &str| SampleError::Field(what, v.to_string());
    let t: f64 = f[0].trim().parse().map_err(|_| bad("time", f[0]))?;
    let (quota_us, period_us) = parse_cpu_max(f[1]).ok_or_else(|| bad("cpu.max", f[1]))?;
    let svc2 = match f.get(FIELDS..) {
        Some([max, stat]) => {
            let (quota_us, period_us) =
                parse_cpu_max(max).ok_or_else(|| bad("svc2 cpu.max", max))?;
            Some(Managed {
                quota_us,
                period_us,
                container: parse_cpu_stat(stat),
            })
        }
        _ => None,
    };
    let (node_busy, node_total) = parse_proc_stat(f[6]).ok_or_else(|| bad("/proc/stat", f[6]))?;
    Ok(Sample {
        t,
        quota_us,
        period_us,
        container: parse_cpu_stat(f[2]),
        pod: parse_cpu_stat(f[3]),
        within: parse_cpu_stat(f[4]),
        batch: parse_cpu_stat(f[5]),
        node_busy,
        node_total,
        within_pressure: parse_pressure(f[7]),
        batch_pressure: parse_pressure(f[8]),
        svc2,
    })
}

/// Parses every line; bad lines are counted, not fatal (a sample cut by the
/// sampler's stop).
pub fn parse_samples(text: &str) -> (Vec<Sample>, usize) {
    let mut bad = 0;
    let mut out = Vec::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_sample(l) {
            Ok(s) => out.push(s),
            Err(_) => bad += 1,
        }
    }
    (out, bad)
}

/// Limit in millicores of a sample (`None` for `max`).
pub fn limit_m(s: &Sample) -> Option<u64> {
    s.quota_us.map(|q| q * 1000 / s.period_us.max(1))
}

/// The second managed service's limit in millicores (`None` for `max` or
/// without one).
pub fn svc2_limit_m(s: &Sample) -> Option<u64> {
    s.svc2
        .and_then(|m| m.quota_us.map(|q| q * 1000 / m.period_us.max(1)))
}

/// CPU (millicores, averaged) a cgroup got over the windows `[from, to]`
/// (Unix s) together: in each window, the counter's growth from its first
/// to its last sample, summed, over the seconds between them, summed.
/// `None` when no window holds two samples or `which` has no value there.
pub fn usage_m(
    samples: &[Sample],
    windows: &[(f64, f64)],
    which: impl Fn(&Sample) -> Option<u64>,
) -> Option<f64> {
    let (mut us, mut secs) = (0u64, 0.0);
    for (from, to) in windows {
        let mut inside = samples
            .iter()
            .filter(|s| s.t >= *from && s.t <= *to)
            .filter_map(|s| Some((s.t, which(s)?)));
        let Some(a) = inside.next() else { continue };
        let Some(b) = inside.next_back() else {
            continue;
        };
        if b.0 > a.0 {
            us += b.1.saturating_sub(a.1);
            secs += b.0 - a.0;
        }
    }
    (secs > 0.0).then(|| us as f64 / 1e3 / secs)
}

/// A container's throttled ratio and usage over `[from, to]`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CpuWindow {
    pub throttled_ratio: f64,
    pub usage_m: f64,
}

/// [`CpuWindow`] of the `cpu.stat` `which` gives (e.g. the second
/// service's container), from the first to the last sample in `[from, to]`
/// that has it.
pub fn cpu_window(
    samples: &[Sample],
    from: f64,
    to: f64,
    which: fn(&Sample) -> Option<CpuStat>,
) -> Option<CpuWindow> {
    let mut inside = samples
        .iter()
        .filter(|s| s.t >= from && s.t <= to)
        .filter_map(|s| Some((s.t, which(s)?)));
    let a = inside.next()?;
    let b = inside.next_back()?;
    if b.0 <= a.0 {
        return None;
    }
    Some(CpuWindow {
        throttled_ratio: ratio(
            b.1.nr_throttled.saturating_sub(a.1.nr_throttled),
            b.1.nr_periods.saturating_sub(a.1.nr_periods),
        ),
        usage_m: b.1.usage_us.saturating_sub(a.1.usage_us) as f64 / 1e3 / (b.0 - a.0),
    })
}

/// Throttling and usage over a window of samples.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Window {
    pub seconds: f64,
    pub periods: u64,
    pub throttled_periods: u64,
    /// Throttled periods / periods (0 when no period ran).
    pub throttled_ratio: f64,
    pub throttled_s: f64,
    pub pod_throttled_ratio: f64,
    pub pod_throttled_s: f64,
    pub usage_m: f64,
    pub node_util: f64,
    /// Times the container's `cpu.max` changed between samples.
    pub limit_changes: usize,
    pub bursts: u64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The window `[from, to]` (Unix s) of `samples`: first and last sample in it.
pub fn window(samples: &[Sample], from: f64, to: f64) -> Option<Window> {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t >= from && s.t <= to)
        .collect();
    let (a, b) = (*inside.first()?, *inside.last()?);
    let d = |f: fn(&CpuStat) -> u64, x: fn(&Sample) -> CpuStat| f(&x(b)).saturating_sub(f(&x(a)));
    let c = |s: &Sample| s.container;
    let p = |s: &Sample| s.pod;
    let secs = b.t - a.t;
    Some(Window {
        seconds: secs,
        periods: d(|s| s.nr_periods, c),
        throttled_periods: d(|s| s.nr_throttled, c),
        throttled_ratio: ratio(d(|s| s.nr_throttled, c), d(|s| s.nr_periods, c)),
        throttled_s: d(|s| s.throttled_us, c) as f64 / 1e6,
        pod_throttled_ratio: ratio(d(|s| s.nr_throttled, p), d(|s| s.nr_periods, p)),
        pod_throttled_s: d(|s| s.throttled_us, p) as f64 / 1e6,
        usage_m: if secs > 0.0 {
            d(|s| s.usage_us, c) as f64 / 1e3 / secs
        } else {
            0.0
        },
        node_util: ratio(
            b.node_busy.saturating_sub(a.node_busy),
            b.node_total.saturating_sub(a.node_total),
        ),
        limit_changes: inside
            .windows(2)
            .filter(|w| w[0].quota_us != w[1].quota_us)
            .count(),
        bursts: d(|s| s.nr_bursts, c),
    })
}

/// Seconds from `from` to the first sample in `[from, to]` whose limit is
/// above `base_m` (0 if it already is at `from`); `None` if it never is.
pub fn first_raise_after(samples: &[Sample], from: f64, to: f64, base_m: u64) -> Option<f64> {
    samples
        .iter()
        .filter(|s| s.t >= from && s.t <= to)
        .find(|s| limit_m(s).is_none_or(|m| m > base_m))
        .map(|s| (s.t - from).max(0.0))
}

/// Seconds from `from` to the first sample in `[from, to]` whose limit is
/// below the limit at `from`; `None` if it is never lowered.
pub fn first_lowering_after(samples: &[Sample], from: f64, to: f64) -> Option<f64> {
    let mut inside = samples.iter().filter(|s| s.t >= from && s.t <= to);
    let start = limit_m(inside.next()?).unwrap_or(u64::MAX);
    inside
        .find(|s| limit_m(s).unwrap_or(u64::MAX) < start)
        .map(|s| s.t - from)
}

/// A `cpu.pressure` stall of a window, as % of its wall time.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Stall {
    pub some_pct: f64,
    pub full_pct: f64,
}

/// The stall of `which` over `[from, to]` (first and last sample in it).
pub fn stall(
    samples: &[Sample],
    from: f64,
    to: f64,
    which: fn(&Sample) -> Pressure,
) -> Option<Stall> {
    let mut inside = samples.iter().filter(|s| s.t >= from && s.t <= to);
    let a = inside.next()?;
    let b = inside.next_back()?;
    let us = (b.t - a.t) * 1e6;
    if us <= 0.0 {
        return None;
    }
    let (pa, pb) = (which(a), which(b));
    Some(Stall {
        some_pct: 100.0 * pb.some_us.saturating_sub(pa.some_us) as f64 / us,
        full_pct: 100.0 * pb.full_us.saturating_sub(pa.full_us) as f64 / us,
    })
}

/// A neighbour whose displacement a lowering is judged against.
#[derive(Clone, Copy, Debug)]
pub struct Neighbour {
    pub name: &'static str,
    pub request_m: u64,
    pub pressure: fn(&Sample) -> Pressure,
}

/// How far before a lowering the neighbours' stalls are looked at.
pub const LOOKBACK_S: f64 = 3.0;
/// A neighbour is displaced when its `full` stall in the look-back grew by
/// more than this share of its request-equivalent (request × the window).
pub const DISPLACED_SHARE: f64 = 0.10;
/// The last sample before a lowering may be at most this old, or the
/// lowering is not judged (the sampler had stopped or stalled).
pub const MAX_SAMPLE_GAP_S: f64 = 1.5;

/// What the samples say about one lowering at `t`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LoweringCheck {
    /// Seconds the samples around the look-back cover (`None`: not judged).
    pub span_s: Option<f64>,
    /// Each neighbour's `full` growth over the span, ms.
    pub full_ms: Vec<(&'static str, f64)>,
    /// The neighbours displaced by the rule.
    pub displaced: Vec<&'static str>,
}

impl LoweringCheck {
    /// Judged, and no neighbour was displaced: a false lowering.
    pub fn is_false(&self) -> bool {
        self.span_s.is_some() && self.displaced.is_empty()
    }
    pub fn judged(&self) -> bool {
        self.span_s.is_some()
    }
}

/// Whether a lowering at `t` (Unix s) came while a neighbour was displaced:
/// from the last sample at or before `t - LOOKBACK_S` to the last sample at
/// or before `t` (their span, ≈ 3 s), a neighbour is displaced when its
/// `full` total grew by more than `DISPLACED_SHARE` × its request × the
/// span (e.g. 150 ms in 3 s for a 500m request). Not judged when the
/// samples do not reach back `LOOKBACK_S` or the last one is older than
/// `MAX_SAMPLE_GAP_S`.
pub fn check_lowering(samples: &[Sample], t: f64, neighbours: &[Neighbour]) -> LoweringCheck {
    let before = |at: f64| samples.iter().rev().find(|s| s.t <= at);
    let not_judged = LoweringCheck {
        span_s: None,
        full_ms: Vec::new(),
        displaced: Vec::new(),
    };
    let (Some(a), Some(b)) = (before(t - LOOKBACK_S), before(t)) else {
        return not_judged;
    };
    let span = b.t - a.t;
    if span <= 0.0 || t - b.t > MAX_SAMPLE_GAP_S {
        return not_judged;
    }
    let mut check = LoweringCheck {
        span_s: Some(span),
        ..not_judged
    };
    for n in neighbours {
        let grew_us = (n.pressure)(b)
            .full_us
            .saturating_sub((n.pressure)(a).full_us) as f64;
        check.full_ms.push((n.name, grew_us / 1e3));
        let allowance_us = DISPLACED_SHARE * n.request_m as f64 / 1000.0 * span * 1e6;
        if grew_us > allowance_us {
            check.displaced.push(n.name);
        }
    }
    check
}

/// One row per interval between samples: time (s from `t0`), limit, usage
/// (millicores) of the service and the neighbours, throttled share of the
/// interval's periods, node utilisation.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TimelineRow {
    pub t: f64,
    pub limit_m: Option<u64>,
    pub usage_m: f64,
    pub throttled_pct: f64,
    pub within_m: f64,
    /// The within-request neighbour's `full` stall, % of the interval.
    pub within_full_pct: f64,
    pub batch_m: f64,
    pub batch_full_pct: f64,
    pub node_util: f64,
    /// The second managed service's limit (`None`: `max`, or no second
    /// service) and usage (NaN without one).
    pub svc2_limit_m: Option<u64>,
    pub svc2_usage_m: f64,
}

pub fn timeline(samples: &[Sample], t0: f64) -> Vec<TimelineRow> {
    samples
        .windows(2)
        .filter(|w| w[1].t > w[0].t)
        .map(|w| {
            let (a, b) = (&w[0], &w[1]);
            let dt = b.t - a.t;
            let m = |x: u64, y: u64| y.saturating_sub(x) as f64 / 1e3 / dt;
            TimelineRow {
                t: b.t - t0,
                limit_m: limit_m(b),
                usage_m: m(a.container.usage_us, b.container.usage_us),
                throttled_pct: 100.0
                    * ratio(
                        b.container
                            .nr_throttled
                            .saturating_sub(a.container.nr_throttled),
                        b.container
                            .nr_periods
                            .saturating_sub(a.container.nr_periods),
                    ),
                within_m: m(a.within.usage_us, b.within.usage_us),
                within_full_pct: m(a.within_pressure.full_us, b.within_pressure.full_us) / 10.0,
                batch_m: m(a.batch.usage_us, b.batch.usage_us),
                batch_full_pct: m(a.batch_pressure.full_us, b.batch_pressure.full_us) / 10.0,
                node_util: ratio(
                    b.node_busy.saturating_sub(a.node_busy),
                    b.node_total.saturating_sub(a.node_total),
                ),
                svc2_limit_m: svc2_limit_m(b),
                svc2_usage_m: match (a.svc2, b.svc2) {
                    (Some(x), Some(y)) => m(x.container.usage_us, y.container.usage_us),
                    _ => f64::NAN,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(usage: u64, periods: u64, throttled: u64, t_us: u64) -> String {
        format!(
            "usage_usec {usage};user_usec 1;system_usec 1;nr_periods {periods};nr_throttled {throttled};throttled_usec {t_us};nr_bursts 0;burst_usec 0"
        )
    }

    fn pressure(some: u64, full: u64) -> String {
        format!(
            "some avg10=1.00 avg60=0.50 avg300=0.10 total={some};full avg10=0.50 avg60=0.20 avg300=0.00 total={full}"
        )
    }

    /// A sampler line; the neighbours' `full` totals are `usage / 10` (within)
    /// and 0 (batch).
    fn line(t: f64, quota: &str, usage: u64, periods: u64, throttled: u64, busy: u64) -> String {
        line_p(t, quota, usage, periods, throttled, busy, usage / 10, 0)
    }

    #[expect(clippy::too_many_arguments, reason = "one sampler line's counters")]
    fn line_p(
        t: f64,
        quota: &str,
        usage: u64,
        periods: u64,
        throttled: u64,
        busy: u64,
        within_full: u64,
        batch_full: u64,
    ) -> String {
        let c = stat(usage, periods, throttled, throttled * 1000);
        format!(
            "{t}|{quota} 100000|{c}|{c}|{}|{}|cpu  {busy} 0 0 {} 0 0 0 0 0 0|{}|{}",
            stat(usage / 2, 0, 0, 0),
            stat(0, 0, 0, 0),
            busy,
            pressure(2 * within_full, within_full),
            pressure(2 * batch_full, batch_full),
        )
    }

    #[test]
    fn parses_cpu_pressure_totals() {
        assert_eq!(
            parse_pressure(&pressure(7, 3)),
            Pressure {
                some_us: 7,
                full_us: 3
            }
        );
        // A kernel without the `full` line, or an unreadable file.
        assert_eq!(
            parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=9"),
            Pressure {
                some_us: 9,
                full_us: 0
            }
        );
        assert_eq!(parse_pressure(""), Pressure::default());
    }

    #[test]
    fn parses_a_sampler_line_and_refuses_a_cut_one() {
        let s = parse_sample(&line(100.5, "30000", 5000, 10, 4, 400)).unwrap();
        assert_eq!(s.t, 100.5);
        assert_eq!(limit_m(&s), Some(300));
        assert_eq!(s.container.nr_throttled, 4);
        assert_eq!(s.container.throttled_us, 4000);
        assert_eq!(s.within.usage_us, 2500);
        assert_eq!((s.node_busy, s.node_total), (400, 800));
        assert_eq!(s.within_pressure.full_us, 500);
        assert_eq!(s.within_pressure.some_us, 1000);
        assert_eq!(s.batch_pressure, Pressure::default());
        let max = parse_sample(&line(1.0, "max", 0, 0, 0, 0)).unwrap();
        assert_eq!(limit_m(&max), None);
        assert_eq!(
            parse_sample("1.0|30000 100000|x"),
            Err(SampleError::Fields(3))
        );
        assert!(matches!(
            parse_sample(&line(1.0, "lots", 0, 0, 0, 0)),
            Err(SampleError::Field("cpu.max", _))
        ));
        let (ok, bad) = parse_samples(&format!("{}\n\n1.0|cut\n", line(1.0, "30000", 0, 0, 0, 0)));
        assert_eq!((ok.len(), bad), (1, 1));
    }

    fn run() -> Vec<Sample> {
        // 10 s at 300m throttled half the periods, raised to 600m at t=4.
        (0..=10)
            .map(|i| {
                let quota = if i < 4 { "30000" } else { "60000" };
                let throttled = if i < 4 { 5 * i } else { 20 };
                parse_sample(&line(
                    i as f64,
                    quota,
                    300_000 * i,
                    10 * i,
                    throttled,
                    50 * i,
                ))
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn a_pair_line_carries_the_second_service() {
        let base = line(100.5, "30000", 5000, 10, 4, 400);
        assert_eq!(parse_sample(&base).unwrap().svc2, None);
        let pair = format!("{base}|80000 100000|{}", stat(9000, 20, 5, 5000));
        let s = parse_sample(&pair).unwrap();
        let m = s.svc2.unwrap();
        assert_eq!((m.quota_us, m.period_us), (Some(80_000), 100_000));
        assert_eq!((m.container.usage_us, m.container.nr_throttled), (9000, 5));
        assert_eq!(svc2_limit_m(&s), Some(800));
        assert_eq!(limit_m(&s), Some(300));
        let max = format!("{base}|max 100000|{}", stat(0, 0, 0, 0));
        assert_eq!(svc2_limit_m(&parse_sample(&max).unwrap()), None);
        assert!(matches!(
            parse_sample(&format!("{base}|lots|x")),
            Err(SampleError::Field("svc2 cpu.max", _))
        ));
        assert_eq!(
            parse_sample(&format!("{base}|80000 100000")),
            Err(SampleError::Fields(10))
        );
    }

    /// `run()` with a second service from t=2 on: 600m, throttled a
    /// quarter of its periods.
    fn pair_run() -> Vec<Sample> {
        run()
            .into_iter()
            .map(|mut s| {
                let i = s.t as u64;
                s.svc2 = (i >= 2).then(|| Managed {
                    quota_us: Some(60_000),
                    period_us: 100_000,
                    container: CpuStat {
                        usage_us: 600_000 * i,
                        nr_periods: 10 * i,
                        nr_throttled: 10 * i / 4,
                        ..CpuStat::default()
                    },
                });
                s
            })
            .collect()
    }

    #[test]
    fn usage_over_windows_together() {
        let s = run();
        // The within pod's usage grows 150m a second throughout.
        let w = usage_m(&s, &[(0.0, 2.0), (5.0, 9.0)], |x| Some(x.within.usage_us)).unwrap();
        assert!((w - 150.0).abs() < 1e-9, "{w}");
        // A window holding one sample adds nothing; none at all: no value.
        let w = usage_m(&s, &[(3.0, 3.5), (5.0, 9.0)], |x| Some(x.within.usage_us)).unwrap();
        assert!((w - 150.0).abs() < 1e-9, "{w}");
        assert_eq!(
            usage_m(&s, &[(20.0, 30.0)], |x| Some(x.within.usage_us)),
            None
        );
        assert_eq!(usage_m(&s, &[], |x| Some(x.within.usage_us)), None);
        // The samples without the counter are skipped: 600m from t=2.
        let p = pair_run();
        let u = usage_m(&p, &[(0.0, 10.0)], |x| x.svc2.map(|m| m.container.usage_us)).unwrap();
        assert!((u - 600.0).abs() < 1e-9, "{u}");
        assert_eq!(
            usage_m(&s, &[(0.0, 10.0)], |x| x.svc2.map(|m| m.container.usage_us)),
            None
        );
    }

    #[test]
    fn the_second_services_window_and_timeline() {
        let p = pair_run();
        let w = cpu_window(&p, 0.0, 10.0, |x| x.svc2.map(|m| m.container)).unwrap();
        assert!((w.usage_m - 600.0).abs() < 1e-9);
        assert!((w.throttled_ratio - 0.25).abs() < 1e-9, "{w:?}");
        assert_eq!(
            cpu_window(&run(), 0.0, 10.0, |x| x.svc2.map(|m| m.container)),
            None
        );
        assert_eq!(
            cpu_window(&p, 2.0, 2.5, |x| x.svc2.map(|m| m.container)),
            None
        );
        let t = timeline(&p, 0.0);
        assert_eq!(t[0].svc2_limit_m, None);
        assert!(t[0].svc2_usage_m.is_nan());
        assert_eq!(t[2].svc2_limit_m, Some(600));
        assert!((t[2].svc2_usage_m - 600.0).abs() < 1e-9);
    }

    #[test]
    fn a_window_gives_throttled_ratio_time_usage_and_changes() {
        let w = window(&run(), 0.0, 10.0).unwrap();
        assert_eq!((w.periods, w.throttled_periods), (100, 20));
        assert!((w.throttled_ratio - 0.2).abs() < 1e-9);
        assert!((w.throttled_s - 0.02).abs() < 1e-9);
        assert!((w.usage_m - 300.0).abs() < 1e-9);
        assert_eq!(w.limit_changes, 1);
        assert!(window(&run(), 20.0, 30.0).is_none());
        let w = window(&run(), 5.0, 10.0).unwrap();
        assert_eq!(w.throttled_periods, 0);
    }

    #[test]
    fn raise_and_lowering_times() {
        let s = run();
        assert_eq!(first_raise_after(&s, 1.0, 10.0, 300), Some(3.0));
        assert_eq!(first_raise_after(&s, 5.0, 10.0, 300), Some(0.0));
        assert_eq!(first_raise_after(&s, 0.0, 3.0, 300), None);
        assert_eq!(first_lowering_after(&s, 0.0, 10.0), None);
        let mut down = s.clone();
        down[8].quota_us = Some(40_000);
        assert_eq!(first_lowering_after(&down, 5.0, 10.0), Some(3.0));
    }

    #[test]
    fn timeline_rows_per_interval() {
        let t = timeline(&run(), 0.0);
        assert_eq!(t.len(), 10);
        assert_eq!(t[0].limit_m, Some(300));
        assert!((t[0].usage_m - 300.0).abs() < 1e-9);
        assert!((t[0].throttled_pct - 50.0).abs() < 1e-9);
        assert!((t[0].within_m - 150.0).abs() < 1e-9);
        // 30 ms of `full` in a 1 s interval.
        assert!((t[0].within_full_pct - 3.0).abs() < 1e-9);
        assert_eq!(t[0].batch_full_pct, 0.0);
        assert_eq!(t[4].limit_m, Some(600));
        assert_eq!(t[5].throttled_pct, 0.0);
        assert!((t[0].node_util - 0.5).abs() < 1e-9);
    }

    #[test]
    fn stall_of_a_window_as_share_of_wall() {
        // within full grows 30 ms a second: 3 %; some twice that.
        let st = stall(&run(), 0.0, 10.0, |s| s.within_pressure).unwrap();
        assert!((st.full_pct - 3.0).abs() < 1e-9);
        assert!((st.some_pct - 6.0).abs() < 1e-9);
        let b = stall(&run(), 2.0, 6.0, |s| s.batch_pressure).unwrap();
        assert_eq!(b.full_pct, 0.0);
        assert!(stall(&run(), 3.0, 3.0, |s| s.within_pressure).is_none());
        assert!(stall(&run(), 20.0, 30.0, |s| s.within_pressure).is_none());
    }

    const NEIGHBOURS: [Neighbour; 2] = [
        Neighbour {
            name: "within",
            request_m: 500,
            pressure: |s| s.within_pressure,
        },
        Neighbour {
            name: "batch",
            request_m: 100,
            pressure: |s| s.batch_pressure,
        },
    ];

    /// Samples every 0.5 s from t=100 to 110; `full` of within / batch grows
    /// by `w` / `b` µs a second from t=105 on.
    fn displaced_run(w: u64, b: u64) -> Vec<Sample> {
        (0..=20)
            .map(|i| {
                let t = 100.0 + f64::from(i) * 0.5;
                let grown = |rate: u64| ((t - 105.0).max(0.0) * rate as f64) as u64;
                parse_sample(&line_p(t, "30000", 0, 0, 0, 0, grown(w), grown(b))).unwrap()
            })
            .collect()
    }

    #[test]
    fn a_lowering_without_a_displaced_neighbour_is_false() {
        // 500m request: 10 % of it over 3 s is 150 ms, 50 ms a second.
        let quiet = displaced_run(40_000, 0);
        let c = check_lowering(&quiet, 108.2, &NEIGHBOURS);
        assert_eq!(c.span_s, Some(3.0));
        assert!(c.is_false() && c.judged());
        assert_eq!(c.full_ms, vec![("within", 120.0), ("batch", 0.0)]);
        let displaced = displaced_run(60_000, 0);
        let c = check_lowering(&displaced, 108.2, &NEIGHBOURS);
        assert_eq!(c.displaced, vec!["within"]);
        assert!(!c.is_false());
        // Before the growth starts, the same run's lowering is false.
        assert!(check_lowering(&displaced, 104.9, &NEIGHBOURS).is_false());
        // The batch neighbour's 100m request: 30 ms in 3 s.
        let batch = displaced_run(0, 11_000);
        assert_eq!(
            check_lowering(&batch, 108.0, &NEIGHBOURS).displaced,
            vec!["batch"]
        );
        assert!(check_lowering(&displaced_run(0, 9_000), 108.0, &NEIGHBOURS).is_false());
    }

    #[test]
    fn a_lowering_outside_the_samples_is_not_judged() {
        let s = displaced_run(0, 0);
        // Samples start at 100: nothing 3 s before 102.
        let early = check_lowering(&s, 102.0, &NEIGHBOURS);
        assert!(!early.judged() && !early.is_false());
        // The sampler stopped at 110.
        assert!(!check_lowering(&s, 112.0, &NEIGHBOURS).judged());
        assert!(check_lowering(&s, 111.0, &NEIGHBOURS).judged());
        assert!(!check_lowering(&[], 105.0, &NEIGHBOURS).judged());
    }
}
