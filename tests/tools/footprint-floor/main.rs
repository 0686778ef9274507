//! The floor of the real-node footprint bench (tests/benches/footprint_vm.rs):
//! the files a calm agent tick reads — kubepods' `cpu.stat` and
//! `cpu.pressure`, and each managed pod's `cpu.stat` — read once a second
//! the cheapest way, and nothing else. Runs in the node VM as a process of
//! its own, so the bench measures it from `/proc/<pid>` exactly as it
//! measures the agent.
//!
//! ```text
//! footprint-floor kept|open KUBEPODS_DIR UID_FILE
//! ```
//!
//! - `kept`: each file opened once (`O_NOFOLLOW|O_NONBLOCK`, checked regular
//!   with `fstat`), then re-read every second with one `pread` at offset 0;
//! - `open`: every second each file opened, checked with `fstat`, read once
//!   and closed.
//!
//! The pods' directories are found by walking KUBEPODS_DIR for the pod uids
//! listed one a line in UID_FILE: `pod<uid>` (cgroupfs driver) or
//! `…-pod<uid with _>.slice` (systemd driver); QoS directories are walked
//! into, pod directories are not. It prints how many files it reads on its
//! first line and fails when a uid has no directory. It runs until killed.
//!
//! Standalone (std only): built by the bench with `rustc --target
//! x86_64-unknown-linux-musl`, a static binary for the guest.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const O_NOFOLLOW: i32 = 0o400000;
const O_NONBLOCK: i32 = 0o4000;

fn open(p: &Path) -> std::io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NOFOLLOW | O_NONBLOCK)
        .open(p)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{}: not a file",
            p.display()
        )));
    }
    Ok(f)
}

fn files(kubepods: &Path, uids: &BTreeSet<String>) -> Result<Vec<PathBuf>, String> {
    let mut out = vec![kubepods.join("cpu.stat"), kubepods.join("cpu.pressure")];
    let mut found = BTreeSet::new();
    let mut stack = vec![kubepods.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for e in rd.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            match name
                .rsplit_once("pod")
                .map(|(_, r)| r.trim_end_matches(".slice").replace('_', "-"))
            {
                Some(uid) if uid.len() >= 32 => {
                    if uids.contains(&uid) {
                        out.push(e.path().join("cpu.stat"));
                        found.insert(uid);
                    }
                }
                _ => stack.push(e.path()),
            }
        }
    }
    let missing: Vec<&String> = uids.difference(&found).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{} pod(s) have no cgroup under {}: {missing:?}",
            missing.len(),
            kubepods.display()
        ));
    }
    Ok(out)
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, kubepods, uid_file] = args.as_slice() else {
        return Err("usage: footprint-floor kept|open KUBEPODS_DIR UID_FILE".into());
    };
    let kept = match mode.as_str() {
        "kept" => true,
        "open" => false,
        m => return Err(format!("unknown mode {m:?} (kept, open)")),
    };
    let uids: BTreeSet<String> = std::fs::read_to_string(uid_file)
        .map_err(|e| format!("{uid_file}: {e}"))?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let paths = files(Path::new(kubepods), &uids)?;
    println!(
        "footprint-floor: {mode}: {} files a tick (kubepods 2 + {} pods)",
        paths.len(),
        paths.len() - 2
    );
    let handles: Vec<File> = if kept {
        paths
            .iter()
            .map(|p| open(p).map_err(|e| format!("{}: {e}", p.display())))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let mut buf = [0u8; 4096];
    let mut next = Instant::now();
    loop {
        if kept {
            for f in &handles {
                let _ = f.read_at(&mut buf, 0);
            }
        } else {
            for p in &paths {
                if let Ok(mut f) = open(p) {
                    let _ = f.read(&mut buf);
                }
            }
        }
        next += Duration::from_secs(1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("footprint-floor: {e}");
        std::process::exit(1);
    }
}
