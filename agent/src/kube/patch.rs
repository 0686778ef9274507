//! The body of a resize patch. Strategic merge only: a JSON merge patch would
//! replace the whole containers list and the requests would vanish (docs/kubelet-behaviour.md §3).

use serde_json::{Value, json};

use crate::model::{ContainerKind, Millis};
use crate::quantity::format_cpu_millis;

/// What a resize changes: CPU limits of named containers, or the pod-level
/// CPU limit. Never requests, never memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitChange {
    Containers(Vec<ContainerLimit>),
    Pod(Millis),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLimit {
    pub name: String,
    pub kind: ContainerKind,
    pub cpu_limit_m: Millis,
}

/// Strategic-merge patch body for the `resize` subresource, keyed by
/// container name so other containers and every request stay untouched.
pub fn resize_body(change: &LimitChange) -> Value {
    let limits = |m: Millis| json!({ "limits": { "cpu": format_cpu_millis(m) } });
    match change {
        LimitChange::Pod(m) => json!({ "spec": { "resources": limits(*m) } }),
        LimitChange::Containers(cs) => {
            let entry =
                |c: &ContainerLimit| json!({ "name": c.name, "resources": limits(c.cpu_limit_m) });
            let apps: Vec<Value> = cs
                .iter()
                .filter(|c| c.kind == ContainerKind::App)
                .map(entry)
                .collect();
            let sidecars: Vec<Value> = cs
                .iter()
                .filter(|c| c.kind == ContainerKind::Sidecar)
                .map(entry)
                .collect();
            let mut spec = serde_json::Map::new();
            if !apps.is_empty() {
                spec.insert("containers".into(), Value::Array(apps));
            }
            if !sidecars.is_empty() {
                spec.insert("initContainers".into(), Value::Array(sidecars));
            }
            json!({ "spec": spec })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_patch_touches_only_cpu_limits_by_name() {
        let body = resize_body(&LimitChange::Containers(vec![
            ContainerLimit {
                name: "app".into(),
                kind: ContainerKind::App,
                cpu_limit_m: 800,
            },
            ContainerLimit {
                name: "proxy".into(),
                kind: ContainerKind::Sidecar,
                cpu_limit_m: 2000,
            },
        ]));
        assert_eq!(
            body,
            json!({"spec": {
                "containers": [{"name": "app", "resources": {"limits": {"cpu": "800m"}}}],
                "initContainers": [{"name": "proxy", "resources": {"limits": {"cpu": "2"}}}]
            }})
        );
    }

    #[test]
    fn pod_level_patch_sets_only_pod_cpu_limit() {
        assert_eq!(
            resize_body(&LimitChange::Pod(450)),
            json!({"spec": {"resources": {"limits": {"cpu": "450m"}}}})
        );
    }
}
