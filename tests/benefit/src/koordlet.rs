//! Configuration (k) of the benefit bench: Koordinator's koordlet with CPU
//! Burst `auto` (docs/benefit.md, "The peer: Koordinator's koordlet").
//! The pure parts: the NodeSLO the bench writes, the burst koordlet sets,
//! its log's quota writes, and the rule that a (k) run in which koordlet
//! wrote nothing to the service's cgroups while the service was throttled
//! measured nothing ([`refusal`]).
//!
//! koordlet's `auto` policy, every second
//! (`pkg/koordlet/qosmanager/plugins/cpuburst/cpu_burst.go`, v1.8.0): sets
//! each container's `cpu.max.burst` to limit × `cpuBurstPercent` (the pod's
//! to the sum), and scales the container's and the pod's `cpu.max` quota by
//! 1.2 while the container was throttled and the node's shared pool is idle,
//! by 0.8 while it is above `sharePoolThresholdPercent`, between the
//! limit's quota and limit × `cfsQuotaBurstPercent`. A quota change is
//! logged (klog, level 0):
//!
//! `I1207 18:04:54.347115    1234 cpu_burst.go:399] scale container
//! benefit-svc-0/svc/app cfs quota success, operation cfsScaleUp, current
//! cfs 30000, target cfs 36000`
//!
//! A burst write is logged only at `-v=5`.

use serde_json::{Value, json};

/// The version the bench runs (tests/koordlet/build.sh builds it).
pub const VERSION: &str = "v1.8.0";

/// koordlet's documented defaults (`pkg/util/sloconfig`, v1.8.0).
pub const CPU_BURST_PERCENT_DEFAULT: u64 = 1000;
pub const CFS_QUOTA_BURST_PERCENT_DEFAULT: u64 = 300;
pub const SHARE_POOL_THRESHOLD_PERCENT_DEFAULT: u64 = 50;

/// The flags the bench runs koordlet with (besides the kubeconfig): CPU
/// Burst alone, host paths (the unit runs on the node, not in a pod), no
/// NodeMetric reports (no koord-manager reads them).
pub fn flags() -> Vec<String> {
    [
        "--feature-gates=AllAlpha=false,AllBeta=false,CPUBurst=true",
        "--cgroup-root-dir=/sys/fs/cgroup/",
        "--tsdb-path=/var/lib/koordlet/tsdb/",
        "--prediction-checkpoint-filepath=/var/lib/koordlet/prediction-checkpoints",
        "--runtime-hooks-addr=/var/run/koordlet/koordlet.sock",
        "--enable-node-metric-report=false",
        "--addr=:9316",
    ]
    .map(String::from)
    .to_vec()
}

/// `cpu.max.burst` (µs a 100 ms period) koordlet writes on a container
/// with `limit_m` at `percent`: limit × percent of the 100 ms period.
pub fn burst_us(limit_m: u64, percent: u64) -> u64 {
    limit_m * percent
}

/// The highest `cpuBurstPercent` whose burst the kernel accepts beside a
/// quota of `quota_us` (cgroup v2 refuses a burst above the quota, EINVAL:
/// koordinator#2326): ⌊quota / limit⌋ (100 for a 300m limit's 30000 µs).
pub fn highest_accepted_percent(limit_m: u64, quota_us: u64) -> u64 {
    quota_us / limit_m.max(1)
}

/// The hand-written NodeSLO named after the node (no koord-manager):
/// `cpuBurstStrategy` `auto` with koordlet's defaults but `percent`.
pub fn node_slo(node: &str, percent: u64) -> Value {
    json!({
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": node},
        "spec": {"cpuBurstStrategy": {
            "policy": "auto",
            "cpuBurstPercent": percent,
            "cfsQuotaBurstPercent": CFS_QUOTA_BURST_PERCENT_DEFAULT,
            "cfsQuotaBurstPeriodSeconds": -1,
            "sharePoolThresholdPercent": SHARE_POOL_THRESHOLD_PERCENT_DEFAULT,
        }}
    })
}

/// The namespace `config/default` puts koordlet in, and its ServiceAccount.
pub const NAMESPACE: &str = "koordinator-system";
pub const SERVICE_ACCOUNT: &str = "koord-koordlet";

/// koordlet's RBAC (`config/rbac/koordlet.yaml`, parsed) as
/// `config/default` installs it: the ServiceAccount in
/// `koordinator-system`, every name prefixed `koord-`; the Namespace first.
pub fn rbac(docs: Vec<Value>) -> Vec<Value> {
    let mut objs = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE}})];
    for mut o in docs {
        let name = o["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        o["metadata"]["name"] = json!(format!("koord-{name}"));
        match o["kind"].as_str() {
            Some("ServiceAccount") => o["metadata"]["namespace"] = json!(NAMESPACE),
            Some("ClusterRoleBinding") => {
                let role = o["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                o["roleRef"]["name"] = json!(format!("koord-{role}"));
                o["subjects"] = json!([{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                    "namespace": NAMESPACE}]);
            }
            _ => {}
        }
        objs.push(o);
    }
    objs
}

/// One `scale container … cfs quota success` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaWrite {
    /// `namespace/pod/container`.
    pub container: String,
    /// `cfsScaleUp`, `cfsScaleDown`, `cfsReset`.
    pub operation: String,
    pub from_us: u64,
    pub to_us: u64,
}

impl QuotaWrite {
    /// Whether it wrote pod `name`'s container (any namespace).
    pub fn of_pod(&self, name: &str) -> bool {
        self.container.split('/').nth(1) == Some(name)
    }
}

/// koordlet's quota writes in its log (journal lines, klog's format).
pub fn quota_writes(log: &str) -> Vec<QuotaWrite> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split_once("scale container ")?.1;
            let (container, rest) = rest.split_once(" cfs quota success, operation ")?;
            let (operation, rest) = rest.split_once(", current cfs ")?;
            let (from, to) = rest.split_once(", target cfs ")?;
            Some(QuotaWrite {
                container: container.to_string(),
                operation: operation.to_string(),
                from_us: from.trim().parse().ok()?,
                to_us: to.split_whitespace().next()?.parse().ok()?,
            })
        })
        .collect()
}

/// What koordlet wrote to the service's cgroups in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Writes {
    /// Samples of the run (every 0.5 s) in which the container's `cpu.max`
    /// quota was above its limit's.
    pub samples_above_limit: usize,
    /// The container's `cpu.max.burst` at the run's end (koordlet rewrites
    /// it every second; the bench set it to 0 before koordlet started).
    pub container_burst_us: u64,
    /// The pod's.
    pub pod_burst_us: u64,
    /// `scale container … cfs quota success` lines of the service.
    pub log_quota_writes: usize,
}

impl Writes {
    pub fn wrote_anything(&self) -> bool {
        self.samples_above_limit > 0
            || self.container_burst_us > 0
            || self.pod_burst_us > 0
            || self.log_quota_writes > 0
    }
}

/// Throttled seconds below which the service counts as never throttled.
pub const THROTTLED_MIN_S: f64 = 0.1;

/// Why a (k) run measured nothing: koordlet wrote nothing to the service's
/// cgroups although the service was throttled for `throttled_s` (its
/// container's `cpu.stat` over the run). `None`: it wrote, or there was
/// nothing to write for.
pub fn refusal(throttled_s: f64, w: &Writes) -> Option<String> {
    (throttled_s >= THROTTLED_MIN_S && !w.wrote_anything()).then(|| {
        format!(
            "koordlet wrote nothing to the service's cgroups although it was throttled for \
             {throttled_s:.1} s: cpu.max never above the limit in the samples, cpu.max.burst 0 \
             (container and pod) at the end, no `cfs quota success` line"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_and_the_highest_percent_the_kernel_takes() {
        // The default 1000 % of a 300m limit: 300 ms a 100 ms period, ten
        // times the 30 ms quota.
        assert_eq!(burst_us(300, CPU_BURST_PERCENT_DEFAULT), 300_000);
        assert_eq!(highest_accepted_percent(300, 30_000), 100);
        assert_eq!(burst_us(300, highest_accepted_percent(300, 30_000)), 30_000);
        assert_eq!(highest_accepted_percent(300, 29_999), 99);
    }

    #[test]
    fn node_slo_is_named_after_the_node_with_auto() {
        let s = node_slo("node-systemd", 100);
        assert_eq!(s["metadata"]["name"], "node-systemd");
        let c = &s["spec"]["cpuBurstStrategy"];
        assert_eq!(c["policy"], "auto");
        assert_eq!(c["cpuBurstPercent"], 100);
        assert_eq!(c["cfsQuotaBurstPercent"], 300);
        assert_eq!(c["sharePoolThresholdPercent"], 50);
    }

    #[test]
    fn flags_run_cpu_burst_alone_with_real_paths() {
        let f = flags();
        assert!(f.contains(&"--feature-gates=AllAlpha=false,AllBeta=false,CPUBurst=true".into()));
        for p in [
            "--cgroup-root-dir=",
            "--tsdb-path=",
            "--prediction-checkpoint-filepath=",
        ] {
            let v = f.iter().find_map(|x| x.strip_prefix(p)).unwrap();
            assert!(v.starts_with('/') && !v.starts_with("/host-"), "{p}{v}");
        }
    }

    #[test]
    fn rbac_as_config_default_installs_it() {
        let docs = vec![
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"namespace": "system", "name": "koordlet"}}),
            json!({"kind": "ClusterRole", "metadata": {"name": "koordlet-role"}}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "koordlet-rolebinding"},
                "roleRef": {"kind": "ClusterRole", "name": "koordlet-role"},
                "subjects": [{"kind": "ServiceAccount", "name": "koordlet", "namespace": "system"}]}),
        ];
        let o = rbac(docs);
        assert_eq!(o[0]["kind"], "Namespace");
        assert_eq!(o[0]["metadata"]["name"], NAMESPACE);
        assert_eq!(o[1]["metadata"]["name"], SERVICE_ACCOUNT);
        assert_eq!(o[1]["metadata"]["namespace"], NAMESPACE);
        assert_eq!(o[2]["metadata"]["name"], "koord-koordlet-role");
        assert_eq!(o[3]["roleRef"]["name"], "koord-koordlet-role");
        assert_eq!(o[3]["subjects"][0]["name"], SERVICE_ACCOUNT);
        assert_eq!(o[3]["subjects"][0]["namespace"], NAMESPACE);
    }

    #[test]
    fn quota_writes_parse_klog_lines() {
        let log = "\
I1207 18:04:53.100000    1234 cpu_burst.go:210] node is in nodeBurstIdle state\n\
I1207 18:04:54.347115    1234 cpu_burst.go:399] scale container benefit-svc-0/svc/app cfs quota success, operation cfsScaleUp, current cfs 30000, target cfs 36000\n\
I1207 18:04:55.347115    1234 cpu_burst.go:399] scale container benefit-svc-0/svc2/app cfs quota success, operation cfsScaleDown, current cfs 43200, target cfs 34560\n\
I1207 18:04:56.0    1234 cpu_burst.go:399] scale container x/y/z cfs quota success, operation cfsScaleUp, current cfs ?, target cfs 1\n";
        let w = quota_writes(log);
        assert_eq!(w.len(), 2);
        assert_eq!(
            w[0],
            QuotaWrite {
                container: "benefit-svc-0/svc/app".into(),
                operation: "cfsScaleUp".into(),
                from_us: 30_000,
                to_us: 36_000,
            }
        );
        assert!(w[0].of_pod("svc") && !w[0].of_pod("svc2") && w[1].of_pod("svc2"));
        assert_eq!(w[1].to_us, 34_560);
    }

    #[test]
    fn a_throttled_service_koordlet_never_wrote_fails_the_run() {
        let nothing = Writes::default();
        let why = refusal(12.5, &nothing).expect("wrote nothing while throttled");
        assert!(why.contains("12.5 s"), "{why}");
        // Not throttled: nothing to write for.
        assert_eq!(refusal(0.0, &nothing), None);
        assert_eq!(refusal(THROTTLED_MIN_S / 2.0, &nothing), None);
        // Any write counts: the quota in the samples, either burst, the log.
        for w in [
            Writes {
                samples_above_limit: 1,
                ..nothing
            },
            Writes {
                container_burst_us: 30_000,
                ..nothing
            },
            Writes {
                pod_burst_us: 30_000,
                ..nothing
            },
            Writes {
                log_quota_writes: 1,
                ..nothing
            },
        ] {
            assert_eq!(refusal(12.5, &w), None, "{w:?}");
        }
    }
}
