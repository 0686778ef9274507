//! Ways the simulated kubelet can misbehave, switched on per pod by tests.

use std::time::Duration;

/// A per-pod fault. Faults are consulted whenever the simulator writes the pod's
/// `cpu.max` files or reports its status, so a fault set before the pod appears
/// also affects its creation.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Fault {
    #[default]
    None,
    /// Resizes are acknowledged (`PodResizeInProgress=True`) but never applied:
    /// cgroups and status keep the old values while the fault lasts.
    NeverApply,
    /// Write `cpu_max` (e.g. `"11000 100000"` for a 101m limit) instead of the
    /// correct value into one container's cgroup, or the pod cgroup when `container`
    /// is None. Status reports the wrong limit read back (quota × 1000 / period, rounded up),
    /// like the 101m → 110m case in docs/kubelet-behaviour.md §4.
    WrongValue {
        container: Option<String>,
        cpu_max: String,
    },
    /// A resize updates the pod cgroup but not the container cgroups; status claims
    /// the new values anyway.
    PodOnly,
    /// A resize is applied to the cgroups on time, but status (resources,
    /// observedGeneration, condition cleared) lags by this much more.
    StaleStatus(Duration),
    /// `status.resources.requests.cpu` (container and pod level) reports
    /// `factor` × the spec request, like docs/kubelet-behaviour.md §4's 79m for 100m on 1.36.1.
    UnderReportRequests { factor: f64 },
}

impl Fault {
    /// The `cpu.max` to write for a target cgroup (container name, or None for the pod
    /// cgroup) instead of `correct`; None = write nothing (keep the old content).
    pub fn cpu_max_override(
        &self,
        target: Option<&str>,
        correct: &str,
        resizing: bool,
    ) -> Option<String> {
        match self {
            Fault::WrongValue { container, cpu_max } if container.as_deref() == target => {
                Some(cpu_max.clone())
            }
            Fault::PodOnly if resizing && target.is_some() => None,
            _ => Some(correct.to_string()),
        }
    }

    /// Extra delay before status reflects an applied resize.
    pub fn extra_status_delay(&self) -> Duration {
        match self {
            Fault::StaleStatus(d) => *d,
            _ => Duration::ZERO,
        }
    }

    pub fn blocks_apply(&self) -> bool {
        matches!(self, Fault::NeverApply)
    }

    /// Reported CPU request for a spec request.
    pub fn reported_request_m(&self, spec_m: u64) -> u64 {
        match self {
            Fault::UnderReportRequests { factor } if factor.is_finite() && *factor >= 0.0 => {
                (spec_m as f64 * factor).round() as u64
            }
            _ => spec_m,
        }
    }
}

/// Millicores a runtime reads back from a `cpu.max` line (None for `max` or junk).
pub fn read_back_limit_m(cpu_max: &str) -> Option<u64> {
    let mut it = cpu_max.split_whitespace();
    let quota: u64 = it.next()?.parse().ok()?;
    let period: u64 = it.next()?.parse().ok()?;
    if period == 0 {
        return None;
    }
    Some((quota * 1000).div_ceil(period))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_value_hits_only_its_target() {
        let f = Fault::WrongValue {
            container: Some("c".into()),
            cpu_max: "11000 100000".into(),
        };
        assert_eq!(
            f.cpu_max_override(Some("c"), "10100 100000", true)
                .as_deref(),
            Some("11000 100000")
        );
        assert_eq!(
            f.cpu_max_override(None, "10100 100000", true).as_deref(),
            Some("10100 100000")
        );
    }

    #[test]
    fn pod_only_skips_containers_on_resize_only() {
        let f = Fault::PodOnly;
        assert_eq!(f.cpu_max_override(Some("c"), "1 2", true), None);
        assert_eq!(
            f.cpu_max_override(Some("c"), "1 2", false).as_deref(),
            Some("1 2")
        );
        assert_eq!(
            f.cpu_max_override(None, "1 2", true).as_deref(),
            Some("1 2")
        );
    }

    #[test]
    fn under_report_scales_requests() {
        let f = Fault::UnderReportRequests { factor: 0.79 };
        assert_eq!(f.reported_request_m(100), 79);
        assert_eq!(Fault::None.reported_request_m(100), 100);
    }

    #[test]
    fn read_back_rounds_up() {
        assert_eq!(read_back_limit_m("11000 100000"), Some(110));
        assert_eq!(read_back_limit_m("10100 100000"), Some(101));
        assert_eq!(read_back_limit_m("max 100000"), None);
    }
}
