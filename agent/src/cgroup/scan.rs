//! One read of the kubepods tree: kubepods itself, every pod cgroup and each
//! container cgroup's `cpu.max`.
//!
//! Per-pod trouble (a pod deleted between listing and reading, a missing or
//! malformed file) is recorded on that pod and the scan carries on; only an
//! unreadable kubepods is fatal. One buffer and one path are reused for every
//! file, each file is read once, and directory entries are classified by name
//! before any `stat`.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use super::layout::{container_name, pod_uid, qos_dir};
use super::parse::{self, ParseError};
use super::types::{
    CgroupError, CgroupSample, ContainerCgroup, ContainerRole, Layout, NodeSnapshot, PodCgroup,
};
use crate::model::Qos;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("kubepods cgroup unusable: {0}")]
    Kubepods(CgroupError),
}

/// Reads the whole tree under `root` as `layout` describes it. `at_us` is the
/// caller's monotonic clock, stored in the snapshot for rate computations.
pub fn scan(root: &Path, layout: &Layout, at_us: u64) -> Result<NodeSnapshot, ScanError> {
    let mut r = Reader {
        path: root.join(&layout.kubepods),
        buf: Buf::default(),
        root: root.to_path_buf(),
    };
    let kubepods = r.sample().map_err(ScanError::Kubepods)?;
    let top = r.subdirs().map_err(ScanError::Kubepods)?;
    let mut pods = Vec::with_capacity(top.len());
    for name in &top {
        if let Some(uid) = pod_uid(name, layout.driver) {
            r.path.push(name);
            pods.push(r.pod(uid, Qos::Guaranteed));
            r.path.pop();
        } else if let Some(qos) = qos_dir(name, layout.driver) {
            r.path.push(name);
            // A QoS cgroup that vanished or cannot be listed holds no pods we
            // can see; kubepods itself was fine, so this is not fatal.
            let children = r.subdirs().unwrap_or_default();
            for child in &children {
                if let Some(uid) = pod_uid(child, layout.driver) {
                    r.path.push(child);
                    pods.push(r.pod(uid, qos));
                    r.path.pop();
                }
            }
            r.path.pop();
        }
    }
    pods.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(NodeSnapshot {
        at_us,
        layout: layout.clone(),
        kubepods,
        pods,
    })
}

/// How much of one pod [`rescan`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Not read: left out of the snapshot.
    Skip,
    /// `cpu.stat` only (usage and throttling); the other values are carried
    /// over from the index snapshot, so they are as old as that scan.
    Stat,
    /// Everything, as [`scan`] reads it (pod files and container `cpu.max`).
    Full,
}

/// A cheaper tick: kubepods in full, and only the pods of `index` (the last
/// full [`scan`]) that `depth` asks for, without listing any directory.
/// The agent reads `cpu.stat` of managed pods every tick and everything else
/// on the audit interval; a pod missing from `index` needs a full scan.
pub fn rescan(
    root: &Path,
    index: &NodeSnapshot,
    at_us: u64,
    depth: impl Fn(&PodCgroup) -> Depth,
) -> Result<NodeSnapshot, ScanError> {
    let mut r = Reader {
        path: root.join(&index.layout.kubepods),
        buf: Buf::default(),
        root: root.to_path_buf(),
    };
    let kubepods = r.sample().map_err(ScanError::Kubepods)?;
    let mut pods = Vec::new();
    for p in &index.pods {
        let d = depth(p);
        if d == Depth::Skip {
            continue;
        }
        r.path = root.join(&p.path);
        if d == Depth::Full {
            pods.push(r.pod(p.uid.clone(), p.qos));
            continue;
        }
        let stat = r.required("cpu.stat", parse::cpu_stat);
        let sample = match (stat, &p.sample) {
            (Ok(cpu_stat), Ok(old)) => Ok(CgroupSample {
                cpu_stat,
                ..old.clone()
            }),
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e.clone()),
        };
        pods.push(PodCgroup {
            sample,
            ..p.clone()
        });
    }
    Ok(NodeSnapshot {
        at_us,
        layout: index.layout.clone(),
        kubepods,
        pods,
    })
}

/// Sets each container's role from the ids the pod's status lists: listed →
/// App, not listed → Sandbox (the pause container), CRI-O's conmon stays
/// Conmon. A container started after the status was read shows as Sandbox
/// until the next status; callers must not act on Sandbox cgroups anyway.
pub fn mark_roles(pod: &mut PodCgroup, app_container_ids: &[&str]) {
    for c in &mut pod.containers {
        if c.role == ContainerRole::Conmon {
            continue;
        }
        c.role = if app_container_ids.contains(&c.id.as_str()) {
            ContainerRole::App
        } else {
            ContainerRole::Sandbox
        };
    }
}

struct Reader {
    /// Absolute path of the cgroup being read; files are pushed and popped.
    path: PathBuf,
    buf: Buf,
    root: PathBuf,
}

/// A reusable read buffer: `data[..len]` holds the last file read.
#[derive(Default)]
struct Buf {
    data: Vec<u8>,
    len: usize,
}

/// Reads `f` to EOF into `b`. Unlike `read_to_end`/`fs::read` it does not
/// `statx` the file for a size hint (cgroupfs reports size 4096 or 0 anyway),
/// which saves one syscall per file.
fn read_all(f: &mut File, b: &mut Buf) -> std::io::Result<usize> {
    b.len = 0;
    if b.data.len() < 4096 {
        b.data.resize(4096, 0);
    }
    loop {
        match f.read(&mut b.data[b.len..]) {
            Ok(0) => return Ok(b.len),
            Ok(n) => b.len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        if b.len == b.data.len() {
            b.data.resize(b.len * 2, 0);
        }
    }
}

enum Read1 {
    Ok,
    NotFound,
}

impl Reader {
    fn data(&self) -> &[u8] {
        &self.buf.data[..self.buf.len]
    }

    fn rel(&self) -> PathBuf {
        self.path
            .strip_prefix(&self.root)
            .map_or_else(|_| self.path.clone(), Path::to_path_buf)
    }

    fn io_err(&self, e: std::io::Error) -> CgroupError {
        CgroupError::Io {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    /// Reads `file` of the current cgroup into `self.buf`.
    fn read(&mut self, file: &str) -> Result<Read1, CgroupError> {
        self.path.push(file);
        let res = File::open(&self.path).and_then(|mut f| read_all(&mut f, &mut self.buf));
        let out = match res {
            Ok(_) => Ok(Read1::Ok),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Read1::NotFound),
            // ENODEV: cgroup removed while open (kernel returns it on rmdir races).
            Err(e) if e.raw_os_error() == Some(nix::libc::ENODEV) => Ok(Read1::NotFound),
            Err(e) => Err(self.io_err(e)),
        };
        self.path.pop();
        out
    }

    /// A required file that is absent: the cgroup vanished, or the file is
    /// missing from a cgroup that still exists.
    fn absent(&mut self, file: &str) -> CgroupError {
        if self.path.is_dir() {
            CgroupError::Missing(self.path.join(file))
        } else {
            CgroupError::Vanished(self.rel())
        }
    }

    fn malformed(&self, file: &str, e: ParseError) -> CgroupError {
        CgroupError::Malformed {
            path: self.path.join(file),
            reason: e.0,
        }
    }

    fn required<T>(
        &mut self,
        file: &str,
        p: fn(&[u8]) -> Result<T, ParseError>,
    ) -> Result<T, CgroupError> {
        match self.read(file)? {
            Read1::Ok => p(self.data()).map_err(|e| self.malformed(file, e)),
            Read1::NotFound => Err(self.absent(file)),
        }
    }

    fn optional<T>(
        &mut self,
        file: &str,
        p: fn(&[u8]) -> Result<T, ParseError>,
    ) -> Result<Option<T>, CgroupError> {
        // PSI disabled in the kernel: reading cpu.pressure fails with EOPNOTSUPP.
        match self.read(file) {
            Ok(Read1::Ok) => p(self.data())
                .map(Some)
                .map_err(|e| self.malformed(file, e)),
            Ok(Read1::NotFound) => Ok(None),
            Err(CgroupError::Io { .. }) if file == "cpu.pressure" => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn sample(&mut self) -> Result<CgroupSample, CgroupError> {
        Ok(CgroupSample {
            cpu_max: self.required("cpu.max", parse::cpu_max)?,
            cpu_stat: self.required("cpu.stat", parse::cpu_stat)?,
            pressure: self.optional("cpu.pressure", parse::pressure)?,
            weight: self.optional("cpu.weight", parse::weight)?,
        })
    }

    /// Names of the current cgroup's child directories. Interface files all
    /// contain a '.' and none ends in `.slice`/`.scope`, so most entries are
    /// dropped by name without a `stat`.
    fn subdirs(&mut self) -> Result<Vec<String>, CgroupError> {
        let rd = match std::fs::read_dir(&self.path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(CgroupError::Vanished(self.rel()));
            }
            Err(e) => return Err(self.io_err(e)),
        };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.contains('.') && !name.ends_with(".slice") && !name.ends_with(".scope") {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.push(name.to_owned());
            }
        }
        Ok(out)
    }

    /// Reads the pod cgroup at `self.path`.
    fn pod(&mut self, uid: String, qos: Qos) -> PodCgroup {
        let path = self.rel();
        let sample = self.sample();
        let mut containers = Vec::new();
        if let Ok(children) = self.subdirs() {
            containers.reserve(children.len());
            for name in &children {
                let Some((runtime, id, role)) = container_name(name) else {
                    continue;
                };
                self.path.push(name);
                let cpu_max = self.required("cpu.max", parse::cpu_max);
                containers.push(ContainerCgroup {
                    id: id.to_owned(),
                    runtime,
                    role,
                    path: self.rel(),
                    cpu_max,
                });
                self.path.pop();
            }
        }
        containers.sort_by(|a, b| a.path.cmp(&b.path));
        PodCgroup {
            uid,
            qos,
            path,
            sample,
            containers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescan_reads_only_what_depth_asks() {
        let (t, layout) = tree();
        let full = scan(t.path(), &layout, 0).unwrap();
        let g = full
            .pods
            .iter()
            .find(|p| p.qos == Qos::Guaranteed)
            .unwrap()
            .clone();
        let gdir = t.path().join(&g.path);
        fs::write(
            gdir.join("cpu.stat"),
            "usage_usec 900\nuser_usec 500\nsystem_usec 400\n",
        )
        .unwrap();
        fs::write(gdir.join("cpu.max"), "70000 100000\n").unwrap();
        let light = rescan(t.path(), &full, 5, |p| {
            if p.uid == g.uid {
                Depth::Stat
            } else {
                Depth::Skip
            }
        })
        .unwrap();
        assert_eq!(light.pods.len(), 1, "skipped pods are left out");
        let s = light.pods[0].sample.as_ref().unwrap();
        assert_eq!(s.cpu_stat.usage_usec, 900, "cpu.stat re-read");
        assert_eq!(
            s.cpu_max,
            g.sample.as_ref().unwrap().cpu_max,
            "cpu.max carried over at Stat depth"
        );
        let deep = rescan(t.path(), &full, 6, |_| Depth::Full).unwrap();
        assert_eq!(deep.pods.len(), full.pods.len());
        let s = deep
            .pods
            .iter()
            .find(|p| p.uid == g.uid)
            .unwrap()
            .sample
            .as_ref()
            .unwrap();
        assert_eq!(
            s.cpu_max.quota_us,
            Some(70000),
            "cpu.max re-read at Full depth"
        );
        fs::remove_dir_all(&gdir).unwrap();
        let gone = rescan(t.path(), &full, 7, |p| {
            if p.uid == g.uid {
                Depth::Stat
            } else {
                Depth::Skip
            }
        })
        .unwrap();
        assert!(
            matches!(gone.pods[0].sample, Err(CgroupError::Vanished(_))),
            "{:?}",
            gone.pods[0].sample
        );
    }
    use crate::cgroup::layout::discover;
    use crate::cgroup::types::{Driver, Runtime};
    use std::fs;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn cg(dir: &Path, max: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("cpu.max"), max).unwrap();
        fs::write(
            dir.join("cpu.stat"),
            "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 10\nnr_throttled 1\nthrottled_usec 5\n",
        )
        .unwrap();
        fs::write(
            dir.join("cpu.pressure"),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        .unwrap();
        fs::write(dir.join("cpu.weight"), "100\n").unwrap();
    }

    fn tree() -> (tempfile::TempDir, Layout) {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::write(r.join("cgroup.controllers"), "cpu memory\n").unwrap();
        let kp = r.join("kubepods.slice");
        cg(&kp, "max 100000\n");
        let g = kp.join("kubepods-pod11111111_2222.slice");
        cg(&g, "50000 100000\n");
        cg(
            &g.join(format!("cri-containerd-{A}.scope")),
            "50000 100000\n",
        );
        cg(&g.join(format!("cri-containerd-{B}.scope")), "max 100000\n");
        let bu = kp.join("kubepods-burstable.slice");
        cg(&bu, "max 100000\n");
        cg(
            &bu.join("kubepods-burstable-pod33333333_4444.slice"),
            "max 100000\n",
        );
        cg(&kp.join("kubepods-besteffort.slice"), "max 100000\n");
        let l = discover(r).unwrap();
        (t, l)
    }

    #[test]
    fn scan_finds_pods_in_each_qos_with_containers() {
        let (t, l) = tree();
        let s = scan(t.path(), &l, 7).unwrap();
        assert_eq!(s.at_us, 7);
        assert_eq!(l.driver, Driver::Systemd);
        assert_eq!(s.pods.len(), 2);
        let g = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        assert_eq!(g.uid, "11111111-2222");
        assert_eq!(
            g.path,
            PathBuf::from("kubepods.slice/kubepods-pod11111111_2222.slice")
        );
        assert_eq!(g.sample.as_ref().unwrap().cpu_max.millicores(), Some(500));
        assert_eq!(g.containers.len(), 2);
        assert_eq!(g.containers[0].id, A);
        assert_eq!(g.containers[0].runtime, Runtime::Containerd);
        assert_eq!(
            g.containers[0].cpu_max.as_ref().unwrap().quota_us,
            Some(50000)
        );
        assert_eq!(g.containers[1].cpu_max.as_ref().unwrap().quota_us, None);
        let b = s.pods.iter().find(|p| p.qos == Qos::Burstable).unwrap();
        assert_eq!(b.uid, "33333333-4444");
    }

    #[test]
    fn malformed_and_missing_files_stay_on_their_pod() {
        let (t, l) = tree();
        let kp = t.path().join("kubepods.slice");
        let g = kp.join("kubepods-pod11111111_2222.slice");
        fs::write(g.join("cpu.stat"), "garbage\n").unwrap();
        fs::remove_file(g.join(format!("cri-containerd-{B}.scope/cpu.max"))).unwrap();
        let s = scan(t.path(), &l, 0).unwrap();
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        assert!(matches!(gp.sample, Err(CgroupError::Malformed { .. })));
        assert!(matches!(
            gp.containers[1].cpu_max,
            Err(CgroupError::Missing(_))
        ));
        assert!(gp.containers[0].cpu_max.is_ok());
        let bp = s.pods.iter().find(|p| p.qos == Qos::Burstable).unwrap();
        assert!(bp.sample.is_ok());
    }

    #[test]
    fn vanished_pod_is_reported_as_vanished() {
        let (t, l) = tree();
        let mut r = Reader {
            path: t.path().join("kubepods.slice/kubepods-podgone.slice"),
            buf: Buf::default(),
            root: t.path().to_path_buf(),
        };
        let p = r.pod("gone".into(), Qos::Guaranteed);
        assert_eq!(
            p.sample,
            Err(CgroupError::Vanished(PathBuf::from(
                "kubepods.slice/kubepods-podgone.slice"
            )))
        );
        assert!(p.containers.is_empty());
        // The rest of the tree still scans.
        assert_eq!(scan(t.path(), &l, 0).unwrap().pods.len(), 2);
    }

    #[test]
    fn missing_psi_and_weight_are_none_not_errors() {
        let (t, l) = tree();
        let kp = t.path().join("kubepods.slice");
        let g = kp.join("kubepods-pod11111111_2222.slice");
        fs::remove_file(g.join("cpu.pressure")).unwrap();
        fs::remove_file(g.join("cpu.weight")).unwrap();
        let s = scan(t.path(), &l, 0).unwrap();
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        let smp = gp.sample.as_ref().unwrap();
        assert_eq!(smp.pressure, None);
        assert_eq!(smp.weight, None);
    }

    #[test]
    fn files_larger_than_the_buffer_are_read_whole() {
        let (t, l) = tree();
        let g = t
            .path()
            .join("kubepods.slice/kubepods-pod11111111_2222.slice");
        let mut big = "x_unknown_key 1\n".repeat(1000);
        big.push_str("usage_usec 4242\n");
        fs::write(g.join("cpu.stat"), big).unwrap();
        let s = scan(t.path(), &l, 0).unwrap();
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        assert_eq!(gp.sample.as_ref().unwrap().cpu_stat.usage_usec, 4242);
    }

    #[test]
    fn unusable_kubepods_is_fatal() {
        let (t, l) = tree();
        fs::write(t.path().join("kubepods.slice/cpu.max"), "bogus").unwrap();
        assert!(matches!(
            scan(t.path(), &l, 0),
            Err(ScanError::Kubepods(CgroupError::Malformed { .. }))
        ));
    }

    #[test]
    fn mark_roles_tells_app_sandbox_and_conmon_apart() {
        let (t, l) = tree();
        let s = scan(t.path(), &l, 0).unwrap();
        let mut p = s
            .pods
            .into_iter()
            .find(|p| p.qos == Qos::Guaranteed)
            .unwrap();
        p.containers.push(ContainerCgroup {
            id: A.into(),
            runtime: Runtime::Crio,
            role: ContainerRole::Conmon,
            path: PathBuf::new(),
            cpu_max: Err(CgroupError::Missing(PathBuf::new())),
        });
        mark_roles(&mut p, &[A]);
        assert_eq!(p.containers[0].role, ContainerRole::App);
        assert_eq!(p.containers[1].role, ContainerRole::Sandbox);
        assert_eq!(p.containers[2].role, ContainerRole::Conmon);
    }
}
