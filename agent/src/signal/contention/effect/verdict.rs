//! The verdict on a claim: the owed pod's before and after windows, the
//! bar a change must pass, and what the check found ([`judge`]).

use crate::model::{CgroupPodId, Millis, Uid};
use crate::signal::contention::MIN_DISPLACED_M;

/// One interval of the owed pod, read: its usage and pressure compared
/// between two snapshots (an interval not read is no sample at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub usage_m: Millis,
    /// CPU it waited for while others held it ([`Displaced::displaced_m`]);
    /// 0 when it was not displaced past [`MIN_DISPLACED_M`].
    ///
    /// [`Displaced::displaced_m`]: crate::signal::contention::Displaced::displaced_m
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
    /// [`APPLY_TIMEOUT`](super::APPLY_TIMEOUT), a pod it lowered left, or
    /// the owed pod went unread.
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

    /// Whether the owed pod stopped asking: its own need ended inside the
    /// check ([`Effect::NeedChanged`] with its usage fallen). Whatever the
    /// lowering did, the CPU it took has nobody to go to now: it is given
    /// back as one that bought nothing is, or a come-and-go neighbour
    /// ratchets the managed pod down one lowering per episode of its need
    /// (benefit bench, `flicker`, 2026-12-07: 800m → 240m in 34 s).
    pub fn stopped_asking(&self) -> bool {
        self.effect == Effect::NeedChanged && self.gained_m() < 0
    }

    /// Fall of its wait, millicores (may be negative).
    pub fn wait_fell_m(&self) -> i64 {
        self.after
            .map_or(0, |a| self.before.displaced_m as i64 - a.displaced_m as i64)
    }
}

/// The least gain (or fall in wait) that counts as help for a pod owed
/// `owed_m`: a quarter of it, and at least [`MIN_DISPLACED_M`].
pub fn need_m(owed_m: Millis) -> Millis {
    (owed_m / 4).max(MIN_DISPLACED_M)
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

pub(super) fn mean(samples: &[Sample]) -> Sample {
    let n = samples.len().max(1) as Millis;
    Sample {
        usage_m: samples.iter().map(|s| s.usage_m).sum::<Millis>() / n,
        displaced_m: samples.iter().map(|s| s.displaced_m).sum::<Millis>() / n,
    }
}
