//! Writes the simulated cgroupfs. Counter files (`cpu.stat`, `cpu.pressure`) are
//! always replaced by rename (staged outside the tree, so, as with the kernel's
//! counters, a watch on the cgroup directory sees no `IN_CREATE`/`IN_MODIFY`),
//! so a reader never sees half a file. `cpu.max` and
//! `cpu.weight` follow [`WriteMode`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

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

/// A directory outside every simulated tree to stage files in (per process),
/// removed when the process exits (a static is never dropped: 226 of them
/// were left in /tmp by a day's test runs).
fn staging() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("headroom-sim-staging-{}", std::process::id()));
        std::fs::create_dir_all(&d).ok()?;
        crate::process::kill_at_exit(vec![], Some(d.clone()));
        Some(d)
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
    if COUNTERS.contains(&name) && twin_of(dir).is_some() {
        return Ok(()); // the kernel's own (see `KernelCounters`)
    }
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
    if let Some(twin) = twin_of(dir) {
        return bind_twin(dir, &twin);
    }
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

/// The counter files: the kernel's under a [`KernelCounters`] root.
const COUNTERS: [&str; 2] = ["cpu.stat", "cpu.pressure"];

/// Simulated roots whose counters are the kernel's: (root, cgroup2 base).
static TWINS: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

/// The real cgroup standing in for the simulated cgroup `dir`, if its
/// root is a [`KernelCounters`] root.
fn twin_of(dir: &Path) -> Option<PathBuf> {
    let twins = TWINS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    twins
        .iter()
        .find_map(|(root, base)| dir.strip_prefix(root).ok().map(|rel| base.join(rel)))
}

fn cstr(p: &Path) -> std::io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Makes the cgroup `twin` (real) and bind-mounts its counter files over
/// `dir`'s (simulated): a reader of `dir/cpu.stat` reads the kernel's.
fn bind_twin(dir: &Path, twin: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(twin) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    for name in COUNTERS {
        bind_file(&twin.join(name), &dir.join(name))?;
    }
    Ok(())
}

/// Bind-mounts the file `src` over `dst` (made empty first, so it exists).
fn bind_file(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::write(dst, "")?;
    let (src, dst) = (cstr(src)?, cstr(dst)?);
    // SAFETY: NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts every mount at or below `dir` (lazily: a reader may hold one open).
fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    points.sort_unstable_by_key(|m| std::cmp::Reverse(m.len()));
    for m in points {
        if let Ok(c) = cstr(Path::new(m)) {
            // SAFETY: as above.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Removes the cgroup tree at `dir` bottom-up (a cgroup is removed by
/// rmdir once it has no children; its files go with it).
pub fn rmdir_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The footprint bench on real cgroup2 counters: every cgroup the
/// simulator makes under `root` gets a twin cgroup under `base` (a
/// directory made in a cgroup2 mount), whose `cpu.stat` and
/// `cpu.pressure` (the kernel's) are bind-mounted over the simulated ones;
/// the simulator writes no counters there, and `cpu.max`, `cpu.weight`
/// stay its own files (a mount without the cpu controller has none). The
/// root's own `cpu.stat` is `base`'s. Dropping this unmounts everything
/// below `root` and removes every twin (rmdir, bottom-up), also on a panic.
pub struct KernelCounters {
    root: PathBuf,
    base: PathBuf,
}

impl KernelCounters {
    /// Registers `root` (made if missing) with its twins under `base`
    /// (made; must not exist).
    pub fn new(root: &Path, base: &Path) -> std::io::Result<KernelCounters> {
        std::fs::create_dir(base)?;
        let kc = KernelCounters {
            root: root.to_path_buf(),
            base: base.to_path_buf(),
        };
        std::fs::create_dir_all(root)?;
        TWINS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((kc.root.clone(), kc.base.clone()));
        bind_file(&base.join("cpu.stat"), &root.join("cpu.stat"))?;
        Ok(kc)
    }
}

impl Drop for KernelCounters {
    fn drop(&mut self) {
        TWINS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|(r, _)| r != &self.root);
        unmount_below(&self.root);
        rmdir_tree(&self.base);
    }
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
    if let Some(twin) = twin_of(dir) {
        unmount_below(dir);
        let r = std::fs::remove_dir_all(dir);
        rmdir_tree(&twin);
        return match r {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        };
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under a `KernelCounters` root a cgroup's counters are the kernel's
    /// (a real cgroup's, bind-mounted), not written by the simulator; its
    /// removal and the guard's drop leave no mount and no cgroup behind.
    /// Skipped without a writable cgroup2 mount.
    #[test]
    fn kernel_counters_are_the_kernels_and_leave_nothing_behind() {
        let Some(base) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .map(Path::new)
            .find(|p| headroom::cgroup::read::is_cgroup2(p))
        else {
            eprintln!("no cgroup2 mount: skipped");
            return;
        };
        let t = tempfile::tempdir().expect("tempdir");
        let root = t.path().join("root");
        let base = base.join(format!("headroom-sim-test-{}", std::process::id()));
        let kc = match KernelCounters::new(&root, &base) {
            Ok(kc) => kc,
            Err(e) => {
                eprintln!("cannot make real cgroups or bind mounts here ({e}): skipped");
                return;
            }
        };
        let pod = root.join("kubepods").join("podx");
        ensure_cgroup(&root.join("kubepods"), "max 100000", 100, WriteMode::Rename).expect("kp");
        ensure_cgroup(&pod, "max 100000", 100, WriteMode::Rename).expect("pod");
        write_atomic(&pod, "cpu.stat", "usage_usec 42\n").expect("a no-op");
        let stat = std::fs::read_to_string(pod.join("cpu.stat")).expect("read");
        assert!(stat.starts_with("usage_usec 0\n"), "{stat:?}");
        assert!(base.join("kubepods/podx").is_dir());
        assert_eq!(read_limit_m(&pod), None, "cpu.max stays the simulator's");
        remove_cgroup(&pod).expect("remove");
        assert!(!pod.exists() && !base.join("kubepods/podx").exists());
        drop(kc);
        assert!(!base.exists(), "every real cgroup removed");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(!mounts.contains(root.to_str().unwrap()), "no mount left");
    }

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
