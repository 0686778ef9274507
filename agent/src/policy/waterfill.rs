//! Water-filling of the slack over managed pods, weight = CPU request, in
//! whole quanta, exact integer arithmetic.
//!
//! Each pod climbs from its floor in steps to `request + k·quantum`; step k
//! of pod i opens at water level `λ = k·quantum / request_i` (share per
//! millicore of request). Steps are taken in one global order — by λ, then
//! by index — as long as the budget covers them; the first step that does
//! not fit ends the round. Since the order does not depend on the budget, a
//! larger budget takes a longer prefix of the same sequence: targets are
//! monotonic in slack. The floors' excess over requests is paid first.
//! To avoid one heap step per quantum on big nodes, a floating-point search
//! first finds a level just below where the budget ends and jumps every pod
//! there in one exact integer pass (a prefix of the same order).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::model::Millis;

/// One pod to fill. Needs `request_m > 0` and `request_m ≤ floor_m ≤ ceiling_m`
/// (violations are repaired: floor lifted to the request, ceiling to the
/// floor). A ceiling off the grid `request + k·quantum` is reached by a last,
/// partial step, taken in the order of the full step it cuts short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillItem {
    pub request_m: Millis,
    pub floor_m: Millis,
    pub ceiling_m: Millis,
}

/// Targets per item, each in `[floor, ceiling]`, with
/// `Σ(target − request) ≤ max(budget, Σ(floor − request))`, and less than
/// one quantum left unused when no ceiling is hit.
pub fn fill(items: &[FillItem], budget_m: Millis, quantum_m: Millis) -> Vec<Millis> {
    let q = quantum_m.max(1);
    let (norm, mut targets, left) = at_floors(items, budget_m);
    let Some(mut left) = left else {
        return targets;
    };
    // Everyone fits up to the ceiling: skip the stepping.
    let room: u128 = norm
        .iter()
        .map(|it| u128::from(it.ceiling_m - it.floor_m))
        .sum();
    if room <= left {
        return norm.iter().map(|it| it.ceiling_m).collect();
    }
    // Jump close to where the budget runs out, then step exactly.
    let a = jump_level(&norm, left, q);
    if a > 0 {
        let jumped: Vec<Millis> = norm.iter().map(|it| value_at(it, a, q)).collect();
        let cost: u128 = jumped
            .iter()
            .zip(&norm)
            .map(|(v, it)| u128::from(v - it.floor_m))
            .sum();
        if cost <= left {
            left -= cost;
            targets = jumped;
        }
    }
    step_from(&norm, &mut targets, left, q);
    targets
}

/// Where both fills start: the items repaired, every target at its floor,
/// and the budget left above the floors (`None` when even they exceed it).
fn at_floors(items: &[FillItem], budget_m: Millis) -> (Vec<FillItem>, Vec<Millis>, Option<u128>) {
    let norm = normalize(items);
    let targets = norm.iter().map(|it| it.floor_m).collect();
    let floors_excess: u128 = norm
        .iter()
        .map(|it| u128::from(it.floor_m - it.request_m))
        .sum();
    let left = u128::from(budget_m).checked_sub(floors_excess);
    (norm, targets, left)
}

/// Repairs items (ceiling ≥ floor ≥ request ≥ 1).
fn normalize(items: &[FillItem]) -> Vec<FillItem> {
    items
        .iter()
        .map(|it| {
            let request_m = it.request_m.max(1);
            let floor_m = it.floor_m.max(request_m);
            FillItem {
                request_m,
                floor_m,
                ceiling_m: it.ceiling_m.max(floor_m),
            }
        })
        .collect()
}

/// Takes steps in the global order from `targets` while `left` covers them.
fn step_from(norm: &[FillItem], targets: &mut [Millis], mut left: u128, q: Millis) {
    let mut heap = BinaryHeap::with_capacity(norm.len());
    for (i, it) in norm.iter().enumerate() {
        if let Some(s) = next_step(it, targets[i], q, i) {
            heap.push(Reverse(s));
        }
    }
    while let Some(Reverse(s)) = heap.pop() {
        let it = &norm[s.index];
        let cost = u128::from(s.value - targets[s.index]);
        if cost > left {
            break;
        }
        left -= cost;
        targets[s.index] = s.value;
        if let Some(n) = next_step(it, s.value, q, s.index) {
            heap.push(Reverse(n));
        }
    }
}

/// Reference: the same greedy, one step at a time from the floors.
#[cfg(test)]
pub(crate) fn fill_stepwise(
    items: &[FillItem],
    budget_m: Millis,
    quantum_m: Millis,
) -> Vec<Millis> {
    let q = quantum_m.max(1);
    let (norm, mut targets, left) = at_floors(items, budget_m);
    if let Some(left) = left {
        step_from(&norm, &mut targets, left, q);
    }
    targets
}

/// Level denominator of the jump: λ = a / JUMP_DEN.
const JUMP_DEN: u128 = 1 << 32;

/// Value of `it` once every step with λ ≤ a / JUMP_DEN is taken (exact).
fn value_at(it: &FillItem, a: u128, q: Millis) -> Millis {
    // Step k is taken iff k·q·D ≤ a·r  ⇔  k ≤ a·r / (q·D).
    let k = a.saturating_mul(u128::from(it.request_m)) / (u128::from(q) * JUMP_DEN);
    let v = u128::from(it.request_m).saturating_add(k.saturating_mul(u128::from(q)));
    Millis::try_from(v)
        .unwrap_or(Millis::MAX)
        .clamp(it.floor_m, it.ceiling_m)
}

/// A level a little below where the budget runs out, found in floating
/// point; [`value_at`] makes it exact and the caller checks its cost, so
/// rounding here can only cost speed, never correctness. 0 = no jump.
fn jump_level(items: &[FillItem], left: u128, q: Millis) -> u128 {
    let qf = q as f64;
    let cost = |lambda: f64| -> f64 {
        items
            .iter()
            .map(|it| {
                let r = it.request_m as f64;
                let v = (r + (lambda * r / qf).floor() * qf)
                    .clamp(it.floor_m as f64, it.ceiling_m as f64);
                v - it.floor_m as f64
            })
            .sum()
    };
    let budget = left as f64;
    let mut lo = 0.0;
    let mut hi = items
        .iter()
        .map(|it| (it.ceiling_m - it.request_m) as f64 / it.request_m as f64)
        .fold(0.0, f64::max);
    for _ in 0..64 {
        let mid = (lo + hi) / 2.0;
        if cost(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= lo * 1e-12 {
            break;
        }
    }
    let a = lo * (1.0 - 1e-9) * JUMP_DEN as f64;
    if a.is_finite() && a >= 1.0 {
        a as u128
    } else {
        0
    }
}

/// The next step above `current`: `request + k·q`, or the ceiling when that
/// is nearer (a partial last step, ordered as the full step k).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    /// k·q: excess over the request at this step (λ numerator).
    excess: u128,
    /// request (λ denominator).
    weight: u128,
    index: usize,
    value: Millis,
}

fn next_step(it: &FillItem, current: Millis, q: Millis, index: usize) -> Option<Step> {
    if current >= it.ceiling_m {
        return None;
    }
    let k = u128::from(current - it.request_m) / u128::from(q) + 1;
    let excess = k * u128::from(q);
    let value = (u128::from(it.request_m) + excess).min(u128::from(it.ceiling_m));
    Some(Step {
        excess,
        weight: u128::from(it.request_m),
        index,
        value: Millis::try_from(value).unwrap_or(it.ceiling_m),
    })
}

impl Ord for Step {
    fn cmp(&self, other: &Self) -> Ordering {
        // excess/weight vs other.excess/other.weight without division; the
        // operands are about < 2^64, so the products fit in u128.
        (self.excess.saturating_mul(other.weight))
            .cmp(&other.excess.saturating_mul(self.weight))
            .then(self.index.cmp(&other.index))
    }
}

impl PartialOrd for Step {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn it(request_m: Millis, floor_m: Millis, ceiling_m: Millis) -> FillItem {
        FillItem {
            request_m,
            floor_m,
            ceiling_m,
        }
    }

    /// What it shows, items as (request, floor, ceiling), budget, and the
    /// targets at a 10m quantum.
    type FillCase = (
        &'static str,
        &'static [(Millis, Millis, Millis)],
        Millis,
        &'static [Millis],
    );

    // One row a line, so the table reads as one.
    #[rustfmt::skip]
    const FILLS: &[FillCase] = &[
        ("shares are proportional to requests", &[(100, 100, 1000), (300, 300, 3000)], 400, &[200, 600]),
        ("ceilings cap and the rest flows to others", &[(100, 100, 150), (100, 100, 1000)], 400, &[150, 450]),
        ("an idle node reaches all ceilings", &[(100, 100, 400), (250, 250, 1000)], 100_000, &[400, 1000]),
        ("a zero budget gives floors", &[(100, 110, 400), (250, 250, 1000)], 0, &[110, 250]),
        // Floor 500 on a 100m request costs 400 of the 450 budget; the other pod gets the remaining 50.
        ("floor excess is paid from the budget first", &[(100, 500, 1000), (100, 100, 1000)], 450, &[500, 150]),
        ("ties break by index", &[(100, 100, 1000), (100, 100, 1000)], 10, &[110, 100]),
        ("bad items are repaired", &[(0, 0, 0), (100, 50, 20)], 1000, &[1, 100]),
    ];

    #[test]
    fn fill_cases() {
        for &(what, items, budget, want) in FILLS {
            let items: Vec<FillItem> = items.iter().map(|&(r, f, c)| it(r, f, c)).collect();
            assert_eq!(fill(&items, budget, 10), want, "{what}");
        }
    }

    #[test]
    fn targets_are_request_plus_whole_quanta() {
        let t = fill(&[it(105, 105, 1000), it(33, 33, 1000)], 57, 10);
        for (x, r) in t.iter().zip([105, 33]) {
            assert_eq!((x - r) % 10, 0, "target {x} request {r}");
        }
        let spent: Millis = t[0] - 105 + t[1] - 33;
        assert!(spent <= 57 && spent > 57 - 10, "spent {spent}");
    }

    fn arb_items() -> impl Strategy<Value = Vec<FillItem>> {
        proptest::collection::vec((1u64..3000, 0u64..500, 0u64..6000), 1..12).prop_map(|v| {
            v.into_iter()
                .map(|(r, f, c)| FillItem {
                    request_m: r,
                    floor_m: r + f,
                    ceiling_m: r + f + c,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn fill_is_monotonic_in_budget(items in arb_items(), b1 in 0u64..40_000, b2 in 0u64..40_000) {
            let lo = fill(&items, b1.min(b2), 10);
            let hi = fill(&items, b1.max(b2), 10);
            for (l, h) in lo.iter().zip(&hi) {
                prop_assert!(l <= h);
            }
        }

        #[test]
        fn fill_stays_in_bounds_and_wastes_under_a_quantum(items in arb_items(), budget in 0u64..40_000) {
            let t = fill(&items, budget, 10);
            let floors: Millis = items.iter().map(|i| i.floor_m - i.request_m).sum();
            let spent: Millis = t.iter().zip(&items).map(|(t, i)| t - i.request_m).sum();
            prop_assert!(spent <= budget.max(floors));
            // Capped: no further step of 10m fits under the ceiling.
            let all_capped = t.iter().zip(&items).all(|(t, i)| *t + 10 > i.ceiling_m);
            if budget >= floors && !all_capped {
                prop_assert!(budget - spent < 10, "budget {} spent {}", budget, spent);
            }
            for (t, i) in t.iter().zip(&items) {
                prop_assert!(i.floor_m <= *t && *t <= i.ceiling_m);
            }
        }
    }

    proptest! {
        #[test]
        fn fill_with_jump_equals_stepwise_greedy(items in arb_items(), budget in 0u64..200_000, q in 1u64..50) {
            prop_assert_eq!(fill(&items, budget, q), fill_stepwise(&items, budget, q));
        }
    }
}
