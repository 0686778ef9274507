//! Static pods (docs/kubelet-behaviour.md "Static pods"): pods the kubelet
//! runs from manifests in its `staticPodPath`, not from the apiserver. As the
//! kubelet v1.37 does (`pkg/kubelet/config/common.go` `applyDefaults`,
//! `pkg/kubelet/pod/mirror_client.go` `CreateMirrorPod`):
//!
//! - the pod's uid is its **config hash**, 32 hex digits without dashes
//!   (the kubelet: FNV-128a over the decoded manifest, then `host:<node>`
//!   and `file:<path>`; here two SipHash halves over the manifest's JSON,
//!   the node and the path: as stable, not the same digits). Its cgroup is
//!   named after it: `pod<hash>`;
//! - its name is `<name>-<node>`, its namespace `default` unless the
//!   manifest says, and it gets the annotations `kubernetes.io/config.hash`
//!   (the hash), `kubernetes.io/config.source: file` and
//!   `kubernetes.io/config.seen`, and a toleration of every `NoExecute` taint;
//! - the apiserver holds a **mirror pod** the kubelet creates: a copy with
//!   `kubernetes.io/config.mirror: <hash>` and a controller ownerReference
//!   to the Node. The copy is sent with the hash as `metadata.uid`; the
//!   apiserver gives it a uid of its own. The kubelet reports the static
//!   pod's status on the mirror, recreates the mirror when it is deleted
//!   (the pod keeps running), and never takes a spec change from it (the
//!   apiserver refuses a mirror pod's resize: "static pods cannot be
//!   resized").

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::PodKey;

/// `kubernetes.io/config.mirror`: on a mirror pod, the config hash of its static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// `kubernetes.io/config.hash`: on a static pod (and so its mirror), its config hash.
pub const HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// `kubernetes.io/config.source`: `file` for a pod from `staticPodPath`.
pub const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
const SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";

/// One manifest in the kubelet's `staticPodPath`.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticPod {
    /// Path of the manifest file; part of the config hash, as for the kubelet.
    pub path: String,
    /// The manifest: a Pod (`metadata.name`, optionally `metadata.namespace`,
    /// `spec` with containers and their resources).
    pub manifest: Value,
}

impl StaticPod {
    /// A manifest at `/etc/kubernetes/manifests/<metadata.name>.yaml`.
    pub fn new(manifest: Value) -> StaticPod {
        let name = manifest["metadata"]["name"].as_str().unwrap_or("pod");
        StaticPod {
            path: format!("/etc/kubernetes/manifests/{name}.yaml"),
            manifest,
        }
    }
}

/// The config hash of a manifest on `node` at `path`: 32 lowercase hex digits.
pub fn config_hash(manifest: &Value, node: &str, path: &str) -> String {
    use std::hash::{Hash, Hasher};
    let text = manifest.to_string();
    let mut out = String::with_capacity(32);
    for salt in 0u8..2 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (salt, &text, format!("host:{node}"), format!("file:{path}")).hash(&mut h);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// The name the kubelet gives a static pod (and its mirror): `<name>-<node>`,
/// the node name lowercased.
pub fn mirror_name(name: &str, node: &str) -> String {
    format!("{name}-{}", node.to_lowercase())
}

/// A static pod as the kubelet runs it.
#[derive(Debug, Clone)]
pub(crate) struct Defaulted {
    pub key: PodKey,
    pub hash: String,
    /// The pod after the kubelet's defaults (uid = hash, annotations, node).
    pub pod: Pod,
}

/// The kubelet's `applyDefaults` for a manifest from a file.
pub(crate) fn defaulted(sp: &StaticPod, node: &str) -> anyhow::Result<Defaulted> {
    let hash = config_hash(&sp.manifest, node, &sp.path);
    let mut v = sp.manifest.clone();
    let name = v["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("static pod {} has no metadata.name", sp.path))?
        .to_string();
    let ns = v["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let name = mirror_name(&name, node);
    v["metadata"]["name"] = json!(name);
    v["metadata"]["namespace"] = json!(ns);
    v["metadata"]["uid"] = json!(hash);
    let seen = super::node::now_time();
    let ann = v["metadata"]
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("static pod {}: metadata is not an object", sp.path))?
        .entry("annotations")
        .or_insert_with(|| json!({}));
    ann[HASH_ANNOTATION] = json!(hash);
    ann[SOURCE_ANNOTATION] = json!("file");
    ann[SEEN_ANNOTATION] = seen;
    v["spec"]["nodeName"] = json!(node);
    let tolerations = v["spec"]
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("static pod {} has no spec", sp.path))?
        .entry("tolerations")
        .or_insert_with(|| json!([]));
    if let Some(t) = tolerations.as_array_mut() {
        t.push(json!({"operator": "Exists", "effect": "NoExecute"}));
    }
    let pod: Pod = serde_json::from_value(v)
        .map_err(|e| anyhow::anyhow!("static pod {} is not a Pod: {e}", sp.path))?;
    Ok(Defaulted {
        key: PodKey { ns, name },
        hash,
        pod,
    })
}

/// The mirror pod the kubelet creates for `d`: a copy with
/// `kubernetes.io/config.mirror` and a controller ownerReference to the Node.
pub(crate) fn mirror_body(d: &Defaulted, node: &str, node_uid: &str) -> Pod {
    let mut pod = d.pod.clone();
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(MIRROR_ANNOTATION.into(), d.hash.clone());
    pod.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.into(),
            uid: node_uid.into(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    pod.status = None;
    pod
}

/// Whether `pod` (from the apiserver) is the mirror of the static pod with `hash`.
pub(crate) fn is_mirror_of(pod: &Pod, hash: &str) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some_and(|h| h == hash)
}

/// What the simulator keeps of one static pod beside its [`super::pods::PodEntry`].
#[derive(Debug, Clone)]
pub(crate) struct StaticState {
    pub defaulted: Defaulted,
    /// `metadata.uid` of the mirror pod in the apiserver, once seen.
    pub mirror_uid: Option<String>,
    /// The mirror is missing (not created yet, deleted, or stale): create it.
    pub create_mirror: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> Value {
        json!({"metadata": {"name": "etcd", "annotations": {"a": "b"}},
               "spec": {"containers": [{"name": "c", "image": "x"}]}})
    }

    #[test]
    fn hash_is_32_hex_without_dashes_and_follows_manifest_node_and_path() {
        let h = config_hash(&manifest(), "n", "/m/etcd.yaml");
        assert_eq!(h.len(), 32);
        assert!(
            h.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(h, config_hash(&manifest(), "n", "/m/etcd.yaml"));
        assert_ne!(h, config_hash(&manifest(), "n2", "/m/etcd.yaml"));
        assert_ne!(h, config_hash(&manifest(), "n", "/m/other.yaml"));
    }

    #[test]
    fn defaults_name_namespace_annotations_and_the_mirror() {
        let d = defaulted(&StaticPod::new(manifest()), "Node-A").expect("defaulted");
        assert_eq!(d.key, PodKey::new("default", "etcd-node-a"));
        let ann = d.pod.metadata.annotations.clone().expect("annotations");
        assert_eq!(ann[HASH_ANNOTATION], d.hash);
        assert_eq!(ann[SOURCE_ANNOTATION], "file");
        assert_eq!(ann["a"], "b");
        assert_eq!(d.pod.metadata.uid.as_deref(), Some(d.hash.as_str()));
        let m = mirror_body(&d, "Node-A", "node-uid");
        assert!(is_mirror_of(&m, &d.hash));
        assert!(!is_mirror_of(&d.pod, &d.hash));
        let owner = &m.metadata.owner_references.expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Node", "node-uid", Some(true))
        );
    }
}
