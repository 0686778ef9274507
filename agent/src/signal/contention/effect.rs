//! What a lowering bought: every lowering made for pods owed CPU is a
//! *claim*, checked once the kubelet applied it.
//!
//! A lowering is a bet that the CPU taken from a managed pod goes to the
//! pod that was owed it. The benefit bench showed how often it does not
//! (docs/benefit.md): the CPU went idle and became the managed pod's queue.
//! So each claim follows one owed pod through four stages:
//!
//! 1. **Applying**: the lowering was accepted; the kubelet has not written
//!    it to `cpu.max` yet (2–12 s on the emulated nodes). Nothing more is
//!    taken for this pod meanwhile: a second lowering decided before the
//!    first one could show any effect is a guess on a guess.
//! 2. **Measuring**: applied; the owed pod's usage and wait are read for
//!    [`MEASURE_INTERVALS`] intervals and put against the interval that owed
//!    it. It *helped* when the pod got at least [`need_m`] more CPU or waited
//!    at least that much less.
//! 3. **Helped**: the lowered pods are held at the limits the lowering set
//!    (no raise back at the cooldown) while the owed pod still runs near its
//!    demand (usage at least its usage before plus half its gain); after
//!    [`QUIET_INTERVALS`] intervals below that, the claim ends.
//! 4. **No effect**: the lowering is undone at once (the hold ends; the
//!    caller waives the raise cooldown) and the pod is owed nothing more
//!    until it has not been displaced for the quiet window: it was not the
//!    managed pods' limits that kept it waiting.
//!
//! Pure: the caller reads the samples and carries out the verdicts.

use foldhash::{HashMap, HashMapExt};
use std::time::Duration;

use super::{Contention, Displaced, MIN_DISPLACED_M};
use crate::model::{CgroupPodId, Millis, Uid};

/// Intervals measured after the kubelet applied a lowering. Two, because
/// one interval on the emulated nodes swings by tens of millicores.
pub const MEASURE_INTERVALS: usize = 2;

/// Intervals in a row the owed pod must run below its demand before a
/// lowering that helped stops holding the CPU it bought for it.
pub const QUIET_INTERVALS: u32 = 3;

/// How long a lowering may take to show in `cpu.max` before its claim is
/// dropped unjudged: twice the default drift grace, as the emulated
/// kubelet took tens of seconds under load.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// One interval of the owed pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub usage_m: Millis,
    /// CPU it waited for while others held it ([`Displaced::displaced_m`]);
    /// 0 when it was not displaced past [`MIN_DISPLACED_M`].
    pub displaced_m: Millis,
}

/// One managed pod a lowering lowered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lowered {
    pub uid: Uid,
    pub from_m: Millis,
    pub to_m: Millis,
}

/// What the check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Helped,
    NoEffect,
    /// Dropped unjudged: the lowering never showed in `cpu.max` within
    /// [`APPLY_TIMEOUT`], or the owed pod's samples were unknown.
    Unjudged,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Helped => "helped",
            Effect::NoEffect => "no_effect",
            Effect::Unjudged => "unjudged",
        }
    }
}

/// A claim judged this interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// The pod the lowering was for, by its cgroup (what the wait was read from).
    pub owed: CgroupPodId,
    pub effect: Effect,
    pub owed_m: Millis,
    pub before: Sample,
    /// Mean of the measured intervals (`None` when unjudged).
    pub after: Option<Sample>,
    pub lowered: Vec<Lowered>,
}

impl Judged {
    /// Usage gained by the owed pod, millicores (may be negative).
    pub fn gained_m(&self) -> i64 {
        self.after
            .map_or(0, |a| a.usage_m as i64 - self.before.usage_m as i64)
    }

    /// Fall of its wait, millicores (may be negative).
    pub fn wait_fell_m(&self) -> i64 {
        self.after
            .map_or(0, |a| self.before.displaced_m as i64 - a.displaced_m as i64)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Stage {
    Applying { pending: Vec<Uid> },
    Measuring { samples: Vec<Sample> },
    Helped { keep_above_m: Millis, below: u32 },
    NoEffect { last_displaced: Duration },
}

#[derive(Debug, Clone, PartialEq)]
struct Claim {
    owed_m: Millis,
    before: Sample,
    lowered: Vec<Lowered>,
    made_at: Duration,
    stage: Stage,
}

/// The least gain (or fall in wait) that counts as help for a pod owed
/// `owed_m`: a quarter of it, and at least [`MIN_DISPLACED_M`].
pub fn need_m(owed_m: Millis) -> Millis {
    (owed_m / 4).max(MIN_DISPLACED_M)
}

/// Every open claim, keyed by the owed pod's cgroup id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Claims {
    by_owed: HashMap<CgroupPodId, Claim>,
}

impl Claims {
    /// Whether a claim for this pod is open (in any stage).
    pub fn has(&self, owed: &CgroupPodId) -> bool {
        self.by_owed.contains_key(owed)
    }

    /// The owed pods whose usage the caller must read every interval while
    /// their claim is measured or held.
    pub fn watched(&self) -> impl Iterator<Item = &CgroupPodId> {
        self.by_owed.keys()
    }

    /// Whether a new lowering may be made for this owed pod: no claim for
    /// it, or one that helped and the pod still waits at least twice its
    /// threshold ([`Displaced::strong`]). A pod may still be short after a
    /// first step, but the marginal rest of its wait is as often latency
    /// beside the CPU just freed: in the benefit bench (2026-12-06) every
    /// follow-up lowering for a 50–60m wait after one that helped (370m →
    /// 310m, 440m → 410m) bought nothing and was undone.
    pub fn may_lower_for(&self, owed: &Displaced) -> bool {
        self.by_owed
            .get(&owed.id)
            .is_none_or(|c| matches!(c.stage, Stage::Helped { .. }) && owed.strong)
    }

    /// What is owed this interval to pods a new lowering may be made for
    /// ([`Self::may_lower_for`]), and how many they are.
    pub fn fresh(&self, c: &Contention) -> (Millis, usize) {
        c.owed()
            .filter(|d| self.may_lower_for(d))
            .fold((0, 0), |(m, n), d| (m + d.deficit_m, n + 1))
    }

    /// The highest limit each managed pod is held to by a lowering still
    /// applying, measured, or found to help (none once found useless).
    pub fn holds(&self) -> HashMap<&Uid, Millis> {
        let mut out: HashMap<&Uid, Millis> = HashMap::new();
        for c in self.by_owed.values() {
            if matches!(c.stage, Stage::NoEffect { .. }) {
                continue;
            }
            for l in &c.lowered {
                let e = out.entry(&l.uid).or_insert(l.to_m);
                *e = (*e).min(l.to_m);
            }
        }
        out
    }

    /// Opens a claim for each pod owed this interval that a lowering may be
    /// made for ([`Self::may_lower_for`]), when this interval's patches
    /// lowered managed pods (`lowered`, accepted by the apiserver). Each
    /// such pod is what the lowering was for; a claim that helped is
    /// replaced by the new one (which holds the pods lower still).
    pub fn open<'a>(
        &mut self,
        owed: impl IntoIterator<Item = &'a Displaced>,
        lowered: &[Lowered],
        now: Duration,
    ) {
        if lowered.is_empty() {
            return;
        }
        for d in owed {
            if d.deficit_m == 0 || !self.may_lower_for(d) {
                continue;
            }
            self.by_owed.insert(
                d.id.clone(),
                Claim {
                    owed_m: d.deficit_m,
                    before: Sample {
                        usage_m: d.usage_m,
                        displaced_m: d.displaced_m,
                    },
                    lowered: lowered.to_vec(),
                    made_at: now,
                    stage: Stage::Applying {
                        pending: lowered.iter().map(|l| l.uid.clone()).collect(),
                    },
                },
            );
        }
    }

    /// A lowered pod's resize showed in its `cpu.max` (`verified`), or was
    /// given up on (not verified): every claim waiting for it learns it.
    /// A lowering that never applied bought nothing anyone can measure.
    pub fn resize_done(&mut self, managed_uid: &Uid, verified: bool) -> Vec<Judged> {
        let mut judged = Vec::new();
        self.by_owed.retain(|owed, c| {
            let Stage::Applying { pending } = &mut c.stage else {
                return true;
            };
            if !pending.iter().any(|u| u == managed_uid) {
                return true;
            }
            if !verified {
                judged.push(c.judged(owed, Effect::Unjudged, None));
                return false;
            }
            pending.retain(|u| u != managed_uid);
            if pending.is_empty() {
                c.stage = Stage::Measuring {
                    samples: Vec::new(),
                };
            }
            true
        });
        judged
    }

    /// One interval: each open claim takes its owed pod's sample (`None`
    /// when unknown this interval) and the verdicts due are returned.
    /// `gone`: whether the owed pod left the node. `quiet`: how long a pod
    /// found not helped must go undisplaced before it can be owed again.
    pub fn step(
        &mut self,
        now: Duration,
        sample: impl Fn(&CgroupPodId) -> Option<Sample>,
        gone: impl Fn(&CgroupPodId) -> bool,
        quiet: Duration,
    ) -> Vec<Judged> {
        let mut judged = Vec::new();
        self.by_owed.retain(|owed, c| {
            if gone(owed) {
                return false;
            }
            let s = sample(owed);
            match &mut c.stage {
                Stage::Applying { .. } => {
                    if now.saturating_sub(c.made_at) < APPLY_TIMEOUT {
                        return true;
                    }
                    judged.push(c.judged(owed, Effect::Unjudged, None));
                    false
                }
                Stage::Measuring { samples } => {
                    samples.extend(s);
                    if samples.len() < MEASURE_INTERVALS {
                        // An owed pod whose usage stays unknown is not
                        // measured forever.
                        if now.saturating_sub(c.made_at) < 2 * APPLY_TIMEOUT {
                            return true;
                        }
                        judged.push(c.judged(owed, Effect::Unjudged, None));
                        return false;
                    }
                    let after = mean(samples);
                    let need = need_m(c.owed_m) as i64;
                    let gained = after.usage_m as i64 - c.before.usage_m as i64;
                    let fell = c.before.displaced_m as i64 - after.displaced_m as i64;
                    if gained >= need || fell >= need {
                        let keep = c.before.usage_m + (gained.max(0) as Millis) / 2;
                        judged.push(c.judged(owed, Effect::Helped, Some(after)));
                        c.stage = Stage::Helped {
                            keep_above_m: keep,
                            below: 0,
                        };
                    } else {
                        judged.push(c.judged(owed, Effect::NoEffect, Some(after)));
                        c.stage = Stage::NoEffect {
                            last_displaced: now,
                        };
                    }
                    true
                }
                Stage::Helped {
                    keep_above_m,
                    below,
                } => {
                    match s {
                        Some(s) if s.usage_m >= *keep_above_m => *below = 0,
                        _ => *below += 1,
                    }
                    *below < QUIET_INTERVALS
                }
                Stage::NoEffect { last_displaced } => {
                    if s.is_some_and(|s| s.displaced_m >= MIN_DISPLACED_M) {
                        *last_displaced = now;
                    }
                    now.saturating_sub(*last_displaced) < quiet
                }
            }
        });
        judged
    }
}

impl Claim {
    fn judged(&self, owed: &CgroupPodId, effect: Effect, after: Option<Sample>) -> Judged {
        Judged {
            owed: owed.clone(),
            effect,
            owed_m: self.owed_m,
            before: self.before,
            after,
            lowered: self.lowered.clone(),
        }
    }
}

fn mean(samples: &[Sample]) -> Sample {
    let n = samples.len().max(1) as Millis;
    Sample {
        usage_m: samples.iter().map(|s| s.usage_m).sum::<Millis>() / n,
        displaced_m: samples.iter().map(|s| s.displaced_m).sum::<Millis>() / n,
    }
}

#[cfg(test)]
mod tests;
