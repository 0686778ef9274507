//! One read of the kubepods tree: kubepods itself, every pod cgroup and each
//! container cgroup's `cpu.max`.
//!
//! Per-pod trouble (a pod deleted between listing and reading, a missing or
//! malformed file) is recorded on that pod and the scan carries on; only an
//! unreadable kubepods is fatal. One buffer and one path are reused for every
//! file, each file is read once, and directory entries are classified by name
//! before any `stat`.

use std::path::{Path, PathBuf};

use super::file;
use super::layout::{self, container_name, pod_dir, pod_id, qos_dir};
use super::parse::{self, ParseError};
use super::read::{self, Buf, Handles, ReadError};
use super::types::{
    CgroupError, CgroupSample, ContainerCgroup, ContainerRole, CpuMax, Layout, NodeSnapshot,
    PodCgroup,
};
use crate::model::{CgroupPodId, Qos};

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("kubepods cgroup unusable: {0}")]
    Kubepods(CgroupError),
}

/// Reads the whole tree under `root` as `layout` describes it. `at_us` is the
/// caller's monotonic clock, stored in the snapshot for rate computations.
pub fn scan(root: &Path, layout: &Layout, at_us: u64) -> Result<NodeSnapshot, ScanError> {
    Scanner::new(root, Handles::none()).scan(layout, at_us)
}

/// How much of one pod [`rescan`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Not read: left out of the snapshot.
    Skip,
    /// The pod's `cpu.stat` only (usage and its own throttling): what the
    /// policy needs of a managed pod. `cpu.max` and `cpu.weight` are carried
    /// over from the index snapshot, so they are as old as that scan; the
    /// containers are left out (empty) and pressure is `None`, so no stale
    /// counter is ever compared with a fresh one.
    Stat,
    /// `cpu.stat` and `cpu.pressure`, and each limited container's
    /// throttling: what attributing contention needs.
    StatPressure,
    /// Everything, as [`scan`] reads it (pod files and container `cpu.max`).
    Full,
}

/// A cheaper tick: kubepods' counters (`cpu.stat`, `cpu.pressure`; its
/// `cpu.max` and `cpu.weight` are the index's), and only the pods of `index`
/// (the last full [`scan`]) that `depth` asks for, without listing any
/// directory. A pod missing from `index` needs a full scan. `depth` sees
/// this tick's kubepods sample (read first), so what it asks of the pods
/// may depend on it.
pub fn rescan(
    root: &Path,
    index: &NodeSnapshot,
    at_us: u64,
    depth: impl FnMut(&PodCgroup, &CgroupSample) -> Depth,
) -> Result<NodeSnapshot, ScanError> {
    Scanner::new(root, Handles::none()).rescan(index, at_us, depth)
}

/// Reads the tree under one root tick after tick, keeping the read buffer
/// and (on cgroupfs) the open handles of the files it reads every tick.
pub struct Scanner {
    root: PathBuf,
    buf: Buf,
    handles: Handles,
}

impl Scanner {
    pub fn new(root: &Path, handles: Handles) -> Self {
        Scanner {
            root: root.to_path_buf(),
            buf: Buf::default(),
            handles,
        }
    }

    /// The open handles (how many, how many reads each way).
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// A reader of the cgroup at `path`; `hot`: whether what it reads is
    /// read every tick (a light tick's counters), whose handles are kept
    /// first.
    fn reader(&mut self, path: PathBuf, hot: bool) -> Reader<'_> {
        Reader {
            path,
            buf: &mut self.buf,
            handles: &mut self.handles,
            root: &self.root,
            hot,
            issues: Vec::new(),
        }
    }

    /// See [`scan`].
    pub fn scan(&mut self, layout: &Layout, at_us: u64) -> Result<NodeSnapshot, ScanError> {
        let (node_usage_us, root_issues) = self.node_usage_us();
        let kp = self.root.join(&layout.kubepods);
        // A full scan (the audit) reads every file once in a while: kept
        // only where the files the light ticks read leave room.
        let mut r = self.reader(kp, false);
        r.issues = root_issues;
        let kubepods = r.sample().map_err(ScanError::Kubepods)?;
        let top = r.subdirs().map_err(ScanError::Kubepods)?;
        let mut pods = Vec::with_capacity(top.len());
        let mut unlisted_qos = Vec::new();
        for name in &top {
            if let Some(id) = pod_id(name, layout.driver) {
                r.path.push(name);
                pods.push(r.pod(id, Qos::Guaranteed));
                r.path.pop();
            } else if let Some(qos) = qos_dir(name, layout.driver) {
                r.path.push(name);
                // A QoS cgroup that vanished holds no pods; one that cannot be
                // listed holds pods we cannot see, which is not the same: it is
                // recorded so nobody reads its pods as gone.
                let children = match r.subdirs() {
                    Ok(c) => c,
                    Err(CgroupError::Vanished(_)) => Vec::new(),
                    Err(e) => {
                        unlisted_qos.push(qos);
                        r.issues.push(e);
                        Vec::new()
                    }
                };
                for child in &children {
                    if let Some(id) = pod_id(child, layout.driver) {
                        r.path.push(child);
                        pods.push(r.pod(id, qos));
                        r.path.pop();
                    }
                }
                r.path.pop();
            }
        }
        let issues = r.issues;
        self.handles.sweep();
        pods.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(NodeSnapshot {
            at_us,
            layout: layout.clone(),
            kubepods,
            pods,
            unlisted_qos,
            node_usage_us,
            issues,
        })
    }

    /// The root cgroup's `usage_usec` (every task of the machine), read
    /// every tick through a kept handle, and the errors met reading it.
    /// Absent or unreadable is `None`, never fatal: only the contention
    /// signal's idle reading uses it, and it falls back to kubepods alone.
    fn node_usage_us(&mut self) -> (Option<u64>, Vec<CgroupError>) {
        let root = self.root.clone();
        let mut r = self.reader(root, true);
        let usage = r
            .optional(file::CPU_STAT, parse::cpu_stat)
            .map(|s| s.usage_usec);
        (usage, r.issues)
    }

    /// See [`rescan`].
    pub fn rescan(
        &mut self,
        index: &NodeSnapshot,
        at_us: u64,
        depth: impl FnMut(&PodCgroup, &CgroupSample) -> Depth,
    ) -> Result<NodeSnapshot, ScanError> {
        self.rescan_finding(index, at_us, &[], depth)
    }

    /// [`rescan`], and the pods of `new` (uid, QoS class) that `index` does
    /// not know, each looked up alone at the directory its class names
    /// ([`pod_dir`]; the other classes' after it) and read in full: a new
    /// pod costs a few files, not a scan of the tree. A pod whose directory
    /// is not (yet) there is left out, nothing recorded. The snapshot's pods
    /// stay in path order.
    pub fn rescan_finding(
        &mut self,
        index: &NodeSnapshot,
        at_us: u64,
        new: &[(CgroupPodId, Qos)],
        mut depth: impl FnMut(&PodCgroup, &CgroupSample) -> Depth,
    ) -> Result<NodeSnapshot, ScanError> {
        let (node_usage_us, root_issues) = self.node_usage_us();
        let kp = self.root.join(&index.layout.kubepods);
        let mut r = self.reader(kp, true);
        r.issues = root_issues;
        let kubepods = r.counters(&index.kubepods).map_err(ScanError::Kubepods)?;
        let mut pods = Vec::with_capacity(index.pods.len() + new.len());
        for p in &index.pods {
            let d = depth(p, &kubepods);
            if d == Depth::Skip {
                continue;
            }
            r.at(&p.path);
            if d == Depth::Full {
                // A pod in a resize, read whole for a few ticks: cold.
                r.hot = false;
                pods.push(r.pod(p.id.clone(), p.qos));
                r.hot = true;
                continue;
            }
            let stat = r.required(file::CPU_STAT, parse::cpu_stat);
            let pressure = match (d, &stat) {
                (Depth::StatPressure, Ok(_)) => r.optional(file::CPU_PRESSURE, parse::pressure),
                _ => None,
            };
            let sample = match (stat, &p.sample) {
                (Ok(cpu_stat), Ok(old)) => Ok(CgroupSample {
                    cpu_stat,
                    pressure,
                    ..*old
                }),
                (Err(e), _) => Err(r.noted(e)),
                (Ok(_), Err(e)) => Err(e.clone()),
            };
            // Container throttling too: it is part of the stall the pod's own
            // quota explains (see `signal::usage::Stall`).
            let containers = if d == Depth::StatPressure {
                let mut containers = p.containers.clone();
                for c in &mut containers {
                    r.at(&c.path);
                    c.throttled_usec = r.container_throttled(&c.cpu_max);
                }
                containers
            } else {
                Vec::new()
            };
            pods.push(PodCgroup {
                id: p.id.clone(),
                qos: p.qos,
                path: p.path.clone(),
                sample,
                containers,
                containers_unlisted: None,
            });
        }
        let mut found = false;
        for (id, qos) in new {
            let (id, qos) = (id, *qos);
            // An id from the API (a mirror pod's annotation names it) is
            // only looked up where a pod cgroup's name could hold it: never
            // a path of its own.
            if !layout::is_pod_id(id.as_str()) {
                continue;
            }
            let classes = [qos, Qos::Burstable, Qos::BestEffort, Qos::Guaranteed];
            for (i, &q) in classes.iter().enumerate() {
                if i > 0 && q == qos {
                    continue;
                }
                r.at(&pod_dir(&index.layout, q, id));
                if r.path.is_dir() {
                    r.hot = false;
                    pods.push(r.pod(id.clone(), q));
                    r.hot = true;
                    found = true;
                    break;
                }
            }
        }
        if found {
            pods.sort_by(|a, b| a.path.cmp(&b.path));
        }
        let issues = r.issues;
        self.handles.sweep();
        Ok(NodeSnapshot {
            at_us,
            layout: index.layout.clone(),
            kubepods,
            pods,
            unlisted_qos: index.unlisted_qos.clone(),
            node_usage_us,
            issues,
        })
    }
}

/// The index after a light read `cur` of it: the pods `cur` found that the
/// index did not know ([`Scanner::rescan_finding`]; `known` says which it
/// knows) added, the pods whose cgroup `cur` saw vanish dropped, in path
/// order; `None` when neither happened (most ticks: nothing allocated).
/// The index keeps its time, so a found pod's counters in it are younger
/// than `at_us` says: a pod first read while it is not managed and
/// measured later against the index (`signal::usage::measure_with`, which
/// `signal::between` measures the slack's `NodeUsage` with) reads a
/// usage averaged over a longer interval than it ran, once.
pub fn reindex(
    index: &NodeSnapshot,
    cur: &NodeSnapshot,
    known: impl Fn(&CgroupPodId) -> bool,
) -> Option<NodeSnapshot> {
    let vanished = |p: &PodCgroup| matches!(p.sample, Err(CgroupError::Vanished(_)));
    if !cur.pods.iter().any(|p| vanished(p) || !known(&p.id)) {
        return None;
    }
    let gone: Vec<&CgroupPodId> = cur
        .pods
        .iter()
        .filter(|p| vanished(p))
        .map(|p| &p.id)
        .collect();
    let mut next = index.clone();
    next.pods.retain(|p| !gone.contains(&&p.id));
    next.pods.extend(
        cur.pods
            .iter()
            .filter(|p| !known(&p.id) && !vanished(p))
            .cloned(),
    );
    next.pods.sort_by(|a, b| a.path.cmp(&b.path));
    Some(next)
}

/// Sets each container's role from the ids the pod's status lists: listed →
/// App, not listed → Sandbox (the pause container), CRI-O's conmon stays
/// Conmon. A container started after the status was read shows as Sandbox
/// until the next status; callers must not act on Sandbox cgroups anyway.
pub fn mark_roles(pod: &mut PodCgroup, is_app: impl Fn(&str) -> bool) {
    for c in &mut pod.containers {
        if c.role == ContainerRole::Conmon {
            continue;
        }
        c.role = if is_app(&c.id) {
            ContainerRole::App
        } else {
            ContainerRole::Sandbox
        };
    }
}

struct Reader<'a> {
    /// Absolute path of the cgroup being read; files are pushed and popped.
    path: PathBuf,
    buf: &'a mut Buf,
    handles: &'a mut Handles,
    root: &'a Path,
    /// Whether the files read now are read every tick (a light tick's):
    /// those keep their handles first ([`Handles::read_cold`]).
    hot: bool,
    /// Errors met so far (see [`NodeSnapshot::issues`]).
    issues: Vec<CgroupError>,
}

enum Read1 {
    Ok,
    NotFound,
}

impl Reader<'_> {
    /// Moves to the cgroup at `rel` (relative to the root), reusing the path's
    /// buffer.
    fn at(&mut self, rel: &Path) {
        self.path.as_mut_os_string().clear();
        self.path.push(self.root);
        self.path.push(rel);
    }

    fn rel(&self) -> PathBuf {
        self.path
            .strip_prefix(self.root)
            .map_or_else(|_| self.path.clone(), Path::to_path_buf)
    }

    /// Records `e` (vanished cgroups are churn, not trouble) and returns it.
    fn noted(&mut self, e: CgroupError) -> CgroupError {
        if !matches!(e, CgroupError::Vanished(_)) {
            self.issues.push(e.clone());
        }
        e
    }

    /// `e` on `self.path`, typed.
    fn error(&self, e: ReadError) -> CgroupError {
        CgroupError::from_read(self.path.clone(), e)
    }

    /// Reads `file` of the current cgroup into `self.buf`.
    fn read(&mut self, file: &str) -> Result<Read1, CgroupError> {
        self.path.push(file);
        let read = if self.hot {
            self.handles.read_into(&self.path, self.buf)
        } else {
            self.handles.read_cold(&self.path, self.buf)
        };
        let out = match read {
            Ok(()) => Ok(Read1::Ok),
            Err(ReadError::NotFound(_)) => Ok(Read1::NotFound),
            Err(e) => Err(self.error(e)),
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

    fn malformed(&self, file: &str, source: ParseError) -> CgroupError {
        CgroupError::Malformed {
            path: self.path.join(file),
            source,
        }
    }

    /// Parses what `read` left in `self.buf`. A file that does not parse loses
    /// its kept handle, so the next tick opens the path again: what the handle
    /// holds may no longer be the file the path names (something mounted over
    /// it, or a cgroup made again), and a path that mends must read as mended.
    fn parsed<T>(
        &mut self,
        file: &str,
        p: fn(&[u8]) -> Result<T, ParseError>,
    ) -> Result<T, CgroupError> {
        p(self.buf.bytes()).map_err(|e| {
            self.path.push(file);
            self.handles.forget(&self.path);
            self.path.pop();
            self.malformed(file, e)
        })
    }

    fn required<T>(
        &mut self,
        file: &str,
        p: fn(&[u8]) -> Result<T, ParseError>,
    ) -> Result<T, CgroupError> {
        match self.read(file)? {
            Read1::Ok => self.parsed(file, p),
            Read1::NotFound => Err(self.absent(file)),
        }
    }

    /// A file whose trouble must not cost the cgroup's other values: any
    /// error is recorded and reads as absent. (PSI disabled in the kernel
    /// fails with EOPNOTSUPP, which is absent too.)
    fn optional<T>(&mut self, file: &str, p: fn(&[u8]) -> Result<T, ParseError>) -> Option<T> {
        let res = match self.read(file) {
            Ok(Read1::Ok) => self.parsed(file, p),
            Ok(Read1::NotFound) => return None,
            Err(CgroupError::Io { source, .. })
                if source.0.raw_os_error() == Some(nix::libc::EOPNOTSUPP) =>
            {
                return None;
            }
            Err(e) => Err(e),
        };
        res.map_err(|e| self.noted(e)).ok()
    }

    /// Reads every file before judging, so one bad file never hides
    /// another's good value from the issues list.
    fn sample(&mut self) -> Result<CgroupSample, CgroupError> {
        let cpu_max = self.required(file::CPU_MAX, parse::cpu_max);
        let cpu_stat = self.required(file::CPU_STAT, parse::cpu_stat);
        let pressure = self.optional(file::CPU_PRESSURE, parse::pressure);
        let weight = self.optional(file::CPU_WEIGHT, parse::weight);
        match (cpu_max, cpu_stat) {
            (Ok(cpu_max), Ok(cpu_stat)) => Ok(CgroupSample {
                cpu_max,
                cpu_stat,
                pressure,
                weight,
            }),
            (Err(e), stat) => {
                if let Err(e2) = stat {
                    self.noted(e2);
                }
                Err(self.noted(e))
            }
            (Ok(_), Err(e)) => Err(self.noted(e)),
        }
    }

    /// kubepods on a light tick: its counters (`cpu.stat`, `cpu.pressure`)
    /// afresh, `cpu.max` and `cpu.weight` as `index` read them (an operator
    /// writing kubepods' `cpu.max` raises an inotify event, hence an audit).
    fn counters(&mut self, index: &CgroupSample) -> Result<CgroupSample, CgroupError> {
        let cpu_stat = self
            .required(file::CPU_STAT, parse::cpu_stat)
            .map_err(|e| self.noted(e))?;
        let pressure = self.optional(file::CPU_PRESSURE, parse::pressure);
        Ok(CgroupSample {
            cpu_stat,
            pressure,
            ..*index
        })
    }

    /// Names of the current cgroup's child directories. Interface files all
    /// contain a '.' and none ends in `.slice`/`.scope`, so most entries are
    /// dropped by name without a `stat`.
    fn subdirs(&mut self) -> Result<Vec<String>, CgroupError> {
        let rd = match read::list_dir(&self.path) {
            Ok(rd) => rd,
            Err(ReadError::NotFound(_)) => return Err(CgroupError::Vanished(self.rel())),
            Err(e) => return Err(self.error(e)),
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

    /// `throttled_usec` of the container cgroup at `self.path` when its
    /// quota is finite; trouble reads as unknown (recorded, like bad PSI).
    fn container_throttled(&mut self, cpu_max: &Result<CpuMax, CgroupError>) -> Option<u64> {
        if !matches!(
            cpu_max,
            Ok(CpuMax {
                quota_us: Some(_),
                ..
            })
        ) {
            return None;
        }
        self.optional(file::CPU_STAT, parse::cpu_stat)
            .and_then(|s| s.throttled_usec)
    }

    /// Reads the pod cgroup at `self.path`.
    fn pod(&mut self, id: CgroupPodId, qos: Qos) -> PodCgroup {
        let path = self.rel();
        let sample = self.sample();
        let mut containers = Vec::new();
        let mut containers_unlisted = None;
        match self.subdirs() {
            Ok(children) => {
                containers.reserve(children.len());
                for name in &children {
                    let Some((runtime, id, role)) = container_name(name) else {
                        continue;
                    };
                    self.path.push(name);
                    let cpu_max = self
                        .required(file::CPU_MAX, parse::cpu_max)
                        .map_err(|e| self.noted(e));
                    let throttled_usec = self.container_throttled(&cpu_max);
                    containers.push(ContainerCgroup {
                        id: id.to_owned(),
                        runtime,
                        role,
                        path: self.rel(),
                        cpu_max,
                        throttled_usec,
                    });
                    self.path.pop();
                }
            }
            Err(CgroupError::Vanished(_)) => {}
            Err(e) => containers_unlisted = Some(self.noted(e)),
        }
        containers.sort_by(|a, b| a.path.cmp(&b.path));
        PodCgroup {
            id,
            qos,
            path: path.into(),
            sample,
            containers,
            containers_unlisted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubepods file that does not parse loses its kept handle: once the
    /// path names a good file again (here a new file renamed over it, as when
    /// something mounted over it is unmounted), the next scan reads it. With
    /// the handle kept, the scan would read the bad file for ever.
    #[test]
    fn a_malformed_file_is_opened_again_on_the_next_scan() {
        let (t, layout) = tree();
        let stat = t.path().join(&layout.kubepods).join(file::CPU_STAT);
        let good = fs::read(&stat).unwrap();
        let bad = t.path().join("bad");
        fs::write(&bad, "garbage\n").unwrap();
        fs::rename(&bad, &stat).unwrap();
        let mut sc = Scanner::new(t.path(), Handles::keeping(64));
        assert!(matches!(
            sc.scan(&layout, 0),
            Err(ScanError::Kubepods(CgroupError::Malformed { .. }))
        ));
        let mended = t.path().join("mended");
        fs::write(&mended, &good).unwrap();
        fs::rename(&mended, &stat).unwrap();
        let index = sc.scan(&layout, 1).expect("the mended file is read");
        let kept = sc.handles().kept_reads;
        sc.rescan(&index, 2, |_, _| Depth::Skip).expect("and kept");
        assert!(sc.handles().kept_reads > kept);
    }

    /// With room for just the files a light tick reads, the audit's full
    /// scan fills the slots first; the light tick's files take them, and
    /// the next full scan takes none back.
    #[test]
    fn a_light_ticks_files_take_the_audits_slots() {
        let (t, layout) = tree();
        let index = scan(t.path(), &layout, 0).expect("full scan");
        // What a light tick reads (the root's counters, kubepods' and each
        // pod's), counted with room to spare.
        let mut roomy = Scanner::new(t.path(), Handles::keeping(1000));
        roomy
            .rescan(&index, 0, |_, _| Depth::Stat)
            .expect("light tick");
        let hot = roomy.handles().len();
        assert!(hot > index.pods.len());
        let before = roomy.handles().kept_reads;
        roomy
            .rescan(&index, 1, |_, _| Depth::Stat)
            .expect("light tick");
        let reads = roomy.handles().kept_reads - before;
        let mut sc = Scanner::new(t.path(), Handles::keeping(hot));
        sc.scan(&layout, 0).expect("full scan");
        assert_eq!(sc.handles().len(), hot, "the audit fills every slot");
        assert_eq!(sc.handles().cold_len(), hot, "all cold");
        sc.rescan(&index, 1, |_, _| Depth::Stat)
            .expect("light tick");
        sc.scan(&layout, 2).expect("full scan");
        assert_eq!(sc.handles().cold_len(), 0, "an audit's file kept");
        let before = sc.handles().kept_reads;
        sc.rescan(&index, 3, |_, _| Depth::Stat)
            .expect("light tick");
        assert_eq!(
            sc.handles().kept_reads - before,
            reads,
            "a light tick's file opened"
        );
    }

    #[test]
    fn rescan_reads_pressure_only_at_stat_pressure_depth() {
        let (t, layout) = tree();
        let full = scan(t.path(), &layout, 0).unwrap();
        let b = full
            .pods
            .iter()
            .find(|p| p.qos == Qos::Burstable)
            .unwrap()
            .clone();
        fs::write(
            t.path().join(&b.path).join(file::CPU_PRESSURE),
            "some avg10=1.00 avg60=0.00 avg300=0.00 total=777\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=555\n",
        )
        .unwrap();
        let read = |d: Depth| {
            let s = rescan(t.path(), &full, 1, |p, kp| {
                assert!(kp.pressure.is_some(), "depth sees this tick's kubepods");
                if p.id == b.id { d } else { Depth::Skip }
            })
            .unwrap();
            s.pods[0].sample.as_ref().unwrap().pressure
        };
        assert_eq!(read(Depth::Stat), None);
        let p = read(Depth::StatPressure).expect("pressure read");
        assert_eq!(
            (p.some.total_us, p.full.map(|f| f.total_us)),
            (777, Some(555))
        );
    }

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
            gdir.join(file::CPU_STAT),
            "usage_usec 900\nuser_usec 500\nsystem_usec 400\n",
        )
        .unwrap();
        fs::write(gdir.join(file::CPU_MAX), "70000 100000\n").unwrap();
        let only_g = |p: &PodCgroup, _: &CgroupSample| {
            if p.id == g.id {
                Depth::Stat
            } else {
                Depth::Skip
            }
        };
        let light = rescan(t.path(), &full, 5, only_g).unwrap();
        assert_eq!(light.pods.len(), 1, "skipped pods are left out");
        let s = light.pods[0].sample.as_ref().unwrap();
        assert_eq!(s.cpu_stat.usage_usec, 900, "cpu.stat re-read");
        assert_eq!(
            s.cpu_max,
            g.sample.as_ref().unwrap().cpu_max,
            "cpu.max carried over at Stat depth"
        );
        assert_eq!(s.pressure, None, "pressure not carried over at Stat depth");
        assert!(
            light.pods[0].containers.is_empty(),
            "no container at Stat depth"
        );
        // kubepods: counters afresh, cpu.max as the index read it.
        let kp = t.path().join("kubepods.slice");
        fs::write(kp.join(file::CPU_MAX), "400000 100000\n").unwrap();
        fs::write(kp.join(file::CPU_STAT), "usage_usec 4242\n").unwrap();
        let light = rescan(t.path(), &full, 5, only_g).unwrap();
        assert_eq!(light.kubepods.cpu_stat.usage_usec, 4242);
        assert_eq!(light.kubepods.cpu_max, full.kubepods.cpu_max);
        let contended = rescan(t.path(), &full, 5, |p, _| {
            if p.id == g.id {
                Depth::StatPressure
            } else {
                Depth::Skip
            }
        })
        .unwrap();
        let c = &contended.pods[0].containers;
        assert_eq!(c.len(), 2);
        assert_eq!(
            c.iter().map(|c| c.throttled_usec).collect::<Vec<_>>(),
            vec![Some(5), None],
            "the limited container's throttling only"
        );
        let deep = rescan(t.path(), &full, 6, |_, _| Depth::Full).unwrap();
        assert_eq!(deep.pods.len(), full.pods.len());
        let s = deep
            .pods
            .iter()
            .find(|p| p.id == g.id)
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
        let gone = rescan(t.path(), &full, 7, only_g).unwrap();
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

    /// A pod made after the index is found at its own directory (its QoS
    /// class's first, another class's if the view's was wrong), read in
    /// full, without listing any directory; one whose directory is not
    /// there yet is left out with nothing recorded. `reindex` then adds the
    /// found pod, and drops one whose cgroup the light read saw vanish.
    #[test]
    fn a_new_pod_is_found_alone_and_a_vanished_one_leaves_the_index() {
        let (t, layout) = tree();
        let index = scan(t.path(), &layout, 0).unwrap();
        let bu = t.path().join("kubepods.slice/kubepods-burstable.slice");
        let new = bu.join("kubepods-burstable-pod55555555_6666.slice");
        cg(&new, "20000 100000\n");
        cg(
            &new.join(format!("cri-containerd-{A}.scope")),
            "20000 100000\n",
        );
        let mut sc = Scanner::new(t.path(), Handles::none());
        let want = [
            ("55555555-6666".into(), Qos::Guaranteed),
            ("77777777-8888".into(), Qos::Burstable),
            // Not a pod id: never looked up as a path.
            ("../../..".into(), Qos::Burstable),
        ];
        let light = sc
            .rescan_finding(&index, 5, &want, |_, _| Depth::Skip)
            .unwrap();
        assert_eq!(light.pods.len(), 1, "{:?}", light.pods);
        let p = &light.pods[0];
        assert_eq!((p.id.as_str(), p.qos), ("55555555-6666", Qos::Burstable));
        assert_eq!(
            p.sample.as_ref().unwrap().cpu_max.quota_us,
            Some(20000),
            "read in full"
        );
        assert_eq!(p.containers.len(), 1);
        assert!(light.issues.is_empty(), "{:?}", light.issues);
        let known = |u: &CgroupPodId| index.pods.iter().any(|p| &p.id == u);
        let next = reindex(&index, &light, known).expect("a pod found");
        assert_eq!(next.pods.len(), index.pods.len() + 1);
        assert!(next.pods.windows(2).all(|w| w[0].path < w[1].path));
        assert_eq!(next.at_us, index.at_us, "the index keeps its time");
        // The new pod's cgroup goes: a light read sees it vanish.
        fs::remove_dir_all(&new).unwrap();
        let gone = sc
            .rescan(&next, 6, |p, _| {
                if p.id.as_str() == "55555555-6666" {
                    Depth::Stat
                } else {
                    Depth::Skip
                }
            })
            .unwrap();
        assert!(matches!(gone.pods[0].sample, Err(CgroupError::Vanished(_))));
        assert!(
            gone.issues.is_empty(),
            "churn, not trouble: {:?}",
            gone.issues
        );
        let known = |u: &CgroupPodId| next.pods.iter().any(|p| &p.id == u);
        let after = reindex(&next, &gone, known).expect("a pod gone");
        assert_eq!(after.pods, index.pods);
        let known = |u: &CgroupPodId| after.pods.iter().any(|p| &p.id == u);
        let calm = sc.rescan(&after, 7, |_, _| Depth::Stat).unwrap();
        assert!(reindex(&after, &calm, known).is_none(), "nothing changed");
    }

    fn cg(dir: &Path, max: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(file::CPU_MAX), max).unwrap();
        fs::write(
            dir.join(file::CPU_STAT),
            "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 10\nnr_throttled 1\nthrottled_usec 5\n",
        )
        .unwrap();
        fs::write(
            dir.join(file::CPU_PRESSURE),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        )
        .unwrap();
        fs::write(dir.join(file::CPU_WEIGHT), "100\n").unwrap();
    }

    fn tree() -> (tempfile::TempDir, Layout) {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        fs::write(r.join(file::CONTROLLERS), "cpu memory\n").unwrap();
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
        assert_eq!(g.id.as_str(), "11111111-2222");
        assert_eq!(
            g.path,
            Path::new("kubepods.slice/kubepods-pod11111111_2222.slice").into()
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
        assert_eq!(b.id.as_str(), "33333333-4444");
    }

    #[test]
    fn malformed_and_missing_files_stay_on_their_pod() {
        let (t, l) = tree();
        let kp = t.path().join("kubepods.slice");
        let g = kp.join("kubepods-pod11111111_2222.slice");
        fs::write(g.join(file::CPU_STAT), "garbage\n").unwrap();
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
        let mut sc = Scanner::new(t.path(), Handles::none());
        let mut r = sc.reader(t.path().join("kubepods.slice/kubepods-podgone.slice"), true);
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
        fs::remove_file(g.join(file::CPU_PRESSURE)).unwrap();
        fs::remove_file(g.join(file::CPU_WEIGHT)).unwrap();
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
        fs::write(g.join(file::CPU_STAT), big).unwrap();
        let s = scan(t.path(), &l, 0).unwrap();
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        assert_eq!(gp.sample.as_ref().unwrap().cpu_stat.usage_usec, 4242);
    }

    /// EACCES on a QoS directory made its pods vanish silently.
    #[test]
    fn unlistable_qos_dir_is_reported_not_empty() {
        let (t, l) = tree();
        let bu = t.path().join("kubepods.slice/kubepods-burstable.slice");
        let _deny = read::seam::deny(&bu);
        let s = scan(t.path(), &l, 0).unwrap();
        assert_eq!(s.unlisted_qos, vec![Qos::Burstable]);
        assert_eq!(s.pods.len(), 1, "only the Guaranteed pod is visible");
        assert!(
            matches!(&s.issues[..], [CgroupError::PermissionDenied { path, .. }] if *path == bu),
            "{:?}",
            s.issues
        );
    }

    #[test]
    fn unreadable_pod_dir_is_permission_denied_on_that_pod() {
        let (t, l) = tree();
        let g = t
            .path()
            .join("kubepods.slice/kubepods-pod11111111_2222.slice");
        let _deny = read::seam::deny(&g);
        let s = scan(t.path(), &l, 0).unwrap();
        assert_eq!(s.pods.len(), 2, "the pod stays in the snapshot");
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        assert!(
            gp.sample
                .as_ref()
                .is_err_and(CgroupError::is_permission_denied),
            "{:?}",
            gp.sample
        );
        assert!(
            gp.containers_unlisted
                .as_ref()
                .is_some_and(CgroupError::is_permission_denied)
        );
        assert!(s.issues.iter().all(CgroupError::is_permission_denied));
        assert!(!s.issues.is_empty());
    }

    /// Malformed PSI used to make the whole kubepods sample (and the tick)
    /// fail, while a missing file was fine; on a pod it hid a good cpu.max.
    #[test]
    fn malformed_psi_reads_as_absent_and_is_reported() {
        let (t, l) = tree();
        let kp = t.path().join("kubepods.slice");
        let g = kp.join("kubepods-pod11111111_2222.slice");
        fs::write(
            kp.join(file::CPU_PRESSURE),
            "some avg10=nan avg60=0 avg300=0 total=0\n",
        )
        .unwrap();
        fs::write(g.join(file::CPU_PRESSURE), "garbage\n").unwrap();
        fs::write(g.join(file::CPU_WEIGHT), "0\n").unwrap();
        let s = scan(t.path(), &l, 0).unwrap();
        assert_eq!(s.kubepods.pressure, None);
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        let smp = gp.sample.as_ref().unwrap();
        assert_eq!(smp.cpu_max.millicores(), Some(500), "cpu.max kept");
        assert_eq!((smp.pressure, smp.weight), (None, None));
        assert_eq!(s.issues.len(), 3, "{:?}", s.issues);
        assert!(
            s.issues
                .iter()
                .all(|e| matches!(e, CgroupError::Malformed { .. }))
        );
    }

    /// Errors keep what the OS or the parser said: the `source()` chain of
    /// an I/O error reaches the real `io::Error`, a malformed file's the
    /// [`ParseError`].
    #[test]
    fn error_sources_reach_the_io_error_and_the_parse_error() {
        use std::error::Error;
        let (t, l) = tree();
        let kp = t.path().join("kubepods.slice");
        let g = kp.join("kubepods-pod11111111_2222.slice");
        // open(2) on a Unix socket fails with ENXIO: an I/O error, not absence.
        fs::remove_file(g.join(file::CPU_MAX)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(g.join(file::CPU_MAX)).unwrap();
        fs::write(g.join(file::CPU_WEIGHT), "many\n").unwrap();
        let s = scan(t.path(), &l, 0).unwrap();
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        let e = gp.sample.as_ref().unwrap_err();
        assert!(matches!(e, CgroupError::Io { .. }), "{e:?}");
        let io = std::iter::successors(Some(e as &(dyn Error + 'static)), |e| (*e).source())
            .find_map(|e| e.downcast_ref::<std::io::Error>())
            .expect("an io::Error in the source chain");
        assert_eq!(io.raw_os_error(), Some(nix::libc::ENXIO));
        let m = s
            .issues
            .iter()
            .find(|e| matches!(e, CgroupError::Malformed { .. }))
            .expect("cpu.weight reported");
        let pe = m.source().unwrap().downcast_ref::<ParseError>().unwrap();
        assert!(matches!(pe, ParseError::Invalid(_)), "{pe:?}");
    }

    /// A symlink to /dev/zero made the scan allocate 4 GiB and abort; a FIFO
    /// hung it; a 13 MB file was read and echoed whole.
    #[test]
    fn hostile_files_cost_one_error_each() {
        let (t, l) = tree();
        let kp = t.path().join("kubepods.slice");
        let g = kp.join("kubepods-pod11111111_2222.slice");
        let bu = kp.join("kubepods-burstable.slice/kubepods-burstable-pod33333333_4444.slice");
        fs::remove_file(g.join(file::CPU_MAX)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", g.join(file::CPU_MAX)).unwrap();
        fs::remove_file(bu.join(file::CPU_MAX)).unwrap();
        nix::unistd::mkfifo(
            &bu.join(file::CPU_MAX),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let c = g.join(format!("cri-containerd-{A}.scope/cpu.max"));
        fs::write(&c, format!("{} 100000\n", "9".repeat(13 << 20))).unwrap();
        let t0 = std::time::Instant::now();
        let s = scan(t.path(), &l, 0).unwrap();
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        let gp = s.pods.iter().find(|p| p.qos == Qos::Guaranteed).unwrap();
        assert!(
            matches!(
                &gp.sample,
                Err(CgroupError::NotRegular {
                    what: "a symlink",
                    ..
                })
            ),
            "{:?}",
            gp.sample
        );
        assert!(matches!(
            &gp.containers[0].cpu_max,
            Err(CgroupError::TooLarge { .. })
        ));
        let bp = s.pods.iter().find(|p| p.qos == Qos::Burstable).unwrap();
        assert!(
            matches!(
                &bp.sample,
                Err(CgroupError::NotRegular { what: "a FIFO", .. })
            ),
            "{:?}",
            bp.sample
        );
        for e in &s.issues {
            assert!(e.to_string().len() < 300, "{e}");
        }
        // kubepods itself: the tick fails, with a short message.
        fs::remove_file(kp.join(file::CPU_MAX)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", kp.join(file::CPU_MAX)).unwrap();
        let e = scan(t.path(), &l, 0).unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
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
            throttled_usec: None,
        });
        mark_roles(&mut p, |id| id == A);
        assert_eq!(p.containers[0].role, ContainerRole::App);
        assert_eq!(p.containers[1].role, ContainerRole::Sandbox);
        assert_eq!(p.containers[2].role, ContainerRole::Conmon);
    }
}
