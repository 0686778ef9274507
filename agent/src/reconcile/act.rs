//! Act: send the planned patches (one re-read and retry after a conflict),
//! and the one pod-level dryRun probe. What an answer means is decided in
//! [`super::outcome`]; this is the I/O around it.

use foldhash::HashMap;
use std::time::Duration;

use super::outcome::{on_dry_run, on_outcome};
use super::{Agent, Round};
use crate::kube::classify::Outcome;
use crate::kube::events::EventApi;
use crate::kube::pods::PodApi;
use crate::kube::resize::{self, ResizeRequest};
use crate::model::PodView;
use crate::policy::{PatchPlan, PolicyConfig, Unmanaged};

/// Wait before asking again after an inconclusive pod-level probe.
const PROBE_RETRY: Duration = Duration::from_secs(30);

/// What the node knows about resizing pods with pod-level resources.
#[derive(Debug, Default)]
pub(super) struct PodLevel {
    /// `None` until probed (or learned from a refusal).
    pub supported: Option<bool>,
    /// No probe before this time (after an inconclusive one).
    pub next_probe: Option<Duration>,
}

impl<P: PodApi, E: EventApi> Agent<P, E> {
    /// Sends every planned patch of a pod this node still has.
    pub(super) async fn act(&mut self, views: &[PodView], patches: &[PatchPlan], now: Duration) {
        let by_uid: HashMap<&str, &PodView> = views.iter().map(|v| (v.uid.as_str(), v)).collect();
        for p in patches {
            if let Some(view) = by_uid.get(p.uid.as_str()) {
                self.act_one(view, p, now).await;
            }
        }
    }

    async fn act_one(&mut self, view: &PodView, p: &PatchPlan, now: Duration) {
        if self.settings.dry_run {
            let effects = on_dry_run(&mut self.records, p);
            self.apply(view, effects, now).await;
            return;
        }
        if !self.records.may_patch(&p.uid, now) {
            return;
        }
        let req = ResizeRequest {
            namespace: view.namespace.to_string(),
            name: view.name.to_string(),
            change: resize::limit_change(view, &p.kind),
            attempted_m: p.new_total_m,
            quantum_m: self.settings.policy.quantum_m,
            dry_run: false,
        };
        let mut answer = self.api.resize(&req).await;
        if answer.outcome == Outcome::Conflict {
            // Re-read; retry once only if the pod is still ours and unchanged in shape.
            match self.api.get(&view.namespace, &view.name).await {
                Ok(Some(fresh))
                    if fresh.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(self.settings.node_name.as_str()) =>
                {
                    answer = self.api.resize(&req).await;
                }
                Ok(_) => answer.outcome = Outcome::NotFound,
                Err(e) => {
                    tracing::warn!(pod = %view.key(), error = %e, "re-read after conflict failed");
                }
            }
        }
        let effects = on_outcome(
            &mut self.records,
            view,
            p,
            answer,
            now,
            &mut self.jitter,
            &self.settings.policy,
        );
        self.apply(view, effects, now).await;
    }
}

impl PodLevel {
    /// One `dryRun=All` resize decides pod-level management for the whole
    /// node: the gate is cluster-wide and the declared feature node-wide, so
    /// the answer does not depend on the pod's shape. An inconclusive answer
    /// (RBAC, transport) is retried after [`PROBE_RETRY`], never every tick.
    pub(super) async fn probe(
        &mut self,
        api: &impl PodApi,
        policy: &PolicyConfig,
        views: &[PodView],
        round: &Round,
        now: Duration,
    ) {
        if self.supported.is_some() || self.next_probe.is_some_and(|t| now < t) {
            return;
        }
        let Some(d) = round
            .decisions
            .iter()
            .find(|d| d.reason() == Some(Unmanaged::PodLevelUnknown))
        else {
            return;
        };
        let Some(v) = views.iter().find(|v| v.uid == d.uid) else {
            return;
        };
        // A value the apiserver can accept: the current pod-level limit, or
        // else the ceiling a pod of this request would get.
        let value = v
            .pod_resources
            .unwrap_or_default()
            .cpu_limit
            .unwrap_or_else(|| crate::policy::floors::scale(v.cpu_request(), policy.ceiling_factor))
            .max(policy.quantum_m);
        let req = resize::pod_level_probe(v, value, policy.quantum_m);
        let answer = api.resize(&req).await;
        match resize::pod_level_support(&answer.outcome) {
            Some(ok) => {
                tracing::info!(pod = %v.key(), supported = ok, "probed pod-level resize support (dryRun=All)");
                self.supported = Some(ok);
            }
            None => {
                self.next_probe = Some(now + PROBE_RETRY);
                tracing::warn!(pod = %v.key(), retry_s = PROBE_RETRY.as_secs(), "pod-level resize probe inconclusive; will retry");
            }
        }
    }
}
