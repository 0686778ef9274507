//! The Kubernetes calls a tick makes, behind [`PodApi`] so a whole tick runs
//! in a unit test against a fake: the resize patch (and its dryRun probe),
//! the re-read after a conflict, and owners' pod templates. [`KubePods`] is
//! the real one.

use std::future::Future;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use super::owner::{self, OwnerError};
use super::resize::{self, ResizeAnswer, ResizeRequest};
use crate::model::{DeclaredLimits, OwnerRef};

pub trait PodApi {
    /// Sends a resize and classifies the answer.
    fn resize(&self, req: &ResizeRequest) -> impl Future<Output = ResizeAnswer>;

    /// The pod as the apiserver has it now; `None` when it is gone.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, kube::Error>>;

    /// The declared limits in `owner`'s pod template
    /// ([`owner::template_limits`]).
    fn template_limits(
        &self,
        namespace: &str,
        owner: &OwnerRef,
    ) -> impl Future<Output = Result<Option<DeclaredLimits>, OwnerError>>;
}

/// [`PodApi`] on a cluster.
#[derive(Clone)]
pub struct KubePods {
    client: Client,
}

impl KubePods {
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl PodApi for KubePods {
    async fn resize(&self, req: &ResizeRequest) -> ResizeAnswer {
        resize::send(&self.pods(&req.namespace), req).await
    }

    async fn get(&self, namespace: &str, name: &str) -> Result<Option<Pod>, kube::Error> {
        self.pods(namespace).get_opt(name).await
    }

    async fn template_limits(
        &self,
        namespace: &str,
        owner: &OwnerRef,
    ) -> Result<Option<DeclaredLimits>, OwnerError> {
        owner::template_limits(&self.client, namespace, owner).await
    }
}
