//! Cgroup naming per docs/kubelet-behaviour.md §1: where the kubelet and the runtime put the
//! node-allocatable, QoS, pod and container cgroups. Pure: no I/O.

use std::path::PathBuf;

/// Cgroup driver and root the simulated kubelet uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimLayout {
    /// systemd driver with kubelet `cgroupRoot: /kubelet`, as kind sets it:
    /// `kubelet.slice/kubelet-kubepods.slice/...`.
    Kind,
    /// systemd driver, default root: `kubepods.slice/...`.
    Systemd,
    /// cgroupfs driver: `kubepods/burstable/pod<uid>`.
    Cgroupfs,
}

/// Container runtime whose cgroup names and container-ID scheme are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimRuntime {
    Containerd,
    Crio,
}

/// QoS class as the apiserver reports it in `status.qosClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimQos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl SimQos {
    pub fn parse(s: &str) -> Option<SimQos> {
        match s {
            "Guaranteed" => Some(SimQos::Guaranteed),
            "Burstable" => Some(SimQos::Burstable),
            "BestEffort" => Some(SimQos::BestEffort),
            _ => None,
        }
    }

    /// Name of the QoS child cgroup; Guaranteed pods have none.
    fn part(self) -> Option<&'static str> {
        match self {
            SimQos::Guaranteed => None,
            SimQos::Burstable => Some("burstable"),
            SimQos::BestEffort => Some("besteffort"),
        }
    }
}

impl SimLayout {
    fn systemd_root(self) -> Option<&'static [&'static str]> {
        match self {
            SimLayout::Kind => Some(&["kubelet", "kubepods"]),
            SimLayout::Systemd => Some(&["kubepods"]),
            SimLayout::Cgroupfs => None,
        }
    }

    /// Every directory from the cgroup root down to (and including) kubepods.
    pub fn kubepods_ancestry(self) -> Vec<PathBuf> {
        match self.systemd_root() {
            Some(parts) => systemd_ancestry(parts),
            None => vec![PathBuf::from("kubepods")],
        }
    }

    /// The node-allocatable cgroup, relative to the cgroup root.
    pub fn kubepods_dir(self) -> PathBuf {
        self.kubepods_ancestry()
            .pop()
            .unwrap_or_else(|| PathBuf::from("kubepods"))
    }

    /// The QoS cgroup a pod of `qos` sits in (kubepods itself for Guaranteed).
    pub fn qos_dir(self, qos: SimQos) -> PathBuf {
        match (self.systemd_root(), qos.part()) {
            (_, None) => self.kubepods_dir(),
            (Some(root), Some(q)) => {
                let mut parts = root.to_vec();
                parts.push(q);
                systemd_ancestry(&parts)
                    .pop()
                    .unwrap_or_else(|| self.kubepods_dir())
            }
            (None, Some(q)) => self.kubepods_dir().join(q),
        }
    }

    /// The pod cgroup, relative to the cgroup root.
    pub fn pod_dir(self, qos: SimQos, uid: &str) -> PathBuf {
        let parent = self.qos_dir(qos);
        match self.systemd_root() {
            Some(root) => {
                let mut parts: Vec<String> = root.iter().map(|p| escape(p)).collect();
                if let Some(q) = qos.part() {
                    parts.push(escape(q));
                }
                parts.push(format!("pod{}", escape(uid)));
                parent.join(format!("{}.slice", parts.join("-")))
            }
            None => parent.join(format!("pod{uid}")),
        }
    }

    fn is_systemd(self) -> bool {
        self.systemd_root().is_some()
    }

    /// Directory name of a container cgroup inside its pod cgroup (docs/kubelet-behaviour.md §1 table).
    pub fn container_dir_name(self, runtime: SimRuntime, id: &str) -> String {
        match (runtime, self.is_systemd()) {
            (SimRuntime::Containerd, true) => format!("cri-containerd-{id}.scope"),
            (SimRuntime::Containerd, false) => id.to_string(),
            (SimRuntime::Crio, true) => format!("crio-{id}.scope"),
            (SimRuntime::Crio, false) => format!("crio-{id}"),
        }
    }

    /// CRI-O's conmon monitor cgroup (conmon_cgroup = "pod"); none for containerd.
    pub fn conmon_dir_name(self, runtime: SimRuntime, id: &str) -> Option<String> {
        match runtime {
            SimRuntime::Containerd => None,
            SimRuntime::Crio if self.is_systemd() => Some(format!("crio-conmon-{id}.scope")),
            SimRuntime::Crio => Some(format!("crio-conmon-{id}")),
        }
    }
}

impl SimRuntime {
    /// `status.containerStatuses[].containerID` for a raw id.
    pub fn container_id_uri(self, id: &str) -> String {
        match self {
            SimRuntime::Containerd => format!("containerd://{id}"),
            SimRuntime::Crio => format!("cri-o://{id}"),
        }
    }
}

/// systemd escapes `-` as `_` inside a unit name part.
fn escape(part: &str) -> String {
    part.replace('-', "_")
}

/// `["a","b","c"]` → `a.slice`, `a.slice/a-b.slice`, `a.slice/a-b.slice/a-b-c.slice`.
fn systemd_ancestry(parts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(parts.len());
    let mut path = PathBuf::new();
    for i in 0..parts.len() {
        let name: Vec<String> = parts[..=i].iter().map(|p| escape(p)).collect();
        path.push(format!("{}.slice", name.join("-")));
        out.push(path.clone());
    }
    out
}

/// A stable 64-hex container id derived from the pod uid and a container name.
pub fn container_id(uid: &str, name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut out = String::with_capacity(64);
    for salt in 0u8..4 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (salt, uid, name).hash(&mut h);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1b2c-33";

    #[test]
    fn kind_burstable_pod_expands_every_ancestor() {
        assert_eq!(
            SimLayout::Kind.pod_dir(SimQos::Burstable, UID),
            PathBuf::from(
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod1b2c_33.slice"
            )
        );
    }

    #[test]
    fn systemd_guaranteed_and_besteffort() {
        assert_eq!(
            SimLayout::Systemd.pod_dir(SimQos::Guaranteed, UID),
            PathBuf::from("kubepods.slice/kubepods-pod1b2c_33.slice")
        );
        assert_eq!(
            SimLayout::Systemd.pod_dir(SimQos::BestEffort, UID),
            PathBuf::from(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c_33.slice"
            )
        );
    }

    #[test]
    fn cgroupfs_keeps_dashes() {
        assert_eq!(
            SimLayout::Cgroupfs.pod_dir(SimQos::Burstable, UID),
            PathBuf::from("kubepods/burstable/pod1b2c-33")
        );
        assert_eq!(
            SimLayout::Cgroupfs.pod_dir(SimQos::Guaranteed, UID),
            PathBuf::from("kubepods/pod1b2c-33")
        );
    }

    #[test]
    fn container_names_per_runtime_and_driver() {
        for (layout, runtime, want) in [
            (
                SimLayout::Kind,
                SimRuntime::Containerd,
                "cri-containerd-ab.scope",
            ),
            (SimLayout::Cgroupfs, SimRuntime::Containerd, "ab"),
            (SimLayout::Systemd, SimRuntime::Crio, "crio-ab.scope"),
            (SimLayout::Cgroupfs, SimRuntime::Crio, "crio-ab"),
        ] {
            assert_eq!(
                layout.container_dir_name(runtime, "ab"),
                want,
                "{layout:?} {runtime:?}"
            );
        }
        assert_eq!(
            SimLayout::Systemd
                .conmon_dir_name(SimRuntime::Crio, "ab")
                .as_deref(),
            Some("crio-conmon-ab.scope")
        );
        assert_eq!(
            SimLayout::Systemd.conmon_dir_name(SimRuntime::Containerd, "ab"),
            None
        );
    }

    #[test]
    fn container_ids_are_64_hex_and_distinct() {
        let a = container_id("u", "a");
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, container_id("u", "b"));
        assert_eq!(a, container_id("u", "a"));
    }
}
