//! From targets to patches: raises wait for a dead band and a cooldown
//! (longer for a pod whose raises keep being undone), lowerings go out at
//! once, and a node-wide token bucket caps the rate.

use serde::{Deserialize, Serialize};

use crate::model::{Millis, Uid};

use super::bucket::TokenBucket;
use super::config::PolicyConfig;
use super::{Decision, Level, ManagedDecision, NodeDecision};

/// The last patch of a pod the apiserver accepted: what the caller
/// remembers between rounds for the raise cooldown.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LastPatch {
    /// When the last accepted patch was sent (seconds, caller's clock).
    pub last_patch_at_s: f64,
    /// The total that patch set (informational: explain, drift).
    pub last_target_m: Millis,
    /// Which way that patch went.
    pub last_direction: Direction,
    /// Raises in a row that a lowering undid within twice the cooldown
    /// before them: the raise cooldown grows with it ([`raise_cooldown_s`]).
    pub flaps: u32,
}

/// The longest raise cooldown, as a multiple of `raise_cooldown_s`.
pub const FLAP_BACKOFF_MAX: f64 = 8.0;

/// The wait before a raise after `flaps` raises in a row were undone
/// quickly: the configured cooldown, doubled from the second flap on (one
/// quick undo is a neighbour arriving, several a loop of raise, contention,
/// lowering), at most [`FLAP_BACKOFF_MAX`] times it. So a short cooldown
/// recovers fast after a neighbour's demand ends, and a pod that keeps
/// flapping is patched at most twice per `8 × raise_cooldown_s`, except
/// after a lowering found to buy nothing: [`LastPatch::waive_raise_cooldown`]
/// lets that one be raised back at once, whatever the flaps.
pub fn raise_cooldown_s(cfg: &PolicyConfig, flaps: u32) -> f64 {
    let doublings = flaps.saturating_sub(1).min(16);
    cfg.raise_cooldown_s * f64::from(1u32 << doublings).min(FLAP_BACKOFF_MAX)
}

impl LastPatch {
    /// The record of `plan`, accepted by the apiserver at `now_s`; `prev`
    /// is the pod's patch before it, if any.
    pub fn after(
        plan: &PatchPlan,
        now_s: f64,
        prev: Option<&LastPatch>,
        cfg: &PolicyConfig,
    ) -> Self {
        let undoes = |p: &LastPatch| {
            p.last_direction == Direction::Raise && plan.direction == Direction::Lower
        };
        let flaps = match prev {
            None => 0,
            Some(p) if !undoes(p) => p.flaps,
            // Undone within twice the wait that preceded the raise: a flap.
            Some(p) if now_s - p.last_patch_at_s < 2.0 * raise_cooldown_s(cfg, p.flaps) => {
                p.flaps.saturating_add(1)
            }
            // A raise that held that long resets the count.
            Some(_) => 0,
        };
        Self {
            last_patch_at_s: now_s,
            last_target_m: plan.new_total_m,
            last_direction: plan.direction,
            flaps,
        }
    }

    /// How long after this patch the pod may be raised again.
    pub fn raise_cooldown_s(&self, cfg: &PolicyConfig) -> f64 {
        raise_cooldown_s(cfg, self.flaps)
    }

    /// Ends the raise cooldown as of `now_s`: the lowering it followed
    /// was found to buy nothing (`crate::signal::contention::effect`), so the limit
    /// it took may come back at once. The flap count stays.
    pub fn waive_raise_cooldown(&mut self, now_s: f64, cfg: &PolicyConfig) {
        self.last_patch_at_s = self.last_patch_at_s.min(now_s - self.raise_cooldown_s(cfg));
    }
}

/// What to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PatchKind {
    /// `spec.containers[name].resources.limits.cpu` (or the sidecar's), only
    /// for containers whose limit changes.
    ContainerLimits(Vec<(String, Millis)>),
    /// `spec.resources.limits.cpu`.
    PodLimit(Millis),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Raise,
    Lower,
}

/// One resize to send.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatchPlan {
    pub namespace: crate::model::Name,
    pub name: crate::model::Name,
    pub uid: Uid,
    pub kind: PatchKind,
    /// Managed total before; `None` when a limit is being adopted.
    pub old_total_m: Option<Millis>,
    pub new_total_m: Millis,
    pub direction: Direction,
    /// Human reason (Event message, log).
    pub why: String,
}

/// Why a pod whose target differs from its limit gets no patch this round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldReason {
    DeadBand,
    Cooldown,
    RateLimited,
}

impl HoldReason {
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::DeadBand => "dead_band",
            HoldReason::Cooldown => "cooldown",
            HoldReason::RateLimited => "rate_limited",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hold {
    pub namespace: crate::model::Name,
    pub name: crate::model::Name,
    pub uid: Uid,
    pub reason: HoldReason,
    pub current_m: Option<Millis>,
    pub target_m: Millis,
}

impl Hold {
    fn of(d: &Decision, m: &ManagedDecision, reason: HoldReason) -> Self {
        Self {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            uid: d.uid.clone(),
            reason,
            current_m: m.current_limit_m,
            target_m: m.target_m,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PlanOutcome {
    /// Lowerings first (largest first), then adoptions, then raises.
    pub patches: Vec<PatchPlan>,
    pub held: Vec<Hold>,
}

/// Why a patch goes out.
#[derive(Debug, Clone, Copy)]
enum Cause {
    Adopt,
    BelowFloor,
    Slack,
    AboveCeiling,
    Pressure,
    AtFloor,
    SlackShrank,
}

impl Cause {
    fn message(self, node: &NodeDecision, d: &ManagedDecision) -> String {
        let target = d.target_m;
        let cur = d.current_limit_m.unwrap_or(0);
        let floor = d.floor.floor_m;
        let ceiling = d.ceiling_m;
        let slack = node.slack_m;
        match self {
            Cause::Adopt => {
                format!("adopt: add CPU limit {target}m (one-way: limits cannot be removed)")
            }
            Cause::BelowFloor => format!("raise {cur}m→{target}m: below floor {floor}m"),
            Cause::Slack => format!(
                "raise {cur}m→{target}m: slack {slack}m, share {}m, ceiling {ceiling}m",
                d.share_m
            ),
            Cause::AboveCeiling => format!("lower {cur}m→{target}m: above ceiling {ceiling}m"),
            Cause::Pressure => {
                let c = &node.contention;
                format!(
                    "lower {cur}m→{target}m: {} pod(s) displaced, {}m owed to them (short of CPU within their requests: node free {}m; kubepods stall {:.1}%, of which own throttling {:.1}%), slack {slack}m",
                    c.displaced_pods, c.demand_m, c.free_m, c.some_pct, c.throttling_pct
                )
            }
            // Facts of this round only: the agent may have no earlier round
            // to compare with (first tick, restart), so no "shrank".
            Cause::AtFloor => {
                format!("lower {cur}m→{target}m: slack {slack}m leaves it at its floor {floor}m")
            }
            Cause::SlackShrank => format!(
                "lower {cur}m→{target}m: slack {slack}m over {} managed pods gives it a share of {}m",
                node.managed_pods, d.share_m
            ),
        }
    }
}

fn band(current: Millis, pct: f64, min_m: Millis) -> Millis {
    let p = if pct.is_finite() { pct.max(0.0) } else { 0.0 };
    ((current as f64 * p / 100.0).ceil() as Millis).max(min_m)
}

/// Which patches get the node's tokens first (`plan`): lowerings (they
/// hand CPU back), then adoptions (a limit added where there was none),
/// then raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum First {
    Lowering,
    Adoption,
    Raise,
}

/// A patch `plan` wants to send, before tokens are handed out; its message
/// is formatted only if it gets one.
struct Wanted<'d> {
    first: First,
    /// How far the limit moves (for an adoption, the target).
    step: Millis,
    decision: &'d Decision,
    managed: &'d ManagedDecision,
    direction: Direction,
    cause: Cause,
}

/// What one managed pod's limit wants this round: a patch (`Some`), nothing
/// (`None`: at target), or a hold and why. `cooling`: whether its last
/// patch is younger than its raise cooldown.
fn wants(
    node: &NodeDecision,
    m: &ManagedDecision,
    cooling: impl FnOnce() -> bool,
    cfg: &PolicyConfig,
) -> Result<Option<(First, Millis, Direction, Cause)>, HoldReason> {
    let (target, floor, ceiling) = (m.target_m, m.floor.floor_m, m.ceiling_m);
    let Some(cur) = m.current_limit_m else {
        return Ok(Some((
            First::Adoption,
            target,
            Direction::Lower,
            Cause::Adopt,
        )));
    };
    if target > cur {
        let step = target - cur;
        if cur < floor {
            Ok(Some((
                First::Raise,
                step,
                Direction::Raise,
                Cause::BelowFloor,
            )))
        } else if target < ceiling
            && step < band(cur, cfg.raise_dead_band_pct, cfg.raise_dead_band_m)
        {
            Err(HoldReason::DeadBand)
        } else if cooling() {
            Err(HoldReason::Cooldown)
        } else {
            Ok(Some((First::Raise, step, Direction::Raise, Cause::Slack)))
        }
    } else if target < cur {
        let step = cur - target;
        let cause = if cur > ceiling {
            Cause::AboveCeiling
        } else if node.under_pressure()
            && step
                >= band(
                    cur,
                    cfg.lower_dead_band_pct / 2.0,
                    cfg.lower_dead_band_m / 2,
                )
        {
            // Half the dead band while pods wait: eager, but a demand
            // wobbling by a few millicores must not patch on every tick.
            Cause::Pressure
        } else if target == floor {
            Cause::AtFloor
        } else if step >= band(cur, cfg.lower_dead_band_pct, cfg.lower_dead_band_m) {
            Cause::SlackShrank
        } else {
            return Err(HoldReason::DeadBand);
        };
        Ok(Some((First::Lowering, step, Direction::Lower, cause)))
    } else {
        Ok(None)
    }
}

/// Turns a round's decisions into patches.
///
/// Raise (target above current): only if the step is at least the dead band
/// (`max(pct of current, m)`) or reaches the ceiling, and the pod's last
/// patch is at least its cooldown old ([`LastPatch::raise_cooldown_s`]); a limit below the floor is
/// raised at once. Lower: at once when the limit is above the ceiling, the
/// target is the floor, the step is at least the lowering dead band, or the
/// node is under pressure and the step is at least half of it. Every patch takes a token from `bucket`; the
/// rest are held as `RateLimited` and come back next round. `last_patch`:
/// the pod's last accepted patch, as the caller remembers it.
pub fn plan<'m>(
    node: &NodeDecision,
    decisions: &[Decision],
    last_patch: impl Fn(&Uid) -> Option<&'m LastPatch>,
    now_s: f64,
    bucket: &mut TokenBucket,
    cfg: &PolicyConfig,
) -> PlanOutcome {
    let mut out = PlanOutcome::default();
    let mut wanted: Vec<Wanted<'_>> = Vec::new();
    for (d, m) in decisions.iter().filter_map(|d| Some((d, d.managed()?))) {
        let cooling = || {
            last_patch(&d.uid).is_some_and(|m| now_s - m.last_patch_at_s < m.raise_cooldown_s(cfg))
        };
        match wants(node, m, cooling, cfg) {
            Ok(Some((first, step, direction, cause))) => wanted.push(Wanted {
                first,
                step,
                decision: d,
                managed: m,
                direction,
                cause,
            }),
            Ok(None) => {}
            Err(reason) => out.held.push(Hold::of(d, m, reason)),
        }
    }
    // Tokens go to lowerings first, then adoptions, then raises; within
    // each, the largest step first, then the smaller uid.
    wanted.sort_by(|a, b| {
        a.first
            .cmp(&b.first)
            .then(b.step.cmp(&a.step))
            .then_with(|| a.decision.uid.cmp(&b.decision.uid))
    });
    for Wanted {
        decision: d,
        managed: m,
        direction,
        cause,
        ..
    } in wanted
    {
        let target = m.target_m;
        if !bucket.try_take(now_s) {
            out.held.push(Hold::of(d, m, HoldReason::RateLimited));
            continue;
        }
        let kind = match m.level {
            Level::Pod => PatchKind::PodLimit(target),
            Level::Containers => PatchKind::ContainerLimits(
                m.containers
                    .iter()
                    .filter(|c| c.current_limit_m != Some(c.target_m))
                    .map(|c| (c.name.to_string(), c.target_m))
                    .collect(),
            ),
        };
        out.patches.push(PatchPlan {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            uid: d.uid.clone(),
            kind,
            old_total_m: m.current_limit_m,
            new_total_m: target,
            direction,
            why: cause.message(node, m),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use foldhash::HashMap;
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{ANN_ADOPT, DeclaredLimits, PodView};
    use crate::policy::tests::fixtures::*;
    use crate::policy::{PodInput, PolicyConfig, TokenBucket, decide};

    #[test]
    fn raise_to_ceiling_goes_out() {
        let p = simple("a", 100, Some(200));
        let (n, ds) = decided(&p, 4000, 0, 0);
        let out = first_plan(&n, &ds, &PolicyConfig::default());
        assert_eq!(out.patches.len(), 1);
        let pp = &out.patches[0];
        assert_eq!(pp.direction, Direction::Raise);
        assert_eq!(pp.kind, PatchKind::ContainerLimits(vec![("c".into(), 400)]));
        assert_eq!((pp.old_total_m, pp.new_total_m), (Some(200), 400));
    }

    #[test]
    fn raise_inside_dead_band_is_held() {
        // Request 1000, limit 1500; slack 1530 → target 1540: +40m < max(10%, 50m).
        let p = simple("a", 1000, Some(1500));
        let (n, ds) = decide(
            &node(1000 + 1530 + 100, 1000, 0),
            &[input(&p, 1000)],
            &PolicyConfig::default(),
        );
        assert_eq!(ds[0].target_m(), Some(2530));
        let p2 = simple("a", 1000, Some(2490));
        let (n2, ds2) = decide(
            &node(1000 + 1530 + 100, 1000, 0),
            &[input(&p2, 1000)],
            &PolicyConfig::default(),
        );
        let out = first_plan(&n2, &ds2, &PolicyConfig::default());
        assert!(out.patches.is_empty());
        assert_eq!(out.held[0].reason, HoldReason::DeadBand);
        // The same +1030m from 1500 is past the band.
        let out = first_plan(&n, &ds, &PolicyConfig::default());
        assert_eq!(out.patches.len(), 1);
    }

    #[test]
    fn raise_waits_for_cooldown_but_lowering_does_not() {
        let cfg = PolicyConfig {
            raise_cooldown_s: 60.0,
            ..PolicyConfig::default()
        };
        let p = simple("a", 100, Some(200));
        let mem = HashMap::from_iter([(
            p.uid.clone(),
            LastPatch {
                last_patch_at_s: 100.0,
                last_target_m: 200,
                last_direction: Direction::Raise,
                flaps: 0,
            },
        )]);
        let (n, ds) = decided(&p, 4000, 0, 0);
        let out = plan(&n, &ds, |u| mem.get(u), 130.0, &mut big_bucket(), &cfg);
        assert!(out.patches.is_empty());
        assert_eq!(out.held[0].reason, HoldReason::Cooldown);
        let out = plan(&n, &ds, |u| mem.get(u), 160.0, &mut big_bucket(), &cfg);
        assert_eq!(out.patches.len(), 1);
        // Lowering right after a patch: node full.
        let q = simple("a", 100, Some(400));
        let (n, ds) = decided(&q, 4000, 4000, 0);
        let out = plan(&n, &ds, |u| mem.get(u), 101.0, &mut big_bucket(), &cfg);
        assert_eq!(out.patches.len(), 1);
        assert_eq!(out.patches[0].direction, Direction::Lower);
        assert_eq!(out.patches[0].new_total_m, 100);
    }

    fn cooldown_15s() -> PolicyConfig {
        PolicyConfig {
            raise_cooldown_s: 15.0,
            ..PolicyConfig::default()
        }
    }

    /// An accepted patch of pod "a" in `dir`, as the caller records it.
    fn patched(
        prev: Option<&LastPatch>,
        dir: Direction,
        now_s: f64,
        cfg: &PolicyConfig,
    ) -> LastPatch {
        let plan = PatchPlan {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "a".into(),
            kind: PatchKind::PodLimit(300),
            old_total_m: Some(200),
            new_total_m: 300,
            direction: dir,
            why: String::new(),
        };
        LastPatch::after(&plan, now_s, prev, cfg)
    }

    #[test]
    fn flapping_raises_back_off_from_the_second_quick_undo_up_to_eight_times_the_cooldown() {
        let cfg = cooldown_15s();
        let mut m = patched(None, Direction::Raise, 0.0, &cfg);
        assert_eq!(m.raise_cooldown_s(&cfg), 15.0);
        // Each raise goes out as soon as its cooldown allows and is undone 5 s
        // later: the first undo costs nothing extra, then the wait doubles.
        let mut t = 0.0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            t += 5.0;
            m = patched(Some(&m), Direction::Lower, t, &cfg);
            waits.push(m.raise_cooldown_s(&cfg));
            t += m.raise_cooldown_s(&cfg);
            m = patched(Some(&m), Direction::Raise, t, &cfg);
        }
        assert_eq!(waits, [15.0, 30.0, 60.0, 120.0, 120.0, 120.0]);
        // A raise that holds for twice its cooldown resets the count.
        m = patched(Some(&m), Direction::Lower, t + 241.0, &cfg);
        assert_eq!((m.flaps, m.raise_cooldown_s(&cfg)), (0, 15.0));
        // Lowering after lowering, raise after raise: not a flap.
        let l = patched(Some(&m), Direction::Lower, t + 242.0, &cfg);
        assert_eq!(l.flaps, 0);
    }

    #[test]
    fn flapping_raises_back_off_in_the_plan_too() {
        let cfg = cooldown_15s();
        let p = simple("a", 100, Some(200));
        let mut m = patched(None, Direction::Raise, 0.0, &cfg);
        m = patched(Some(&m), Direction::Lower, 5.0, &cfg);
        m = patched(Some(&m), Direction::Raise, 20.0, &cfg);
        m = patched(Some(&m), Direction::Lower, 25.0, &cfg);
        assert_eq!(m.flaps, 2);
        let mem = HashMap::from_iter([(p.uid.clone(), m)]);
        let (n, ds) = decided(&p, 4000, 0, 0);
        // 30 s after the second quick undo, not 15.
        let out = plan(
            &n,
            &ds,
            |u| mem.get(u),
            25.0 + 29.0,
            &mut big_bucket(),
            &cfg,
        );
        assert_eq!(out.held[0].reason, HoldReason::Cooldown);
        let out = plan(
            &n,
            &ds,
            |u| mem.get(u),
            25.0 + 30.0,
            &mut big_bucket(),
            &cfg,
        );
        assert_eq!(out.patches.len(), 1);
        assert_eq!(out.patches[0].direction, Direction::Raise);
    }

    #[test]
    fn a_flapping_pod_is_patched_at_most_twice_per_eight_cooldowns() {
        // The worst loop: every raise the moment it is allowed, every raise
        // undone 1 s later, for an hour.
        let cfg = cooldown_15s();
        let mut m = patched(None, Direction::Raise, 0.0, &cfg);
        let (mut t, mut patches) = (0.0, 1u32);
        while t < 3600.0 {
            t += 1.0;
            m = patched(Some(&m), Direction::Lower, t, &cfg);
            t += m.raise_cooldown_s(&cfg);
            m = patched(Some(&m), Direction::Raise, t, &cfg);
            patches += 2;
        }
        // 3600 / 121 s per cycle once backed off, plus the first few cycles.
        assert!(
            patches <= 2 * (3600 / 121) + 2 * 5,
            "{patches} patches in an hour"
        );
        assert!(
            patches >= 2 * (3600 / 121),
            "{patches}: backed off beyond 8 cooldowns"
        );
    }

    #[test]
    fn a_waived_cooldown_lets_the_raise_after_a_lowering_go_out_at_once() {
        let cfg = cooldown_15s();
        let p = simple("a", 100, Some(200));
        // Lowered at 100 s; the idle node wants it raised back to 400m.
        let mut m = patched(None, Direction::Lower, 100.0, &cfg);
        let (n, ds) = decided(&p, 4000, 0, 0);
        let now = 105.0;
        let at = |m: LastPatch| {
            let mem = HashMap::from_iter([(p.uid.clone(), m)]);
            plan(&n, &ds, |u| mem.get(u), now, &mut big_bucket(), &cfg)
        };
        let out = at(m);
        assert!(out.patches.is_empty(), "{out:?}");
        assert_eq!(out.held[0].reason, HoldReason::Cooldown);
        // The lowering bought nothing: the raise goes out now.
        m.waive_raise_cooldown(now, &cfg);
        let out = at(m);
        assert_eq!(out.patches.len(), 1, "{out:?}");
        assert_eq!(out.patches[0].direction, Direction::Raise);
        assert_eq!(out.patches[0].new_total_m, 400);
    }

    #[test]
    fn small_lowering_is_held_unless_pressure_or_floor() {
        let cfg = PolicyConfig::default();
        // Limit 400, slack gives target 380: -20m inside the band.
        let p = simple("a", 100, Some(400));
        let (n, ds) = decide(&node(100 + 280 + 100, 100, 0), &[input(&p, 100)], &cfg);
        assert_eq!(ds[0].target_m(), Some(380));
        let out = first_plan(&n, &ds, &cfg);
        assert_eq!(out.held[0].reason, HoldReason::DeadBand);
        // Same with contention pressure: lower at once.
        let (n, ds) = decide(&node(100 + 280 + 100, 100, 20), &[input(&p, 100)], &cfg);
        assert!(n.under_pressure());
        let out = first_plan(&n, &ds, &cfg);
        assert_eq!(out.patches[0].direction, Direction::Lower);
        // A target at the floor goes out even inside the band.
        let p = simple("a", 100, Some(130));
        let (n, ds) = decided(&p, 4000, 4000, 0);
        let out = first_plan(&n, &ds, &cfg);
        assert_eq!(out.patches[0].new_total_m, 100);
    }

    #[test]
    fn tiny_lowering_under_pressure_is_held_but_half_a_band_goes_out() {
        let cfg = PolicyConfig::default();
        let p = simple("a", 100, Some(400));
        // Half the lowering band of a 400m limit: max(5% of 400, 25m) = 25m.
        let (mut tiny, mut half) = (false, false);
        for cap in 300..800 {
            // Bursting 300m above its request: what is owed comes out of it.
            let (n, ds) = decide(&node(cap, 400, 20), &[input(&p, 400)], &cfg);
            let Some(t) = ds[0].target_m().filter(|t| *t < 400) else {
                continue;
            };
            assert!(n.under_pressure());
            let out = first_plan(&n, &ds, &cfg);
            if 400 - t < 25 && t != ds[0].floor_m().unwrap() {
                tiny = true;
                assert!(
                    out.patches.is_empty(),
                    "a {}m step under pressure was patched",
                    400 - t
                );
                assert_eq!(out.held[0].reason, HoldReason::DeadBand);
            } else if (25..50).contains(&(400 - t)) {
                half = true;
                assert_eq!(
                    out.patches[0].direction,
                    Direction::Lower,
                    "a {}m step under pressure held",
                    400 - t
                );
            }
        }
        assert!(tiny && half, "the sweep covered both cases");
    }

    #[test]
    fn bucket_caps_patches_and_lowerings_go_first() {
        let cfg = PolicyConfig::default();
        let pods: Vec<PodView> = (0..4)
            .map(|i| simple(&format!("p{i}"), 100, Some(if i < 2 { 200 } else { 400 })))
            .collect();
        let inputs: Vec<PodInput> = pods.iter().map(|p| input(p, 0)).collect();
        // Slack 400: each target 200 → p2, p3 lower by 200; p0, p1 unchanged.
        let (n, ds) = decide(&node(500, 0, 0), &inputs, &cfg);
        assert!(ds.iter().all(|d| d.target_m() == Some(200)));
        let mut bucket = TokenBucket::new(1.0, 1);
        let out = plan(&n, &ds, |_| None, 0.0, &mut bucket, &cfg);
        assert_eq!(out.patches.len(), 1);
        assert_eq!(out.patches[0].direction, Direction::Lower);
        assert_eq!(
            out.held
                .iter()
                .filter(|h| h.reason == HoldReason::RateLimited)
                .count(),
            1
        );
    }

    #[test]
    fn adoption_adds_a_limit_once() {
        let mut p = simple("a", 100, None);
        p.annotations.insert(ANN_ADOPT.into(), "true".into());
        let (n, ds) = decided(&p, 4000, 0, 0);
        let out = first_plan(&n, &ds, &PolicyConfig::default());
        assert_eq!(out.patches[0].old_total_m, None);
        assert_eq!(
            out.patches[0].kind,
            PatchKind::ContainerLimits(vec![("c".into(), 400)])
        );
    }

    #[test]
    fn pod_level_patches_only_the_pod_limit() {
        let mut p = pod_level_a();
        // The workload's own 500m: above 4 × request, kept on an idle node.
        let (n, ds) = decided(&p, 8000, 0, 0);
        let cfg = PolicyConfig::default();
        let out = first_plan(&n, &ds, &cfg);
        assert_eq!(out.patches, vec![]);
        // 500m set by Headroom; the workload declares 300m: ceiling 400m.
        p.limits_set_by_headroom = true;
        let declared = DeclaredLimits {
            containers: BTreeMap::from([("c".to_string(), None)]),
            pod: Some(300),
        };
        let inputs = [PodInput {
            declared: Some(&declared),
            ..input(&p, 0)
        }];
        let (n, ds) = decide(&node(8000, 0, 0), &inputs, &cfg);
        let out = first_plan(&n, &ds, &cfg);
        assert_eq!(out.patches[0].kind, PatchKind::PodLimit(400));
        assert_eq!(out.patches[0].why, "lower 500m→400m: above ceiling 400m");
        assert_eq!(out.patches[0].direction, Direction::Lower);
    }

    #[test]
    fn at_target_means_no_patch() {
        let p = simple("a", 100, Some(400));
        let (n, ds) = decided(&p, 4000, 0, 0);
        let out = first_plan(&n, &ds, &PolicyConfig::default());
        assert_eq!(out, PlanOutcome::default());
    }
}
