//! Drift and resize verification as pure state machines, one per pod (the
//! reconciler keeps them in the pod's record, so they go with it). Time and
//! grace are passed in (`now`, a monotonic [`Duration`] since any fixed
//! origin), so tests drive them without clocks.

use foldhash::HashMap;
use std::time::Duration;

use crate::model::{ResizeState, Uid};
use crate::policy::Direction;
use crate::verify::compare::{Mismatch, Target};

/// Default time a mismatch must outlive before it counts as drift, and a
/// resize may take before it counts as unverified.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriftEvent {
    /// A mismatch outlived the grace period (emitted once on entry).
    Drift {
        uid: Uid,
        mismatch: Mismatch,
        /// When the mismatch was first seen.
        since: Duration,
    },
    /// Still drifting, but the found value changed (refresh the Event text;
    /// not a new drift for counters).
    Changed { uid: Uid, mismatch: Mismatch },
    /// The cgroup matches again after a drift.
    Cleared {
        uid: Uid,
        target: Target,
        /// How long it drifted, from first mismatch to the match.
        lasted: Duration,
    },
    /// The pod vanished while drifting: drop its series.
    Forgotten { uid: Uid, target: Target },
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

/// One pod's mismatches, per target (its record's part; time and grace
/// come in). A mismatch becomes drift only once it has lasted `grace`; a
/// match ends it.
#[derive(Debug, Clone, Default)]
pub struct PodDrift {
    targets: HashMap<Target, State>,
}

impl PodDrift {
    /// One check of one target of pod `uid`: `mismatch` is `None` when it
    /// matched.
    pub fn observe(
        &mut self,
        uid: &Uid,
        target: &Target,
        mismatch: Option<&Mismatch>,
        now: Duration,
        grace: Duration,
    ) -> Vec<DriftEvent> {
        let mut out = Vec::new();
        match mismatch {
            None => {
                if let Some(State::Drifting { since, .. }) = self.targets.remove(target) {
                    out.push(DriftEvent::Cleared {
                        uid: uid.clone(),
                        target: target.clone(),
                        lasted: now.saturating_sub(since),
                    });
                }
            }
            Some(m) => {
                let state = self
                    .targets
                    .entry(target.clone())
                    .or_insert(State::Pending { since: now });
                match state {
                    State::Pending { since } if now.saturating_sub(*since) >= grace => {
                        let since = *since;
                        out.push(DriftEvent::Drift {
                            uid: uid.clone(),
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
                                uid: uid.clone(),
                                mismatch: m.clone(),
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// One audit of the whole pod: `mismatches` as [`compare`](super::compare::compare)
    /// returned them. Every tracked target not listed matched.
    pub fn observe_pod(
        &mut self,
        uid: &Uid,
        mismatches: &[Mismatch],
        now: Duration,
        grace: Duration,
    ) -> Vec<DriftEvent> {
        let mut out = Vec::new();
        let matched: Vec<Target> = self
            .targets
            .keys()
            .filter(|k| !mismatches.iter().any(|m| &m.target == *k))
            .cloned()
            .collect();
        for t in &matched {
            out.extend(self.observe(uid, t, None, now, grace));
        }
        for m in mismatches {
            out.extend(self.observe(uid, &m.target, Some(m), now, grace));
        }
        out
    }

    /// The pod no longer runs: drop its state; drifting targets give
    /// `Forgotten`.
    pub fn forget(&mut self, uid: &Uid) -> Vec<DriftEvent> {
        let mut out: Vec<DriftEvent> = std::mem::take(&mut self.targets)
            .into_iter()
            .filter(|(_, s)| matches!(s, State::Drifting { .. }))
            .map(|(target, _)| DriftEvent::Forgotten {
                uid: uid.clone(),
                target,
            })
            .collect();
        out.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        out
    }

    pub fn is_drifting(&self, target: &Target) -> bool {
        matches!(self.targets.get(target), Some(State::Drifting { .. }))
    }

    /// Every drifting target's mismatch.
    pub fn drifting(&self) -> impl Iterator<Item = &Mismatch> {
        self.targets.values().filter_map(|s| match s {
            State::Drifting { mismatch, .. } => Some(mismatch),
            State::Pending { .. } => None,
        })
    }

    /// Whether any target is tracked (pending or drifting).
    pub fn is_tracked(&self) -> bool {
        !self.targets.is_empty()
    }
}

/// How a resize ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResizeOutcome {
    /// The cgroups matched the patched spec. `latency`: patch sent → first
    /// match seen.
    Verified {
        uid: Uid,
        generation: i64,
        latency: Duration,
    },
    /// No match within grace: after the kubelet reported done, or (if it
    /// never did) after the patch was sent.
    Unverified {
        uid: Uid,
        generation: i64,
        kubelet_done: bool,
        waited: Duration,
    },
    /// Another writer changed the pod's limits before this resize showed
    /// (`managedFields`): what `cpu.max` shows from now on is its value,
    /// and matching it would verify someone else's resize as Headroom's.
    Overtaken {
        uid: Uid,
        generation: i64,
        /// The other writer's field manager.
        by: String,
    },
}

/// A patched resize followed until it is verified in the cgroups (its
/// pod's record holds it while in flight).
///
/// Rules: a match after the kubelet reports done verifies. A match seen
/// *before* done (status lagging behind a correct cgroup, docs/kubelet-behaviour.md §3) is
/// remembered: the resize verifies once done arrives, or when the grace
/// runs out with status still lagging — never as a failure. No match within
/// `grace` of done (or of sending, if done never comes) → unverified.
#[derive(Debug, Clone)]
pub struct InflightResize {
    generation: i64,
    direction: Direction,
    sent_at: Duration,
    done_at: Option<Duration>,
    first_match: Option<Duration>,
}

/// Whether the kubelet has finished the resize of `generation`: observed
/// at or past it, and neither pending nor in progress.
pub fn kubelet_done(resize: &ResizeState, generation: i64) -> bool {
    resize.observed_generation.is_some_and(|g| g >= generation)
        && resize.pending.is_none()
        && resize.in_progress.is_none()
}

impl InflightResize {
    /// A resize patch (raising or lowering the limit: `direction`) was
    /// accepted; its response carried `generation`. It replaces an older
    /// one of the same pod in flight (which ends superseded).
    pub fn patched(generation: i64, direction: Direction, sent_at: Duration) -> Self {
        Self {
            generation,
            direction,
            sent_at,
            done_at: None,
            first_match: None,
        }
    }

    /// Feed the pod's resize status (from each watch event). Returns true
    /// when the kubelet is (now) done: time to re-read the cgroups.
    pub fn kubelet_status(&mut self, resize: &ResizeState, now: Duration) -> bool {
        if self.done_at.is_none() && kubelet_done(resize, self.generation) {
            self.done_at = Some(now);
        }
        self.done_at.is_some()
    }

    /// Pod `uid`'s cgroups were compared with its spec at `now`. `Some`
    /// when the resize ended (the caller drops it).
    pub fn checked(
        &mut self,
        uid: &Uid,
        matches: bool,
        now: Duration,
        grace: Duration,
    ) -> Option<ResizeOutcome> {
        if matches && self.first_match.is_none() {
            self.first_match = Some(now);
        }
        let base = self.done_at.unwrap_or(self.sent_at);
        let expired = now.saturating_sub(base) >= grace;
        match (self.first_match, self.done_at.is_some() || expired) {
            // Verified: done and matched, or status lagged past grace but
            // the cgroup was right.
            (Some(m), true) if matches || self.done_at.is_none() => Some(ResizeOutcome::Verified {
                uid: uid.clone(),
                generation: self.generation,
                latency: m.saturating_sub(self.sent_at),
            }),
            _ if expired => Some(ResizeOutcome::Unverified {
                uid: uid.clone(),
                generation: self.generation,
                kubelet_done: self.done_at.is_some(),
                waited: now.saturating_sub(self.sent_at),
            }),
            _ => None,
        }
    }

    /// Generation the patch's response carried.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Which way the resize goes.
    pub fn direction(&self) -> Direction {
        self.direction
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{CpuMax, Driver};
    use crate::verify::compare::Observed;
    use crate::verify::expected::ExpectedMax;

    const G: Duration = Duration::from_secs(30);

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn u() -> Uid {
        "u".into()
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
        let mut t = PodDrift::default();
        let m = mm(Target::Pod, 11_000);
        assert_eq!(
            t.observe_pod(&u(), std::slice::from_ref(&m), s(0), G),
            vec![]
        );
        assert_eq!(
            t.observe_pod(&u(), std::slice::from_ref(&m), s(29), G),
            vec![]
        );
        assert!(!t.is_drifting(&Target::Pod));
    }

    #[test]
    fn mismatch_outliving_grace_is_drift_once() {
        let mut t = PodDrift::default();
        let m = mm(Target::Pod, 11_000);
        t.observe_pod(&u(), std::slice::from_ref(&m), s(0), G);
        let ev = t.observe_pod(&u(), std::slice::from_ref(&m), s(30), G);
        assert_eq!(
            ev,
            vec![DriftEvent::Drift {
                uid: "u".into(),
                mismatch: m.clone(),
                since: s(0)
            }]
        );
        assert!(t.is_drifting(&Target::Pod));
        assert_eq!(
            t.observe_pod(&u(), std::slice::from_ref(&m), s(60), G),
            vec![]
        );
        assert_eq!(t.drifting().count(), 1);
    }

    #[test]
    fn match_within_grace_resets_the_clock() {
        let mut t = PodDrift::default();
        let m = mm(Target::Pod, 11_000);
        t.observe_pod(&u(), std::slice::from_ref(&m), s(0), G);
        assert_eq!(t.observe_pod(&u(), &[], s(20), G), vec![]);
        t.observe_pod(&u(), std::slice::from_ref(&m), s(25), G);
        assert_eq!(
            t.observe_pod(&u(), std::slice::from_ref(&m), s(50), G),
            vec![]
        );
        assert_eq!(
            t.observe_pod(&u(), std::slice::from_ref(&m), s(55), G)
                .len(),
            1
        );
    }

    #[test]
    fn drift_clears_when_the_cgroup_matches_again() {
        let mut t = PodDrift::default();
        let m = mm(Target::Container("c".into()), 20_000);
        t.observe_pod(&u(), std::slice::from_ref(&m), s(0), G);
        t.observe_pod(&u(), std::slice::from_ref(&m), s(30), G);
        let ev = t.observe_pod(&u(), &[], s(45), G);
        assert_eq!(
            ev,
            vec![DriftEvent::Cleared {
                uid: "u".into(),
                target: Target::Container("c".into()),
                lasted: s(45)
            }]
        );
        assert!(!t.is_tracked());
    }

    #[test]
    fn changed_value_while_drifting_is_reported_as_changed() {
        let mut t = PodDrift::default();
        t.observe_pod(&u(), &[mm(Target::Pod, 11_000)], s(0), G);
        t.observe_pod(&u(), &[mm(Target::Pod, 11_000)], s(30), G);
        let ev = t.observe_pod(&u(), &[mm(Target::Pod, 12_000)], s(40), G);
        assert!(matches!(&ev[..], [DriftEvent::Changed { .. }]));
    }

    #[test]
    fn targets_are_tracked_separately() {
        let mut t = PodDrift::default();
        t.observe_pod(&u(), &[mm(Target::Pod, 1)], s(0), G);
        let ev = t.observe_pod(
            &u(),
            &[mm(Target::Pod, 1), mm(Target::Container("c".into()), 2)],
            s(30),
            G,
        );
        assert_eq!(ev.len(), 1);
        assert!(t.is_drifting(&Target::Pod));
        assert!(!t.is_drifting(&Target::Container("c".into())));
    }

    #[test]
    fn vanished_pod_is_forgotten() {
        let (mut t, mut pending) = (PodDrift::default(), PodDrift::default());
        t.observe_pod(&u(), &[mm(Target::Pod, 1)], s(0), G);
        t.observe_pod(&u(), &[mm(Target::Pod, 1)], s(30), G);
        pending.observe_pod(&"v".into(), &[mm(Target::Pod, 1)], s(30), G);
        assert_eq!(
            t.forget(&u()),
            vec![DriftEvent::Forgotten {
                uid: "u".into(),
                target: Target::Pod
            }]
        );
        assert!(!t.is_tracked());
        // A pending (not drifting) pod is dropped silently.
        assert_eq!(pending.forget(&"v".into()), vec![]);
        assert!(!pending.is_tracked());
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
        let mut r = InflightResize::patched(3, Direction::Raise, s(10));
        assert!(!r.kubelet_status(&in_progress(3), s(11)));
        assert!(r.kubelet_status(&done(3), s(12)));
        assert_eq!(
            r.checked(&u(), true, s(13), G),
            Some(ResizeOutcome::Verified {
                uid: "u".into(),
                generation: 3,
                latency: s(3)
            })
        );
    }

    #[test]
    fn mismatch_after_done_within_grace_waits() {
        let mut r = InflightResize::patched(3, Direction::Raise, s(0));
        r.kubelet_status(&done(3), s(5));
        assert_eq!(r.checked(&u(), false, s(6), G), None);
        assert_eq!(r.checked(&u(), false, s(34), G), None);
        assert_eq!(
            r.checked(&u(), false, s(35), G),
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
        let mut r = InflightResize::patched(3, Direction::Raise, s(0));
        r.kubelet_status(&in_progress(3), s(1));
        assert_eq!(r.checked(&u(), false, s(29), G), None);
        assert!(matches!(
            r.checked(&u(), false, s(30), G),
            Some(ResizeOutcome::Unverified {
                kubelet_done: false,
                ..
            })
        ));
    }

    /// docs/kubelet-behaviour.md §3: status still in progress while cpu.max is already right.
    #[test]
    fn lagging_status_with_correct_cgroup_is_verified_not_drift() {
        let mut r = InflightResize::patched(3, Direction::Raise, s(0));
        r.kubelet_status(&in_progress(3), s(1));
        assert_eq!(r.checked(&u(), true, s(6), G), None);
        assert_eq!(
            r.checked(&u(), true, s(30), G),
            Some(ResizeOutcome::Verified {
                uid: "u".into(),
                generation: 3,
                latency: s(6)
            })
        );
    }

    #[test]
    fn lagging_status_then_done_verifies_with_first_match_latency() {
        let mut r = InflightResize::patched(3, Direction::Raise, s(0));
        r.checked(&u(), true, s(4), G);
        r.kubelet_status(&done(3), s(9));
        assert!(matches!(
            r.checked(&u(), true, s(10), G),
            Some(ResizeOutcome::Verified { latency, .. }) if latency == s(4)
        ));
    }
}
