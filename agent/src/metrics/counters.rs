//! Setters of the counters: resizes by result, failed patches by class,
//! scan errors by kind, detected drifts by kind of cgroup.

use super::labels::{
    CgroupKind, Direction, DriftEventLabels, LoweringEffect, LoweringLabels, PatchErrorClass,
    PatchErrorLabels, ResizeLabels, ResizeResult, ScanErrorKind, ScanErrorLabels,
};
use super::registry::Metrics;
use crate::model::Target;

impl Metrics {
    pub fn scan_error(&self, kind: ScanErrorKind) {
        self.scan_errors
            .get_or_create(&ScanErrorLabels { kind })
            .inc();
    }

    pub fn resize(&self, result: ResizeResult, direction: Direction) {
        self.resizes
            .get_or_create(&ResizeLabels { result, direction })
            .inc();
    }

    pub fn resize_verified(&self, direction: Direction, latency_seconds: f64) {
        self.resize(ResizeResult::verified, direction);
        self.resize_latency.observe(latency_seconds);
    }

    pub fn patch_error(&self, class: PatchErrorClass) {
        self.patch_errors
            .get_or_create(&PatchErrorLabels { class })
            .inc();
    }

    /// A new drift was detected (count it; the gauge is [`Metrics::set_drift`]).
    /// `headroom_lowerings_total{effect}` + 1.
    pub fn lowering_checked(&self, effect: LoweringEffect) {
        self.lowerings
            .get_or_create(&LoweringLabels { effect })
            .inc();
    }

    pub fn drift_detected(&self, target: &Target) {
        let cgroup = match target {
            Target::Pod => CgroupKind::pod,
            Target::Container(_) => CgroupKind::container,
        };
        self.drift_events
            .get_or_create(&DriftEventLabels { cgroup })
            .inc();
    }
}
