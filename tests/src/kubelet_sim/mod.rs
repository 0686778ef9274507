//! A simulated kubelet for integration tests: it stands in for the kubelet (and
//! the container runtime and the kernel's CPU accounting) of one named node, against
//! a real kube-apiserver, and writes a cgroup v2 tree into a temporary directory that
//! the agent is pointed at. Written from `docs/kubelet-behaviour.md`, not from the agent's code.
//!
//! # What it simulates
//!
//! - **Node**: creates (or updates) the Node with `capacity` = `allocatable` (CPU,
//!   memory, 110 pods), a `Ready=True` condition and `declaredFeatures` (see
//!   [`SimConfig::declared_features`]). No heartbeats or leases. The root
//!   cgroup's `cpuset.cpus.effective` lists ⌈allocatable⌉ online CPUs (or the
//!   static CPU manager's [`StaticCpuManager::cpus`], whose exclusive CPUs and
//!   shared pool go into the containers' `cpuset.cpus.effective`, see [`cpuset`]).
//! - **Cgroup tree** (docs/kubelet-behaviour.md §1) under `cgroup_root`, per [`SimLayout`] (kind's
//!   `/kubelet` root with the systemd driver, plain systemd, cgroupfs) and
//!   [`SimRuntime`] (containerd, CRI-O): kubepods, its QoS children, pod cgroups
//!   (`pod<uid>`, Guaranteed directly under kubepods), one cgroup per running
//!   container, one for the pause (sandbox) container, and for CRI-O a
//!   `crio-conmon-<id>` cgroup per container. Every cgroup has `cgroup.controllers`
//!   (with `cpu`), `cgroup.subtree_control`, an empty `cgroup.procs`, `cpu.max`,
//!   `cpu.weight`, `cpu.stat` and `cpu.pressure`. kubepods gets `max <period>`.
//! - **Values** (docs/kubelet-behaviour.md §2, §4): container quota = limit × period / 1000, at least
//!   1000 µs; `max` with no limit; a container without a limit under a pod-level limit
//!   gets the pod's limit. Pod quota = aggregate of container limits (sidecars, and
//!   ordinary init containers the way the kubelet's `PodLimits` takes their peak) plus
//!   `spec.overhead.cpu` when every container has a limit, or the pod-level limit plus
//!   overhead; else `max`. `cpu.weight` = runc's linear shares→weight mapping of the
//!   requests (pod: sum of requests or the pod-level request, plus overhead; burstable
//!   QoS cgroup: sum over its pods; kubepods: allocatable; pause/conmon/besteffort: 1).
//! - **Pod lifecycle**: watches pods with `spec.nodeName=<node>`; a new pod gets its
//!   cgroups and a Running status at once (containerIDs `containerd://<64 hex>` or
//!   `cri-o://<64 hex>`, running state, `resources`, `allocatedResources`,
//!   `observedGeneration`, pod-level `resources` when the spec has them; ordinary
//!   init containers are reported `Completed` and have no cgroup). A pod with a
//!   `deletionTimestamp` loses its cgroups and is then deleted with grace period 0,
//!   as the kubelet confirms a deletion.
//! - **Static pods** ([`SimConfig::static_pods`], docs/kubelet-behaviour.md
//!   "Static pods"): run from the start under their config hash (cgroup
//!   `pod<hash>`), with a mirror pod the simulator creates in the apiserver
//!   (`kubernetes.io/config.mirror`, another uid, owned by the Node), reports
//!   status on and recreates when deleted; see [`static_pods`].
//! - **Resize** (docs/kubelet-behaviour.md §3, §4): a `metadata.generation` bump whose resources differ
//!   from what was applied sets `PodResizeInProgress=True` and moves
//!   `status.observedGeneration` to the new generation (as a real kubelet does); after `resize_delay` the new container and pod `cpu.max` and
//!   `cpu.weight` are written; after a further `status_delay` the status reports the
//!   new resources and generation and the condition is gone. A new generation during
//!   a resize restarts it toward the newest spec. A bump without a resource change
//!   only moves `status.observedGeneration`.
//! - **Faults** per pod: see [`Fault`].
//! - **Load** (see [`load`]): each container has a CPU demand set by the test (a pod
//!   demand is split evenly over its running containers). Every tick, CPU is granted
//!   by the `cpu.max` files *as they are on disk* (so out-of-band writes take effect,
//!   as in the kernel): container quota, then pod quota, then node capacity (the Node's
//!   allocatable, or a finite kubepods `cpu.max` if lower) shared by water-filling on
//!   pod `cpu.weight`. `usage_usec` of every cgroup grows by what it got;
//!   `nr_periods` grows while a finite-quota cgroup has demand, `nr_throttled` and
//!   `throttled_usec` while demand exceeds the quota. The QoS cgroups and kubepods
//!   aggregate their pods.
//!
//! # What it approximates or leaves out
//!
//! - No processes, no CFS, no real time slices: the counters are arithmetic on the
//!   tick length (measured, not nominal). `throttled_usec` is one run queue's view:
//!   `dt × (1 − quota/demand)`. `user_usec:system_usec` is 9:1. Hierarchical CFS
//!   weights are flattened: pods compete by their own weight, whatever their QoS.
//! - PSI is approximated per cgroup, the way the kernel (≥ 5.13) counts it
//!   (docs/kubelet-behaviour.md §8). A container's demand is ⌈demand / 1000m⌉ busy
//!   threads. What the node denies it after quotas is split in two: the part of its
//!   demand beyond the node's CPUs is its own threads queued behind each other
//!   (`self_queued`), the rest is displacement by other pods. Over the time its
//!   threads were runnable on a CPU (`demand − self_queued`): `full` = (displaced +
//!   `throttle_psi_weight` × throttled) / that, and `some` = min(1, `full` +
//!   self_queued / that), because a thread waiting behind its own sibling is `some`
//!   but never `full` (one of them runs). So on 2 CPUs a lone pod with 3 busy threads
//!   reads `some` 50 %, with 4 or more 100 %, `full` 0; a single thread reads
//!   `some` = `full` = its denied share. Throttling is weighted (default 0.85): the
//!   kernel counts a throttled task as runnable and not running, so a
//!   single-threaded pod throttled at its limit adds most of its throttled time to
//!   kubepods `some` (0.84–0.87 of it measured on both real nodes; parity test
//!   `psi_of_a_pod_throttled_at_its_own_limit_matches_the_real_kernel`). A group's
//!   `some` is 1 − Π(1 − `some`ᵢ), its `full` Π `full`ᵢ over busy members, assuming
//!   independence; threads are not pooled across a pod's containers, so two
//!   containers that only together outnumber the CPUs read as displacing each other.
//!   avg10/60/300 are continuous exponential moving averages with 10, 60 and 300 s
//!   windows (the kernel updates every 2 s); `total` is µs of `some`/`full`.
//! - Fluid fairness: a pod gets its weighted share of a full node or all it
//!   wants, so a pod within its request never waits while another bursts
//!   (the real kernel does: docs/kubelet-behaviour.md §8). A test that
//!   needs such a wait asks for it per pod ([`SimKubelet::set_cede`],
//!   [`load::cede`]).
//! - No admission: every resize is accepted (never `PodResizePending`
//!   `Deferred`/`Infeasible`), there is no eviction, no restarts for
//!   `resizePolicy: RestartContainer`, no memory files, no probes, no images.
//!   Status `resources.limits` report what the runtime believes it set (the spec, or
//!   the value written under [`Fault::WrongValue`]), not a re-read of the file.
//! - `cpu.weight` uses one runc mapping; real runc versions differ (docs/kubelet-behaviour.md §2).
//! - A fault changed after a write affects only later writes and reports.
//!
//! # Files and concurrent readers
//!
//! `cpu.stat` and `cpu.pressure` are replaced by rename every tick, so a reader
//! never sees half a file (they raise no `IN_MODIFY`, like the kernel's counters).
//! `cpu.max` and `cpu.weight` follow [`WriteMode`]: rename by default; `InPlace`
//! writes them with truncate + `write(2)` to raise `IN_MODIFY` like the real kubelet.

pub mod cgroup_writer;
pub mod cpuset;
mod driver;
pub mod faults;
pub mod layout;
pub mod load;
mod node;
pub mod plan;
mod pods;
pub mod resize;
pub mod static_pods;
pub mod status;
mod tick;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use cgroup_writer::WriteMode;
pub use cpuset::StaticCpuManager;
pub use faults::Fault;
pub use layout::{SimLayout, SimQos, SimRuntime};
pub use static_pods::StaticPod;

/// Configuration of one simulated node.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub node_name: String,
    /// Node `allocatable.cpu` (and capacity) in millicores; also the CPU pods can use.
    pub allocatable_cpu_m: u64,
    /// Node `allocatable.memory`, a quantity such as `"8Gi"`.
    pub allocatable_memory: String,
    /// Root of the simulated cgroupfs (the agent's `/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
    pub layout: SimLayout,
    pub runtime: SimRuntime,
    /// CFS period written into every `cpu.max`.
    pub period_us: u64,
    /// Time from a generation bump to the cgroup write.
    pub resize_delay: Duration,
    /// Time from the cgroup write to the status update.
    pub status_delay: Duration,
    /// Load-model step and counter-file update period.
    pub tick: Duration,
    pub write_mode: WriteMode,
    /// Weight of CFS throttling in the PSI stall fraction (see module docs).
    pub throttle_psi_weight: f64,
    /// Node `status.declaredFeatures`. The apiserver (NodeDeclaredFeatures admission,
    /// 1.37) refuses a resize of a pod with pod-level resources unless its node
    /// declares `InPlacePodLevelResourcesVerticalScaling`: "pod update requires
    /// features ... which are not available on node". Empty = an older kubelet.
    pub declared_features: Vec<String>,
    /// `cpuManagerPolicy: static`: exclusive CPUs for Guaranteed containers
    /// with whole-CPU requests, the shared pool for the rest, in the
    /// containers' `cpuset.cpus.effective` ([`cpuset`]). `None`: the
    /// default `none` policy (no cpuset files below the root).
    pub static_cpu_manager: Option<StaticCpuManager>,
    /// Manifests in the kubelet's `staticPodPath`: run from the start, each
    /// with its cgroup named after its config hash and a mirror pod in the
    /// apiserver ([`static_pods`]).
    pub static_pods: Vec<StaticPod>,
}

impl SimConfig {
    /// Defaults: 4 CPUs, 8Gi, kind layout, containerd, period 100000 µs, resize and
    /// status delays 200 ms, tick 100 ms.
    pub fn new(node_name: impl Into<String>, cgroup_root: impl Into<PathBuf>) -> SimConfig {
        SimConfig {
            node_name: node_name.into(),
            allocatable_cpu_m: 4000,
            allocatable_memory: "8Gi".into(),
            cgroup_root: cgroup_root.into(),
            layout: SimLayout::Kind,
            runtime: SimRuntime::Containerd,
            period_us: 100_000,
            resize_delay: Duration::from_millis(200),
            status_delay: Duration::from_millis(200),
            tick: Duration::from_millis(100),
            write_mode: WriteMode::Rename,
            throttle_psi_weight: 0.85,
            declared_features: vec!["InPlacePodLevelResourcesVerticalScaling".into()],
            static_cpu_manager: None,
            static_pods: Vec::new(),
        }
    }
}

/// A pod by namespace and name (ordered by namespace, then name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PodKey {
    pub ns: String,
    pub name: String,
}

impl PodKey {
    pub fn new(ns: &str, name: &str) -> PodKey {
        PodKey {
            ns: ns.to_string(),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for PodKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ns, self.name)
    }
}

/// Demand set by a test for a pod: a pod total and per-container overrides.
#[derive(Debug, Clone, Default)]
pub(crate) struct Demand {
    pub pod_m: f64,
    pub containers: HashMap<String, f64>,
}

/// A running simulated kubelet. Dropping it stops its task; the cgroup files stay.
pub struct SimKubelet {
    shared: Arc<driver::Shared>,
    stop_tx: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl SimKubelet {
    /// Registers the Node, writes the kubepods tree and starts watching pods.
    pub async fn start(client: kube::Client, cfg: SimConfig) -> anyhow::Result<SimKubelet> {
        node::register_node(&client, &cfg)
            .await
            .with_context(|| format!("registering node {}", cfg.node_name))?;
        node::write_node_tree(&cfg)
            .with_context(|| format!("writing kubepods tree in {}", cfg.cgroup_root.display()))?;
        let shared = Arc::new(driver::Shared::new(cfg));
        start_static_pods(&shared)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(driver::run(shared.clone(), client, stop_rx));
        Ok(SimKubelet {
            shared,
            stop_tx,
            task: Some(task),
        })
    }

    /// Creates the Node again (or updates it), as a kubelet restarted after
    /// its Node object was deleted registers it anew. The simulator never
    /// does this by itself: a test deletes and recreates the Node when it wants.
    pub async fn register_node(&self, client: &kube::Client) -> anyhow::Result<()> {
        node::register_node(client, &self.shared.cfg)
            .await
            .with_context(|| format!("registering node {}", self.shared.cfg.node_name))
    }

    pub fn config(&self) -> &SimConfig {
        &self.shared.cfg
    }

    fn state(&self) -> MutexGuard<'_, driver::State> {
        self.shared.lock()
    }

    /// Sets a pod's total CPU demand, split evenly over its running containers.
    /// May be called before the pod exists.
    pub fn set_demand(&self, ns: &str, name: &str, millicores: u64) {
        self.state()
            .demands
            .entry(PodKey::new(ns, name))
            .or_default()
            .pod_m = millicores as f64;
    }

    /// Sets one container's demand; it overrides that container's even share.
    pub fn set_container_demand(&self, ns: &str, name: &str, container: &str, millicores: u64) {
        self.state()
            .demands
            .entry(PodKey::new(ns, name))
            .or_default()
            .containers
            .insert(container.to_string(), millicores as f64);
    }

    /// The name of static pod `name` (its manifest's `metadata.name`) and
    /// of its mirror pod on this node: `<name>-<node>`.
    pub fn static_pod_name(&self, name: &str) -> String {
        static_pods::mirror_name(name, &self.shared.cfg.node_name)
    }

    /// The config hash of static pod `ns`/`name` (the mirror's name), which
    /// names its cgroup; `None` if it is not a static pod of this node.
    pub fn config_hash(&self, ns: &str, name: &str) -> Option<String> {
        self.state()
            .statics
            .get(&PodKey::new(ns, name))
            .map(|s| s.defaulted.hash.clone())
    }

    /// Makes a pod cede `share` (0–1) of the CPU the fluid model grants it
    /// to other pods that want more, while the node has no idle CPU: it
    /// waits (`cpu.pressure` `full`) though within its weight's share. The
    /// real kernel shows such waits beside a many-threaded burster
    /// ([`load::cede`]); the fluid model alone never does.
    pub fn set_cede(&self, ns: &str, name: &str, share: f64) {
        self.state()
            .cede
            .insert(PodKey::new(ns, name), share.clamp(0.0, 1.0));
    }

    /// Switches a pod's fault mode (may be called before the pod exists).
    pub fn set_fault(&self, ns: &str, name: &str, fault: Fault) {
        self.state().faults.insert(PodKey::new(ns, name), fault);
    }

    /// Writes `value` (e.g. `"20000 100000"`) into the `cpu.max` of the pod cgroup
    /// (`container` None) or of a container, as someone other than the kubelet would.
    pub fn write_cpu_max_out_of_band(
        &self,
        ns: &str,
        name: &str,
        container: Option<&str>,
        value: &str,
    ) -> anyhow::Result<()> {
        let dir = match container {
            Some(c) => self.container_cgroup_path(ns, name, c),
            None => self.pod_cgroup_path(ns, name),
        }
        .with_context(|| format!("no cgroup for {ns}/{name} {container:?}"))?;
        let content = format!("{}\n", value.trim_end());
        cgroup_writer::write_setting(&dir, "cpu.max", &content, self.shared.cfg.write_mode)
            .with_context(|| format!("writing {}", dir.display()))
    }

    /// Sets `cpu.max` on kubepods, as an operator capping the node would.
    pub fn write_kubepods_cpu_max(&self, value: &str) -> anyhow::Result<()> {
        let dir = self.kubepods_path();
        let content = format!("{}\n", value.trim_end());
        cgroup_writer::write_setting(&dir, "cpu.max", &content, self.shared.cfg.write_mode)
            .with_context(|| format!("writing {}", dir.display()))
    }

    /// Absolute path of the node-allocatable cgroup.
    pub fn kubepods_path(&self) -> PathBuf {
        let cfg = &self.shared.cfg;
        cfg.cgroup_root.join(cfg.layout.kubepods_dir())
    }

    /// Absolute path of a pod's cgroup, once the simulator has created it.
    pub fn pod_cgroup_path(&self, ns: &str, name: &str) -> Option<PathBuf> {
        self.state()
            .pods
            .get(&PodKey::new(ns, name))
            .map(|p| p.dir.clone())
    }

    /// Absolute path of a running container's cgroup.
    pub fn container_cgroup_path(&self, ns: &str, name: &str, container: &str) -> Option<PathBuf> {
        let st = self.state();
        let pod = st.pods.get(&PodKey::new(ns, name))?;
        pod.ids
            .get(container)
            .map(|id| pod.container_dir(&self.shared.cfg, id))
    }

    /// Absolute path of the pause (sandbox) container's cgroup.
    pub fn pause_cgroup_path(&self, ns: &str, name: &str) -> Option<PathBuf> {
        let st = self.state();
        let pod = st.pods.get(&PodKey::new(ns, name))?;
        Some(pod.container_dir(&self.shared.cfg, &pod.pause_id))
    }

    /// Container name → raw container id, for pods the simulator runs.
    pub fn container_ids(&self, ns: &str, name: &str) -> Option<BTreeMap<String, String>> {
        self.state()
            .pods
            .get(&PodKey::new(ns, name))
            .map(|p| p.ids.clone())
    }

    /// Stops the watch and tick task and waits for it.
    pub async fn stop(mut self) {
        let _ = self.stop_tx.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Runs the static pods of the config at once, as the kubelet does from its
/// `staticPodPath` before (and whether or not) the apiserver answers; their
/// mirror pods are created by the task.
fn start_static_pods(shared: &driver::Shared) -> anyhow::Result<()> {
    let cfg = &shared.cfg;
    let mut st = shared.lock();
    for sp in &cfg.static_pods {
        let d = static_pods::defaulted(sp, &cfg.node_name)?;
        let plan =
            plan::PodPlan::from_pod(&d.pod).with_context(|| format!("static pod {}", sp.path))?;
        pods::start_pod(cfg, &mut st, d.key.clone(), d.hash.clone(), plan, 1);
        st.statics.insert(
            d.key.clone(),
            static_pods::StaticState {
                defaulted: d,
                mirror_uid: None,
                create_mirror: true,
            },
        );
    }
    Ok(())
}

impl Drop for SimKubelet {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
