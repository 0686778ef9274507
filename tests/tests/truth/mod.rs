//! The truth suites' one driver: a [`Case`] creates one pod bound to a Node that no
//! kubelet backs (and that has no status unless the case writes one, so the apiserver
//! assumes the node supports resize), sends its resize patches in order and checks
//! each answer against an [`Expect`].
//!
//! Shared by `truth_resize.rs` and `truth_podlevel_gate_off.rs`, which differ only in
//! the control plane (feature gates) and the cases.

#![allow(
    dead_code,
    reason = "each truth suite is its own crate and uses part of the kit"
)]

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::control_plane::{ControlPlane, api_message, resize};

/// Node the pods are bound to: 1.37's resize admission needs it to exist.
pub const NODE: &str = "truth-node";
const IMAGE: &str = "registry.k8s.io/pause:3.10";

/// A control plane and the features its [`NODE`] declares.
pub struct Suite {
    pub control_plane: fn() -> &'static ControlPlane,
    pub declared_features: &'static [&'static str],
}

/// The Node a case's pod is bound to.
#[derive(Debug, Clone, Copy)]
pub enum Node {
    /// The suite's [`NODE`], declaring the suite's features.
    Suite,
    /// A Node of this name that declares no features.
    Undeclared(&'static str),
    /// A name no Node object has.
    Missing(&'static str),
}

impl Node {
    fn name(self) -> &'static str {
        match self {
            Node::Suite => NODE,
            Node::Undeclared(n) | Node::Missing(n) => n,
        }
    }
}

/// One resize request: a patch of the `resize` subresource, maybe a dry run.
pub struct Resize {
    pub patch: Patch<Value>,
    pub dry_run: bool,
}

impl From<Patch<Value>> for Resize {
    fn from(patch: Patch<Value>) -> Resize {
        Resize {
            patch,
            dry_run: false,
        }
    }
}

/// The same resize as a dry run.
pub fn dry_run(patch: Patch<Value>) -> Resize {
    Resize {
        patch,
        dry_run: true,
    }
}

/// Strategic-merge resize of container `c`'s resources.
pub fn container_patch(resources: Value) -> Patch<Value> {
    Patch::Strategic(json!({"spec": {"containers": [{"name": "c", "resources": resources}]}}))
}

/// Strategic-merge resize of pod-level resources.
pub fn pod_patch(resources: Value) -> Patch<Value> {
    Patch::Strategic(json!({"spec": {"resources": resources}}))
}

/// What an admitted step's check sees.
pub struct Answer<'a> {
    /// The pod the resize call returned.
    pub pod: &'a Pod,
    /// The pod as the create returned it.
    pub created: &'a Pod,
    /// The pod read back after the resize.
    pub stored: &'a Pod,
}

/// What the server must do with one resize.
pub enum Expect {
    /// Admitted; the function checks the answer (`|_| {}` when admission is all).
    Admitted(fn(&Answer<'_>)),
    /// Refused with a Status message that contains the text; the pod is unchanged.
    Refused(&'static str),
    /// Refused with exactly this Status message; the pod is unchanged.
    RefusedExactly(String),
    /// Refused with a message that starts with `prefix` and contains `text`; the
    /// pod is unchanged.
    RefusedStarting {
        prefix: &'static str,
        text: &'static str,
    },
}

struct Step {
    resize: Resize,
    expect: Expect,
}

/// One pod and the resizes sent to it, in order.
pub struct Case {
    /// Prefix of the case's own namespace.
    ns: &'static str,
    name: &'static str,
    node: Node,
    container: Value,
    pod_level: Option<Value>,
    sidecar: Option<Value>,
    on_created: Option<fn(&Pod)>,
    status: Option<Value>,
    steps: Vec<Step>,
}

impl Case {
    /// Pod `name` with one pause container `c` whose `resources` are `container`,
    /// in a fresh namespace named after `ns`, bound to the suite's node.
    pub fn new(ns: &'static str, name: &'static str, container: Value) -> Case {
        Case {
            ns,
            name,
            node: Node::Suite,
            container,
            pod_level: None,
            sidecar: None,
            on_created: None,
            status: None,
            steps: Vec::new(),
        }
    }

    /// `spec.resources` (pod-level resources).
    pub fn pod_level(mut self, resources: Value) -> Case {
        self.pod_level = Some(resources);
        self
    }

    /// A sidecar (`restartPolicy: Always` init container) `s` with these resources.
    pub fn sidecar(mut self, resources: Value) -> Case {
        self.sidecar = Some(resources);
        self
    }

    pub fn on(mut self, node: Node) -> Case {
        self.node = node;
        self
    }

    /// Checks the pod as the create returned it (what defaulting filled in).
    pub fn created(mut self, check: fn(&Pod)) -> Case {
        self.on_created = Some(check);
        self
    }

    /// A strategic-merge status patch written after the create, before any resize.
    pub fn status(mut self, status: Value) -> Case {
        self.status = Some(status);
        self
    }

    pub fn step(mut self, resize: impl Into<Resize>, expect: Expect) -> Case {
        self.steps.push(Step {
            resize: resize.into(),
            expect,
        });
        self
    }

    /// An admitted resize and nothing more to check.
    pub fn admits(self, resize: impl Into<Resize>) -> Case {
        self.step(resize, Expect::Admitted(|_| {}))
    }

    /// An admitted resize whose answer `check` looks at.
    pub fn admits_then(self, resize: impl Into<Resize>, check: fn(&Answer<'_>)) -> Case {
        self.step(resize, Expect::Admitted(check))
    }

    /// A resize refused with a message containing `text`.
    pub fn refuses(self, resize: impl Into<Resize>, text: &'static str) -> Case {
        self.step(resize, Expect::Refused(text))
    }

    fn pod_json(&self) -> Value {
        let mut spec = json!({
            "nodeName": self.node.name(),
            "containers": [{"name": "c", "image": IMAGE, "resources": self.container}],
        });
        if let Some(r) = &self.pod_level {
            spec["resources"] = r.clone();
        }
        if let Some(r) = &self.sidecar {
            spec["initContainers"] =
                json!([{"name": "s", "image": IMAGE, "restartPolicy": "Always", "resources": r}]);
        }
        json!({"metadata": {"name": self.name}, "spec": spec})
    }

    /// Creates the pod, then sends and checks every step; panics at the first miss,
    /// naming the step.
    pub async fn run(self, suite: &Suite) {
        let cp = (suite.control_plane)();
        cp.ensure_node(NODE, "4", "16Gi", suite.declared_features)
            .await
            .expect("node");
        if let Node::Undeclared(n) = self.node {
            cp.ensure_node(n, "4", "16Gi", &[]).await.expect("node");
        }
        let ns = cp.namespace(self.ns).await;
        let api: Api<Pod> = Api::namespaced(cp.client().await, &ns);
        let name = self.name;
        let pod: Pod = serde_json::from_value(self.pod_json()).expect("pod json");
        let created = api
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
        if let Some(check) = self.on_created {
            check(&created);
        }
        if let Some(status) = self.status {
            api.patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
                .await
                .expect("status patch");
        }
        for (i, step) in self.steps.into_iter().enumerate() {
            let at = format!("step {} of {name}", i + 1);
            match step.expect {
                Expect::Admitted(check) => {
                    let pod = admitted(&api, name, &step.resize, &at).await;
                    let stored = api.get(name).await.expect("get pod");
                    check(&Answer {
                        pod: &pod,
                        created: &created,
                        stored: &stored,
                    });
                }
                Expect::Refused(text) => {
                    let msg = refused(&api, name, &step.resize, text, &at).await;
                    assert!(msg.contains(text), "{at}: message {msg:?} lacks {text:?}");
                }
                Expect::RefusedExactly(text) => {
                    let msg = refused(&api, name, &step.resize, &text, &at).await;
                    assert_eq!(msg, text, "{at}");
                }
                Expect::RefusedStarting { prefix, text } => {
                    let msg = refused(&api, name, &step.resize, text, &at).await;
                    assert!(msg.contains(text), "{at}: message {msg:?} lacks {text:?}");
                    assert!(msg.starts_with(prefix), "{at}: {msg}");
                }
            }
        }
    }
}

async fn admitted(api: &Api<Pod>, name: &str, r: &Resize, at: &str) -> Pod {
    match resize(api, name, &r.patch, r.dry_run).await {
        Ok(p) => p,
        Err(e) => panic!("{at}: resize {:?} of {name} was refused: {e}", r.patch),
    }
}

/// Sends a resize that must be refused; returns the Status message after checking
/// that the pod's resourceVersion did not move.
async fn refused(api: &Api<Pod>, name: &str, r: &Resize, want: &str, at: &str) -> String {
    let before = api.get(name).await.expect("get pod");
    let err = match resize(api, name, &r.patch, r.dry_run).await {
        Ok(p) => panic!(
            "{at}: resize {:?} of {name} was admitted, expected refusal {want:?}; \
             container resources now {}, pod-level {}",
            r.patch,
            ctr_res(&p),
            pod_res(&p)
        ),
        Err(e) => e,
    };
    let msg = api_message(&err)
        .unwrap_or_else(|| panic!("{at}: not an API error: {err}"))
        .to_string();
    let after = api.get(name).await.expect("get pod");
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "{at}: a refused resize changed the pod"
    );
    msg
}

/// Container `c`'s resources as JSON.
pub fn ctr_res(pod: &Pod) -> Value {
    serde_json::to_value(&pod.spec.as_ref().expect("spec").containers[0].resources).expect("json")
}

/// Sidecar `s`'s resources as JSON.
pub fn sidecar_res(pod: &Pod) -> Value {
    let spec = pod.spec.as_ref().expect("spec");
    let init = &spec.init_containers.as_ref().expect("init")[0];
    serde_json::to_value(&init.resources).expect("json")
}

/// Pod-level resources as JSON.
pub fn pod_res(pod: &Pod) -> Value {
    serde_json::to_value(&pod.spec.as_ref().expect("spec").resources).expect("json")
}

/// Container `c`'s image.
pub fn image(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().expect("spec").containers[0]
        .image
        .as_deref()
}

/// The `kubernetes_feature_enabled` line of `gate` in the apiserver's /metrics.
pub async fn gate_metric(cp: &ControlPlane, gate: &str) -> Option<String> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let metrics = cp.client().await.request_text(req).await.expect("/metrics");
    let prefix = format!(r#"kubernetes_feature_enabled{{name="{gate}",stage="#);
    metrics
        .lines()
        .find(|l| l.starts_with(&prefix))
        .map(str::to_string)
}

/// The feature gate (and node-declared feature) of pod-level resize.
pub const PODLEVEL_FEATURE: &str = "InPlacePodLevelResourcesVerticalScaling";

/// Pod-level resources cpu 100m/500m, memory 64Mi/128Mi: a Burstable pod
/// whose pod-level limit a resize can change.
pub fn pod_level_100m_500m() -> Value {
    json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}})
}

/// Container (or pod) resources with only a CPU limit.
pub fn cpu_limit(cpu: &str) -> Value {
    json!({"limits": {"cpu": cpu}})
}
