//! Caches of what the agent needs from the API, each a single watch:
//! its own node's pods (field selector `spec.nodeName`, never the cluster's
//! pods), its own Node (allocatable CPU), and the namespaces that opted in
//! (label selector, so no namespace outside the opt-in is ever cached).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::model::ANN_MANAGED;
use crate::quantity;

/// Read handles on the watch caches.
#[derive(Clone)]
pub struct Caches {
    pub pods: Store<Pod>,
    pub node: Store<Node>,
    pub namespaces: Store<Namespace>,
}

impl Caches {
    /// The node's allocatable CPU, if the Node is cached and parseable.
    pub fn allocatable_cpu_m(&self) -> Option<u64> {
        let node = self.node.state().into_iter().next()?;
        let q = node.status.as_ref()?.allocatable.as_ref()?.get("cpu")?;
        quantity::cpu_millis(&q.0).ok()
    }

    /// Whether a namespace carries the opt-in label.
    pub fn namespace_opted_in(&self, ns: &str) -> bool {
        self.namespaces.state().iter().any(|n| n.name_any() == ns)
    }

    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    /// Waits until every cache has done its initial list.
    pub async fn wait_ready(&self) {
        let _ = self.pods.wait_until_ready().await;
        let _ = self.node.wait_until_ready().await;
        let _ = self.namespaces.wait_until_ready().await;
    }
}

/// Starts the three watches; they retry with kube-runtime's default backoff
/// forever, logging each error (an apiserver outage is survived, not fatal).
pub fn start(client: Client, node_name: &str) -> (Caches, Vec<JoinHandle<()>>) {
    let (pods, pods_w) = reflector::store();
    let (node, node_w) = reflector::store();
    let (namespaces, ns_w) = reflector::store();

    let pod_cfg = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
    let pod_stream = watcher(Api::<Pod>::all(client.clone()), pod_cfg)
        .default_backoff()
        // managedFields are large and never read: keep memory flat.
        .modify(|p| p.managed_fields_mut().clear())
        .reflect(pods_w);
    let node_cfg = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    let node_stream = watcher(Api::<Node>::all(client.clone()), node_cfg)
        .default_backoff()
        .modify(|n| {
            n.managed_fields_mut().clear();
            if let Some(s) = n.status.as_mut() {
                s.images = None;
            }
        })
        .reflect(node_w);
    let ns_cfg = watcher::Config::default().labels(&format!("{ANN_MANAGED}=true"));
    let ns_stream = watcher(Api::<Namespace>::all(client), ns_cfg)
        .default_backoff()
        .modify(|n| n.managed_fields_mut().clear())
        .reflect(ns_w);

    let tasks = vec![
        tokio::spawn(drain("pods", pod_stream)),
        tokio::spawn(drain("node", node_stream)),
        tokio::spawn(drain("namespaces", ns_stream)),
    ];
    (
        Caches {
            pods,
            node,
            namespaces,
        },
        tasks,
    )
}

async fn drain<S, T>(what: &'static str, stream: S)
where
    S: futures::Stream<Item = Result<watcher::Event<T>, watcher::Error>>,
{
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        if let Err(e) = ev {
            tracing::warn!(watch = what, error = %e, "watch error; retrying with backoff");
        }
    }
}
