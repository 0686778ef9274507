//! Caches of what the agent needs from the API, each a single watch:
//! its own node's pods (field selector `spec.nodeName`, never the cluster's
//! pods), its own Node (allocatable CPU), and the namespaces that opted in
//! (label selector, so no namespace outside the opt-in is ever cached).

use foldhash::HashSet;
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

    /// Names of the namespaces that carry the opt-in label (the watch is
    /// label-selected, so every cached namespace opted in).
    pub fn opted_in_namespaces(&self) -> HashSet<String> {
        self.namespaces
            .state()
            .iter()
            .map(|n| n.name_any())
            .collect()
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

    let (pod_cfg, node_cfg, ns_cfg) = watch_configs(node_name);
    let pod_stream = watcher(Api::<Pod>::all(client.clone()), pod_cfg)
        .default_backoff()
        // Keep only what PodView reads: memory stays flat on busy nodes.
        .modify(slim_pod)
        .reflect(pods_w);
    let node_stream = watcher(Api::<Node>::all(client.clone()), node_cfg)
        .default_backoff()
        .modify(|n| {
            n.managed_fields_mut().clear();
            if let Some(s) = n.status.as_mut() {
                s.images = None;
            }
        })
        .reflect(node_w);
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

/// The three watches' configs: own node's pods, own Node, opted-in
/// namespaces. Every (re)list asks for `resourceVersion=0`, served from the
/// apiserver's watch cache, not a quorum read from etcd. kube-runtime's
/// default (`MostRecent`, pages of 500) sends the pod list with a field
/// selector to etcd, which has no field index: each agent start then reads
/// every pod of the cluster from etcd, and a rollout of N agents N times
/// (the scale bench counted 1 etcd pod list per agent start). Unpaged,
/// because kube-core drops `resourceVersion=0` from a list with a `limit`;
/// the lists are one node's pods, one Node, the opted-in namespaces. The
/// caches tolerate a list older than the newest state: the watch that
/// follows delivers every later change, and resizes are verified against
/// the cgroups.
pub fn watch_configs(node_name: &str) -> (watcher::Config, watcher::Config, watcher::Config) {
    let from_cache = |c: watcher::Config| watcher::Config {
        page_size: None,
        ..c.any_semantic()
    };
    let pods = from_cache(watcher::Config::default().fields(&format!("spec.nodeName={node_name}")));
    let node = from_cache(watcher::Config::default().fields(&format!("metadata.name={node_name}")));
    let namespaces = from_cache(watcher::Config::default().labels(&format!("{ANN_MANAGED}=true")));
    (pods, node, namespaces)
}

/// Drops the parts of a Pod the agent never reads (labels, volumes, env,
/// commands, probes, images, IPs..., the `managedFields` entries other than
/// the agent's own and those of in-place CPU limit writers, owner references
/// other than the controller), so the
/// watch cache holds a few hundred bytes per container instead of kilobytes.
/// Everything `PodView::try_from` and the events need is kept.
pub fn slim_pod(p: &mut Pod) {
    let m = &mut p.metadata;
    // Only the agent's own entries (which limits Headroom set) and those of
    // other writers that changed a CPU limit in place (whom Headroom yields to).
    let kept: Vec<_> = m
        .managed_fields
        .take()
        .into_iter()
        .flatten()
        .filter(|e| {
            e.manager.as_deref() == Some(crate::model::FIELD_MANAGER)
                || crate::kube::view::limit_writer(e).is_some()
        })
        .collect();
    m.managed_fields = (!kept.is_empty()).then_some(kept);
    m.labels = None;
    // Only the controller: its pod template holds the declared limits.
    m.owner_references = m
        .owner_references
        .take()
        .map(|o| {
            o.into_iter()
                .filter(|o| o.controller == Some(true))
                .collect::<Vec<_>>()
        })
        .filter(|o| !o.is_empty());
    m.finalizers = None;
    if let Some(a) = m.annotations.as_mut() {
        // The last-applied annotation is a copy of the whole object.
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = None;
        spec.affinity = None;
        spec.tolerations = None;
        spec.topology_spread_constraints = None;
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            c.env = None;
            c.env_from = None;
            c.command = None;
            c.args = None;
            c.volume_mounts = None;
            c.liveness_probe = None;
            c.readiness_probe = None;
            c.startup_probe = None;
            c.lifecycle = None;
            c.ports = None;
            c.security_context = None;
            c.image = None;
        }
    }
    if let Some(st) = p.status.as_mut() {
        st.pod_ips = None;
        st.host_ips = None;
        for cs in st
            .container_statuses
            .iter_mut()
            .flatten()
            .chain(st.init_container_statuses.iter_mut().flatten())
        {
            cs.image = String::new();
            cs.image_id = String::new();
            cs.last_state = None;
            cs.volume_mounts = None;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PodView;

    #[test]
    fn every_watch_lists_from_the_watch_cache_and_only_what_the_agent_owns() {
        let (pods, node, ns) = watch_configs("n1");
        for c in [&pods, &node, &ns] {
            assert_eq!(c.list_semantic, watcher::ListSemantic::Any, "{c:?}");
            assert_eq!(c.page_size, None, "kube-core drops rv=0 from a paged list");
        }
        assert_eq!(pods.field_selector.as_deref(), Some("spec.nodeName=n1"));
        assert_eq!(node.field_selector.as_deref(), Some("metadata.name=n1"));
        assert_eq!(
            ns.label_selector.as_deref(),
            Some("headroom.dev/managed=true")
        );
    }

    /// What the watcher sends for those settings (rv "0", NotOlderThan, no
    /// limit): `resourceVersion=0` is in the query; with a limit it is not.
    #[test]
    fn an_unpaged_any_list_asks_for_resource_version_zero() {
        let lp = |limit| kube::api::ListParams {
            resource_version: Some("0".into()),
            version_match: Some(kube::api::VersionMatch::NotOlderThan),
            limit,
            ..Default::default()
        };
        let uri = |lp: &kube::api::ListParams| {
            kube::core::Request::new("/api/v1/pods")
                .list(lp)
                .unwrap()
                .uri()
                .to_string()
        };
        assert!(
            uri(&lp(None)).contains("resourceVersion=0"),
            "{}",
            uri(&lp(None))
        );
        assert!(
            !uri(&lp(Some(500))).contains("resourceVersion"),
            "{}",
            uri(&lp(Some(500)))
        );
    }

    #[test]
    fn slim_pod_keeps_everything_the_view_reads() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 2, "resourceVersion": "7",
                "labels": {"app": "x"}, "annotations": {"headroom.dev/managed": "true",
                "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kubectl"},
                    {"manager": "headroom-agent", "operation": "Update", "subresource": "resize", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {"f:resources": {"f:limits": {"f:cpu": {}}}}}}}},
                    {"manager": "vpa-updater", "operation": "Update", "subresource": "resize", "fieldsType": "FieldsV1",
                     "time": "2026-07-01T12:00:00Z",
                     "fieldsV1": {"f:spec": {"f:initContainers": {"k:{\"name\":\"side\"}": {"f:resources": {"f:limits": {"f:cpu": {}}}}}}}},
                    {"manager": "vpa-requests", "operation": "Update", "subresource": "resize", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {"f:resources": {"f:requests": {"f:cpu": {}}}}}}}}],
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-controller", "uid": "o-1"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "o-2", "controller": true}]},
            "spec": {"nodeName": "n", "volumes": [{"name": "v", "emptyDir": {}}],
                "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always",
                    "resources": {"limits": {"cpu": "100m"}}}],
                "containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "B"}],
                    "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}}}]},
            "status": {"phase": "Running", "qosClass": "Burstable", "podIPs": [{"ip": "10.0.0.1"}],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "sha", "ready": true, "restartCount": 0,
                    "containerID": "containerd://abc", "state": {"running": {}},
                    "resources": {"limits": {"cpu": "200m"}}}]}
        }))
        .unwrap();
        let mut before = PodView::try_from(&p).unwrap();
        slim_pod(&mut p);
        before
            .annotations
            .remove("kubectl.kubernetes.io/last-applied-configuration");
        assert_eq!(
            PodView::try_from(&p).unwrap(),
            before,
            "only the last-applied copy is dropped"
        );
        assert!(
            before.limits_set_by_headroom,
            "the agent's own entry is kept"
        );
        assert_eq!(before.owner.as_ref().map(|o| o.name.as_str()), Some("rs"));
        assert_eq!(
            before.limit_writers.len(),
            1,
            "the other writer's entry is kept"
        );
        assert_eq!(p.metadata.managed_fields.as_ref().map(Vec::len), Some(2));
        assert_eq!(p.metadata.owner_references.as_ref().map(Vec::len), Some(1));
        assert!(p.metadata.labels.is_none());
        assert!(p.spec.as_ref().unwrap().containers[0].env.is_none());
        assert!(!before.annotations.is_empty());
        assert!(
            !p.metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key("kubectl.kubernetes.io/last-applied-configuration")
        );
    }
}
