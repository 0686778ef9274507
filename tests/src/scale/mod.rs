//! Pure parts and small I/O helpers of the fleet-scale bench
//! (`tests/benches/scale.rs`): the per-node pod mix, curve fits for the
//! extrapolation, the apiserver's audit log, a byte-counting relay, and
//! Markdown tables.

pub mod audit;
pub mod fit;
pub mod proxy;

use crate::workload::{FOOTPRINT_MIX, Kind};

/// The footprint bench's mix (160/40/20/15/15 of 250) scaled to `pods`
/// pods by largest remainder, so the kinds keep their shares and the
/// counts add up to `pods` exactly.
pub fn scaled_mix(pods: usize) -> Vec<(Kind, usize)> {
    let total: usize = FOOTPRINT_MIX.iter().map(|(_, n)| n).sum();
    let mut out: Vec<(Kind, usize, usize)> = FOOTPRINT_MIX
        .iter()
        .map(|&(k, n)| (k, n * pods / total, n * pods % total))
        .collect();
    let mut left = pods - out.iter().map(|x| x.1).sum::<usize>();
    let mut order: Vec<usize> = (0..out.len()).collect();
    // Largest remainder first; ties to the earlier (bigger) kind.
    order.sort_by(|&a, &b| out[b].2.cmp(&out[a].2).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        out[i].1 += 1;
        left -= 1;
    }
    out.into_iter().map(|(k, n, _)| (k, n)).collect()
}

/// The `q`-quantile (0..=1) of `v` by the nearest-rank method; `None` when
/// empty.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s: Vec<f64> = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = (q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.saturating_sub(1).min(s.len() - 1)])
}

/// A Markdown table: a header row, a separator, then `rows` (cells are
/// padded to the widest of their column; a short row is padded with empty
/// cells).
pub fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header
        .len()
        .max(rows.iter().map(Vec::len).max().unwrap_or(0));
    let cell = |r: &[String], i: usize| r.get(i).cloned().unwrap_or_default();
    let head: Vec<String> = header.iter().map(|s| s.to_string()).collect();
    let mut width = vec![3; cols];
    for r in std::iter::once(&head).chain(rows) {
        for (i, w) in width.iter_mut().enumerate() {
            *w = (*w).max(cell(r, i).chars().count());
        }
    }
    let line = |r: &[String]| {
        let cells: Vec<String> = (0..cols)
            .map(|i| format!("{:<w$}", cell(r, i), w = width[i]))
            .collect();
        format!("| {} |", cells.join(" | "))
    };
    let mut out = vec![line(&head)];
    out.push(format!(
        "|{}|",
        width
            .iter()
            .map(|w| "-".repeat(w + 2))
            .collect::<Vec<_>>()
            .join("|")
    ));
    out.extend(rows.iter().map(|r| line(r)));
    out.join("\n")
}

/// A figure with a sensible number of digits (3 significant, no
/// exponent), e.g. 0.0123, 1.23, 123, 12300.
pub fn sig3(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let a = x.abs();
    let decimals = if a == 0.0 || a >= 100.0 {
        0
    } else {
        (2 - a.log10().floor() as i32).max(0) as usize
    };
    format!("{x:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_at_250_is_the_footprint_mix() {
        assert_eq!(scaled_mix(250), FOOTPRINT_MIX.to_vec());
    }

    #[test]
    fn a_scaled_mix_adds_up_and_keeps_every_kind_with_enough_pods() {
        for p in [1, 7, 20, 50, 110, 333] {
            let m = scaled_mix(p);
            assert_eq!(m.iter().map(|x| x.1).sum::<usize>(), p, "{p}: {m:?}");
        }
        let m = scaled_mix(20);
        assert_eq!(m[0], (Kind::Managed1, 13));
        assert!(m.iter().all(|(_, n)| *n >= 1), "{m:?}");
        assert_eq!(scaled_mix(0).iter().map(|x| x.1).sum::<usize>(), 0);
    }

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(quantile(&v, 0.5), Some(3.0));
        assert_eq!(quantile(&v, 0.99), Some(5.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn a_table_pads_columns_and_short_rows() {
        let t = markdown_table(
            &["a", "long"],
            &[vec!["xyz".into()], vec!["1".into(), "2".into()]],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "| a   | long |");
        assert_eq!(lines[1], "|-----|------|");
        assert_eq!(lines[2], "| xyz |      |");
        assert_eq!(lines[3], "| 1   | 2    |");
    }

    #[test]
    fn sig3_keeps_three_significant_digits() {
        assert_eq!(sig3(0.012345), "0.0123");
        assert_eq!(sig3(1.2345), "1.23");
        assert_eq!(sig3(12.345), "12.3");
        assert_eq!(sig3(12345.6), "12346");
        assert_eq!(sig3(0.0), "0");
        assert_eq!(sig3(f64::NAN), "n/a");
    }
}
