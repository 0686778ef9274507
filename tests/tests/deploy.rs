//! `deploy/` against the real kube-apiserver: every object is accepted by a
//! server-side dry-run apply, the agent's RBAC is what it uses and no more, and
//! the admission policy pins the agent's resizes to its own node (docs/kubelet-behaviour.md §7).
//!
//! The kustomizations are plain `resources:` lists, so this file renders them
//! itself (no kustomize binary in CI): `load` follows the lists in order and
//! refuses any other kustomize field, which it would silently ignore.
//!
//! The Prometheus Operator CRDs do not exist on a bare apiserver and cannot be
//! fetched here: the dry-run test installs a minimal CRD of its own for
//! PodMonitor and PrometheusRule whose schema covers the fields deploy/ uses
//! (unknown fields are pruned by the API server, so a typo in a field name
//! still passes — only kinds, types and required fields are checked).
//!
//! Finally the agent itself runs as its ServiceAccount, with a token bound to
//! its own pod on a simulated node, through the deployed RBAC and policy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::Discovery;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use testkit::control_plane::{ControlPlane, api_message, resize};
use testkit::manifests::kind_name;
use testkit::scenario::wait_until;

const AGENT_NS: &str = "headroom-system";
const AGENT_SA: &str = "headroom-agent";
const AGENT_USER: &str = "system:serviceaccount:headroom-system:headroom-agent";
const MANAGER: &str = "headroom-test";
/// Bound for waiting on asynchronous server state (RBAC and policy caches).
const SETTLE: Duration = Duration::from_secs(60);

/// Texts from deploy/base/admission-policy.yaml.
const MSG_NO_CLAIM: &str = "this request has no node claim";
const MSG_OTHER_NODE: &str = "may resize pods only on its own node";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The objects of a kustomization directory (testkit's loader: plain
/// `resources:` lists only, any other kustomize field refused).
fn load(dir: &Path) -> anyhow::Result<Vec<Value>> {
    testkit::manifests::load_kustomization(dir)
}

/// Server-side apply of one manifest, resolved through discovery.
async fn apply(
    client: &Client,
    discovery: &Discovery,
    obj: &Value,
    dry_run: bool,
) -> anyhow::Result<DynamicObject> {
    testkit::manifests::apply_one(client, discovery, obj, MANAGER, dry_run).await
}

/// Installs deploy/base for real (idempotent; tests of this binary share it).
async fn install_base(client: &Client) {
    let objs = load(&deploy_dir().join("base")).expect("deploy/base renders");
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    for o in &objs {
        if let Err(e) = apply(client, &discovery, o, false).await {
            panic!("applying {}: {e:#}", kind_name(o));
        }
    }
}

/// [`wait_until`] with [`SETTLE`]; panics with the last error.
async fn settle<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    wait_until(what, SETTLE, f).await.unwrap().0
}

// ---------------------------------------------------------------- rendering

#[test]
fn kustomizations_render_base_and_monitoring_in_listed_order() {
    let base: Vec<String> = load(&deploy_dir()).unwrap().iter().map(kind_name).collect();
    assert_eq!(
        base,
        [
            "Namespace/headroom-system",
            "ServiceAccount/headroom-agent",
            "ClusterRole/headroom-agent",
            "ClusterRoleBinding/headroom-agent",
            "DaemonSet/headroom-agent",
            "ValidatingAdmissionPolicy/headroom-agent-own-node-only",
            "ValidatingAdmissionPolicyBinding/headroom-agent-own-node-only",
            "NetworkPolicy/headroom-agent-metrics",
        ]
    );
    let mon: Vec<String> = load(&deploy_dir().join("monitoring"))
        .unwrap()
        .iter()
        .map(kind_name)
        .collect();
    assert_eq!(mon[..base.len()], base[..]);
    assert_eq!(
        mon[base.len()..],
        ["PodMonitor/headroom-agent", "PrometheusRule/headroom"]
    );
}

#[test]
fn daemonset_is_locked_down() {
    let objs = load(&deploy_dir().join("base")).unwrap();
    let ds = objs.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    let c = &pod["containers"][0];
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["securityContext"]["privileged"].is_null());
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert!(
        c["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--cgroup-root=/host/sys/fs/cgroup"))
    );
    // Every volume mount is read-only, and the only volume is the cgroup tree.
    for m in c["volumeMounts"].as_array().unwrap() {
        assert_eq!(m["readOnly"], true, "{m}");
    }
    let vols = pod["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 1);
    assert_eq!(vols[0]["hostPath"]["path"], "/sys/fs/cgroup");
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod[key].is_null(), "{key} set");
    }
}

#[test]
fn daemonset_args_parse_as_the_agent_cli() {
    let objs = load(&deploy_dir().join("base")).unwrap();
    let ds = objs.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let args: Vec<String> = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    // The host cgroup root does not exist here, so the agent stops right after
    // parsing, at cgroup discovery: that error names the root it was given.
    testkit::agent::assert_stops_at_the_host_cgroup_root(&args, "argument parsing");
}

// ---------------------------------------------------------------- dry run

/// A CRD for a Prometheus Operator kind, with a schema for the fields deploy/ uses.
fn minimal_crd(kind: &str, plural: &str, spec_schema: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                      "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {"spec": spec_schema}
                }}
            }]
        }
    })
}

fn prometheus_crds() -> [Value; 2] {
    let labels = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let relabel = json!({"type": "object", "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"}, "regex": {"type": "string"},
        "action": {"type": "string"}, "replacement": {"type": "string"}}});
    let pod_monitor = json!({
        "type": "object",
        "required": ["selector"],
        "properties": {
            "selector": {"type": "object", "properties": {"matchLabels": labels}},
            "podMetricsEndpoints": {"type": "array", "items": {"type": "object", "properties": {
                "port": {"type": "string"}, "path": {"type": "string"},
                "honorLabels": {"type": "boolean"},
                "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                "relabelings": {"type": "array", "items": relabel}}}}
        }
    });
    let prometheus_rule = json!({
        "type": "object",
        "properties": {"groups": {"type": "array", "items": {
            "type": "object", "required": ["name", "rules"],
            "properties": {"name": {"type": "string", "minLength": 1},
                "rules": {"type": "array", "items": {
                    "type": "object", "required": ["expr"],
                    "properties": {
                        "alert": {"type": "string"}, "record": {"type": "string"},
                        "expr": {"x-kubernetes-int-or-string": true},
                        "for": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                        "labels": labels, "annotations": labels}}}}}}}
    });
    [
        minimal_crd("PodMonitor", "podmonitors", pod_monitor),
        minimal_crd("PrometheusRule", "prometheusrules", prometheus_rule),
    ]
}

#[tokio::test]
async fn every_deploy_object_passes_server_side_dry_run_apply() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;

    // Namespaced objects need their namespace to exist, even for a dry run.
    let objs = load(&deploy_dir().join("monitoring")).unwrap();
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    apply(&client, &discovery, &objs[0], false).await.unwrap();
    assert_eq!(objs[0]["kind"], "Namespace");

    let crd_api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in prometheus_crds() {
        let name = crd["metadata"]["name"].as_str().unwrap().to_string();
        crd_api
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap();
        settle(&format!("CRD {name} established"), || {
            let api = crd_api.clone();
            let name = name.clone();
            async move {
                let c = api.get(&name).await.map_err(|e| e.to_string())?;
                let established = c
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(()).ok_or("not established".into())
            }
        })
        .await;
    }
    // Discovery after the CRDs are served.
    let discovery = settle("monitoring.coreos.com in discovery", || {
        let client = client.clone();
        async move {
            let d = Discovery::new(client)
                .run()
                .await
                .map_err(|e| e.to_string())?;
            if d.has_group("monitoring.coreos.com") {
                Ok(d)
            } else {
                Err("group not served yet".into())
            }
        }
    })
    .await;

    let mut failures = Vec::new();
    for o in &objs {
        match apply(&client, &discovery, o, true).await {
            Ok(_) => println!("dry-run apply ok: {}", kind_name(o)),
            Err(e) => failures.push(format!("{}: {e:#}", kind_name(o))),
        }
    }
    assert!(
        failures.is_empty(),
        "dry-run apply refused:\n{}",
        failures.join("\n")
    );
}

// ---------------------------------------------------------------- RBAC

async fn can(
    client: &Client,
    ns: Option<&str>,
    group: &str,
    resource: &str,
    sub: &str,
    verb: &str,
) -> bool {
    let sar: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": AGENT_USER,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:headroom-system",
                       "system:authenticated"],
            "resourceAttributes": {
                "namespace": ns.unwrap_or(""), "group": group, "resource": resource,
                "subresource": sub, "verb": verb
            }
        }
    }))
    .unwrap();
    let r = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .unwrap();
    r.status.map(|s| s.allowed).unwrap_or(false)
}

/// (namespace, group, resource, subresource, verb)
type Access = (
    Option<&'static str>,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

const USED: &[Access] = &[
    (None, "", "pods", "", "list"),
    (None, "", "pods", "", "watch"),
    (Some("app"), "", "pods", "", "get"),
    (Some("app"), "", "pods", "resize", "patch"),
    (None, "", "nodes", "", "get"),
    (None, "", "nodes", "", "list"),
    (None, "", "nodes", "", "watch"),
    (None, "", "namespaces", "", "get"),
    (None, "", "namespaces", "", "list"),
    (None, "", "namespaces", "", "watch"),
    (Some("app"), "events.k8s.io", "events", "", "create"),
    (Some("app"), "events.k8s.io", "events", "", "patch"),
    // The declared limits in a pod's controller's template.
    (Some("app"), "apps", "replicasets", "", "get"),
    (Some("app"), "apps", "statefulsets", "", "get"),
    (Some("app"), "apps", "daemonsets", "", "get"),
    (Some("app"), "batch", "jobs", "", "get"),
];

const FORBIDDEN: &[Access] = &[
    // Owners: one `get` each, never a list, a watch or a write.
    (None, "apps", "replicasets", "", "list"),
    (None, "apps", "replicasets", "", "watch"),
    (Some("app"), "apps", "replicasets", "", "patch"),
    (Some("app"), "apps", "statefulsets", "", "update"),
    (Some("app"), "batch", "jobs", "", "delete"),
    (Some("app"), "apps", "deployments", "", "get"),
    (Some("app"), "", "pods", "", "patch"),
    (Some("app"), "", "pods", "", "update"),
    (Some("app"), "", "pods", "", "delete"),
    (Some("app"), "", "pods", "", "create"),
    (Some("app"), "", "pods", "status", "patch"),
    (Some("app"), "", "pods", "eviction", "create"),
    (Some("app"), "", "pods", "exec", "create"),
    (Some("app"), "", "pods", "resize", "update"),
    (Some("app"), "", "secrets", "", "get"),
    (None, "", "secrets", "", "list"),
    (Some("app"), "", "configmaps", "", "get"),
    (None, "", "nodes", "", "patch"),
    (None, "", "nodes", "status", "patch"),
    (None, "", "namespaces", "", "patch"),
    (Some("app"), "", "events", "", "create"),
    (Some("app"), "events.k8s.io", "events", "", "delete"),
    (Some(AGENT_NS), "", "serviceaccounts", "token", "create"),
    (Some("app"), "apps", "deployments", "", "patch"),
];

#[tokio::test]
async fn rbac_allows_each_verb_the_agent_uses() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    install_base(&client).await;
    for &(ns, g, r, s, v) in USED {
        // The RBAC authorizer learns of the new binding through its informers.
        settle(&format!("{v} {g}/{r}/{s} allowed"), || {
            let client = client.clone();
            async move {
                can(&client, ns, g, r, s, v)
                    .await
                    .then_some(())
                    .ok_or("denied".to_string())
            }
        })
        .await;
    }
}

#[tokio::test]
async fn rbac_denies_what_the_agent_must_not_do() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    install_base(&client).await;
    // Wait until the binding is visible, so a denial below is not just lag.
    settle("binding active", || {
        let client = client.clone();
        async move {
            can(&client, Some("app"), "", "pods", "resize", "patch")
                .await
                .then_some(())
                .ok_or("denied".to_string())
        }
    })
    .await;
    let mut granted = Vec::new();
    for &(ns, g, r, s, v) in FORBIDDEN {
        if can(&client, ns, g, r, s, v).await {
            granted.push(format!("{v} {g}/{r}/{s} in {ns:?}"));
        }
    }
    assert!(
        granted.is_empty(),
        "agent may do more than it uses: {granted:?}"
    );
}

// ---------------------------------------------------------------- admission

fn pod(name: &str, node: &str, sa: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": sa.unwrap_or("default"),
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": {"cpu": "100m", "memory": "64Mi"},
                    "limits": {"cpu": "200m", "memory": "128Mi"}
                }
            }]
        }
    }))
    .unwrap()
}

async fn agent_token(client: &Client, bound_to: Option<&Pod>) -> String {
    let bound = bound_to
        .map(|p| json!({"kind": "Pod", "apiVersion": "v1", "name": p.name_any(), "uid": p.uid()}));
    let tr: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 3600, "boundObjectRef": bound}
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), AGENT_NS)
        .create_token_request(AGENT_SA, &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .expect("TokenRequest status without a token")
}

fn raise_limit(cpu: &str) -> Patch<Value> {
    Patch::Strategic(json!({"spec": {"containers": [
        {"name": "c", "resources": {"limits": {"cpu": cpu}}}
    ]}}))
}

/// Pods on two nodes and agent tokens, with the policy known to be active.
struct Fixture {
    ns: String,
    node_a: String,
    node_b: String,
    /// Authenticated with a token bound to an agent pod on node_a.
    agent_a: Client,
}

async fn fixture(tag: &str) -> Fixture {
    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    install_base(&admin).await;
    let ns = cp.namespace(&format!("deploy-{tag}")).await;
    // Nodes unique to this test, without kubelets. The Node objects must exist:
    // the PodResize admission plugin refuses a resize on an unknown node.
    let node_a = format!("{ns}-node-a");
    let node_b = format!("{ns}-node-b");
    let nodes = Api::<Node>::all(admin.clone());
    for name in [&node_a, &node_b] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let res = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
        let status = json!({"status": {"capacity": res, "allocatable": res}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }

    let pods = Api::<Pod>::namespaced(admin.clone(), &ns);
    for (name, node) in [("on-a", &node_a), ("on-b", &node_b)] {
        pods.create(&PostParams::default(), &pod(name, node, None))
            .await
            .unwrap();
    }
    let agent_pod = Api::<Pod>::namespaced(admin.clone(), AGENT_NS)
        .create(
            &PostParams::default(),
            &pod(&format!("agent-{ns}"), &node_a, Some(AGENT_SA)),
        )
        .await
        .unwrap();
    let agent_a = cp
        .client_for_token(&agent_token(&admin, Some(&agent_pod)).await)
        .unwrap();

    // Active = RBAC lets the agent through and the policy denies the cross-node
    // resize (both are cached by the API server a moment after creation).
    let probe = Api::<Pod>::namespaced(agent_a.clone(), &ns);
    settle("admission policy active", || {
        let probe = probe.clone();
        async move {
            match resize(&probe, "on-b", &raise_limit("300m"), true).await {
                Ok(_) => Err("cross-node dry-run resize admitted".to_string()),
                Err(e) if api_message(&e).is_some_and(|m| m.contains(MSG_OTHER_NODE)) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    Fixture {
        ns,
        node_a,
        node_b,
        agent_a,
    }
}

#[tokio::test]
async fn pod_bound_agent_token_names_the_node_of_its_pod() {
    let f = fixture("claim").await;
    let review = Api::<SelfSubjectReview>::all(f.agent_a.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(user.username.as_deref(), Some(AGENT_USER));
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/node-name"),
        Some(&vec![f.node_a.clone()])
    );
}

#[tokio::test]
async fn agent_resize_of_a_pod_on_its_own_node_is_admitted() {
    let f = fixture("own").await;
    let pods = Api::<Pod>::namespaced(f.agent_a.clone(), &f.ns);
    // The dryRun=All feature probe first, then the real resize.
    resize(&pods, "on-a", &raise_limit("300m"), true)
        .await
        .unwrap();
    let p = resize(&pods, "on-a", &raise_limit("300m"), false)
        .await
        .unwrap();
    let c = &p.spec.unwrap().containers[0];
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["cpu"].0, "300m");
}

#[tokio::test]
async fn agent_resize_of_a_pod_on_another_node_is_denied_with_the_policy_message() {
    let f = fixture("cross").await;
    let pods = Api::<Pod>::namespaced(f.agent_a.clone(), &f.ns);
    let err = resize(&pods, "on-b", &raise_limit("300m"), false)
        .await
        .expect_err("cross-node resize admitted");
    let kube::Error::Api(status) = &err else {
        panic!("not an API error: {err}");
    };
    assert_eq!(status.code, 403, "{status:?}");
    let want = format!(
        "headroom-agent on node {} may resize pods only on its own node; pod {}/on-b is on node {}",
        f.node_a, f.ns, f.node_b
    );
    assert!(status.message.contains(&want), "{}", status.message);
    // Nothing changed.
    let admin = ControlPlane::shared().client().await;
    let p = Api::<Pod>::namespaced(admin, &f.ns)
        .get("on-b")
        .await
        .unwrap();
    let limits = p.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .limits
        .unwrap();
    assert_eq!(limits["cpu"].0, "200m");
}

#[tokio::test]
async fn agent_token_without_node_claim_is_denied_fail_closed() {
    let f = fixture("unbound").await;
    let admin = ControlPlane::shared().client().await;
    let unbound = ControlPlane::shared()
        .client_for_token(&agent_token(&admin, None).await)
        .unwrap();
    let pods = Api::<Pod>::namespaced(unbound, &f.ns);
    // Even for a pod on "its" node: with no claim there is no node to compare.
    for name in ["on-a", "on-b"] {
        let err = resize(&pods, name, &raise_limit("300m"), false)
            .await
            .expect_err("resize without node claim admitted");
        let msg = api_message(&err).unwrap_or_default();
        assert!(msg.contains(MSG_NO_CLAIM), "{name}: {msg}");
    }
}

#[tokio::test]
async fn policy_leaves_other_users_alone() {
    let f = fixture("others").await;
    let admin = ControlPlane::shared().client().await;
    let pods = Api::<Pod>::namespaced(admin, &f.ns);
    resize(&pods, "on-b", &raise_limit("250m"), false)
        .await
        .unwrap();
}

// ------------------------------------------------------- agent end to end

/// A kubeconfig that authenticates with a bearer token only.
fn token_kubeconfig(cp: &ControlPlane, token: &str, path: &Path) {
    let ca = path.with_extension("ca.pem");
    std::fs::write(&ca, cp.ca_pem()).unwrap();
    let kc = testkit::certs::Kubeconfig {
        server: cp.base_url(),
        ca: &ca.display().to_string(),
        user: "agent",
        auth: testkit::certs::KubeconfigAuth::Token(token),
        namespace: None,
    }
    .yaml();
    std::fs::write(path, kc).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_with_pod_bound_token_runs_end_to_end_against_simulated_node() {
    use testkit::agent::{fast_args, metric};
    use testkit::scenario::Scenario;
    use testkit::scenario::pod::{cpu_limit, touched_by_agent};

    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    install_base(&admin).await;
    let mut s = Scenario::builder("deploy-e2e").nodes(2).start().await;
    let (ns, node_a, node_b) = (
        s.ns.clone(),
        s.nodes[0].name.clone(),
        s.nodes[1].name.clone(),
    );
    // The agent's own pod on node a (what the DaemonSet would create), and a
    // token bound to it: the apiserver puts node a's name in the token.
    let agent_pod = Api::<Pod>::namespaced(admin.clone(), AGENT_NS)
        .create(
            &PostParams::default(),
            &pod(&format!("agent-{ns}"), &node_a, Some(AGENT_SA)),
        )
        .await
        .unwrap();
    let kubeconfig = s.dir.path().join("agent.kubeconfig");
    token_kubeconfig(
        cp,
        &agent_token(&admin, Some(&agent_pod)).await,
        &kubeconfig,
    );

    let pods = Api::<Pod>::namespaced(admin.clone(), &ns);
    for (name, node) in [("on-a", &node_a), ("on-b", &node_b)] {
        pods.create(&PostParams::default(), &pod(name, node, None))
            .await
            .unwrap();
    }
    let opts = s.agent_options(0).kubeconfig(&kubeconfig).args(fast_args());
    s.start_agent_with(0, opts).await;
    // request 100m → ceiling 400m on an idle node.
    s.wait_pod("on-a", "the agent raises its own node's pod", |p| {
        cpu_limit(p, "c").as_deref() == Some("400m")
    })
    .await;
    assert!(touched_by_agent(&s.get("on-a").await));
    let b = pods.get("on-b").await.unwrap();
    assert_eq!(
        b.metadata.generation,
        Some(1),
        "pod on the other node patched"
    );
    let m = s.scrape().await;
    assert_eq!(
        metric(&m, "headroom_patch_errors_total", &[("class", "forbidden")]).unwrap_or(0.0),
        0.0,
        "{}",
        s.agent().log_tail(20)
    );
    assert!(metric(&m, "headroom_resizes_total", &[("result", "applied")]).unwrap_or(0.0) >= 1.0);
}

// ------------------------------------------------------- network policy

/// `matchLabels` of a label selector (the policy uses no expressions; a
/// selector with any is refused here rather than half-evaluated).
fn selects(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    assert!(
        selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty),
        "matchExpressions not evaluated by this test: {selector:?}"
    );
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn network_policy_admits_only_prometheus_to_the_metrics_port() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    install_base(&admin).await;
    // As the apiserver stored them, not as the files say.
    let np = Api::<NetworkPolicy>::namespaced(admin.clone(), AGENT_NS)
        .get("headroom-agent-metrics")
        .await
        .expect("NetworkPolicy applied");
    let ds = Api::<DaemonSet>::namespaced(admin.clone(), AGENT_NS)
        .get("headroom-agent")
        .await
        .unwrap();
    let spec = np.spec.unwrap();
    let template = ds.spec.template;
    let agent_labels = template.metadata.unwrap().labels.unwrap();
    let pod_selector = spec.pod_selector.clone().expect("podSelector");
    assert!(
        selects(&pod_selector, &agent_labels),
        "policy does not select the agent pods"
    );
    assert!(
        pod_selector.match_labels.iter().flatten().count() > 0,
        "an empty podSelector would isolate every pod of the namespace"
    );
    // Ingress only: egress to the API server stays open.
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));

    let rules = spec.ingress.unwrap();
    assert_eq!(rules.len(), 1, "{rules:?}");
    let rule = &rules[0];
    // The port is the DaemonSet's named metrics port, which is the one the
    // agent serves on.
    let ports = rule.ports.clone().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, Some(IntOrString::String("metrics".into())));
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    let container = &template.spec.unwrap().containers[0];
    let port = container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("the DaemonSet names its metrics port");
    assert_eq!(port.container_port, 9464);
    assert!(
        container
            .args
            .iter()
            .flatten()
            .any(|a| a == "--metrics-addr=0.0.0.0:9464")
    );

    // One peer with both selectors (AND): Prometheus pods in the monitoring
    // namespace; two peers would admit either (OR).
    let peers = rule.from.clone().unwrap();
    assert_eq!(peers.len(), 1, "{peers:?}");
    let ns_sel = peers[0]
        .namespace_selector
        .clone()
        .expect("namespaceSelector");
    let pod_sel = peers[0].pod_selector.clone().expect("podSelector");
    assert!(peers[0].ip_block.is_none());

    // The namespace label it keys on is the one the apiserver sets itself.
    let monitoring = Api::<Namespace>::all(admin.clone());
    let _ = monitoring
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "monitoring"}})).unwrap(),
        )
        .await;
    let mon_labels = monitoring
        .get("monitoring")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    let other_ns = cp.namespace("not-monitoring").await;
    let other_labels = monitoring
        .get(&other_ns)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert!(
        selects(&ns_sel, &mon_labels),
        "{ns_sel:?} vs {mon_labels:?}"
    );
    assert!(!selects(&ns_sel, &other_labels));

    // Labels prometheus-operator puts on its Prometheus pods.
    let prometheus = labels(&[
        ("app.kubernetes.io/name", "prometheus"),
        ("app.kubernetes.io/instance", "k8s"),
        ("prometheus", "k8s"),
    ]);
    assert!(selects(&pod_sel, &prometheus));
    for other in [
        labels(&[]),
        labels(&[("app.kubernetes.io/name", "grafana")]),
        agent_labels.clone(),
    ] {
        assert!(!selects(&pod_sel, &other), "{other:?} admitted");
    }
}

/// The agent's pod, from the DaemonSet template, as a Pod in `ns`.
fn agent_pod_from_template(ns: &str, without_host_path: bool) -> Pod {
    let objs = load(&deploy_dir().join("base")).unwrap();
    let ds = objs.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let mut spec = ds["spec"]["template"]["spec"].clone();
    if without_host_path {
        spec["volumes"] = json!([]);
        spec["containers"][0]["volumeMounts"] = json!([]);
    }
    // The ServiceAccount exists only in headroom-system; Pod Security does not look at it.
    spec["serviceAccountName"] = json!("default");
    spec["priorityClassName"] = Value::Null;
    serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": ns},
        "spec": spec,
    }))
    .unwrap()
}

/// Why deploy/base/namespace.yaml asks for Pod Security `privileged`: under
/// `baseline` and `restricted` the API server refuses the agent's pod for its
/// read-only hostPath volume and for nothing else (the same pod without the
/// volume is admitted under `restricted`).
#[tokio::test]
async fn agent_pod_needs_privileged_pod_security_only_for_its_host_path() {
    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone());
    for (level, violation) in [
        ("baseline", "hostPath volumes (volume \"host-cgroup\")"),
        (
            "restricted",
            "restricted volume types (volume \"host-cgroup\" uses restricted volume type \"hostPath\")",
        ),
    ] {
        let ns = cp.namespace(&format!("pss-{level}")).await;
        let label = json!({"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": level,
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}});
        namespaces
            .patch(&ns, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();
        let pods = Api::<Pod>::namespaced(admin.clone(), &ns);
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let err = match pods
            .create(&dry, &agent_pod_from_template(&ns, false))
            .await
        {
            Ok(_) => panic!("the agent pod must be refused under {level}"),
            Err(e) => e,
        };
        let msg = api_message(&err).unwrap_or_default();
        // The violations follow the level, ", "-separated: exactly one here.
        assert!(
            msg.ends_with(&format!(
                "violates PodSecurity \"{level}:latest\": {violation}"
            )),
            "{level}: {err}"
        );
        pods.create(&dry, &agent_pod_from_template(&ns, true))
            .await
            .unwrap_or_else(|e| panic!("{level}: without the hostPath the pod is admitted: {e}"));
    }
}
