//! Child processes that cannot outlive the test binary.
//!
//! Every child is forked from one dedicated, never-ending std thread with
//! `prctl(PR_SET_PDEATHSIG, SIGKILL)`. The kernel delivers that signal when
//! the *thread* that forked the child exits, which is why the fork must not
//! happen on a tokio worker or a libtest thread (both end long before the
//! process). The spawner thread ends only with the process, so a SIGKILL,
//! SIGTERM, Ctrl-C, panic or normal exit of the test binary all kill the
//! children. [`kill_at_exit`] adds an `atexit` hook for the orderly path so
//! that temp dirs can be removed after their processes are gone.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Mutex, Once, OnceLock};

type Request = (Command, Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = channel::<Request>();
        std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                // The Sender lives in a static, so recv() never fails: this
                // thread lives as long as the process.
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(spawn_with_pdeathsig(&mut cmd));
                }
            })
            .expect("cannot start the testkit spawner thread");
        Mutex::new(tx)
    })
}

fn spawn_with_pdeathsig(cmd: &mut Command) -> io::Result<Child> {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and only calls
    // async-signal-safe functions (prctl, getppid, _exit); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Spawns `cmd` so that it is SIGKILLed when this process dies, however it dies.
pub fn spawn_guarded(cmd: Command) -> io::Result<Child> {
    let (tx, rx) = channel();
    spawner()
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .send((cmd, tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("spawner thread dropped the request"))?
}

struct ExitCleanup {
    pids: Vec<u32>,
    dir: Option<PathBuf>,
}

fn exit_registry() -> &'static Mutex<Vec<ExitCleanup>> {
    static REG: OnceLock<Mutex<Vec<ExitCleanup>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Vec::new()))
}

extern "C" fn run_exit_cleanup() {
    // try_lock: never block process exit on a lock held by a dying thread.
    let Ok(mut reg) = exit_registry().try_lock() else {
        return;
    };
    for entry in reg.drain(..) {
        for pid in &entry.pids {
            let Ok(pid) = libc::pid_t::try_from(*pid) else {
                continue;
            };
            // SAFETY: plain syscalls on pids this process spawned and still
            // owns (unreaped children cannot be recycled).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        if let Some(dir) = entry.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// At normal process exit (including libtest's exit after a failed test),
/// SIGKILL and reap `pids`, then remove `dir`. For objects that live in
/// statics and are never dropped.
pub fn kill_at_exit(pids: Vec<u32>, dir: Option<PathBuf>) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registering a plain extern "C" fn.
        unsafe {
            libc::atexit(run_exit_cleanup);
        }
    });
    if let Ok(mut reg) = exit_registry().lock() {
        reg.push(ExitCleanup { pids, dir });
    }
}

/// True when `pid` no longer runs a program whose command line contains
/// `needle` (gone, a zombie, or the pid was reused by something else).
pub fn process_gone(pid: u32, needle: &str) -> bool {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(_) => return true,
    };
    // State is the field after the parenthesised comm, which may hold spaces.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    if matches!(state, Some("Z") | Some("X")) {
        return true;
    }
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmdline) => !String::from_utf8_lossy(&cmdline).contains(needle),
        Err(_) => true,
    }
}
