//! The CPUs Burstable pods can actually run on.
//!
//! Under the kubelet's static CPU manager (`cpuManagerPolicy: static`) a
//! Guaranteed pod's container with an integer CPU request gets CPUs of its
//! own, and every other container is confined to the *shared pool*: the
//! kubelet writes that set into each container's `cpuset.cpus` (through the
//! runtime) and narrows it whenever an exclusive allocation is made. The pool
//! never shows on kubepods or the QoS cgroups (their cpusets stay the whole
//! node), only on the containers (docs/kubelet-behaviour.md §10).
//!
//! So the pool is read from the tree: the intersection of
//! `cpuset.cpus.effective` of a few Burstable and BestEffort app containers
//! (every one carries the same pool). The intersection, not the union: a
//! pause container, which the kubelet never confines, keeps the whole node,
//! and `slack` without `--pods` cannot tell it from an app container (seen
//! on a real static node: the union read `0-2` for a pool of `0`); and a
//! container read mid-update may still hold a wider set. Under the default
//! `none` policy every set is the root's and nothing changes. Capacity, and
//! with it slack and the default ceiling, is then at most the pool
//! ([`crate::signal::usage::CapacitySource::SharedPool`]): a managed pod is never
//! promised CPU its cpuset does not hold.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::cgroup::{CgroupError, ContainerRole, NodeSnapshot, cpuset};
use crate::model::Qos;

/// Containers whose cpuset is read per scan, at most.
pub const MAX_READS: usize = 4;

/// The shared pool as read from one scan.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SharedPool {
    /// CPUs in the intersection of the cpusets read.
    pub cpus: u64,
    /// That intersection as a kernel CPU list (`0-1,4`).
    pub list: String,
    /// Containers whose cpuset was read.
    pub read: usize,
    /// Containers whose cpuset could not be read or parsed. Skipped, never
    /// fatal: the others make the pool.
    pub skipped: Vec<Skip>,
}

/// A container cgroup whose cpuset was not used.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Skip {
    /// Relative to the cgroup root.
    pub path: PathBuf,
    /// What went wrong, as every cgroup read says it: the agent counts it
    /// (`ScanErrorKind::of`) unless the container vanished (ordinary churn).
    #[serde(skip)]
    pub error: CgroupError,
    /// The error, said.
    pub why: String,
}

/// The container cgroups (relative to the root) whose cpusets tell the
/// pool: app containers of Burstable and BestEffort pods, in scan order, at
/// most `4 × MAX_READS` (room for some to be skipped).
pub fn candidates(snap: &NodeSnapshot) -> Vec<PathBuf> {
    snap.pods
        .iter()
        .filter(|p| matches!(p.qos, Qos::Burstable | Qos::BestEffort))
        .flat_map(|p| p.containers.iter())
        .filter(|c| matches!(c.role, ContainerRole::App | ContainerRole::Unknown))
        .map(|c| c.path.clone())
        .take(4 * MAX_READS)
        .collect()
}

/// Reads the shared pool under `root` from `containers` ([`candidates`]),
/// at most [`MAX_READS`] of them. `None` when no cpuset could be read: then
/// nothing narrows capacity.
pub fn read_paths(root: &Path, containers: Vec<PathBuf>) -> Option<SharedPool> {
    from_sets(containers, |rel| cpuset::read_cpus(root, rel))
}

/// [`read_paths`] over the snapshot's [`candidates`].
pub fn read(root: &Path, snap: &NodeSnapshot) -> Option<SharedPool> {
    read_paths(root, candidates(snap))
}

/// [`read_paths`] over any source of CPU sets (`read_set` gets a
/// container path relative to the root), for tests. Sets that share no CPU
/// (never seen: every container holds the pool) give no pool either.
pub fn from_sets<I, F>(containers: I, mut read_set: F) -> Option<SharedPool>
where
    I: IntoIterator<Item = PathBuf>,
    F: FnMut(&Path) -> Result<BTreeSet<u32>, CgroupError>,
{
    let mut common: Option<BTreeSet<u32>> = None;
    let mut read = 0;
    let mut skipped = Vec::new();
    for rel in containers {
        if read >= MAX_READS {
            break;
        }
        match read_set(&rel) {
            Ok(set) => {
                common = Some(match common {
                    None => set,
                    Some(c) => c.intersection(&set).copied().collect(),
                });
                read += 1;
            }
            Err(error) => skipped.push(Skip {
                path: rel,
                why: error.to_string(),
                error,
            }),
        }
    }
    let common = common.filter(|c| !c.is_empty())?;
    Some(SharedPool {
        cpus: common.len() as u64,
        list: cpuset::format_cpu_list(&common),
        read,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's text, or `None` for a file the agent may not read.
    type Files = &'static [(&'static str, Option<&'static str>)];

    fn files(map: Files) -> impl FnMut(&Path) -> Result<BTreeSet<u32>, CgroupError> {
        move |p: &Path| {
            let (_, r) = map
                .iter()
                .find(|(k, _)| Path::new(k) == p)
                .expect("known path");
            match r {
                Some(text) => cpuset::parse_cpus(p, text.as_bytes()),
                None => Err(CgroupError::PermissionDenied {
                    path: p.to_path_buf(),
                    source: crate::cgroup::IoError(std::sync::Arc::new(
                        std::io::ErrorKind::PermissionDenied.into(),
                    )),
                }),
            }
        }
    }

    #[test]
    fn the_pool_is_the_intersection_of_the_containers_cpusets_and_bad_ones_are_skipped() {
        let paths = ["a", "b", "c", "d"].map(PathBuf::from);
        let pool = from_sets(
            paths,
            files(&[
                ("a", Some("0-1\n")),
                ("b", Some("garbage\n")),
                ("c", None),
                ("d", Some("0,1\n")),
            ]),
        )
        .expect("two read");
        assert_eq!(pool.cpus, 2);
        assert_eq!(pool.list, "0-1");
        assert_eq!(pool.read, 2);
        assert_eq!(pool.skipped.len(), 2);
        assert!(matches!(
            pool.skipped[0].error,
            CgroupError::Malformed { .. }
        ));
        assert!(pool.skipped[0].why.contains("not a CPU number"), "{pool:?}");
        assert!(pool.skipped[1].error.is_permission_denied());
        assert_eq!(pool.skipped[1].path, PathBuf::from("c"));
    }

    #[test]
    fn a_pause_container_with_the_whole_node_does_not_widen_the_pool() {
        let paths = ["pause", "app"].map(PathBuf::from);
        let pool = from_sets(
            paths,
            files(&[("pause", Some("0-2\n")), ("app", Some("0\n"))]),
        )
        .unwrap();
        assert_eq!((pool.cpus, pool.list.as_str(), pool.read), (1, "0", 2));
        // Sets with nothing in common: no pool (capacity not narrowed to 0).
        let paths = ["a", "b"].map(PathBuf::from);
        assert_eq!(
            from_sets(paths, files(&[("a", Some("0\n")), ("b", Some("1\n"))])),
            None
        );
    }

    #[test]
    fn nothing_readable_is_no_pool() {
        assert_eq!(from_sets(Vec::<PathBuf>::new(), |_| unreachable!()), None);
        assert_eq!(
            from_sets([PathBuf::from("a")], files(&[("a", Some("3-1"))])),
            None
        );
    }

    #[test]
    fn at_most_max_reads_files_are_read() {
        let mut n = 0;
        let pool = from_sets((0..100).map(|i| PathBuf::from(i.to_string())), |_| {
            n += 1;
            Ok((0..4).collect())
        })
        .unwrap();
        assert_eq!((n, pool.read, pool.cpus), (MAX_READS, MAX_READS, 4));
    }

    fn write(dir: &Path, file: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
    }

    fn cgroup(dir: &Path, cpu_max: &str, cpuset: Option<&str>) {
        write(dir, "cpu.max", &format!("{cpu_max}\n"));
        write(
            dir,
            "cpu.stat",
            "usage_usec 0\nuser_usec 0\nsystem_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
        );
        if let Some(c) = cpuset {
            write(dir, "cpuset.cpus.effective", &format!("{c}\n"));
        }
    }

    const B_UID: &str = "11111111-2222-3333-4444-555555555555";
    const G_UID: &str = "66666666-7777-8888-9999-000000000000";
    const APP: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const APP2: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    const EXCL: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    /// A cgroupfs tree as the static CPU manager leaves it on a 4-CPU node:
    /// kubepods and the QoS cgroups span 0-3; the Guaranteed pod's container
    /// holds CPU 3 alone; the Burstable pod's containers the shared 0-2
    /// (`bad` replaces the second one's cpuset).
    fn static_tree(bad: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        write(root, "cgroup.controllers", "cpuset cpu io memory pids\n");
        write(root, "cpuset.cpus.effective", "0-3\n");
        let kp = root.join("kubepods");
        write(&kp, "cgroup.controllers", "cpuset cpu io memory pids\n");
        cgroup(&kp, "max 100000", Some("0-3"));
        cgroup(&kp.join("burstable"), "max 100000", Some("0-3"));
        cgroup(&kp.join("besteffort"), "max 100000", Some("0-3"));
        let bp = kp.join(format!("burstable/pod{B_UID}"));
        cgroup(&bp, "80000 100000", Some("0-3"));
        cgroup(&bp.join(APP), "80000 100000", Some("0-2"));
        cgroup(&bp.join(APP2), "80000 100000", Some(bad));
        let gp = kp.join(format!("pod{G_UID}"));
        cgroup(&gp, "100000 100000", Some("0-3"));
        cgroup(&gp.join(EXCL), "100000 100000", Some("3"));
        t
    }

    #[test]
    fn the_pool_of_a_static_cpu_manager_tree_leaves_out_exclusive_cpus() {
        let t = static_tree("0-2");
        let layout = crate::cgroup::discover(t.path()).unwrap();
        let snap = crate::cgroup::scan(t.path(), &layout, 0).unwrap();
        let pool = read(t.path(), &snap).expect("pool");
        assert_eq!(
            (pool.cpus, pool.list.as_str(), pool.read),
            (2 + 1, "0-2", 2)
        );
        assert!(pool.skipped.is_empty(), "{pool:?}");
        // Capacity follows it: allocatable 3500m, 4 CPUs online, pool of 3.
        let cap = crate::signal::usage::CapacityInputs {
            node_allocatable_m: Some(3500),
            online_cpus: crate::signal::usage::online_cpus_at(t.path()),
            shared_pool_cpus: Some(pool.cpus),
        };
        assert_eq!(
            crate::signal::usage::capacity(&snap.kubepods, cap),
            (3000, crate::signal::usage::CapacitySource::SharedPool)
        );
    }

    #[test]
    fn a_malformed_cpuset_in_a_tree_is_skipped_and_said() {
        for bad in ["", "0-2,x", "2-0", "\u{1}\u{2}", "0-9000"] {
            let t = static_tree(bad);
            let layout = crate::cgroup::discover(t.path()).unwrap();
            let snap = crate::cgroup::scan(t.path(), &layout, 0).unwrap();
            let pool = read(t.path(), &snap).expect("the good container still counts");
            assert_eq!(pool.list, "0-2", "{bad:?}");
            assert_eq!(pool.skipped.len(), 1, "{bad:?}: {pool:?}");
            let s = &pool.skipped[0];
            assert!(
                matches!(s.error, CgroupError::Malformed { .. }),
                "{bad:?}: {s:?}"
            );
            assert!(s.path.ends_with(APP2), "{s:?}");
            assert!(s.why.contains("cpuset.cpus.effective: malformed"), "{s:?}");
        }
        // A container gone since the scan is churn, said as such.
        let t = static_tree("0-2");
        let layout = crate::cgroup::discover(t.path()).unwrap();
        let snap = crate::cgroup::scan(t.path(), &layout, 0).unwrap();
        std::fs::remove_file(t.path().join(format!(
            "kubepods/burstable/pod{B_UID}/{APP2}/cpuset.cpus.effective"
        )))
        .unwrap();
        let pool = read(t.path(), &snap).unwrap();
        assert!(
            matches!(pool.skipped[0].error, CgroupError::Vanished(_)),
            "{pool:?}"
        );
    }
}
