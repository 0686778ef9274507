//! Check: follow in-flight resizes until `cpu.max` shows them, and audit
//! every pod's cgroups for drift on full scans (the pure parts are in
//! [`crate::verify`]).

use foldhash::{HashMap, HashSet};
use std::time::Duration;

use super::Agent;
use super::observe::Observation;
use super::outcome::{drift_uid, on_drift, on_resize_outcome};
use crate::cgroup::{Driver, PodCgroup};
use crate::kube::events::EventApi;
use crate::kube::pods::PodApi;
use crate::model::{CgroupPodId, PodView, Uid};
use crate::verify::{self, DriftEvent, ResizeOutcome};

/// Whether `cg` holds what `view`'s spec asks for. `patched_generation`: the
/// generation of the resize in flight; a pod cache still at an older
/// generation holds the pre-patch spec, which the cgroups match trivially,
/// and that would verify a resize never applied.
pub fn cgroups_match(
    view: &PodView,
    cg: Option<&PodCgroup>,
    patched_generation: Option<i64>,
    driver: Driver,
) -> bool {
    let spec_current = patched_generation.is_none_or(|g| view.generation >= g);
    spec_current
        && cg.is_some_and(|cg| {
            let period = cg.sample.as_ref().map_or(100_000, |s| s.cpu_max.period_us);
            let expected = verify::expected_cpu_max(view, period);
            verify::compare(&expected, cg, driver).is_empty()
        })
}

impl<P: PodApi, E: EventApi> Agent<P, E> {
    pub(super) async fn check(&mut self, obs: &Observation, now: Duration) {
        let cgroups: HashMap<&CgroupPodId, &PodCgroup> =
            obs.cur.pods.iter().map(|p| (&p.id, p)).collect();
        let outcomes = self.verify_resizes(&obs.views, &cgroups, now).await;
        let mut drift_events = Vec::new();
        let grace = self.settings.drift_grace;
        if obs.full {
            for a in verify::audit_snapshot(obs.views.iter(), &obs.cur) {
                // A pod that matches and never drifted needs no record.
                let drift = match self.records.get_mut(&a.uid) {
                    Some(r) => r.drift_mut(),
                    None if a.mismatches.is_empty() => continue,
                    None => self.records.entry(&a.uid).drift_mut(),
                };
                drift_events.extend(drift.observe_pod(&a.uid, &a.mismatches, now, grace));
            }
        }
        let mut live: HashSet<&Uid> =
            HashSet::with_capacity_and_hasher(obs.views.len(), Default::default());
        live.extend(
            obs.views
                .iter()
                .filter(|v| v.is_running() && !v.terminating)
                .map(|v| &v.uid),
        );
        for (uid, r) in self.records.iter_mut() {
            if !live.contains(uid) {
                drift_events.extend(r.drift_mut().forget(uid));
            }
        }
        let mut judged = Vec::new();
        for ev in outcomes {
            tracing::debug!(?ev, "resize verification");
            let (uid, verified) = match &ev {
                ResizeOutcome::Verified { uid, .. } => (uid, true),
                ResizeOutcome::Unverified { uid, .. } | ResizeOutcome::Overtaken { uid, .. } => {
                    (uid, false)
                }
            };
            judged.extend(self.scan.claims.resize_done(uid, verified, now));
        }
        self.report_checked(&obs.views, &judged, now).await;
        self.report_drift(&obs.views, drift_events, now).await;
    }

    /// Follows in-flight resizes until verified in `cpu.max` (or not).
    async fn verify_resizes(
        &mut self,
        views: &[PodView],
        cgroups: &HashMap<&CgroupPodId, &PodCgroup>,
        now: Duration,
    ) -> Vec<ResizeOutcome> {
        let mut out = Vec::new();
        let grace = self.settings.drift_grace;
        let wall_clock_s = crate::policy::writers::wall_clock_s();
        for v in views {
            let Some(r) = self.records.get_mut(&v.uid).and_then(|r| r.resize_mut()) else {
                continue;
            };
            // Another writer's resize of the pod since this one: the
            // cgroups will show its value, which is not Headroom's to verify.
            if let Some(w) = crate::policy::writers::yields_to(v, wall_clock_s) {
                let o = ResizeOutcome::Overtaken {
                    uid: v.uid.clone(),
                    generation: r.generation(),
                    by: w.manager.clone(),
                };
                let direction = r.direction();
                if let Some(rec) = self.records.get_mut(&v.uid) {
                    rec.resize_ended();
                }
                self.apply(v, on_resize_outcome(&o, direction), now).await;
                out.push(o);
                continue;
            }
            r.kubelet_status(&v.resize, now);
            let matches = cgroups_match(
                v,
                cgroups.get(&v.cgroup_id).copied(),
                Some(r.generation()),
                self.layout.driver,
            );
            let direction = r.direction();
            if let Some(o) = r.checked(&v.uid, matches, now, grace) {
                if let Some(rec) = self.records.get_mut(&v.uid) {
                    rec.resize_ended();
                }
                self.apply(v, on_resize_outcome(&o, direction), now).await;
                out.push(o);
            }
        }
        out
    }

    async fn report_drift(&mut self, views: &[PodView], events: Vec<DriftEvent>, now: Duration) {
        for ev in events {
            let Some(v) = views.iter().find(|v| &v.uid == drift_uid(&ev)) else {
                continue;
            };
            self.apply(v, on_drift(ev, now), now).await;
        }
    }
}
