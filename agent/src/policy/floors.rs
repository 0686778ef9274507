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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ANN_ADOPT, ANN_CEILING, Resources};
    use crate::policy::eligibility;
    use crate::policy::tests::fixtures::*;

    fn floor_of(p: &PodView, extra: Option<Millis>) -> Floor {
        let shape = eligibility(p, &ctx(Some(true))).unwrap();
        floor(p, &shape, 10, extra)
    }

    /// docs/kubelet-behaviour.md §4 pod `case`: container "c", pod-level
    /// resources, adopt-unlimited, and the floor (value, QoS guard, bound by
    /// a container limit) that keeps what the apiserver refused out of reach.
    type DocCase = (
        &'static str,
        Resources,
        Resources,
        bool,
        (Millis, bool, bool),
    );

    // One row a line, so the table reads as one.
    #[rustfmt::skip]
    const DOC_CASES: &[DocCase] = &[
        // a: req 100m/64Mi, lim 500m/128Mi; c req 100m: the pod request.
        ("a", res(Some(100), None, None, None), res(Some(100), Some(500), Some(64 * MI), Some(128 * MI)), false, (100, false, false)),
        // b: as a, container lim 400m → 300m refused: the largest container limit.
        ("b", res(Some(100), Some(400), None, None), res(Some(100), Some(500), Some(64 * MI), Some(128 * MI)), false, (400, false, true)),
        // c with adoption: → 100m refused (under the 110m filled-in request).
        ("c", res(Some(110), None, None, None), res(Some(110), None, Some(64 * MI), Some(128 * MI)), true, (110, false, false)),
        // d after c lim → 700m: pod → 300m refused.
        ("d", res(Some(110), Some(700), None, None), res(Some(110), Some(800), Some(64 * MI), Some(128 * MI)), false, (700, false, true)),
        // e: req cpu 100m/mem 128Mi, lim cpu 500m/mem 128Mi: 100m refused, 101m ok (memory equal: strictly above the request).
        ("e", res(Some(100), None, None, None), res(Some(100), Some(500), Some(128 * MI), Some(128 * MI)), false, (110, true, false)),
    ];

    #[test]
    fn floor_doc_cases() {
        for &(case, c, pod_r, adopt, want) in DOC_CASES {
            let mut p = pod_level(case, c, pod_r);
            if adopt {
                p.annotations.insert(ANN_ADOPT.into(), "true".into());
            }
            let f = floor_of(&p, None);
            assert_eq!(
                (f.floor_m, f.qos_guard, f.container_limit_bound),
                want,
                "pod {case}"
            );
        }
    }

    #[test]
    fn floor_case_f_guaranteed_is_never_managed() {
        let p = pod_level(
            "f",
            res(Some(100), None, None, None),
            res(Some(500), Some(500), Some(128 * MI), Some(128 * MI)),
        );
        assert!(eligibility(&p, &ctx(Some(true))).is_err());
    }

    #[test]
    fn container_qos_floor_one_quantum_above_when_guaranteed_would_follow() {
        // cpu 100m/300m, mem 64Mi/64Mi: limit = request would be Guaranteed.
        let p = pod(
            "q",
            vec![container(
                "c",
                res(Some(100), Some(300), Some(64 * MI), Some(64 * MI)),
            )],
        );
        let f = floor_of(&p, None);
        assert_eq!(f.floor_m, 110);
        assert!(f.qos_guard);
        // With a memory limit above request, no guard is needed.
        assert_eq!(floor_of(&simple("s", 100, Some(300)), None).floor_m, 100);
    }

    #[test]
    fn learned_floor_lifts_the_floor() {
        let f = floor_of(&simple("s", 100, Some(300)), Some(250));
        assert_eq!(f.floor_m, 250);
        assert!(f.learned);
        assert!(!floor_of(&simple("s", 100, Some(300)), Some(50)).learned);
    }

    #[test]
    fn ceiling_default_annotation_capacity_and_floor() {
        let p = simple("s", 100, Some(300));
        assert_eq!(ceiling(&p, 100, 100, 4.0, 8000, None), 400);
        assert_eq!(ceiling(&p, 100, 100, 4.0, 250, None), 250);
        assert_eq!(ceiling(&p, 105, 105, 4.0, 8000, None), 420);
        // Not rounded to a quantum grid: a big quantum cannot pull it down.
        assert_eq!(ceiling(&p, 10, 10, 1.5, 8000, None), 15);
        let mut a = p.clone();
        a.annotations.insert(ANN_CEILING.into(), "1.5".into());
        assert_eq!(ceiling(&a, 100, 100, 4.0, 8000, None), 1500);
        a.annotations.insert(ANN_CEILING.into(), "bogus".into());
        assert_eq!(ceiling(&a, 100, 100, 4.0, 8000, None), 400);
        a.annotations.insert(ANN_CEILING.into(), "50m".into());
        assert_eq!(ceiling(&a, 100, 110, 4.0, 8000, None), 110);
        // The default ceiling never falls below the declared limit (even above
        // capacity: lowering it there changes nothing the kernel enforces on an
        // idle node, and opting in must not lower a limit); the annotation, the
        // user's explicit cap, still wins.
        assert_eq!(ceiling(&p, 10, 10, 4.0, 8000, Some(100)), 100);
        assert_eq!(ceiling(&p, 100, 100, 4.0, 8000, Some(300)), 400);
        assert_eq!(ceiling(&p, 100, 100, 4.0, 250, Some(300)), 300);
        a.annotations.insert(ANN_CEILING.into(), "50m".into());
        assert_eq!(ceiling(&a, 10, 10, 4.0, 8000, Some(100)), 50);
    }
}
