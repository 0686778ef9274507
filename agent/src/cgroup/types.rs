//! Typed values read from cgroup v2 files, and the per-node snapshot the
//! scanner produces. Plain data: the slack, verify and policy layers read
//! these and nothing else of the filesystem.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::parse::ParseError;
use crate::model::{CgroupPodId, Qos};

/// `cpu.max`: `"<quota> <period>"` or `"max <period>"` (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuMax {
    /// `None` = `max` (unlimited).
    pub quota_us: Option<u64>,
    pub period_us: u64,
}

impl CpuMax {
    /// The limit in millicores (rounded up), `None` when unlimited.
    pub fn millicores(&self) -> Option<u64> {
        self.quota_us
            .map(|q| (q as u128 * 1000).div_ceil(self.period_us.max(1) as u128) as u64)
    }
}

/// `cpu.stat`. The throttling fields exist only where the cpu controller is
/// enabled for the cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStat {
    pub usage_usec: u64,
    pub user_usec: u64,
    pub system_usec: u64,
    pub nr_periods: Option<u64>,
    pub nr_throttled: Option<u64>,
    pub throttled_usec: Option<u64>,
}

/// One line of a PSI file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Total stall time, µs.
    pub total_us: u64,
}

/// `cpu.pressure`. `full` is absent on older kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub some: PsiLine,
    pub full: Option<PsiLine>,
}

/// Container runtime, from the container cgroup's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Containerd,
    Crio,
    Docker,
    /// A bare 64-hex id (cgroupfs driver with containerd or cri-dockerd: the
    /// name does not say which).
    Unknown,
}

/// cgroup driver the kubelet uses, found by looking at the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    Systemd,
    Cgroupfs,
}

/// Where the kubelet's cgroups are under a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub driver: Driver,
    /// Node-allocatable cgroup (`kubepods.slice`, `kubelet.slice/kubelet-kubepods.slice`,
    /// `kubepods`, …), relative to the root.
    pub kubepods: PathBuf,
}

/// An `io::Error` that snapshots can clone and compare (by kind and errno).
#[derive(Debug, Clone)]
pub struct IoError(pub Arc<std::io::Error>);

impl PartialEq for IoError {
    fn eq(&self, o: &Self) -> bool {
        self.0.kind() == o.0.kind() && self.0.raw_os_error() == o.0.raw_os_error()
    }
}

impl Eq for IoError {}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for IoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl From<std::io::Error> for IoError {
    fn from(e: std::io::Error) -> Self {
        IoError(Arc::new(e))
    }
}

/// Why one cgroup (or one file or directory of it) could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgroupError {
    /// The cgroup directory is gone (pod deleted between listing and reading).
    #[error("cgroup {0} vanished")]
    Vanished(PathBuf),
    #[error("{0} is missing")]
    Missing(PathBuf),
    /// `source` quotes at most a short prefix of the content.
    #[error("{path}: malformed: {source}")]
    Malformed {
        path: PathBuf,
        #[source]
        source: ParseError,
    },
    /// EACCES/EPERM: the agent may not read it. Not the same as absent.
    #[error("{path}: permission denied")]
    PermissionDenied {
        path: PathBuf,
        #[source]
        source: IoError,
    },
    /// A symlink, FIFO, device… where the kernel puts a regular file.
    #[error("{path}: {what}; not read")]
    NotRegular { path: PathBuf, what: &'static str },
    #[error("{path}: larger than {limit} bytes; not read")]
    TooLarge { path: PathBuf, limit: usize },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: IoError,
    },
}

impl CgroupError {
    /// A read of `path` that failed, typed: the one mapping of the reader's
    /// errors to the scan's (a file not found is `Io` here: a reader that
    /// can tell vanished from missing says so itself).
    pub fn from_read(path: PathBuf, e: super::read::ReadError) -> Self {
        use super::read::{MAX_FILE, ReadError};
        match e {
            ReadError::PermissionDenied(source) => CgroupError::PermissionDenied {
                path,
                source: source.into(),
            },
            ReadError::Symlink => CgroupError::NotRegular {
                path,
                what: "a symlink",
            },
            ReadError::NotRegular(what) => CgroupError::NotRegular { path, what },
            ReadError::TooLarge => CgroupError::TooLarge {
                path,
                limit: MAX_FILE,
            },
            ReadError::NotFound(source) | ReadError::Io(source) => CgroupError::Io {
                path,
                source: source.into(),
            },
        }
    }

    pub fn is_permission_denied(&self) -> bool {
        matches!(self, CgroupError::PermissionDenied { .. })
    }
}

/// Files of one cgroup that Headroom reads every tick.
#[derive(Debug, Clone, PartialEq)]
pub struct CgroupSample {
    pub cpu_max: CpuMax,
    pub cpu_stat: CpuStat,
    /// Absent where the kernel has no PSI for this cgroup, and where
    /// `cpu.pressure` could not be read or parsed (see the snapshot's issues).
    pub pressure: Option<Pressure>,
    pub weight: Option<u64>,
}

/// What a container cgroup is, from its name (and, when the pod's status is
/// known, from the container ids it lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerRole {
    /// An id listed in the pod's `containerStatuses`.
    App,
    /// The pause/sandbox container: an id the pod status does not list.
    Sandbox,
    /// CRI-O's `crio-conmon-<id>` monitor cgroup.
    Conmon,
    /// Not matched against a pod status yet.
    Unknown,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerCgroup {
    pub id: String,
    pub runtime: Runtime,
    pub role: ContainerRole,
    /// Relative to the cgroup root.
    pub path: PathBuf,
    pub cpu_max: Result<CpuMax, CgroupError>,
    /// `throttled_usec` of the container's `cpu.stat`, read only where its
    /// `cpu.max` has a quota (nothing else can throttle it). A task is
    /// throttled at whichever of its container or pod quota runs out first, so
    /// the pod cgroup's counter alone misses part of the throttling.
    pub throttled_usec: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PodCgroup {
    /// The pod id in the cgroup's name, dashes restored (systemd's `_`
    /// escaping undone): the API pod's uid, or a static pod's config hash.
    pub id: CgroupPodId,
    pub qos: Qos,
    /// Relative to the cgroup root. Shared: a light tick copies it into
    /// each pod it reads.
    pub path: Arc<Path>,
    pub sample: Result<CgroupSample, CgroupError>,
    pub containers: Vec<ContainerCgroup>,
    /// Why the container cgroups could not be listed (then `containers` is
    /// empty because they are unknown, not because there are none).
    pub containers_unlisted: Option<CgroupError>,
}

/// One read of the whole kubepods tree.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSnapshot {
    /// Monotonic time of the read, µs (from the caller's clock).
    pub at_us: u64,
    pub layout: Layout,
    pub kubepods: CgroupSample,
    pub pods: Vec<PodCgroup>,
    /// QoS classes whose directory could not be listed: their pods are
    /// unknown this scan, not gone.
    pub unlisted_qos: Vec<Qos>,
    /// `usage_usec` of the root cgroup's `cpu.stat`: CPU time everything on
    /// the machine used, the node's own processes included (kubelet,
    /// containerd, which kubepods does not hold). `None` where the root has
    /// no `cpu.stat` (kernels before 5.8, fixtures) or it could not be read:
    /// then the node counts as idle by kubepods alone.
    pub node_usage_us: Option<u64>,
    /// Every error met while reading this snapshot (vanished cgroups aside),
    /// including those also kept on a pod: for logs and counters.
    pub issues: Vec<CgroupError>,
}
