//! Writes the simulated cgroupfs. Counter files (`cpu.stat`, `cpu.pressure`) are
//! always replaced by rename (staged outside the tree, so, as with the kernel's
//! counters, a watch on the cgroup directory sees no `IN_CREATE`/`IN_MODIFY`),
//! so a reader never sees half a file. `cpu.max` and
//! `cpu.weight` follow [`WriteMode`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// How the simulator writes `cpu.max` and `cpu.weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Temp file + rename: readers see the old or the new content, never a mix
    /// (the kernel's guarantee). Inotify watches on the file itself do not survive
    /// the replacement; a watch on the directory sees `IN_MOVED_TO`.
    #[default]
    Rename,
    /// Truncate + one `write(2)` in place, as the kubelet does on a real cgroupfs:
    /// raises `IN_MODIFY` on the file, but a reader can catch it empty in between.
    InPlace,
}

const CONTROLLERS: &str = "cpuset cpu io memory hugetlb pids rdma misc\n";

/// A directory outside every simulated tree to stage files in (per process).
fn staging() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("headroom-sim-staging-{}", std::process::id()));
        std::fs::create_dir_all(&d).ok().map(|_| d)
    })
    .as_deref()
}

/// Replaces `dir/name` by rename. The temp file is staged outside the tree
/// when it can be: the kernel's counters change without any inotify event in
/// the cgroup directory, and a temp file created there would raise
/// `IN_CREATE`/`IN_MODIFY` that a real node never shows. Falls back to a
/// dot-file in `dir` when the staging area is on another filesystem.
pub fn write_atomic(dir: &Path, name: &str, content: &str) -> std::io::Result<()> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dest = dir.join(name);
    if let Some(st) = staging() {
        let tmp = st.join(format!("{name}.{}", N.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&tmp, content)?;
        match std::fs::rename(&tmp, &dest) {
            Ok(()) => return Ok(()),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                if e.raw_os_error() != Some(EXDEV) {
                    return Err(e);
                }
            }
        }
    }
    let tmp = dir.join(format!(".{name}.sim-tmp"));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, dest)
}

/// `rename(2)` across filesystems.
const EXDEV: i32 = 18;

/// Writes a kubelet-written file (`cpu.max`, `cpu.weight`).
pub fn write_setting(
    dir: &Path,
    name: &str,
    content: &str,
    mode: WriteMode,
) -> std::io::Result<()> {
    match mode {
        WriteMode::Rename => write_atomic(dir, name, content),
        WriteMode::InPlace => {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.join(name))?;
            f.write_all(content.as_bytes())
        }
    }
}

/// Creates a cgroup directory with the interface files every cgroup has, if missing.
/// `cpu_max` and `weight` are written only when the cgroup is new.
pub fn ensure_cgroup(
    dir: &Path,
    cpu_max: &str,
    weight: u64,
    mode: WriteMode,
) -> std::io::Result<()> {
    if dir.join("cgroup.controllers").exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    write_atomic(dir, "cgroup.controllers", CONTROLLERS)?;
    write_atomic(dir, "cgroup.subtree_control", "cpu memory pids\n")?;
    write_atomic(dir, "cgroup.procs", "")?;
    write_setting(dir, "cpu.max", &format!("{cpu_max}\n"), mode)?;
    write_setting(dir, "cpu.weight", &format!("{weight}\n"), mode)?;
    write_atomic(
        dir,
        "cpu.stat",
        &super::load::CgroupCounters::default().cpu_stat(),
    )?;
    write_atomic(
        dir,
        "cpu.pressure",
        &super::load::CgroupCounters::default().cpu_pressure(),
    )
}

/// Reads a file the simulator wrote, but only if it is still a regular file:
/// tests replace files with FIFOs to attack the agent, and a blocking read
/// here would hang the simulator (and the test waiting for it to stop). The
/// agent's hardened reader (no symlinks, non-blocking open, regular files,
/// size cap) is exactly that: plain file I/O, no cgroup semantics shared.
pub fn read_regular(path: &Path) -> Option<String> {
    headroom::cgroup::read::read(path)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
}

/// Reads `cpu.max` the way the kernel enforces it: None for `max`, a missing file
/// or content it would not have accepted.
pub fn read_limit_m(dir: &Path) -> Option<f64> {
    let text = read_regular(&dir.join("cpu.max"))?;
    let mut it = text.split_whitespace();
    let quota: f64 = it.next()?.parse().ok()?;
    let period: f64 = it.next()?.parse().ok()?;
    (period > 0.0).then(|| quota * 1000.0 / period)
}

/// Removes a cgroup directory tree (the kernel needs rmdir bottom-up; here the
/// files are plain files, so remove_dir_all is the equivalent).
pub fn remove_cgroup(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_writes_interface_files_once() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("a/b");
        ensure_cgroup(&dir, "max 100000", 39, WriteMode::Rename).expect("ensure");
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.max")).expect("read"),
            "max 100000\n"
        );
        assert_eq!(read_limit_m(&dir), None);
        write_setting(&dir, "cpu.max", "50000 100000\n", WriteMode::InPlace).expect("write");
        ensure_cgroup(&dir, "max 100000", 39, WriteMode::Rename).expect("ensure again");
        assert_eq!(read_limit_m(&dir), Some(500.0));
        assert!(
            std::fs::read_to_string(dir.join("cgroup.controllers"))
                .expect("c")
                .contains("cpu ")
        );
        remove_cgroup(&dir).expect("rm");
        remove_cgroup(&dir).expect("rm twice");
        assert!(!dir.exists());
    }
}
