//! The QEMU command line of a node VM. Software emulation (TCG) only: this
//! machine's /dev/kvm is a paravirtual hypervisor that cannot boot a stock
//! kernel. Networking is user-mode with `restrict=on`: the guest reaches
//! nothing but the forwards listed here, and nothing leaves the machine.

use std::path::{Path, PathBuf};

use super::config::GUEST_APISERVER_PORT;
use crate::certs::GUEST_APISERVER_IP;

/// Everything a VM is started with.
#[derive(Clone, Debug)]
pub struct VmLaunch {
    pub name: String,
    pub cpus: u32,
    pub memory_mib: u32,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub disk: PathBuf,
    /// A qcow2 overlay over `disk` that keeps the guest's writes across a
    /// reboot; `None`: qemu's throwaway snapshot.
    pub overlay: Option<PathBuf>,
    /// Read-only 9p share mounted at /mnt/host (kubelet, images).
    pub host_share: PathBuf,
    /// Read-only 9p share mounted at /mnt/node (this node's config).
    pub node_share: PathBuf,
    pub console_log: PathBuf,
    /// QMP socket (what a diagnosis asks: are the vCPUs running or paused).
    pub qmp_socket: PathBuf,
    /// `(host loopback port, guest port)`: ssh and whatever a test exposes.
    pub host_forwards: Vec<(u16, u16)>,
    /// The apiserver on the host's loopback, reached from the guest at
    /// `GUEST_APISERVER_IP:GUEST_APISERVER_PORT`.
    pub apiserver_port: u16,
    /// More kernel command line words (a boot's injected fault), or empty.
    pub extra_append: String,
}

impl VmLaunch {
    pub fn args(&self) -> Vec<String> {
        let mut netdev = String::from("user,id=n0,restrict=on");
        for (host, guest) in &self.host_forwards {
            netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{host}-:{guest}"));
        }
        // One socat per guest connection (the chardev form of guestfwd would
        // carry a single connection only).
        netdev.push_str(&format!(
            ",guestfwd=tcp:{GUEST_APISERVER_IP}:{GUEST_APISERVER_PORT}-cmd:socat STDIO TCP:127.0.0.1:{}",
            self.apiserver_port
        ));
        let share = |path: &Path, tag: &str| {
            format!(
                "local,path={},mount_tag={tag},security_model=none,readonly=on",
                path.display()
            )
        };
        vec![
            "-name".into(),
            self.name.clone(),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-accel".into(),
            // A smaller translation cache keeps qemu's RSS near 1 GB.
            "tcg,thread=multi,tb-size=256".into(),
            "-cpu".into(),
            "max".into(),
            "-smp".into(),
            self.cpus.to_string(),
            "-m".into(),
            self.memory_mib.to_string(),
            "-kernel".into(),
            self.kernel.display().to_string(),
            "-initrd".into(),
            self.initrd.display().to_string(),
            "-append".into(),
            format!(
                "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 psi=1 \
                 mitigations=off no_timer_check panic=5 quiet systemd.show_status=false {}",
                self.extra_append
            )
            .trim_end()
            .to_string(),
            "-drive".into(),
            match &self.overlay {
                // The overlay (made over the image by `qemu-img create -b`) keeps
                // this VM's writes; the image itself is only read.
                Some(o) => format!("file={},if=virtio,format=qcow2", o.display()),
                // snapshot=on: every boot starts from the clean image; writes are thrown away.
                None => format!(
                    "file={},if=virtio,format=raw,snapshot=on",
                    self.disk.display()
                ),
            },
            "-netdev".into(),
            netdev,
            "-device".into(),
            "virtio-net-pci,netdev=n0".into(),
            "-virtfs".into(),
            share(&self.host_share, "hosttools"),
            "-virtfs".into(),
            share(&self.node_share, "nodecfg"),
            "-device".into(),
            "virtio-rng-pci".into(),
            "-display".into(),
            "none".into(),
            "-serial".into(),
            format!("file:{}", self.console_log.display()),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", self.qmp_socket.display()),
            "-no-reboot".into(),
        ]
    }
}

/// The oldest QEMU the node VMs run under. QEMU 7.2's multi-threaded TCG
/// kills guests on run-time kernel code patching far sooner than 10.0 does,
/// and runs cgroup-heavy guest work about 2.5x slower (docs/development.md,
/// "Guest kernels under emulation"); `scripts/lib/packages.sh` installs 10.
pub const MIN_QEMU_MAJOR: u32 = 10;

/// Checks the first line of `qemu-system-x86_64 --version` against
/// [`MIN_QEMU_MAJOR`]: an error names the version found and why it is refused.
pub fn check_qemu_version(version_output: &str) -> Result<(), String> {
    let line = version_output.lines().next().unwrap_or("");
    let major = line
        .split_once("version ")
        .and_then(|(_, v)| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .ok_or_else(|| format!("cannot read a QEMU version from {line:?}"))?;
    if major < MIN_QEMU_MAJOR {
        return Err(format!(
            "QEMU {major} found, the node VMs need {MIN_QEMU_MAJOR} or later: under older \
             multi-threaded TCG their guest kernels die on run-time code patching \
             (docs/development.md, \"Guest kernels under emulation\"); \
             tests/node-vm/build.sh installs it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_seven_is_refused_and_ten_or_later_is_taken() {
        let old = "QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright";
        let err = check_qemu_version(old).unwrap_err();
        assert!(err.contains("QEMU 7 found"), "{err}");
        check_qemu_version("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2)").unwrap();
        check_qemu_version("QEMU emulator version 11.1.0").unwrap();
        let err = check_qemu_version("qemu: unknown option").unwrap_err();
        assert!(err.contains("cannot read"), "{err}");
    }

    fn launch() -> VmLaunch {
        VmLaunch {
            name: "n".into(),
            cpus: 2,
            memory_mib: 2048,
            kernel: "/k".into(),
            initrd: "/i".into(),
            disk: "/d".into(),
            overlay: None,
            host_share: "/h".into(),
            node_share: "/n".into(),
            console_log: "/c".into(),
            qmp_socket: "/q".into(),
            host_forwards: vec![(2222, 22), (9999, 9100)],
            apiserver_port: 6000,
            extra_append: String::new(),
        }
    }

    /// The kernel command line qemu is given.
    fn append(l: &VmLaunch) -> String {
        let args = l.args();
        let i = args.iter().position(|a| a == "-append").expect("-append");
        args[i + 1].clone()
    }

    #[test]
    fn a_boots_fault_goes_on_that_boots_command_line_only() {
        let clean = append(&launch());
        assert!(clean.ends_with("systemd.show_status=false"), "{clean}");
        let faulty = VmLaunch {
            extra_append: "systemd.mask=headroom-node.service".into(),
            ..launch()
        };
        assert_eq!(
            append(&faulty),
            format!("{clean} systemd.mask=headroom-node.service")
        );
    }

    #[test]
    fn network_is_restricted_with_explicit_forwards_only() {
        let args = launch().args();
        let netdevs: Vec<&String> = args.iter().filter(|a| a.starts_with("user,")).collect();
        assert_eq!(netdevs.len(), 1, "exactly one netdev: {args:?}");
        let nd = netdevs[0];
        assert!(nd.contains(",restrict=on"), "{nd}");
        let parts: Vec<&str> = nd.split(',').collect();
        let fwds: Vec<&str> = parts
            .iter()
            .copied()
            .filter(|p| p.starts_with("hostfwd=") || p.starts_with("guestfwd="))
            .collect();
        assert_eq!(
            fwds,
            [
                "hostfwd=tcp:127.0.0.1:2222-:22",
                "hostfwd=tcp:127.0.0.1:9999-:9100",
                "guestfwd=tcp:10.0.2.100:6443-cmd:socat STDIO TCP:127.0.0.1:6000",
            ]
        );
        // Host forwards listen on loopback only.
        assert!(fwds.iter().all(|f| !f.starts_with("hostfwd=tcp::")));
        assert!(
            !args.iter().any(|a| a.contains("kvm")),
            "TCG only: {args:?}"
        );
        assert!(args.iter().any(|a| a.contains("snapshot=on")));
    }

    /// With an overlay the drive is the overlay (the image is its read-only
    /// backing file) and there is no throwaway snapshot; without one, never
    /// an overlay.
    #[test]
    fn a_persistent_disk_is_the_overlay_and_never_the_image() {
        let mut l = launch();
        l.overlay = Some("/vm/disk.qcow2".into());
        let args = l.args();
        let drives: Vec<&String> = args.iter().filter(|a| a.starts_with("file=")).collect();
        assert_eq!(
            drives,
            ["file=/vm/disk.qcow2,if=virtio,format=qcow2"],
            "{args:?}"
        );
        assert!(
            !args
                .iter()
                .any(|a| a.contains("snapshot=on") || a.contains("file=/d,"))
        );
        assert!(!launch().args().iter().any(|a| a.contains("qcow2")));
    }
}
