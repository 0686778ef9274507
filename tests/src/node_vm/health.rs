//! What a test prints when a node stops answering: whether qemu answers at
//! all and whether its vCPUs run (QMP `query-status`: a full host disk pauses
//! a VM with `io-error`; no answer is a qemu gone or hung), the host's disk, memory and load, and the guest console's
//! tail. A CI run once lost a node mid-tier with nothing but "Connection timed
//! out during banner exchange" to show for it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::control_plane::log_tail;

/// The QMP socket of a VM whose directory is `dir`.
pub fn qmp_socket(dir: &Path) -> PathBuf {
    dir.join("qmp.sock")
}

/// Every booted VM by node name, so a test that only has a Node's name (a pod's
/// `spec.nodeName`) can diagnose it.
static VMS: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

pub(super) fn register(name: &str, dir: &Path) {
    let mut v = VMS.lock().unwrap_or_else(|p| p.into_inner());
    v.retain(|(n, _)| n != name);
    v.push((name.to_string(), dir.to_path_buf()));
}

pub(super) fn unregister(dir: &Path) {
    VMS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(_, d)| d != dir);
}

/// The diagnosis of the VM named `name`, if this process booted it.
pub fn diagnose_node(name: &str) -> Option<String> {
    let dir = VMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, d)| d.clone())?;
    Some(diagnose(name, &dir))
}

/// A few lines on the VM and the host it runs on, then the console's tail.
pub fn diagnose(name: &str, dir: &Path) -> String {
    let vcpus = query_status(&qmp_socket(dir))
        .unwrap_or_else(|e| format!("unknown: qemu does not answer QMP ({e})"));
    let host = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|e| format!("<{cmd}: {e}>"))
    };
    let dir_s = dir.display().to_string();
    let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
    format!(
        "--- diagnosis of node {name}: vCPUs {vcpus}\n\
         guest kernel: {}\n\
         host load: {}\nhost memory:\n{}\nhost disk of {dir_s}:\n{}\n\
         --- console tail:\n{}",
        kernel_failure(&console).unwrap_or("no panic, oops or lockup on the console"),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim(),
        host("free", &["-m"]),
        host("df", &["-h", &dir_s]),
        log_tail(&dir.join("console.log"), 30)
    )
}

/// The first console line that says the guest kernel failed (a panic, an
/// oops, a BUG or a lockup), so a node that died under the test is told from
/// one the test could not reach.
pub fn kernel_failure(console: &str) -> Option<&str> {
    // RCU's stall reports (`rcu_preempt detected stalls on CPUs/tasks`,
    // `rcu_sched self-detected stall`) print after 21 s of a CPU that no
    // longer runs its timers: a CI run lost a 3-vCPU node that way before
    // ssh (console full of `rcu_preempt kthread timer wakeup didn't happen`).
    const MARKS: [&str; 7] = [
        "Kernel panic",
        "BUG:",
        "Oops:",
        "general protection fault",
        "soft lockup",
        "self-detected stall",
        "detected stalls on CPUs",
    ];
    console
        .lines()
        .find(|l| MARKS.iter().any(|m| l.contains(m)))
        .map(str::trim)
}

/// QMP `query-status` over the VM's socket: `running`, `paused (io-error)`, ...
pub fn query_status(sock: &Path) -> Result<String, String> {
    let s = UnixStream::connect(sock).map_err(|e| e.to_string())?;
    let t = Some(Duration::from_secs(3));
    s.set_read_timeout(t).map_err(|e| e.to_string())?;
    s.set_write_timeout(t).map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    // Greeting, then capabilities negotiation, then the query. Events may come
    // in between: read until the answer that carries a status.
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    w.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"query-status\"}\n")
        .map_err(|e| e.to_string())?;
    for _ in 0..20 {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            break;
        }
        let v: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => continue,
        };
        if let Some(st) = v.pointer("/return/status").and_then(|s| s.as_str()) {
            return Ok(st.to_string());
        }
    }
    Err("no status in the answer".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A QMP server that greets, sends an event between the answers, then
    /// answers the capabilities and the query as qemu does.
    fn fake_qmp(status: &'static str) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<()>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = qmp_socket(dir.path());
        let l = UnixListener::bind(&sock).expect("bind");
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            s.write_all(b"{\"return\": {}}\n").unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            assert!(line.contains("query-status"), "{line}");
            s.write_all(b"{\"event\": \"STOP\", \"timestamp\": {}}\n")
                .unwrap();
            s.write_all(
                format!("{{\"return\": {{\"status\": \"{status}\", \"running\": false}}}}\n")
                    .as_bytes(),
            )
            .unwrap();
        });
        (dir, sock, h)
    }

    #[test]
    fn query_status_reads_the_status_past_events() {
        let (_d, sock, h) = fake_qmp("io-error");
        assert_eq!(query_status(&sock).as_deref(), Ok("io-error"));
        h.join().unwrap();
    }

    #[test]
    fn query_status_of_a_missing_socket_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        assert!(query_status(&qmp_socket(dir.path())).is_err());
    }

    #[test]
    fn a_silent_qmp_server_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let sock = qmp_socket(dir.path());
        let l = UnixListener::bind(&sock).unwrap();
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            std::thread::sleep(Duration::from_secs(4));
            drop(s);
        });
        assert!(query_status(&sock).is_err());
        h.join().unwrap();
    }

    #[test]
    fn an_rcu_stall_is_a_kernel_failure() {
        // The console of the 3-vCPU node a CI run lost before ssh.
        let console = "[  150.554002] rcu: \tPossible timer handling issue on cpu=1 timer-softirq=1\n\
                       [  171.559630] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:\n\
                       [  171.560041] rcu: \t1-...!: (0 ticks this GP) idle=a268/0/0x0\n";
        assert_eq!(
            kernel_failure(console),
            Some("[  171.559630] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:")
        );
        assert!(
            kernel_failure("[ 9.1] rcu: INFO: rcu_sched self-detected stall on CPU\n").is_some()
        );
        assert_eq!(
            kernel_failure("[ 2.0] rcu: Hierarchical RCU implementation.\n"),
            None
        );
    }

    #[test]
    fn a_panicked_guest_is_named_in_the_diagnosis() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("console.log"),
            "[   39.1] RIP: 0010:update_curr+0x63/0x200\n\
             [   39.2] Kernel panic - not syncing: Fatal exception in interrupt\n\
             [   42.1] Shutting down cpus with NMI\n",
        )
        .unwrap();
        let d = diagnose("panicked-node", dir.path());
        assert!(
            d.contains("guest kernel: [   39.2] Kernel panic - not syncing: Fatal exception"),
            "{d}"
        );
        std::fs::write(dir.path().join("console.log"), "vm login: \n").unwrap();
        let d = diagnose("quiet-node", dir.path());
        assert!(
            d.contains("guest kernel: no panic, oops or lockup on the console"),
            "{d}"
        );
    }

    #[test]
    fn diagnose_node_knows_only_registered_vms() {
        let dir = tempfile::tempdir().unwrap();
        assert!(diagnose_node("health-test-node").is_none());
        register("health-test-node", dir.path());
        let d = diagnose_node("health-test-node").expect("registered");
        assert!(
            d.contains("health-test-node: vCPUs unknown: qemu does not answer QMP"),
            "{d}"
        );
        unregister(dir.path());
        assert!(diagnose_node("health-test-node").is_none());
    }
}
