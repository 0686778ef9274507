//! Turns every apiserver answer to a resize into a typed outcome the
//! reconciler can act on: refusals with a reason (and, where the message
//! reveals one, a floor), conflicts, vanished pods, RBAC/admission denials,
//! and transient errors to back off from.

use crate::metrics::PatchErrorClass;
use crate::model::Millis;
use crate::quantity;

/// Why the apiserver refused a resize (texts: docs/kubelet-behaviour.md §3–4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    QosChange,
    RequestsRemoved,
    LimitsRemoved,
    NotMutable,
    StaticPod,
    WindowsPod,
    /// Pod-level resources with `InPlacePodLevelResourcesVerticalScaling` off.
    PodLevelGateOff,
    /// The Node does not declare a feature the resize needs
    /// (`status.declaredFeatures`, e.g. InPlacePodLevelResourcesVerticalScaling).
    NodeLacksFeature,
    /// Pod-level limit under a container's own limit.
    BelowContainerLimit,
    /// Limit under the request.
    BelowRequest,
    /// Any other 422/400.
    Invalid,
}

impl Refusal {
    /// Stable label for metrics and events.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refusal::QosChange => "qos_change",
            Refusal::RequestsRemoved => "requests_removed",
            Refusal::LimitsRemoved => "limits_removed",
            Refusal::NotMutable => "not_mutable",
            Refusal::StaticPod => "static_pod",
            Refusal::WindowsPod => "windows_pod",
            Refusal::PodLevelGateOff => "pod_level_gate_off",
            Refusal::NodeLacksFeature => "node_lacks_feature",
            Refusal::BelowContainerLimit => "below_container_limit",
            Refusal::BelowRequest => "below_request",
            Refusal::Invalid => "invalid",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Applied,
    Refused {
        refusal: Refusal,
        message: String,
        /// A floor the message proves: never patch below it again.
        floor_m: Option<Millis>,
    },
    /// 409: the object changed under us; re-read and retry once.
    Conflict,
    /// 404: the pod is gone; forget it.
    NotFound,
    /// 403 or 401: RBAC or admission policy; a configuration alarm.
    Forbidden(String),
    /// 429, 5xx, timeouts and transport errors: back off with jitter.
    Transient {
        class: TransientClass,
        message: String,
    },
}

/// The kinds of failure that are worth a retry after a backoff: the
/// transient subset of [`PatchErrorClass`], so an `Outcome::Transient` cannot
/// hold a refusal's or a conflict's label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransientClass {
    /// No answer: timeout, connection, TLS.
    Transport,
    /// 403 while the pod's Node object is being registered again.
    NodeNotFound,
    /// 429.
    Throttled,
    /// 5xx.
    ServerError,
    /// Any other status code.
    Unexpected,
}

impl From<TransientClass> for PatchErrorClass {
    fn from(c: TransientClass) -> Self {
        match c {
            TransientClass::Transport => PatchErrorClass::transport,
            TransientClass::NodeNotFound => PatchErrorClass::node_not_found,
            TransientClass::Throttled => PatchErrorClass::throttled,
            TransientClass::ServerError => PatchErrorClass::server_error,
            TransientClass::Unexpected => PatchErrorClass::unexpected,
        }
    }
}

impl Outcome {
    /// The `headroom_patch_errors_total{class}` label a failed patch counts
    /// under; `None` for an applied one.
    pub fn error_class(&self) -> Option<PatchErrorClass> {
        match self {
            Outcome::Applied => None,
            Outcome::Refused { .. } => Some(PatchErrorClass::refused),
            Outcome::Conflict => Some(PatchErrorClass::conflict),
            Outcome::NotFound => Some(PatchErrorClass::not_found),
            Outcome::Forbidden(_) => Some(PatchErrorClass::forbidden),
            Outcome::Transient { class, .. } => Some((*class).into()),
        }
    }
}

/// Classifies a failed request. `attempted_m` is the CPU limit the patch
/// asked for (pod total or pod-level), used to learn a QoS floor.
pub fn classify(err: &kube::Error, attempted_m: Millis, quantum_m: Millis) -> Outcome {
    match err {
        kube::Error::Api(status) => {
            classify_status(status.code, &status.message, attempted_m, quantum_m)
        }
        other => Outcome::Transient {
            class: TransientClass::Transport,
            message: other.to_string(),
        },
    }
}

/// Classifies an apiserver `Status` by code and message.
pub fn classify_status(
    code: u16,
    message: &str,
    attempted_m: Millis,
    quantum_m: Millis,
) -> Outcome {
    let message = message.to_string();
    match code {
        404 => Outcome::NotFound,
        409 => Outcome::Conflict,
        // Resize admission cannot find the pod's Node: the Node object is
        // being deleted and registered again, which passes. Not an RBAC or
        // policy alarm: that would stop every patch of the node for 30 s,
        // doubling per 403 up to 10 min, long after the Node is back.
        // Back off per pod instead (found by tests/tests/agent_faults.rs).
        403 if is_node_not_found(&message) => Outcome::Transient {
            class: TransientClass::NodeNotFound,
            message,
        },
        401 | 403 if !is_refusal_403(&message) => Outcome::Forbidden(message),
        429 => Outcome::Transient {
            class: TransientClass::Throttled,
            message,
        },
        500..=599 => Outcome::Transient {
            class: TransientClass::ServerError,
            message,
        },
        400 | 403 | 422 => {
            let (refusal, floor_m) = refusal_of(&message, attempted_m, quantum_m);
            Outcome::Refused {
                refusal,
                message,
                floor_m,
            }
        }
        _ => Outcome::Transient {
            class: TransientClass::Unexpected,
            message,
        },
    }
}

/// kube-apiserver 1.37's resize admission for a pod whose `spec.nodeName`
/// is not a Node it knows: `pods "p" is forbidden: node "n" not found`.
fn is_node_not_found(msg: &str) -> bool {
    msg.split_once("forbidden: node \"")
        .is_some_and(|(_, rest)| rest.ends_with("\" not found"))
}

/// 403s that are about the pod or node, not about who asks: admission
/// answers to treat as refusals rather than RBAC alarms.
fn is_refusal_403(msg: &str) -> bool {
    msg.contains("resize of pods with pod-level resources is forbidden")
        || (msg.contains("requires features") && msg.contains("not available on node"))
}

fn refusal_of(msg: &str, attempted_m: Millis, quantum_m: Millis) -> (Refusal, Option<Millis>) {
    if msg.contains("Pod QOS Class may not change as a result of resizing") {
        // Pod e (docs/kubelet-behaviour.md §4): at the request it would turn Guaranteed; one
        // quantum above is admitted.
        return (
            Refusal::QosChange,
            Some(attempted_m.saturating_add(quantum_m.max(1))),
        );
    }
    if msg.contains("resize of pods with pod-level resources is forbidden") {
        return (Refusal::PodLevelGateOff, None);
    }
    if msg.contains("requires features") && msg.contains("not available on node") {
        return (Refusal::NodeLacksFeature, None);
    }
    if msg.contains("resource requests cannot be removed") {
        return (Refusal::RequestsRemoved, None);
    }
    if msg.contains("resource limits cannot be removed") {
        return (Refusal::LimitsRemoved, None);
    }
    if msg.contains("only cpu and memory resources are mutable") {
        return (Refusal::NotMutable, None);
    }
    if msg.contains("static pods cannot be resized") {
        return (Refusal::StaticPod, None);
    }
    if msg.contains("windows pods cannot be resized") {
        return (Refusal::WindowsPod, None);
    }
    if msg.contains("must be less than or equal to pod limits") {
        // `...[cpu].limits: Invalid value: "400m": must be less than or equal to pod limits of 300m`
        return (Refusal::BelowContainerLimit, invalid_value(msg));
    }
    if msg.contains("must be less than or equal to cpu limit") {
        // `spec.resources.requests: Invalid value: "110m": must be less than or equal to cpu limit of 100m`
        return (Refusal::BelowRequest, invalid_value(msg));
    }
    (Refusal::Invalid, None)
}

/// The quantity in the first `Invalid value: "<q>"` of a message.
fn invalid_value(msg: &str) -> Option<Millis> {
    let rest = msg.split_once("Invalid value: \"")?.1;
    let q = rest.split_once('"')?.0;
    quantity::cpu_millis(q).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, msg: &str, attempted: Millis) -> (Refusal, Option<Millis>) {
        match classify_status(code, msg, attempted, 10) {
            Outcome::Refused {
                refusal, floor_m, ..
            } => (refusal, floor_m),
            o => panic!("expected a refusal, got {o:?}"),
        }
    }

    #[test]
    fn qos_refusal_learns_one_quantum_above() {
        let msg = "Pod \"e\" is invalid: spec: Forbidden: Pod QOS Class may not change as a result of resizing";
        assert_eq!(refused(422, msg, 100), (Refusal::QosChange, Some(110)));
    }

    #[test]
    fn pod_level_container_limit_refusal_reveals_floor() {
        let msg = "Pod \"b\" is invalid: spec.resources.containers[0][cpu].limits: Invalid value: \"400m\": must be less than or equal to pod limits of 300m";
        assert_eq!(
            refused(422, msg, 300),
            (Refusal::BelowContainerLimit, Some(400))
        );
    }

    #[test]
    fn pod_level_request_refusal_reveals_floor() {
        let msg = "Pod \"c\" is invalid: spec.resources.requests: Invalid value: \"110m\": must be less than or equal to cpu limit of 100m";
        assert_eq!(refused(422, msg, 100), (Refusal::BelowRequest, Some(110)));
    }

    #[test]
    fn gate_off_is_a_refusal_not_an_rbac_alarm() {
        let msg = "The Pod \"a\" is invalid: []: Forbidden: resize of pods with pod-level resources is forbidden when InPlacePodLevelResourcesVerticalScalingEnabled feature gate is disabled";
        assert_eq!(refused(422, msg, 800), (Refusal::PodLevelGateOff, None));
    }

    #[test]
    fn undeclared_node_feature_is_a_refusal_not_an_rbac_alarm() {
        // Seen on kube-apiserver 1.37.2 when the Node's status.declaredFeatures
        // lacks the pod-level resize feature.
        let msg = "pods \"p\" is forbidden: pod update requires features InPlacePodLevelResourcesVerticalScaling which are not available on node \"n1\"";
        assert_eq!(refused(403, msg, 800), (Refusal::NodeLacksFeature, None));
        assert!(matches!(
            classify_status(
                403,
                "pods \"p\" is forbidden: User \"x\" cannot patch resource \"pods/resize\"",
                1,
                10
            ),
            Outcome::Forbidden(_)
        ));
    }

    #[test]
    fn missing_node_is_transient_not_an_rbac_alarm() {
        // kube-apiserver 1.37.2 while the pod's Node object is deleted.
        let msg = "pods \"b\" is forbidden: node \"n1\" not found";
        assert!(matches!(
            classify_status(403, msg, 400, 10),
            Outcome::Transient {
                class: TransientClass::NodeNotFound,
                ..
            }
        ));
        assert!(matches!(
            classify_status(
                403,
                "pods \"b\" is forbidden: node \"n1\" not found by policy x",
                1,
                10
            ),
            Outcome::Forbidden(_)
        ));
    }

    #[test]
    fn every_fixed_text_maps_to_its_reason() {
        for (msg, want) in [
            (
                "resource requests cannot be removed",
                Refusal::RequestsRemoved,
            ),
            ("resource limits cannot be removed", Refusal::LimitsRemoved),
            (
                "only cpu and memory resources are mutable",
                Refusal::NotMutable,
            ),
            ("static pods cannot be resized", Refusal::StaticPod),
            ("windows pods cannot be resized", Refusal::WindowsPod),
            ("something else entirely", Refusal::Invalid),
        ] {
            assert_eq!(refused(422, msg, 500).0, want, "{msg}");
        }
    }

    #[test]
    fn codes_map_to_actions() {
        assert_eq!(classify_status(404, "gone", 1, 10), Outcome::NotFound);
        assert_eq!(classify_status(409, "conflict", 1, 10), Outcome::Conflict);
        assert!(matches!(
            classify_status(403, "denied by policy", 1, 10),
            Outcome::Forbidden(_)
        ));
        assert!(matches!(
            classify_status(429, "slow down", 1, 10),
            Outcome::Transient {
                class: TransientClass::Throttled,
                ..
            }
        ));
        assert!(matches!(
            classify_status(503, "unavailable", 1, 10),
            Outcome::Transient {
                class: TransientClass::ServerError,
                ..
            }
        ));
    }

    #[test]
    fn every_patch_error_class_is_reachable() {
        let refusal = "Pod \"e\" is invalid: spec: Forbidden: Pod QOS Class may not change as a result of resizing";
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let reached: Vec<Option<PatchErrorClass>> = vec![
            classify_status(422, refusal, 100, 10).error_class(),
            classify_status(409, "conflict", 1, 10).error_class(),
            classify_status(404, "gone", 1, 10).error_class(),
            classify_status(403, "denied by policy", 1, 10).error_class(),
            classify(&kube::Error::ReadEvents(io), 1, 10).error_class(),
            classify_status(403, "pods \"b\" is forbidden: node \"n1\" not found", 1, 10)
                .error_class(),
            classify_status(429, "slow down", 1, 10).error_class(),
            classify_status(503, "unavailable", 1, 10).error_class(),
            classify_status(302, "moved", 1, 10).error_class(),
        ];
        let want: Vec<Option<PatchErrorClass>> = PatchErrorClass::ALL.map(Some).to_vec();
        assert_eq!(reached, want);
        assert_eq!(Outcome::Applied.error_class(), None);
    }
}
