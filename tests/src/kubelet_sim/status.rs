//! The pod status the simulated kubelet reports, as a JSON merge patch body for
//! the status subresource. Lists (conditions, container statuses) are sent whole:
//! a merge patch replaces them, which is how the condition is cleared.

use std::collections::BTreeMap;

use headroom::quantity::format_cpu_millis;
use serde_json::{Map, Value, json};

use super::faults::Fault;
use super::plan::{ContainerKind, ContainerPlan, PodPlan, Quantities};

/// Everything the status is built from.
pub struct StatusInput<'a> {
    /// The resources the kubelet believes it has actuated.
    pub reported: &'a PodPlan,
    /// Allocated resources (what the kubelet admitted: the applied spec).
    pub allocated: &'a PodPlan,
    /// Container name → `containerID` URI.
    pub ids: &'a BTreeMap<String, String>,
    /// Limit (millicores) the runtime reads back, per container name, when it
    /// differs from the spec (a wrong value was written).
    pub read_back_m: &'a BTreeMap<String, u64>,
    /// Same for the pod cgroup (pod-level limit), when it differs.
    pub pod_read_back_m: Option<u64>,
    pub observed_generation: i64,
    /// Generation of a resize in progress (condition `PodResizeInProgress=True`).
    pub resize_in_progress: Option<i64>,
    pub fault: &'a Fault,
    /// RFC 3339 time the pod started.
    pub started_at: &'a Value,
    pub host_ip: &'a str,
}

fn with_cpu(q: &Quantities, cpu_m: Option<u64>) -> Value {
    let mut m: Map<String, Value> = q.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    if let Some(c) = cpu_m {
        m.insert("cpu".into(), json!(format_cpu_millis(c)));
    }
    Value::Object(m)
}

fn reported_resources(c: &ContainerPlan, inp: &StatusInput) -> Value {
    let req = c.request_m.map(|m| inp.fault.reported_request_m(m));
    let lim = inp.read_back_m.get(&c.name).copied().or(c.limit_m);
    json!({"requests": with_cpu(&c.requests, req), "limits": with_cpu(&c.limits, lim)})
}

fn container_status(c: &ContainerPlan, alloc: Option<&ContainerPlan>, inp: &StatusInput) -> Value {
    let state = match c.kind {
        ContainerKind::Init => json!({"terminated": {
            "exitCode": 0, "reason": "Completed",
            "startedAt": inp.started_at, "finishedAt": inp.started_at,
        }}),
        _ => json!({"running": {"startedAt": inp.started_at}}),
    };
    let running = c.kind != ContainerKind::Init;
    let mut s = json!({
        "name": c.name,
        "image": "registry.k8s.io/pause:3.10",
        "imageID": "registry.k8s.io/pause@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a",
        "containerID": inp.ids.get(&c.name),
        "ready": running,
        "started": running,
        "restartCount": 0,
        "state": state,
    });
    if running && let Value::Object(m) = &mut s {
        m.insert("resources".into(), reported_resources(c, inp));
        let alloc_req = alloc.map_or(&c.requests, |a| &a.requests);
        if !alloc_req.is_empty() {
            m.insert("allocatedResources".into(), with_cpu(alloc_req, None));
        }
    }
    s
}

fn condition(kind: &str, generation: i64, now: &Value) -> Value {
    json!({"type": kind, "status": "True", "observedGeneration": generation,
           "lastProbeTime": null, "lastTransitionTime": now})
}

/// The status body: `{"status": {...}}`.
pub fn status_patch(inp: &StatusInput) -> Value {
    let plan = inp.reported;
    let statuses = |kinds: &[ContainerKind]| -> Vec<Value> {
        plan.containers
            .iter()
            .filter(|c| kinds.contains(&c.kind))
            .map(|c| container_status(c, inp.allocated.container(&c.name), inp))
            .collect()
    };
    let g = inp.observed_generation;
    let mut conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .map(|k| condition(k, g, inp.started_at))
    .collect();
    if let Some(rg) = inp.resize_in_progress {
        conditions.push(json!({"type": "PodResizeInProgress", "status": "True",
            "observedGeneration": rg, "lastProbeTime": null,
            "lastTransitionTime": inp.started_at}));
    }
    let mut status = json!({
        "phase": "Running",
        "observedGeneration": g,
        "hostIP": inp.host_ip,
        "hostIPs": [{"ip": inp.host_ip}],
        "podIP": "10.244.0.10",
        "podIPs": [{"ip": "10.244.0.10"}],
        "startTime": inp.started_at,
        "conditions": conditions,
        "initContainerStatuses": statuses(&[ContainerKind::Sidecar, ContainerKind::Init]),
        "containerStatuses": statuses(&[ContainerKind::App]),
    });
    if let (Some(req), Some(lim), Value::Object(m)) =
        (&plan.pod_requests, &plan.pod_limits, &mut status)
    {
        let r = plan.pod_request_m.map(|x| inp.fault.reported_request_m(x));
        m.insert(
            "resources".into(),
            json!({"requests": with_cpu(req, r),
                   "limits": with_cpu(lim, inp.pod_read_back_m.or(plan.pod_limit_m))}),
        );
        if let Some(areq) = &inp.allocated.pod_requests {
            m.insert("allocatedResources".into(), with_cpu(areq, None));
        }
    }
    json!({ "status": status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn reports_resources_read_back_and_under_reported_requests() {
        let pod: Pod = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "c", "image": "x", "resources": {
                "requests": {"cpu": "100m", "memory": "64Mi"},
                "limits": {"cpu": "101m"}}}
        ]}, "status": {"qosClass": "Burstable"}}))
        .expect("pod");
        let plan = PodPlan::from_pod(&pod).expect("plan");
        let ids = BTreeMap::from([("c".to_string(), "containerd://ab".to_string())]);
        let rb = BTreeMap::from([("c".to_string(), 110)]);
        let fault = Fault::UnderReportRequests { factor: 0.79 };
        let now = json!("2026-11-08T00:00:00Z");
        let body = status_patch(&StatusInput {
            reported: &plan,
            allocated: &plan,
            ids: &ids,
            read_back_m: &rb,
            pod_read_back_m: None,
            observed_generation: 2,
            resize_in_progress: Some(3),
            fault: &fault,
            started_at: &now,
            host_ip: "10.0.0.1",
        });
        let cs = &body["status"]["containerStatuses"][0];
        assert_eq!(cs["containerID"], "containerd://ab");
        assert_eq!(cs["resources"]["limits"]["cpu"], "110m");
        assert_eq!(cs["resources"]["requests"]["cpu"], "79m");
        assert_eq!(cs["resources"]["requests"]["memory"], "64Mi");
        assert_eq!(cs["allocatedResources"]["cpu"], "100m");
        let conds = body["status"]["conditions"].as_array().expect("conds");
        let resize = conds
            .iter()
            .find(|c| c["type"] == "PodResizeInProgress")
            .expect("cond");
        assert_eq!(resize["observedGeneration"], 3);
        assert_eq!(body["status"]["observedGeneration"], 2);
    }
}
