//! Sends resize patches (and dry-run probes) to the `resize` subresource and
//! classifies the answer. The only code in Headroom that writes to a Pod.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};

use super::classify::{Outcome, Refusal, classify};
use super::patch::{ContainerLimit, LimitChange, resize_body};
use crate::model::{ContainerKind, Millis, PodView};
use crate::policy::PatchKind;

pub use crate::model::FIELD_MANAGER;

/// One resize to send: which pod, what to write, and how to read a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeRequest {
    pub namespace: String,
    pub name: String,
    pub change: LimitChange,
    /// The total (or pod-level) limit asked for, used to learn floors from
    /// refusals.
    pub attempted_m: Millis,
    pub quantum_m: Millis,
    /// `dryRun=All`: validated and admitted, never stored.
    pub dry_run: bool,
}

/// The apiserver's answer to a resize, classified.
#[derive(Debug, Clone, PartialEq)]
pub struct ResizeAnswer {
    pub outcome: Outcome,
    /// `metadata.generation` of the patched pod, when it was applied.
    pub generation: Option<i64>,
}

/// Patches `pods/resize` with a strategic-merge body.
pub async fn send(api: &Api<Pod>, req: &ResizeRequest) -> ResizeAnswer {
    let mut pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    if req.dry_run {
        pp = pp.dry_run();
    }
    let body = resize_body(&req.change);
    match api
        .patch_resize(&req.name, &pp, &Patch::Strategic(&body))
        .await
    {
        Ok(pod) => ResizeAnswer {
            outcome: Outcome::Applied,
            generation: pod.metadata.generation,
        },
        Err(e) => ResizeAnswer {
            outcome: classify(&e, req.attempted_m, req.quantum_m),
            generation: None,
        },
    }
}

/// The `dryRun=All` resize of a pod-level limit that asks whether this
/// cluster admits resizes of pods with pod-level resources
/// (`InPlacePodLevelResourcesVerticalScaling`).
pub fn pod_level_probe(view: &PodView, limit_m: Millis, quantum_m: Millis) -> ResizeRequest {
    ResizeRequest {
        namespace: view.namespace.to_string(),
        name: view.name.to_string(),
        change: LimitChange::Pod(limit_m),
        attempted_m: limit_m,
        quantum_m,
        dry_run: true,
    }
}

/// What the probe's answer says about pod-level resize support. `None`
/// when it says nothing about the gate (transient error, RBAC): ask again
/// later.
pub fn pod_level_support(outcome: &Outcome) -> Option<bool> {
    match outcome {
        Outcome::Applied => Some(true),
        Outcome::Refused {
            refusal: Refusal::PodLevelGateOff,
            ..
        } => Some(false),
        // Refused for another reason (e.g. a floor): the gate itself let it
        // through to validation, so resizes of this shape are possible.
        Outcome::Refused { .. } => Some(true),
        _ => None,
    }
}

/// Policy plan → patch body input; sidecars keep their `initContainers` key.
pub fn limit_change(view: &PodView, kind: &PatchKind) -> LimitChange {
    match kind {
        PatchKind::PodLimit(m) => LimitChange::Pod(*m),
        PatchKind::ContainerLimits(cs) => LimitChange::Containers(
            cs.iter()
                .map(|(name, m)| ContainerLimit {
                    name: name.clone(),
                    kind: view
                        .containers
                        .iter()
                        .find(|c| *c.name == **name)
                        .map_or(ContainerKind::App, |c| c.kind),
                    cpu_limit_m: *m,
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::classify::TransientClass;

    #[test]
    fn limit_change_keeps_each_container_kind() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [{"name": "app"}],
                "initContainers": [{"name": "proxy", "restartPolicy": "Always"}]}
        }))
        .unwrap();
        let view = PodView::try_from(&pod).unwrap();
        let kind = PatchKind::ContainerLimits(vec![("app".into(), 300), ("proxy".into(), 200)]);
        let kinds: Vec<(String, ContainerKind, Millis)> = match limit_change(&view, &kind) {
            LimitChange::Containers(cs) => cs
                .into_iter()
                .map(|c| (c.name, c.kind, c.cpu_limit_m))
                .collect(),
            LimitChange::Pod(_) => panic!("container limits expected"),
        };
        assert_eq!(
            kinds,
            [
                ("app".into(), ContainerKind::App, 300),
                ("proxy".into(), ContainerKind::Sidecar, 200)
            ]
        );
        assert_eq!(
            limit_change(&view, &PatchKind::PodLimit(450)),
            LimitChange::Pod(450)
        );
    }

    #[test]
    fn probe_answers_map_to_support() {
        let refused = |refusal| Outcome::Refused {
            refusal,
            message: String::new(),
            floor_m: None,
        };
        assert_eq!(pod_level_support(&Outcome::Applied), Some(true));
        assert_eq!(
            pod_level_support(&refused(Refusal::PodLevelGateOff)),
            Some(false)
        );
        assert_eq!(
            pod_level_support(&refused(Refusal::BelowRequest)),
            Some(true)
        );
        assert_eq!(pod_level_support(&Outcome::Forbidden("rbac".into())), None);
        assert_eq!(
            pod_level_support(&Outcome::Transient {
                class: TransientClass::ServerError,
                message: String::new()
            }),
            None
        );
    }
}
