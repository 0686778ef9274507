//! The files that make a VM a node, as plain text: kubelet config, containerd
//! config, CNI config, kubeconfig, node.env. Pure functions, so what a node is
//! given can be read and unit-tested without booting anything.

use crate::certs::GUEST_APISERVER_IP;

/// Port the guest connects to at [`GUEST_APISERVER_IP`]; QEMU forwards it to
/// the apiserver on the host's loopback.
pub const GUEST_APISERVER_PORT: u16 = 6443;

/// How the kubelet and the runtime lay out cgroups on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupDriver {
    Systemd,
    Cgroupfs,
}

impl CgroupDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Systemd => "systemd",
            CgroupDriver::Cgroupfs => "cgroupfs",
        }
    }
}

/// The Debian release a node image is built from
/// (`tests/node-vm/build-rootfs.sh <suite>`): its kernel, containerd, runc
/// and systemd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Suite {
    /// Debian 12: Linux 6.1, containerd 1.6, runc 1.1, systemd 252.
    Bookworm,
    /// Debian 13: Linux 6.12, containerd 1.7, runc 1.1, systemd 257.
    Trixie,
}

impl Suite {
    pub const ALL: [Suite; 2] = [Suite::Bookworm, Suite::Trixie];

    pub fn as_str(self) -> &'static str {
        match self {
            Suite::Bookworm => "bookworm",
            Suite::Trixie => "trixie",
        }
    }

    pub fn parse(s: &str) -> Option<Suite> {
        Suite::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// Which suite each named node runs, from `HEADROOM_NODE_SUITES`
/// (`node-systemd=bookworm,node-cgroupfs=trixie`): `None` for a node it does
/// not name; an error for a malformed entry or an unknown suite.
pub fn suite_overrides(text: &str) -> Result<Vec<(String, Suite)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (node, suite) = e
                .split_once('=')
                .ok_or_else(|| format!("HEADROOM_NODE_SUITES: {e:?} is not node=suite"))?;
            let suite = Suite::parse(suite.trim()).ok_or_else(|| {
                format!("HEADROOM_NODE_SUITES: unknown suite {suite:?} (bookworm, trixie)")
            })?;
            Ok((node.trim().to_string(), suite))
        })
        .collect()
}

/// One node VM.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    /// The image (kernel, containerd, runc) the node boots.
    pub suite: Suite,
    pub driver: CgroupDriver,
    /// kubelet `cgroupRoot`, e.g. `/kubelet` as on kind nodes; `None` = `/`.
    pub cgroup_root: Option<String>,
    /// This node's pod subnet (bridge CNI with host-local IPAM).
    pub pod_cidr: String,
    pub cpus: u32,
    pub memory_mib: u32,
    /// kubelet `--v`.
    pub kubelet_verbosity: u8,
    /// `cpuManagerPolicy: static` with this `kubeReserved.cpu` (e.g. `100m`;
    /// the policy needs a reservation, and keeps ⌈it⌉ whole CPUs, CPU 0 up,
    /// in the shared pool). `None`: the default `none` policy.
    pub static_cpu_manager: Option<String>,
    /// The disk keeps its writes across a reboot (a qcow2 overlay in the VM's
    /// directory over the cached image) instead of qemu's throwaway snapshot:
    /// what [`super::NodeVm::reboot`] needs.
    pub persistent_disk: bool,
    /// Words added to the kernel command line of the first boot only: a
    /// fault for the harness's second boot to mend (e.g.
    /// `systemd.mask=headroom-node.service`: the kubelet will not start).
    pub first_boot_fault: Option<String>,
}

impl NodeSpec {
    /// systemd driver under a `/kubelet` cgroupRoot, the layout of kind nodes.
    pub fn kind_like(name: &str, index: u8) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            suite: Suite::Bookworm,
            driver: CgroupDriver::Systemd,
            cgroup_root: Some("/kubelet".to_string()),
            pod_cidr: format!("10.244.{index}.0/24"),
            cpus: 2,
            memory_mib: 2560,
            kubelet_verbosity: 2,
            static_cpu_manager: None,
            persistent_disk: false,
            first_boot_fault: None,
        }
    }

    /// cgroupfs driver, no cgroupRoot: `/sys/fs/cgroup/kubepods/...`.
    pub fn cgroupfs(name: &str, index: u8) -> NodeSpec {
        NodeSpec {
            driver: CgroupDriver::Cgroupfs,
            cgroup_root: None,
            ..NodeSpec::kind_like(name, index)
        }
    }

    pub fn with_suite(self, suite: Suite) -> NodeSpec {
        NodeSpec { suite, ..self }
    }

    /// The node-allocatable cgroup's absolute path in the guest.
    pub fn kubepods_path(&self) -> String {
        format!("/sys/fs/cgroup/{}", self.kubepods_dir())
    }

    /// Path of the node-allocatable cgroup (`kubepods`) under /sys/fs/cgroup.
    pub fn kubepods_dir(&self) -> String {
        let root = self
            .cgroup_root
            .as_deref()
            .unwrap_or("/")
            .trim_matches('/')
            .to_string();
        match (self.driver, root.is_empty()) {
            (CgroupDriver::Cgroupfs, true) => "kubepods".into(),
            (CgroupDriver::Cgroupfs, false) => format!("{root}/kubepods"),
            (CgroupDriver::Systemd, true) => "kubepods.slice".into(),
            // Every systemd ancestor is expanded: /kubelet → kubelet.slice/kubelet-kubepods.slice.
            (CgroupDriver::Systemd, false) => format!("{root}.slice/{root}-kubepods.slice"),
        }
    }
}

pub fn kubelet_config(spec: &NodeSpec) -> String {
    let mut cgroup_root = spec
        .cgroup_root
        .as_deref()
        .map(|r| format!("cgroupRoot: {r}\n"))
        .unwrap_or_default();
    if let Some(cpu) = &spec.static_cpu_manager {
        cgroup_root.push_str(&format!(
            "cpuManagerPolicy: static\nkubeReserved:\n  cpu: {cpu}\n"
        ));
    }
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: {driver}
{cgroup_root}containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/ca.crt
authorization:
  mode: Webhook
failSwapOn: false
# Empty at boot; a test drops a manifest in to run a static pod.
staticPodPath: {STATIC_POD_PATH}
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
maxPods: 110
serializeImagePulls: false
nodeStatusUpdateFrequency: 10s
# A small throwaway disk: never evict or garbage-collect images for space.
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
",
        driver = spec.driver.as_str(),
    )
}

/// The kubelet's `staticPodPath` on every node: empty at boot.
pub const STATIC_POD_PATH: &str = "/etc/kubernetes/manifests";

pub fn containerd_config(spec: &NodeSpec) -> String {
    format!(
        r#"version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "headroom.local/pause:1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = {systemd}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
"#,
        systemd = spec.driver == CgroupDriver::Systemd,
    )
}

pub fn cni_config(spec: &NodeSpec) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "headroom",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": spec.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

/// A kubeconfig for processes in the guest (kubelet, agent), with files
/// under /etc/kubernetes.
pub fn guest_kubeconfig(user: &str, cert: &str, key: &str) -> String {
    crate::certs::Kubeconfig {
        server: &format!("https://{GUEST_APISERVER_IP}:{GUEST_APISERVER_PORT}"),
        ca: "/etc/kubernetes/ca.crt",
        user,
        auth: crate::certs::KubeconfigAuth::Cert { cert, key },
        namespace: None,
    }
    .yaml()
}

/// The systemd slice of a cgroupRoot under the systemd driver (`/kubelet` →
/// `kubelet.slice`), which must exist before the kubelet starts.
pub fn cgroup_root_slice(spec: &NodeSpec) -> Option<String> {
    let root = spec.cgroup_root.as_deref()?.trim_matches('/');
    (spec.driver == CgroupDriver::Systemd && !root.is_empty())
        .then(|| format!("{}.slice", root.replace('/', "-")))
}

pub fn node_env(spec: &NodeSpec) -> String {
    format!(
        "NODE_NAME={}\nKUBELET_VERBOSITY={}\nKUBELET_SLICE={}\n",
        spec.name,
        spec.kubelet_verbosity,
        cgroup_root_slice(spec).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubepods_dir_expands_systemd_ancestors() {
        assert_eq!(
            NodeSpec::kind_like("a", 1).kubepods_dir(),
            "kubelet.slice/kubelet-kubepods.slice"
        );
        assert_eq!(NodeSpec::cgroupfs("b", 2).kubepods_dir(), "kubepods");
        let mut s = NodeSpec::kind_like("c", 3);
        s.cgroup_root = None;
        assert_eq!(s.kubepods_dir(), "kubepods.slice");
    }

    #[test]
    fn suite_overrides_parse_and_refuse() {
        assert_eq!(
            suite_overrides("node-systemd=bookworm, node-cgroupfs=trixie,").unwrap(),
            [
                ("node-systemd".to_string(), Suite::Bookworm),
                ("node-cgroupfs".to_string(), Suite::Trixie)
            ]
        );
        assert_eq!(suite_overrides("").unwrap(), []);
        assert!(
            suite_overrides("node-systemd")
                .unwrap_err()
                .contains("not node=suite"),
            "no ="
        );
        assert!(
            suite_overrides("a=sid")
                .unwrap_err()
                .contains("unknown suite \"sid\""),
            "unknown suite"
        );
    }

    #[test]
    fn driver_reaches_kubelet_and_runtime_alike() {
        let a = NodeSpec::kind_like("a", 1);
        assert!(kubelet_config(&a).contains("cgroupDriver: systemd\ncgroupRoot: /kubelet\n"));
        assert!(containerd_config(&a).contains("SystemdCgroup = true"));
        let b = NodeSpec::cgroupfs("b", 2);
        assert!(kubelet_config(&b).contains("cgroupDriver: cgroupfs\ncontainerRuntimeEndpoint"));
        assert!(containerd_config(&b).contains("SystemdCgroup = false"));
        assert!(cni_config(&b).contains("10.244.2.0/24"));
        assert!(node_env(&a).contains("KUBELET_SLICE=kubelet.slice\n"));
        assert!(node_env(&b).contains("KUBELET_SLICE=\n"));
        assert!(!kubelet_config(&b).contains("cpuManagerPolicy"));
        assert!(kubelet_config(&b).contains("\nstaticPodPath: /etc/kubernetes/manifests\n"));
        let st = NodeSpec {
            static_cpu_manager: Some("100m".into()),
            ..b
        };
        assert!(
            kubelet_config(&st).contains("cpuManagerPolicy: static\nkubeReserved:\n  cpu: 100m\n")
        );
    }
}
