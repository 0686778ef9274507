//! Opening and reading one cgroup interface file, defensively.
//!
//! cgroupfs files are small regular files the kernel fills on read. Anything
//! else in their place (a symlink to `/dev/zero`, a FIFO, a huge file in a
//! fixture or bind mount) must cost one failed read, never the agent:
//! - `O_NOFOLLOW`: a symlink is refused (ELOOP), not followed;
//! - `O_NONBLOCK`: opening a FIFO never waits for a writer;
//! - `fstat` after the open: only a regular file is read at all;
//! - the read stops past [`MAX_FILE`] bytes.
//!
//! One `read` per file: cgroupfs generates a file whole on the first read
//! of offset 0, so a read that does not fill the buffer is the end (no
//! second `read` to see EOF). A file that fills the buffer is read on into a
//! bigger one, up to the cap.
//!
//! [`Handles`] keeps the hot files open and re-reads them with `pread` at
//! offset 0 (kernfs regenerates a seq_file read from offset 0), so a file
//! read every tick costs one syscall instead of four (`openat`, `fstat`,
//! `read`, `close`). Only files on a real cgroup2 mount: anywhere else a
//! file may be replaced by rename (the simulated kubelet and fixtures do),
//! and an open handle would keep reading the old one. Under a root that is
//! cgroupfs every file is; under any other root each file is asked once
//! (`fstatfs` of its first open), so a kernel cgroup file bind-mounted into
//! a tree on another filesystem (the footprint bench's) is kept open too.

use foldhash::HashMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use nix::libc;

/// No cgroup v2 CPU interface file comes near this (`cpu.stat` is < 1 KiB).
pub const MAX_FILE: usize = 64 * 1024;

/// Why one file (or directory) could not be read. Keeps the real
/// `io::Error` where there is one.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// ENOENT, or ENODEV (the cgroup was removed while open).
    #[error("not found")]
    NotFound(#[source] io::Error),
    #[error("permission denied")]
    PermissionDenied(#[source] io::Error),
    #[error("is a symlink; not followed")]
    Symlink,
    /// What it is instead ("a FIFO", "a character device", …).
    #[error("is {0}, not a regular file; not read")]
    NotRegular(&'static str),
    #[error("larger than {MAX_FILE} bytes; not read")]
    TooLarge,
    #[error(transparent)]
    Io(io::Error),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENODEV) => ReadError::NotFound(e),
            Some(libc::EACCES | libc::EPERM) => ReadError::PermissionDenied(e),
            Some(libc::ELOOP) => ReadError::Symlink,
            _ if e.kind() == ErrorKind::NotFound => ReadError::NotFound(e),
            _ if e.kind() == ErrorKind::PermissionDenied => ReadError::PermissionDenied(e),
            _ => ReadError::Io(e),
        }
    }
}

/// A reusable read buffer: `bytes()` is the last file read.
#[derive(Default)]
pub struct Buf {
    data: Vec<u8>,
    len: usize,
}

impl Buf {
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

fn file_kind(mode: libc::mode_t) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFCHR => Some("a character device"),
        libc::S_IFBLK => Some("a block device"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFLNK => Some("a symlink"),
        _ => Some("a special file"),
    }
}

/// Opens `path` for reading if it is a regular file (not through a symlink,
/// never blocking on a FIFO).
pub fn open(path: &Path) -> Result<File, ReadError> {
    #[cfg(test)]
    seam::check(path)?;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let st = nix::sys::stat::fstat(&f).map_err(|e| ReadError::Io(e.into()))?;
    match file_kind(st.st_mode) {
        None => Ok(f),
        Some(k) => Err(ReadError::NotRegular(k)),
    }
}

/// Reads the regular file at `path` into `b` (at most [`MAX_FILE`] bytes).
pub fn read_into(path: &Path, b: &mut Buf) -> Result<(), ReadError> {
    let mut f = open(path)?;
    fill(b, |buf, _| f.read(buf))
}

/// Reads a whole file into `b` with `read_at(buf, offset)`: one call when
/// the file fits the buffer (a short read is the end), more only for a file
/// that fills it.
fn fill(
    b: &mut Buf,
    mut read_at: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
) -> Result<(), ReadError> {
    b.len = 0;
    if b.data.len() < 4096 {
        b.data.resize(4096, 0);
    }
    loop {
        if b.len == b.data.len() {
            if b.len > MAX_FILE {
                return Err(ReadError::TooLarge);
            }
            // One byte past the cap tells "exactly MAX_FILE" from "more".
            b.data.resize((b.len * 2).min(MAX_FILE + 1), 0);
        }
        match read_at(&mut b.data[b.len..], b.len as u64) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                b.len += n;
                if b.len < b.data.len() {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Open handles of the files read every tick, re-read with `pread` at
/// offset 0 (see the module doc). Keeps at most `cap` files open; a handle
/// not used for [`Handles::IDLE_SWEEPS`] sweeps is closed, and one whose
/// read fails is closed and the file read afresh once (a cgroup removed and
/// made again under the same path reads as the new one).
///
/// Two kinds of read: *hot* ([`Self::read_into`]: a light tick's files,
/// read every tick) and *cold* ([`Self::read_cold`]: the audit's full scan
/// and a pod's full read, every 30 s or so). A cold file is kept only while
/// there is room, and a hot file that finds none takes a cold one's slot:
/// the audit's files save their opens where the budget allows (at 250
/// pods, ~1,880 files every 30 s) but never crowd out the files read every
/// tick (at 500 pods and a budget of 512 they had taken 444 of its slots).
#[derive(Debug, Default)]
pub struct Handles {
    /// Keyed by the path's bytes: hashing and comparing a `Path` walks its
    /// components, and this map is asked once per file read.
    open: HashMap<OsString, Kept>,
    /// How many of `open` only cold reads used (a hot one may take their slot).
    cold: usize,
    /// Under a root that is not cgroupfs: the files found (by `fstatfs`)
    /// not to be on cgroup2, never kept, with their unused sweeps.
    elsewhere: HashMap<OsString, u32>,
    /// Whether only files on cgroup2 are kept (the root is not cgroupfs).
    only_cgroup2: bool,
    cap: usize,
    /// Reads served by an open handle, and by open + read + close.
    pub kept_reads: u64,
    pub opened_reads: u64,
}

#[derive(Debug)]
struct Kept {
    file: File,
    /// Sweeps since its last read.
    idle: u32,
    /// Read by a hot read at least once since it was opened.
    hot: bool,
}

impl Handles {
    /// Sweeps a handle may go unused before it is closed.
    pub const IDLE_SWEEPS: u32 = 60;

    /// No handle kept: every read opens and closes its file.
    pub fn none() -> Self {
        Self::default()
    }

    /// Keeps up to `cap` files open whatever the filesystem (benches and
    /// tests of files nobody replaces).
    pub fn keeping(cap: usize) -> Self {
        Handles {
            cap,
            ..Self::default()
        }
    }

    /// Keeps files open when `root` is a cgroup2 mount, up to half the
    /// soft fd limit (at most 4096); else keeps only the files that are on
    /// cgroup2 all the same (bind-mounted kernel files).
    pub fn for_root(root: &Path) -> Self {
        if is_cgroup2(root) {
            Self::keeping(fd_budget())
        } else {
            Self::cgroup2_files(fd_budget())
        }
    }

    /// Keeps up to `cap` files open, only those on cgroup2 (asked once per
    /// path, by `fstatfs` of its first open).
    pub fn cgroup2_files(cap: usize) -> Self {
        Handles {
            cap,
            only_cgroup2: true,
            ..Self::default()
        }
    }

    /// Whether every file is kept open (the root is cgroupfs, or a bench
    /// asked); [`Self::cgroup2_files`] keeps only some.
    pub fn keeps(&self) -> bool {
        self.cap > 0 && !self.only_cgroup2
    }

    /// Files open now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Files open now that only cold reads used.
    pub fn cold_len(&self) -> usize {
        self.cold
    }

    /// A hot read of `path` into `b` (a file read every tick), through its
    /// open handle if it has one, else opening it and keeping it: in a free
    /// slot, or in a cold file's.
    pub fn read_into(&mut self, path: &Path, b: &mut Buf) -> Result<(), ReadError> {
        self.read(path, b, true)
    }

    /// A cold read of `path` into `b` (a file read once in a while): as
    /// [`Self::read_into`], but kept only in a free slot.
    pub fn read_cold(&mut self, path: &Path, b: &mut Buf) -> Result<(), ReadError> {
        self.read(path, b, false)
    }

    fn read(&mut self, path: &Path, b: &mut Buf, hot: bool) -> Result<(), ReadError> {
        if self.cap == 0 {
            self.opened_reads += 1;
            return read_into(path, b);
        }
        if let Some(k) = self.open.get_mut(path.as_os_str()) {
            k.idle = 0;
            if hot && !k.hot {
                k.hot = true;
                self.cold -= 1;
            }
            match fill(b, |buf, off| k.file.read_at(buf, off)) {
                Ok(()) => {
                    self.kept_reads += 1;
                    return Ok(());
                }
                Err(_) => {
                    self.close(path);
                }
            }
        }
        if let Some(idle) = self.elsewhere.get_mut(path.as_os_str()) {
            *idle = 0;
            self.opened_reads += 1;
            return read_into(path, b);
        }
        self.opened_reads += 1;
        let f = open(path)?;
        fill(b, |buf, off| f.read_at(buf, off))?;
        if self.only_cgroup2 && !fd_is_cgroup2(&f) {
            self.elsewhere.insert(path.as_os_str().to_owned(), 0);
            return Ok(());
        }
        if self.open.len() >= self.cap && hot && self.cold > 0 {
            self.close_one_cold();
        }
        if self.open.len() < self.cap {
            let kept = Kept {
                file: f,
                idle: 0,
                hot,
            };
            self.open.insert(path.as_os_str().to_owned(), kept);
            self.cold += usize::from(!hot);
        }
        Ok(())
    }

    /// Closes one handle only cold reads used (any one: each is read as
    /// seldom as the others).
    fn close_one_cold(&mut self) {
        let mut left = 1;
        self.open.retain(|_, k| {
            let close = left > 0 && !k.hot;
            left -= usize::from(close);
            !close
        });
        self.cold -= 1 - left;
    }

    fn close(&mut self, path: &Path) {
        if let Some(k) = self.open.remove(path.as_os_str()) {
            self.cold -= usize::from(!k.hot);
        }
    }

    /// Closes the handle of `path`, if kept: its next read opens the path again.
    pub fn forget(&mut self, path: &Path) {
        self.close(path);
        self.elsewhere.remove(path.as_os_str());
    }

    /// Closes the handles unused for [`Self::IDLE_SWEEPS`] sweeps (call once a tick).
    pub fn sweep(&mut self) {
        let mut closed_cold = 0;
        self.open.retain(|_, k| {
            k.idle += 1;
            let keep = k.idle < Self::IDLE_SWEEPS;
            closed_cold += usize::from(!keep && !k.hot);
            keep
        });
        self.cold -= closed_cold;
        self.elsewhere.retain(|_, idle| {
            *idle += 1;
            *idle < Self::IDLE_SWEEPS
        });
    }

    /// Closes every handle.
    pub fn clear(&mut self) {
        self.open.clear();
        self.cold = 0;
        self.elsewhere.clear();
    }
}

/// Whether `path` is on a cgroup2 filesystem.
pub fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// Whether the open file `f` is on a cgroup2 filesystem.
fn fd_is_cgroup2(f: &File) -> bool {
    nix::sys::statfs::fstatfs(f)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as long-running
/// daemons do: containerd 2.x starts containers at a soft limit of 1,024
/// (hard 524,288), which would leave the kept handles 512 slots.
/// Returns (soft before, soft after); an error leaves the limit as it was.
pub fn raise_fd_limit() -> nix::Result<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok((soft, getrlimit(Resource::RLIMIT_NOFILE)?.0))
}

/// Half the soft `RLIMIT_NOFILE`, at most 4096 (the rest stays for sockets
/// and one-off reads); 512 when it cannot be read.
pub fn fd_budget() -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    getrlimit(Resource::RLIMIT_NOFILE).map_or(512, |(soft, _)| {
        usize::try_from(soft / 2).unwrap_or(usize::MAX).min(4096)
    })
}

/// [`read_into`] with a buffer of its own, for one-off reads.
pub fn read(path: &Path) -> Result<Vec<u8>, ReadError> {
    let mut b = Buf::default();
    read_into(path, &mut b)?;
    b.data.truncate(b.len);
    Ok(b.data)
}

/// Lists a directory (the seam tests use to simulate EACCES as root).
pub fn list_dir(path: &Path) -> Result<std::fs::ReadDir, ReadError> {
    #[cfg(test)]
    seam::check(path)?;
    Ok(std::fs::read_dir(path)?)
}

/// Whether `path` exists as a regular file (`lstat`): `Ok(false)` when it
/// does not exist, an error when it is something else or cannot be told
/// (EACCES on the directory).
pub fn is_file(path: &Path) -> Result<bool, ReadError> {
    use std::os::unix::fs::MetadataExt;
    #[cfg(test)]
    seam::check(path)?;
    match std::fs::symlink_metadata(path) {
        Ok(m) => match file_kind(m.mode()) {
            None => Ok(true),
            Some(k) => Err(ReadError::NotRegular(k)),
        },
        Err(e) => match ReadError::from(e) {
            ReadError::NotFound(_) => Ok(false),
            e => Err(e),
        },
    }
}

/// Tests run as root, where `chmod 000` denies nothing: paths under a
/// denied prefix fail with a real EACCES `io::Error` instead.
#[cfg(test)]
pub mod seam {
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    thread_local! {
        static DENIED: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    }

    /// Denies `dir` and everything below it on this thread until the guard drops.
    pub fn deny(dir: &Path) -> Guard {
        DENIED.with(|d| d.borrow_mut().push(dir.to_path_buf()));
        Guard
    }

    pub struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            DENIED.with(|d| d.borrow_mut().clear());
        }
    }

    pub(super) fn check(path: &Path) -> Result<(), super::ReadError> {
        let denied = DENIED.with(|d| d.borrow().iter().any(|p| path.starts_with(p)));
        if denied {
            return Err(std::io::Error::from_raw_os_error(nix::libc::EACCES).into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::file;
    use std::time::{Duration, Instant};

    #[test]
    fn symlink_to_dev_zero_is_refused_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(file::CPU_MAX);
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        assert!(
            matches!(read(&p), Err(ReadError::Symlink)),
            "{:?}",
            read(&p)
        );
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(file::CPU_MAX);
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let t0 = Instant::now();
        let r = read(&p);
        assert!(matches!(r, Err(ReadError::NotRegular("a FIFO"))), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn character_device_is_refused() {
        let r = read(Path::new("/dev/zero"));
        assert!(
            matches!(r, Err(ReadError::NotRegular("a character device"))),
            "{r:?}"
        );
    }

    #[test]
    fn reads_are_capped() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(file::CPU_MAX);
        std::fs::write(&p, vec![b'1'; MAX_FILE]).unwrap();
        assert_eq!(read(&p).unwrap().len(), MAX_FILE, "exactly the cap is read");
        std::fs::write(&p, vec![b'1'; 13 << 20]).unwrap();
        assert!(matches!(read(&p), Err(ReadError::TooLarge)));
    }

    #[test]
    fn errors_keep_their_io_error() {
        let t = tempfile::tempdir().unwrap();
        match read(&t.path().join("nope")) {
            Err(ReadError::NotFound(e)) => assert_eq!(e.kind(), ErrorKind::NotFound),
            r => panic!("{r:?}"),
        }
        let _g = seam::deny(t.path());
        match read(&t.path().join("nope")) {
            Err(ReadError::PermissionDenied(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EACCES))
            }
            r => panic!("{r:?}"),
        }
        assert!(matches!(
            list_dir(t.path()),
            Err(ReadError::PermissionDenied(_))
        ));
        assert!(matches!(
            is_file(&t.path().join("x")),
            Err(ReadError::PermissionDenied(_))
        ));
    }

    #[test]
    fn files_around_the_buffer_size_are_read_whole_either_way() {
        let t = tempfile::tempdir().unwrap();
        let mut kept = Handles::keeping(16);
        let mut b = Buf::default();
        for n in [0, 1, 4095, 4096, 4097, 8192, 20_000] {
            let p = t.path().join(format!("f{n}"));
            let body: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            std::fs::write(&p, &body).unwrap();
            assert_eq!(read(&p).unwrap(), body, "{n} bytes, open + read");
            for _ in 0..2 {
                kept.read_into(&p, &mut b).unwrap();
                assert_eq!(b.bytes(), &body[..], "{n} bytes, kept handle");
            }
        }
        assert_eq!((kept.opened_reads, kept.kept_reads), (7, 7));
    }

    /// A kept handle re-reads from offset 0: a file rewritten in place
    /// (shorter or longer) reads as its new content.
    #[test]
    fn a_kept_handle_rereads_the_whole_file() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(file::CPU_STAT);
        std::fs::write(&p, "usage_usec 100000\n").unwrap();
        let mut h = Handles::keeping(4);
        let mut b = Buf::default();
        h.read_into(&p, &mut b).unwrap();
        for body in ["usage_usec 7\n", "usage_usec 123456789\nnr_periods 1\n"] {
            let mut f = OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&p)
                .unwrap();
            std::io::Write::write_all(&mut f, body.as_bytes()).unwrap();
            h.read_into(&p, &mut b).unwrap();
            assert_eq!(b.bytes(), body.as_bytes());
        }
        assert_eq!((h.len(), h.opened_reads, h.kept_reads), (1, 1, 2));
    }

    /// `n` one-line files `f0`… under `dir`.
    fn small_files(dir: &Path, n: usize) -> Vec<std::path::PathBuf> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("f{i}"));
                std::fs::write(&p, "1\n").unwrap();
                p
            })
            .collect()
    }

    #[test]
    fn handles_are_capped_and_idle_ones_closed() {
        let t = tempfile::tempdir().unwrap();
        let files = small_files(t.path(), 5);
        let mut h = Handles::keeping(3);
        let mut b = Buf::default();
        for p in &files {
            h.read_into(p, &mut b).unwrap();
        }
        assert_eq!(h.len(), 3, "at most the cap");
        for _ in 0..Handles::IDLE_SWEEPS {
            h.read_into(&files[0], &mut b).unwrap();
            h.sweep();
        }
        assert_eq!(h.len(), 1, "only the file read every sweep stays open");
        assert!(!Handles::none().keeps());
        assert!(!is_cgroup2(t.path()), "a temp dir is not cgroupfs");
        assert!(!Handles::for_root(t.path()).keeps());
    }

    /// Cold reads keep a file only in a free slot; a hot read takes a cold
    /// file's slot, never a hot one's.
    #[test]
    fn a_hot_file_takes_a_cold_files_slot() {
        let t = tempfile::tempdir().unwrap();
        let f = small_files(t.path(), 7);
        let mut h = Handles::keeping(3);
        let mut b = Buf::default();
        for p in &f[..3] {
            h.read_cold(p, &mut b).unwrap();
        }
        assert_eq!((h.len(), h.cold_len()), (3, 3));
        h.read_cold(&f[3], &mut b).unwrap();
        assert_eq!((h.len(), h.cold_len()), (3, 3), "a cold read takes no slot");
        // Read hot, a kept cold file turns hot; a new hot file evicts one.
        h.read_into(&f[0], &mut b).unwrap();
        h.read_into(&f[4], &mut b).unwrap();
        h.read_into(&f[5], &mut b).unwrap();
        assert_eq!((h.len(), h.cold_len()), (3, 0));
        // Full of hot files: the next hot one is read, not kept.
        h.read_into(&f[6], &mut b).unwrap();
        assert_eq!((h.len(), h.cold_len()), (3, 0));
        let opened = h.opened_reads;
        for p in [&f[0], &f[4], &f[5]] {
            h.read_into(p, &mut b).unwrap();
        }
        assert_eq!(h.opened_reads, opened, "a hot file lost its handle");
        // Swept, forgotten or cleared, the cold count follows.
        h.clear();
        h.read_cold(&f[1], &mut b).unwrap();
        h.read_cold(&f[2], &mut b).unwrap();
        h.forget(&f[1]);
        assert_eq!(h.cold_len(), 1);
        for _ in 0..Handles::IDLE_SWEEPS {
            h.sweep();
        }
        assert_eq!((h.len(), h.cold_len()), (0, 0));
    }

    /// Symlinks, FIFOs and devices are refused through the kept-handle path
    /// too (the first read opens like any other), and nothing is kept.
    #[test]
    fn kept_handles_keep_the_hardened_open() {
        let t = tempfile::tempdir().unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let mut h = Handles::keeping(8);
        let mut b = Buf::default();
        assert!(matches!(
            h.read_into(&link, &mut b),
            Err(ReadError::Symlink)
        ));
        assert!(matches!(
            h.read_into(&fifo, &mut b),
            Err(ReadError::NotRegular("a FIFO"))
        ));
        assert!(matches!(
            h.read_into(Path::new("/dev/zero"), &mut b),
            Err(ReadError::NotRegular(_))
        ));
        let big = t.path().join("big");
        std::fs::write(&big, vec![b'1'; MAX_FILE + 1]).unwrap();
        assert!(matches!(
            h.read_into(&big, &mut b),
            Err(ReadError::TooLarge)
        ));
        assert!(h.is_empty());
    }

    /// Under a root that is not cgroupfs, only a file on cgroup2 is kept
    /// (here a kernel `cpu.stat` bind-mounted over a temp file; skipped
    /// without a writable cgroup2 mount); the others are asked once and
    /// read by open + read + close ever after.
    #[test]
    fn under_another_root_only_cgroup2_files_are_kept() {
        let t = tempfile::tempdir().unwrap();
        let plain = t.path().join("cpu.max");
        std::fs::write(&plain, "max 100000\n").unwrap();
        let mut h = Handles::for_root(t.path());
        assert!(!h.keeps());
        let mut b = Buf::default();
        for _ in 0..3 {
            h.read_into(&plain, &mut b).unwrap();
        }
        assert_eq!((h.len(), h.opened_reads, h.kept_reads), (0, 3, 0));
        std::fs::write(&plain, "50000 100000\n").unwrap();
        h.read_into(&plain, &mut b).unwrap();
        assert_eq!(
            b.bytes(),
            b"50000 100000\n",
            "not kept: reads what is there now"
        );
        let Some(base) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .map(Path::new)
            .find(|p| is_cgroup2(p))
        else {
            eprintln!("no cgroup2 mount: the bind-mounted half skipped");
            return;
        };
        let cg = base.join(format!("headroom-read-bind-{}", std::process::id()));
        if std::fs::create_dir(&cg).is_err() {
            eprintln!(
                "{} not writable: the bind-mounted half skipped",
                base.display()
            );
            return;
        }
        let stat = t.path().join(file::CPU_STAT);
        std::fs::write(&stat, "").unwrap();
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let (src, dst) = (c(&cg.join(file::CPU_STAT)), c(&stat));
        // SAFETY: both paths are NUL-terminated and outlive the calls.
        let bound = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if bound == 0 {
            h.read_into(&stat, &mut b).unwrap();
            h.read_into(&stat, &mut b).unwrap();
            assert!(b.bytes().starts_with(b"usage_usec "), "{:?}", b.bytes());
            assert_eq!((h.len(), h.kept_reads), (1, 1));
            h.clear();
            // SAFETY: as above.
            unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
        } else {
            eprintln!("bind mount refused: the bind-mounted half skipped");
        }
        std::fs::remove_dir(&cg).unwrap();
    }

    /// On a real cgroup2 mount (skipped where there is none to write): a
    /// kept handle of a removed cgroup reads as not found (ENODEV), so the
    /// scan calls it vanished, and the handle is closed.
    #[test]
    fn a_kept_handle_of_a_removed_cgroup_reads_as_not_found() {
        let Some(base) = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .iter()
            .map(Path::new)
            .find(|p| is_cgroup2(p))
        else {
            eprintln!("no cgroup2 mount: skipped");
            return;
        };
        let dir = base.join(format!("headroom-read-test-{}", std::process::id()));
        if std::fs::create_dir(&dir).is_err() {
            eprintln!("{} not writable: skipped", base.display());
            return;
        }
        let mut h = Handles::for_root(&dir);
        assert!(h.keeps());
        let mut b = Buf::default();
        let stat = dir.join(file::CPU_STAT);
        h.read_into(&stat, &mut b).unwrap();
        assert!(b.bytes().starts_with(b"usage_usec "), "{:?}", b.bytes());
        h.read_into(&stat, &mut b).unwrap();
        assert_eq!((h.len(), h.kept_reads), (1, 1));
        std::fs::remove_dir(&dir).unwrap();
        assert!(
            matches!(h.read_into(&stat, &mut b), Err(ReadError::NotFound(_))),
            "{:?}",
            h.read_into(&stat, &mut b)
        );
        assert!(h.is_empty());
    }
}
