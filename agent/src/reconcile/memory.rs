//! What the reconciler remembers between ticks, per pod and node-wide.
//! Pure data with explicit time, so every retry/backoff rule is unit-tested.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::model::{DeclaredLimits, Millis};
use crate::policy::PodMemory;

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

#[derive(Debug, Default)]
pub struct Memory {
    /// Last accepted patch per uid (cooldown for raises).
    pub patches: HashMap<String, PodMemory>,
    /// Floors learned from refusals, per uid.
    pub floors: HashMap<String, Millis>,
    pub backoff: HashMap<String, Backoff>,
    /// Node-wide stop after a 403 (RBAC or admission): a configuration alarm.
    pub forbidden: Option<Backoff>,
    /// Last dry-run target logged per uid (log changes only).
    pub dry_run_logged: HashMap<String, Millis>,
    /// Limits each pod's workload declares: seen while they were not yet
    /// Headroom's, or read from the owner's pod template.
    pub declared: HashMap<String, DeclaredLimits>,
    /// Pods whose limits Headroom leaves to another writer (reason
    /// `other_writer`) as of the last round: their Event is sent once, when
    /// the pause begins.
    pub yielded: HashSet<String>,
}

impl Memory {
    pub fn may_patch(&self, uid: &str, now: Duration) -> bool {
        self.forbidden.is_none_or(|f| now >= f.until)
            && self.backoff.get(uid).is_none_or(|b| now >= b.until)
    }

    pub fn learn_floor(&mut self, uid: &str, floor_m: Millis) {
        let f = self.floors.entry(uid.to_string()).or_insert(0);
        *f = (*f).max(floor_m);
    }

    /// A transient failure: exponential backoff with jitter (`rand01` ∈ [0,1]).
    pub fn transient(&mut self, uid: &str, now: Duration, rand01: f64) -> Duration {
        let b = self.backoff.entry(uid.to_string()).or_insert(Backoff {
            attempts: 0,
            until: now,
        });
        let d = backoff(b.attempts, BASE, CAP, rand01);
        b.attempts = b.attempts.saturating_add(1);
        b.until = now + d;
        d
    }

    /// A refusal without a learned floor: hold the pod for [`REFUSAL_HOLD`].
    pub fn refused(&mut self, uid: &str, now: Duration) {
        let b = self.backoff.entry(uid.to_string()).or_insert(Backoff {
            attempts: 0,
            until: now,
        });
        b.attempts = b.attempts.saturating_add(1);
        b.until = now + REFUSAL_HOLD;
    }

    pub fn succeeded(&mut self, uid: &str) {
        self.backoff.remove(uid);
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

    /// Every pod (uid) something is remembered about, from each per-pod map
    /// (a uid may come more than once).
    pub fn uids(&self) -> impl Iterator<Item = &String> {
        self.patches
            .keys()
            .chain(self.floors.keys())
            .chain(self.backoff.keys())
            .chain(self.dry_run_logged.keys())
            .chain(self.declared.keys())
            .chain(self.yielded.iter())
    }

    /// Drops everything about a pod that is gone.
    pub fn forget(&mut self, uid: &str) {
        self.patches.remove(uid);
        self.floors.remove(uid);
        self.backoff.remove(uid);
        self.dry_run_logged.remove(uid);
        self.declared.remove(uid);
        self.yielded.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut m = Memory::default();
        let d1 = m.transient("a", S(10), 1.0);
        assert!(!m.may_patch("a", S(10)));
        assert!(m.may_patch("a", S(10) + d1));
        let d2 = m.transient("a", S(20), 1.0);
        assert!(d2 > d1);
        assert!(m.may_patch("b", S(10)), "other pods are not held");
        m.succeeded("a");
        assert!(m.may_patch("a", S(20)));
    }

    #[test]
    fn refusal_holds_the_pod() {
        let mut m = Memory::default();
        m.refused("a", S(0));
        assert!(!m.may_patch("a", S(299)));
        assert!(m.may_patch("a", S(300)));
    }

    #[test]
    fn forbidden_stops_every_pod_and_doubles() {
        let mut m = Memory::default();
        let d1 = m.forbidden(S(0));
        assert!(!m.may_patch("x", S(1)));
        assert!(m.may_patch("x", d1));
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
        let mut m = Memory::default();
        m.learn_floor("floor", 400);
        m.transient("backoff", S(0), 0.5);
        // Dry-run mode remembers what it logged and nothing else.
        m.dry_run_logged.insert("dry".into(), 200);
        m.declared
            .insert("declared".into(), DeclaredLimits::default());
        m.yielded.insert("yielded".into());
        let mut uids: Vec<&str> = m.uids().map(String::as_str).collect();
        uids.sort_unstable();
        assert_eq!(uids, ["backoff", "declared", "dry", "floor", "yielded"]);
        for u in ["backoff", "declared", "dry", "floor", "yielded"] {
            m.forget(u);
        }
        assert_eq!(m.uids().count(), 0);
    }

    #[test]
    fn learned_floors_only_rise_and_are_forgotten() {
        let mut m = Memory::default();
        m.learn_floor("a", 400);
        m.learn_floor("a", 300);
        assert_eq!(m.floors["a"], 400);
        m.forget("a");
        assert!(!m.floors.contains_key("a"));
    }
}
