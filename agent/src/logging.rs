//! Logs to stderr: human-readable by default, one JSON object per line with
//! `--log-format json`. `RUST_LOG` overrides the default `info` filter.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Installs the global subscriber. A second call is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log redirected to a file or
        // collected by the kubelet stays plain text.
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
