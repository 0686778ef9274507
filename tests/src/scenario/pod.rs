//! Pods as the scenario tests write and read them: a Burstable pod body, and
//! what the tests look at in a pod the apiserver returns (limits in
//! millicores, generation, conditions, who wrote it).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

/// The field manager the agent patches with.
pub const AGENT_MANAGER: &str = "headroom-agent";

/// A Burstable pod bound to `node`: one container "app", CPU request and
/// (optional) limit, memory request 64Mi.
pub fn burstable(name: &str, node: &str, req: &str, lim: Option<&str>) -> Value {
    let mut res = json!({"requests": {"cpu": req, "memory": "64Mi"}});
    if let Some(l) = lim {
        res["limits"] = json!({"cpu": l});
    }
    json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": res}]}
    })
}

/// `pod` annotated `headroom.dev/managed=false` (its other annotations replaced).
pub fn opted_out(mut pod: Value) -> Value {
    pod["metadata"]["annotations"] = json!({"headroom.dev/managed": "false"});
    pod
}

/// A CPU quantity in millicores, if it parses.
pub fn millis(q: Option<&Quantity>) -> Option<u64> {
    q.and_then(|q| headroom::quantity::cpu_millis(&q.0).ok())
}

fn container<'a>(p: &'a Pod, name: &str) -> Option<&'a k8s_openapi::api::core::v1::Container> {
    p.spec.as_ref()?.containers.iter().find(|c| c.name == name)
}

/// The CPU limit of `container` as written in the spec.
pub fn cpu_limit(p: &Pod, container_name: &str) -> Option<String> {
    let r = container(p, container_name)?.resources.as_ref()?;
    r.limits.as_ref()?.get("cpu").map(|q| q.0.clone())
}

/// The CPU request of `container` as written in the spec.
pub fn cpu_request(p: &Pod, container_name: &str) -> Option<String> {
    let r = container(p, container_name)?.resources.as_ref()?;
    r.requests.as_ref()?.get("cpu").map(|q| q.0.clone())
}

/// The CPU limit of `container` in millicores.
pub fn cpu_limit_m(p: &Pod, container_name: &str) -> Option<u64> {
    let r = container(p, container_name)?.resources.as_ref()?;
    millis(r.limits.as_ref()?.get("cpu"))
}

/// The pod-level CPU limit (`spec.resources.limits.cpu`) in millicores.
pub fn pod_limit_m(p: &Pod) -> Option<u64> {
    let r = p.spec.as_ref()?.resources.as_ref()?;
    millis(r.limits.as_ref()?.get("cpu"))
}

pub fn generation(p: &Pod) -> i64 {
    p.metadata.generation.unwrap_or(0)
}

/// Whether condition `type_` (e.g. `PodResizeInProgress`) is `True`.
pub fn has_condition(p: &Pod, type_: &str) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Running, with container statuses.
pub fn is_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|c| !c.is_empty())
}

/// Whether the agent's field manager ever wrote this pod.
pub fn touched_by_agent(p: &Pod) -> bool {
    p.metadata
        .managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some(AGENT_MANAGER))
}

/// Generation, container limits and conditions, for a failure message.
pub fn summary(p: &Pod) -> String {
    let spec = p.spec.as_ref().map(|s| {
        s.containers
            .iter()
            .map(|c| {
                format!(
                    "{}={:?}",
                    c.name,
                    c.resources.as_ref().and_then(|r| r.limits.as_ref())
                )
            })
            .collect::<Vec<_>>()
    });
    format!(
        "gen={:?} limits={spec:?} conditions={:?}",
        p.metadata.generation,
        p.status.as_ref().and_then(|s| s.conditions.clone())
    )
}
