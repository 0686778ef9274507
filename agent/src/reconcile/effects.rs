//! The one executor of [`Effect`]s: metrics, Events, logs and the agent's
//! per-pod state. Every decision was made before; this only carries it out.

use std::time::Duration;

use super::Agent;
use super::outcome::{Effect, Log};
use crate::kube::events::EventApi;
use crate::kube::pods::PodApi;
use crate::metrics;
use crate::model::PodView;

impl<P: PodApi, E: EventApi> Agent<P, E> {
    /// Carries out `effects` about `view`, in order.
    pub(super) async fn apply(&mut self, view: &PodView, effects: Vec<Effect>, now: Duration) {
        for e in effects {
            match e {
                Effect::PatchError(class) => self.metrics.patch_error(class),
                Effect::Resize(result, d) => self.metrics.resize(result, d),
                Effect::Verified { direction, latency } => self
                    .metrics
                    .resize_verified(direction, latency.as_secs_f64()),
                Effect::Drift { target, drifting } => {
                    self.metrics
                        .set_drift(&view.namespace, &view.name, &target, drifting);
                }
                Effect::DriftDetected(target) => self.metrics.drift_detected(&target),
                Effect::Event {
                    type_,
                    reason,
                    note,
                } => {
                    let sent = self.records.entry(&view.uid).events_mut();
                    self.events
                        .publish(view, sent, type_, reason, note, now)
                        .await;
                }
                Effect::Log(line) => log(view, &line),
                Effect::Forget => self.forget(&view.uid),
                Effect::Track {
                    generation,
                    direction,
                } => {
                    if let Some(d) = self.records.track(&view.uid, generation, direction, now) {
                        self.metrics.resize(metrics::ResizeResult::superseded, d);
                    }
                }
                Effect::PodLevelUnsupported => self.pod_level.supported = Some(false),
            }
        }
    }
}

fn log(view: &PodView, line: &Log) {
    let pod = view.key();
    match line {
        Log::DryRun { old, new, why } => {
            tracing::info!(pod = %pod, %old, %new, %why, "dry-run: would resize");
        }
        Log::Resized {
            old,
            new,
            generation,
            why,
        } => tracing::info!(pod = %pod, %old, %new, generation, %why, "resized"),
        Log::Refused {
            reason,
            learned_floor,
            message,
        } => {
            let learned_floor = learned_floor.map_or_else(|| "-".to_string(), |m| format!("{m}m"));
            tracing::warn!(pod = %pod, reason, %learned_floor, %message, "resize refused");
        }
        Log::Forbidden { message, pause } => tracing::error!(
            pod = %pod, %message, pause_s = pause.as_secs(),
            "resize forbidden (RBAC or admission policy): configuration alarm; pausing all patches"
        ),
        Log::BackingOff {
            class,
            message,
            retry_in,
        } => tracing::warn!(
            pod = %pod, class = ?class, %message, retry_in_ms = retry_in.as_millis() as u64,
            "resize failed; backing off"
        ),
        Log::Verified {
            generation,
            latency,
        } => tracing::info!(
            pod = %pod, generation, latency_ms = latency.as_millis() as u64,
            "resize verified in cpu.max"
        ),
        Log::Unverified {
            generation,
            kubelet_done,
            waited,
        } => tracing::warn!(
            pod = %pod, generation, kubelet_done, waited_s = waited.as_secs(),
            "resize not seen in cpu.max within grace"
        ),
        Log::Overtaken { generation, by } => tracing::info!(
            pod = %pod, generation, by = %by,
            "resize overtaken by another writer's before it showed in cpu.max; not verified as Headroom's"
        ),
        Log::Drift { mismatch, lasting } => tracing::warn!(
            pod = %pod, cgroup = %mismatch.target, %mismatch, for_s = lasting.as_secs(),
            "cgroup drift"
        ),
        Log::DriftChanged { mismatch } => tracing::warn!(
            pod = %pod, cgroup = %mismatch.target, %mismatch, "cgroup drift changed"
        ),
        Log::DriftCleared { target, lasted } => tracing::info!(
            pod = %pod, cgroup = %target, lasted_s = lasted.as_secs(), "cgroup drift cleared"
        ),
        Log::Yielded(y) => tracing::info!(
            pod = %pod, manager = %y.manager, limits = %y.limits.join(","),
            changed_at = y.changed_at.as_deref().unwrap_or("-"), why = %y.describe(),
            "yielding to another writer"
        ),
        Log::YieldEnded => tracing::info!(pod = %pod, "no longer yielding to another writer"),
        Log::LoweringChecked {
            owed,
            effect,
            from_m,
            to_m,
            gained_m,
            wait_fell_m,
            usage_before_m,
            usage_after_m,
            window,
            bar_m,
        } => tracing::info!(
            pod = %pod, %owed, effect = %effect, from_m, to_m, gained_m, wait_fell_m, usage_before_m,
            usage_after_m = usage_after_m.map_or(-1, |m| m as i64), window, bar_m,
            "lowering checked"
        ),
    }
}
