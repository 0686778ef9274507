//! The benefit bench's matrix (tests/benches/benefit.rs): scenarios ×
//! configurations × repetitions, in an order randomised from a seed.
//!
//! A scenario is who runs beside the managed service and what each of them
//! asks for (their schedules, [`crate::schedule`]); every configuration runs
//! under every scenario. The scenarios:
//!
//! - `mixed`: the service bursting to 1.5 × its limit twice, a
//!   within-request neighbour at a steady 150m and an unmanaged batch
//!   neighbour needing 0.8 CPU from 7 s into the second burst (the bench's
//!   one scenario before the matrix);
//! - `short`: the node short of CPU: the within-request neighbour at 90 % of
//!   its request all run, the service bursting to its ceiling (request × 4),
//!   the batch neighbour as in `mixed`;
//! - `alone`: the service alone: the neighbours' pods exist but get no load;
//! - `pair`: a second managed service of the same shape (`svc2`), bursting
//!   together with the first, beside the within-request neighbour (no batch
//!   load);
//! - `flicker`: the node short as in `short` (the service bursting to its
//!   ceiling, the batch neighbour's 0.8 CPU) for 70 s, while the
//!   within-request neighbour's need (450m, as in `short`) comes and goes
//!   every 2–8 s ([`flicker_within`]); each on phase (`contended`) and the
//!   pause after it is one *episode* of its need ([`episodes`]), and the
//!   service may be patched at most twice in one (issue 47).

use crate::schedule::{self, Phase};

/// Scenario names, in the order tables list them.
pub const NAMES: [&str; 5] = ["mixed", "short", "alone", "pair", "flicker"];

/// The scenario the static baseline check (`summary::baseline_check`)
/// reads: the bench's one scenario before the matrix.
pub const BASELINE: &str = "mixed";

/// The service: quiet 50m, bursts of 450m (1.5 × its 300m limit) at 25 ms a
/// request; bursts of 25 s, long against the 2–12 s a real kubelet under
/// emulation takes to apply a resize. `BENEFIT_SCHEDULE` overrides it in
/// `mixed`.
pub const MIXED_SVC: &str = "quiet:10@2,burst:25@18,quiet:15@2,burst:25@18,quiet:5@2";
/// The within-request neighbour: steady 150m, below its 500m request; its
/// `contended` phase is the batch neighbour's demand.
pub const MIXED_WITHIN: &str = "steady:57@6,contended:15@6,steady:8@6";
/// The batch neighbour: 0.8 CPU from 7 s into the second burst, for 15 s.
pub const MIXED_BATCH: &str = "idle:57@0.4,demand:15@32,idle:8@0.4";
/// `short`: the service's bursts at 800m (32 × 25 ms), its Headroom
/// ceiling (request 200m × 4); each request also costs the service CPU
/// outside its burn, so its demand is above the ceiling.
pub const SHORT_SVC: &str = "quiet:10@2,burst:25@32,quiet:15@2,burst:25@32,quiet:5@2";
/// `short`: the within-request neighbour at 450m (18 × 25 ms), 90 % of its
/// 500m request, all run.
pub const SHORT_WITHIN: &str = "steady:57@18,contended:15@18,steady:8@18";
/// `pair`: the within-request neighbour at 150m; its `contended` phases are
/// the two services' bursts.
pub const PAIR_WITHIN: &str = "steady:10@6,contended:25@6,steady:15@6,contended:25@6,steady:5@6";

/// `flicker`: the service bursting to its ceiling (800m, as in `short`) for
/// 70 s, so the node is short through every episode of the neighbour's need.
pub const FLICKER_SVC: &str = "quiet:5@2,burst:70@32,quiet:5@2";
/// `flicker`: the batch neighbour's 0.8 CPU all through the service's burst
/// (in `short` it makes the node short in the second burst; here in all of
/// it). Above its 100m request, it is owed no more than that, so the
/// within-request neighbour's episodes are the only need on the node that
/// comes and goes.
pub const FLICKER_BATCH: &str = "idle:5@0.4,demand:70@32,idle:5@0.4";
/// `flicker`: the seed of the within-request neighbour's on/off pattern
/// ([`flicker_within`]). Fixed, so every run and configuration (and every
/// bench) sees the same pattern: (c) is compared with (a) under the same
/// demand. This one's draws reach both ends of the 2–8 s range, on and off,
/// and fill the 60 s: needs of 8, 3, 2, 6, 8, 2 s, pauses of 6, 7, 4, 2, 8,
/// 4 s (six episodes).
pub const FLICKER_SEED: u64 = 41;
/// The within-request neighbour's phases in which it needs its CPU while
/// others compete for it (its figures over them: `within_contended_*`); in
/// `flicker` each is an episode's need ([`episodes`]).
pub const CONTENDED: &str = "contended";
/// `flicker`: the neighbour's need starts 10 s into the run (5 s into the
/// service's burst, after its raise to the ceiling) and comes and goes for
/// at most 60 s (ending by 70 s, before the burst ends at 75 s).
pub const FLICKER_LEAD_S: u32 = 10;
pub const FLICKER_SPAN_S: u32 = 60;
/// Shortest and longest on (and off) phase, in whole seconds.
pub const FLICKER_MIN_S: u32 = 2;
pub const FLICKER_MAX_S: u32 = 8;
/// The neighbour's rate while it needs CPU: 18 × 25 ms = 450m, 90 % of its
/// 500m request (as in `short`); while it does not: 0.4/s (10m, the batch
/// neighbour's idle).
pub const FLICKER_ON_RATE: f64 = 18.0;
pub const FLICKER_OFF_RATE: f64 = 0.4;

/// The within-request neighbour's schedule in `flicker`: idle for
/// [`FLICKER_LEAD_S`], then on (`contended`, [`FLICKER_ON_RATE`]) and off
/// (`rest`, [`FLICKER_OFF_RATE`]) phases in turn, each of a whole number of
/// seconds drawn from [`FLICKER_MIN_S`]..=[`FLICKER_MAX_S`] (xorshift64*
/// from `seed`), as many on/off pairs as fit in [`FLICKER_SPAN_S`], then
/// idle to 80 s.
///
/// Why irregular and not a fixed 4 s on / 4 s off: the agent works on fixed
/// periods (its tick, its 5 s contention window, its 15 s raise cooldown,
/// the 2–12 s the kubelet under emulation takes to apply a resize); a fixed
/// period would meet them at one phase every time, lucky or unlucky. Draws
/// from 2 to 8 s put episodes both shorter and longer than the contention
/// window and the resize delay, and gaps both shorter and longer than the
/// time to react; the pattern is fixed by the seed, so each episode is
/// known from the schedule ([`episodes`]).
pub fn flicker_within(seed: u64) -> String {
    let mut state = seed | 1;
    let mut draw = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let span = u64::from(FLICKER_MAX_S - FLICKER_MIN_S + 1);
        FLICKER_MIN_S + ((state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % span) as u32
    };
    let mut out = vec![format!("idle:{FLICKER_LEAD_S}@{FLICKER_OFF_RATE}")];
    let mut used = 0;
    loop {
        let (on, off) = (draw(), draw());
        if used + on + off > FLICKER_SPAN_S {
            break;
        }
        out.push(format!("{CONTENDED}:{on}@{FLICKER_ON_RATE}"));
        out.push(format!("rest:{off}@{FLICKER_OFF_RATE}"));
        used += on + off;
    }
    out.push(format!(
        "idle:{}@{FLICKER_OFF_RATE}",
        80 - FLICKER_LEAD_S - used
    ));
    out.join(",")
}

/// The episodes of a neighbour's need in its schedule: each run of
/// consecutive phases named `need` together with the one phase after it
/// (the pause before the need comes back), as `[from, to)` offsets (s from
/// the schedule's start). A need that ends the schedule has no pause. The
/// agent reacts with a lag (its contention window, the kubelet's resize),
/// so a patch for an episode may land in its pause; every patch from an
/// episode's start to the next episode's start (or the end of the last
/// one's pause) counts to that episode.
pub fn episodes(phases: &[Phase], need: &str) -> Vec<(f64, f64)> {
    let starts = schedule::phase_starts(phases);
    let end = |i: usize| (starts[i] + phases[i].duration).as_secs_f64();
    let mut out = Vec::new();
    let mut i = 0;
    while i < phases.len() {
        if phases[i].name != need {
            i += 1;
            continue;
        }
        let from = starts[i].as_secs_f64();
        while i + 1 < phases.len() && phases[i + 1].name == need {
            i += 1;
        }
        // The pause after it, if any.
        let last = (i + 1).min(phases.len() - 1);
        out.push((from, end(last)));
        i = last + 1;
    }
    out
}

/// Who is in a scenario and which goals apply to it (summary.json's
/// `parties`, `summary::goals`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Parties {
    /// A second managed service beside the first.
    pub svc2: bool,
    /// The within-request neighbour gets load.
    pub within: bool,
    /// The unmanaged batch neighbour gets load.
    pub batch: bool,
    /// The managed services' p99 is held to 2 × theirs under (b) no limit.
    /// Not in `short`: there "no limit" takes CPU the neighbours are owed.
    pub vs_nolimit: bool,
    /// The within-request neighbour's need comes and goes (`flicker`): the
    /// agent's patches are counted per episode of it ([`episodes`]), not
    /// per burst of the service.
    pub episodes: bool,
}

/// One scenario's schedules (`None`: that pod gets no load).
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub name: &'static str,
    /// One line for the table.
    pub about: &'static str,
    pub svc: Vec<Phase>,
    pub svc2: Option<Vec<Phase>>,
    pub within: Option<Vec<Phase>>,
    pub batch: Option<Vec<Phase>>,
    pub vs_nolimit: bool,
    pub episodes: bool,
}

impl Scenario {
    pub fn parties(&self) -> Parties {
        Parties {
            svc2: self.svc2.is_some(),
            within: self.within.is_some(),
            batch: self.batch.is_some(),
            vs_nolimit: self.vs_nolimit,
            episodes: self.episodes,
        }
    }

    /// The longest of its schedules.
    pub fn total(&self) -> std::time::Duration {
        [
            Some(&self.svc),
            self.svc2.as_ref(),
            self.within.as_ref(),
            self.batch.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|p| schedule::total(p))
        .max()
        .unwrap_or_default()
    }
}

/// The `mixed` scenario's schedules as given (`BENEFIT_SCHEDULE`,
/// `BENEFIT_WITHIN_SCHEDULE`, `BENEFIT_BATCH_SCHEDULE`, else the defaults).
#[derive(Clone, Copy, Debug)]
pub struct MixedSchedules<'a> {
    pub svc: &'a str,
    pub within: &'a str,
    pub batch: &'a str,
}

impl Default for MixedSchedules<'_> {
    fn default() -> Self {
        MixedSchedules {
            svc: MIXED_SVC,
            within: MIXED_WITHIN,
            batch: MIXED_BATCH,
        }
    }
}

fn parse(what: &str, text: &str) -> Result<Vec<Phase>, String> {
    schedule::parse(text).map_err(|e| format!("{what}: {e}"))
}

/// The scenario `name`.
pub fn scenario(name: &str, mixed: MixedSchedules<'_>) -> Result<Scenario, String> {
    let some = |p: &str| -> Result<Option<Vec<Phase>>, String> { parse(name, p).map(Some) };
    Ok(match name {
        "mixed" => Scenario {
            name: "mixed",
            about: "bursts to 1.5 × the limit; within-request neighbour at 150m; the batch \
                    neighbour's 0.8 CPU in the second burst",
            svc: parse("BENEFIT_SCHEDULE", mixed.svc)?,
            svc2: None,
            within: Some(parse("BENEFIT_WITHIN_SCHEDULE", mixed.within)?),
            batch: Some(parse("BENEFIT_BATCH_SCHEDULE", mixed.batch)?),
            vs_nolimit: true,
            episodes: false,
        },
        "short" => Scenario {
            name: "short",
            about: "the node short of CPU: bursts to the 800m ceiling; within-request \
                    neighbour at 90 % of its request; the batch neighbour as in mixed",
            svc: parse(name, SHORT_SVC)?,
            svc2: None,
            within: some(SHORT_WITHIN)?,
            batch: some(MIXED_BATCH)?,
            vs_nolimit: false,
            episodes: false,
        },
        "flicker" => Scenario {
            name: "flicker",
            about: "the node short as in short for 70 s; the within-request neighbour's \
                    need (450m) comes and goes every 2–8 s",
            svc: parse(name, FLICKER_SVC)?,
            svc2: None,
            within: some(&flicker_within(FLICKER_SEED))?,
            batch: some(FLICKER_BATCH)?,
            vs_nolimit: false,
            episodes: true,
        },
        "alone" => Scenario {
            name: "alone",
            about: "the service alone: bursts to 1.5 × the limit, the neighbours idle",
            svc: parse(name, MIXED_SVC)?,
            svc2: None,
            within: None,
            batch: None,
            vs_nolimit: true,
            episodes: false,
        },
        "pair" => Scenario {
            name: "pair",
            about: "two managed services bursting together to 1.5 × their limits; \
                    within-request neighbour at 150m",
            svc: parse(name, MIXED_SVC)?,
            svc2: some(MIXED_SVC)?,
            within: some(PAIR_WITHIN)?,
            batch: None,
            vs_nolimit: true,
            episodes: false,
        },
        other => {
            return Err(format!(
                "unknown scenario {other:?} (known: {})",
                NAMES.join(",")
            ));
        }
    })
}

/// `BENEFIT_SCENARIOS`: a comma list of [`NAMES`] (in the order given,
/// each once); unset or empty: all of them.
pub fn scenario_names(list: Option<&str>) -> Result<Vec<&'static str>, String> {
    let Some(list) = list.filter(|l| !l.trim().is_empty()) else {
        return Ok(NAMES.to_vec());
    };
    let mut out: Vec<&'static str> = Vec::new();
    for n in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let name = NAMES.iter().copied().find(|k| *k == n).ok_or_else(|| {
            format!(
                "BENEFIT_SCENARIOS: unknown {n:?} (known: {})",
                NAMES.join(",")
            )
        })?;
        if out.contains(&name) {
            return Err(format!("BENEFIT_SCENARIOS: {n:?} twice"));
        }
        out.push(name);
    }
    Ok(out)
}

/// Default repetitions of each (scenario, configuration).
pub const DEFAULT_REPS: usize = 3;

/// Repetitions from `BENEFIT_MATRIX` and `BENEFIT_REPS`: `quick` is one of
/// each whatever `BENEFIT_REPS` says; `full` or unset, `BENEFIT_REPS`
/// (default [`DEFAULT_REPS`]).
pub fn reps(matrix: Option<&str>, reps: Option<&str>) -> Result<usize, String> {
    match matrix.map(str::trim) {
        Some("quick") => return Ok(1),
        None | Some("" | "full") => {}
        Some(other) => return Err(format!("BENEFIT_MATRIX: {other:?} is not quick or full")),
    }
    let n = match reps {
        None => DEFAULT_REPS,
        Some(r) => r
            .trim()
            .parse()
            .map_err(|_| format!("BENEFIT_REPS: {r:?} is not a number"))?,
    };
    if n == 0 {
        return Err("BENEFIT_REPS: 0 repetitions".into());
    }
    Ok(n)
}

/// One run of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned<T> {
    pub rep: usize,
    /// Index into the scenarios.
    pub scenario: usize,
    pub config: T,
}

/// xorshift64*: a reproducible order from the printed seed.
pub fn shuffled<T: Clone>(items: &[T], state: &mut u64) -> Vec<T> {
    let mut v = items.to_vec();
    for i in (1..v.len()).rev() {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let j = (state.wrapping_mul(0x2545_f491_4f6c_dd1d) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// Every (scenario, configuration) `reps` times: each repetition a block
/// holding every cell once, shuffled from `seed` (so a drift of the host
/// over the run spreads over all cells alike).
pub fn plan<T: Clone>(scenarios: usize, configs: &[T], reps: usize, seed: u64) -> Vec<Planned<T>> {
    let cells: Vec<(usize, T)> = (0..scenarios)
        .flat_map(|s| configs.iter().map(move |c| (s, c.clone())))
        .collect();
    let mut state = seed | 1;
    (0..reps)
        .flat_map(|rep| {
            shuffled(&cells, &mut state)
                .into_iter()
                .map(move |(scenario, config)| Planned {
                    rep,
                    scenario,
                    config,
                })
        })
        .collect()
}

/// Highest CPU a schedule asks for, in millicores, at `burn_us` a request.
pub fn peak_demand_m(phases: &[Phase], burn_us: u64) -> f64 {
    phases
        .iter()
        .map(|p| p.rate_per_s * burn_us as f64 / 1000.0)
        .fold(0.0, f64::max)
}

/// The `[from, to)` offsets (s from the schedule's start) of its phases
/// named `name`, in order.
pub fn phase_windows(phases: &[Phase], name: &str) -> Vec<(f64, f64)> {
    phases
        .iter()
        .zip(schedule::phase_starts(phases))
        .filter(|(p, _)| p.name == name)
        .map(|(p, start)| (start.as_secs_f64(), (start + p.duration).as_secs_f64()))
        .collect()
}

/// Indices of its phases named `name`.
pub fn phase_indices(phases: &[Phase], name: &str) -> Vec<usize> {
    phases
        .iter()
        .enumerate()
        .filter(|(_, p)| p.name == name)
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Scenario> {
        NAMES
            .iter()
            .map(|n| scenario(n, MixedSchedules::default()).unwrap())
            .collect()
    }

    #[test]
    fn five_scenarios_of_equal_length_and_their_parties() {
        let s = all();
        assert_eq!(
            s.iter().map(|s| s.name).collect::<Vec<_>>(),
            ["mixed", "short", "alone", "pair", "flicker"]
        );
        for sc in &s {
            assert_eq!(sc.total().as_secs(), 80, "{}", sc.name);
        }
        let p: Vec<Parties> = s.iter().map(Scenario::parties).collect();
        assert!(p[0].within && p[0].batch && !p[0].svc2 && p[0].vs_nolimit);
        assert!(p[1].within && p[1].batch && !p[1].vs_nolimit);
        assert!(!p[2].within && !p[2].batch && !p[2].svc2);
        assert!(p[3].svc2 && p[3].within && !p[3].batch);
        assert!(p[4].within && p[4].batch && !p[4].svc2 && !p[4].vs_nolimit && p[4].episodes);
        assert!(p[..4].iter().all(|p| !p.episodes));
        // The pair's services burst together.
        assert_eq!(s[3].svc2.as_ref(), Some(&s[3].svc));
        assert!(scenario("nope", MixedSchedules::default()).is_err());
    }

    #[test]
    fn short_bursts_to_the_ceiling_and_its_neighbour_stays_within_its_request() {
        let short = scenario("short", MixedSchedules::default()).unwrap();
        assert!(peak_demand_m(&short.svc, 25_000) >= 800.0);
        let w = peak_demand_m(short.within.as_ref().unwrap(), 25_000);
        assert!((w - 450.0).abs() < 1e-9 && w <= 500.0, "{w}");
        // mixed: 1.5 × the 300m limit, the neighbour at 150m.
        let mixed = scenario("mixed", MixedSchedules::default()).unwrap();
        assert!((peak_demand_m(&mixed.svc, 25_000) - 450.0).abs() < 1e-9);
        assert!((peak_demand_m(mixed.within.as_ref().unwrap(), 25_000) - 150.0).abs() < 1e-9);
    }

    #[test]
    fn flicker_is_short_and_its_neighbours_need_comes_and_goes_every_2_to_8_s() {
        let f = scenario("flicker", MixedSchedules::default()).unwrap();
        // Short as in `short`: the service at its ceiling, the batch
        // neighbour's 0.8 CPU, all through the burst.
        assert!(peak_demand_m(&f.svc, 25_000) >= 800.0);
        assert_eq!(phase_windows(&f.svc, "burst"), [(5.0, 75.0)]);
        assert_eq!(
            phase_windows(f.batch.as_ref().unwrap(), "demand"),
            [(5.0, 75.0)]
        );
        let w = f.within.as_ref().unwrap();
        assert!((peak_demand_m(w, 25_000) - 450.0).abs() < 1e-9);
        assert_eq!(schedule::total(w).as_secs(), 80);
        // After the lead-in, on and off in turn, each 2–8 s, within the burst.
        let flick = &w[1..w.len() - 1];
        assert!(flick.len() >= 8, "{flick:?}");
        for (i, p) in flick.iter().enumerate() {
            assert_eq!(p.name, if i % 2 == 0 { "contended" } else { "rest" });
            let d = p.duration.as_secs_f64();
            assert!((2.0..=8.0).contains(&d), "{p:?}");
            assert_eq!(d.fract(), 0.0);
            let rate = if i % 2 == 0 { 18.0 } else { 0.4 };
            assert_eq!(p.rate_per_s, rate);
        }
        let need = phase_windows(w, "contended");
        assert_eq!(need[0].0, 10.0);
        let eps = episodes(w, "contended");
        assert_eq!(eps.len(), need.len());
        assert!(eps.last().unwrap().1 <= 70.0, "{eps:?}");
        // Irregular: needs both shorter and longer than the agent's 5 s
        // contention window, pauses both shorter and longer than it.
        let lengths = |name: &str| -> Vec<f64> {
            phase_windows(w, name).iter().map(|(a, b)| b - a).collect()
        };
        assert_eq!(lengths("contended"), [8.0, 3.0, 2.0, 6.0, 8.0, 2.0]);
        assert_eq!(lengths("rest"), [6.0, 7.0, 4.0, 2.0, 8.0, 4.0]);
        assert_eq!(
            eps,
            [
                (10.0, 24.0),
                (24.0, 34.0),
                (34.0, 40.0),
                (40.0, 48.0),
                (48.0, 64.0),
                (64.0, 70.0)
            ]
        );
        // The same seed, the same pattern; another seed, another.
        assert_eq!(flicker_within(FLICKER_SEED), flicker_within(FLICKER_SEED));
        assert_ne!(
            flicker_within(FLICKER_SEED),
            flicker_within(FLICKER_SEED + 2)
        );
    }

    #[test]
    fn an_episode_is_a_need_and_the_pause_after_it() {
        let w = schedule::parse(
            "idle:10@0.4,contended:3@18,rest:5@0.4,contended:2@18,contended:1@18,rest:4@0.4,\
             idle:10@0.4,contended:2@18",
        )
        .unwrap();
        // Consecutive need phases are one episode; each takes the pause
        // after it; a need that ends the schedule has none.
        assert_eq!(
            episodes(&w, "contended"),
            [(10.0, 18.0), (18.0, 25.0), (35.0, 37.0)]
        );
        // Episodes tile the time from the first need on up to the last
        // pause's end: no gap between an episode and the next need.
        let f = scenario("flicker", MixedSchedules::default()).unwrap();
        let eps = episodes(f.within.as_ref().unwrap(), "contended");
        assert!(eps.windows(2).all(|x| x[0].1 == x[1].0), "{eps:?}");
        assert!(episodes(&w, "nope").is_empty());
        // Scenarios without a need that comes and goes have one episode
        // per contended phase at most.
        let short = scenario("short", MixedSchedules::default()).unwrap();
        assert_eq!(
            episodes(short.within.as_ref().unwrap(), "contended"),
            [(57.0, 80.0)]
        );
    }

    #[test]
    fn mixed_takes_the_schedules_given() {
        let m = scenario(
            "mixed",
            MixedSchedules {
                svc: "burst:5@10",
                ..MixedSchedules::default()
            },
        )
        .unwrap();
        assert_eq!(m.svc.len(), 1);
        let bad = scenario(
            "mixed",
            MixedSchedules {
                within: "x",
                ..MixedSchedules::default()
            },
        );
        assert!(bad.unwrap_err().starts_with("BENEFIT_WITHIN_SCHEDULE"));
    }

    #[test]
    fn scenario_lists() {
        assert_eq!(scenario_names(None).unwrap(), NAMES);
        assert_eq!(scenario_names(Some(" ")).unwrap(), NAMES);
        assert_eq!(
            scenario_names(Some("pair, mixed")).unwrap(),
            ["pair", "mixed"]
        );
        assert!(scenario_names(Some("mixed,nope")).is_err());
        assert!(scenario_names(Some("mixed,mixed")).is_err());
    }

    #[test]
    fn quick_is_one_repetition_whatever_reps_says() {
        assert_eq!(reps(None, None), Ok(3));
        assert_eq!(reps(None, Some("5")), Ok(5));
        assert_eq!(reps(Some("full"), Some("2")), Ok(2));
        assert_eq!(reps(Some("quick"), Some("5")), Ok(1));
        assert_eq!(reps(Some("quick"), None), Ok(1));
        assert!(reps(Some("slow"), None).is_err());
        assert!(reps(None, Some("x")).is_err());
        assert!(reps(None, Some("0")).is_err());
    }

    #[test]
    fn the_plan_holds_every_cell_once_a_repetition_in_a_seeded_order() {
        let configs = ["a", "b", "c", "e"];
        let p = plan(4, &configs, 3, 42);
        assert_eq!(p.len(), 48);
        for rep in 0..3 {
            let mut cells: Vec<(usize, &str)> = p
                .iter()
                .filter(|r| r.rep == rep)
                .map(|r| (r.scenario, r.config))
                .collect();
            assert_eq!(cells.len(), 16);
            cells.sort_unstable();
            cells.dedup();
            assert_eq!(cells.len(), 16, "each cell once in repetition {rep}");
        }
        // Repetitions in order, blocks of 16.
        assert!(p.windows(2).all(|w| w[0].rep <= w[1].rep));
        assert_eq!(p, plan(4, &configs, 3, 42), "reproducible");
        // (The seed is made odd: 42 and 43 are one seed.)
        assert_ne!(p, plan(4, &configs, 3, 44), "the seed matters");
        // Shuffled across scenarios, not scenario by scenario.
        let first: Vec<usize> = p[..16].iter().map(|r| r.scenario).collect();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_ne!(first, sorted);
        assert!(plan::<&str>(4, &[], 3, 1).is_empty());
    }

    #[test]
    fn windows_of_named_phases() {
        let s = scenario("pair", MixedSchedules::default()).unwrap();
        assert_eq!(phase_windows(&s.svc, "burst"), [(10.0, 35.0), (50.0, 75.0)]);
        assert_eq!(
            phase_windows(s.within.as_ref().unwrap(), "contended"),
            phase_windows(&s.svc, "burst"),
            "the pair's neighbour is contended while both services burst"
        );
        assert_eq!(phase_indices(&s.svc, "burst"), [1, 3]);
        let m = scenario("mixed", MixedSchedules::default()).unwrap();
        assert_eq!(
            phase_windows(m.within.as_ref().unwrap(), "contended"),
            phase_windows(m.batch.as_ref().unwrap(), "demand"),
        );
        assert!(phase_windows(&m.svc, "nope").is_empty());
    }
}
