//! Kubernetes resource quantities ("500m", "1.5", "2", "128Mi", "1e3") as
//! integers: CPU in millicores, memory in bytes. Rounds up like the
//! apiserver's `MilliValue()`/`Value()` so a floor is never understated.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid quantity {0:?}")]
pub struct QuantityError(pub String);

/// Parses a CPU quantity into millicores (rounded up).
pub fn cpu_millis(q: &str) -> Result<u64, QuantityError> {
    scaled(q, 3)
}

/// Parses a memory (or any integer) quantity into units (rounded up).
pub fn bytes(q: &str) -> Result<u64, QuantityError> {
    scaled(q, 0)
}

/// Formats millicores the way kubectl would write them back ("800m", "2").
pub fn format_cpu_millis(m: u64) -> String {
    if m.is_multiple_of(1000) {
        format!("{}", m / 1000)
    } else {
        format!("{m}m")
    }
}

/// Value of `q` × 10^`exp10`, rounded up, as an integer.
fn scaled(q: &str, exp10: i32) -> Result<u64, QuantityError> {
    let err = || QuantityError(q.to_string());
    let s = q.trim();
    if s.is_empty() || s.starts_with('-') {
        return Err(err());
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    // Split number and suffix.
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num.matches('.').count() > 1 || num == "." {
        return Err(err());
    }
    let (mult_num, mult_den, mut exp): (u128, u128, i32) = match suffix {
        "" => (1, 1, 0),
        "m" => (1, 1, -3),
        "u" => (1, 1, -6),
        "n" => (1, 1, -9),
        "k" => (1, 1, 3),
        "M" => (1, 1, 6),
        "G" => (1, 1, 9),
        "T" => (1, 1, 12),
        "P" => (1, 1, 15),
        "E" => (1, 1, 18),
        "Ki" => (1 << 10, 1, 0),
        "Mi" => (1 << 20, 1, 0),
        "Gi" => (1 << 30, 1, 0),
        "Ti" => (1 << 40, 1, 0),
        "Pi" => (1 << 50, 1, 0),
        "Ei" => (1 << 60, 1, 0),
        e if e.starts_with(['e', 'E']) => {
            let x: i32 = e[1..].parse().map_err(|_| err())?;
            if !(-30..=30).contains(&x) {
                return Err(err());
            }
            (1, 1, x)
        }
        _ => return Err(err()),
    };
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.len() + frac_part.len() > 30 {
        return Err(err());
    }
    let digits = format!("{int_part}{frac_part}");
    let mut value: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| err())?
    };
    exp -= frac_part.len() as i32;
    exp += exp10;
    value = value.checked_mul(mult_num).ok_or_else(err)? / mult_den;
    let out = if exp >= 0 {
        let p = 10u128.checked_pow(exp as u32).ok_or_else(err)?;
        value.checked_mul(p).ok_or_else(err)?
    } else {
        let p = 10u128.checked_pow((-exp) as u32).ok_or_else(err)?;
        value.div_ceil(p)
    };
    u64::try_from(out).map_err(|_| err())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_forms() {
        assert_eq!(cpu_millis("500m").unwrap(), 500);
        assert_eq!(cpu_millis("1").unwrap(), 1000);
        assert_eq!(cpu_millis("1.5").unwrap(), 1500);
        assert_eq!(cpu_millis("0.1").unwrap(), 100);
        assert_eq!(cpu_millis("100u").unwrap(), 1, "rounds up like MilliValue");
        assert_eq!(cpu_millis("1e3").unwrap(), 1_000_000);
        assert_eq!(cpu_millis("2k").unwrap(), 2_000_000);
    }

    #[test]
    fn memory_forms() {
        assert_eq!(bytes("128Mi").unwrap(), 128 << 20);
        assert_eq!(bytes("1G").unwrap(), 1_000_000_000);
        assert_eq!(bytes("1.5Gi").unwrap(), 3 << 29);
    }

    #[test]
    fn rejects_garbage() {
        for q in [
            "",
            "-1",
            "abc",
            "1.2.3",
            "5x",
            "m",
            "1e999",
            "99999999999999999999999999999999Ei",
        ] {
            assert!(cpu_millis(q).is_err(), "{q}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(format_cpu_millis(800), "800m");
        assert_eq!(format_cpu_millis(2000), "2");
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = cpu_millis(&s);
            let _ = bytes(&s);
        }

        #[test]
        fn millis_roundtrip(m in 0u64..10_000_000) {
            proptest::prop_assert_eq!(cpu_millis(&format_cpu_millis(m)).unwrap(), m);
        }
    }
}
