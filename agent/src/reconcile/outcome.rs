//! What follows an answer, as data: each function here updates [`Records`]
//! (the only state it touches) and returns the [`Effect`]s for one pod, which
//! one executor carries out (`effects.rs`) — koordinator's strategies emit
//! updaters, one executor runs them. No I/O; time and jitter come in.

use std::time::Duration;

use crate::kube::classify::{Outcome, Refusal};
use crate::kube::events::{
    EventType, REASON_DRIFT, REASON_DRIFT_CLEARED, REASON_LOWERING_HELPED,
    REASON_LOWERING_NEED_CHANGED, REASON_LOWERING_UNDONE, REASON_REFUSED, REASON_RESIZED,
    REASON_YIELDED,
};
use crate::kube::resize::ResizeAnswer;
use crate::metrics::{LoweringEffect, PatchErrorClass, ResizeResult};
use crate::model::{Millis, PodView, Uid};
use crate::policy::{Decision, Direction, PatchPlan, PolicyConfig, Yielded};
use crate::signal::contention::effect::{Effect as Bought, Judged, Lowered};
use crate::verify::{DriftEvent, Mismatch, ResizeOutcome, Target};

use super::records::{Jitter, Records};

/// One thing to do about one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// `headroom_patch_errors_total{class}` + 1.
    PatchError(PatchErrorClass),
    /// `headroom_resizes_total{result, direction}` + 1.
    Resize(ResizeResult, Direction),
    /// A resize seen in `cpu.max`: counted as verified, with its latency.
    Verified {
        direction: Direction,
        latency: Duration,
    },
    /// The drift gauge of one cgroup of the pod.
    Drift {
        target: Target,
        drifting: bool,
    },
    /// `headroom_drift_events_total{cgroup}` + 1.
    DriftDetected(Target),
    /// A Kubernetes Event on the pod (rate-limited by the sink).
    Event {
        type_: EventType,
        reason: &'static str,
        note: String,
    },
    Log(Log),
    /// The pod is gone: drop everything remembered about it.
    Forget,
    /// Follow the accepted resize until it shows in `cpu.max`.
    Track {
        generation: i64,
        direction: Direction,
    },
    /// This node cannot resize pods with pod-level resources: they all
    /// become unmanaged.
    PodLevelUnsupported,
}

/// A log line about the pod, one variant per message.
#[derive(Debug, Clone, PartialEq)]
pub enum Log {
    DryRun {
        old: String,
        new: String,
        why: String,
    },
    Resized {
        old: String,
        new: String,
        generation: i64,
        why: String,
    },
    Refused {
        reason: &'static str,
        learned_floor: Option<Millis>,
        message: String,
    },
    Forbidden {
        message: String,
        pause: Duration,
    },
    BackingOff {
        class: PatchErrorClass,
        message: String,
        retry_in: Duration,
    },
    Verified {
        generation: i64,
        latency: Duration,
    },
    Unverified {
        generation: i64,
        kubelet_done: bool,
        waited: Duration,
    },
    Overtaken {
        generation: i64,
        by: String,
    },
    Drift {
        mismatch: Mismatch,
        lasting: Duration,
    },
    DriftChanged {
        mismatch: Mismatch,
    },
    DriftCleared {
        target: Target,
        lasted: Duration,
    },
    /// Headroom leaves the pod's limits to another writer.
    Yielded(Yielded),
    /// The other writer's change is handed back (`headroom.dev/resume`), or
    /// gone: Headroom manages the pod's limits again (or it left for
    /// another reason).
    YieldEnded,
    /// What a lowering of this pod bought the pod it was made for.
    LoweringChecked {
        /// `namespace/name` of the owed pod (its cgroup's pod id if it is not known).
        owed: String,
        effect: &'static str,
        from_m: Millis,
        to_m: Millis,
        gained_m: i64,
        wait_fell_m: i64,
        usage_before_m: Millis,
        usage_after_m: Option<Millis>,
        /// Intervals in each window.
        window: usize,
        /// The least change that counted as help.
        bar_m: Millis,
    },
}

/// The counter's label of a checked lowering.
pub fn lowering_label(e: Bought) -> LoweringEffect {
    match e {
        Bought::Helped => LoweringEffect::helped,
        Bought::NoEffect => LoweringEffect::no_effect,
        Bought::NeedChanged => LoweringEffect::need_changed,
        Bought::Unjudged => LoweringEffect::unjudged,
    }
}

/// What a checked lowering means for one pod it lowered (`lowered`): a
/// log line, an Event, and when it bought nothing, or its owed pod stopped
/// asking ([`Judged::stopped_asking`]), its undoing — the raise
/// cooldown waived, so the limit the lowering took comes back at the next
/// round rather than 15 s or more later (the cooldown guards a raise
/// against a neighbour that needs the CPU; this one was shown not to).
/// For a lowering that bought nothing the waiver is for the first such
/// lowering in a row for the same owed pod (`Judged::strikes`): after that
/// the raise cooldown, with its backoff, stands, and the owed pod's block
/// doubles, so a lower–undo loop slows down rather than repeats at the
/// tick rate. A pod that stopped asking is not blocked: its next episode
/// of need is a new one.
pub fn on_lowering_checked(
    records: &mut Records,
    j: &Judged,
    lowered: &Lowered,
    owed: &str,
    now: Duration,
    cfg: &PolicyConfig,
) -> Vec<Effect> {
    let mut out = Vec::new();
    out.push(Effect::Log(Log::LoweringChecked {
        owed: owed.to_string(),
        effect: j.effect.as_str(),
        from_m: lowered.from_m,
        to_m: lowered.to_m,
        gained_m: j.gained_m(),
        wait_fell_m: j.wait_fell_m(),
        usage_before_m: j.before.usage_m,
        usage_after_m: j.after.map(|a| a.usage_m),
        window: j.window,
        bar_m: j.bar_m,
    }));
    let figures = format!(
        "{owed} used {}m and waited {}m before; {}m and {}m after ({} intervals each, {}m counts)",
        j.before.usage_m,
        j.before.displaced_m,
        j.after.map_or(0, |a| a.usage_m),
        j.after.map_or(0, |a| a.displaced_m),
        j.window,
        j.bar_m,
    );
    let (from, to) = (lowered.from_m, lowered.to_m);
    // What the verdict says, and whether the lowering is undone: its limit
    // may come back at once, the raise cooldown waived.
    let (reason, note, undo) = match j.effect {
        Bought::Helped => (
            REASON_LOWERING_HELPED,
            format!(
                "lowering {from}m→{to}m for {owed} (short of CPU within its request) helped: {figures}; held while it runs"
            ),
            false,
        ),
        Bought::NoEffect => (
            REASON_LOWERING_UNDONE,
            format!(
                "lowering {from}m→{to}m for {owed} bought nothing: {figures}; undone; not lowered for again until it has been quiet and its block (30 s, doubling each time in a row) is over"
            ),
            j.strikes <= 1,
        ),
        // Every time, not the first in a row only: each needs a new episode
        // of the owed pod's need past the owed threshold, a lowering for
        // it, its apply and a check — two patches per episode at most —
        // and nothing is blocked.
        Bought::NeedChanged if j.stopped_asking() => (
            REASON_LOWERING_NEED_CHANGED,
            format!(
                "lowering {from}m→{to}m for {owed}: it stopped asking meanwhile ({figures}); undone"
            ),
            true,
        ),
        Bought::NeedChanged => (
            REASON_LOWERING_NEED_CHANGED,
            format!(
                "lowering {from}m→{to}m for {owed}: it asked for more meanwhile ({figures}); not held"
            ),
            false,
        ),
        Bought::Unjudged => return out,
    };
    if undo && let Some(r) = records.get_mut(&lowered.uid) {
        r.waive_raise_cooldown(now.as_secs_f64(), cfg);
    }
    out.push(Effect::Event {
        type_: EventType::Normal,
        reason,
        note,
    });
    out
}

/// A CPU limit as a Kubernetes quantity in millicores (`300m`), or
/// `unlimited`.
pub fn fmt_limit(m: Option<Millis>) -> String {
    m.map_or_else(|| "unlimited".to_string(), |m| format!("{m}m"))
}

/// The round's pods that begin or stop yielding to another writer, with
/// their effects: one Event and a log line when a pause begins (not one per
/// tick: the pod's record remembers it), a log line when it ends. In dry-run
/// (`events: false`) only the log lines.
pub fn on_yields(
    records: &mut Records,
    decisions: &[Decision],
    events: bool,
) -> Vec<(Uid, Vec<Effect>)> {
    let mut out = Vec::new();
    let mut now_yielded = foldhash::HashSet::default();
    for d in decisions {
        let Some(y) = d.yielded() else {
            continue;
        };
        now_yielded.insert(&d.uid);
        if !records.entry(&d.uid).set_yielded(true) {
            let mut effects = vec![Effect::Log(Log::Yielded(y.clone()))];
            if events {
                effects.push(Effect::Event {
                    type_: EventType::Normal,
                    reason: REASON_YIELDED,
                    note: y.describe(),
                });
            }
            out.push((d.uid.clone(), effects));
        }
    }
    for (uid, r) in records.iter_mut() {
        if r.yielded() && !now_yielded.contains(uid) {
            r.set_yielded(false);
            out.push((uid.clone(), vec![Effect::Log(Log::YieldEnded)]));
        }
    }
    out
}

/// `--dry-run`: log and count a plan once per target, send nothing.
pub fn on_dry_run(records: &mut Records, plan: &PatchPlan) -> Vec<Effect> {
    let before = records.entry(&plan.uid).dry_run_logged(plan.new_total_m);
    if before == Some(plan.new_total_m) {
        return Vec::new();
    }
    vec![
        Effect::Log(Log::DryRun {
            old: fmt_limit(plan.old_total_m),
            new: fmt_limit(Some(plan.new_total_m)),
            why: plan.why.clone(),
        }),
        Effect::Resize(ResizeResult::dry_run, plan.direction),
    ]
}

/// What a resize the apiserver applied (as `generation`) does: follow it
/// until it shows in `cpu.max`, count, log and announce it.
fn on_applied(plan: &PatchPlan, generation: i64) -> Vec<Effect> {
    let dir = plan.direction;
    let old = fmt_limit(plan.old_total_m);
    let new = fmt_limit(Some(plan.new_total_m));
    let note = format!("CPU limit {old} → {new}: {}", plan.why);
    vec![
        Effect::Track {
            generation,
            direction: dir,
        },
        Effect::Resize(ResizeResult::applied, dir),
        Effect::Log(Log::Resized {
            old,
            new,
            generation,
            why: plan.why.clone(),
        }),
        Effect::Event {
            type_: EventType::Normal,
            reason: REASON_RESIZED,
            note,
        },
    ]
}

/// What a refused resize does: count, log and announce it, and when the
/// cluster or node cannot resize pod-level resources, stop managing them.
fn on_refused(
    plan: &PatchPlan,
    refusal: Refusal,
    message: String,
    floor_m: Option<Millis>,
) -> Vec<Effect> {
    let mut out = vec![Effect::Resize(ResizeResult::refused, plan.direction)];
    if matches!(
        refusal,
        Refusal::PodLevelGateOff | Refusal::NodeLacksFeature
    ) {
        // Cluster gate off or node lacks the feature: every pod-level pod
        // of this node becomes unmanaged.
        out.push(Effect::PodLevelUnsupported);
    }
    let note = format!(
        "resize to {}m refused ({}): {message}",
        plan.new_total_m,
        refusal.as_str()
    );
    out.extend([
        Effect::Log(Log::Refused {
            reason: refusal.as_str(),
            learned_floor: floor_m,
            message,
        }),
        Effect::Event {
            type_: EventType::Warning,
            reason: REASON_REFUSED,
            note,
        },
    ]);
    out
}

/// The apiserver answered `plan`'s patch of `view` (after the conflict retry,
/// if there was one): remember what it teaches and say what to do.
pub fn on_outcome(
    records: &mut Records,
    view: &PodView,
    plan: &PatchPlan,
    answer: ResizeAnswer,
    now: Duration,
    jitter: &mut Jitter,
    policy: &PolicyConfig,
) -> Vec<Effect> {
    let dir = plan.direction;
    let uid = &plan.uid;
    let mut out: Vec<Effect> = answer
        .outcome
        .error_class()
        .map(Effect::PatchError)
        .into_iter()
        .collect();
    match answer.outcome {
        Outcome::Applied => {
            let generation = answer.generation.unwrap_or(view.generation + 1);
            records.succeeded(uid);
            records.entry(uid).patched(plan, now.as_secs_f64(), policy);
            out.extend(on_applied(plan, generation));
        }
        Outcome::Refused {
            refusal,
            message,
            floor_m,
        } => {
            match floor_m {
                Some(f) => records.learn_floor(uid, f),
                None => records.refused(uid, now),
            }
            out.extend(on_refused(plan, refusal, message, floor_m));
        }
        Outcome::NotFound => out.push(Effect::Forget),
        Outcome::Conflict => {
            records.transient(uid, now, jitter.next01());
        }
        Outcome::Forbidden(message) => {
            out.push(Effect::Resize(ResizeResult::error, dir));
            let pause = records.forbidden(now);
            out.push(Effect::Log(Log::Forbidden { message, pause }));
        }
        Outcome::Transient { class, message } => {
            out.push(Effect::Resize(ResizeResult::error, dir));
            let retry_in = records.transient(uid, now, jitter.next01());
            out.push(Effect::Log(Log::BackingOff {
                class: class.into(),
                message,
                retry_in,
            }));
        }
    }
    out
}

/// A resize in flight ended (verified in `cpu.max`, or not within grace).
pub fn on_resize_outcome(outcome: &ResizeOutcome, direction: Direction) -> Vec<Effect> {
    match *outcome {
        ResizeOutcome::Verified {
            latency,
            generation,
            ..
        } => vec![
            Effect::Verified { direction, latency },
            Effect::Log(Log::Verified {
                generation,
                latency,
            }),
        ],
        ResizeOutcome::Unverified {
            generation,
            kubelet_done,
            waited,
            ..
        } => vec![
            Effect::Resize(ResizeResult::unverified, direction),
            Effect::Log(Log::Unverified {
                generation,
                kubelet_done,
                waited,
            }),
        ],
        ResizeOutcome::Overtaken {
            generation, ref by, ..
        } => vec![
            Effect::Resize(ResizeResult::superseded, direction),
            Effect::Log(Log::Overtaken {
                generation,
                by: by.clone(),
            }),
        ],
    }
}

/// The pod a drift event is about.
pub fn drift_uid(ev: &DriftEvent) -> &Uid {
    match ev {
        DriftEvent::Drift { uid, .. }
        | DriftEvent::Changed { uid, .. }
        | DriftEvent::Cleared { uid, .. }
        | DriftEvent::Forgotten { uid, .. } => uid,
    }
}

/// A drift event of a pod still known: gauge, counter, log and Event.
pub fn on_drift(ev: DriftEvent, now: Duration) -> Vec<Effect> {
    match ev {
        DriftEvent::Drift {
            mismatch, since, ..
        } => {
            let target = mismatch.target.clone();
            let note = format!("{target}: {mismatch}");
            vec![
                Effect::Drift {
                    target: target.clone(),
                    drifting: true,
                },
                Effect::DriftDetected(target),
                Effect::Log(Log::Drift {
                    mismatch,
                    lasting: now.saturating_sub(since),
                }),
                Effect::Event {
                    type_: EventType::Warning,
                    reason: REASON_DRIFT,
                    note,
                },
            ]
        }
        DriftEvent::Changed { mismatch, .. } => vec![Effect::Log(Log::DriftChanged { mismatch })],
        DriftEvent::Cleared { target, lasted, .. } => {
            let note = format!("{target}: cpu.max matches the spec again");
            vec![
                Effect::Drift {
                    target: target.clone(),
                    drifting: false,
                },
                Effect::Log(Log::DriftCleared { target, lasted }),
                Effect::Event {
                    type_: EventType::Normal,
                    reason: REASON_DRIFT_CLEARED,
                    note,
                },
            ]
        }
        DriftEvent::Forgotten { target, .. } => vec![Effect::Drift {
            target,
            drifting: false,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PatchKind;

    fn view() -> PodView {
        PodView::try_from(&crate::reconcile::tick_tests::pod(1, 200, 1)).unwrap()
    }

    fn lower_to(m: Millis) -> PatchPlan {
        let v = view();
        PatchPlan {
            namespace: v.namespace,
            name: v.name,
            uid: v.uid,
            kind: PatchKind::ContainerLimits(vec![("app".into(), m)]),
            old_total_m: Some(200),
            new_total_m: m,
            direction: Direction::Lower,
            why: "busy".into(),
        }
    }

    fn answer(outcome: Outcome) -> ResizeAnswer {
        ResizeAnswer {
            outcome,
            generation: None,
        }
    }

    fn run(records: &mut Records, outcome: Outcome) -> Vec<Effect> {
        let v = view();
        let s = Duration::from_secs(10);
        on_outcome(
            records,
            &v,
            &lower_to(100),
            answer(outcome),
            s,
            &mut Jitter::new(1),
            &PolicyConfig::default(),
        )
    }

    #[test]
    fn applied_tracks_the_next_generation_and_remembers_the_patch() {
        let mut m = Records::default();
        let fx = run(&mut m, Outcome::Applied);
        assert_eq!(
            fx[0],
            Effect::Track {
                generation: 2,
                direction: Direction::Lower
            },
            "no generation in the answer: the view's + 1"
        );
        assert_eq!(
            fx[1],
            Effect::Resize(ResizeResult::applied, Direction::Lower)
        );
        assert_eq!(
            m.get(&view().uid)
                .unwrap()
                .last_patch()
                .unwrap()
                .last_target_m,
            100
        );
    }

    #[test]
    fn gate_off_refusal_holds_the_pod_and_unmanages_pod_level() {
        let mut m = Records::default();
        let gate_off = Outcome::Refused {
            refusal: Refusal::PodLevelGateOff,
            message: "gate".into(),
            floor_m: None,
        };
        let fx = run(&mut m, gate_off);
        assert!(fx.contains(&Effect::PodLevelUnsupported));
        assert!(fx.contains(&Effect::PatchError(PatchErrorClass::refused)));
        assert!(!m.may_patch(&view().uid, Duration::from_secs(11)), "held");
        assert_eq!(m.get(&view().uid).unwrap().learned_floor_m(), None);
    }

    #[test]
    fn gone_forbidden_and_transient_answers() {
        let mut m = Records::default();
        assert_eq!(
            run(&mut m, Outcome::NotFound),
            [
                Effect::PatchError(PatchErrorClass::not_found),
                Effect::Forget
            ]
        );
        let fx = run(&mut m, Outcome::Forbidden("rbac".into()));
        assert!(
            matches!(&fx[2], Effect::Log(Log::Forbidden { pause, .. }) if pause.as_secs() == 30)
        );
        assert!(
            !m.may_patch(&Uid::from("other"), Duration::from_secs(11)),
            "node-wide pause"
        );
        let mut m = Records::default();
        let slow = Outcome::Transient {
            class: crate::kube::classify::TransientClass::Throttled,
            message: "slow".into(),
        };
        let fx = run(&mut m, slow);
        assert_eq!(fx[0], Effect::PatchError(PatchErrorClass::throttled));
        assert!(matches!(&fx[2], Effect::Log(Log::BackingOff { .. })));
        assert!(!m.may_patch(&view().uid, Duration::from_secs(10)));
        assert!(m.may_patch(&Uid::from("other"), Duration::from_secs(10)));
    }

    #[test]
    fn dry_run_logs_and_counts_a_target_once() {
        let mut m = Records::default();
        assert_eq!(on_dry_run(&mut m, &lower_to(100)).len(), 2);
        assert!(on_dry_run(&mut m, &lower_to(100)).is_empty());
        assert_eq!(on_dry_run(&mut m, &lower_to(110)).len(), 2);
    }
}
