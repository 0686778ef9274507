//! The limits a workload declares, read from its controller's pod template
//! (read-only: `get` on the owner). Used once Headroom has changed a pod's
//! limits and the agent did not see them before (it restarted).

use k8s_openapi::api::apps::v1::{DaemonSet, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

use crate::kube::view::ViewError;
use crate::model::{DeclaredLimits, OwnerRef};

/// Why an owner's template gave no limits.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("reading {kind} {namespace}/{name}: {source}")]
    Api {
        kind: String,
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("{kind} {namespace}/{name}: {source}")]
    Template {
        kind: String,
        namespace: String,
        name: String,
        source: ViewError,
    },
}

/// Owner kinds whose pod template the agent reads.
pub const TEMPLATE_KINDS: [&str; 4] = ["ReplicaSet", "StatefulSet", "DaemonSet", "Job"];

/// The declared limits in `owner`'s pod template. `Ok(None)`: a kind with no
/// template the agent reads, or the owner is gone or replaced (another uid).
pub async fn template_limits(
    client: &Client,
    namespace: &str,
    owner: &OwnerRef,
) -> Result<Option<DeclaredLimits>, OwnerError> {
    let template = match owner.kind.as_str() {
        "ReplicaSet" => get::<ReplicaSet>(client, namespace, owner, |o| o.spec.template).await?,
        "StatefulSet" => {
            get::<StatefulSet>(client, namespace, owner, |o| Some(o.spec.template)).await?
        }
        "DaemonSet" => {
            get::<DaemonSet>(client, namespace, owner, |o| Some(o.spec.template)).await?
        }
        "Job" => get::<Job>(client, namespace, owner, |o| o.spec.map(|s| s.template)).await?,
        _ => None,
    };
    let Some(spec) = template.and_then(|t| t.spec) else {
        return Ok(None);
    };
    DeclaredLimits::of_spec(&spec)
        .map(Some)
        .map_err(|source| OwnerError::Template {
            kind: owner.kind.clone(),
            namespace: namespace.to_string(),
            name: owner.name.clone(),
            source,
        })
}

async fn get<K>(
    client: &Client,
    namespace: &str,
    owner: &OwnerRef,
    template: impl FnOnce(K) -> Option<PodTemplateSpec>,
) -> Result<Option<PodTemplateSpec>, OwnerError>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let o = api
        .get_opt(&owner.name)
        .await
        .map_err(|source| OwnerError::Api {
            kind: owner.kind.clone(),
            namespace: namespace.to_string(),
            name: owner.name.clone(),
            source,
        })?;
    // A controller of the same name created later is not this pod's owner.
    Ok(
        o.filter(|o| o.meta().uid.as_deref() == Some(owner.uid.as_str()))
            .and_then(template),
    )
}
