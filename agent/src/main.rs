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
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
