//! inotify on the pod and container cgroup directories, so an out-of-band
//! write to a `cpu.max` triggers an audit at once instead of at the next
//! interval.
//!
//! One watch per directory (not per file): a directory watch reports
//! IN_MODIFY for its files by name, and IN_CREATE/IN_DELETE for child
//! cgroups, with half the watches. Measured on this kernel (6.18, cgroup v1
//! and v2 kernfs): one `write(2)` through a shell `>` gives two IN_MODIFY
//! (truncate + write), an `rmdir` gives IN_DELETE|IN_ISDIR on the parent but
//! no IN_DELETE_SELF/IN_IGNORED on the removed directory, so watches of gone
//! directories are dropped here on the parent's event. Kernel-updated files
//! (`cpu.stat`, `cpu.pressure`) raise nothing: they must be polled.

use foldhash::{HashMap, HashMapExt, HashSet};

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};

use crate::cgroup::{NodeSnapshot, PodCgroup, file};

/// What changed, with paths relative to the cgroup root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `cpu.max` of this cgroup was written.
    CpuMaxChanged(PathBuf),
    /// A child cgroup appeared (a new pod or container).
    Created(PathBuf),
    /// A cgroup was removed; its watch is dropped.
    Removed(PathBuf),
    /// The kernel queue overflowed: events were lost, audit everything.
    Overflow,
}

/// The directories worth watching in a snapshot: the node-allocatable
/// cgroup, the QoS parents of pod cgroups, every pod and container cgroup.
/// Relative to the root; each once.
pub fn dirs_to_watch(snapshot: &NodeSnapshot) -> Vec<PathBuf> {
    let mut dirs = vec![snapshot.layout.kubepods.clone()];
    // QoS parents repeat pod after pod: a handful of distinct ones.
    let mut parents: Vec<&Path> = Vec::new();
    for p in &snapshot.pods {
        if let Some(parent) = p.path.parent().filter(|x| !x.as_os_str().is_empty())
            && !parents.contains(&parent)
            && parent != snapshot.layout.kubepods
        {
            parents.push(parent);
        }
        dirs.push(p.path.to_path_buf());
        dirs.extend(p.containers.iter().map(|c| c.path.clone()));
    }
    dirs.extend(parents.into_iter().map(Path::to_path_buf));
    dirs
}

/// How many pod and container cgroups a scan found: the watches are
/// re-synced whenever it changes. Counting pods alone missed a container
/// cgroup created between the scan that first saw its pod and the watch on
/// the pod's directory (no IN_CREATE was ever raised for it, so its
/// `cpu.max` went unwatched until the pod count next changed). A count is
/// enough: a cgroup removed meanwhile raises IN_DELETE on a watched parent,
/// which forces a re-sync anyway.
pub fn watch_key(pods: &[PodCgroup]) -> usize {
    pods.iter().map(|p| 1 + p.containers.len()).sum()
}

const MASK: WatchMask = WatchMask::MODIFY
    .union(WatchMask::CREATE)
    .union(WatchMask::DELETE)
    .union(WatchMask::ONLYDIR);

/// An inotify instance over cgroup directories under `root`.
pub struct CgroupWatch {
    root: PathBuf,
    stream: EventStream<Vec<u8>>,
    watches: Watches,
    by_wd: HashMap<WatchDescriptor, PathBuf>,
    /// Keyed by the path's bytes: a re-sync asks it for every pod and
    /// container directory, and hashing a `Path` walks its components.
    by_path: HashMap<OsString, WatchDescriptor>,
}

impl CgroupWatch {
    /// Needs a tokio runtime (the fd is registered with its reactor).
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let inotify = Inotify::init()?;
        let stream = inotify.into_event_stream(vec![0u8; 64 * 1024])?;
        let watches = stream.watches();
        Ok(Self {
            root: root.into(),
            stream,
            watches,
            by_wd: HashMap::new(),
            by_path: HashMap::new(),
        })
    }

    /// Makes the watched set equal to `dirs` (relative to the root): adds
    /// new ones, removes the rest. Returns the directories that could not
    /// be watched (gone already, or the inotify watch limit reached).
    pub fn sync(&mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Vec<(PathBuf, io::Error)> {
        let want: HashSet<OsString> = dirs.into_iter().map(PathBuf::into_os_string).collect();
        let stale: Vec<OsString> = self
            .by_path
            .keys()
            .filter(|p| !want.contains(*p))
            .cloned()
            .collect();
        for p in stale {
            self.unwatch(Path::new(&p));
        }
        let mut failed = Vec::new();
        for rel in want {
            if self.by_path.contains_key(&rel) {
                continue;
            }
            let rel = PathBuf::from(rel);
            match self.watches.add(self.root.join(&rel), MASK) {
                Ok(wd) => {
                    // inotify returns the same wd for the same inode; keep
                    // the newest path for it.
                    if let Some(old) = self.by_wd.insert(wd.clone(), rel.clone()) {
                        self.by_path.remove(old.as_os_str());
                    }
                    self.by_path.insert(rel.into_os_string(), wd);
                }
                Err(e) => failed.push((rel, e)),
            }
        }
        failed
    }

    fn unwatch(&mut self, rel: &Path) {
        if let Some(wd) = self.by_path.remove(rel.as_os_str()) {
            self.by_wd.remove(&wd);
            // Fails with EINVAL when the kernel already dropped it: fine.
            let _ = self.watches.remove(wd);
        }
    }

    /// Number of directories watched.
    pub fn watched(&self) -> usize {
        self.by_path.len()
    }

    /// The next relevant event; irrelevant ones (writes to other files) are
    /// skipped. `None` when the inotify fd is closed.
    pub async fn next(&mut self) -> Option<io::Result<WatchEvent>> {
        loop {
            let ev = match self.stream.next().await? {
                Ok(ev) => ev,
                Err(e) => return Some(Err(e)),
            };
            if ev.mask.contains(EventMask::Q_OVERFLOW) {
                return Some(Ok(WatchEvent::Overflow));
            }
            if ev.mask.contains(EventMask::IGNORED) {
                if let Some(p) = self.by_wd.remove(&ev.wd) {
                    self.by_path.remove(p.as_os_str());
                }
                continue;
            }
            let Some(dir) = self.by_wd.get(&ev.wd).cloned() else {
                continue;
            };
            let Some(name) = ev.name.as_deref() else {
                continue;
            };
            if let Some(e) = classify(ev.mask, &dir, name) {
                if let WatchEvent::Removed(p) = &e {
                    self.unwatch(p);
                }
                return Some(Ok(e));
            }
        }
    }
}

/// Maps one directory event to a [`WatchEvent`]; pure, for tests.
fn classify(mask: EventMask, dir: &Path, name: &OsStr) -> Option<WatchEvent> {
    let is_dir = mask.contains(EventMask::ISDIR);
    if mask.contains(EventMask::MODIFY) && !is_dir && name == file::CPU_MAX {
        Some(WatchEvent::CpuMaxChanged(dir.to_path_buf()))
    } else if mask.contains(EventMask::CREATE) && is_dir {
        Some(WatchEvent::Created(dir.join(name)))
    } else if mask.contains(EventMask::DELETE) && is_dir {
        Some(WatchEvent::Removed(dir.join(name)))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    async fn next_event(w: &mut CgroupWatch) -> WatchEvent {
        // A bound so a broken watch fails the test instead of hanging it;
        // not a timing assertion.
        tokio::time::timeout(Duration::from_secs(10), w.next())
            .await
            .expect("no inotify event")
            .expect("stream ended")
            .expect("inotify error")
    }

    fn write(path: &Path, s: &str) {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .expect("open");
        f.write_all(s.as_bytes()).expect("write");
    }

    #[test]
    fn classify_keeps_cpu_max_writes_and_dir_changes_only() {
        let d = Path::new("kubepods/pod1");
        assert_eq!(
            classify(EventMask::MODIFY, d, OsStr::new(file::CPU_MAX)),
            Some(WatchEvent::CpuMaxChanged(d.into()))
        );
        assert_eq!(
            classify(EventMask::MODIFY, d, OsStr::new("cgroup.procs")),
            None
        );
        assert_eq!(
            classify(EventMask::CREATE | EventMask::ISDIR, d, OsStr::new("abc")),
            Some(WatchEvent::Created(d.join("abc")))
        );
        assert_eq!(classify(EventMask::CREATE, d, OsStr::new("file")), None);
        assert_eq!(
            classify(EventMask::DELETE | EventMask::ISDIR, d, OsStr::new("abc")),
            Some(WatchEvent::Removed(d.join("abc")))
        );
    }

    /// The race cold CI hit: the first scan saw the pod before its container
    /// cgroup existed, so the container's `cpu.max` was never watched.
    #[test]
    fn a_container_cgroup_appearing_later_changes_the_watch_key() {
        use crate::verify::compare::tests::cgroup_for;
        use crate::verify::expected::tests::{container, pod};
        let seen = cgroup_for(&pod("a", vec![container("c", Some(100), Some(200))]));
        let mut early = seen.clone();
        early.containers.clear();
        let one = watch_key(std::slice::from_ref(&seen));
        assert_ne!(watch_key(&[early]), one, "a new container re-syncs");
        let other = cgroup_for(&pod("b", vec![container("c", Some(100), Some(200))]));
        assert_ne!(watch_key(&[seen, other]), one, "a new pod re-syncs");
    }

    #[tokio::test]
    async fn write_to_cpu_max_raises_an_event() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = Path::new("kubepods/burstable/podx");
        std::fs::create_dir_all(tmp.path().join(pod)).unwrap();
        std::fs::write(tmp.path().join(pod).join(file::CPU_MAX), "max 100000\n").unwrap();
        std::fs::write(tmp.path().join(pod).join(file::CPU_STAT), "usage_usec 1\n").unwrap();
        let mut w = CgroupWatch::new(tmp.path()).unwrap();
        assert!(w.sync([pod.to_path_buf()]).is_empty());
        assert_eq!(w.watched(), 1);
        // A write to another file is skipped; the cpu.max write comes through.
        write(&tmp.path().join(pod).join(file::CPU_STAT), "usage_usec 2\n");
        write(&tmp.path().join(pod).join(file::CPU_MAX), "50000 100000\n");
        assert_eq!(
            next_event(&mut w).await,
            WatchEvent::CpuMaxChanged(pod.to_path_buf())
        );
    }

    #[tokio::test]
    async fn mkdir_and_rmdir_raise_created_and_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let qos = Path::new("kubepods/burstable");
        std::fs::create_dir_all(tmp.path().join(qos)).unwrap();
        let mut w = CgroupWatch::new(tmp.path()).unwrap();
        w.sync([qos.to_path_buf()]);
        let pod = qos.join("podnew");
        std::fs::create_dir(tmp.path().join(&pod)).unwrap();
        assert_eq!(next_event(&mut w).await, WatchEvent::Created(pod.clone()));
        w.sync([qos.to_path_buf(), pod.clone()]);
        assert_eq!(w.watched(), 2);
        std::fs::remove_dir(tmp.path().join(&pod)).unwrap();
        assert_eq!(next_event(&mut w).await, WatchEvent::Removed(pod));
        assert_eq!(w.watched(), 1);
    }

    #[tokio::test]
    async fn sync_drops_unwanted_and_reports_missing_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a")).unwrap();
        std::fs::create_dir_all(tmp.path().join("b")).unwrap();
        let mut w = CgroupWatch::new(tmp.path()).unwrap();
        assert!(w.sync(["a".into(), "b".into()]).is_empty());
        let failed = w.sync(["a".into(), "gone".into()]);
        assert_eq!(w.watched(), 1);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, PathBuf::from("gone"));
    }

    /// Runs against a real cgroupfs when `HEADROOM_CGROUP_PROBE_DIR` names a
    /// writable cgroup directory holding `cpu.max` (needs root).
    #[tokio::test]
    #[ignore = "needs root and a real cgroup v2 cpu controller"]
    async fn real_cgroupfs_cpu_max_write_raises_an_event() {
        let Ok(dir) = std::env::var("HEADROOM_CGROUP_PROBE_DIR") else {
            return;
        };
        let dir = PathBuf::from(dir);
        let mut w = CgroupWatch::new(dir.parent().unwrap()).unwrap();
        let rel = PathBuf::from(dir.file_name().unwrap());
        assert!(w.sync([rel.clone()]).is_empty());
        let cur = std::fs::read_to_string(dir.join(file::CPU_MAX)).unwrap();
        write(&dir.join(file::CPU_MAX), &cur);
        assert_eq!(next_event(&mut w).await, WatchEvent::CpuMaxChanged(rel));
    }
}
