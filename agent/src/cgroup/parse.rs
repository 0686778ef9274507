//! Parsers for the cgroup v2 CPU interface files, from raw bytes.
//!
//! Every function takes whatever bytes the kernel (or a broken fixture, or a
//! file truncated mid-write) gave and returns a typed value or a
//! [`ParseError`]; none of them panics on any input (see the proptests
//! below). Unknown keys are ignored so newer kernels (e.g. `nr_bursts`) parse.

use std::num::{ParseFloatError, ParseIntError};
use std::str::Utf8Error;

use super::types::{CpuMax, CpuStat, Pressure, PsiLine};

/// Why a file's content could not be parsed. The scanner adds the path.
/// Where a std parser failed, its error is the [`source`](std::error::Error::source).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The content breaks the file's grammar or the kernel's bounds.
    #[error("{0}")]
    Invalid(String),
    #[error("not UTF-8")]
    NotUtf8(#[source] Utf8Error),
    /// `token` is quoted (see [`quote`]).
    #[error("{what}: {token} is out of range")]
    OutOfRange {
        what: String,
        token: String,
        #[source]
        source: ParseIntError,
    },
    /// `token` is quoted (see [`quote`]).
    #[error("{what}: {token} is not a number")]
    NotANumber {
        what: String,
        token: String,
        #[source]
        source: ParseFloatError,
    },
}

fn err<T>(msg: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError::Invalid(msg.into()))
}

/// Longest piece of file content an error quotes: a 13 MB file must not be
/// echoed whole into logs and terminals.
const QUOTE_MAX: usize = 48;

/// `s` Debug-quoted, cut to [`QUOTE_MAX`] bytes (on a char boundary) with
/// the total length when longer.
pub fn quote(s: &str) -> String {
    if s.len() <= QUOTE_MAX {
        return format!("{s:?}");
    }
    let mut end = QUOTE_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &s[..end], s.len())
}

fn text(b: &[u8]) -> Result<&str, ParseError> {
    std::str::from_utf8(b).map_err(ParseError::NotUtf8)
}

fn int(tok: &str, what: &str) -> Result<u64, ParseError> {
    // `u64::from_str` accepts a leading '+'; the kernel never writes one.
    if tok.is_empty() || !tok.bytes().all(|c| c.is_ascii_digit()) {
        return err(format!("{what}: {} is not an unsigned integer", quote(tok)));
    }
    tok.parse().map_err(|source| ParseError::OutOfRange {
        what: what.to_string(),
        token: quote(tok),
        source,
    })
}

/// Bounds the kernel enforces on `cpu.max` writes (kernel/sched/core.c:
/// `min_cfs_quota_period` 1 ms, `max_cfs_quota_period` 1 s, and a quota of at
/// least 1 ms); the kubelet clamps to the same floor. A value outside them was
/// not written by a kernel, so it is malformed, not a limit.
pub const PERIOD_US: std::ops::RangeInclusive<u64> = 1_000..=1_000_000;
pub const MIN_QUOTA_US: u64 = 1_000;

/// `cpu.max`: `"<quota> <period>\n"` or `"max <period>\n"`. The period is
/// read, never assumed; values outside the kernel's bounds are malformed.
pub fn cpu_max(b: &[u8]) -> Result<CpuMax, ParseError> {
    let s = text(b)?;
    let mut it = s.split_ascii_whitespace();
    let (Some(q), Some(p), None) = (it.next(), it.next(), it.next()) else {
        return err(format!(
            "expected \"<quota|max> <period>\", got {}",
            quote(s)
        ));
    };
    let period_us = int(p, "period")?;
    if !PERIOD_US.contains(&period_us) {
        return err(format!(
            "period {period_us} µs outside the kernel's {}..={} µs",
            PERIOD_US.start(),
            PERIOD_US.end()
        ));
    }
    let quota_us = if q == "max" {
        None
    } else {
        let q = int(q, "quota")?;
        if q < MIN_QUOTA_US {
            return err(format!("quota {q} µs below the kernel's {MIN_QUOTA_US} µs"));
        }
        Some(q)
    };
    Ok(CpuMax {
        quota_us,
        period_us,
    })
}

/// `cpu.stat`: `key value` lines. `usage_usec` is required; the throttling
/// fields are optional (absent without the cpu controller).
pub fn cpu_stat(b: &[u8]) -> Result<CpuStat, ParseError> {
    let s = text(b)?;
    let mut st = CpuStat::default();
    let mut usage = None;
    for line in s.lines() {
        let mut it = line.split_ascii_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            if line.trim().is_empty() {
                continue;
            }
            return err(format!("line {} is not \"key value\"", quote(line)));
        };
        let slot = match k {
            "usage_usec" => {
                usage = Some(int(v, k)?);
                continue;
            }
            "user_usec" => &mut st.user_usec,
            "system_usec" => &mut st.system_usec,
            "nr_periods" => st.nr_periods.insert(0),
            "nr_throttled" => st.nr_throttled.insert(0),
            "throttled_usec" => st.throttled_usec.insert(0),
            _ => continue,
        };
        *slot = int(v, k)?;
    }
    match usage {
        Some(u) => {
            st.usage_usec = u;
            Ok(st)
        }
        None => err("no usage_usec"),
    }
}

fn avg(tok: &str, key: &str) -> Result<f64, ParseError> {
    let v: f64 = tok.parse().map_err(|source| ParseError::NotANumber {
        what: key.to_string(),
        token: quote(tok),
        source,
    })?;
    // PSI averages are percentages; reject NaN/inf/negative so no consumer
    // has to guard against them.
    if !v.is_finite() || !(0.0..=100.0).contains(&v) {
        return err(format!("{key}: {} is not a percentage", quote(tok)));
    }
    Ok(v)
}

fn psi_line(rest: &str) -> Result<PsiLine, ParseError> {
    let (mut a10, mut a60, mut a300, mut total) = (None, None, None, None);
    for kv in rest.split_ascii_whitespace() {
        let Some((k, v)) = kv.split_once('=') else {
            return err(format!("{} is not key=value", quote(kv)));
        };
        match k {
            "avg10" => a10 = Some(avg(v, k)?),
            "avg60" => a60 = Some(avg(v, k)?),
            "avg300" => a300 = Some(avg(v, k)?),
            "total" => total = Some(int(v, k)?),
            _ => {}
        }
    }
    match (a10, a60, a300, total) {
        (Some(avg10), Some(avg60), Some(avg300), Some(total_us)) => Ok(PsiLine {
            avg10,
            avg60,
            avg300,
            total_us,
        }),
        _ => err(format!(
            "PSI line {} lacks one of avg10 avg60 avg300 total",
            quote(rest)
        )),
    }
}

/// `cpu.pressure`: a `some` line and, on newer kernels, a `full` line.
pub fn pressure(b: &[u8]) -> Result<Pressure, ParseError> {
    let s = text(b)?;
    let (mut some, mut full) = (None, None);
    for line in s.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "some" => some = Some(psi_line(rest)?),
            "full" => full = Some(psi_line(rest)?),
            _ => return err(format!("unknown PSI line {}", quote(line))),
        }
    }
    match some {
        Some(some) => Ok(Pressure { some, full }),
        None => err("no \"some\" line"),
    }
}

/// `cpu.weight`: one integer in 1..=10000.
pub fn weight(b: &[u8]) -> Result<u64, ParseError> {
    let s = text(b)?.trim();
    let w = int(s, "weight")?;
    if !(1..=10000).contains(&w) {
        return err(format!("weight {w} outside 1..=10000"));
    }
    Ok(w)
}

/// Writes `cpu.max` the way the kernel does (for fixtures and round-trips).
pub fn format_cpu_max(m: &CpuMax) -> String {
    match m.quota_us {
        Some(q) => format!("{q} {}\n", m.period_us),
        None => format!("max {}\n", m.period_us),
    }
}

/// Writes `cpu.stat` the way the kernel does.
pub fn format_cpu_stat(s: &CpuStat) -> String {
    let mut out = format!(
        "usage_usec {}\nuser_usec {}\nsystem_usec {}\n",
        s.usage_usec, s.user_usec, s.system_usec
    );
    for (k, v) in [
        ("nr_periods", s.nr_periods),
        ("nr_throttled", s.nr_throttled),
        ("throttled_usec", s.throttled_usec),
    ] {
        if let Some(v) = v {
            out.push_str(&format!("{k} {v}\n"));
        }
    }
    out
}

/// Writes `cpu.pressure` the way the kernel does (two decimals).
pub fn format_pressure(p: &Pressure) -> String {
    let line = |k: &str, l: &PsiLine| {
        format!(
            "{k} avg10={:.2} avg60={:.2} avg300={:.2} total={}\n",
            l.avg10, l.avg60, l.avg300, l.total_us
        )
    };
    let mut out = line("some", &p.some);
    if let Some(f) = &p.full {
        out.push_str(&line("full", f));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn cpu_max_reads_quota_and_any_period() {
        assert_eq!(
            cpu_max(b"50000 100000\n").unwrap(),
            CpuMax {
                quota_us: Some(50000),
                period_us: 100000
            }
        );
        let m = cpu_max(b"25000 50000\n").unwrap();
        assert_eq!(m.period_us, 50000);
        assert_eq!(m.millicores(), Some(500));
    }

    /// The std parser's error stays reachable through `source()`.
    #[test]
    fn parse_errors_keep_the_std_error_as_source() {
        use std::error::Error;
        let e = cpu_max(b"5 99999999999999999999999").unwrap_err();
        assert!(matches!(e, ParseError::OutOfRange { .. }), "{e:?}");
        assert!(e.source().unwrap().is::<ParseIntError>());
        let e = pressure(b"some avg10=x avg60=0 avg300=0 total=0").unwrap_err();
        assert_eq!(e.to_string(), "avg10: \"x\" is not a number");
        assert!(e.source().unwrap().is::<ParseFloatError>());
        let e = weight(b"\xff").unwrap_err();
        assert!(e.source().unwrap().is::<Utf8Error>());
        assert!(ParseError::Invalid("x".into()).source().is_none());
    }

    #[test]
    fn cpu_max_max_is_unlimited() {
        let m = cpu_max(b"max 100000\n").unwrap();
        assert_eq!(m.quota_us, None);
        assert_eq!(m.millicores(), None);
    }

    #[test]
    fn cpu_max_rejects_malformed() {
        for bad in [
            &b""[..],
            b"max",
            b"max 0",
            b"50000",
            b"1 2 3",
            b"-5 100000",
            b"+5 100000",
            b"5 99999999999999999999999",
            b"\xff\xfe 100000",
        ] {
            assert!(cpu_max(bad).is_err(), "{bad:?}");
        }
    }

    /// Values no kernel writes were read as 1,000,000m and 0m.
    #[test]
    fn cpu_max_rejects_values_outside_kernel_bounds() {
        for bad in [
            &b"1000 1\n"[..],
            b"0 100000\n",
            b"999 100000\n",
            b"max 999\n",
            b"50000 1000001\n",
        ] {
            assert!(cpu_max(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        for good in [&b"1000 1000\n"[..], b"1000 100000\n", b"max 1000000\n"] {
            assert!(cpu_max(good).is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
    }

    #[test]
    fn errors_quote_a_short_prefix_only() {
        let big = format!("{} 100000", "9".repeat(13 << 20));
        let e = cpu_max(big.as_bytes()).unwrap_err().to_string();
        assert!(e.len() < 200, "{} bytes", e.len());
        assert!(e.contains("bytes)"), "{e}");
        let e = cpu_stat(format!("usage_usec 1\n{}\n", "x".repeat(100_000)).as_bytes())
            .unwrap_err()
            .to_string();
        assert!(e.len() < 200, "{} bytes", e.len());
        assert_eq!(quote("é".repeat(40).as_str()).matches('é').count(), 24);
    }

    const STAT: &[u8] = b"usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n\
nr_periods 50\nnr_throttled 5\nthrottled_usec 777\nnr_bursts 0\nburst_usec 0\n";

    #[test]
    fn cpu_stat_reads_all_fields_and_ignores_unknown() {
        let s = cpu_stat(STAT).unwrap();
        assert_eq!(s.usage_usec, 1234);
        assert_eq!(s.user_usec, 1000);
        assert_eq!(s.system_usec, 234);
        assert_eq!(s.nr_periods, Some(50));
        assert_eq!(s.nr_throttled, Some(5));
        assert_eq!(s.throttled_usec, Some(777));
    }

    #[test]
    fn cpu_stat_without_cpu_controller_has_no_throttling() {
        let s = cpu_stat(b"usage_usec 9\nuser_usec 5\nsystem_usec 4\n").unwrap();
        assert_eq!(s.nr_periods, None);
        assert_eq!(s.nr_throttled, None);
    }

    #[test]
    fn cpu_stat_rejects_missing_usage_and_bad_numbers() {
        assert!(cpu_stat(b"user_usec 5\n").is_err());
        assert!(cpu_stat(b"usage_usec x\n").is_err());
        assert!(cpu_stat(b"usage_usec\n").is_err());
    }

    #[test]
    fn pressure_reads_some_and_full() {
        let p = pressure(
            b"some avg10=1.50 avg60=0.20 avg300=0.00 total=12345\n\
full avg10=0.75 avg60=0.10 avg300=0.00 total=600\n",
        )
        .unwrap();
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.total_us, 12345);
        assert_eq!(p.full.unwrap().avg10, 0.75);
    }

    #[test]
    fn pressure_without_full_line_is_some_only() {
        let p = pressure(b"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").unwrap();
        assert!(p.full.is_none());
    }

    #[test]
    fn pressure_rejects_nan_and_missing_fields() {
        assert!(pressure(b"some avg10=NaN avg60=0 avg300=0 total=0\n").is_err());
        assert!(pressure(b"some avg10=0.00 avg60=0.00 total=0\n").is_err());
        assert!(pressure(b"full avg10=0 avg60=0 avg300=0 total=0\n").is_err());
    }

    #[test]
    fn weight_in_range() {
        assert_eq!(weight(b"100\n").unwrap(), 100);
        assert!(weight(b"0\n").is_err());
        assert!(weight(b"10001\n").is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic_on_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = cpu_max(&b);
            let _ = cpu_stat(&b);
            let _ = pressure(&b);
            let _ = weight(&b);
        }

        #[test]
        fn parsers_never_panic_on_near_valid_text(s in "(max|[0-9]{0,22}|some|full|usage_usec|avg10=[0-9.e+-]{0,8}|total=[0-9]{0,21}|[ \n=])*") {
            let b = s.as_bytes();
            let _ = cpu_max(b);
            let _ = cpu_stat(b);
            let _ = pressure(b);
            let _ = weight(b);
        }

        #[test]
        fn cpu_max_round_trips(q in proptest::option::of(MIN_QUOTA_US..u64::MAX), p in PERIOD_US) {
            let m = CpuMax { quota_us: q, period_us: p };
            prop_assert_eq!(cpu_max(format_cpu_max(&m).as_bytes()).unwrap(), m);
        }

        #[test]
        fn cpu_stat_round_trips(u in any::<u64>(), us in any::<u64>(), sy in any::<u64>(),
                                thr in proptest::option::of((any::<u64>(), any::<u64>(), any::<u64>()))) {
            let s = CpuStat {
                usage_usec: u, user_usec: us, system_usec: sy,
                nr_periods: thr.map(|t| t.0), nr_throttled: thr.map(|t| t.1), throttled_usec: thr.map(|t| t.2),
            };
            prop_assert_eq!(cpu_stat(format_cpu_stat(&s).as_bytes()).unwrap(), s);
        }

        #[test]
        fn pressure_round_trips(a in 0u32..10000, b in 0u32..10000, c in 0u32..10000, t in any::<u64>(), full in any::<bool>()) {
            let l = PsiLine { avg10: a as f64 / 100.0, avg60: b as f64 / 100.0, avg300: c as f64 / 100.0, total_us: t };
            let p = Pressure { some: l, full: full.then_some(l) };
            prop_assert_eq!(pressure(format_pressure(&p).as_bytes()).unwrap(), p);
        }

        #[test]
        fn weight_round_trips(w in 1u64..=10000) {
            prop_assert_eq!(weight(format!("{w}\n").as_bytes()).unwrap(), w);
        }
    }
}
