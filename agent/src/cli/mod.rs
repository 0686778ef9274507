//! Subcommands. Each lives in its own file with an `Args` struct and a
//! `run(Args) -> anyhow::Result<ExitCode>`; add a variant here and an arm in
//! [`dispatch`] to add one.

use std::process::ExitCode;

pub mod explain;
pub mod run;
pub mod slack;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Sample the node's cgroups twice and print capacity, usage, real slack
    /// and every pod's CPU limits as the cgroups hold them.
    Slack(slack::Args),
    /// Run the node agent: resize opted-in pods of this node, verify cgroups,
    /// serve metrics.
    Run(run::Args),
    /// Explain what the agent would do with one pod of this node, and why.
    Explain(explain::Args),
}

pub fn dispatch(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Slack(a) => slack::run(a),
        Command::Run(a) => run::run(a),
        Command::Explain(a) => explain::run(a),
    }
}

/// `500ms`, `1s`, `1.5s`, `2m`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 1s, 2m)"))?;
    let secs = v * scale;
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 {
        return Err(format!("{s:?} must be between 0 and 24h"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// A CPU quantity (`4000m`, `3.5`) in millicores.
pub fn parse_cpu(s: &str) -> Result<u64, String> {
    headroom::quantity::cpu_millis(s).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("NaNs").is_err());
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(parse_cpu("4000m"), Ok(4000));
        assert_eq!(parse_cpu("3.5"), Ok(3500));
        assert!(parse_cpu("four").is_err());
    }
}
