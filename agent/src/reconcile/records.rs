//! What the reconciler remembers between ticks: one record per pod, so
//! forgetting a pod is one removal, and the node-wide 403 pause.
//! Pure data with explicit time, so every retry/backoff rule is unit-tested.

use foldhash::HashMap;
use std::time::Duration;

use crate::kube::events::SentEvents;
use crate::model::{DeclaredLimits, Millis, Uid};
use crate::policy::{Direction, LastPatch, PatchPlan, PolicyConfig};
use crate::verify::{InflightResize, PodDrift};

/// Per-pod retry state after a failed patch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub attempts: u32,
    pub until: Duration,
}

/// How long a pod waits after a refusal that taught nothing (no floor):
/// retrying the same value would be refused again.
pub const REFUSAL_HOLD: Duration = Duration::from_secs(300);
const BASE: Duration = Duration::from_secs(1);
const CAP: Duration = Duration::from_secs(120);
/// A 403 stops all patching for this long (then one try, doubling).
const FORBIDDEN_BASE: Duration = Duration::from_secs(30);
const FORBIDDEN_CAP: Duration = Duration::from_secs(600);

/// Exponential backoff with full jitter: a random delay in [base, cap·2^n].
pub fn backoff(attempt: u32, base: Duration, cap: Duration, rand01: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16));
    let hi = exp.min(cap).max(base);
    base + (hi - base).mul_f64(rand01.clamp(0.0, 1.0))
}

/// xorshift64: the jitter of [`backoff`], no crate needed. Deterministic
/// for a seed, so a test can replay it.
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// A zero seed would stay zero; it is replaced.
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next value in [0, 1).
    pub fn next01(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Everything the agent remembers about one pod between ticks. Adding
/// per-pod state here is all it takes for it to be forgotten with the pod.
/// Its fields are private: each stage reads and changes them through the
/// operations below, named for what the stage does.
#[derive(Debug, Default)]
pub struct PodRecord {
    /// Last accepted patch (cooldown for raises).
    last_patch: Option<LastPatch>,
    /// Floor learned from refusals.
    learned_floor_m: Option<Millis>,
    /// Retry state after a failed patch.
    backoff: Option<Backoff>,
    /// Last dry-run target logged (log changes only).
    dry_run_logged: Option<Millis>,
    /// Limits the pod's workload declares: seen while they were not yet
    /// Headroom's, or read from the owner's pod template.
    declared: Option<DeclaredLimits>,
    /// Headroom leaves the pod's limits to another writer (reason
    /// `other_writer`) as of the last round: its Event is sent once, when
    /// the pause begins.
    yielded: bool,
    /// The resize in flight, until it shows in `cpu.max` (or not).
    resize: Option<InflightResize>,
    /// Mismatches of its cgroups with its spec, per cgroup.
    drift: PodDrift,
    /// When each kind of Event was last sent for it (rate limit).
    events: SentEvents,
}

impl PodRecord {
    /// The last patch the apiserver accepted.
    pub fn last_patch(&self) -> Option<&LastPatch> {
        self.last_patch.as_ref()
    }

    /// A patch of `plan` the apiserver accepted at `now_s`: the record of
    /// it replaces the one before (from which it learns flaps).
    pub fn patched(&mut self, plan: &PatchPlan, now_s: f64, cfg: &PolicyConfig) {
        self.last_patch = Some(LastPatch::after(plan, now_s, self.last_patch.as_ref(), cfg));
    }

    /// A lowering found to buy nothing: it may be raised back at once.
    pub fn waive_raise_cooldown(&mut self, now_s: f64, cfg: &PolicyConfig) {
        if let Some(l) = self.last_patch.as_mut() {
            l.waive_raise_cooldown(now_s, cfg);
        }
    }

    /// The floor learned from refusals.
    pub fn learned_floor_m(&self) -> Option<Millis> {
        self.learned_floor_m
    }

    /// The limits the workload declares, as known.
    pub fn declared(&self) -> Option<&DeclaredLimits> {
        self.declared.as_ref()
    }

    /// Learns the limits the workload declares.
    pub fn declare(&mut self, d: DeclaredLimits) {
        self.declared = Some(d);
    }

    /// Whether the pod yielded to another writer as of the last round.
    pub fn yielded(&self) -> bool {
        self.yielded
    }

    /// Sets whether the pod yields to another writer; whether it did before.
    pub fn set_yielded(&mut self, yielded: bool) -> bool {
        std::mem::replace(&mut self.yielded, yielded)
    }

    /// Remembers the dry-run target logged; the one logged before.
    pub fn dry_run_logged(&mut self, target_m: Millis) -> Option<Millis> {
        self.dry_run_logged.replace(target_m)
    }

    /// The resize in flight.
    pub fn resize(&self) -> Option<&InflightResize> {
        self.resize.as_ref()
    }

    pub fn resize_mut(&mut self) -> Option<&mut InflightResize> {
        self.resize.as_mut()
    }

    /// The resize in flight ended (verified, or given up on).
    pub fn resize_ended(&mut self) -> Option<InflightResize> {
        self.resize.take()
    }

    /// Its cgroups' mismatches with its spec.
    pub fn drift_mut(&mut self) -> &mut PodDrift {
        &mut self.drift
    }

    /// When each kind of Event was last sent for it.
    pub fn events_mut(&mut self) -> &mut SentEvents {
        &mut self.events
    }
}

/// What the reconciler remembers: one [`PodRecord`] per pod, and the
/// node-wide stop after a 403.
#[derive(Debug, Default)]
pub struct Records {
    pods: HashMap<Uid, PodRecord>,
    /// Node-wide stop after a 403 (RBAC or admission): a configuration alarm.
    pub forbidden: Option<Backoff>,
}

impl Records {
    /// The record of a pod, if anything is remembered about it.
    pub fn get(&self, uid: &Uid) -> Option<&PodRecord> {
        self.pods.get(uid)
    }

    /// The record of a pod, made empty if there was none.
    pub fn entry(&mut self, uid: &Uid) -> &mut PodRecord {
        self.pods.entry(uid.clone()).or_default()
    }

    pub fn get_mut(&mut self, uid: &Uid) -> Option<&mut PodRecord> {
        self.pods.get_mut(uid)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Uid, &mut PodRecord)> {
        self.pods.iter_mut()
    }

    /// Every pod something is remembered about.
    pub fn uids(&self) -> impl Iterator<Item = &Uid> {
        self.pods.keys()
    }

    /// Drops everything about a pod that is gone; what was remembered.
    pub fn forget(&mut self, uid: &Uid) -> Option<PodRecord> {
        self.pods.remove(uid)
    }

    /// Follows an accepted resize until it shows in `cpu.max`. A newer
    /// patch of the same pod replaces the one in flight: its direction is
    /// returned (it ends superseded).
    pub fn track(
        &mut self,
        uid: &Uid,
        generation: i64,
        direction: Direction,
        sent_at: Duration,
    ) -> Option<Direction> {
        self.entry(uid)
            .resize
            .replace(InflightResize::patched(generation, direction, sent_at))
            .map(|r| r.direction())
    }

    /// Resizes in flight, over all pods.
    pub fn resizes_in_flight(&self) -> usize {
        self.pods.values().filter(|p| p.resize.is_some()).count()
    }

    pub fn may_patch(&self, uid: &Uid, now: Duration) -> bool {
        self.forbidden.is_none_or(|f| now >= f.until)
            && self
                .get(uid)
                .and_then(|p| p.backoff)
                .is_none_or(|b| now >= b.until)
    }

    pub fn learn_floor(&mut self, uid: &Uid, floor_m: Millis) {
        let f = &mut self.entry(uid).learned_floor_m;
        *f = Some(f.unwrap_or(0).max(floor_m));
    }

    /// A transient failure: exponential backoff with jitter (`rand01` ∈ [0,1]).
    pub fn transient(&mut self, uid: &Uid, now: Duration, rand01: f64) -> Duration {
        let b = self.entry(uid).backoff.get_or_insert(Backoff {
            attempts: 0,
            until: now,
        });
        let d = backoff(b.attempts, BASE, CAP, rand01);
        b.attempts = b.attempts.saturating_add(1);
        b.until = now + d;
        d
    }

    /// A refusal without a learned floor: hold the pod for [`REFUSAL_HOLD`].
    pub fn refused(&mut self, uid: &Uid, now: Duration) {
        let b = self.entry(uid).backoff.get_or_insert(Backoff {
            attempts: 0,
            until: now,
        });
        b.attempts = b.attempts.saturating_add(1);
        b.until = now + REFUSAL_HOLD;
    }

    pub fn succeeded(&mut self, uid: &Uid) {
        if let Some(p) = self.get_mut(uid) {
            p.backoff = None;
        }
        self.forbidden = None;
    }

    /// A 403: stop patching node-wide, doubling the pause each time.
    pub fn forbidden(&mut self, now: Duration) -> Duration {
        let attempts = self.forbidden.map_or(0, |f| f.attempts.saturating_add(1));
        let d = FORBIDDEN_BASE
            .saturating_mul(1 << attempts.min(10))
            .min(FORBIDDEN_CAP);
        self.forbidden = Some(Backoff {
            attempts,
            until: now + d,
        });
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ResizeState;
    use crate::verify::ResizeOutcome;

    fn done(generation: i64) -> ResizeState {
        ResizeState {
            observed_generation: Some(generation),
            ..Default::default()
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn backoff_stays_within_bounds() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(60);
        for attempt in 0..40 {
            for r in [0.0, 0.5, 1.0] {
                let d = backoff(attempt, base, cap, r);
                assert!(d >= base && d <= cap, "{attempt} {r} {d:?}");
            }
        }
        assert!(backoff(3, base, cap, 1.0) > backoff(1, base, cap, 1.0));
    }

    #[test]
    fn jitter_is_in_the_unit_interval_and_replays_from_its_seed() {
        let mut a = Jitter::new(7);
        let mut b = Jitter::new(7);
        let xs: Vec<f64> = (0..1000).map(|_| a.next01()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        assert!(xs.iter().any(|x| *x > 0.5) && xs.iter().any(|x| *x < 0.5));
        assert_eq!(xs, (0..1000).map(|_| b.next01()).collect::<Vec<_>>());
        assert!(Jitter::new(0).next01() > 0.0, "a zero seed is replaced");
    }

    #[test]
    fn transient_failures_back_off_and_grow() {
        let mut m = Records::default();
        let d1 = m.transient(&"a".into(), S(10), 1.0);
        assert!(!m.may_patch(&Uid::from("a"), S(10)));
        assert!(m.may_patch(&Uid::from("a"), S(10) + d1));
        let d2 = m.transient(&"a".into(), S(20), 1.0);
        assert!(d2 > d1);
        assert!(
            m.may_patch(&Uid::from("b"), S(10)),
            "other pods are not held"
        );
        m.succeeded(&Uid::from("a"));
        assert!(m.may_patch(&Uid::from("a"), S(20)));
    }

    #[test]
    fn refusal_holds_the_pod() {
        let mut m = Records::default();
        m.refused(&"a".into(), S(0));
        assert!(!m.may_patch(&Uid::from("a"), S(299)));
        assert!(m.may_patch(&Uid::from("a"), S(300)));
    }

    #[test]
    fn forbidden_stops_every_pod_and_doubles() {
        let mut m = Records::default();
        let d1 = m.forbidden(S(0));
        assert!(!m.may_patch(&Uid::from("x"), S(1)));
        assert!(m.may_patch(&Uid::from("x"), d1));
        let d2 = m.forbidden(d1);
        assert_eq!(d2, d1 * 2);
        let mut last = d2;
        for _ in 0..20 {
            last = m.forbidden(S(0));
        }
        assert_eq!(last, FORBIDDEN_CAP);
    }

    #[test]
    fn every_remembered_pod_is_listed_and_forgotten() {
        let mut m = Records::default();
        m.learn_floor(&"floor".into(), 400);
        m.transient(&"backoff".into(), S(0), 0.5);
        // Dry-run mode remembers what it logged and nothing else.
        m.entry(&"dry".into()).dry_run_logged = Some(200);
        m.entry(&"declared".into()).declared = Some(DeclaredLimits::default());
        m.entry(&"yielded".into()).yielded = true;
        let mut uids: Vec<&str> = m.uids().map(Uid::as_str).collect();
        uids.sort_unstable();
        assert_eq!(uids, ["backoff", "declared", "dry", "floor", "yielded"]);
        for u in ["backoff", "declared", "dry", "floor", "yielded"] {
            m.forget(&Uid::from(u));
        }
        assert_eq!(m.uids().count(), 0);
    }

    #[test]
    fn learned_floors_only_rise_and_are_forgotten() {
        let mut m = Records::default();
        m.learn_floor(&"a".into(), 400);
        m.learn_floor(&"a".into(), 300);
        assert_eq!(m.get(&Uid::from("a")).unwrap().learned_floor_m, Some(400));
        m.forget(&Uid::from("a"));
        assert!(m.get(&Uid::from("a")).is_none());
    }

    #[test]
    fn newer_patch_replaces_the_one_in_flight() {
        let mut m = Records::default();
        let u: Uid = "u".into();
        m.track(&u, 3, Direction::Raise, S(0));
        m.track(&u, 4, Direction::Raise, S(10));
        let r = m.get_mut(&Uid::from("u")).unwrap().resize.as_mut().unwrap();
        assert!(!r.kubelet_status(&done(3), S(11)));
        assert!(r.kubelet_status(&done(4), S(12)));
        assert!(matches!(
            r.checked(&u, true, S(12), S(30)),
            Some(ResizeOutcome::Verified { generation: 4, .. })
        ));
    }

    #[test]
    fn direction_is_kept_while_in_flight() {
        let mut m = Records::default();
        let u: Uid = "u".into();
        let direction = |m: &Records| {
            m.get(&Uid::from("u"))?
                .resize
                .as_ref()
                .map(InflightResize::direction)
        };
        assert_eq!(m.track(&u, 3, Direction::Lower, S(0)), None);
        assert_eq!(direction(&m), Some(Direction::Lower));
        assert_eq!(m.resizes_in_flight(), 1);
        assert_eq!(
            m.track(&u, 4, Direction::Raise, S(1)),
            Some(Direction::Lower),
            "the replaced resize ends superseded"
        );
        assert_eq!(direction(&m), Some(Direction::Raise));
        let gone = m.forget(&Uid::from("u")).and_then(|r| r.resize);
        assert_eq!(
            gone.map(|r| r.direction()),
            Some(Direction::Raise),
            "it ends with the pod"
        );
        assert!(m.forget(&Uid::from("u")).is_none());
        assert_eq!(direction(&m), None);
        assert_eq!(m.resizes_in_flight(), 0);
    }

    #[test]
    fn unknown_or_forgotten_pod_gives_nothing() {
        let mut m = Records::default();
        assert!(m.get(&Uid::from("x")).is_none());
        m.track(&"u".into(), 1, Direction::Raise, S(0));
        m.forget(&Uid::from("u"));
        assert!(m.get(&Uid::from("u")).is_none(), "nothing left to verify");
        assert_eq!(m.resizes_in_flight(), 0);
    }
}
