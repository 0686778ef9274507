//! What a lowering bought: every lowering made for pods owed CPU is a
//! *claim*, checked once the kubelet applied it.
//!
//! A lowering is a bet that the CPU taken from a managed pod goes to the
//! pod that was owed it. The benefit bench showed how often it does not
//! (docs/benefit.md): the CPU went idle and became the managed pod's queue,
//! or the owed pod's own need ended just then and its wait went with it.
//! So each claim follows one owed pod through its stages:
//!
//! 1. **Applying**: the lowering was accepted; the kubelet has not written
//!    it to `cpu.max` yet (2–12 s on the emulated nodes). Nothing more is
//!    taken for this pod meanwhile: a second lowering decided before the
//!    first one could show any effect is a guess on a guess. The owed pod
//!    is read every interval meanwhile (its pressure too, whatever the
//!    gate): these intervals are the *before* window, beside the one that
//!    owed it and the one before that.
//! 2. **Measuring**: applied; the owed pod is read for as many intervals as
//!    the before window holds (at least [`MIN_WINDOW`], at most
//!    [`WINDOW`]): equal windows, of intervals actually read ([`judge`]).
//! 3. **Helped**: the lowered pods are held at the limits the lowering set
//!    (no raise back at the cooldown) while the owed pod still runs near
//!    its demand, within its request, and the node has no idle CPU the
//!    size of what the hold took; [`QUIET_INTERVALS`] intervals otherwise,
//!    or [`HOLD_MAX`], end it.
//! 4. **Blocked** (the lowering bought nothing, or could not be judged):
//!    undone at once when it bought nothing (the hold ends; the caller
//!    waives the raise cooldown), and the pod is owed nothing more until it
//!    has gone undisplaced for the quiet window *and* the block, which
//!    doubles with each lowering in a row that bought it nothing
//!    ([`block_for`]): a neighbour whose need comes and goes is not lowered
//!    for and undone every few seconds.
//!
//! A claim whose owed pod changed its own need meanwhile (its usage fell:
//! it stopped asking; or rose beyond what it waited for: it asked for more)
//! ends *need changed*: nothing was learned, nothing is held or blocked.
//!
//! Pure: the caller reads the samples and carries out the verdicts.

use foldhash::{HashMap, HashMapExt};
use std::time::Duration;

use super::{Displaced, MIN_DISPLACED_M};
use crate::model::{CgroupPodId, Millis, Uid};

/// Most intervals in the before and the after window.
pub const WINDOW: usize = 3;

/// Fewest intervals in the after window: one interval on the emulated
/// nodes swings by tens of millicores.
pub const MIN_WINDOW: usize = 2;

/// Intervals in a row the owed pod must run below its demand (or above
/// its request, or beside idle CPU) before a lowering that helped stops
/// holding the CPU it bought for it.
pub const QUIET_INTERVALS: u32 = 3;

/// The longest a lowering that helped holds, whatever the owed pod does:
/// then it is owed afresh, or not, from what it waits for then.
pub const HOLD_MAX: Duration = Duration::from_secs(300);

/// How long a pod is owed nothing after a lowering for it bought nothing
/// (the first time; doubled each time in a row, at most [`BLOCK_MAX`]).
pub const BLOCK_BASE: Duration = Duration::from_secs(30);

/// The longest block.
pub const BLOCK_MAX: Duration = Duration::from_secs(480);

/// How long a lowering may take to show in `cpu.max` before its claim is
/// dropped unjudged: twice the default drift grace, as the emulated
/// kubelet took tens of seconds under load.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(60);

/// One interval of the owed pod, read: its usage and pressure compared
/// between two snapshots (an interval not read is no sample at all).
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
    /// The owed pod's own need changed across the windows: its usage fell
    /// (it stopped asking) or rose beyond what it waited for (it asked for
    /// more). What the lowering did cannot be told from that.
    NeedChanged,
    /// Dropped unjudged: the lowering never showed in `cpu.max` within
    /// [`APPLY_TIMEOUT`], a pod it lowered left, or the owed pod went
    /// unread.
    Unjudged,
}

impl Effect {
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Helped => "helped",
            Effect::NoEffect => "no_effect",
            Effect::NeedChanged => "need_changed",
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
    /// Mean of the before window.
    pub before: Sample,
    /// Mean of the after window (`None` when unjudged).
    pub after: Option<Sample>,
    /// Intervals in each window.
    pub window: usize,
    /// The least change that counted as help: [`need_m`], or the spread
    /// of the before window where that was larger.
    pub bar_m: Millis,
    /// Lowerings in a row for this owed pod that bought nothing, this one
    /// included (0 unless no effect).
    pub strikes: u32,
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
    Applying {
        pending: Vec<Uid>,
    },
    Measuring {
        after: Vec<Sample>,
    },
    Helped {
        keep_above_m: Millis,
        below: u32,
        since: Duration,
        /// A follow-up lowering for it bought nothing: no more follow-ups
        /// while this claim holds.
        no_follow_up: bool,
    },
    /// Owed nothing until undisplaced since `last_displaced` for the quiet
    /// window, and not before `until`.
    Blocked {
        last_displaced: Duration,
        until: Duration,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct Claim {
    owed_m: Millis,
    /// The owed pod's request when the claim opened.
    request_m: Millis,
    /// The before window: the newest [`WINDOW`] intervals read before the
    /// lowering showed in `cpu.max`.
    before: Vec<Sample>,
    lowered: Vec<Lowered>,
    made_at: Duration,
    stage: Stage,
    /// The claim that helped this pod before this one, a follow-up
    /// lowering, replaced: it comes back, holds and all, when the
    /// follow-up bought nothing or could not be judged.
    prior: Option<Box<Claim>>,
}

/// The least gain (or fall in wait) that counts as help for a pod owed
/// `owed_m`: a quarter of it, and at least [`MIN_DISPLACED_M`].
pub fn need_m(owed_m: Millis) -> Millis {
    (owed_m / 4).max(MIN_DISPLACED_M)
}

/// How long a pod is owed nothing after `strikes` lowerings in a row for
/// it bought nothing (1: the first).
pub fn block_for(strikes: u32) -> Duration {
    let doublings = strikes.saturating_sub(1).min(16);
    BLOCK_BASE.saturating_mul(1 << doublings).min(BLOCK_MAX)
}

fn spread(before: &[Sample], f: impl Fn(&Sample) -> Millis) -> Millis {
    let max = before.iter().map(&f).max().unwrap_or(0);
    let min = before.iter().map(&f).min().unwrap_or(0);
    max - min
}

/// The verdict on two windows of the owed pod, and the bar it was held to.
///
/// - Its usage fell by more than the bar: it stopped asking — need changed
///   (a lowering cannot make a pod use less; its wait fell with its need).
/// - Its usage rose by more than it waited for before, plus the bar: it
///   asked for more — need changed (no lowering gives a pod more than it
///   waited for).
/// - Its usage rose, or its wait fell, by at least the bar: helped.
/// - Else: no effect.
///
/// The bar is [`need_m`] of what it was owed, or the spread (max − min) of
/// the same figure over the before window where that is larger: a change
/// no bigger than the pod's own swing before the lowering is noise.
pub fn judge(owed_m: Millis, before: &[Sample], after: &[Sample]) -> (Effect, Millis) {
    let (b, a) = (mean(before), mean(after));
    let need = need_m(owed_m);
    let bar_usage = need.max(spread(before, |s| s.usage_m));
    let bar_wait = need.max(spread(before, |s| s.displaced_m));
    let gained = a.usage_m as i64 - b.usage_m as i64;
    let fell = b.displaced_m as i64 - a.displaced_m as i64;
    let stopped_asking = -gained > bar_usage as i64;
    let asked_for_more = gained > (b.displaced_m + bar_usage) as i64;
    let effect = if stopped_asking || asked_for_more {
        Effect::NeedChanged
    } else if gained >= bar_usage as i64 || fell >= bar_wait as i64 {
        Effect::Helped
    } else {
        Effect::NoEffect
    };
    let bar = if gained >= bar_usage as i64 || effect != Effect::Helped {
        bar_usage
    } else {
        bar_wait
    };
    (effect, bar)
}

/// What one interval tells [`Claims::step`] besides the owed pods' samples.
pub struct Interval<'a> {
    pub now: Duration,
    /// The node's free CPU ([`super::Contention::free_m`]).
    pub free_m: Millis,
    /// How long a pod found not helped must go undisplaced before it can
    /// be owed again.
    pub quiet: Duration,
    /// Whether a pod (owed, by cgroup id) left the node.
    pub owed_gone: &'a dyn Fn(&CgroupPodId) -> bool,
    /// Whether a managed pod (by uid) left the node.
    pub lowered_gone: &'a dyn Fn(&Uid) -> bool,
}

/// Every open claim, keyed by the owed pod's cgroup id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Claims {
    by_owed: HashMap<CgroupPodId, Claim>,
    /// Lowerings in a row that bought a pod nothing, by owed pod (its
    /// block doubles with each; a lowering that helps it resets it).
    strikes: HashMap<CgroupPodId, u32>,
}

impl Claims {
    /// Whether a claim for this pod is open (in any stage).
    pub fn has(&self, owed: &CgroupPodId) -> bool {
        self.by_owed.contains_key(owed)
    }

    /// The owed pods the caller must read every interval, usage and
    /// pressure, while their claim is open.
    pub fn watched(&self) -> impl Iterator<Item = &CgroupPodId> {
        self.by_owed.keys()
    }

    /// Whether a new lowering may be made for this owed pod: no claim for
    /// it, or one that helped and has had no follow-up that bought nothing.
    /// A pod may still be short after a first step (on the cgroupfs node,
    /// 2026-12-06, a neighbour within its 800m request still lost ~150m a
    /// second beside a managed pod 680m above its request, and no interval
    /// reached the twice-the-threshold wait a follow-up then needed). The
    /// marginal rest of its wait is as often latency beside the CPU just
    /// freed (in the benefit bench every follow-up for a 50–60m wait bought
    /// nothing): such a follow-up is undone alone, the lowering before it
    /// holds again, and no second follow-up is made while it holds.
    pub fn may_lower_for(&self, owed: &Displaced) -> bool {
        self.by_owed.get(&owed.id).is_none_or(|c| {
            matches!(
                c.stage,
                Stage::Helped {
                    no_follow_up: false,
                    ..
                }
            )
        })
    }

    /// What is owed this interval to pods a new lowering may be made for
    /// ([`Self::may_lower_for`]), and how many they are.
    pub fn fresh(&self, c: &super::Contention) -> (Millis, usize) {
        c.owed()
            .filter(|d| self.may_lower_for(d))
            .fold((0, 0), |(m, n), d| (m + d.deficit_m, n + 1))
    }

    /// The highest limit each managed pod is held to by a lowering still
    /// applying, measured, or found to help — and by the lowering that
    /// helped before a follow-up still being checked (none once blocked).
    pub fn holds(&self) -> HashMap<&Uid, Millis> {
        let mut out: HashMap<&Uid, Millis> = HashMap::new();
        for c in self.by_owed.values() {
            let mut claim = Some(c);
            while let Some(c) = claim {
                if !matches!(c.stage, Stage::Blocked { .. }) {
                    for l in &c.lowered {
                        let e = out.entry(&l.uid).or_insert(l.to_m);
                        *e = (*e).min(l.to_m);
                    }
                }
                claim = c.prior.as_deref();
            }
        }
        out
    }

    /// Opens a claim for each pod owed this interval that a lowering may be
    /// made for ([`Self::may_lower_for`]), when this interval's patches
    /// lowered managed pods (`lowered`, accepted by the apiserver). Each
    /// such pod is what the lowering was for. `earlier`: its sample the
    /// interval before, where that was read (the before window's first
    /// interval). A claim that helped is kept under the new one
    /// (`prior`): its holds stay, and it comes back if the new one buys
    /// nothing.
    pub fn open<'a>(
        &mut self,
        owed: impl IntoIterator<Item = &'a Displaced>,
        earlier: impl Fn(&CgroupPodId) -> Option<Sample>,
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
            let mut before: Vec<Sample> = earlier(&d.id).into_iter().collect();
            before.push(Sample {
                usage_m: d.usage_m,
                displaced_m: d.displaced_m,
            });
            let prior = self.by_owed.remove(&d.id).map(Box::new);
            self.by_owed.insert(
                d.id.clone(),
                Claim {
                    owed_m: d.deficit_m,
                    request_m: d.request_m,
                    before,
                    lowered: lowered.to_vec(),
                    made_at: now,
                    stage: Stage::Applying {
                        pending: lowered.iter().map(|l| l.uid.clone()).collect(),
                    },
                    prior,
                },
            );
        }
    }

    /// A lowered pod's resize showed in its `cpu.max` (`verified`), or was
    /// given up on (not verified): every claim waiting for it learns it.
    /// A lowering that never applied bought nothing anyone can measure.
    /// `now`: when, for the block an unjudged claim leaves.
    pub fn resize_done(&mut self, managed_uid: &Uid, verified: bool, now: Duration) -> Vec<Judged> {
        let mut judged = Vec::new();
        let owed: Vec<CgroupPodId> = self
            .by_owed
            .iter()
            .filter(|(_, c)| {
                matches!(&c.stage, Stage::Applying { pending } if pending.contains(managed_uid))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for id in owed {
            let Some(c) = self.by_owed.get_mut(&id) else {
                continue;
            };
            if !verified {
                judged.push(c.judged(&id, Effect::Unjudged, None, 0));
                self.end(&id, Effect::Unjudged, now);
                continue;
            }
            let Stage::Applying { pending } = &mut c.stage else {
                continue;
            };
            pending.retain(|u| u != managed_uid);
            if pending.is_empty() {
                // The interval the kubelet applied it in is neither before
                // nor after; the window before keeps at least one.
                if c.before.len() > 1 {
                    c.before.pop();
                }
                let extra = c.before.len().saturating_sub(WINDOW);
                c.before.drain(..extra);
                c.stage = Stage::Measuring { after: Vec::new() };
            }
        }
        judged
    }

    /// One interval: each open claim takes its owed pod's sample (`None`
    /// when not read this interval) and the verdicts due are returned.
    pub fn step(
        &mut self,
        at: &Interval<'_>,
        sample: impl Fn(&CgroupPodId) -> Option<Sample>,
    ) -> Vec<Judged> {
        let mut judged = Vec::new();
        let mut ended: Vec<(CgroupPodId, Effect)> = Vec::new();
        self.strikes.retain(|id, _| !(at.owed_gone)(id));
        self.by_owed.retain(|owed, c| {
            if (at.owed_gone)(owed) {
                return false;
            }
            match c.step(owed, sample(owed), at) {
                Next::Keep => true,
                Next::Drop => false,
                Next::Judged(j) => {
                    if j.effect != Effect::Helped {
                        ended.push((owed.clone(), j.effect));
                    }
                    judged.push(j);
                    true
                }
            }
        });
        for j in judged.iter().filter(|j| j.effect == Effect::Helped) {
            self.strikes.remove(&j.owed);
        }
        for (id, effect) in ended {
            self.end(&id, effect, at.now);
        }
        for j in judged.iter_mut().filter(|j| j.effect == Effect::NoEffect) {
            j.strikes = self.strikes.get(&j.owed).copied().unwrap_or(0);
        }
        judged
    }

    /// What a claim that did not help leaves behind: the claim it followed
    /// back (unjudged or no effect), a block (no effect, doubling with each
    /// in a row; unjudged, the base one), or nothing (need changed).
    fn end(&mut self, id: &CgroupPodId, effect: Effect, now: Duration) {
        let Some(c) = self.by_owed.remove(id) else {
            return;
        };
        let block = match effect {
            Effect::Helped | Effect::NeedChanged => {
                self.strikes.remove(id);
                return;
            }
            Effect::NoEffect => {
                let strikes = self.strikes.entry(id.clone()).or_insert(0);
                *strikes = strikes.saturating_add(1);
                block_for(*strikes)
            }
            Effect::Unjudged => block_for(1),
        };
        if let Some(mut prior) = c.prior {
            // The follow-up bought nothing; the lowering before it did:
            // held again, and no further follow-up while it holds.
            if let Stage::Helped {
                below,
                no_follow_up,
                ..
            } = &mut prior.stage
            {
                *below = 0;
                *no_follow_up = true;
            }
            self.by_owed.insert(id.clone(), *prior);
            return;
        }
        let mut c = c;
        c.stage = Stage::Blocked {
            last_displaced: now,
            until: now + block,
        };
        self.by_owed.insert(id.clone(), c);
    }
}

/// What one interval does to a claim.
enum Next {
    Keep,
    /// Ended with nothing to report (its hold let go).
    Drop,
    /// Judged: kept in the Helped stage, else ended by [`Claims::end`].
    Judged(Judged),
}

impl Claim {
    /// One interval of this claim, with the owed pod's sample `s`.
    fn step(&mut self, owed: &CgroupPodId, s: Option<Sample>, at: &Interval<'_>) -> Next {
        let now = at.now;
        match &mut self.stage {
            Stage::Applying { pending } => {
                // A lowered pod that left will never show its limit.
                let gone = pending.iter().any(|u| (at.lowered_gone)(u));
                if gone || now.saturating_sub(self.made_at) >= APPLY_TIMEOUT {
                    return Next::Judged(self.judged(owed, Effect::Unjudged, None, 0));
                }
                if let Some(s) = s {
                    self.before.push(s);
                    // One more than the window: the newest may be the
                    // interval the kubelet applied it in.
                    if self.before.len() > WINDOW + 1 {
                        self.before.remove(0);
                    }
                }
                Next::Keep
            }
            Stage::Measuring { after } => {
                after.extend(s);
                let want = self.before.len().clamp(MIN_WINDOW, WINDOW);
                if after.len() < want {
                    // An owed pod that stays unread is not measured forever.
                    if now.saturating_sub(self.made_at) < 2 * APPLY_TIMEOUT {
                        return Next::Keep;
                    }
                    return Next::Judged(self.judged(owed, Effect::Unjudged, None, 0));
                }
                let after = std::mem::take(after);
                let (effect, bar) = judge(self.owed_m, &self.before, &after);
                let a = mean(&after);
                if effect == Effect::Helped {
                    let b = mean(&self.before);
                    self.stage = Stage::Helped {
                        keep_above_m: b.usage_m + a.usage_m.saturating_sub(b.usage_m) / 2,
                        below: 0,
                        since: now,
                        no_follow_up: false,
                    };
                }
                Next::Judged(self.judged(owed, effect, Some(a), bar))
            }
            Stage::Helped { .. } => {
                if self.still_held(s, at) {
                    Next::Keep
                } else {
                    // Let go, the claim it followed with it.
                    Next::Drop
                }
            }
            Stage::Blocked {
                last_displaced,
                until,
            } => {
                // An interval not read is not quiet.
                if s.is_none_or(|s| s.displaced_m >= MIN_DISPLACED_M) {
                    *last_displaced = now;
                }
                if now.saturating_sub(*last_displaced) < at.quiet || now < *until {
                    Next::Keep
                } else {
                    Next::Drop
                }
            }
        }
    }

    /// Whether a claim that helped still holds after this interval: the
    /// owed pod still runs near its demand, within its request, and the
    /// node has no idle CPU the size of what the hold took (else the CPU
    /// bought goes unused, or the pod is above its request, where CFS
    /// shares the surplus by weight) — [`QUIET_INTERVALS`] intervals
    /// otherwise end it, going above its request at once, and [`HOLD_MAX`]
    /// whatever it does.
    fn still_held(&mut self, s: Option<Sample>, at: &Interval<'_>) -> bool {
        let freed: Millis = self
            .lowered
            .iter()
            .map(|l| l.from_m.saturating_sub(l.to_m))
            .sum();
        let request_m = self.request_m;
        let Stage::Helped {
            keep_above_m,
            below,
            since,
            ..
        } = &mut self.stage
        else {
            return false;
        };
        let above_request = s.is_some_and(|s| s.usage_m > request_m + super::MIN_OWED_M);
        let still = s.is_some_and(|s| s.usage_m >= *keep_above_m)
            && !above_request
            && at.free_m < freed.max(MIN_DISPLACED_M);
        *below = if still { 0 } else { *below + 1 };
        !above_request && *below < QUIET_INTERVALS && at.now.saturating_sub(*since) < HOLD_MAX
    }

    fn judged(
        &self,
        owed: &CgroupPodId,
        effect: Effect,
        after: Option<Sample>,
        bar_m: Millis,
    ) -> Judged {
        Judged {
            owed: owed.clone(),
            effect,
            owed_m: self.owed_m,
            before: mean(&self.before),
            after,
            window: self.before.len(),
            bar_m,
            strikes: 0,
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
