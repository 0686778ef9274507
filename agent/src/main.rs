//! `headroom-agent`: the node agent and its diagnostic commands.

mod cli;
mod logging;

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "headroom-agent", version, about)]
struct Args {
    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "human",
        env = "HEADROOM_LOG_FORMAT"
    )]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: cli::Command,
}

fn main() -> ExitCode {
    let args = Args::parse();
    logging::init(args.log_format);
    match cli::dispatch(args.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::from(2)
        }
    }
}

/// The error and its causes, `: `-joined, each cause once: an error that
/// already quotes its source (`reading X: No such file (os error 2)`) does
/// not get the same text appended again.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let shown = io.to_string();
        #[derive(Debug, thiserror::Error)]
        #[error("cgroup root /x: {0}")]
        struct Quoting(#[source] std::io::Error);
        let e = anyhow::Error::new(Quoting(io)).context("first sample");
        let s = error_chain(&e);
        assert_eq!(s.matches(&shown).count(), 1, "{s}");
        assert!(s.starts_with("first sample: cgroup root /x: "), "{s}");
    }
}
