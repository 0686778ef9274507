//! Drift and resize verification as pure state machines. Time is passed in
//! (`now`, a monotonic [`Duration`] since any fixed origin), so tests drive
//! them without clocks.

use std::collections::HashMap;
use std::time::Duration;

use crate::model::ResizeState;
use crate::policy::Direction;
use crate::verify::compare::{Mismatch, Target};

/// Default time a mismatch must outlive before it counts as drift, and a
/// resize may take before it counts as unverified.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriftEvent {
    /// A mismatch outlived the grace period (emitted once on entry).
    Drift {
        uid: String,
        mismatch: Mismatch,
        /// When the mismatch was first seen.
        since: Duration,
    },
    /// Still drifting, but the found value changed (refresh the Event text;
    /// not a new drift for counters).
    Changed { uid: String, mismatch: Mismatch },
    /// The cgroup matches again after a drift.
    Cleared {
        uid: String,
        target: Target,
        /// How long it drifted, from first mismatch to the match.
        lasted: Duration,
    },
    /// The pod vanished while drifting: drop its series.
    Forgotten { uid: String, target: Target },
}

#[derive(Debug, Clone)]
enum State {
    /// Mismatching, within grace.
    Pending {
        since: Duration,
    },
    Drifting {
        since: Duration,
        mismatch: Mismatch,
    },
}

/// Tracks mismatches per (pod uid, target). A mismatch becomes drift only
/// once it has lasted `grace`; a match ends it.
#[derive(Debug, Clone)]
pub struct DriftTracker {
    grace: Duration,
    pods: HashMap<String, HashMap<Target, State>>,
}

impl Default for DriftTracker {
    fn default() -> Self {
        Self::new(DEFAULT_GRACE)
    }
}

impl DriftTracker {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            pods: HashMap::new(),
        }
    }

    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// One check of one target: `mismatch` is `None` when it matched.
    pub fn observe(
        &mut self,
        uid: &str,
        target: &Target,
        mismatch: Option<&Mismatch>,
        now: Duration,
    ) -> Vec<DriftEvent> {
        let mut out = Vec::new();
        match mismatch {
            None => {
                if let Some(targets) = self.pods.get_mut(uid) {
                    if let Some(State::Drifting { since, .. }) = targets.remove(target) {
                        out.push(DriftEvent::Cleared {
                            uid: uid.to_string(),
                            target: target.clone(),
                            lasted: now.saturating_sub(since),
                        });
                    }
                    if targets.is_empty() {
                        self.pods.remove(uid);
                    }
                }
            }
            Some(m) => {
                let state = self
                    .pods
                    .entry(uid.to_string())
                    .or_default()
                    .entry(target.clone())
                    .or_insert(State::Pending { since: now });
                match state {
                    State::Pending { since } if now.saturating_sub(*since) >= self.grace => {
                        let since = *since;
                        out.push(DriftEvent::Drift {
                            uid: uid.to_string(),
                            mismatch: m.clone(),
                            since,
                        });
                        *state = State::Drifting {
                            since,
                            mismatch: m.clone(),
                        };
                    }
                    State::Pending { .. } => {}
                    State::Drifting { mismatch, .. } => {
                        if mismatch != m {
                            *mismatch = m.clone();
                            out.push(DriftEvent::Changed {
                                uid: uid.to_string(),
                                mismatch: m.clone(),
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// One audit of a whole pod: `mismatches` as [`compare`](super::compare::compare)
    /// returned them. Every tracked target of the pod not listed matched.
    pub fn observe_pod(
        &mut self,
        uid: &str,
        mismatches: &[Mismatch],
        now: Duration,
    ) -> Vec<DriftEvent> {
        let mut out = Vec::new();
        let matched: Vec<Target> = self
            .pods
            .get(uid)
            .map(|t| {
                t.keys()
                    .filter(|k| !mismatches.iter().any(|m| &m.target == *k))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for t in &matched {
            out.extend(self.observe(uid, t, None, now));
        }
        for m in mismatches {
            out.extend(self.observe(uid, &m.target, Some(m), now));
        }
        out
    }

    /// The pod is gone: drop its state; drifting targets give `Forgotten`.
    pub fn forget(&mut self, uid: &str) -> Vec<DriftEvent> {
        let Some(targets) = self.pods.remove(uid) else {
            return Vec::new();
        };
        let mut out: Vec<DriftEvent> = targets
            .into_iter()
            .filter(|(_, s)| matches!(s, State::Drifting { .. }))
            .map(|(target, _)| DriftEvent::Forgotten {
                uid: uid.to_string(),
                target,
            })
            .collect();
        out.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        out
    }

    /// Forgets every pod for which `live` is false.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) -> Vec<DriftEvent> {
        let gone: Vec<String> = self.pods.keys().filter(|u| !live(u)).cloned().collect();
        gone.iter().flat_map(|u| self.forget(u)).collect()
    }

    pub fn is_drifting(&self, uid: &str, target: &Target) -> bool {
        matches!(
            self.pods.get(uid).and_then(|t| t.get(target)),
            Some(State::Drifting { .. })
        )
    }

    /// Every drifting target: (uid, mismatch).
    pub fn drifting(&self) -> impl Iterator<Item = (&str, &Mismatch)> {
        self.pods.iter().flat_map(|(uid, t)| {
            t.values().filter_map(move |s| match s {
                State::Drifting { mismatch, .. } => Some((uid.as_str(), mismatch)),
                State::Pending { .. } => None,
            })
        })
    }

    /// Number of pods with any tracked (pending or drifting) target.
    pub fn tracked_pods(&self) -> usize {
        self.pods.len()
    }
}

/// How a resize ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeOutcome {
    /// The cgroups matched the patched spec. `latency`: patch sent → first
    /// match seen.
    Verified {
        uid: String,
        generation: i64,
        latency: Duration,
    },
    /// No match within grace: after the kubelet reported done, or (if it
    /// never did) after the patch was sent.
    Unverified {
        uid: String,
        generation: i64,
        kubelet_done: bool,
        waited: Duration,
    },
}

#[derive(Debug, Clone)]
struct Inflight {
    generation: i64,
    direction: Direction,
    sent_at: Duration,
    done_at: Option<Duration>,
    first_match: Option<Duration>,
}

/// Follows each patched resize until it is verified in the cgroups.
///
/// Rules: a match after the kubelet reports done verifies. A match seen
/// *before* done (status lagging behind a correct cgroup, docs/kubelet-behaviour.md §3) is
/// remembered: the resize verifies once done arrives, or when the grace
/// runs out with status still lagging — never as a failure. No match within
/// `grace` of done (or of sending, if done never comes) → unverified.
#[derive(Debug, Clone)]
pub struct ResizeTracker {
    grace: Duration,
    inflight: HashMap<String, Inflight>,
}

impl Default for ResizeTracker {
    fn default() -> Self {
        Self::new(DEFAULT_GRACE)
    }
}

/// Whether the kubelet has finished the resize of `generation`: observed
/// at or past it, and neither pending nor in progress.
pub fn kubelet_done(resize: &ResizeState, generation: i64) -> bool {
    resize.observed_generation.is_some_and(|g| g >= generation)
        && resize.pending.is_none()
        && resize.in_progress.is_none()
}

impl ResizeTracker {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            inflight: HashMap::new(),
        }
    }

    /// A resize patch (raising or lowering the limit: `direction`) was
    /// accepted; its response carried `generation`. A newer patch of the
    /// same pod replaces an older one in flight: its direction is returned
    /// (it ends superseded).
    pub fn patched(
        &mut self,
        uid: &str,
        generation: i64,
        direction: Direction,
        sent_at: Duration,
    ) -> Option<Direction> {
        self.inflight
            .insert(
                uid.to_string(),
                Inflight {
                    generation,
                    direction,
                    sent_at,
                    done_at: None,
                    first_match: None,
                },
            )
            .map(|r| r.direction)
    }

    /// Feed the pod's resize status (from each watch event). Returns true
    /// when the kubelet is (now) done: time to re-read the cgroups.
    pub fn kubelet_status(&mut self, uid: &str, resize: &ResizeState, now: Duration) -> bool {
        let Some(r) = self.inflight.get_mut(uid) else {
            return false;
        };
        if r.done_at.is_none() && kubelet_done(resize, r.generation) {
            r.done_at = Some(now);
        }
        r.done_at.is_some()
    }

    /// The pod's cgroups were compared with its spec at `now`.
    pub fn checked(&mut self, uid: &str, matches: bool, now: Duration) -> Option<ResizeOutcome> {
        let r = self.inflight.get_mut(uid)?;
        if matches && r.first_match.is_none() {
            r.first_match = Some(now);
        }
        let base = r.done_at.unwrap_or(r.sent_at);
        let expired = now.saturating_sub(base) >= self.grace;
        let outcome = match (r.first_match, r.done_at.is_some() || expired) {
            // Verified: done and matched, or status lagged past grace but
            // the cgroup was right.
            (Some(m), true) if matches || r.done_at.is_none() => ResizeOutcome::Verified {
                uid: uid.to_string(),
                generation: r.generation,
                latency: m.saturating_sub(r.sent_at),
            },
            _ if expired => ResizeOutcome::Unverified {
                uid: uid.to_string(),
                generation: r.generation,
                kubelet_done: r.done_at.is_some(),
                waited: now.saturating_sub(r.sent_at),
            },
            _ => return None,
        };
        self.inflight.remove(uid);
        Some(outcome)
    }

    /// Generation of the resize in flight for `uid`, if any.
    pub fn generation(&self, uid: &str) -> Option<i64> {
        self.inflight.get(uid).map(|r| r.generation)
    }

    /// Direction of the resize in flight for `uid`, if any.
    pub fn direction(&self, uid: &str) -> Option<Direction> {
        self.inflight.get(uid).map(|r| r.direction)
    }

    /// Pods (uids) with a resize in flight.
    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.inflight.keys()
    }

    /// The pod is gone: nothing to verify. The direction of the resize that
    /// was in flight, if one was (it ends with the pod).
    pub fn forget(&mut self, uid: &str) -> Option<Direction> {
        self.inflight.remove(uid).map(|r| r.direction)
    }

    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{CpuMax, Driver};
    use crate::verify::compare::Observed;
    use crate::verify::expected::ExpectedMax;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn mm(target: Target, found: u64) -> Mismatch {
        Mismatch {
            target,
            expected: ExpectedMax::Limit {
                millis: 800,
                period_us: 100_000,
            },
            actual: Observed::Value(CpuMax {
                quota_us: Some(found),
                period_us: 100_000,
            }),
            driver: Driver::Cgroupfs,
        }
    }

    #[test]
    fn mismatch_within_grace_is_not_drift() {
        let mut t = DriftTracker::new(s(30));
        let m = mm(Target::Pod, 11_000);
        assert_eq!(t.observe_pod("u", std::slice::from_ref(&m), s(0)), vec![]);
        assert_eq!(t.observe_pod("u", std::slice::from_ref(&m), s(29)), vec![]);
        assert!(!t.is_drifting("u", &Target::Pod));
    }

    #[test]
    fn mismatch_outliving_grace_is_drift_once() {
        let mut t = DriftTracker::new(s(30));
        let m = mm(Target::Pod, 11_000);
        t.observe_pod("u", std::slice::from_ref(&m), s(0));
        let ev = t.observe_pod("u", std::slice::from_ref(&m), s(30));
        assert_eq!(
            ev,
            vec![DriftEvent::Drift {
                uid: "u".into(),
                mismatch: m.clone(),
                since: s(0)
            }]
        );
        assert!(t.is_drifting("u", &Target::Pod));
        assert_eq!(t.observe_pod("u", std::slice::from_ref(&m), s(60)), vec![]);
        assert_eq!(t.drifting().count(), 1);
    }

    #[test]
    fn match_within_grace_resets_the_clock() {
        let mut t = DriftTracker::new(s(30));
        let m = mm(Target::Pod, 11_000);
        t.observe_pod("u", std::slice::from_ref(&m), s(0));
        assert_eq!(t.observe_pod("u", &[], s(20)), vec![]);
        t.observe_pod("u", std::slice::from_ref(&m), s(25));
        assert_eq!(t.observe_pod("u", std::slice::from_ref(&m), s(50)), vec![]);
        assert_eq!(t.observe_pod("u", std::slice::from_ref(&m), s(55)).len(), 1);
    }

    #[test]
    fn drift_clears_when_the_cgroup_matches_again() {
        let mut t = DriftTracker::new(s(30));
        let m = mm(Target::Container("c".into()), 20_000);
        t.observe_pod("u", std::slice::from_ref(&m), s(0));
        t.observe_pod("u", std::slice::from_ref(&m), s(30));
        let ev = t.observe_pod("u", &[], s(45));
        assert_eq!(
            ev,
            vec![DriftEvent::Cleared {
                uid: "u".into(),
                target: Target::Container("c".into()),
                lasted: s(45)
            }]
        );
        assert_eq!(t.tracked_pods(), 0);
    }

    #[test]
    fn changed_value_while_drifting_is_reported_as_changed() {
        let mut t = DriftTracker::new(s(30));
        t.observe_pod("u", &[mm(Target::Pod, 11_000)], s(0));
        t.observe_pod("u", &[mm(Target::Pod, 11_000)], s(30));
        let ev = t.observe_pod("u", &[mm(Target::Pod, 12_000)], s(40));
        assert!(matches!(&ev[..], [DriftEvent::Changed { .. }]));
    }

    #[test]
    fn targets_are_tracked_separately() {
        let mut t = DriftTracker::new(s(30));
        t.observe_pod("u", &[mm(Target::Pod, 1)], s(0));
        let ev = t.observe_pod(
            "u",
            &[mm(Target::Pod, 1), mm(Target::Container("c".into()), 2)],
            s(30),
        );
        assert_eq!(ev.len(), 1);
        assert!(t.is_drifting("u", &Target::Pod));
        assert!(!t.is_drifting("u", &Target::Container("c".into())));
    }

    #[test]
    fn vanished_pod_is_forgotten() {
        let mut t = DriftTracker::new(s(30));
        t.observe_pod("u", &[mm(Target::Pod, 1)], s(0));
        t.observe_pod("u", &[mm(Target::Pod, 1)], s(30));
        t.observe_pod("v", &[mm(Target::Pod, 1)], s(30));
        let ev = t.retain(|uid| uid == "v");
        assert_eq!(
            ev,
            vec![DriftEvent::Forgotten {
                uid: "u".into(),
                target: Target::Pod
            }]
        );
        assert_eq!(t.tracked_pods(), 1);
        // A pending (not drifting) pod is dropped silently.
        assert_eq!(t.forget("v"), vec![]);
        assert_eq!(t.tracked_pods(), 0);
    }

    fn done(gen_: i64) -> ResizeState {
        ResizeState {
            observed_generation: Some(gen_),
            ..Default::default()
        }
    }

    fn in_progress(gen_: i64) -> ResizeState {
        ResizeState {
            in_progress: Some(String::new()),
            observed_generation: Some(gen_),
            ..Default::default()
        }
    }

    #[test]
    fn kubelet_done_needs_generation_and_no_conditions() {
        assert!(kubelet_done(&done(3), 3));
        assert!(kubelet_done(&done(4), 3));
        assert!(!kubelet_done(&done(2), 3));
        assert!(!kubelet_done(&in_progress(3), 3));
        let pending = ResizeState {
            pending: Some("Infeasible".into()),
            observed_generation: Some(3),
            ..Default::default()
        };
        assert!(!kubelet_done(&pending, 3));
        assert!(!kubelet_done(&ResizeState::default(), 1));
    }

    #[test]
    fn match_after_done_verifies_with_latency_from_send() {
        let mut r = ResizeTracker::new(s(30));
        r.patched("u", 3, Direction::Raise, s(10));
        assert!(!r.kubelet_status("u", &in_progress(3), s(11)));
        assert!(r.kubelet_status("u", &done(3), s(12)));
        assert_eq!(
            r.checked("u", true, s(13)),
            Some(ResizeOutcome::Verified {
                uid: "u".into(),
                generation: 3,
                latency: s(3)
            })
        );
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn mismatch_after_done_within_grace_waits() {
        let mut r = ResizeTracker::new(s(30));
        r.patched("u", 3, Direction::Raise, s(0));
        r.kubelet_status("u", &done(3), s(5));
        assert_eq!(r.checked("u", false, s(6)), None);
        assert_eq!(r.checked("u", false, s(34)), None);
        assert_eq!(
            r.checked("u", false, s(35)),
            Some(ResizeOutcome::Unverified {
                uid: "u".into(),
                generation: 3,
                kubelet_done: true,
                waited: s(35)
            })
        );
    }

    #[test]
    fn kubelet_never_done_and_no_match_is_unverified() {
        let mut r = ResizeTracker::new(s(30));
        r.patched("u", 3, Direction::Raise, s(0));
        r.kubelet_status("u", &in_progress(3), s(1));
        assert_eq!(r.checked("u", false, s(29)), None);
        assert!(matches!(
            r.checked("u", false, s(30)),
            Some(ResizeOutcome::Unverified {
                kubelet_done: false,
                ..
            })
        ));
    }

    /// docs/kubelet-behaviour.md §3: status still in progress while cpu.max is already right.
    #[test]
    fn lagging_status_with_correct_cgroup_is_verified_not_drift() {
        let mut r = ResizeTracker::new(s(30));
        r.patched("u", 3, Direction::Raise, s(0));
        r.kubelet_status("u", &in_progress(3), s(1));
        assert_eq!(r.checked("u", true, s(6)), None);
        assert_eq!(
            r.checked("u", true, s(30)),
            Some(ResizeOutcome::Verified {
                uid: "u".into(),
                generation: 3,
                latency: s(6)
            })
        );
    }

    #[test]
    fn lagging_status_then_done_verifies_with_first_match_latency() {
        let mut r = ResizeTracker::new(s(30));
        r.patched("u", 3, Direction::Raise, s(0));
        r.checked("u", true, s(4));
        r.kubelet_status("u", &done(3), s(9));
        assert!(matches!(
            r.checked("u", true, s(10)),
            Some(ResizeOutcome::Verified { latency, .. }) if latency == s(4)
        ));
    }

    #[test]
    fn newer_patch_replaces_the_one_in_flight() {
        let mut r = ResizeTracker::new(s(30));
        r.patched("u", 3, Direction::Raise, s(0));
        r.patched("u", 4, Direction::Raise, s(10));
        assert!(!r.kubelet_status("u", &done(3), s(11)));
        assert!(r.kubelet_status("u", &done(4), s(12)));
        assert!(matches!(
            r.checked("u", true, s(12)),
            Some(ResizeOutcome::Verified { generation: 4, .. })
        ));
    }

    #[test]
    fn direction_is_kept_while_in_flight() {
        let mut r = ResizeTracker::new(s(30));
        assert_eq!(r.patched("u", 3, Direction::Lower, s(0)), None);
        assert_eq!(r.direction("u"), Some(Direction::Lower));
        assert_eq!(r.uids().collect::<Vec<_>>(), ["u"]);
        assert_eq!(
            r.patched("u", 4, Direction::Raise, s(1)),
            Some(Direction::Lower),
            "the replaced resize ends superseded"
        );
        assert_eq!(r.direction("u"), Some(Direction::Raise));
        assert_eq!(
            r.forget("u"),
            Some(Direction::Raise),
            "it ends with the pod"
        );
        assert_eq!(r.forget("u"), None);
        assert_eq!(r.direction("u"), None);
        assert_eq!(r.uids().count(), 0);
    }

    #[test]
    fn unknown_or_forgotten_pod_gives_nothing() {
        let mut r = ResizeTracker::new(s(30));
        assert_eq!(r.checked("x", true, s(1)), None);
        r.patched("u", 1, Direction::Raise, s(0));
        r.forget("u");
        assert_eq!(r.checked("u", false, s(100)), None);
    }
}
