//! The resize state machine of one pod: generation bump → `PodResizeInProgress`
//! → (after `resize_delay`) cgroups written → (after `status_delay`) status caught
//! up and the condition cleared. Pure: the caller does the writes.

use std::time::{Duration, Instant};

use super::faults::Fault;
use super::plan::PodPlan;

#[derive(Debug, Clone)]
pub struct ResizeState {
    pub generation: i64,
    pub target: PodPlan,
    pub apply_at: Instant,
    pub applied_at: Option<Instant>,
}

/// What a generation bump means for the pod.
#[derive(Debug, Clone, PartialEq)]
pub enum OnGeneration {
    /// Resources unchanged and nothing in flight: just report the generation.
    Observe,
    /// (Re)start a resize toward the new spec.
    Start,
}

/// Decides what a new spec generation starts. A bump during a resize restarts it
/// toward the newest spec, as the kubelet re-syncs to the latest allocation.
pub fn on_generation(in_flight: bool, applied: &PodPlan, spec: &PodPlan) -> OnGeneration {
    if in_flight || !same_resources(applied, spec) {
        OnGeneration::Start
    } else {
        OnGeneration::Observe
    }
}

/// Equal for resizing purposes (the QoS class is fixed for a pod's life).
pub fn same_resources(a: &PodPlan, b: &PodPlan) -> bool {
    a.containers == b.containers
        && a.pod_requests == b.pod_requests
        && a.pod_limits == b.pod_limits
        && a.overhead_m == b.overhead_m
}

/// The next thing to do for a resize in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Wait,
    /// Write the target's cgroup values now.
    Apply,
    /// Report the target in status and clear the condition; the resize is over.
    Report,
}

impl ResizeState {
    pub fn new(generation: i64, target: PodPlan, now: Instant, resize_delay: Duration) -> Self {
        ResizeState {
            generation,
            target,
            apply_at: now + resize_delay,
            applied_at: None,
        }
    }

    /// Advances the machine; `fault` is read at each step so tests may switch it
    /// (clearing `StaleStatus` lets a held status through at the next step).
    pub fn step(&mut self, now: Instant, fault: &Fault, status_delay: Duration) -> Step {
        match self.applied_at {
            None if now >= self.apply_at && !fault.blocks_apply() => {
                self.applied_at = Some(now);
                Step::Apply
            }
            Some(t) if now >= t + status_delay + fault.extra_status_delay() => Step::Report,
            _ => Step::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn plan(limit: &str) -> PodPlan {
        let pod: Pod = serde_json::from_value(serde_json::json!({"spec": {"containers": [
            {"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": limit}}}
        ]}, "status": {"qosClass": "Burstable"}}))
        .expect("pod");
        PodPlan::from_pod(&pod).expect("plan")
    }

    #[test]
    fn generation_without_resource_change_is_only_observed() {
        assert_eq!(
            on_generation(false, &plan("500m"), &plan("500m")),
            OnGeneration::Observe
        );
        assert_eq!(
            on_generation(false, &plan("500m"), &plan("800m")),
            OnGeneration::Start
        );
        assert_eq!(
            on_generation(true, &plan("500m"), &plan("500m")),
            OnGeneration::Start
        );
    }

    #[test]
    fn applies_after_delay_then_reports_after_status_delay() {
        let t0 = Instant::now();
        let d = Duration::from_secs(1);
        let mut r = ResizeState::new(2, plan("800m"), t0, d);
        assert_eq!(r.step(t0, &Fault::None, d), Step::Wait);
        assert_eq!(r.step(t0 + d, &Fault::None, d), Step::Apply);
        assert_eq!(r.step(t0 + d, &Fault::None, d), Step::Wait);
        assert_eq!(r.step(t0 + 2 * d, &Fault::None, d), Step::Report);
    }

    #[test]
    fn never_apply_holds_and_stale_status_lags() {
        let t0 = Instant::now();
        let d = Duration::from_secs(1);
        let mut r = ResizeState::new(2, plan("800m"), t0, Duration::ZERO);
        assert_eq!(r.step(t0 + 10 * d, &Fault::NeverApply, d), Step::Wait);
        let stale = Fault::StaleStatus(5 * d);
        assert_eq!(r.step(t0 + 10 * d, &stale, d), Step::Apply);
        assert_eq!(r.step(t0 + 12 * d, &stale, d), Step::Wait);
        assert_eq!(r.step(t0 + 16 * d, &stale, d), Step::Report);
        assert_eq!(r.step(t0 + 12 * d, &Fault::None, d), Step::Report);
    }
}
