//! The benchmark's service: `benefit-service [--listen ADDR] [--workers N] [--burn-us N]`.
//! Every `GET /burn?us=N` burns N µs of CPU time on one of N workers.

use std::time::Duration;

use benefit::args::Args;
use benefit::serve::{ServeConfig, serve};

fn main() {
    let run = || -> Result<(), String> {
        let a = Args::parse(std::env::args().skip(1), &["listen", "workers", "burn-us"])
            .map_err(|e| e.to_string())?;
        let listen = a.str("listen").unwrap_or("0.0.0.0:8080");
        let cfg = ServeConfig {
            workers: a.get("workers", 4usize).map_err(|e| e.to_string())?,
            default_burn: Duration::from_micros(
                a.get("burn-us", 10_000u64).map_err(|e| e.to_string())?,
            ),
        };
        let l = std::net::TcpListener::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
        eprintln!(
            "benefit-service on {listen}: {} workers, {:?} per request",
            cfg.workers, cfg.default_burn
        );
        serve(l, cfg);
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("benefit-service: {e}");
        std::process::exit(2);
    }
}
