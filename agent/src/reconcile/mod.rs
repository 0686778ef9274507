//! The reconciler: one tick = observe (scan cgroups, measure slack) →
//! decide (pure policy) → act (resize patches) → verify (re-read cpu.max of
//! patched pods; audit every pod for drift). All I/O of a tick is here; the
//! rules live in `policy`, `verify` and [`memory`].

pub mod memory;
pub mod round;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use crate::cgroup::{self, Depth, Layout, NodeSnapshot, PodCgroup, ScanError};
use crate::kube::classify::{Outcome, Refusal};
use crate::kube::events::{
    EventSink, REASON_DRIFT, REASON_DRIFT_CLEARED, REASON_REFUSED, REASON_RESIZED,
};
use crate::kube::patch::{ContainerLimit, LimitChange};
use crate::kube::resize;
use crate::kube::watch::Caches;
use crate::metrics::{self, Metrics, ResizeResult, ScanErrorKind};
use crate::model::{ContainerKind, DeclaredLimits, Millis, PodView, Qos};
use crate::policy::{Direction, PatchKind, PatchPlan, PolicyConfig, TokenBucket, Unmanaged};
use crate::slack::{self, CapacityInputs, ContentionAverage, NodeSlack, UsageBasis};
use crate::verify::{self, DriftEvent, DriftTracker, ResizeOutcome, ResizeTracker};

use memory::Memory;
pub use round::{Round, observe_round};

/// Wait before reading an owner's pod template again after a failure.
const TEMPLATE_RETRY: Duration = Duration::from_secs(300);
/// Owner templates read per tick at most (a restart on a full node must not
/// burst the apiserver).
const TEMPLATES_PER_TICK: usize = 5;

/// Minimum time between full scans triggered by a pod whose cgroup is not
/// known yet (a Running pod without a cgroup must not force one every tick).
const NEW_POD_RESCAN: Duration = Duration::from_secs(2);

/// Wait before asking again after an inconclusive pod-level probe.
const PROBE_RETRY: Duration = Duration::from_secs(30);

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

/// Settings of the `run` loop (flags of `headroom-agent run`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub node_name: String,
    pub cgroup_root: PathBuf,
    pub tick: Duration,
    pub dry_run: bool,
    pub policy: PolicyConfig,
    /// Fallback allocatable when the Node is not cached yet.
    pub node_allocatable_m: Option<Millis>,
    pub audit_interval: Duration,
    pub drift_grace: Duration,
    pub event_interval: Duration,
}

/// The agent's state across ticks.
pub struct Agent {
    pub settings: Settings,
    pub layout: Layout,
    caches: Caches,
    api: Api<Pod>,
    events: EventSink,
    pub metrics: Arc<Metrics>,
    memory: Memory,
    bucket: TokenBucket,
    drift: DriftTracker,
    resizes: ResizeTracker,
    /// Direction of each in-flight resize, for the verified/unverified metric.
    inflight_dir: HashMap<String, Direction>,
    prev: Option<NodeSnapshot>,
    /// kubepods contention (stall minus throttling), smoothed across ticks.
    contention: ContentionAverage,
    /// Last full scan: where every pod's cgroup is (shared with the scan
    /// task on the blocking pool).
    index: Option<Arc<NodeSnapshot>>,
    /// A scan that outlived its tick's deadline: no second one is started
    /// while it runs.
    stuck_scan: Option<ScanTask>,
    /// Whether the last tick read a usable snapshot (for `/readyz`).
    last_tick_ok: bool,
    /// Issues logged at warn level last time, so a standing problem is not
    /// logged every tick.
    logged_issues: Vec<String>,
    index_uids: HashSet<String>,
    last_full: Option<Duration>,
    last_audit: Option<Duration>,
    audit_requested: bool,
    pod_level_supported: Option<bool>,
    /// Pods that could not be read as a PodView: uid → resourceVersion logged.
    unreadable: HashMap<String, String>,
    next_probe: Option<Duration>,
    /// Declared limits of owners' pod templates, by owner uid.
    templates: HashMap<String, DeclaredLimits>,
    /// Owners whose template could not be read: when to try again.
    template_retry: HashMap<String, Duration>,
    started: Instant,
    online_cpus: u64,
    rng: u64,
}

impl Agent {
    pub fn new(
        settings: Settings,
        layout: Layout,
        caches: Caches,
        client: kube::Client,
        metrics: Arc<Metrics>,
    ) -> Self {
        let events = EventSink::new(client.clone(), &settings.node_name, settings.event_interval);
        let bucket = TokenBucket::from_config(&settings.policy);
        let drift = DriftTracker::new(settings.drift_grace);
        let resizes = ResizeTracker::new(settings.drift_grace);
        Self {
            layout,
            caches,
            api: Api::all(client),
            events,
            metrics,
            memory: Memory::default(),
            bucket,
            drift,
            resizes,
            inflight_dir: HashMap::new(),
            prev: None,
            contention: ContentionAverage::default(),
            index: None,
            stuck_scan: None,
            last_tick_ok: true,
            logged_issues: Vec::new(),
            index_uids: HashSet::new(),
            last_full: None,
            last_audit: None,
            audit_requested: true,
            pod_level_supported: None,
            unreadable: HashMap::new(),
            next_probe: None,
            templates: HashMap::new(),
            template_retry: HashMap::new(),
            started: Instant::now(),
            online_cpus: slack::online_cpus_at(&settings.cgroup_root),
            rng: 0x9E37_79B9_7F4A_7C15 ^ std::process::id() as u64,
            settings,
        }
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// xorshift: jitter for backoff, no crate needed.
    fn rand01(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An inotify event (or overflow) asks for an audit at the next tick.
    pub fn request_audit(&mut self) {
        self.audit_requested = true;
    }

    /// The last full scan (for the inotify watch set): a light rescan
    /// leaves out unmanaged pods, whose cpu.max must stay watched too.
    pub fn snapshot(&self) -> Option<&NodeSnapshot> {
        self.index.as_deref().or(self.prev.as_ref())
    }

    /// Whether the last tick read a usable cgroup snapshot.
    pub fn last_tick_ok(&self) -> bool {
        self.last_tick_ok
    }

    /// Runs the scan on the blocking pool: a read that blocks (a hung
    /// filesystem) must not stall the runtime thread that also serves
    /// `/healthz`. A scan past its deadline fails the tick and is left to
    /// finish alone; none is started beside it.
    async fn read_tree(&mut self, full: bool, at_us: u64) -> Result<NodeSnapshot, TickError> {
        let deadline = self.settings.tick.max(MIN_SCAN_DEADLINE);
        if let Some(h) = &self.stuck_scan {
            if !h.is_finished() {
                return Err(TickError::Timeout(deadline));
            }
            self.stuck_scan = None; // its snapshot is stale: read afresh
        }
        let root = self.settings.cgroup_root.clone();
        let layout = self.layout.clone();
        let index = if full { None } else { self.index.clone() };
        let inflight: HashSet<String> = self.inflight_dir.keys().cloned().collect();
        let mut task = tokio::task::spawn_blocking(move || match index {
            // Every Burstable pod's usage is read each tick, not only the
            // managed ones': a pod that turns managed (or leaves a resize)
            // with no usage yet would count its burst as other pods' usage
            // for a tick and make the slack jump. Guaranteed pods too: their
            // throttling is part of the stall that is not contention
            // (`slack::Stall`). BestEffort pods have no quota to throttle.
            Some(index) => cgroup::rescan(&root, &index, at_us, |p| {
                if inflight.contains(&p.uid) {
                    Depth::Full
                } else if p.qos == Qos::BestEffort {
                    Depth::Skip
                } else {
                    Depth::Stat
                }
            }),
            None => cgroup::scan(&root, &layout, at_us),
        });
        match tokio::time::timeout(deadline, &mut task).await {
            Ok(joined) => joined?.map_err(TickError::from),
            Err(_) => {
                self.stuck_scan = Some(task);
                Err(TickError::Timeout(deadline))
            }
        }
    }

    /// Counts every read error of the snapshot; logs them when they change.
    fn report_issues(&mut self, snap: &NodeSnapshot) {
        for e in &snap.issues {
            self.metrics.scan_error(ScanErrorKind::of(e));
        }
        let now: Vec<String> = snap.issues.iter().map(ToString::to_string).collect();
        if now != self.logged_issues {
            for e in &now {
                tracing::warn!(error = %e, "cgroup read error");
            }
            for q in &snap.unlisted_qos {
                tracing::warn!(
                    qos = q.as_str(),
                    "QoS cgroup not listable: its pods are unknown this scan (not counted as gone or drifting)"
                );
            }
            self.logged_issues = now;
        }
    }

    /// Pods of this node as views; pods that cannot be read are skipped
    /// and logged (never fatal).
    fn views(&mut self) -> Vec<PodView> {
        let mut out = Vec::new();
        let mut unreadable = HashMap::new();
        for p in self.caches.pods() {
            // The field selector already scopes the watch; this guards the
            // invariant that no other node's pod is ever considered.
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                != Some(self.settings.node_name.as_str())
            {
                continue;
            }
            match PodView::try_from(p.as_ref()) {
                Ok(v) => out.push(v),
                Err(e) => {
                    // Logged once per version of the pod, counted every tick.
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    let rv = p.metadata.resource_version.clone().unwrap_or_default();
                    if self.unreadable.get(&uid) != Some(&rv) {
                        tracing::warn!(pod = ?p.metadata.name, error = %e, "skipping unreadable pod");
                    }
                    unreadable.insert(uid, rv);
                }
            }
        }
        self.unreadable = unreadable;
        out
    }

    /// One tick. Returns the round for callers that want to show it.
    pub async fn tick(&mut self) -> Option<Round> {
        let now = self.now();
        let t_scan = Instant::now();
        let views = self.views();
        // Full scan (every pod's files and container cpu.max) on the audit
        // interval, on inotify events and for pods not seen yet; otherwise
        // only kubepods, managed pods' cpu.stat and in-flight resizes.
        let audit_due = self.audit_requested
            || self
                .last_audit
                .is_none_or(|t| now.saturating_sub(t) >= self.settings.audit_interval);
        let unseen = views
            .iter()
            .any(|v| v.is_running() && !self.index_uids.contains(&v.uid));
        let full = self.index.is_none()
            || audit_due
            || (unseen
                && self
                    .last_full
                    .is_none_or(|t| now.saturating_sub(t) >= NEW_POD_RESCAN));
        let at_us = now.as_micros() as u64;
        let mut snap = match self.read_tree(full, at_us).await {
            Ok(s) => s,
            Err(e) => {
                self.last_tick_ok = false;
                self.metrics.scan_error(e.kind());
                tracing::error!(error = %e, "cgroup scan failed; skipping this tick");
                return None;
            }
        };
        self.last_tick_ok = true;
        self.report_issues(&snap);
        if full {
            self.last_full = Some(now);
            self.index_uids = snap.pods.iter().map(|p| p.uid.clone()).collect();
            self.index = Some(Arc::new(snap.clone()));
        }
        mark_roles(&mut snap.pods, &views);
        self.metrics
            .scan_duration
            .observe(t_scan.elapsed().as_secs_f64());
        let Some(prev) = self.prev.take() else {
            self.prev = Some(snap);
            return None; // first sample: no rates yet
        };
        let cur = snap;
        let cap = CapacityInputs {
            node_allocatable_m: self
                .caches
                .allocatable_cpu_m()
                .or(self.settings.node_allocatable_m),
            online_cpus: self.online_cpus,
        };
        let slack = slack::measure(&prev, &cur, cap);
        drop(prev);
        if slack.usage_basis != UsageBasis::Kubepods {
            // kubepods' counter went backwards (or time did not advance): the
            // interval's usage is unknown, and reading it as 0 would hand out
            // the whole node as slack. Skip it; the next interval is clean.
            self.metrics.scan_error(ScanErrorKind::counter_reset);
            tracing::warn!(basis = ?slack.usage_basis, "kubepods usage_usec went backwards; skipping this interval's usage");
            self.prev = Some(cur);
            return None;
        }

        self.learn_declared(&views, now).await;
        let t_decide = Instant::now();
        let contention_pct = self
            .contention
            .update(slack.stall.as_ref(), slack.interval_us);
        let opted = self.caches.opted_in_namespaces();
        let round = observe_round(
            &self.settings.node_name,
            &views,
            &slack,
            contention_pct,
            &opted,
            &self.memory.floors,
            &self.memory.declared,
            self.pod_level_supported,
            &self.settings.policy,
        );
        let outcome = crate::policy::plan(
            &round.node,
            &round.decisions,
            &self.memory.patches,
            now.as_secs_f64(),
            &mut self.bucket,
            &self.settings.policy,
        );
        self.metrics
            .decision_duration
            .observe(t_decide.elapsed().as_secs_f64());

        self.probe_pod_level(&views, &round, now).await;
        let by_uid: HashMap<&str, &PodView> = views.iter().map(|v| (v.uid.as_str(), v)).collect();
        for p in &outcome.patches {
            if let Some(view) = by_uid.get(p.uid.as_str()) {
                self.act(view, p, now).await;
            }
        }

        let cur_pods: HashMap<&str, &PodCgroup> =
            cur.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        let events = self.verify_resizes(&views, &cur_pods, now);
        let mut drift_events = Vec::new();
        if full {
            self.audit_requested = false;
            self.last_audit = Some(now);
            for a in verify::audit_snapshot(views.iter(), &cur) {
                drift_events.extend(self.drift.observe_pod(&a.uid, &a.mismatches, now));
            }
        }
        let live: HashSet<&str> = views
            .iter()
            .filter(|v| v.is_running() && !v.terminating)
            .map(|v| v.uid.as_str())
            .collect();
        drift_events.extend(self.drift.retain(|u| live.contains(u)));
        drop(cur_pods);
        self.prev = Some(cur);
        for ev in events {
            tracing::debug!(?ev, "resize verification");
        }
        self.report_drift(&views, drift_events, now).await;
        self.forget_gone(&views);
        self.export(&views, &slack, &round);
        Some(round)
    }

    /// Learns the limits each Burstable pod's workload declares, so the
    /// default ceiling never falls below them: the pod's own limits while
    /// they are not Headroom's (`managedFields`), else its controller's pod
    /// template (read-only `get`). A pod with neither (no owner, limits set
    /// by an earlier agent) keeps its current limit as the ceiling's lower
    /// bound (`policy::declared_limit`).
    async fn learn_declared(&mut self, views: &[PodView], now: Duration) {
        let mut reads = 0;
        for v in views.iter().filter(|v| v.qos == Qos::Burstable) {
            if !v.limits_set_by_headroom {
                let d = DeclaredLimits::of(v);
                if self.memory.declared.get(&v.uid) != Some(&d) {
                    self.memory.declared.insert(v.uid.clone(), d);
                }
                continue;
            }
            if self.memory.declared.contains_key(&v.uid) {
                continue;
            }
            let Some(owner) = v.owner.as_ref() else {
                continue;
            };
            if let Some(t) = self.templates.get(&owner.uid) {
                self.memory.declared.insert(v.uid.clone(), t.clone());
                continue;
            }
            if reads >= TEMPLATES_PER_TICK
                || self
                    .template_retry
                    .get(&owner.uid)
                    .is_some_and(|t| now < *t)
            {
                continue;
            }
            reads += 1;
            let client = self.api.clone().into_client();
            match crate::kube::owner::template_limits(&client, &v.namespace, owner).await {
                Ok(Some(t)) => {
                    tracing::info!(pod = %v.key(), owner = %format!("{}/{}", owner.kind, owner.name), "declared limits read from the owner's pod template");
                    self.templates.insert(owner.uid.clone(), t.clone());
                    self.memory.declared.insert(v.uid.clone(), t);
                }
                Ok(None) => {
                    self.template_retry
                        .insert(owner.uid.clone(), now + TEMPLATE_RETRY);
                    tracing::info!(pod = %v.key(), owner = %format!("{}/{}", owner.kind, owner.name), "no pod template to read declared limits from; the ceiling stays at least the current limit");
                }
                Err(e) => {
                    self.template_retry
                        .insert(owner.uid.clone(), now + TEMPLATE_RETRY);
                    tracing::warn!(pod = %v.key(), error = %e, retry_s = TEMPLATE_RETRY.as_secs(), "owner's pod template unreadable; the ceiling stays at least the current limit");
                }
            }
        }
        // Templates of owners no pod of this node names any more.
        let owners: HashSet<&str> = views
            .iter()
            .filter_map(|v| v.owner.as_ref().map(|o| o.uid.as_str()))
            .collect();
        self.templates.retain(|u, _| owners.contains(u.as_str()));
        self.template_retry
            .retain(|u, _| owners.contains(u.as_str()));
    }

    /// One `dryRun=All` resize decides pod-level management for the whole
    /// node: the gate is cluster-wide and the declared feature node-wide, so
    /// the answer does not depend on the pod's shape. An inconclusive answer
    /// (RBAC, transport) is retried after [`PROBE_RETRY`], never every tick.
    async fn probe_pod_level(&mut self, views: &[PodView], round: &Round, now: Duration) {
        if self.pod_level_supported.is_some() || self.next_probe.is_some_and(|t| now < t) {
            return;
        }
        let Some(d) = round
            .decisions
            .iter()
            .find(|d| d.reason == Some(Unmanaged::PodLevelUnknown))
        else {
            return;
        };
        let Some(v) = views.iter().find(|v| v.uid == d.uid) else {
            return;
        };
        let pr = v.pod_resources.unwrap_or_default();
        // A value the apiserver can accept: the current pod-level limit, or
        // else the ceiling a pod of this request would get.
        let value = pr
            .cpu_limit
            .unwrap_or_else(|| {
                crate::policy::floors::scale(v.cpu_request(), self.settings.policy.ceiling_factor)
            })
            .max(self.settings.policy.quantum_m);
        let api: Api<Pod> = Api::namespaced(self.api.clone().into_client(), &v.namespace);
        match resize::probe_pod_level(&api, &v.name, value, self.settings.policy.quantum_m).await {
            Some(ok) => {
                tracing::info!(pod = %v.key(), supported = ok, "probed pod-level resize support (dryRun=All)");
                self.pod_level_supported = Some(ok);
            }
            None => {
                self.next_probe = Some(now + PROBE_RETRY);
                tracing::warn!(pod = %v.key(), retry_s = PROBE_RETRY.as_secs(), "pod-level resize probe inconclusive; will retry");
            }
        }
    }

    async fn act(&mut self, view: &PodView, p: &PatchPlan, now: Duration) {
        let dir = metrics_dir(p.direction);
        if self.settings.dry_run {
            if self
                .memory
                .dry_run_logged
                .insert(p.uid.clone(), p.new_total_m)
                != Some(p.new_total_m)
            {
                tracing::info!(pod = %view.key(), old = %fmt_limit(p.old_total_m), new = %fmt_limit(Some(p.new_total_m)), why = %p.why, "dry-run: would resize");
                self.metrics.resize(ResizeResult::dry_run, dir);
            }
            return;
        }
        if !self.memory.may_patch(&p.uid, now) {
            return;
        }
        let change = limit_change(view, &p.kind);
        let api: Api<Pod> = Api::namespaced(self.api.clone().into_client(), &view.namespace);
        let q = self.settings.policy.quantum_m;
        let (mut outcome, mut pod) =
            resize::send(&api, &view.name, &change, p.new_total_m, q, false).await;
        if outcome == Outcome::Conflict {
            // Re-read; retry once only if the pod is still ours and unchanged in shape.
            match api.get_opt(&view.name).await {
                Ok(Some(fresh))
                    if fresh.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        == Some(self.settings.node_name.as_str()) =>
                {
                    (outcome, pod) =
                        resize::send(&api, &view.name, &change, p.new_total_m, q, false).await;
                }
                Ok(_) => outcome = Outcome::NotFound,
                Err(e) => {
                    tracing::warn!(pod = %view.key(), error = %e, "re-read after conflict failed")
                }
            }
        }
        let old = fmt_limit(p.old_total_m);
        let new = fmt_limit(Some(p.new_total_m));
        if let Some(class) = outcome.error_class() {
            self.metrics.patch_error(class);
        }
        match outcome {
            Outcome::Applied => {
                let generation = pod
                    .as_ref()
                    .and_then(|p| p.metadata.generation)
                    .unwrap_or(view.generation + 1);
                self.memory.succeeded(&p.uid);
                self.memory.patches.insert(
                    p.uid.clone(),
                    crate::policy::PodMemory::after(p, now.as_secs_f64()),
                );
                self.resizes.patched(&p.uid, generation, now);
                self.inflight_dir.insert(p.uid.clone(), p.direction);
                self.metrics.resize(ResizeResult::applied, dir);
                tracing::info!(pod = %view.key(), %old, %new, generation, why = %p.why, "resized");
                let note = format!("CPU limit {old} → {new}: {}", p.why);
                self.events
                    .publish(view, false, REASON_RESIZED, note, now)
                    .await;
            }
            Outcome::Refused {
                refusal,
                message,
                floor_m,
            } => {
                self.metrics.resize(ResizeResult::refused, dir);
                match floor_m {
                    Some(f) => self.memory.learn_floor(&p.uid, f),
                    None => self.memory.refused(&p.uid, now),
                }
                if matches!(
                    refusal,
                    Refusal::PodLevelGateOff | Refusal::NodeLacksFeature
                ) {
                    // Cluster gate off or node lacks the feature: every
                    // pod-level pod of this node becomes unmanaged.
                    self.pod_level_supported = Some(false);
                }
                tracing::warn!(pod = %view.key(), reason = refusal.as_str(), learned_floor = %floor_m.map_or_else(|| "-".to_string(), |m| format!("{m}m")), %message, "resize refused");
                let note = format!(
                    "resize to {}m refused ({}): {message}",
                    p.new_total_m,
                    refusal.as_str()
                );
                self.events
                    .publish(view, true, REASON_REFUSED, note, now)
                    .await;
            }
            Outcome::NotFound => {
                self.forget(&p.uid);
            }
            Outcome::Conflict => {
                let r = self.rand01();
                self.memory.transient(&p.uid, now, r);
            }
            Outcome::Forbidden(message) => {
                self.metrics.resize(ResizeResult::error, dir);
                let pause = self.memory.forbidden(now);
                tracing::error!(pod = %view.key(), %message, pause_s = pause.as_secs(), "resize forbidden (RBAC or admission policy): configuration alarm; pausing all patches");
            }
            Outcome::Transient { class, message } => {
                self.metrics.resize(ResizeResult::error, dir);
                let r = self.rand01();
                let d = self.memory.transient(&p.uid, now, r);
                tracing::warn!(pod = %view.key(), class = ?class, %message, retry_in_ms = d.as_millis() as u64, "resize failed; backing off");
            }
        }
    }

    /// Follows in-flight resizes until verified in `cpu.max` (or not).
    fn verify_resizes(
        &mut self,
        views: &[PodView],
        cgroups: &HashMap<&str, &PodCgroup>,
        now: Duration,
    ) -> Vec<ResizeOutcome> {
        let mut out = Vec::new();
        for v in views {
            if !self.inflight_dir.contains_key(&v.uid) {
                continue;
            }
            self.resizes.kubelet_status(&v.uid, &v.resize, now);
            // The pod cache may still hold the pre-patch spec: the cgroups
            // match that trivially, which would verify a resize never applied.
            let spec_current = self
                .resizes
                .generation(&v.uid)
                .is_none_or(|g| v.generation >= g);
            let matches = spec_current
                && cgroups.get(v.uid.as_str()).is_some_and(|cg| {
                    let expected = verify::expected_cpu_max(
                        v,
                        cg.sample.as_ref().map_or(100_000, |s| s.cpu_max.period_us),
                    );
                    verify::compare(&expected, cg, self.layout.driver).is_empty()
                });
            if let Some(o) = self.resizes.checked(&v.uid, matches, now) {
                let dir = self
                    .inflight_dir
                    .remove(&v.uid)
                    .map_or(metrics::Direction::raise, metrics_dir);
                match &o {
                    ResizeOutcome::Verified {
                        latency,
                        generation,
                        ..
                    } => {
                        self.metrics.resize_verified(dir, latency.as_secs_f64());
                        tracing::info!(pod = %v.key(), generation, latency_ms = latency.as_millis() as u64, "resize verified in cpu.max");
                    }
                    ResizeOutcome::Unverified {
                        generation,
                        kubelet_done,
                        waited,
                        ..
                    } => {
                        self.metrics.resize(ResizeResult::unverified, dir);
                        tracing::warn!(pod = %v.key(), generation, kubelet_done, waited_s = waited.as_secs(), "resize not seen in cpu.max within grace");
                    }
                }
                out.push(o);
            }
        }
        out
    }

    async fn report_drift(&mut self, views: &[PodView], events: Vec<DriftEvent>, now: Duration) {
        for ev in events {
            match ev {
                DriftEvent::Drift {
                    uid,
                    mismatch,
                    since,
                } => {
                    let Some(v) = views.iter().find(|v| v.uid == uid) else {
                        continue;
                    };
                    self.metrics
                        .set_drift(&v.namespace, &v.name, &mismatch.target, true);
                    self.metrics.drift_detected(&mismatch.target);
                    tracing::warn!(pod = %v.key(), cgroup = %mismatch.target, %mismatch, for_s = now.saturating_sub(since).as_secs(), "cgroup drift");
                    let note = format!("{}: {mismatch}", mismatch.target);
                    self.events.publish(v, true, REASON_DRIFT, note, now).await;
                }
                DriftEvent::Changed { uid, mismatch } => {
                    if let Some(v) = views.iter().find(|v| v.uid == uid) {
                        tracing::warn!(pod = %v.key(), cgroup = %mismatch.target, %mismatch, "cgroup drift changed");
                    }
                }
                DriftEvent::Cleared {
                    uid,
                    target,
                    lasted,
                } => {
                    let Some(v) = views.iter().find(|v| v.uid == uid) else {
                        continue;
                    };
                    self.metrics
                        .set_drift(&v.namespace, &v.name, &target, false);
                    tracing::info!(pod = %v.key(), cgroup = %target, lasted_s = lasted.as_secs(), "cgroup drift cleared");
                    let note = format!("{target}: cpu.max matches the spec again");
                    self.events
                        .publish(v, false, REASON_DRIFT_CLEARED, note, now)
                        .await;
                }
                DriftEvent::Forgotten { uid, target } => {
                    if let Some(v) = views.iter().find(|v| v.uid == uid) {
                        self.metrics
                            .set_drift(&v.namespace, &v.name, &target, false);
                    }
                }
            }
        }
    }

    fn forget(&mut self, uid: &str) {
        self.memory.forget(uid);
        self.resizes.forget(uid);
        self.inflight_dir.remove(uid);
        self.events.forget(uid);
    }

    /// Drops state and series of pods that left the node. Every per-pod map
    /// is swept: a pod known to one map only (a dry-run log, a drift event
    /// of a pod never patched) is forgotten too.
    fn forget_gone(&mut self, views: &[PodView]) {
        let live: HashSet<&str> = views.iter().map(|v| v.uid.as_str()).collect();
        let gone: HashSet<String> = self
            .memory
            .uids()
            .chain(self.inflight_dir.keys())
            .chain(self.events.uids())
            .filter(|u| !live.contains(u.as_str()))
            .cloned()
            .collect();
        for uid in gone {
            self.forget(&uid);
        }
        let names: HashSet<(String, String)> = views
            .iter()
            .map(|v| (v.namespace.clone(), v.name.clone()))
            .collect();
        self.metrics.retain_pods(&names);
    }

    fn export(&self, views: &[PodView], slack: &NodeSlack, round: &Round) {
        let allocatable = self
            .caches
            .allocatable_cpu_m()
            .or(self.settings.node_allocatable_m);
        let booked: Millis = views
            .iter()
            .filter(|v| !v.terminating)
            .map(booked_request)
            .sum();
        self.metrics.set_node(&metrics::NodeValues {
            capacity_millicores: slack.capacity_m as f64,
            usage_millicores: slack.usage_m as f64,
            real_slack_millicores: round.node.slack_m as f64,
            booked_slack_millicores: allocatable.map_or(0.0, |a| a as f64 - booked as f64),
            pressure_some_ratio: slack.pressure_some_avg10.unwrap_or(0.0) / 100.0,
            pressure_full_ratio: slack.pressure_full_avg10.map(|p| p / 100.0),
            throttling_stall_ratio: round.node.stall.throttling_pct / 100.0,
            contention_ratio: round.node.stall.contention_pct / 100.0,
        });
        let throttled: HashMap<&str, Option<f64>> = slack
            .pods
            .iter()
            .map(|p| (p.uid.as_str(), p.throttled_ratio))
            .collect();
        let mut unmanaged: HashMap<String, usize> = HashMap::new();
        if !self.unreadable.is_empty() {
            unmanaged.insert("unreadable".into(), self.unreadable.len());
        }
        let mut managed = 0;
        for d in &round.decisions {
            match d.reason {
                None => {
                    managed += 1;
                    let throttled = throttled
                        .get(d.uid.as_str())
                        .copied()
                        .flatten()
                        .unwrap_or(0.0);
                    self.metrics.set_pod(
                        &d.namespace,
                        &d.name,
                        &metrics::PodValues {
                            request_millicores: d.request_m as f64,
                            limit_millicores: d.current_limit_m.map(|m| m as f64),
                            target_millicores: d.target_m.map(|m| m as f64),
                            usage_millicores: d.usage_m as f64,
                            throttled_ratio: throttled,
                        },
                    );
                }
                Some(r) => {
                    *unmanaged.entry(r.reason().to_string()).or_default() += 1;
                    self.metrics.remove_pod_values(&d.namespace, &d.name);
                }
            }
        }
        self.metrics.set_pod_states(managed, &unmanaged);
    }
}

/// What the scheduler books for a pod (docs/kubelet-behaviour.md §5): max(spec, allocated)
/// requests plus overhead.
pub fn booked_request(v: &PodView) -> Millis {
    let spec = v.cpu_request();
    let allocated: Millis = v
        .statuses
        .iter()
        .filter_map(|s| s.allocated.and_then(|a| a.cpu_request))
        .sum();
    spec.max(allocated) + v.overhead_cpu.unwrap_or(0)
}

/// A CPU limit as a Kubernetes quantity in millicores (`300m`), or
/// `unlimited`.
fn fmt_limit(m: Option<Millis>) -> String {
    m.map_or_else(|| "unlimited".to_string(), |m| format!("{m}m"))
}

fn metrics_dir(d: Direction) -> metrics::Direction {
    match d {
        Direction::Raise => metrics::Direction::raise,
        Direction::Lower => metrics::Direction::lower,
    }
}

/// Policy plan → patch body input; sidecars keep their `initContainers` key.
pub fn limit_change(view: &PodView, kind: &PatchKind) -> LimitChange {
    match kind {
        PatchKind::PodLimit(m) => LimitChange::Pod(*m),
        PatchKind::ContainerLimits(cs) => LimitChange::Containers(
            cs.iter()
                .map(|(name, m)| ContainerLimit {
                    name: name.clone(),
                    kind: view
                        .containers
                        .iter()
                        .find(|c| &c.name == name)
                        .map_or(ContainerKind::App, |c| c.kind),
                    cpu_limit_m: *m,
                })
                .collect(),
        ),
    }
}

/// Marks app vs sandbox container cgroups from the ids in pod status.
pub fn mark_roles(pods: &mut [PodCgroup], views: &[PodView]) {
    let by_uid: HashMap<&str, &PodView> = views.iter().map(|v| (v.uid.as_str(), v)).collect();
    for cg in pods {
        if let Some(v) = by_uid.get(cg.uid.as_str()) {
            let ids: Vec<&str> = v
                .statuses
                .iter()
                .filter_map(|s| s.container_id.as_deref())
                .collect();
            cgroup::mark_roles(cg, &ids);
        }
    }
}
