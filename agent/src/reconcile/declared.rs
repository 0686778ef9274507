//! The limits each Burstable pod's workload declares, so the default
//! ceiling never falls below them: the pod's own limits while they are not
//! Headroom's (`managedFields`), else its controller's pod template
//! (read-only `get`, at most a few per tick, retried after a failure). A pod
//! with neither (no owner, limits set by an earlier agent) keeps its current
//! limit as the ceiling's lower bound (`policy::declared_limit`).

use foldhash::{HashMap, HashSet};
use std::time::Duration;

use super::records::Records;
use crate::kube::pods::PodApi;
use crate::model::{DeclaredLimits, PodView, Qos, Uid};

/// Wait before reading an owner's pod template again after a failure.
const TEMPLATE_RETRY: Duration = Duration::from_secs(300);
/// Owner templates read per tick at most (a restart on a full node must not
/// burst the apiserver).
const TEMPLATES_PER_TICK: usize = 5;

/// Owners' pod templates read so far, by owner uid.
#[derive(Debug, Default)]
pub(super) struct Templates {
    /// Declared limits of owners' pod templates.
    limits: HashMap<Uid, DeclaredLimits>,
    /// Owners whose template could not be read: when to try again.
    retry: HashMap<Uid, Duration>,
}

impl Templates {
    /// Forgets owners no pod of this node names any more.
    fn retain_owners_of(&mut self, views: &[PodView]) {
        let owners: HashSet<&str> = views
            .iter()
            .filter_map(|v| v.owner.as_ref().map(|o| o.uid.as_str()))
            .collect();
        self.limits.retain(|u, _| owners.contains(u.as_str()));
        self.retry.retain(|u, _| owners.contains(u.as_str()));
    }

    /// Learns the declared limits of this tick's pods into their records
    /// (see the module docs), reading owners' templates through `api`.
    pub(super) async fn learn(
        &mut self,
        api: &impl PodApi,
        records: &mut Records,
        views: &[PodView],
        now: Duration,
    ) {
        let mut reads = 0;
        for v in views.iter().filter(|v| v.qos == Qos::Burstable) {
            if !v.limits_set_by_headroom {
                let known = records.get(&v.uid).and_then(|r| r.declared());
                if !known.is_some_and(|d| d.is_of(v)) {
                    records.entry(&v.uid).declare(DeclaredLimits::of(v));
                }
                continue;
            }
            if records.get(&v.uid).is_some_and(|r| r.declared().is_some()) {
                continue;
            }
            let Some(owner) = v.owner.as_ref() else {
                continue;
            };
            if let Some(t) = self.limits.get(&owner.uid) {
                records.entry(&v.uid).declare(t.clone());
                continue;
            }
            if reads >= TEMPLATES_PER_TICK || self.retry.get(&owner.uid).is_some_and(|t| now < *t) {
                continue;
            }
            reads += 1;
            let owner_name = format!("{}/{}", owner.kind, owner.name);
            match api.template_limits(&v.namespace, owner).await {
                Ok(Some(t)) => {
                    tracing::info!(pod = %v.key(), owner = %owner_name, "declared limits read from the owner's pod template");
                    self.limits.insert(owner.uid.clone(), t.clone());
                    records.entry(&v.uid).declare(t);
                }
                Ok(None) => {
                    self.retry.insert(owner.uid.clone(), now + TEMPLATE_RETRY);
                    tracing::info!(pod = %v.key(), owner = %owner_name, "no pod template to read declared limits from; the ceiling stays at least the current limit");
                }
                Err(e) => {
                    self.retry.insert(owner.uid.clone(), now + TEMPLATE_RETRY);
                    tracing::warn!(pod = %v.key(), error = %e, retry_s = TEMPLATE_RETRY.as_secs(), "owner's pod template unreadable; the ceiling stays at least the current limit");
                }
            }
        }
        self.retain_owners_of(views);
    }
}
