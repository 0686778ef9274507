//! Curve fits for the scale bench: a least-squares line `y = a + b·x` (the
//! per-node slope is what extrapolates) and a log-log power fit `y = c·x^k`
//! whose exponent says whether the measured curve is linear (k ≈ 1),
//! sub-linear or super-linear, so an extrapolation is not trusted blindly.

/// `y = intercept + slope·x` fitted by least squares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    pub intercept: f64,
    pub slope: f64,
    /// Coefficient of determination (1 = every point on the line).
    pub r2: f64,
}

/// Why no fit was made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error("need at least 2 points with distinct x, got {0}")]
    TooFewPoints(usize),
    #[error("a point is not finite: ({0}, {1})")]
    NotFinite(f64, f64),
    #[error("a power fit needs x > 0 and y > 0, got ({0}, {1})")]
    NotPositive(f64, f64),
}

impl Line {
    pub fn at(&self, x: f64) -> f64 {
        self.intercept + self.slope * x
    }
}

/// Least-squares line through `points` (x, y).
pub fn line(points: &[(f64, f64)]) -> Result<Line, FitError> {
    if let Some(&(x, y)) = points
        .iter()
        .find(|(x, y)| !x.is_finite() || !y.is_finite())
    {
        return Err(FitError::NotFinite(x, y));
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if points.len() < 2 || sxx == 0.0 {
        return Err(FitError::TooFewPoints(points.len()));
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let ss_res: f64 = points
        .iter()
        .map(|p| (p.1 - (intercept + slope * p.0)).powi(2))
        .sum();
    let r2 = if ss_tot == 0.0 {
        1.0
    } else {
        1.0 - ss_res / ss_tot
    };
    Ok(Line {
        intercept,
        slope,
        r2,
    })
}

/// `y = coeff · x^exponent`, fitted as a line in log-log space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Power {
    pub coeff: f64,
    pub exponent: f64,
    /// r² in log-log space.
    pub r2: f64,
}

impl Power {
    pub fn at(&self, x: f64) -> f64 {
        self.coeff * x.powf(self.exponent)
    }
}

pub fn power(points: &[(f64, f64)]) -> Result<Power, FitError> {
    if let Some(&(x, y)) = points.iter().find(|(x, y)| !(*x > 0.0 && *y > 0.0)) {
        return Err(FitError::NotPositive(x, y));
    }
    let logs: Vec<(f64, f64)> = points.iter().map(|(x, y)| (x.ln(), y.ln())).collect();
    let l = line(&logs)?;
    Ok(Power {
        coeff: l.intercept.exp(),
        exponent: l.slope,
        r2: l.r2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_through_exact_points_is_recovered() {
        let pts: Vec<(f64, f64)> = [1.0, 10.0, 25.0, 50.0, 100.0]
            .iter()
            .map(|&x| (x, 3.0 + 0.5 * x))
            .collect();
        let l = line(&pts).unwrap();
        assert!((l.slope - 0.5).abs() < 1e-9, "{l:?}");
        assert!((l.intercept - 3.0).abs() < 1e-9, "{l:?}");
        assert!((l.r2 - 1.0).abs() < 1e-12);
        assert!((l.at(5000.0) - 2503.0).abs() < 1e-6);
    }

    #[test]
    fn noise_lowers_r2_below_one() {
        let pts = [(1.0, 1.0), (2.0, 3.0), (3.0, 2.0), (4.0, 5.0)];
        let l = line(&pts).unwrap();
        assert!(l.r2 < 1.0 && l.r2 > 0.0, "{l:?}");
        assert!(l.slope > 0.0);
    }

    #[test]
    fn one_point_or_one_x_is_refused() {
        assert_eq!(line(&[(1.0, 2.0)]), Err(FitError::TooFewPoints(1)));
        assert_eq!(
            line(&[(3.0, 2.0), (3.0, 5.0)]),
            Err(FitError::TooFewPoints(2))
        );
        assert_eq!(line(&[]), Err(FitError::TooFewPoints(0)));
    }

    #[test]
    fn non_finite_points_are_refused() {
        assert!(matches!(
            line(&[(1.0, f64::NAN), (2.0, 1.0)]),
            Err(FitError::NotFinite(..))
        ));
    }

    #[test]
    fn power_fit_finds_the_exponent() {
        let quad: Vec<(f64, f64)> = [1.0, 10.0, 25.0, 50.0, 100.0]
            .iter()
            .map(|&x| (x, 2.0 * x * x))
            .collect();
        let p = power(&quad).unwrap();
        assert!((p.exponent - 2.0).abs() < 1e-9, "{p:?}");
        assert!((p.coeff - 2.0).abs() < 1e-9, "{p:?}");
        assert!((p.at(3.0) - 18.0).abs() < 1e-6);
    }

    #[test]
    fn power_fit_refuses_zero_or_negative() {
        assert!(matches!(
            power(&[(1.0, 0.0), (2.0, 1.0)]),
            Err(FitError::NotPositive(..))
        ));
        assert!(matches!(
            power(&[(0.0, 1.0), (2.0, 1.0)]),
            Err(FitError::NotPositive(..))
        ));
    }
}
