//! Latency recording, corrected for coordinated omission: a request's
//! latency runs from its *scheduled* send time, not from when a connection
//! got round to sending it, so a stalled server is charged for every request
//! that should have gone out during the stall.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency a histogram holds (longer ones are clamped to it).
pub const MAX_LATENCY: Duration = Duration::from_secs(120);

fn new_hist() -> Histogram<u64> {
    // 1 µs to 120 s at 3 significant digits.
    Histogram::new_with_bounds(1, MAX_LATENCY.as_micros() as u64, 3)
        .expect("static histogram bounds are valid")
}

/// Latency of one request: from its scheduled send time to its completion.
/// A completion before the schedule (impossible unless clocks are mixed up)
/// counts as zero.
pub fn corrected_latency(scheduled: Duration, completed: Duration) -> Duration {
    completed.saturating_sub(scheduled)
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Connection or protocol error: its latency still counts.
    Error,
    /// Still unanswered when the run ended: counted at the time it had waited.
    Unfinished,
}

/// Percentiles (ms) of one histogram.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

fn percentiles(h: &Histogram<u64>) -> Percentiles {
    let ms = |us: u64| us as f64 / 1000.0;
    Percentiles {
        count: h.len(),
        p50_ms: ms(h.value_at_quantile(0.50)),
        p90_ms: ms(h.value_at_quantile(0.90)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        max_ms: ms(h.max()),
    }
}

/// All latencies of a run: overall, per phase, and per second of schedule
/// (by scheduled send time).
pub struct Recorder {
    all: Histogram<u64>,
    phases: Vec<Histogram<u64>>,
    seconds: Vec<Histogram<u64>>,
    errors: u64,
    unfinished: u64,
}

/// What a run reports (the load generator's JSON output).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub all: Percentiles,
    pub phases: Vec<Percentiles>,
    /// Per second of the schedule: requests scheduled in it and their p50/p99.
    pub seconds: Vec<Percentiles>,
    pub errors: u64,
    pub unfinished: u64,
}

impl Recorder {
    pub fn new(phases: usize, seconds: usize) -> Recorder {
        Recorder {
            all: new_hist(),
            phases: (0..phases).map(|_| new_hist()).collect(),
            seconds: (0..seconds.max(1)).map(|_| new_hist()).collect(),
            errors: 0,
            unfinished: 0,
        }
    }

    /// Records a request scheduled at `scheduled` (offset from the run's
    /// start) in phase `phase`, which ended at `ended` with `outcome`.
    pub fn record(&mut self, scheduled: Duration, phase: usize, ended: Duration, outcome: Outcome) {
        let us = (corrected_latency(scheduled, ended).as_micros() as u64)
            .clamp(1, MAX_LATENCY.as_micros() as u64);
        match outcome {
            Outcome::Ok => {}
            Outcome::Error => self.errors += 1,
            Outcome::Unfinished => self.unfinished += 1,
        }
        // saturating_record clamps to the histogram's range instead of failing.
        self.all.saturating_record(us);
        if let Some(h) = self.phases.get_mut(phase) {
            h.saturating_record(us);
        }
        let sec = (scheduled.as_secs() as usize).min(self.seconds.len() - 1);
        self.seconds[sec].saturating_record(us);
    }

    pub fn summary(&self) -> Summary {
        Summary {
            all: percentiles(&self.all),
            phases: self.phases.iter().map(percentiles).collect(),
            seconds: self.seconds.iter().map(percentiles).collect(),
            errors: self.errors,
            unfinished: self.unfinished,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn latency_runs_from_the_scheduled_time() {
        // Scheduled at 100 ms, actually sent at 400 ms (connection busy),
        // answered at 410 ms: 310 ms, not the 10 ms the wire saw.
        assert_eq!(corrected_latency(ms(100), ms(410)), ms(310));
        assert_eq!(corrected_latency(ms(500), ms(400)), Duration::ZERO);
    }

    #[test]
    fn a_stall_is_charged_to_every_request_scheduled_during_it() {
        // 100 requests at 10 ms intervals; the server stalls 500 ms on the
        // first one, then answers each in 1 ms as soon as it can (one
        // connection, so requests queue behind the stall).
        let mut r = Recorder::new(1, 1);
        let mut free_at = ms(500);
        for k in 0..100u64 {
            let scheduled = ms(10 * k);
            let start = free_at.max(scheduled);
            let done = start + ms(1);
            free_at = done;
            r.record(scheduled, 0, done, Outcome::Ok);
        }
        let s = r.summary();
        assert_eq!(s.all.count, 100);
        // Without correction only one request would be slow (p50 ≈ 1 ms).
        // Corrected, the ~50 queued behind the stall are slow too.
        assert!(s.all.p50_ms > 5.0, "p50 {}", s.all.p50_ms);
        // The first waited 501 ms, the next 492 ms, ...
        assert!(
            s.all.max_ms >= 500.0 && s.all.max_ms < 502.0,
            "max {}",
            s.all.max_ms
        );
        assert!(s.all.p99_ms >= 490.0, "p99 {}", s.all.p99_ms);
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let mut r = Recorder::new(1, 1);
        for v in 1..=1000u64 {
            r.record(Duration::ZERO, 0, ms(v), Outcome::Ok);
        }
        let p = r.summary().all;
        // 3 significant digits: within 0.1 %.
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 0.001;
        assert!(near(p.p50_ms, 500.0), "{p:?}");
        assert!(near(p.p90_ms, 900.0), "{p:?}");
        assert!(near(p.p99_ms, 990.0), "{p:?}");
        assert!(near(p.p999_ms, 999.0), "{p:?}");
        assert!(near(p.max_ms, 1000.0), "{p:?}");
    }

    #[test]
    fn phases_seconds_errors_and_unfinished_are_kept_apart() {
        let mut r = Recorder::new(2, 3);
        r.record(ms(100), 0, ms(110), Outcome::Ok);
        r.record(ms(1500), 1, ms(1600), Outcome::Error);
        // Beyond the last second: counted in the last one, not dropped.
        r.record(ms(9000), 1, ms(200_000), Outcome::Unfinished);
        let s = r.summary();
        assert_eq!(s.all.count, 3);
        assert_eq!(s.phases[0].count, 1);
        assert_eq!(s.phases[1].count, 2);
        assert_eq!(
            s.seconds.iter().map(|p| p.count).collect::<Vec<_>>(),
            vec![1, 1, 1]
        );
        assert_eq!((s.errors, s.unfinished), (1, 1));
        // Clamped to the histogram's range, not lost.
        assert!(s.all.max_ms >= 119_000.0, "{}", s.all.max_ms);
    }
}
