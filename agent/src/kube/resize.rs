//! Sends resize patches (and dry-run probes) to the `resize` subresource and
//! classifies the answer. The only code in Headroom that writes to a Pod.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};

use super::classify::{Outcome, classify};
use super::patch::{LimitChange, resize_body};
use crate::model::Millis;

pub use crate::model::FIELD_MANAGER;

/// Patches `pods/resize` with a strategic-merge body. `attempted_m` is the
/// total (or pod-level) limit asked for, used to learn floors from refusals.
pub async fn send(
    api: &Api<Pod>,
    name: &str,
    change: &LimitChange,
    attempted_m: Millis,
    quantum_m: Millis,
    dry_run: bool,
) -> (Outcome, Option<Pod>) {
    let mut pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    if dry_run {
        pp = pp.dry_run();
    }
    let body = resize_body(change);
    match api.patch_resize(name, &pp, &Patch::Strategic(&body)).await {
        Ok(pod) => (Outcome::Applied, Some(pod)),
        Err(e) => (classify(&e, attempted_m, quantum_m), None),
    }
}

/// Whether this cluster admits resizes of pods with pod-level resources
/// (`InPlacePodLevelResourcesVerticalScaling`), by a `dryRun=All` resize of
/// the pod-level limit. `None` when the answer says nothing about the gate
/// (transient error, RBAC): ask again later.
pub async fn probe_pod_level(
    api: &Api<Pod>,
    name: &str,
    limit_m: Millis,
    quantum_m: Millis,
) -> Option<bool> {
    let (outcome, _) = send(
        api,
        name,
        &LimitChange::Pod(limit_m),
        limit_m,
        quantum_m,
        true,
    )
    .await;
    match outcome {
        Outcome::Applied => Some(true),
        Outcome::Refused {
            refusal: super::classify::Refusal::PodLevelGateOff,
            ..
        } => Some(false),
        // Refused for another reason (e.g. a floor): the gate itself let it
        // through to validation, so resizes of this shape are possible.
        Outcome::Refused { .. } => Some(true),
        _ => None,
    }
}
