//! Statistics of the benefit benchmark's repetitions: medians, percentile
//! bootstrap intervals of a median and of a ratio (or difference) of two
//! medians, and the check of a new static baseline against the committed
//! one. Pure and seeded, so a summary is reproducible from its runs.csv.

/// Resamples of a bootstrap interval.
pub const RESAMPLES: usize = 2000;
/// The bootstrap's fixed seed (any constant: it makes the intervals
/// reproducible, not better).
pub const SEED: u64 = 0x00be_2ef1_7b00_7571;
/// Two-sided coverage of the intervals.
pub const LEVEL: f64 = 0.95;

/// A point estimate and its bootstrap interval `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Interval {
    pub point: f64,
    pub lo: f64,
    pub hi: f64,
}

impl Interval {
    pub fn contains(&self, x: f64) -> bool {
        self.lo <= x && x <= self.hi
    }
}

/// Median of the finite values; `None` if there is none.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// splitmix64: a small reproducible generator for the resampling.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A resample of `v` (same size, with replacement).
    fn resample(&mut self, v: &[f64], out: &mut Vec<f64>) {
        out.clear();
        let n = v.len() as u64;
        out.extend((0..v.len()).map(|_| v[(self.next() % n) as usize]));
    }
}

/// The `q` quantile (0..=1) of sorted values, linear between ranks.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (i, frac) = (pos.floor() as usize, pos.fract());
    match sorted.get(i + 1) {
        Some(next) => sorted[i] + frac * (next - sorted[i]),
        None => sorted[i],
    }
}

fn finite(v: &[f64]) -> Vec<f64> {
    v.iter().copied().filter(|x| x.is_finite()).collect()
}

/// Percentile bootstrap of `f(median(x), median(base))`: `x` and `base`
/// are resampled independently (each with replacement, at its own size)
/// `resamples` times; the interval is the central `LEVEL` of the resampled
/// statistics. Resamples where `f` has no value (a zero baseline) are
/// dropped. `None` when either side has no finite value or `f` has none
/// at the medians.
pub fn bootstrap2(
    x: &[f64],
    base: &[f64],
    f: impl Fn(f64, f64) -> Option<f64>,
    resamples: usize,
    seed: u64,
) -> Option<Interval> {
    let (x, base) = (finite(x), finite(base));
    let point = f(median(&x)?, median(&base)?)?;
    let mut rng = Rng(seed);
    let (mut rx, mut rb) = (Vec::new(), Vec::new());
    let mut stats: Vec<f64> = (0..resamples)
        .filter_map(|_| {
            rng.resample(&x, &mut rx);
            rng.resample(&base, &mut rb);
            f(median(&rx)?, median(&rb)?).filter(|s| s.is_finite())
        })
        .collect();
    if stats.is_empty() {
        return Some(Interval {
            point,
            lo: point,
            hi: point,
        });
    }
    stats.sort_by(f64::total_cmp);
    let tail = (1.0 - LEVEL) / 2.0;
    Some(Interval {
        point,
        lo: quantile(&stats, tail),
        hi: quantile(&stats, 1.0 - tail),
    })
}

/// The median of `x` and its percentile bootstrap interval.
pub fn bootstrap_median(x: &[f64], resamples: usize, seed: u64) -> Option<Interval> {
    bootstrap2(x, x, |m, _| Some(m), resamples, seed)
}

/// `median(x) / median(base)` and its interval; `None` when the baseline's
/// median is not positive.
pub fn bootstrap_ratio(x: &[f64], base: &[f64], resamples: usize, seed: u64) -> Option<Interval> {
    bootstrap2(x, base, |a, b| (b > 0.0).then(|| a / b), resamples, seed)
}

/// `median(x) - median(base)` and its interval.
pub fn bootstrap_diff(x: &[f64], base: &[f64], resamples: usize, seed: u64) -> Option<Interval> {
    bootstrap2(x, base, |a, b| Some(a - b), resamples, seed)
}

/// A new static baseline is comparable with the committed one when it lies
/// within `[LOW, HIGH]` × the committed figure.
pub const BASELINE_RANGE: (f64, f64) = (0.5, 2.0);

/// Whether `new` lies outside [`BASELINE_RANGE`] × `committed` (a run on a
/// host much busier or quieter than the committed one's). A committed
/// figure that is not positive cannot be compared: never flagged.
pub fn outside_baseline(new: f64, committed: f64) -> bool {
    if committed <= 0.0 || !committed.is_finite() || !new.is_finite() {
        return false;
    }
    let (lo, hi) = BASELINE_RANGE;
    new < lo * committed || new > hi * committed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_non_finite() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn quantile_interpolates_between_ranks() {
        let v = [0.0, 10.0, 20.0, 30.0, 40.0];
        assert_eq!(quantile(&v, 0.0), 0.0);
        assert_eq!(quantile(&v, 1.0), 40.0);
        assert_eq!(quantile(&v, 0.5), 20.0);
        assert!((quantile(&v, 0.025) - 1.0).abs() < 1e-9);
        assert_eq!(quantile(&[7.0], 0.975), 7.0);
    }

    #[test]
    fn a_constant_sample_has_a_point_interval() {
        let i = bootstrap_median(&[5.0, 5.0, 5.0], RESAMPLES, SEED).unwrap();
        assert_eq!((i.point, i.lo, i.hi), (5.0, 5.0, 5.0));
        let r = bootstrap_ratio(&[2.0, 2.0], &[4.0, 4.0, 4.0], RESAMPLES, SEED).unwrap();
        assert_eq!((r.point, r.lo, r.hi), (0.5, 0.5, 0.5));
    }

    #[test]
    fn the_median_interval_lies_within_the_values_and_holds_the_median() {
        let x = [10.0, 12.0, 30.0];
        let i = bootstrap_median(&x, RESAMPLES, SEED).unwrap();
        assert_eq!(i.point, 12.0);
        assert!(i.contains(12.0));
        assert!(i.lo >= 10.0 && i.hi <= 30.0, "{i:?}");
        // Three values: a resample's median is one of them, and 10 or 30
        // each come out in ~26 % of the resamples: the interval spans them.
        assert_eq!((i.lo, i.hi), (10.0, 30.0));
    }

    #[test]
    fn the_bootstrap_is_reproducible_and_the_seed_matters() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 40.0];
        let b = [2.0, 3.0, 5.0, 8.0, 13.0];
        let a1 = bootstrap_ratio(&x, &b, RESAMPLES, SEED).unwrap();
        let a2 = bootstrap_ratio(&x, &b, RESAMPLES, SEED).unwrap();
        assert_eq!(a1, a2);
        let other = bootstrap_ratio(&x, &b, RESAMPLES, SEED + 1).unwrap();
        assert_eq!(other.point, a1.point);
        assert!(other.lo != a1.lo || other.hi != a1.hi);
        assert!((a1.point - 5.5 / 5.0).abs() < 1e-12);
        assert!(a1.lo < a1.point && a1.point < a1.hi, "{a1:?}");
    }

    #[test]
    fn ratio_and_difference_of_medians() {
        let r =
            bootstrap_ratio(&[50.0, 60.0, 70.0], &[100.0, 110.0, 120.0], RESAMPLES, SEED).unwrap();
        assert!((r.point - 60.0 / 110.0).abs() < 1e-12);
        assert!(
            r.lo >= 50.0 / 120.0 - 1e-12 && r.hi <= 70.0 / 100.0 + 1e-12,
            "{r:?}"
        );
        let d = bootstrap_diff(&[1.5, 2.0, 2.5], &[1.0, 1.0, 1.0], RESAMPLES, SEED).unwrap();
        assert_eq!(d.point, 1.0);
        assert!(d.lo >= 0.5 && d.hi <= 1.5, "{d:?}");
    }

    #[test]
    fn no_ratio_against_a_zero_baseline_or_without_values() {
        assert_eq!(bootstrap_ratio(&[1.0], &[0.0, 0.0], RESAMPLES, SEED), None);
        assert_eq!(bootstrap_ratio(&[], &[1.0], RESAMPLES, SEED), None);
        assert_eq!(bootstrap_median(&[f64::NAN], RESAMPLES, SEED), None);
        // A baseline whose resamples are sometimes zero: those are dropped.
        let r = bootstrap_ratio(&[1.0, 1.0, 1.0], &[0.0, 2.0, 2.0], RESAMPLES, SEED).unwrap();
        assert_eq!(r.point, 0.5);
        assert!(r.lo >= 0.5 && r.hi <= 1.0, "{r:?}");
    }

    #[test]
    fn a_baseline_outside_half_to_twice_the_committed_is_flagged() {
        assert!(!outside_baseline(18_000.0, 18_400.0));
        assert!(!outside_baseline(9_200.0, 18_400.0));
        assert!(!outside_baseline(36_800.0, 18_400.0));
        assert!(outside_baseline(9_000.0, 18_400.0));
        assert!(outside_baseline(40_000.0, 18_400.0));
        assert!(!outside_baseline(40_000.0, 0.0));
        assert!(!outside_baseline(f64::NAN, 18_400.0));
    }
}
