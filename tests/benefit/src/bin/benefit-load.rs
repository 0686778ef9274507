//! The benchmark's open-loop load generator:
//!
//!   benefit-load --target IP:PORT --schedule quiet:10@8,burst:30@45 \
//!       [--burn-us 10000] [--connections 32] [--drain-s 20] \
//!       [--start-at-unix-ns N] [--out FILE.json]
//!
//! Prints (or writes) one JSON object: the settings, the actual start time
//! (Unix ns) and the latency summary (coordinated-omission corrected).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use benefit::args::Args;
use benefit::load::{LoadConfig, run};
use benefit::schedule;

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn main() {
    let go = || -> Result<(), String> {
        let known = [
            "target",
            "schedule",
            "burn-us",
            "connections",
            "drain-s",
            "start-at-unix-ns",
            "out",
        ];
        let a = Args::parse(std::env::args().skip(1), &known).map_err(|e| e.to_string())?;
        let e = |e: benefit::args::ArgError| e.to_string();
        let target = a.required("target").map_err(e)?;
        let cfg = LoadConfig {
            target: target
                .parse()
                .map_err(|_| format!("--target {target:?}: want IP:PORT"))?,
            phases: schedule::parse(a.required("schedule").map_err(e)?)
                .map_err(|e| e.to_string())?,
            burn_us: a.get("burn-us", 10_000u64).map_err(e)?,
            connections: a.get("connections", 32usize).map_err(e)?.clamp(1, 1024),
            drain: Duration::from_secs_f64(a.get("drain-s", 20.0f64).map_err(e)?.clamp(0.0, 600.0)),
        };
        let at: u128 = a.get("start-at-unix-ns", 0u128).map_err(e)?;
        let now = unix_ns();
        if at > now {
            let wait = Duration::from_nanos((at - now).min(600_000_000_000) as u64);
            std::thread::sleep(wait);
        }
        let start_unix_ns = unix_ns();
        let summary = run(&cfg, Instant::now());
        let out = serde_json::json!({
            "target": target,
            "burn_us": cfg.burn_us,
            "connections": cfg.connections,
            "start_unix_ns": start_unix_ns.to_string(),
            "phases": cfg.phases,
            "summary": summary,
        });
        let text = serde_json::to_string(&out).map_err(|e| e.to_string())?;
        match a.str("out") {
            Some(path) => {
                std::fs::write(path, text + "\n").map_err(|e| format!("writing {path}: {e}"))?
            }
            None => println!("{text}"),
        }
        Ok(())
    };
    if let Err(e) = go() {
        eprintln!("benefit-load: {e}");
        std::process::exit(2);
    }
}
