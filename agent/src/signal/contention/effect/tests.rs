use super::*;

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

/// A claim for `steady` (using 500m, waiting 250m, owed 250m) after svc was
/// lowered 1900m → 1650m, applied at 5 s.
fn applied() -> Claims {
    let mut c = Claims::default();
    c.open([&owed("steady", 500, 250, 250)], &svc(1900, 1650), s(0));
    assert!(c.resize_done(&Uid::from("svc"), true).is_empty());
    c
}

#[test]
fn a_claim_opens_only_when_something_was_lowered() {
    let mut c = Claims::default();
    c.open([&owed("steady", 500, 250, 250)], &[], s(0));
    assert!(!c.has(&CgroupPodId::from("steady")));
    c.open([&owed("steady", 500, 250, 250)], &svc(1900, 1650), s(0));
    assert!(c.has(&CgroupPodId::from("steady")));
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
}

#[test]
fn no_second_lowering_for_a_pod_before_the_first_ones_effect_is_known() {
    let mut c = Claims::default();
    c.open([&owed("steady", 500, 250, 250)], &svc(1900, 1650), s(0));
    let contention = Contention {
        displaced: vec![owed("steady", 500, 300, 300), owed("other", 100, 60, 60)],
        ..Contention::default()
    };
    // Still waiting, more than before: only the other pod is fresh demand.
    assert_eq!(c.fresh(&contention), (60, 1));
    // A second claim for the same pod does not replace the first.
    c.open([&owed("steady", 500, 300, 300)], &svc(1650, 1350), s(1));
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650));
}

#[test]
fn nothing_is_judged_before_the_kubelet_applied_the_lowering() {
    let mut c = Claims::default();
    c.open([&owed("steady", 500, 250, 250)], &svc(1900, 1650), s(0));
    for t in 1..10 {
        let j = c.step(s(t), |_| sample(500, 250), |_| false, QUIET);
        assert!(j.is_empty(), "judged at {t} s before the resize showed");
    }
    // Another pod's resize does not count.
    assert!(c.resize_done(&Uid::from("web"), true).is_empty());
    assert!(
        c.step(s(10), |_| sample(500, 250), |_| false, QUIET)
            .is_empty()
    );
}

#[test]
fn a_lowering_the_owed_pod_gained_from_helped_and_holds_while_it_runs() {
    let mut c = applied();
    assert!(
        c.step(s(6), |_| sample(700, 40), |_| false, QUIET)
            .is_empty()
    );
    let j = c.step(s(7), |_| sample(720, 60), |_| false, QUIET);
    assert_eq!(j.len(), 1);
    assert_eq!(j[0].effect, Effect::Helped);
    assert_eq!(j[0].gained_m(), 210);
    assert_eq!(j[0].wait_fell_m(), 200);
    // Held at the lowered limit while steady runs near its demand
    // (at least 500 + 210 / 2 = 605m)...
    for t in 8..30 {
        assert!(
            c.step(s(t), |_| sample(650, 50), |_| false, QUIET)
                .is_empty()
        );
        assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1650), "at {t} s");
    }
    // ...one low interval is noise...
    c.step(s(30), |_| sample(100, 0), |_| false, QUIET);
    c.step(s(31), |_| sample(650, 0), |_| false, QUIET);
    assert!(c.has(&CgroupPodId::from("steady")));
    // Still short after the first step, but a marginal wait (under twice
    // its 80m threshold) earns no follow-up...
    let marginal = Contention {
        displaced: vec![owed("steady", 650, 120, 120)],
        ..Contention::default()
    };
    assert_eq!(c.fresh(&marginal), (0, 0));
    c.open([&owed("steady", 650, 120, 120)], &svc(1650, 1550), s(31));
    assert_eq!(
        c.holds().get(&Uid::from("svc")),
        Some(&1650),
        "no claim opened"
    );
    // ...a strong one does: a second lowering replaces the claim and
    // holds lower.
    let contention = Contention {
        displaced: vec![owed("steady", 650, 170, 150)],
        ..Contention::default()
    };
    assert_eq!(c.fresh(&contention), (150, 1));
    c.open([&owed("steady", 650, 170, 150)], &svc(1650, 1500), s(31));
    assert_eq!(c.holds().get(&Uid::from("svc")), Some(&1500));
    assert_eq!(c.fresh(&contention), (0, 0), "not before this one is known");
    c.resize_done(&Uid::from("svc"), true);
    c.step(s(32), |_| sample(800, 0), |_| false, QUIET);
    let j = c.step(s(33), |_| sample(800, 0), |_| false, QUIET);
    assert_eq!((j[0].effect, j[0].before.usage_m), (Effect::Helped, 650));
    // ...three in a row end its demand, and the hold.
    for t in 34..37 {
        c.step(s(t), |_| sample(100, 0), |_| false, QUIET);
    }
    assert!(!c.has(&CgroupPodId::from("steady")));
    assert!(c.holds().is_empty());
}

#[test]
fn a_fall_in_wait_alone_is_help() {
    let mut c = applied();
    c.step(s(6), |_| sample(510, 100), |_| false, QUIET);
    let j = c.step(s(7), |_| sample(500, 120), |_| false, QUIET);
    assert_eq!(j[0].effect, Effect::Helped);
}

#[test]
fn a_lowering_that_bought_nothing_is_undone_and_not_repeated_while_the_demand_lasts() {
    let mut c = applied();
    c.step(s(6), |_| sample(520, 240), |_| false, QUIET);
    let j = c.step(s(7), |_| sample(510, 250), |_| false, QUIET);
    assert_eq!(j[0].effect, Effect::NoEffect);
    assert_eq!(j[0].lowered, svc(1900, 1650));
    // Undone: nothing holds svc down any more.
    assert!(c.holds().is_empty());
    // Still waiting: not owed again.
    let contention = Contention {
        displaced: vec![owed("steady", 500, 250, 250)],
        ..Contention::default()
    };
    for t in 8..20 {
        c.step(s(t), |_| sample(500, 250), |_| false, QUIET);
        assert_eq!(c.fresh(&contention), (0, 0), "owed again at {t} s");
    }
    // Once it has not waited for the quiet window, it can be owed again.
    for t in 20..26 {
        c.step(s(t), |_| sample(500, 0), |_| false, QUIET);
    }
    assert!(!c.has(&CgroupPodId::from("steady")));
    assert_eq!(c.fresh(&contention), (250, 1));
}

#[test]
fn gains_below_the_need_are_no_effect() {
    // Owed 250m: help needs 62m.
    assert_eq!(need_m(250), 62);
    assert_eq!(need_m(20), MIN_DISPLACED_M);
    let mut c = applied();
    c.step(s(6), |_| sample(560, 200), |_| false, QUIET);
    let j = c.step(s(7), |_| sample(560, 200), |_| false, QUIET);
    // +60m used, −50m waited: under 62m either way.
    assert_eq!(j[0].effect, Effect::NoEffect);
}

#[test]
fn a_lowering_never_applied_is_dropped_unjudged() {
    let mut c = Claims::default();
    c.open([&owed("steady", 500, 250, 250)], &svc(1900, 1650), s(0));
    let j = c.resize_done(&Uid::from("svc"), false);
    assert_eq!(j[0].effect, Effect::Unjudged);
    assert!(!c.has(&CgroupPodId::from("steady")));
    let mut c = Claims::default();
    c.open([&owed("steady", 500, 250, 250)], &svc(1900, 1650), s(0));
    assert!(c.step(s(59), |_| None, |_| false, QUIET).is_empty());
    assert_eq!(
        c.step(s(60), |_| None, |_| false, QUIET)[0].effect,
        Effect::Unjudged
    );
    assert!(c.holds().is_empty());
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
    c.open([&owed("steady", 500, 250, 250)], &two, s(0));
    c.resize_done(&Uid::from("a"), true);
    c.step(s(1), |_| sample(800, 0), |_| false, QUIET);
    c.step(s(2), |_| sample(800, 0), |_| false, QUIET);
    assert!(
        c.step(s(3), |_| sample(800, 0), |_| false, QUIET)
            .is_empty()
    );
    c.resize_done(&Uid::from("b"), true);
    c.step(s(4), |_| sample(800, 0), |_| false, QUIET);
    assert_eq!(
        c.step(s(5), |_| sample(800, 0), |_| false, QUIET)[0].effect,
        Effect::Helped
    );
}

#[test]
fn a_claim_ends_with_its_owed_pod() {
    let mut c = applied();
    assert!(
        c.step(s(6), |_| sample(700, 0), |u| u.as_str() == "steady", QUIET)
            .is_empty()
    );
    assert!(!c.has(&CgroupPodId::from("steady")));
    assert!(c.holds().is_empty());
}
