//! The agent's `resized` log lines, as the benefit bench saves them
//! (`journalctl -u headroom-agent -o cat`, raw/*-agent.log):
//!
//! `2026-12-03T18:04:54.347115Z  INFO headroom::reconcile::effects: resized
//! pod=benefit-svc-0/svc old=800m new=590m generation=5 why=lower 800m→590m: …`
//!
//! The journal of the agent's unit holds every run of the bench; a run's
//! lines are those after the last `Started …` line systemd wrote.
//!
//! Two more kinds of line count (tracing's format: the message, then
//! `key=value` fields):
//!
//! - `yielding to another writer pod=… manager=…`: the agent left a pod's
//!   limits to another field manager (docs/coexistence.md); it ends with
//!   `no longer yielding to another writer`;
//! - `lowering checked pod=<ns>/<name> owed=<ns>/<name>
//!   effect=helped|no_effect|unjudged from_m=… to_m=… gained_m=… wait_fell_m=…
//!   usage_before_m=… usage_after_m=…`: after a lowering, whether the pod it
//!   was owed to gained CPU or waited less ([`lowering_checks`]; one line per
//!   pod lowered).

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

/// What the agent logs when it begins to leave a pod to another writer.
pub const YIELDING: &str = "yielding to another writer";

/// The lines of `log` where the agent began yielding a pod to another
/// writer (not those where it stopped: `no longer yielding …`).
pub fn yield_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(YIELDING) && !l.contains("no longer yielding"))
        .collect()
}

/// What the agent said while another node agent wrote the same cgroups
/// (the bench's `x-coexist` run, koordlet beside it): its log's lines by
/// message, and the first drift line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Coexistence {
    /// `cgroup drift` and `cgroup drift changed` (the former's start):
    /// cgroups disagreeing with the pod spec past the grace period.
    pub drifts: usize,
    pub drifts_cleared: usize,
    /// The agent's own resizes: seen in `cpu.max`, not seen within grace,
    /// overtaken by another writer's before they showed.
    pub verified: usize,
    pub unverified: usize,
    pub overtaken: usize,
    /// Pods left to another writer (begun).
    pub yields: usize,
    pub first_drift: Option<String>,
}

/// [`Coexistence`] of an agent log (tracing's text lines, `<time> <LEVEL>
/// <target>: <message> <fields>`; a message is matched whole, so `cgroup
/// drift` is not `cgroup drift cleared`).
pub fn coexistence(log: &str) -> Coexistence {
    let is = |l: &str, m: &str| {
        let m = format!(": {m}");
        l.contains(&format!("{m} ")) || l.ends_with(&m)
    };
    let mut c = Coexistence::default();
    for l in log.lines() {
        // `cgroup drift cleared` first: the message `cgroup drift` is its
        // start, followed by a space as fields are.
        if is(l, "cgroup drift cleared") {
            c.drifts_cleared += 1;
        } else if is(l, "cgroup drift") {
            c.drifts += 1;
            c.first_drift.get_or_insert_with(|| l.to_string());
        } else if is(l, "resize verified in cpu.max") {
            c.verified += 1;
        } else if is(l, "resize not seen in cpu.max within grace") {
            c.unverified += 1;
        } else if l.contains("resize overtaken by another writer") {
            c.overtaken += 1;
        } else if is(l, YIELDING) {
            c.yields += 1;
        }
    }
    c
}

/// Why a run in which the agent ran measured nothing (the bench then fails
/// rather than print a table of it).
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// The agent yielded a pod to another writer: it managed nothing there.
    /// The lines (their count) and the first.
    Yielded { lines: usize, first: String },
    /// An agent that patches made no patch although a service bursts above
    /// its limit.
    NoPatch,
    /// The agent's metrics count patches (`applied`) its log has no
    /// `resized` line of a service for: the log format changed under the
    /// analysis.
    LogUnread { metric_patches: f64 },
}

/// [`Refusal`] of a run from its agent log: any `yielding` line; no patch
/// at all when the agent `patches` and the service `bursts_above_limit`
/// (neither in the log, `log_patches`, nor in the metrics,
/// `metric_patches`); patches in the metrics but none in the log.
pub fn refusal(
    log: &str,
    patches: bool,
    bursts_above_limit: bool,
    log_patches: usize,
    metric_patches: f64,
) -> Option<Refusal> {
    let y = yield_lines(log);
    if let Some(first) = y.first() {
        return Some(Refusal::Yielded {
            lines: y.len(),
            first: first.to_string(),
        });
    }
    if patches && bursts_above_limit && log_patches == 0 && metric_patches == 0.0 {
        return Some(Refusal::NoPatch);
    }
    if metric_patches > 0.0 && log_patches == 0 {
        return Some(Refusal::LogUnread { metric_patches });
    }
    None
}

/// Whether a checked lowering bought the pod it was owed to anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// `effect=helped`: the owed pod gained CPU or waited less.
    Helped,
    /// `effect=no_effect`: it bought nothing.
    NoEffect,
    /// `effect=unjudged`: the agent could not tell (e.g. the owed pod's
    /// demand ended).
    Unjudged,
    /// Any other value (a newer agent's): counted apart.
    Other,
}

/// One `lowering checked` line.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedLowering {
    /// Unix seconds.
    pub t: f64,
    /// The pod lowered, `namespace/name`.
    pub pod: String,
    /// The pod the CPU was owed to, `namespace/name`.
    pub owed: String,
    pub effect: Effect,
    pub gained_m: Option<f64>,
    pub wait_fell_m: Option<f64>,
}

/// The marker of a checked lowering (spaces included: the message is
/// followed by its fields).
const LOWERING_CHECKED: &str = " lowering checked ";

/// A `lowering checked` line; `None` for any other line or one without
/// `pod=`, `owed=` or `effect=`. Values may be quoted (tracing's `?` form)
/// and the millicore fields may carry an `m`.
pub fn parse_lowering_checked(line: &str) -> Option<CheckedLowering> {
    let (ts, rest) = line.trim_start().split_once(char::is_whitespace)?;
    let t = parse_utc(ts)?;
    let at = rest.find(LOWERING_CHECKED)?;
    let (mut pod, mut owed, mut effect) = (None, None, None);
    let (mut gained_m, mut wait_fell_m) = (None, None);
    let m = |v: &str| v.strip_suffix('m').unwrap_or(v).parse::<f64>().ok();
    for kv in rest[at + LOWERING_CHECKED.len()..].split_whitespace() {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        let v = v.trim_matches('"');
        match k {
            "pod" => pod = Some(v.to_string()),
            "owed" => owed = Some(v.to_string()),
            "effect" => {
                effect = Some(match v {
                    "helped" => Effect::Helped,
                    "no_effect" => Effect::NoEffect,
                    "unjudged" => Effect::Unjudged,
                    _ => Effect::Other,
                });
            }
            "gained_m" => gained_m = m(v),
            "wait_fell_m" => wait_fell_m = m(v),
            _ => {}
        }
    }
    Some(CheckedLowering {
        t,
        pod: pod?,
        owed: owed?,
        effect: effect?,
        gained_m,
        wait_fell_m,
    })
}

/// The checked lowerings of the agent's last start, in log order.
pub fn lowering_checks(log: &str) -> Vec<CheckedLowering> {
    last_start(log)
        .lines()
        .filter_map(parse_lowering_checked)
        .collect()
}

/// Checked lowerings by effect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EffectCounts {
    pub helped: usize,
    pub no_effect: usize,
    pub unjudged: usize,
    pub other: usize,
}

pub fn effect_counts(checks: &[CheckedLowering]) -> EffectCounts {
    let mut c = EffectCounts::default();
    for x in checks {
        match x.effect {
            Effect::Helped => c.helped += 1,
            Effect::NoEffect => c.no_effect += 1,
            Effect::Unjudged => c.unjudged += 1,
            Effect::Other => c.other += 1,
        }
    }
    c
}

/// For each window `[from, to)` (Unix s), how many of `resizes` patched
/// the pod named `name`: the service's bursts, or in `flicker` the episodes
/// of the within-request neighbour's need (`matrix::episodes`), where a
/// patch at the instant one episode ends and the next begins counts to the
/// next.
pub fn patches_per_burst(resizes: &[Resize], name: &str, bursts: &[(f64, f64)]) -> Vec<usize> {
    bursts
        .iter()
        .map(|(from, to)| {
            resizes
                .iter()
                .filter(|r| r.of_pod(name) && r.t >= *from && r.t < *to)
                .count()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coexistence_counts_each_message_whole() {
        // The agent's lines as the bench's unit journal holds them (the
        // verified line from a run beside koordlet; the others' messages
        // as reconcile/effects.rs logs them).
        let e = "2026-12-07T23:45:52.674679Z  INFO headroom::reconcile::effects:";
        let log = [
            format!("{e} cgroup drift pod=benefit-svc-0/svc cgroup=app mismatch=x for_s=12"),
            format!("{e} cgroup drift changed pod=benefit-svc-0/svc cgroup=app"),
            format!("{e} cgroup drift cleared pod=benefit-svc-0/svc cgroup=app lasted_s=4"),
            format!(
                "{e} resize verified in cpu.max pod=benefit-svc-0/svc generation=2 latency_ms=1001"
            ),
            format!("{e} resize not seen in cpu.max within grace pod=benefit-svc-0/svc"),
            format!(
                "{e} resize overtaken by another writer's before it showed in cpu.max; not \
                 verified as Headroom's pod=benefit-svc-0/svc"
            ),
            format!("{e} yielding to another writer pod=benefit-svc-0/svc manager=x"),
            format!("{e} no longer yielding to another writer pod=benefit-svc-0/svc"),
            format!("{e} resized pod=benefit-svc-0/svc old=300m new=800m why=cgroup drift"),
        ]
        .join("\n");
        let c = coexistence(&log);
        assert_eq!(
            (
                c.drifts,
                c.drifts_cleared,
                c.verified,
                c.unverified,
                c.overtaken,
                c.yields
            ),
            (2, 1, 1, 1, 1, 1)
        );
        assert!(c.first_drift.unwrap().contains("for_s=12"));
        assert_eq!(coexistence("resized pod=x"), Coexistence::default());
    }

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
    fn yield_lines_are_the_pauses_not_their_ends() {
        let log = "\
2026-12-05T10:00:00.1Z  INFO headroom::reconcile::effects: yielding to another writer pod=benefit-svc-0/svc manager=kube-client limits=container app changed_at=2026-12-05T09:59:58Z why=CPU limit of container app changed in place
2026-12-05T10:00:01.0Z  INFO headroom::reconcile::effects: no longer yielding to another writer pod=benefit-svc-0/svc
2026-12-05T10:00:02.0Z  INFO headroom::reconcile::effects: resized pod=benefit-svc-0/svc old=300m new=800m generation=3 why=raise
";
        let y = yield_lines(log);
        assert_eq!(y.len(), 1);
        assert!(y[0].contains("manager=kube-client"));
        assert!(yield_lines(LOG).is_empty());
    }

    #[test]
    fn a_run_that_measured_nothing_is_refused() {
        let yielded = "2026-12-05T10:00:00Z  INFO headroom::reconcile::effects: yielding to another writer pod=ns/svc manager=x\n";
        match refusal(yielded, true, true, 3, 3.0) {
            Some(Refusal::Yielded { lines: 1, first }) => assert!(first.contains("pod=ns/svc")),
            other => panic!("{other:?}"),
        }
        // A dry run yields the same way: refused too.
        assert!(matches!(
            refusal(yielded, false, true, 0, 0.0),
            Some(Refusal::Yielded { .. })
        ));
        // Patching, bursting above the limit, no patch anywhere.
        assert_eq!(refusal(LOG, true, true, 0, 0.0), Some(Refusal::NoPatch));
        // No burst above the limit, or a dry run: no patch is expected.
        assert_eq!(refusal(LOG, true, false, 0, 0.0), None);
        assert_eq!(refusal(LOG, false, true, 0, 0.0), None);
        // Patches counted but none read from the log.
        assert_eq!(
            refusal(LOG, true, true, 0, 2.0),
            Some(Refusal::LogUnread {
                metric_patches: 2.0
            })
        );
        assert_eq!(refusal(LOG, true, true, 2, 2.0), None);
    }

    #[test]
    fn checked_lowerings_helped_and_no_effect() {
        let log = "\
Started headroom-agent.service - /mnt/node/bin/headroom-agent run --node-name n.
2026-12-05T10:00:00.5Z  INFO headroom::reconcile::effects: lowering checked pod=benefit-svc-0/svc owed=benefit-neighbours-0/within effect=helped from_m=800 to_m=500 gained_m=120 wait_fell_m=80 usage_before_m=100 usage_after_m=220
2026-12-05T10:00:02Z  INFO headroom::reconcile::effects: lowering checked pod=benefit-svc-0/svc owed=benefit-neighbours-0/within effect=unjudged from_m=800 to_m=500 gained_m=0 wait_fell_m=0 usage_before_m=100 usage_after_m=-1
2026-12-05T10:00:03Z  INFO headroom::reconcile::effects: lowering checked pod=\"benefit-svc-0/svc2\" owed=\"benefit-neighbours-0/batch\" effect=no_effect gained_m=0m wait_fell_m=-5
2026-12-05T10:00:04Z  INFO headroom::reconcile::effects: lowering checked pod=benefit-svc-0/svc owed=benefit-neighbours-0/batch effect=maybe
2026-12-05T10:00:05Z  INFO headroom::reconcile::effects: lowering checked pod=benefit-svc-0/svc effect=helped
2026-12-05T10:00:06Z DEBUG headroom::reconcile: lowering checks due pod=benefit-svc-0/svc owed=x effect=helped
";
        let c = lowering_checks(log);
        assert_eq!(c.len(), 4, "{c:?}");
        assert_eq!(c[0].pod, "benefit-svc-0/svc");
        assert_eq!(c[0].owed, "benefit-neighbours-0/within");
        assert_eq!(c[0].effect, Effect::Helped);
        assert_eq!((c[0].gained_m, c[0].wait_fell_m), (Some(120.0), Some(80.0)));
        assert!((c[0].t - parse_utc("2026-12-05T10:00:00.5Z").unwrap()).abs() < 1e-9);
        assert_eq!(c[1].effect, Effect::Unjudged);
        assert_eq!(c[2].pod, "benefit-svc-0/svc2");
        assert_eq!(c[2].effect, Effect::NoEffect);
        assert_eq!((c[2].gained_m, c[2].wait_fell_m), (Some(0.0), Some(-5.0)));
        assert_eq!((c[3].effect, c[3].gained_m), (Effect::Other, None));
        assert_eq!(
            effect_counts(&c),
            EffectCounts {
                helped: 1,
                no_effect: 1,
                unjudged: 1,
                other: 1
            }
        );
        // Only the last start counts.
        let two = format!("{log}Started again.\n");
        assert!(lowering_checks(&two).is_empty());
        assert!(lowering_checks(LOG).is_empty());
    }

    #[test]
    fn patches_counted_per_pod_and_burst_window() {
        let r = |t: f64, pod: &str| Resize {
            t,
            pod: format!("ns/{pod}"),
            old_m: 300,
            new_m: 800,
            why: String::new(),
        };
        let resizes = [
            r(9.0, "svc"),
            r(10.0, "svc"),
            r(12.0, "svc2"),
            r(20.0, "svc"),
            r(34.9, "svc"),
            r(35.0, "svc"),
            r(51.0, "svc"),
        ];
        let bursts = [(10.0, 35.0), (50.0, 75.0)];
        assert_eq!(patches_per_burst(&resizes, "svc", &bursts), [3, 1]);
        assert_eq!(patches_per_burst(&resizes, "svc2", &bursts), [1, 0]);
        assert_eq!(patches_per_burst(&resizes, "within", &bursts), [0, 0]);
        assert!(patches_per_burst(&resizes, "svc", &[]).is_empty());
    }

    #[test]
    fn patches_counted_per_episode_of_the_neighbours_need() {
        use crate::{matrix, schedule};
        let t0 = 1000.0;
        let w = schedule::parse(
            "idle:10@0.4,contended:3@18,rest:5@0.4,contended:2@18,rest:4@0.4,idle:10@0.4",
        )
        .unwrap();
        let eps: Vec<(f64, f64)> = matrix::episodes(&w, "contended")
            .into_iter()
            .map(|(a, b)| (t0 + a, t0 + b))
            .collect();
        assert_eq!(eps, [(1010.0, 1018.0), (1018.0, 1024.0)]);
        let r = |t: f64, old_m: u64, new_m: u64| Resize {
            t: t0 + t,
            pod: "benefit-svc-0/svc".into(),
            old_m,
            new_m,
            why: String::new(),
        };
        let resizes = [
            // The service's own raise, before any need: no episode's.
            r(6.0, 300, 800),
            // First episode: lowered in the need, raised in the pause.
            r(12.0, 800, 500),
            r(16.5, 500, 800),
            // At the second's start: the second's; then two more there.
            r(18.0, 800, 500),
            r(20.0, 500, 800),
            r(23.9, 800, 500),
            // After the last pause: no episode's.
            r(24.0, 500, 800),
        ];
        assert_eq!(patches_per_burst(&resizes, "svc", &eps), [2, 3]);
        assert_eq!(patches_per_burst(&resizes, "svc2", &eps), [0, 0]);
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
