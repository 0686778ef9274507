//! Split of a pod's managed total over its managed containers.

use smallvec::SmallVec;

use crate::model::Millis;

/// One part per container, in line up to four (see
/// [`super::eligibility::ManagedContainers`]).
pub type Parts = SmallVec<[Millis; 4]>;

/// Splits `total_m` over containers with the given CPU requests.
///
/// The excess over Σ requests is handed out in whole quanta in proportion
/// to the requests (largest remainder, ties to the earlier container); a
/// remainder smaller than a quantum (from a floor that is not on the
/// quantum grid) goes to the container with the largest request. Every
/// container gets at least its request, and the parts add up to
/// `max(total_m, Σ requests)`.
pub fn split(total_m: Millis, requests_m: &[Millis], quantum_m: Millis) -> Parts {
    let q = quantum_m.max(1);
    let sum: Millis = requests_m.iter().sum();
    let mut out: Parts = requests_m.into();
    if out.is_empty() || total_m <= sum {
        return out;
    }
    let excess = total_m - sum;
    let quanta = u128::from(excess / q);
    let rem = excess % q;
    // Largest request gets the odd remainder; with all-zero requests, the first.
    let big = requests_m
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i);
    if sum == 0 {
        // No weights: spread evenly.
        let n = out.len() as u128;
        for (i, o) in out.iter_mut().enumerate() {
            let k = quanta / n + u128::from((i as u128) < quanta % n);
            *o += (k as Millis) * q;
        }
        out[big] += rem;
        return out;
    }
    let total_w = u128::from(sum);
    let mut given: u128 = 0;
    let mut rema: SmallVec<[(u128, usize); 4]> = SmallVec::with_capacity(out.len());
    for (i, (o, r)) in out.iter_mut().zip(requests_m).enumerate() {
        let num = quanta * u128::from(*r);
        let k = num / total_w;
        given += k;
        *o += (k as Millis) * q;
        rema.push((num % total_w, i));
    }
    // Hand out the quanta lost to rounding: largest remainder first.
    rema.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in rema.iter().take((quanta - given) as usize) {
        out[i] += q;
    }
    out[big] += rem;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_to_requests() {
        assert_eq!(split(800, &[100, 300], 10).as_slice(), [200, 600]);
    }

    #[test]
    fn parts_add_up_and_stay_on_the_grid() {
        let parts = split(1000, &[100, 100, 100], 10);
        assert_eq!(parts.iter().sum::<Millis>(), 1000);
        assert_eq!(parts.as_slice(), [340, 330, 330]);
    }

    #[test]
    fn off_grid_remainder_goes_to_the_largest_request() {
        // Learned floor 357 over requests 100 + 200.
        let parts = split(357, &[100, 200], 10);
        assert_eq!(parts.as_slice(), [120, 237]);
    }

    #[test]
    fn every_container_keeps_its_request() {
        let parts = split(130, &[100, 5, 5], 10);
        assert_eq!(parts.iter().sum::<Millis>(), 130);
        for (p, r) in parts.iter().zip([100, 5, 5]) {
            assert!(*p >= r);
        }
    }

    #[test]
    fn total_below_requests_returns_requests() {
        assert_eq!(split(50, &[100, 200], 10).as_slice(), [100, 200]);
    }

    #[test]
    fn one_quantum_over_requests_lifts_exactly_one_container() {
        let parts = split(210, &[100, 100], 10);
        assert_eq!(parts.as_slice(), [110, 100]);
    }
}
