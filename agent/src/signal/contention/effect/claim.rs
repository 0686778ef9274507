//! One claim: a lowering made for one owed pod, through its stages, one
//! interval at a time ([`Claim::step`]).

use std::time::Duration;

use super::verdict::{Effect, Judged, Lowered, Sample, judge, mean};
use super::{
    APPLY_TIMEOUT, HOLD_MAX, HoldEnd, HoldEnded, Interval, MIN_WINDOW, QUIET_INTERVALS, WINDOW,
};
use crate::model::{CgroupPodId, Millis, Uid};
use crate::signal::contention::{MIN_DISPLACED_M, MIN_OWED_M};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Stage {
    Applying {
        pending: Vec<Uid>,
    },
    Measuring {
        after: Vec<Sample>,
    },
    Helped {
        /// The least demand (usage + wait) per interval that is still the
        /// need the lowering was for: its demand before, less the bar.
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
pub(super) struct Claim {
    pub(super) owed_m: Millis,
    /// The owed pod's request when the claim opened.
    pub(super) request_m: Millis,
    /// The before window: the newest [`WINDOW`] intervals read before the
    /// lowering showed in `cpu.max`.
    pub(super) before: Vec<Sample>,
    pub(super) lowered: Vec<Lowered>,
    pub(super) made_at: Duration,
    pub(super) stage: Stage,
    /// The claim that helped this pod before this one, a follow-up
    /// lowering, replaced: it comes back, holds and all, when the
    /// follow-up bought nothing or could not be judged.
    pub(super) prior: Option<Box<Claim>>,
}

/// What one interval does to a claim.
pub(super) enum Next {
    Keep,
    /// A block that lapsed: nothing held, nothing to report.
    Drop,
    /// A lowering that helped let go of its hold, and why (the claim it
    /// followed goes with it).
    LetGo(HoldEnd),
    /// Judged: kept in the Helped stage, else ended by
    /// [`Claims::end`](super::Claims::end).
    Judged(Judged),
}

impl Claim {
    /// One interval of this claim, with the owed pod's sample `s`.
    pub(super) fn step(
        &mut self,
        owed: &CgroupPodId,
        s: Option<Sample>,
        at: &Interval<'_>,
    ) -> Next {
        let now = at.now;
        // A lowered pod that left will never show its limit; one another
        // writer resized shows that writer's: neither measures the lowering,
        // and a hold has nothing left to hold.
        let released = self.lowered.iter().any(|l| (at.lowered_released)(&l.uid));
        // Above its request before the check is done: owed nothing, and an
        // after window with it there measures its new need, not the
        // lowering (on the 6.12 node, 2026-12-07, a follow-up was judged
        // helped on +506m its own limit's raise gave it).
        let above_request = s.is_some_and(|s| s.usage_m > self.request_m + MIN_OWED_M);
        match &mut self.stage {
            Stage::Applying { .. } | Stage::Measuring { .. } if released => {
                Next::Judged(self.judged(owed, Effect::Unjudged, None, 0))
            }
            Stage::Applying { .. } | Stage::Measuring { .. } if above_request => {
                Next::Judged(self.judged(owed, Effect::NeedChanged, s, 0))
            }
            Stage::Helped { .. } if released => Next::LetGo(HoldEnd::Released),
            Stage::Applying { .. } => {
                if now.saturating_sub(self.made_at) >= APPLY_TIMEOUT {
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
                    // Its demand, not its usage: a pod the hold helps still
                    // swings by its own noise second to second (the
                    // neighbour on the emulated node used 539–716m with
                    // its demand at 780–800m), and three seconds under a
                    // usage threshold ended holds it still needed.
                    let b = mean(&self.before);
                    self.stage = Stage::Helped {
                        keep_above_m: (b.usage_m + b.displaced_m).saturating_sub(bar),
                        below: 0,
                        since: now,
                        no_follow_up: false,
                    };
                }
                Next::Judged(self.judged(owed, effect, Some(a), bar))
            }
            Stage::Helped { .. } => match self.hold_ends(s, at) {
                None => Next::Keep,
                Some(why) => Next::LetGo(why),
            },
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

    /// Why a claim that helped stops holding after this interval, or
    /// `None` while it holds: the owed pod still asks for about what it
    /// asked for before (its usage plus its wait, within the verdict's
    /// bar), within its request, and the node has no idle CPU the size of
    /// what the hold took (else the CPU bought goes unused, or the pod is
    /// above its request, where CFS shares the surplus by weight) —
    /// [`QUIET_INTERVALS`] intervals read otherwise end it, going above its
    /// request at once, and [`HOLD_MAX`] whatever it does.
    fn hold_ends(&mut self, s: Option<Sample>, at: &Interval<'_>) -> Option<HoldEnd> {
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
            return Some(HoldEnd::NeedEnded);
        };
        let past_max = at.now.saturating_sub(*since) >= HOLD_MAX;
        // An interval not read tells nothing either way: counted as quiet,
        // three in a row (a snapshot without the owed pod's `full`) ended a
        // hold its pod still needed. HOLD_MAX still bounds it.
        let Some(s) = s else {
            return past_max.then_some(HoldEnd::HoldMax);
        };
        if s.usage_m > request_m + MIN_OWED_M {
            return Some(HoldEnd::AboveRequest);
        }
        let asks = s.usage_m + s.displaced_m >= *keep_above_m;
        let idle = at.free_m >= freed.max(MIN_DISPLACED_M);
        *below = if asks && !idle { 0 } else { *below + 1 };
        if *below >= QUIET_INTERVALS {
            // Named by this interval, the one that ended it.
            Some(if asks {
                HoldEnd::IdleCpu
            } else {
                HoldEnd::NeedEnded
            })
        } else {
            past_max.then_some(HoldEnd::HoldMax)
        }
    }

    /// What this claim, and the claims it followed, hold down: the pods
    /// each lowered, but a blocked claim's (undone).
    pub(super) fn holding(&self) -> impl Iterator<Item = &Lowered> {
        std::iter::successors(Some(self), |c| c.prior.as_deref())
            .filter(|c| !matches!(c.stage, Stage::Blocked { .. }))
            .flat_map(|c| c.lowered.iter())
    }

    /// The end of what [`Self::holding`] held down: `None` if nothing.
    pub(super) fn held_ended(&self, owed: &CgroupPodId, why: HoldEnd) -> Option<HoldEnded> {
        let lowered: Vec<Lowered> = self.holding().cloned().collect();
        (!lowered.is_empty()).then(|| HoldEnded {
            owed: owed.clone(),
            lowered,
            why,
        })
    }

    pub(super) fn judged(
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
