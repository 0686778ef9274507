//! Subcommands. Each lives in its own file with an `Args` struct and a
//! `run(Args) -> anyhow::Result<ExitCode>`; add a variant here and an arm in
//! [`dispatch`] to add one.

use std::process::ExitCode;
use std::time::Duration;

pub mod explain;
pub mod plan;
pub mod run;
pub mod slack_cmd;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Sample the node's cgroups twice and print capacity, usage, real slack
    /// and every pod's CPU limits as the cgroups hold them.
    Slack(slack_cmd::Args),
    /// Run the node agent: resize opted-in pods of this node, verify cgroups,
    /// serve metrics.
    Run(run::Args),
    /// Explain what the agent would do with one pod of this node, and why.
    Explain(explain::Args),
    /// The agent's decision for every pod of a node, from files alone (a
    /// cgroup tree and the pods as JSON): no cluster needed.
    Plan(plan::Args),
}

pub fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Slack(a) => slack_cmd::run(a),
        Command::Run(a) => run::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Plan(a) => plan::run(a),
    }
}

/// Longest duration any flag takes.
const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);
/// Shortest `--tick`: a shorter one only burns CPU (each tick reads every
/// managed pod's cgroup), and cgroup counters move in ms anyway.
pub const TICK_MIN: Duration = Duration::from_millis(100);

/// `500ms`, `1s`, `1.5s`, `2m`, `1h`, or a bare number of seconds; more
/// than 0 and at most 24h.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    duration_between(s, Duration::ZERO, false)
}

/// `--tick`: as [`parse_duration`], at least [`TICK_MIN`].
pub fn parse_tick(s: &str) -> Result<Duration, String> {
    duration_between(s, TICK_MIN, true)
}

/// A duration in `(min, 24h]`, or `[min, 24h]` when `min_inclusive`.
fn duration_between(s: &str, min: Duration, min_inclusive: bool) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .ok_or_else(|| format!("{s:?} is not a duration (e.g. 500ms, 1s, 2m, 1h)"))?;
    let secs = v * scale;
    let range = if min_inclusive {
        format!("between {} and 24h", fmt_duration(min))
    } else {
        "more than 0 and at most 24h".to_string()
    };
    let low = if min_inclusive {
        secs < min.as_secs_f64()
    } else {
        secs <= min.as_secs_f64()
    };
    if low || secs > DURATION_MAX.as_secs_f64() {
        return Err(format!("{s:?} must be {range}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A CPU quantity (`4000m`, `3.5`) in millicores.
pub fn parse_cpu(s: &str) -> Result<u64, String> {
    headroom::quantity::cpu_millis(s).map_err(|e| e.to_string())
}

/// `--node-allocatable`: a CPU quantity above 0 (a node with no CPU has no
/// slack to share; 0 would pin every managed pod to its floor).
pub fn parse_allocatable(s: &str) -> Result<u64, String> {
    match parse_cpu(s)? {
        0 => Err(format!("{s:?} must be more than 0 (e.g. 4000m, 3.5)")),
        m => Ok(m),
    }
}

/// `--node-name`: a DNS-1123 subdomain, as the apiserver names nodes.
pub fn parse_node_name(s: &str) -> Result<String, String> {
    headroom::names::node_name(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration(" 90m "), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("NaNs").is_err());
        assert!(parse_duration("infs").is_err());
    }

    #[test]
    fn duration_errors_name_the_problem_and_the_range() {
        // A valid duration out of range is out of range, not "not a duration".
        assert_eq!(
            parse_duration("25h").unwrap_err(),
            "\"25h\" must be more than 0 and at most 24h"
        );
        assert_eq!(
            parse_duration("0s").unwrap_err(),
            "\"0s\" must be more than 0 and at most 24h"
        );
        assert!(parse_duration("1d").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn tick_has_a_floor() {
        assert_eq!(parse_tick("100ms"), Ok(TICK_MIN));
        assert_eq!(parse_tick("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(
            parse_tick("0.000001s").unwrap_err(),
            "\"0.000001s\" must be between 100ms and 24h"
        );
        assert!(parse_tick("99ms").is_err());
        assert!(parse_tick("0").is_err());
    }

    #[test]
    fn allocatable_must_be_positive() {
        assert_eq!(parse_allocatable("4"), Ok(4000));
        assert_eq!(parse_allocatable("1m"), Ok(1));
        assert!(parse_allocatable("0").unwrap_err().contains("more than 0"));
        assert!(parse_allocatable("0m").is_err());
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        assert_eq!(parse_node_name("node-a"), Ok("node-a".into()));
        assert!(
            parse_node_name("")
                .unwrap_err()
                .contains("must not be empty")
        );
        assert!(
            parse_node_name("a,metadata.namespace=x")
                .unwrap_err()
                .contains("DNS-1123 subdomain")
        );
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(parse_cpu("4000m"), Ok(4000));
        assert_eq!(parse_cpu("3.5"), Ok(3500));
        assert!(parse_cpu("four").is_err());
    }
}
