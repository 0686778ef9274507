//! Floors and ceilings of a managed pod's CPU limit, in the unit the shape
//! patches (sum of managed container limits, or the pod-level limit).

use crate::model::{ANN_CEILING, Millis, PodView, Qos, compute_qos};
use crate::quantity;

use super::eligibility::{ManagedContainer, ManagedShape};

/// Lowest limit Headroom may set, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Floor {
    pub floor_m: Millis,
    /// The floor is one quantum above what the apiserver would otherwise
    /// allow, so the QoS class stays Burstable.
    pub qos_guard: bool,
    /// Pod-level: the largest container CPU limit lifted the floor.
    pub container_limit_bound: bool,
    /// The caller's learned floor (from a refusal) lifted the floor.
    pub learned: bool,
    /// `floor = "declared"`: the limit the workload declares lifted the floor.
    pub declared_bound: bool,
}

/// Floor of the managed limit.
///
/// Container level: the managed containers' requests; if limits equal to
/// requests would make the pod Guaranteed, one quantum more.
/// Pod level (docs/kubelet-behaviour.md §4): max(pod CPU request, largest container CPU limit);
/// if a limit equal to the request would make the pod Guaranteed (pod-level
/// memory request == limit), strictly above: request + quantum.
/// `extra_floor_m` (learned from refusals) raises it further.
pub fn floor(
    pod: &PodView,
    shape: &ManagedShape,
    quantum_m: Millis,
    extra_floor_m: Option<Millis>,
) -> Floor {
    let mut f = Floor {
        floor_m: 0,
        qos_guard: false,
        container_limit_bound: false,
        learned: false,
        declared_bound: false,
    };
    match shape {
        ManagedShape::Containers(managed) => {
            let request: Millis = managed.iter().map(|c| c.request_m).sum();
            f.floor_m = request;
            if guaranteed_at_request(pod, managed) {
                f.floor_m = request.saturating_add(quantum_m);
                f.qos_guard = true;
            }
        }
        ManagedShape::PodLevel { request_m, .. } => {
            let largest = pod
                .containers
                .iter()
                .filter_map(|c| c.resources.cpu_limit)
                .max()
                .unwrap_or(0);
            let mut pr = pod.pod_resources.unwrap_or_default();
            pr.cpu_request = Some(*request_m);
            pr.cpu_limit = Some(*request_m);
            let guard = compute_qos(&pod.containers, Some(&pr)) == Qos::Guaranteed;
            let base = if guard {
                request_m.saturating_add(quantum_m)
            } else {
                *request_m
            };
            f.qos_guard = guard && base >= largest;
            f.container_limit_bound = largest > base;
            f.floor_m = base.max(largest);
        }
    }
    if let Some(extra) = extra_floor_m.filter(|e| *e > f.floor_m) {
        f.floor_m = extra;
        f.learned = true;
    }
    f
}

/// `floor = "declared"`: the floor is at least the limit the workload
/// declares (`declared_m`, only a known declaration — never the current limit
/// standing in for an unknown one, or a raised pod could never come down).
/// The request-based floor still wins where it is higher (QoS guard, learned
/// floors).
pub fn lift_to_declared(mut f: Floor, declared_m: Option<Millis>) -> Floor {
    if let Some(d) = declared_m.filter(|d| *d > f.floor_m) {
        f.floor_m = d;
        f.declared_bound = true;
    }
    f
}

/// Would the pod be Guaranteed with every managed container's CPU limit at
/// its request? Mirrors [`compute_qos`] without cloning the containers
/// (the property tests check the two agree on every plan).
fn guaranteed_at_request(pod: &PodView, managed: &[ManagedContainer]) -> bool {
    if let Some(p) = pod.pod_resources.as_ref().filter(|p| {
        p.cpu_request.is_some()
            || p.mem_request.is_some()
            || p.cpu_limit.is_some()
            || p.mem_limit.is_some()
    }) {
        return compute_qos(&[], Some(p)) == Qos::Guaranteed;
    }
    !pod.containers.is_empty()
        && pod.containers.iter().all(|c| {
            let r = &c.resources;
            let cpu_limit = match managed.iter().find(|m| m.name == c.name) {
                Some(m) => Some(m.request_m),
                None => r.cpu_limit,
            };
            cpu_limit.is_some()
                && r.mem_limit.is_some()
                && r.cpu_request == cpu_limit
                && r.mem_request == r.mem_limit
        })
}

/// Ceiling of the managed limit: the `headroom.dev/ceiling` annotation if it
/// parses (the user's explicit cap, never above `capacity_m`); else the
/// default, request × `factor` capped at `capacity_m` but never below the
/// limit the workload declares (`declared_m`), so opting in never lowers a
/// limit on an idle node. Never below `floor_m`. Not rounded to the quantum:
/// rounding down would let a large quantum pull every ceiling to the request
/// (the water-filling's last step may be a partial one that ends exactly
/// here).
pub fn ceiling(
    pod: &PodView,
    request_m: Millis,
    floor_m: Millis,
    factor: f64,
    capacity_m: Millis,
    declared_m: Option<Millis>,
) -> Millis {
    let from_annotation = pod
        .annotation(ANN_CEILING)
        .and_then(|v| quantity::cpu_millis(v).ok());
    let raw = match from_annotation {
        Some(a) => a.min(capacity_m),
        None => scale(request_m, factor)
            .min(capacity_m)
            .max(declared_m.unwrap_or(0)),
    };
    raw.max(floor_m)
}

/// `m × factor`, saturating, rounded down; `m` itself for a factor below 1
/// or not finite (a ceiling never falls below the request because of it).
pub fn scale(m: Millis, factor: f64) -> Millis {
    let v = m as f64 * factor;
    if v.is_finite() && factor >= 1.0 {
        // `as` saturates at u64::MAX.
        v as Millis
    } else {
        m
    }
}
