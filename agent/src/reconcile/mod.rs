//! The reconciler: one tick = observe (scan cgroups, measure slack) →
//! decide (pure policy) → act (resize patches) → check (re-read cpu.max of
//! patched pods; audit every pod for drift). Each stage has its file; what an
//! answer or a verification means is pure ([`outcome`], [`records`]) and
//! carried out by one executor (`effects.rs`). The Kubernetes calls go
//! through [`PodApi`] and [`EventApi`], so a whole tick runs in a unit test.

mod act;
mod check;
mod declared;
mod effects;
mod export;
mod observe;
pub mod outcome;
pub mod records;
pub mod round;
pub mod stateless;

#[cfg(test)]
mod tick_tests;

use foldhash::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::runtime::events::Recorder;

use crate::cgroup::{Layout, NodeSnapshot};
use crate::kube::events::{self, EventApi, EventSink};
use crate::kube::pods::{KubePods, PodApi};
use crate::kube::watch::Caches;
use crate::metrics::Metrics;
use crate::model::{Millis, PodView, Uid};
use crate::policy::{Direction, PatchPlan, PolicyConfig, TokenBucket};
use crate::signal::contention::effect::{Judged, Lowered, Sample};
use crate::signal::usage;

use act::PodLevel;
use declared::Templates;
use observe::{Observation, ScanState};
use records::{Jitter, Records};

pub use observe::TickError;
pub use round::{Known, Owed, Round, decide_round};

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

/// Monotonic time since the agent started.
type Clock = Box<dyn Fn() -> Duration + Send + Sync>;

/// The agent's state across ticks.
pub struct Agent<P = KubePods, E = Recorder> {
    pub settings: Settings,
    pub layout: Layout,
    caches: Caches,
    api: P,
    events: EventSink<E>,
    pub metrics: Arc<Metrics>,
    /// Everything remembered per pod (and the node-wide 403 pause).
    records: Records,
    bucket: TokenBucket,
    scan: ScanState,
    pod_level: PodLevel,
    templates: Templates,
    clock: Clock,
    online_cpus: u64,
    jitter: Jitter,
}

impl Agent {
    /// The agent on a cluster: patches and Events through `client`.
    pub fn with_client(
        settings: Settings,
        layout: Layout,
        caches: Caches,
        client: kube::Client,
        metrics: Arc<Metrics>,
    ) -> Self {
        let recorder = Recorder::new(client.clone(), events::reporter(&settings.node_name));
        Self::new(
            settings,
            layout,
            caches,
            KubePods::new(client),
            recorder,
            metrics,
        )
    }
}

impl<P: PodApi, E: EventApi> Agent<P, E> {
    pub fn new(
        settings: Settings,
        layout: Layout,
        caches: Caches,
        api: P,
        events: E,
        metrics: Arc<Metrics>,
    ) -> Self {
        let started = Instant::now();
        Self {
            layout,
            caches,
            api,
            events: EventSink::with_recorder(events, settings.event_interval),
            metrics,
            records: Records::default(),
            bucket: TokenBucket::from_config(&settings.policy),
            scan: ScanState::new(),
            pod_level: PodLevel::default(),
            templates: Templates::default(),
            clock: Box::new(move || started.elapsed()),
            online_cpus: usage::online_cpus_at(&settings.cgroup_root),
            jitter: Jitter::new(0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id())),
            settings,
        }
    }

    /// Replaces the monotonic clock (time since start) the agent reads.
    pub fn with_clock(mut self, clock: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    fn now(&self) -> Duration {
        (self.clock)()
    }

    /// An inotify event (or overflow) asks for an audit at the next tick.
    pub fn request_audit(&mut self) {
        self.scan.audit_requested = true;
    }

    /// The last full scan (for the inotify watch set): a light rescan
    /// leaves out unmanaged pods, whose cpu.max must stay watched too.
    pub fn snapshot(&self) -> Option<&NodeSnapshot> {
        self.scan.index.as_deref().or(self.scan.prev.as_ref())
    }

    /// Whether the last tick read a usable cgroup snapshot.
    pub fn last_tick_ok(&self) -> bool {
        self.scan.last_tick_ok
    }

    fn allocatable_m(&self) -> Option<Millis> {
        self.caches
            .allocatable_cpu_m()
            .or(self.settings.node_allocatable_m)
    }

    /// One tick. Returns the round for callers that want to show it.
    pub async fn tick(&mut self) -> Option<Round> {
        let now = self.now();
        let obs = self.observe(now).await?;
        self.templates
            .learn(&self.api, &mut self.records, &obs.views, now)
            .await;
        self.report_checked(&obs.views, &obs.judged, now).await;
        let (round, patches) = self.decide(&obs, now);
        self.announce_yields(&obs.views, &round, now).await;
        self.pod_level
            .probe(&self.api, &self.settings.policy, &obs.views, &round, now)
            .await;
        self.act(&obs.views, &patches, now).await;
        self.open_claims(&obs, &patches, now);
        self.check(&obs, now).await;
        let Observation {
            views,
            cur,
            slack,
            full,
            ..
        } = obs;
        self.scan.finish(cur, full, now);
        self.forget_gone(&views);
        export::export(
            &self.metrics,
            &views,
            &slack,
            &round,
            self.allocatable_m(),
            self.scan.unreadable.len(),
        );
        Some(round)
    }

    /// Decide: the policy's round over this tick's observations, and the
    /// patches hysteresis and the token bucket let through.
    fn decide(&mut self, obs: &Observation, now: Duration) -> (Round, Vec<PatchPlan>) {
        let t_decide = Instant::now();
        let opted = self.caches.opted_in_namespaces();
        let holds = self.scan.claims.holds();
        let round = decide_round(
            &self.settings.node_name,
            &obs.views,
            &obs.eligible,
            &obs.slack,
            &obs.contention,
            obs.owed,
            &opted,
            |uid| {
                let r = self.records.get(uid);
                Known {
                    learned_floor_m: r.and_then(|r| r.learned_floor_m()),
                    declared: r.and_then(|r| r.declared()),
                    held_at_m: holds.get(uid).copied(),
                }
            },
            self.pod_level.supported,
            crate::policy::writers::wall_clock_s(),
            &self.settings.policy,
        );
        let plan = crate::policy::plan(
            &round.node,
            &round.decisions,
            |uid| self.records.get(uid)?.last_patch(),
            now.as_secs_f64(),
            &mut self.bucket,
            &self.settings.policy,
        );
        self.metrics
            .decision_duration
            .observe(t_decide.elapsed().as_secs_f64());
        (round, plan.patches)
    }

    /// A lowering the apiserver accepted this tick while pods were owed
    /// CPU that no lowering was made for yet is made for them: one claim
    /// each, checked once the kubelet applied it
    /// ([`crate::signal::contention::effect`]). What was held for them is then
    /// let go: the claim holds the lowered limits instead, and the
    /// neighbour's own usage keeps the slack down from there.
    fn open_claims(&mut self, obs: &Observation, patches: &[PatchPlan], now: Duration) {
        if obs.owed.fresh_pods == 0 || self.settings.dry_run {
            return;
        }
        let now_s = now.as_secs_f64();
        let lowered: Vec<Lowered> = patches
            .iter()
            .filter(|p| p.direction == Direction::Lower)
            .filter(|p| {
                self.records
                    .get(&p.uid)
                    .and_then(|r| r.last_patch())
                    .is_some_and(|l| {
                        l.last_patch_at_s == now_s && l.last_direction == Direction::Lower
                    })
            })
            .filter_map(|p| {
                Some(Lowered {
                    uid: p.uid.clone(),
                    from_m: p.old_total_m?,
                    to_m: p.new_total_m,
                })
            })
            .collect();
        if lowered.is_empty() {
            return;
        }
        let earlier = &self.scan.before_earlier;
        self.scan.claims.open(
            obs.contention.owed(),
            |id| {
                earlier
                    .displaced
                    .iter()
                    .find(|d| &d.id == id)
                    .map(|d| Sample {
                        usage_m: d.usage_m,
                        displaced_m: d.displaced_m,
                    })
            },
            &lowered,
            now,
        );
        self.scan.held = Default::default();
    }

    /// Carries out the verdicts on lowerings checked this tick: counted
    /// once each, logged and announced on every pod they lowered that is
    /// still here.
    async fn report_checked(&mut self, views: &[PodView], judged: &[Judged], now: Duration) {
        for j in judged {
            self.metrics
                .lowering_checked(outcome::lowering_label(j.effect));
            let owed = views
                .iter()
                .find(|v| v.cgroup_id == j.owed)
                .map_or_else(|| j.owed.to_string(), PodView::key);
            for l in &j.lowered {
                let effects = outcome::on_lowering_checked(
                    &mut self.records,
                    j,
                    l,
                    &owed,
                    now,
                    &self.settings.policy,
                );
                if let Some(v) = views.iter().find(|v| v.uid == l.uid) {
                    self.apply(v, effects, now).await;
                }
            }
        }
    }

    /// One Event and log line for each pod that begins to yield to another
    /// writer this round, a log line for each that stops.
    async fn announce_yields(&mut self, views: &[PodView], round: &Round, now: Duration) {
        let changes =
            outcome::on_yields(&mut self.records, &round.decisions, !self.settings.dry_run);
        for (uid, effects) in changes {
            if let Some(v) = views.iter().find(|v| v.uid == uid) {
                self.apply(v, effects, now).await;
            }
        }
    }

    /// Drops everything remembered about a pod: its record (the Events
    /// sent for it included). A resize still in flight ends with it.
    fn forget(&mut self, uid: &Uid) {
        if let Some(r) = self.records.forget(uid).and_then(|mut r| r.resize_ended()) {
            self.metrics
                .resize(crate::metrics::ResizeResult::pod_gone, r.direction());
        }
    }

    /// Drops state and series of pods that left the node.
    fn forget_gone(&mut self, views: &[PodView]) {
        let live: HashSet<&Uid> = views.iter().map(|v| &v.uid).collect();
        let gone: HashSet<Uid> = self
            .records
            .uids()
            .filter(|u| !live.contains(u))
            .cloned()
            .collect();
        for uid in gone {
            self.forget(&uid);
        }
        let names: HashSet<(&str, &str)> =
            views.iter().map(|v| (&*v.namespace, &*v.name)).collect();
        self.metrics.retain_pods(&names);
    }
}
