use super::*;
use crate::signal::contention::{Contention, MIN_DISPLACED_M};

const QUIET: Duration = Duration::from_secs(5);

fn s(t: u64) -> Duration {
    Duration::from_secs(t)
}

/// A pod within its 800m request (threshold 80m), short of CPU.
fn owed(uid: &str, usage_m: Millis, displaced_m: Millis, deficit_m: Millis) -> Displaced {
    Displaced {
        id: uid.into(),
        waited_us: 0,
        throttled_us: 0,
        displaced_us: 0,
        displaced_m,
        usage_m,
        request_m: 800,
        within_request: true,
        short: true,
        strong: displaced_m >= 160,
        deficit_m,
    }
}

fn svc(from_m: Millis, to_m: Millis) -> Vec<Lowered> {
    vec![Lowered {
        uid: "svc".into(),
        from_m,
        to_m,
    }]
}

fn sample(usage_m: Millis, displaced_m: Millis) -> Option<Sample> {
    Some(Sample {
        usage_m,
        displaced_m,
    })
}

fn no_earlier(_: &CgroupPodId) -> Option<Sample> {
    None
}

/// One interval at `t` s on a node with `free_m` free, every pod present
/// and Headroom's unless `gone` names it (an owed pod's cgroup id gone, or a
/// lowered pod's uid gone or resized by another writer).
fn step_on(c: &mut Claims, t: u64, free_m: Millis, gone: &str, smp: Option<Sample>) -> Vec<Judged> {
    stepped(c, t, free_m, gone, smp).judged
}

/// [`step_on`], whole: the verdicts and the holds that ended.
fn stepped(c: &mut Claims, t: u64, free_m: Millis, gone: &str, smp: Option<Sample>) -> Stepped {
    let owed_gone = |id: &CgroupPodId| id.as_str() == gone;
    let lowered_released = |u: &Uid| u.as_str() == gone;
    c.step(
        &Interval {
            now: s(t),
            free_m,
            quiet: QUIET,
            owed_gone: &owed_gone,
            lowered_released: &lowered_released,
        },
        |_| smp,
    )
}

/// The holds that ended in one interval, each as (why, pods it let go).
fn ended(
    c: &mut Claims,
    t: u64,
    free_m: Millis,
    gone: &str,
    smp: Option<Sample>,
) -> Vec<(HoldEnd, Vec<Lowered>)> {
    stepped(c, t, free_m, gone, smp)
        .ended
        .into_iter()
        .inspect(|e| assert_eq!(e.owed, steady()))
        .map(|e| (e.why, e.lowered))
        .collect()
}

fn step(c: &mut Claims, t: u64, smp: Option<Sample>) -> Vec<Judged> {
    step_on(c, t, 0, "", smp)
}

fn steady() -> CgroupPodId {
    CgroupPodId::from("steady")
}

/// A claim for `steady` (using 500m, waiting 250m, owed 250m) opened at 0 s
/// for svc's lowering 1900m → 1650m, not applied yet.
fn opened() -> Claims {
    let mut c = Claims::default();
    c.open(
        [&owed("steady", 500, 250, 250)],
        no_earlier,
        &svc(1900, 1650),
        s(0),
    );
    c
}

/// A claim for `steady` (using 500m, waiting 250m, owed 250m) after svc was
/// lowered 1900m → 1650m at 0 s; one more interval (500m, 250m) read while
/// the kubelet applied it, at 1 s; applied at 2 s. Its before window: the
/// two intervals, (500m, 250m) each.
fn applied() -> Claims {
    let mut c = opened();
    assert!(step(&mut c, 1, sample(500, 250)).is_empty());
    assert!(step(&mut c, 2, sample(500, 250)).is_empty());
    assert!(c.resize_done(&Uid::from("svc"), true, s(2)).is_empty());
    c
}

/// The one verdict of two after-intervals at 3 and 4 s.
fn verdict(c: &mut Claims, a: Option<Sample>, b: Option<Sample>) -> Judged {
    assert!(step(c, 3, a).is_empty(), "judged on one interval");
    let mut j = step(c, 4, b);
    assert_eq!(j.len(), 1, "one verdict after two intervals");
    j.remove(0)
}

#[test]
fn a_claim_opens_only_when_something_was_lowered() {
    let mut c = Claims::default();
    c.open([&owed("steady", 500, 250, 250)], no_earlier, &[], s(0));
    assert!(!c.has(&steady()));
    c.open(
        [&owed("steady", 500, 250, 250)],
        no_earlier,
        &svc(1900, 1650),
        s(0),
    );
    assert!(c.has(&steady()));
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
}

#[test]
fn no_second_lowering_for_a_pod_before_the_first_ones_effect_is_known() {
    let mut c = opened();
    let contention = Contention {
        displaced: vec![owed("steady", 500, 300, 300), owed("other", 100, 60, 60)],
        ..Contention::default()
    };
    // Still waiting, more than before: only the other pod is fresh demand.
    assert_eq!(c.fresh(&contention), (60, 1));
    // A second claim for the same pod does not replace the first.
    c.open(
        [&owed("steady", 500, 300, 300)],
        no_earlier,
        &svc(1650, 1350),
        s(1),
    );
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
}

#[test]
fn nothing_is_judged_before_the_kubelet_applied_the_lowering() {
    let mut c = opened();
    for t in 1..10 {
        assert!(
            step(&mut c, t, sample(800, 0)).is_empty(),
            "judged at {t} s before the resize showed"
        );
    }
    // Another pod's resize does not count.
    assert!(c.resize_done(&Uid::from("web"), true, s(10)).is_empty());
    assert!(step(&mut c, 10, sample(800, 0)).is_empty());
}

#[test]
fn a_lowering_the_owed_pod_gained_from_helped_and_holds_while_it_runs() {
    let mut c = applied();
    let j = verdict(&mut c, sample(700, 40), sample(720, 60));
    assert_eq!(j.effect, Effect::Helped);
    assert_eq!((j.gained_m(), j.wait_fell_m(), j.window), (210, 200, 2));
    // Held at the lowered limit while steady asks for about what it did
    // (usage + wait at least 750 − the 62m bar = 688m), however its usage
    // swings...
    for t in 5..30 {
        let smp = if t % 4 == 0 {
            sample(640, 60)
        } else {
            sample(560, 140)
        };
        assert!(step(&mut c, t, smp).is_empty());
        assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650), "at {t} s");
    }
    // ...one low interval is noise...
    step(&mut c, 30, sample(100, 0));
    step(&mut c, 31, sample(700, 0));
    assert!(c.has(&steady()));
    // Still short after the first step (owed 150m): a follow-up lowering
    // holds lower, the first one's hold kept under it.
    let contention = Contention {
        displaced: vec![owed("steady", 650, 150, 150)],
        ..Contention::default()
    };
    assert_eq!(c.fresh(&contention), (150, 1));
    c.open(
        [&owed("steady", 650, 150, 150)],
        no_earlier,
        &svc(1650, 1500),
        s(31),
    );
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1500));
    assert_eq!(c.fresh(&contention), (0, 0), "not before this one is known");
    step(&mut c, 32, sample(650, 150));
    c.resize_done(&Uid::from("svc"), true, s(33));
    step(&mut c, 33, sample(780, 0));
    let j = step(&mut c, 34, sample(780, 0));
    assert_eq!((j[0].effect, j[0].before.usage_m), (Effect::Helped, 650));
    // ...three in a row below its demand end it, and the hold.
    for t in 35..37 {
        assert!(ended(&mut c, t, 0, "", sample(100, 0)).is_empty());
    }
    assert_eq!(
        ended(&mut c, 37, 0, "", sample(100, 0)),
        [(
            HoldEnd::NeedEnded,
            [svc(1650, 1500), svc(1900, 1650)].concat()
        )]
    );
    assert!(!c.has(&steady()));
    assert!(c.holds().is_empty());
}

#[test]
fn a_fall_in_wait_alone_is_help() {
    let mut c = applied();
    let j = verdict(&mut c, sample(510, 100), sample(500, 120));
    assert_eq!(j.effect, Effect::Helped);
}

#[test]
fn a_lowering_that_bought_nothing_is_undone_and_blocked_longer_each_time() {
    let mut c = applied();
    let j = verdict(&mut c, sample(520, 240), sample(510, 250));
    assert_eq!((j.effect, j.strikes), (Effect::NoEffect, 1));
    assert_eq!(j.lowered, svc(1900, 1650));
    // Undone: nothing holds svc down any more.
    assert!(c.holds().is_empty());
    let contention = Contention {
        displaced: vec![owed("steady", 500, 250, 250)],
        ..Contention::default()
    };
    // Still waiting: not owed again.
    for t in 5..20 {
        step(&mut c, t, sample(500, 250));
        assert_eq!(c.fresh(&contention), (0, 0), "owed again at {t} s");
    }
    // Quiet for the window, but the block (30 s from the verdict at 4 s)
    // is not over.
    for t in 20..34 {
        step(&mut c, t, sample(500, 0));
        assert_eq!(c.fresh(&contention), (0, 0), "owed again at {t} s");
    }
    step(&mut c, 34, sample(500, 0));
    assert!(!c.has(&steady()));
    assert_eq!(c.fresh(&contention), (250, 1));
    // A second lowering in a row that buys nothing blocks twice as long.
    c.open(
        [&owed("steady", 500, 250, 250)],
        no_earlier,
        &svc(1900, 1650),
        s(40),
    );
    step(&mut c, 41, sample(500, 250));
    c.resize_done(&Uid::from("svc"), true, s(42));
    step(&mut c, 42, sample(500, 250));
    let j = step(&mut c, 43, sample(500, 250));
    assert_eq!((j[0].effect, j[0].strikes), (Effect::NoEffect, 2));
    for t in 44..103 {
        step(&mut c, t, sample(500, 0));
        assert!(c.has(&steady()), "block ended at {t} s, before 60 s");
    }
    step(&mut c, 103, sample(500, 0));
    assert!(!c.has(&steady()));
    assert_eq!(block_for(1), BLOCK_BASE);
    assert_eq!(block_for(2), 2 * BLOCK_BASE);
    assert_eq!(block_for(40), BLOCK_MAX);
}

#[test]
fn gains_below_the_need_are_no_effect() {
    // Owed 250m: help needs 62m.
    assert_eq!(need_m(250), 62);
    assert_eq!(need_m(20), MIN_DISPLACED_M);
    let mut c = applied();
    // +60m used, −50m waited: under 62m either way.
    let j = verdict(&mut c, sample(560, 200), sample(560, 200));
    assert_eq!((j.effect, j.bar_m), (Effect::NoEffect, 62));
}

#[test]
fn a_change_within_the_before_windows_own_swing_is_no_effect() {
    // Before: (400m, 300m), (600m, 200m), (500m, 100m): usage swung by
    // 200m and the wait by 200m on their own.
    let before = [sample(400, 300), sample(600, 200), sample(500, 100)].map(Option::unwrap);
    // +150m used and −150m waited would pass the 62m need: not this swing.
    let after = [sample(650, 50), sample(650, 50)].map(Option::unwrap);
    assert_eq!(judge(250, &before, &after), (Effect::NoEffect, 200));
    // +210m is beyond it.
    let after = [sample(710, 40), sample(710, 40)].map(Option::unwrap);
    assert_eq!(judge(250, &before, &after), (Effect::Helped, 200));
}

#[test]
fn a_pod_that_stopped_asking_is_not_credited_nor_held_nor_blocked() {
    // Seen on a real node: usage 462m → 88m, its wait falling with it.
    let mut c = applied();
    let j = verdict(&mut c, sample(90, 0), sample(86, 0));
    assert_eq!(j.effect, Effect::NeedChanged);
    assert!(j.stopped_asking(), "the caller undoes it: {j:?}");
    assert!(j.wait_fell_m() >= 62, "its wait fell, yet no help");
    assert!(!c.has(&steady()));
    assert!(c.holds().is_empty());
    let contention = Contention {
        displaced: vec![owed("steady", 500, 250, 250)],
        ..Contention::default()
    };
    assert_eq!(c.fresh(&contention), (250, 1), "no block");
}

#[test]
fn a_pod_whose_need_grew_beyond_its_wait_is_need_changed() {
    let mut c = applied();
    // +340m used: more than the 250m it waited for (+62m), still within
    // its 800m request (+50m; above it ends the claim at once).
    let j = verdict(&mut c, sample(840, 0), sample(840, 0));
    assert_eq!(j.effect, Effect::NeedChanged);
    assert!(!j.stopped_asking(), "it asks for more: not undone");
    // +300m, within what it waited for and the bar: the CPU it was owed.
    let mut c = applied();
    assert_eq!(
        verdict(&mut c, sample(800, 0), sample(800, 0)).effect,
        Effect::Helped
    );
}

#[test]
fn the_windows_are_equal_and_of_intervals_read() {
    let mut c = Claims::default();
    // The interval before the one that owed it, the one that did, three
    // read while applying (one unread), the last of them the one the
    // kubelet applied it in: the newest three before that.
    c.open(
        [&owed("steady", 500, 250, 250)],
        |_| sample(900, 0),
        &svc(1900, 1650),
        s(0),
    );
    step(&mut c, 1, None);
    step(&mut c, 2, sample(500, 250));
    step(&mut c, 3, sample(500, 250));
    // Applied during the interval read at 4 s: neither before nor after.
    step(&mut c, 4, sample(650, 100));
    c.resize_done(&Uid::from("svc"), true, s(4));
    // Unread intervals do not count: after three read ones.
    for (t, smp) in [
        (5, None),
        (6, sample(700, 50)),
        (7, None),
        (8, sample(700, 50)),
    ] {
        assert!(step(&mut c, t, smp).is_empty(), "judged at {t} s");
    }
    let j = step(&mut c, 9, sample(700, 50));
    assert_eq!(j[0].window, 3);
    assert_eq!(
        j[0].before,
        Sample {
            usage_m: 500,
            displaced_m: 250
        }
    );
    assert_eq!(j[0].effect, Effect::Helped);
}

#[test]
fn a_lowering_never_applied_is_dropped_unjudged_and_blocks_once() {
    let mut c = opened();
    let j = c.resize_done(&Uid::from("svc"), false, s(1));
    assert_eq!(j[0].effect, Effect::Unjudged);
    assert!(c.holds().is_empty());
    let contention = Contention {
        displaced: vec![owed("steady", 500, 250, 250)],
        ..Contention::default()
    };
    assert_eq!(c.fresh(&contention), (0, 0), "blocked for the base block");
    let mut c = opened();
    assert!(step(&mut c, 59, None).is_empty());
    assert_eq!(step(&mut c, 60, None)[0].effect, Effect::Unjudged);
    assert!(c.holds().is_empty());
}

#[test]
fn an_owed_pod_left_unread_after_the_lowering_is_unjudged_not_helped() {
    let mut c = applied();
    for t in 3..120 {
        assert!(step(&mut c, t, None).is_empty(), "judged at {t} s");
    }
    assert_eq!(step(&mut c, 120, None)[0].effect, Effect::Unjudged);
}

#[test]
fn a_claim_waits_for_every_pod_it_lowered() {
    let mut c = Claims::default();
    let two = vec![
        Lowered {
            uid: "a".into(),
            from_m: 1000,
            to_m: 800,
        },
        Lowered {
            uid: "b".into(),
            from_m: 1000,
            to_m: 900,
        },
    ];
    c.open([&owed("steady", 500, 250, 250)], no_earlier, &two, s(0));
    step(&mut c, 1, sample(500, 250));
    c.resize_done(&Uid::from("a"), true, s(1));
    for t in 2..5 {
        assert!(step(&mut c, t, sample(500, 250)).is_empty());
    }
    c.resize_done(&Uid::from("b"), true, s(5));
    // Before: three of (500m, 250m), read until both applied; after: three.
    step(&mut c, 6, sample(720, 0));
    step(&mut c, 7, sample(720, 0));
    let j = step(&mut c, 8, sample(720, 0));
    assert_eq!((j[0].effect, j[0].window), (Effect::Helped, 3));
}

#[test]
fn a_lowered_pod_that_leaves_ends_the_claim_at_once() {
    let mut c = opened();
    let j = step_on(&mut c, 1, 0, "svc", sample(500, 250));
    assert_eq!(j[0].effect, Effect::Unjudged);
    assert!(c.holds().is_empty());
}

/// Another writer resized svc after the lowering showed: the after window
/// would measure its limit, not the lowering. Unjudged, though the owed
/// pod's figures alone would read helped.
#[test]
fn a_lowered_pod_released_while_measuring_is_not_judged_on_another_writers_limit() {
    let mut c = applied();
    assert!(step(&mut c, 3, sample(720, 30)).is_empty());
    let j = step_on(&mut c, 4, 0, "svc", sample(720, 30));
    assert_eq!(j.len(), 1);
    assert_eq!(j[0].effect, Effect::Unjudged);
    assert!(c.holds().is_empty());
}

/// A hold whose lowered pod another writer resized holds nothing: it ends
/// at once, though the owed pod still runs at its demand.
#[test]
fn a_hold_ends_when_its_lowered_pod_is_released() {
    let mut c = helped();
    step(&mut c, 5, sample(720, 0));
    assert!(c.has(&steady()));
    assert_eq!(
        ended(&mut c, 6, 0, "svc", sample(720, 0)),
        [(HoldEnd::Released, svc(1900, 1650))]
    );
    assert!(!c.has(&steady()));
    assert!(c.holds().is_empty());
}

#[test]
fn a_claim_ends_with_its_owed_pod() {
    let mut c = applied();
    assert_eq!(
        ended(&mut c, 3, 0, "steady", sample(700, 0)),
        [(HoldEnd::OwedLeft, svc(1900, 1650))]
    );
    assert!(!c.has(&steady()));
    assert!(c.holds().is_empty());
    // And a hold in force, with the lowering it followed.
    let (mut c, _) = follow_up_measuring();
    assert_eq!(
        ended(&mut c, 8, 0, "steady", None),
        [(
            HoldEnd::OwedLeft,
            [svc(1650, 1500), svc(1900, 1650)].concat()
        )]
    );
    assert!(c.holds().is_empty());
}

/// `applied()` judged helped at 4 s (+220m used), held from then.
fn helped() -> Claims {
    let mut c = applied();
    assert_eq!(
        verdict(&mut c, sample(720, 30), sample(720, 30)).effect,
        Effect::Helped
    );
    c
}

#[test]
fn a_hold_ends_as_soon_as_the_owed_pod_is_above_its_request() {
    let mut c = helped();
    // At its 800m request (and within noise of it): still held.
    step(&mut c, 5, sample(850, 0));
    assert!(c.has(&steady()));
    // 860m of its 800m request: owed nothing, CFS shares the surplus.
    assert_eq!(
        ended(&mut c, 6, 0, "", sample(860, 0)),
        [(HoldEnd::AboveRequest, svc(1900, 1650))]
    );
    assert!(!c.has(&steady()));
    assert!(c.holds().is_empty());
}

/// Above its request before the check is done, the owed pod is owed
/// nothing and its after window would measure its own new need: the claim
/// ends need changed, at once, its hold with it.
#[test]
fn a_claim_whose_owed_pod_goes_above_its_request_before_the_check_is_need_changed() {
    // While the kubelet applies the lowering...
    let mut c = opened();
    let j = step(&mut c, 1, sample(860, 0));
    assert_eq!(j[0].effect, Effect::NeedChanged);
    assert!(c.holds().is_empty());
    // ...and while it is measured (one after-interval read at 3 s).
    let mut c = applied();
    assert!(step(&mut c, 3, sample(720, 30)).is_empty());
    let out = stepped(&mut c, 4, 0, "", sample(1300, 0));
    assert_eq!(out.judged[0].effect, Effect::NeedChanged);
    assert_eq!(out.ended[0].why, HoldEnd::NeedChanged);
    assert!(c.holds().is_empty());
}

#[test]
fn a_hold_ends_when_what_it_bought_lies_idle() {
    let mut c = helped();
    // Near its demand, but 300m free: more than the 250m the hold took.
    for t in 5..7 {
        assert!(ended(&mut c, t, 300, "", sample(720, 0)).is_empty());
        assert!(c.has(&steady()), "ended at {t} s");
    }
    assert_eq!(
        ended(&mut c, 7, 300, "", sample(720, 0)),
        [(HoldEnd::IdleCpu, svc(1900, 1650))]
    );
    assert!(!c.has(&steady()));
}

#[test]
fn a_hold_ends_after_its_longest() {
    let mut c = helped();
    let until = 4 + HOLD_MAX.as_secs();
    for t in 5..until {
        step(&mut c, t, sample(720, 0));
    }
    assert!(c.has(&steady()));
    assert_eq!(
        ended(&mut c, until, 0, "", sample(720, 0)),
        [(HoldEnd::HoldMax, svc(1900, 1650))]
    );
    assert!(!c.has(&steady()));
}

/// `helped()` and a follow-up for `steady` (still waiting 200m, owed 80m):
/// svc 1650m → 1500m at 5 s, applied at 7 s, one after-interval read; the
/// follow-up's hold is the lower one meanwhile. Returns the owed pod too.
fn follow_up_measuring() -> (Claims, Displaced) {
    let mut c = helped();
    let strong = owed("steady", 720, 200, 80);
    c.open([&strong], no_earlier, &svc(1650, 1500), s(5));
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1500));
    step(&mut c, 6, sample(720, 200));
    c.resize_done(&Uid::from("svc"), true, s(7));
    step(&mut c, 7, sample(720, 200));
    (c, strong)
}

#[test]
fn a_follow_up_that_bought_nothing_gives_back_only_its_own_step() {
    let (mut c, strong) = follow_up_measuring();
    let out = stepped(&mut c, 8, 0, "", sample(720, 200));
    let j = &out.judged;
    assert_eq!(
        (j[0].effect, &j[0].lowered),
        (Effect::NoEffect, &svc(1650, 1500))
    );
    assert_eq!(
        out.ended,
        [HoldEnded {
            owed: steady(),
            lowered: svc(1650, 1500),
            why: HoldEnd::NoEffect
        }]
    );
    // The first lowering, which helped, holds again...
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
    // ...and earns no second follow-up.
    let contention = Contention {
        displaced: vec![strong],
        ..Contention::default()
    };
    assert_eq!(c.fresh(&contention), (0, 0));
}

#[test]
fn a_follow_up_whose_owed_pod_changed_its_need_leaves_the_first_hold() {
    let (mut c, _) = follow_up_measuring();
    // It asked for far more than it waited for: nothing learned.
    let j = step(&mut c, 8, sample(1300, 0));
    assert_eq!(
        (j[0].effect, &j[0].lowered),
        (Effect::NeedChanged, &svc(1650, 1500))
    );
    // The first lowering, which helped, still holds while its pod runs.
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
    step(&mut c, 9, sample(720, 30));
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
}

#[test]
fn a_hold_is_not_ended_by_intervals_not_read() {
    let mut c = helped();
    for t in 5..5 + 2 * u64::from(QUIET_INTERVALS) {
        step(&mut c, t, None);
    }
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
    // Read again, quiet: the quiet count starts from the first read.
    let from = 5 + 2 * u64::from(QUIET_INTERVALS);
    for t in from..from + u64::from(QUIET_INTERVALS) - 1 {
        step(&mut c, t, sample(100, 0));
    }
    assert!(c.has(&steady()));
    step(&mut c, from + u64::from(QUIET_INTERVALS), sample(100, 0));
    assert!(!c.has(&steady()));
}

#[test]
fn a_blocked_pod_unread_is_not_quiet() {
    let mut c = applied();
    assert_eq!(
        verdict(&mut c, sample(500, 250), sample(500, 250)).effect,
        Effect::NoEffect
    );
    for t in 5..200 {
        step(&mut c, t, None);
    }
    assert!(c.has(&steady()), "an unread pod counted as quiet");
}
