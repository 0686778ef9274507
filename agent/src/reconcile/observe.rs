//! Observe: this node's pods from the watch cache, the cgroup tree (a full
//! scan on the audit interval, on inotify events and for pods not seen yet;
//! otherwise a light rescan), and the node's slack between two snapshots.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Agent;
use crate::cgroup::{self, CgroupError, NodeSnapshot, ScanError, Scanner};
use crate::kube::events::EventApi;
use crate::kube::pods::PodApi;
use crate::metrics::ScanErrorKind;
use crate::model::{CgroupPodId, PodView, Qos, Uid};
use crate::policy::Eligibility;
use crate::signal::contention::effect::{Claims, Judged};
use crate::signal::contention::{self, Contention, HeldDemand};
use crate::signal::usage::{CapacityInputs, NodeUsage, UsageBasis};
use crate::signal::{self, Signal};

use super::round::Owed;

mod plan;

/// Least time a cgroup scan may take before its tick counts as failed
/// (the tick period, if longer). A scan is milliseconds; this is a hang.
const MIN_SCAN_DEADLINE: Duration = Duration::from_secs(2);

/// Why a tick read no usable snapshot.
#[derive(Debug, thiserror::Error)]
pub enum TickError {
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error("cgroup scan still running after {0:?}")]
    Timeout(Duration),
    #[error("cgroup scan task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl TickError {
    pub fn kind(&self) -> ScanErrorKind {
        match self {
            TickError::Scan(_) => ScanErrorKind::kubepods,
            TickError::Timeout(_) => ScanErrorKind::timeout,
            TickError::Join(_) => ScanErrorKind::io,
        }
    }
}

type ScanTask = tokio::task::JoinHandle<Result<NodeSnapshot, ScanError>>;

/// What observing remembers between ticks.
pub(super) struct ScanState {
    /// Last tick's snapshot: rates are measured against it.
    pub prev: Option<NodeSnapshot>,
    /// CPU owed to pods short of it within their requests that no lowering
    /// was made for yet, held across ticks.
    pub held: HeldDemand,
    /// The lowerings made for pods short of CPU, each checked once applied.
    pub claims: Claims,
    /// The last interval's attribution: a marginal wait counts only when it
    /// shows twice in a row (`contention::attribute`).
    pub earlier: Contention,
    /// The attribution of the interval before `earlier`: a claim opened
    /// this tick takes the owed pod's sample from it (its before window).
    pub before_earlier: Contention,
    /// Last full scan: where every pod's cgroup is (shared with the scan
    /// task on the blocking pool).
    pub index: Option<Arc<NodeSnapshot>>,
    /// The pods `index` holds, by cgroup id.
    index_ids: HashSet<CgroupPodId>,
    /// A scan that outlived its tick's deadline: no second one is started
    /// while it runs.
    stuck: Option<ScanTask>,
    /// Whether the last tick read a usable snapshot (for `/readyz`).
    pub last_tick_ok: bool,
    /// Issues logged at warn level last time, so a standing problem is not
    /// logged every tick.
    logged_issues: Vec<String>,
    last_audit: Option<Duration>,
    pub audit_requested: bool,
    /// Pods that could not be read as a PodView: uid → resourceVersion logged.
    pub unreadable: HashMap<Uid, String>,
    /// This node's pods as views, kept from tick to tick, and the list
    /// `unreadable` goes with.
    views: crate::kube::view::Views,
    views_last: Arc<Vec<PodView>>,
    /// Reads the tree (its buffer and open handles kept across ticks);
    /// shared with the scan task on the blocking pool.
    scanner: Option<Arc<Mutex<Scanner>>>,
}

impl ScanState {
    pub fn new() -> Self {
        Self {
            prev: None,
            held: HeldDemand::default(),
            claims: Claims::default(),
            earlier: Contention::default(),
            before_earlier: Contention::default(),
            index: None,
            index_ids: HashSet::new(),
            stuck: None,
            last_tick_ok: true,
            logged_issues: Vec::new(),
            last_audit: None,
            audit_requested: true,
            unreadable: HashMap::new(),
            views: crate::kube::view::Views::default(),
            views_last: Arc::default(),
            scanner: None,
        }
    }

    /// Whether this tick reads every pod's files: on the audit interval and
    /// on request (inotify). A Running pod the index does not know yet is
    /// looked up alone ([`Self::unseen`]), not by a full scan.
    fn wants_full(&self, now: Duration, audit_interval: Duration) -> bool {
        let since = |t: Option<Duration>, d: Duration| t.is_none_or(|t| now.saturating_sub(t) >= d);
        let audit_due = self.audit_requested || since(self.last_audit, audit_interval);
        self.index.is_none() || audit_due
    }

    /// Running pods the index does not know: a light tick (not `full`)
    /// looks each up at its own directory (`Scanner::rescan_finding`).
    fn unseen(&self, views: &[PodView], full: bool) -> Vec<(CgroupPodId, Qos)> {
        if full {
            return Vec::new();
        }
        views
            .iter()
            .filter(|v| v.is_running() && !self.index_ids.contains(&v.cgroup_id))
            .map(|v| (v.cgroup_id.clone(), v.qos))
            .collect()
    }

    /// The index before the light read `cur`; after it, the index holds
    /// the pods `cur` found and not those it saw vanish ([`cgroup::reindex`]).
    fn reindex(&mut self, cur: &NodeSnapshot) -> Option<Arc<NodeSnapshot>> {
        let older = self.index.clone();
        let known = |id: &CgroupPodId| self.index_ids.contains(id);
        if let Some(next) = older
            .as_deref()
            .and_then(|i| cgroup::reindex(i, cur, known))
        {
            self.index_ids = next.pods.iter().map(|p| p.id.clone()).collect();
            self.index = Some(Arc::new(next));
        }
        older
    }

    /// The tick is done with `cur`: the next one measures against it. A
    /// full scan was an audit.
    pub fn finish(&mut self, cur: NodeSnapshot, full: bool, now: Duration) {
        if full {
            self.audit_requested = false;
            self.last_audit = Some(now);
        }
        self.prev = Some(cur);
    }
}

/// One tick's observations.
pub(super) struct Observation {
    pub views: Arc<Vec<PodView>>,
    /// Each view's eligibility this tick, asked once ([`Eligibility::of`]).
    pub eligible: Eligibility,
    pub cur: NodeSnapshot,
    pub slack: NodeUsage,
    /// Who waited for CPU this interval.
    pub contention: Contention,
    /// What managed pods give back for it, held across ticks, and for how
    /// many pods no lowering was made yet.
    pub owed: Owed,
    /// Lowerings whose effect was judged this interval.
    pub judged: Vec<Judged>,
    /// Whether `cur` is a full scan (every pod, every file).
    pub full: bool,
}

impl<P: PodApi, E: EventApi> Agent<P, E> {
    /// Reads pods and cgroups. `None` when there is nothing to decide on:
    /// the scan failed, this is the first sample, or kubepods' counter reset.
    pub(super) async fn observe(&mut self, now: Duration) -> Option<Observation> {
        let t_scan = Instant::now();
        let views = self.views();
        let full = self.scan.wants_full(now, self.settings.audit_interval);
        let opted = self.caches.opted_in_namespaces();
        let eligible = Eligibility::of(
            &views,
            &self.settings.node_name,
            &opted,
            self.pod_level.supported,
            crate::policy::writers::wall_clock_s(),
        );
        let managed = contention::managed(&views, &eligible);
        let (mut snap, older) = self.read_snapshot(now, full, &views, &managed).await?;
        signal::mark_roles(&mut snap.pods, &views);
        self.metrics
            .scan_duration
            .observe(t_scan.elapsed().as_secs_f64());
        let Some(prev) = self.scan.prev.take() else {
            self.scan.prev = Some(snap);
            return None; // first sample: no rates yet
        };
        let pool = self.shared_pool(&snap).await;
        let cap = CapacityInputs {
            node_allocatable_m: self.allocatable_m(),
            online_cpus: self.online_cpus,
            shared_pool_cpus: pool,
        };
        let Signal {
            usage: slack,
            contention,
        } = signal::between(
            &prev,
            &snap,
            &views,
            &managed,
            signal::Inputs {
                capacity: cap,
                thresholds: self.thresholds(),
                earlier: &self.scan.earlier,
                older: older.as_deref(),
            },
        );
        drop(older);
        if slack.usage_basis != UsageBasis::Kubepods {
            // kubepods' counter went backwards (or time did not advance): the
            // interval's usage is unknown, and reading it as 0 would hand out
            // the whole node as slack. Skip it; the next interval is clean.
            self.metrics.scan_error(ScanErrorKind::counter_reset);
            tracing::warn!(basis = ?slack.usage_basis, "kubepods usage_usec went backwards; skipping this interval's usage");
            self.scan.prev = Some(snap);
            self.scan.earlier = Contention::default();
            return None;
        }
        log_displaced(&contention, slack.interval_us);
        drop(managed);
        self.scan.before_earlier = std::mem::replace(&mut self.scan.earlier, contention.clone());
        let judged = self.step_claims(now, &views, (&prev, &snap), &slack, &contention);
        drop(prev);
        let (fresh_m, fresh_pods) = self.scan.claims.fresh(&contention);
        let demand_m = self.scan.held.update(
            fresh_m,
            slack.interval_us,
            self.settings.policy.contention_window_s,
        );
        Some(Observation {
            views,
            eligible,
            cur: snap,
            slack,
            contention,
            owed: Owed {
                demand_m,
                fresh_pods,
            },
            judged,
            full,
        })
    }

    /// Reads this tick's snapshot (`full`: every pod, every file; else what
    /// `read_plan` asks), and the last full scan before it: the usage of
    /// a pod the previous tick did not read is measured since then. `None`
    /// when the read failed (counted and logged).
    async fn read_snapshot(
        &mut self,
        now: Duration,
        full: bool,
        views: &[PodView],
        managed: &HashSet<&CgroupPodId>,
    ) -> Option<(NodeSnapshot, Option<Arc<NodeSnapshot>>)> {
        // Pods a lowering was made for are read every tick, usage and
        // pressure whatever the gate, while it is checked and held: their
        // usage and wait are its effect, and an interval not read would
        // read as no wait at all.
        let claimed: Vec<CgroupPodId> = self.scan.claims.watched().cloned().collect();
        let claimed: HashSet<&CgroupPodId> = claimed.iter().collect();
        // Pods with a resize in flight are read in full (`read_plan`).
        let resizing: HashSet<&CgroupPodId> = views
            .iter()
            .filter(|v| {
                self.records
                    .get(&v.uid)
                    .is_some_and(|r| r.resize().is_some())
            })
            .map(|v| &v.cgroup_id)
            .collect();
        let snap = match self
            .read_tree(
                full,
                now.as_micros() as u64,
                managed,
                &claimed,
                &resizing,
                self.scan.unseen(views, full),
            )
            .await
        {
            Ok(s) => s,
            Err(e) => {
                self.scan.last_tick_ok = false;
                self.metrics.scan_error(e.kind());
                tracing::error!(error = %e, "cgroup scan failed; skipping this tick");
                return None;
            }
        };
        self.scan.last_tick_ok = true;
        self.report_issues(&snap);
        // The last full scan before this tick: the usage of a pod the
        // previous tick did not read is measured since then.
        let older = if full {
            self.scan.index_ids = snap.pods.iter().map(|p| p.id.clone()).collect();
            self.scan.index.replace(Arc::new(snap.clone()))
        } else {
            self.scan.reindex(&snap)
        };
        Some((snap, older))
    }

    /// CPUs of the shared pool Burstable pods run on ([`crate::signal::shared_pool`]),
    /// read on the blocking pool (a hung filesystem must not stall the
    /// runtime thread); `None` when unread, and then nothing narrows capacity.
    /// Skipped cpusets are logged and counted, never fatal.
    async fn shared_pool(&self, snap: &NodeSnapshot) -> Option<u64> {
        use crate::signal::shared_pool;
        let paths = shared_pool::candidates(snap);
        if paths.is_empty() {
            return None;
        }
        let root = self.settings.cgroup_root.clone();
        let task = tokio::task::spawn_blocking(move || shared_pool::read_paths(&root, paths));
        let Ok(Ok(pool)) = tokio::time::timeout(MIN_SCAN_DEADLINE, task).await else {
            self.metrics.scan_error(ScanErrorKind::timeout);
            tracing::warn!("reading the shared CPU pool timed out; capacity not narrowed");
            return None;
        };
        let pool = pool?;
        for s in &pool.skipped {
            if matches!(s.error, CgroupError::Vanished(_)) {
                continue; // churn: the container went away since the scan
            }
            let kind = ScanErrorKind::of(&s.error);
            self.metrics.scan_error(kind);
            tracing::warn!(path = %s.path.display(), "{}; left out of the shared CPU pool", s.why);
        }
        self.metrics.node_shared_pool_cpus.set(pool.cpus as f64);
        Some(pool.cpus)
    }

    /// What a wait must reach to be owed, on this node.
    fn thresholds(&self) -> contention::Thresholds {
        contention::Thresholds {
            min_pct_of_request: self.settings.policy.pressure_start_pct,
            cpus: self.online_cpus,
            reserve_m: self.settings.policy.reserve_m,
        }
    }

    /// Counts every read error of the snapshot; logs them when they change.
    fn report_issues(&mut self, snap: &NodeSnapshot) {
        for e in &snap.issues {
            self.metrics.scan_error(ScanErrorKind::of(e));
        }
        let now: Vec<String> = snap.issues.iter().map(ToString::to_string).collect();
        if now != self.scan.logged_issues {
            for e in &now {
                tracing::warn!(error = %e, "cgroup read error");
            }
            for q in &snap.unlisted_qos {
                tracing::warn!(
                    qos = q.as_str(),
                    "QoS cgroup not listable: its pods are unknown this scan (not counted as gone or drifting)"
                );
            }
            self.scan.logged_issues = now;
        }
    }

    /// Pods of this node as views (kept from tick to tick: a pod is read
    /// again only when its resourceVersion changed); pods that cannot be
    /// read are skipped and logged (never fatal).
    fn views(&mut self) -> Arc<Vec<PodView>> {
        let mut unreadable = HashMap::new();
        let known = &self.scan.unreadable;
        // The field selector already scopes the watch; the node filter
        // guards the invariant that no other node's pod is ever considered.
        let views = self.scan.views.refresh(
            &self.caches.pods(),
            &self.settings.node_name,
            |p, e| {
                // Logged once per version of the pod, counted every tick.
                let uid = Uid::from(p.metadata.uid.clone().unwrap_or_default());
                let rv = p.metadata.resource_version.clone().unwrap_or_default();
                if known.get(&uid) != Some(&rv) {
                    tracing::warn!(pod = ?p.metadata.name, error = %e, "skipping unreadable pod");
                }
                unreadable.insert(uid, rv);
            },
        );
        // A list handed out again has last time's unreadable pods.
        if !Arc::ptr_eq(&views, &self.scan.views_last) {
            self.scan.unreadable = unreadable;
            self.scan.views_last = Arc::clone(&views);
        }
        views
    }
}

/// Logs each pod that waited this interval (debug).
fn log_displaced(contention: &Contention, interval_us: u64) {
    for d in &contention.displaced {
        tracing::debug!(
            pod = %d.id,
            interval_us,
            waited_us = d.waited_us,
            throttled_us = d.throttled_us,
            displaced_m = d.displaced_m,
            usage_m = d.usage_m,
            request_m = d.request_m,
            owed_m = d.deficit_m,
            "pod displaced"
        );
    }
}
