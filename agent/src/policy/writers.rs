//! Who else changes a pod's CPU limits. A CPU limit changed in place (the
//! `resize` subresource) by a field manager other than Headroom is that
//! writer's decision — VPA's updater, another controller, a person's
//! `kubectl patch --subresource resize` — and Headroom leaves the pod's
//! limits to it: two writers that each undo the other's resize patch the pod
//! for ever. The pod annotation `headroom.dev/resume` (an RFC 3339 time)
//! hands the limits changed at or before that time back to Headroom; a later
//! change by another writer pauses it again.
//!
//! Pure: everything comes from the pod (`managedFields`, annotations) and the
//! wall clock passed in, so `run`, `explain`, `plan` and a restarted agent
//! decide alike (docs/coexistence.md).

use std::str::FromStr;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::model::{ANN_RESUME, LimitWriter, PodView};

/// How far past the agent's clock a `headroom.dev/resume` time may lie:
/// clock skew between the machine that wrote it and the node. A later time
/// would hand over changes not made yet, and is ignored.
pub const RESUME_SKEW_S: i64 = 300;

/// What the pod's `headroom.dev/resume` annotation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// No annotation.
    Absent,
    /// A time (Unix seconds) Headroom honours.
    At(i64),
    /// Not an RFC 3339 time: ignored.
    Unparseable,
    /// More than [`RESUME_SKEW_S`] ahead of the clock: ignored.
    Future(i64),
}

/// Reads `headroom.dev/resume` against the clock `now_s` (Unix seconds).
pub fn resume(pod: &PodView, now_s: i64) -> Resume {
    let Some(v) = pod.annotation(ANN_RESUME) else {
        return Resume::Absent;
    };
    match Timestamp::from_str(v.trim()) {
        Err(_) => Resume::Unparseable,
        Ok(t) if t.as_second() > now_s.saturating_add(RESUME_SKEW_S) => {
            Resume::Future(t.as_second())
        }
        Ok(t) => Resume::At(t.as_second()),
    }
}

/// Whether the resume time covers `w`'s change. A change of unknown time
/// is never covered.
fn covered(w: &LimitWriter, r: Resume) -> bool {
    match (w.at_s, r) {
        (Some(t), Resume::At(r)) => t <= r,
        _ => false,
    }
}

/// The writer Headroom yields to: of the other writers whose change the
/// resume time does not cover, the latest. `None`: the pod's limits are
/// Headroom's to manage.
pub fn yields_to(pod: &PodView, now_s: i64) -> Option<&LimitWriter> {
    let r = resume(pod, now_s);
    pod.limit_writers
        .iter()
        .filter(|w| !covered(w, r))
        .max_by_key(|w| (w.at_s, &w.manager))
}

/// The wall clock in Unix seconds, for the callers of the policy (which
/// reads no clock itself).
pub fn wall_clock_s() -> i64 {
    Timestamp::now().as_second()
}

fn rfc3339(s: i64) -> String {
    Timestamp::from_second(s).map_or_else(|_| s.to_string(), |t| t.to_string())
}

/// Why Headroom leaves a pod's limits alone, for `explain`, `plan`, the
/// Event and the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Yielded {
    /// The other writer's field manager (e.g. VPA's updater, `kubectl-patch`).
    pub manager: String,
    /// The limits it changed: `container NAME`, `pod-level limit`.
    pub limits: Vec<String>,
    /// When it last changed them (RFC 3339), if `managedFields` say.
    pub changed_at: Option<String>,
    /// Why `headroom.dev/resume`, if set, does not hand them back.
    pub resume: Option<String>,
}

impl Yielded {
    /// Why Headroom yields on `pod`, if it does.
    pub fn of(pod: &PodView, now_s: i64) -> Option<Self> {
        let w = yields_to(pod, now_s)?;
        let mut limits: Vec<String> = w
            .containers
            .iter()
            .map(|c| format!("container {c}"))
            .collect();
        if w.pod_level {
            limits.push("pod-level limit".into());
        }
        let resume = match resume(pod, now_s) {
            Resume::Absent => None,
            Resume::At(r) => Some(format!("{ANN_RESUME}={} is before this change", rfc3339(r))),
            Resume::Unparseable => Some(format!("{ANN_RESUME} is not an RFC 3339 time; ignored")),
            Resume::Future(r) => Some(format!(
                "{ANN_RESUME}={} lies in the future; ignored",
                rfc3339(r)
            )),
        };
        Some(Self {
            manager: w.manager.clone(),
            limits,
            changed_at: w.at_s.map(rfc3339),
            resume,
        })
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "CPU limit of {} changed in place by {}",
            self.limits.join(", "),
            self.manager
        );
        if let Some(t) = &self.changed_at {
            s.push_str(&format!(" at {t}"));
        }
        s.push_str(&format!(
            "; Headroom leaves this pod's limits to it until {ANN_RESUME} is set to a later time"
        ));
        if let Some(r) = &self.resume {
            s.push_str(&format!(" ({r})"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::fixtures::simple;

    /// 2026-07-01T12:00:00Z
    const T: i64 = 1_782_907_200;

    fn writer(manager: &str, at_s: Option<i64>) -> LimitWriter {
        LimitWriter {
            manager: manager.into(),
            containers: vec!["a".into()],
            pod_level: false,
            at_s,
        }
    }

    fn with(writers: Vec<LimitWriter>, resume: Option<&str>) -> PodView {
        let mut p = simple("a", 100, Some(500));
        p.limit_writers = writers;
        if let Some(r) = resume {
            p.annotations.insert(ANN_RESUME.into(), r.into());
        }
        p
    }

    #[test]
    fn no_other_writer_no_yield() {
        assert_eq!(yields_to(&with(vec![], None), T), None);
        assert_eq!(Yielded::of(&with(vec![], None), T), None);
    }

    #[test]
    fn another_writers_resize_is_yielded_to() {
        let p = with(vec![writer("vpa-updater", Some(T))], None);
        assert_eq!(
            yields_to(&p, T).map(|w| w.manager.as_str()),
            Some("vpa-updater")
        );
        let y = Yielded::of(&p, T).unwrap();
        assert_eq!(y.limits, ["container a"]);
        assert_eq!(y.changed_at.as_deref(), Some("2026-07-01T12:00:00Z"));
        assert_eq!(y.resume, None);
        assert!(
            y.describe().starts_with(
                "CPU limit of container a changed in place by vpa-updater at 2026-07-01T12:00:00Z; "
            ),
            "{}",
            y.describe()
        );
    }

    #[test]
    fn resume_at_or_after_the_change_hands_it_back() {
        for r in [
            "2026-07-01T12:00:00Z",
            "2026-07-01T12:00:01Z",
            " 2026-07-01T14:00:00+02:00 ",
        ] {
            let p = with(vec![writer("kubectl-patch", Some(T))], Some(r));
            assert_eq!(yields_to(&p, T + 60), None, "{r}");
        }
    }

    #[test]
    fn a_change_after_the_resume_time_pauses_again() {
        let p = with(
            vec![writer("kubectl-patch", Some(T))],
            Some("2026-07-01T11:59:55Z"),
        );
        let y = Yielded::of(&p, T).unwrap();
        assert_eq!(
            y.resume.as_deref(),
            Some("headroom.dev/resume=2026-07-01T11:59:55Z is before this change")
        );
    }

    #[test]
    fn the_latest_uncovered_writer_is_named() {
        let p = with(
            vec![
                writer("person", Some(T - 100)),
                writer("vpa-updater", Some(T)),
                writer("older", Some(T - 200)),
            ],
            Some("2026-07-01T11:58:30Z"), // covers `person` (T-100) and `older`
        );
        assert_eq!(yields_to(&p, T).unwrap().manager, "vpa-updater");
        let p = with(
            vec![
                writer("person", Some(T - 100)),
                writer("older", Some(T - 200)),
            ],
            None,
        );
        assert_eq!(yields_to(&p, T).unwrap().manager, "person");
    }

    #[test]
    fn refused_resume_times_are_ignored_and_said_so() {
        let w = || vec![writer("vpa-updater", Some(T))];
        for (r, says) in [
            ("yesterday", "not an RFC 3339 time"),
            ("2026-07-01", "not an RFC 3339 time"),
            ("2026-07-01T12:05:01Z", "lies in the future"),
        ] {
            let p = with(w(), Some(r));
            let y = Yielded::of(&p, T).unwrap_or_else(|| panic!("{r} honoured"));
            assert!(y.resume.as_deref().unwrap().contains(says), "{r}: {y:?}");
        }
        // Within the skew allowance: honoured.
        assert_eq!(yields_to(&with(w(), Some("2026-07-01T12:05:00Z")), T), None);
    }

    #[test]
    fn a_change_of_unknown_time_is_never_covered() {
        let p = with(vec![writer("x", None)], Some("2026-07-01T12:00:00Z"));
        let y = Yielded::of(&p, T).unwrap();
        assert_eq!(y.changed_at, None);
        assert!(!y.describe().contains(" at "), "{}", y.describe());
    }

    #[test]
    fn pod_level_and_several_containers_are_named() {
        let mut w = writer("vpa-updater", Some(T));
        w.containers = vec!["app".into(), "proxy".into()];
        w.pod_level = true;
        let y = Yielded::of(&with(vec![w], None), T).unwrap();
        assert_eq!(
            y.limits,
            ["container app", "container proxy", "pod-level limit"]
        );
    }
}
