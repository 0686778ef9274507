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
    fn every_flag_of_every_subcommand_has_help_text() {
        use clap::CommandFactory as _;
        let cmd = Args::command();
        let mut missing = Vec::new();
        for sub in cmd.get_subcommands() {
            for a in sub.get_arguments() {
                let id = a.get_id().as_str();
                if id != "help" && id != "version" && a.get_help().is_none() {
                    missing.push(format!("{} --{id}", sub.get_name()));
                }
            }
        }
        assert!(missing.is_empty(), "no help text: {missing:?}");
    }

    #[test]
    fn a_flag_has_the_same_env_var_in_every_subcommand() {
        use clap::CommandFactory as _;
        use foldhash::{HashMap, HashMapExt};
        let cmd = Args::command();
        // flag → env var, from whichever subcommand names one.
        let mut env: HashMap<String, String> = HashMap::new();
        for sub in cmd.get_subcommands() {
            for a in sub.get_arguments() {
                if let Some(e) = a.get_env() {
                    let e = e.to_string_lossy().to_string();
                    let prev = env.insert(a.get_id().to_string(), e.clone());
                    assert!(
                        prev.as_ref().is_none_or(|p| *p == e),
                        "{}: {prev:?} vs {e}",
                        a.get_id()
                    );
                }
            }
        }
        for sub in cmd.get_subcommands() {
            for a in sub.get_arguments() {
                if let Some(e) = env.get(a.get_id().as_str()) {
                    assert_eq!(
                        a.get_env()
                            .map(|x| x.to_string_lossy().to_string())
                            .as_ref(),
                        Some(e),
                        "{} --{} has no env var {e}",
                        sub.get_name(),
                        a.get_id()
                    );
                }
            }
        }
    }

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
