//! `headroom-agent slack` on a copy of the kind fixture tree with hostile or
//! broken cgroup files: each case once crashed, hung, flooded the terminal
//! or misreported the node.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const KP: &str = "kubelet.slice/kubelet-kubepods.slice";
const BURSTABLE: &str = "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice";

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

fn fixture() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cgroup-fixtures/kind/root");
    copy_tree(&src, &root);
    (t, root)
}

/// The first pod cgroup under the Burstable QoS directory.
fn burstable_pod(root: &Path) -> PathBuf {
    std::fs::read_dir(root.join(BURSTABLE))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap()
}

fn replace(path: &Path, with: impl FnOnce(&Path)) {
    std::fs::remove_file(path).unwrap();
    with(path);
}

/// Runs `slack` with a deadline; a hang is killed and fails the test.
fn slack(root: &Path, extra: &[&str], tweak: impl FnOnce(&mut Command)) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom-agent"));
    cmd.args(["slack", "--node-allocatable", "4000m", "--cgroup-root"])
        .arg(root)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tweak(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("slack hung for 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn symlink_to_dev_zero_is_an_error_not_an_abort() {
    let (_t, root) = fixture();
    let pod = burstable_pod(&root);
    replace(&pod.join("cpu.max"), |p| {
        std::os::unix::fs::symlink("/dev/zero", p).unwrap()
    });
    let o = slack(&root, &["--interval", "100ms"], |_| {});
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(
        out.contains("is a symlink") || out.contains("a symlink"),
        "{out}"
    );
    // kubepods itself: a clean error exit, not SIGABRT.
    replace(&root.join(KP).join("cpu.max"), |p| {
        std::os::unix::fs::symlink("/dev/zero", p).unwrap()
    });
    let o = slack(&root, &["--interval", "100ms"], |_| {});
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("symlink"), "{err}");
}

#[test]
fn fifo_cpu_max_does_not_hang() {
    let (_t, root) = fixture();
    let pod = burstable_pod(&root);
    replace(&pod.join("cpu.max"), |p| {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap()
    });
    let t0 = Instant::now();
    let o = slack(&root, &["--interval", "100ms"], |_| {});
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(out.contains("a FIFO"), "{out}");
}

#[test]
fn huge_cpu_max_is_not_echoed() {
    let (_t, root) = fixture();
    let pod = burstable_pod(&root);
    std::fs::write(
        pod.join("cpu.max"),
        format!("{} 100000\n", "9".repeat(13 << 20)),
    )
    .unwrap();
    let o = slack(&root, &["--interval", "100ms"], |_| {});
    let (out, err) = text(&o);
    assert!(
        out.len() + err.len() < 64 * 1024,
        "{} + {} bytes of output",
        out.len(),
        err.len()
    );
    assert!(out.contains("larger than 65536 bytes"), "{out}");
}

#[test]
fn malformed_kubepods_psi_reads_as_absent() {
    let (_t, root) = fixture();
    std::fs::write(
        root.join(KP).join("cpu.pressure"),
        "some avg10=nan avg60=0.00 avg300=0.00 total=0\n",
    )
    .unwrap();
    let o = slack(&root, &["--interval", "100ms", "--json"], |_| {});
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["node"]["pressure_some_avg10"].is_null());
    assert_eq!(v["issues"].as_array().unwrap().len(), 1, "{out}");
    assert!(err.contains("cpu.pressure"), "logged: {err}");
}

#[test]
fn kubepods_counter_reset_is_said() {
    let (_t, root) = fixture();
    let stat = root.join(KP).join("cpu.stat");
    let s = std::fs::read_to_string(&stat).unwrap();
    std::fs::write(&stat, s.replacen("usage_usec ", "usage_usec 9999", 1)).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_headroom-agent"))
        .args(["slack", "--node-allocatable", "4000m", "--interval", "1s"])
        .arg("--cgroup-root")
        .arg(&root)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    std::fs::write(&stat, &s).unwrap(); // usage goes backwards mid-interval
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("counter reset seen"), "{out}");
}

/// Runs as an unprivileged user (root reads through chmod 000): a QoS
/// directory it may not list is reported, and the exit status says the
/// answer is incomplete.
#[test]
fn unreadable_qos_dir_is_reported_when_not_root() {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        eprintln!("skipped: needs root to drop to another user");
        return;
    }
    let (t, root) = fixture();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_headroom-agent"));
    // The unprivileged user must reach the tree and the binary.
    for p in std::iter::once(t.path()).chain(bin.ancestors().skip(1)) {
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        if mode & 0o005 != 0o005 && p.starts_with(t.path()) {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        } else if mode & 0o001 == 0 {
            eprintln!("skipped: {} is not searchable by others", p.display());
            return;
        }
    }
    let baseline = slack(&root, &["--interval", "100ms"], |c| {
        c.uid(65534).gid(65534);
    });
    let (out, err) = text(&baseline);
    assert_eq!(baseline.status.code(), Some(0), "{out}\n{err}");
    std::fs::set_permissions(root.join(BURSTABLE), std::fs::Permissions::from_mode(0o000)).unwrap();
    let o = slack(&root, &["--interval", "100ms"], |c| {
        c.uid(65534).gid(65534);
    });
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(out.contains("Burstable pods: NOT LISTED"), "{out}");
    assert!(out.contains("permission denied"), "{out}");
}

/// `slack --json` names idle CPU `idle_millicores`, the stall's queued
/// share `queued_pct` and each pod's cgroup id `pod_id`; the names before
/// 0.2 (`slack_millicores`, `contention_pct`, `uid`) are written beside
/// them, equal, for one release.
#[test]
fn renamed_json_fields_keep_their_old_names_for_one_release() {
    let (_t, root) = fixture();
    let o = slack(&root, &["--interval", "100ms", "--json"], |_| {});
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let node = &v["node"];
    assert!(node["idle_millicores"].is_u64(), "{node}");
    assert_eq!(node["idle_millicores"], node["slack_millicores"], "{node}");
    let stall = &node["stall"];
    assert!(stall["queued_pct"].is_f64(), "{stall}");
    assert_eq!(stall["queued_pct"], stall["contention_pct"], "{stall}");
    let pods = v["pods"].as_array().expect("pods");
    assert!(!pods.is_empty(), "{v}");
    for p in pods {
        assert!(p["pod_id"].is_string(), "{p}");
        assert_eq!(p["pod_id"], p["uid"], "{p}");
    }
}
