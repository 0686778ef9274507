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
//! The reused-buffer fast path stays: one `openat`, one `fstat`, reads until
//! EOF, no `statx` size hint.

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
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
        match f.read(&mut b.data[b.len..]) {
            Ok(0) => return Ok(()),
            Ok(n) => b.len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
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
    use std::time::{Duration, Instant};

    #[test]
    fn symlink_to_dev_zero_is_refused_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("cpu.max");
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
        let p = t.path().join("cpu.max");
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
        let p = t.path().join("cpu.max");
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
}
