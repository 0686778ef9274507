//! Where the kubelet put its cgroups: found by looking at the tree, never
//! assumed (docs/kubelet-behaviour.md §1). Also the pure naming rules for pod and container
//! cgroup directories.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::file;
use super::read::{self, ReadError};
use super::types::{ContainerRole, Driver, Layout, Runtime};
use crate::model::{CgroupPodId, Qos};

/// How deep under the root to look for the node-allocatable cgroup. kind's
/// `kubelet.slice/kubelet-kubepods.slice` is depth 2; a cgroupfs
/// `<prefix>/kubepods` is depth 2 as well. Bounded so a large `system.slice`
/// is not walked.
const MAX_DEPTH: usize = 3;

/// cgroup v1 hierarchy names as they appear under a tmpfs `/sys/fs/cgroup`.
const V1_NAMES: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpu,cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "net_cls,net_prio",
    "perf_event",
    "pids",
    "rdma",
    "systemd",
];

const NEED: &str = "Headroom needs the unified cgroup v2 hierarchy mounted at the root \
(cgroup2 at /sys/fs/cgroup, e.g. systemd.unified_cgroup_hierarchy=1), with the cpu \
controller enabled down to the kubelet's kubepods cgroup";

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cgroup root {0} does not exist or is not a directory")]
    NoRoot(PathBuf),
    #[error("{root} is not a usable cgroup v2 hierarchy: {found}. {NEED}")]
    NotCgroup2 { root: PathBuf, found: String },
    #[error(
        "{root} is cgroup v2 but no kubepods cgroup was found within {MAX_DEPTH} levels \
(looked for kubepods.slice, <prefix>-kubepods.slice, kubepods): is the kubelet running \
on this node, and is this the host's cgroup root?"
    )]
    NoKubepods { root: PathBuf },
    #[error("{kubepods}: cpu controller missing ({found}). {NEED}")]
    CpuControllerMissing { kubepods: PathBuf, found: String },
    /// EACCES/EPERM: says nothing about what the directory holds.
    #[error(
        "{path}: permission denied: the agent cannot read the cgroup tree there \
(run as a user that may read /sys/fs/cgroup, or mount it readable)"
    )]
    PermissionDenied {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Finds the node-allocatable cgroup under `root`.
pub fn discover(root: &Path) -> Result<Layout, LayoutError> {
    if !root.is_dir() {
        return Err(LayoutError::NoRoot(root.to_path_buf()));
    }
    if !root.join(file::CONTROLLERS).is_file() {
        return Err(LayoutError::NotCgroup2 {
            root: root.to_path_buf(),
            found: describe_non_v2(root),
        });
    }
    let (rel, driver) = find_kubepods(root)?.ok_or_else(|| LayoutError::NoKubepods {
        root: root.to_path_buf(),
    })?;
    let dir = root.join(&rel);
    let mut missing = Vec::new();
    for f in [file::CPU_MAX, file::CPU_STAT] {
        let p = dir.join(f);
        // An unreadable kubepods is not one without the cpu controller.
        match read::is_file(&p) {
            Ok(true) => {}
            Ok(false) => missing.push(f),
            Err(ReadError::PermissionDenied(source)) => {
                return Err(LayoutError::PermissionDenied { path: p, source });
            }
            Err(e) => {
                return Err(LayoutError::Io {
                    path: p,
                    source: std::io::Error::other(e),
                });
            }
        }
    }
    if !missing.is_empty() {
        let ctl = read::read(&dir.join(file::CONTROLLERS))
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let mut found = format!("no {}", missing.join(", no "));
        if let Some(c) = ctl {
            let _ = write!(found, "; its cgroup.controllers is {:?}", c.trim());
        }
        return Err(LayoutError::CpuControllerMissing {
            kubepods: dir,
            found,
        });
    }
    Ok(Layout {
        driver,
        kubepods: rel,
    })
}

/// Says what a root without `cgroup.controllers` holds instead.
fn describe_non_v2(root: &Path) -> String {
    let mut v1 = Vec::new();
    let mut v2_subdirs = Vec::new();
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let p = e.path();
            if p.join(file::CONTROLLERS).is_file() {
                let ctl = std::fs::read_to_string(p.join(file::CONTROLLERS)).unwrap_or_default();
                let cpu = if p.join(file::CPU_MAX).is_file() {
                    "has cpu.max"
                } else {
                    "no cpu.max"
                };
                v2_subdirs.push(format!(
                    "a cgroup v2 mount at {name}/ (cgroup.controllers {:?}, {cpu})",
                    ctl.trim()
                ));
            } else if V1_NAMES.contains(&name.as_str()) {
                v1.push(name);
            }
        }
    }
    v1.sort();
    v2_subdirs.sort();
    let mut found = String::from("no cgroup.controllers at the root");
    if !v1.is_empty() {
        let _ = write!(
            found,
            "; cgroup v1 controller directories [{}] (a cgroup v1 or hybrid host)",
            v1.join(", ")
        );
    }
    for s in &v2_subdirs {
        let _ = write!(
            found,
            "; {s}, not usable: the cpu controller is bound to v1"
        );
    }
    if v1.is_empty() && v2_subdirs.is_empty() {
        found.push_str("; nothing that looks like a cgroup hierarchy");
    }
    found
}

/// What a directory name says about the kubelet's node-allocatable cgroup.
pub fn kubepods_driver(name: &str) -> Option<Driver> {
    if name == "kubepods.slice" || name.ends_with("-kubepods.slice") {
        Some(Driver::Systemd)
    } else if name == "kubepods" {
        Some(Driver::Cgroupfs)
    } else {
        None
    }
}

/// Breadth-first, shallowest match wins; ties go to the lexically first path.
fn find_kubepods(root: &Path) -> Result<Option<(PathBuf, Driver)>, LayoutError> {
    let mut level = vec![PathBuf::new()];
    for _ in 0..MAX_DEPTH {
        let mut next = Vec::new();
        let mut hits = Vec::new();
        for rel in &level {
            let dir = root.join(rel);
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                // A sibling that vanished or is unreadable is not our business.
                Err(e) if rel.as_os_str().is_empty() => return Err(io(&dir)(e)),
                Err(_) => continue,
            };
            for e in rd.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                let child = rel.join(name);
                match kubepods_driver(name) {
                    Some(d) => hits.push((child, d)),
                    None => next.push(child),
                }
            }
        }
        if !hits.is_empty() {
            hits.sort_by(|a, b| a.0.cmp(&b.0));
            return Ok(hits.into_iter().next());
        }
        level = next;
    }
    Ok(None)
}

/// QoS class of a child of kubepods that is a QoS-level cgroup
/// (`kubepods-burstable.slice`, `kubelet-kubepods-besteffort.slice`, `burstable`).
pub fn qos_dir(name: &str, driver: Driver) -> Option<Qos> {
    let base = match driver {
        Driver::Systemd => name.strip_suffix(".slice")?.rsplit('-').next()?,
        Driver::Cgroupfs => name,
    };
    match base {
        "burstable" => Some(Qos::Burstable),
        "besteffort" => Some(Qos::BestEffort),
        _ => None,
    }
}

/// The pod id from a pod cgroup name: systemd `…-pod<id with _>.slice`
/// (escaping undone) or cgroupfs `pod<id>`.
pub fn pod_id(name: &str, driver: Driver) -> Option<CgroupPodId> {
    let raw = match driver {
        // The escaped uid has no '-', so the last '-'-part is `pod<uid_>`.
        Driver::Systemd => name.strip_suffix(".slice")?.rsplit('-').next()?,
        Driver::Cgroupfs => name,
    };
    let uid = raw.strip_prefix("pod")?;
    is_pod_id(uid).then(|| CgroupPodId::from(uid.replace('_', "-")))
}

/// Whether `s` could be the pod id in a pod cgroup's name: letters,
/// digits, `-` and `_` (systemd's escape of `-`), nothing that walks a path.
pub fn is_pod_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// Where the kubelet puts the cgroup of pod `uid` of class `qos`, relative
/// to the root: the inverse of [`qos_dir`] and [`pod_uid`]. systemd:
/// `<kubepods>/<stem>-burstable.slice/<stem>-burstable-pod<uid_>.slice`
/// (`<stem>` is kubepods' own name without `.slice`; Guaranteed pods sit
/// in kubepods itself); cgroupfs: `kubepods/burstable/pod<uid>`. Lets a new
/// pod's cgroup be read without listing any directory.
pub fn pod_dir(layout: &Layout, qos: Qos, id: &CgroupPodId) -> PathBuf {
    let uid = id.as_str();
    let part = match qos {
        Qos::Guaranteed => None,
        Qos::Burstable => Some("burstable"),
        Qos::BestEffort => Some("besteffort"),
    };
    let mut p = layout.kubepods.clone();
    match layout.driver {
        Driver::Systemd => {
            let kp = layout.kubepods.file_name().and_then(|n| n.to_str());
            let stem = kp
                .and_then(|n| n.strip_suffix(".slice"))
                .unwrap_or("kubepods");
            let escaped = uid.replace('-', "_");
            match part {
                Some(q) => {
                    p.push(format!("{stem}-{q}.slice"));
                    p.push(format!("{stem}-{q}-pod{escaped}.slice"));
                }
                None => p.push(format!("{stem}-pod{escaped}.slice")),
            }
        }
        Driver::Cgroupfs => {
            if let Some(q) = part {
                p.push(q);
            }
            p.push(format!("pod{uid}"));
        }
    }
    p
}

fn is_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|c| c.is_ascii_alphanumeric())
}

/// A bare container id (cgroupfs driver, containerd or cri-dockerd): 64 hex.
fn is_bare_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// Runtime, container id and (for CRI-O's monitor) role from a container
/// cgroup name, for both drivers. `None` for anything else in a pod cgroup.
pub fn container_name(name: &str) -> Option<(Runtime, &str, ContainerRole)> {
    let scope = name.strip_suffix(".scope");
    let body = scope.unwrap_or(name);
    let (rt, id, role) = if let Some(id) = body.strip_prefix("crio-conmon-") {
        (Runtime::Crio, id, ContainerRole::Conmon)
    } else if let Some(id) = body.strip_prefix("crio-") {
        (Runtime::Crio, id, ContainerRole::Unknown)
    } else if let Some(id) = scope.and_then(|s| s.strip_prefix("cri-containerd-")) {
        (Runtime::Containerd, id, ContainerRole::Unknown)
    } else if let Some(id) = scope.and_then(|s| s.strip_prefix("docker-")) {
        (Runtime::Docker, id, ContainerRole::Unknown)
    } else if scope.is_none() && is_bare_id(name) {
        (Runtime::Unknown, name, ContainerRole::Unknown)
    } else {
        return None;
    };
    is_id(id).then_some((rt, id, role))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// `pod_dir` names what the scan's `qos_dir` and `pod_uid` read back.
    #[test]
    fn pod_dir_is_what_qos_dir_and_pod_uid_read() {
        let uid = "1b2c3d4e-0000-4a4a-8b8b-0123456789ab";
        for (driver, kp) in [
            (Driver::Systemd, "kubepods.slice"),
            (Driver::Systemd, "kubelet.slice/kubelet-kubepods.slice"),
            (Driver::Cgroupfs, "kubepods"),
        ] {
            let layout = Layout {
                driver,
                kubepods: PathBuf::from(kp),
            };
            for qos in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
                let p = pod_dir(&layout, qos, &CgroupPodId::from(uid));
                let name = p.file_name().and_then(|n| n.to_str()).unwrap();
                assert_eq!(
                    pod_id(name, driver).as_ref().map(CgroupPodId::as_str),
                    Some(uid),
                    "{p:?}"
                );
                let parent = p.parent().unwrap();
                if qos == Qos::Guaranteed {
                    assert_eq!(parent, Path::new(kp), "{p:?}");
                } else {
                    assert_eq!(parent.parent().unwrap(), Path::new(kp), "{p:?}");
                    let q = parent.file_name().and_then(|n| n.to_str()).unwrap();
                    assert_eq!(qos_dir(q, driver), Some(qos), "{p:?}");
                }
            }
        }
        let kind = Layout {
            driver: Driver::Systemd,
            kubepods: PathBuf::from("kubelet.slice/kubelet-kubepods.slice"),
        };
        assert_eq!(
            pod_dir(&kind, Qos::Burstable, &CgroupPodId::from(uid)),
            Path::new(
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/\
                 kubelet-kubepods-burstable-pod1b2c3d4e_0000_4a4a_8b8b_0123456789ab.slice"
            )
        );
    }

    #[test]
    fn pod_id_undoes_systemd_escaping() {
        assert_eq!(
            pod_id(
                "kubelet-kubepods-burstable-pod1b2c3d4e_0000_4a4a_8b8b_0123456789ab.slice",
                Driver::Systemd
            )
            .as_ref()
            .map(CgroupPodId::as_str),
            Some("1b2c3d4e-0000-4a4a-8b8b-0123456789ab")
        );
        assert_eq!(
            pod_id("kubepods-podabc_def.slice", Driver::Systemd)
                .as_ref()
                .map(CgroupPodId::as_str),
            Some("abc-def")
        );
        assert_eq!(
            pod_id("pod1b2c-3d", Driver::Cgroupfs)
                .as_ref()
                .map(CgroupPodId::as_str),
            Some("1b2c-3d")
        );
    }

    #[test]
    fn pod_id_rejects_non_pods() {
        assert_eq!(pod_id("kubepods-burstable.slice", Driver::Systemd), None);
        assert_eq!(pod_id("kubepods-pod.slice", Driver::Systemd), None);
        assert_eq!(pod_id("burstable", Driver::Cgroupfs), None);
        assert_eq!(pod_id("cpu.max", Driver::Cgroupfs), None);
    }

    #[test]
    fn qos_dirs_for_both_drivers_and_prefixes() {
        assert_eq!(
            qos_dir("kubelet-kubepods-burstable.slice", Driver::Systemd),
            Some(Qos::Burstable)
        );
        assert_eq!(
            qos_dir("kubepods-besteffort.slice", Driver::Systemd),
            Some(Qos::BestEffort)
        );
        assert_eq!(qos_dir("burstable", Driver::Cgroupfs), Some(Qos::Burstable));
        assert_eq!(qos_dir("kubepods-podabc.slice", Driver::Systemd), None);
    }

    #[test]
    fn container_names_for_each_runtime() {
        let c = |n: &str| container_name(n).map(|(r, i, role)| (r, i.to_string(), role));
        let u = ContainerRole::Unknown;
        assert_eq!(
            c(&format!("cri-containerd-{ID}.scope")),
            Some((Runtime::Containerd, ID.into(), u))
        );
        assert_eq!(c(ID), Some((Runtime::Unknown, ID.into(), u)));
        assert_eq!(
            c(&format!("crio-{ID}.scope")),
            Some((Runtime::Crio, ID.into(), u))
        );
        assert_eq!(
            c(&format!("crio-{ID}")),
            Some((Runtime::Crio, ID.into(), u))
        );
        assert_eq!(
            c(&format!("crio-conmon-{ID}.scope")),
            Some((Runtime::Crio, ID.into(), ContainerRole::Conmon))
        );
        assert_eq!(
            c(&format!("crio-conmon-{ID}")),
            Some((Runtime::Crio, ID.into(), ContainerRole::Conmon))
        );
        assert_eq!(
            c(&format!("docker-{ID}.scope")),
            Some((Runtime::Docker, ID.into(), u))
        );
        assert_eq!(c("cpu.max"), None);
        assert_eq!(c("cri-containerd-.scope"), None);
        assert_eq!(c("deadbeef"), None);
    }

    fn mkfile(p: &Path, content: &str) {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    fn v2_kubepods(root: &Path, rel: &str) {
        mkfile(&root.join(file::CONTROLLERS), "cpuset cpu io memory pids\n");
        mkfile(&root.join(rel).join(file::CPU_MAX), "max 100000\n");
        mkfile(&root.join(rel).join(file::CPU_STAT), "usage_usec 0\n");
    }

    #[test]
    fn discovers_each_kubepods_flavour() {
        for (rel, driver) in [
            ("kubepods.slice", Driver::Systemd),
            ("kubelet.slice/kubelet-kubepods.slice", Driver::Systemd),
            ("custom.slice/custom-kubepods.slice", Driver::Systemd),
            ("kubepods", Driver::Cgroupfs),
            ("kubelet/kubepods", Driver::Cgroupfs),
        ] {
            let t = tempfile::tempdir().unwrap();
            fs::create_dir_all(t.path().join("system.slice/containerd.service")).unwrap();
            v2_kubepods(t.path(), rel);
            let l = discover(t.path()).unwrap();
            assert_eq!(l.kubepods, PathBuf::from(rel));
            assert_eq!(l.driver, driver);
        }
    }

    #[test]
    fn v1_host_error_says_what_was_found_and_needed() {
        let t = tempfile::tempdir().unwrap();
        for d in ["cpu", "cpuacct", "memory", "systemd"] {
            fs::create_dir_all(t.path().join(d)).unwrap();
        }
        mkfile(&t.path().join("unified/cgroup.controllers"), "\n");
        mkfile(&t.path().join("unified/cpu.stat"), "usage_usec 0\n");
        let e = discover(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("cgroup v1 controller directories [cpu, cpuacct, memory, systemd]"),
            "{e}"
        );
        assert!(e.contains("no cgroup.controllers"), "{e}");
        assert!(e.contains("unified/"), "{e}");
        assert!(e.contains("no cpu.max"), "{e}");
        assert!(e.contains("needs the unified cgroup v2 hierarchy"), "{e}");
    }

    #[test]
    fn v2_without_kubepods_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        mkfile(&t.path().join(file::CONTROLLERS), "cpu\n");
        fs::create_dir_all(t.path().join("system.slice")).unwrap();
        let e = discover(t.path()).unwrap_err();
        assert!(matches!(e, LayoutError::NoKubepods { .. }), "{e}");
        assert!(e.to_string().contains("no kubepods cgroup"));
    }

    /// EACCES on kubepods used to read as "cpu controller missing".
    #[test]
    fn unreadable_kubepods_is_permission_denied_not_missing_controller() {
        let t = tempfile::tempdir().unwrap();
        v2_kubepods(t.path(), "kubepods.slice");
        let _deny = crate::cgroup::read::seam::deny(&t.path().join("kubepods.slice"));
        let e = discover(t.path()).unwrap_err();
        assert!(matches!(e, LayoutError::PermissionDenied { .. }), "{e}");
        assert!(!e.to_string().contains("cpu controller"), "{e}");
    }

    #[test]
    fn kubepods_without_cpu_controller_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        mkfile(&t.path().join(file::CONTROLLERS), "memory pids\n");
        mkfile(
            &t.path().join("kubepods.slice/cgroup.controllers"),
            "memory pids\n",
        );
        mkfile(&t.path().join("kubepods.slice/cpu.stat"), "usage_usec 0\n");
        let e = discover(t.path()).unwrap_err();
        assert!(matches!(e, LayoutError::CpuControllerMissing { .. }), "{e}");
        let s = e.to_string();
        assert!(s.contains("no cpu.max") && s.contains("memory pids"), "{s}");
    }

    #[test]
    fn missing_root_is_an_error() {
        let e = discover(Path::new("/nonexistent/headroom")).unwrap_err();
        assert!(matches!(e, LayoutError::NoRoot(_)));
    }
}
