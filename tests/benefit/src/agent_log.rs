//! The agent's `resized` log lines, as the benefit bench saves them
//! (`journalctl -u headroom-agent -o cat`, raw/*-agent.log):
//!
//! `2026-12-03T18:04:54.347115Z  INFO headroom::reconcile::effects: resized
//! pod=benefit-svc-0/svc old=800m new=590m generation=5 why=lower 800m→590m: …`
//!
//! The journal of the agent's unit holds every run of the bench; a run's
//! lines are those after the last `Started …` line systemd wrote.

/// Why the agent lowered a limit, from the start of its `why` text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LowerWhy {
    /// `N pod(s) displaced, Xm owed to them` (before 2026-12-05: `N pod(s)
    /// within their requests displaced, …`).
    Displaced,
    /// `above ceiling`.
    Ceiling,
    /// `leaves it at its floor`.
    Floor,
    /// `gives it a share of`.
    Share,
    Other,
}

impl LowerWhy {
    pub fn of(why: &str) -> LowerWhy {
        if why.contains("pod(s) displaced") || why.contains("within their requests displaced") {
            LowerWhy::Displaced
        } else if why.contains("above ceiling") {
            LowerWhy::Ceiling
        } else if why.contains("at its floor") {
            LowerWhy::Floor
        } else if why.contains("gives it a share of") {
            LowerWhy::Share
        } else {
            LowerWhy::Other
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            LowerWhy::Displaced => "displaced",
            LowerWhy::Ceiling => "ceiling",
            LowerWhy::Floor => "floor",
            LowerWhy::Share => "share",
            LowerWhy::Other => "other",
        }
    }
}

/// One applied resize.
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    /// Unix seconds (the guest's clock, as the sampler's).
    pub t: f64,
    /// `namespace/name`.
    pub pod: String,
    pub old_m: u64,
    pub new_m: u64,
    pub why: String,
}

impl Resize {
    pub fn is_lowering(&self) -> bool {
        self.new_m < self.old_m
    }
    /// Whether it resized the pod named `name` (any namespace).
    pub fn of_pod(&self, name: &str) -> bool {
        self.pod.rsplit('/').next() == Some(name)
    }
}

/// Days from 1970-01-01 to a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|+00:00)` → Unix seconds (UTC only: the
/// agent logs in UTC).
pub fn parse_utc(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z').or_else(|| s.strip_suffix("+00:00"))?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let y: i64 = d.next()?.parse().ok()?;
    let mo: u32 = d.next()?.parse().ok()?;
    let da: u32 = d.next()?.parse().ok()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let h: u32 = t.next()?.parse().ok()?;
    let mi: u32 = t.next()?.parse().ok()?;
    let se: u32 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let frac = if frac.is_empty() {
        0.0
    } else if frac.bytes().all(|b| b.is_ascii_digit()) {
        format!("0.{frac}").parse().ok()?
    } else {
        return None;
    };
    let secs = days_from_civil(y, mo, da) * 86_400
        + i64::from(h) * 3600
        + i64::from(mi) * 60
        + i64::from(se);
    Some(secs as f64 + frac)
}

fn millis(v: &str) -> Option<u64> {
    v.strip_suffix('m')?.parse().ok()
}

/// A `resized` line; `None` for any other line (including `dry-run: would
/// resize`).
pub fn parse_resized(line: &str) -> Option<Resize> {
    let (ts, rest) = line.trim_start().split_once(char::is_whitespace)?;
    let t = parse_utc(ts)?;
    let at = rest.find(" resized pod=")?;
    let fields = &rest[at + " resized ".len()..];
    let (head, why) = fields.split_once(" why=").unwrap_or((fields, ""));
    let mut pod = None;
    let (mut old_m, mut new_m) = (None, None);
    for kv in head.split_whitespace() {
        match kv.split_once('=') {
            Some(("pod", v)) => pod = Some(v.to_string()),
            Some(("old", v)) => old_m = millis(v),
            Some(("new", v)) => new_m = millis(v),
            _ => {}
        }
    }
    Some(Resize {
        t,
        pod: pod?,
        old_m: old_m?,
        new_m: new_m?,
        why: why.trim().to_string(),
    })
}

/// The lines of the agent's last start in a journal of several.
pub fn last_start(log: &str) -> &str {
    let mut at = 0;
    let mut pos = 0;
    for line in log.split_inclusive('\n') {
        pos += line.len();
        if line.starts_with("Started ") {
            at = pos;
        }
    }
    &log[at..]
}

/// The resizes of the agent's last start, in log order.
pub fn resizes(log: &str) -> Vec<Resize> {
    last_start(log).lines().filter_map(parse_resized).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
Started headroom-agent.service - /mnt/node/bin/headroom-agent run --node-name n.
2026-12-03T18:03:52.606534Z  INFO headroom::reconcile::effects: resized pod=benefit-svc-0/svc old=300m new=800m generation=4 why=raise 300m→800m: slack 1900m, share 600m, ceiling 800m
2026-12-03T18:04:54.347115Z  INFO headroom::reconcile::effects: resized pod=benefit-svc-0/svc old=800m new=590m generation=5 why=lower 800m→590m: cpu contention 28.1%
Stopped headroom-agent.service - /mnt/node/bin/headroom-agent run --node-name n.
Started headroom-agent.service - /mnt/node/bin/headroom-agent run --node-name n --dry-run.
2026-12-03T18:07:19.985706Z  INFO headroom::reconcile::effects: resized pod=benefit-svc-0/svc old=300m new=800m generation=9 why=raise 300m→800m: slack 1900m, share 600m, ceiling 800m
2026-12-03T18:07:20.000000Z DEBUG headroom_agent::cli::run: cpu.max written: audit at next tick path=x
2026-12-03T18:08:22.565337Z  INFO headroom::reconcile::effects: resized pod=benefit-svc-0/svc old=800m new=530m generation=10 why=lower 800m→530m: 1 pod(s) within their requests displaced, 270m owed to them (kubepods stall 40.0%, of which own throttling 1.0%), slack 338m
2026-12-03T18:08:23.000000Z  INFO headroom::reconcile::effects: dry-run: would resize pod=benefit-svc-0/svc old=530m new=200m why=lower 530m→200m: slack 0m leaves it at its floor 200m
";

    #[test]
    fn utc_timestamps() {
        assert_eq!(parse_utc("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_utc("2000-03-01T00:00:00Z"), Some(951_868_800.0));
        let t = parse_utc("2026-12-03T18:04:54.347115Z").unwrap();
        assert!((t - 1_796_321_094.347_115).abs() < 1e-6, "{t}");
        assert_eq!(
            parse_utc("2026-12-03T18:04:54+00:00"),
            Some(1_796_321_094.0)
        );
        assert_eq!(parse_utc("2026-12-03T18:04:54+01:00"), None);
        assert_eq!(parse_utc("2026-13-03T18:04:54Z"), None);
        assert_eq!(parse_utc("2026-12-03T18:04:54.x1Z"), None);
        assert_eq!(parse_utc("Started"), None);
    }

    #[test]
    fn a_resized_line_and_not_a_dry_run_one() {
        let r = parse_resized(LOG.lines().nth(2).unwrap()).unwrap();
        assert_eq!(r.pod, "benefit-svc-0/svc");
        assert!(r.of_pod("svc") && !r.of_pod("within"));
        assert_eq!((r.old_m, r.new_m), (800, 590));
        assert!(r.is_lowering());
        assert!(r.why.starts_with("lower 800m→590m: cpu contention"));
        assert_eq!(parse_resized(LOG.lines().last().unwrap()), None);
        assert_eq!(parse_resized(LOG.lines().next().unwrap()), None);
        assert_eq!(
            parse_resized("2026-12-03T18:08:22Z INFO resized pod=x old=1m"),
            None
        );
    }

    #[test]
    fn only_the_last_start_counts() {
        let r = resizes(LOG);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].old_m, r[0].new_m), (300, 800));
        assert!(!r[0].is_lowering());
        assert_eq!(LowerWhy::of(&r[1].why), LowerWhy::Displaced);
        // No start line (the tail cut it off): all of it is the last run.
        assert_eq!(resizes(last_start(LOG)).len(), 2);
        assert_eq!(last_start("a\nb\n"), "a\nb\n");
    }

    #[test]
    fn why_kinds() {
        let k = |s| LowerWhy::of(s);
        assert_eq!(k("lower 800m→300m: above ceiling 300m"), LowerWhy::Ceiling);
        assert_eq!(
            k("lower 800m→200m: slack 0m leaves it at its floor 200m"),
            LowerWhy::Floor
        );
        assert_eq!(
            k("lower 800m→500m: slack 900m over 2 managed pods gives it a share of 450m"),
            LowerWhy::Share
        );
        assert_eq!(k("lower 800m→500m: cpu contention 30%"), LowerWhy::Other);
        assert_eq!(LowerWhy::Share.as_str(), "share");
    }
}
