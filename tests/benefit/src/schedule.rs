//! A bursty arrival schedule: phases of fixed duration and fixed arrival
//! rate (quiet → burst → quiet, repeated). Open loop: send times depend on
//! the schedule only, never on how fast the server answers.

use std::time::Duration;

/// One phase: `rate_per_s` requests per second, evenly spaced, for `duration`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Phase {
    pub name: String,
    #[serde(serialize_with = "secs")]
    pub duration: Duration,
    pub rate_per_s: f64,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("phase {0:?}: want NAME:SECONDS@RATE, e.g. burst:30@45")]
    Syntax(String),
    #[error("phase {0:?}: duration must be a number of seconds in (0, 3600]")]
    Duration(String),
    #[error("phase {0:?}: rate must be a number of requests per second in [0, 10000]")]
    Rate(String),
    #[error("empty schedule")]
    Empty,
}

/// Parses `quiet:10@8,burst:30@45,...` (name:seconds@rate per second).
pub fn parse(text: &str) -> Result<Vec<Phase>, ScheduleError> {
    let mut phases = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let syntax = || ScheduleError::Syntax(part.to_string());
        let (name, rest) = part.split_once(':').ok_or_else(syntax)?;
        let (dur, rate) = rest.split_once('@').ok_or_else(syntax)?;
        if name.is_empty() {
            return Err(syntax());
        }
        let dur: f64 = dur
            .parse()
            .map_err(|_| ScheduleError::Duration(part.into()))?;
        if !(dur > 0.0 && dur <= 3600.0) {
            return Err(ScheduleError::Duration(part.into()));
        }
        let rate: f64 = rate.parse().map_err(|_| ScheduleError::Rate(part.into()))?;
        if !(0.0..=10_000.0).contains(&rate) {
            return Err(ScheduleError::Rate(part.into()));
        }
        phases.push(Phase {
            name: name.to_string(),
            duration: Duration::from_secs_f64(dur),
            rate_per_s: rate,
        });
    }
    if phases.is_empty() {
        return Err(ScheduleError::Empty);
    }
    Ok(phases)
}

/// Total length of a schedule.
pub fn total(phases: &[Phase]) -> Duration {
    phases.iter().map(|p| p.duration).sum()
}

/// Start offset of each phase.
pub fn phase_starts(phases: &[Phase]) -> Vec<Duration> {
    let mut at = Duration::ZERO;
    phases
        .iter()
        .map(|p| {
            let s = at;
            at += p.duration;
            s
        })
        .collect()
}

/// Every send time (offset from the schedule's start), in order, with the
/// index of its phase. Within a phase, request k goes at start + k / rate.
pub fn send_times(phases: &[Phase]) -> Vec<(Duration, usize)> {
    let mut out = Vec::new();
    for (i, (p, start)) in phases.iter().zip(phase_starts(phases)).enumerate() {
        if p.rate_per_s <= 0.0 {
            continue;
        }
        let n = (p.duration.as_secs_f64() * p.rate_per_s).floor() as u64;
        for k in 0..n {
            out.push((start + Duration::from_secs_f64(k as f64 / p.rate_per_s), i));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_phases_in_order() {
        let p = parse("quiet:10@8, burst:2.5@40").unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].name, "quiet");
        assert_eq!(p[1].duration, Duration::from_millis(2500));
        assert_eq!(p[1].rate_per_s, 40.0);
        assert_eq!(total(&p), Duration::from_millis(12_500));
        assert_eq!(
            phase_starts(&p),
            vec![Duration::ZERO, Duration::from_secs(10)]
        );
    }

    #[test]
    fn rejects_bad_phases_with_the_reason() {
        assert_eq!(parse(""), Err(ScheduleError::Empty));
        assert!(matches!(parse("quiet10@8"), Err(ScheduleError::Syntax(_))));
        assert!(matches!(parse(":10@8"), Err(ScheduleError::Syntax(_))));
        assert!(matches!(parse("q:0@8"), Err(ScheduleError::Duration(_))));
        assert!(matches!(parse("q:NaN@8"), Err(ScheduleError::Duration(_))));
        assert!(matches!(parse("q:10@-1"), Err(ScheduleError::Rate(_))));
        assert!(matches!(parse("q:10@inf"), Err(ScheduleError::Rate(_))));
    }

    #[test]
    fn send_times_follow_the_rate_of_each_phase() {
        let p = parse("quiet:1@4,idle:1@0,burst:0.5@20").unwrap();
        let t = send_times(&p);
        // 4 in the first second, none while idle, 10 in the burst.
        assert_eq!(t.len(), 14);
        assert_eq!(t.iter().filter(|(_, i)| *i == 0).count(), 4);
        assert_eq!(t.iter().filter(|(_, i)| *i == 1).count(), 0);
        assert_eq!(t[1].0, Duration::from_millis(250));
        assert_eq!(t[4].0, Duration::from_secs(2));
        assert_eq!(t[5].0, Duration::from_millis(2050));
        assert!(t.windows(2).all(|w| w[0].0 < w[1].0), "in order");
        assert!(t.last().unwrap().0 < total(&p));
    }
}
