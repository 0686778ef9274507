//! Writes the Grafana dashboard the chart ships
//! (deploy/helm/headroom/dashboards/headroom.json) from
//! `headroom_tools::dashboard`; with `--check`, only compares and fails when
//! the committed file differs.
//!
//!     cargo run -p headroom-tools --bin gen-dashboard [-- --check]

use std::path::Path;

use anyhow::{Context as _, bail};
use headroom_tools::dashboard::{DASHBOARD_PATH, dashboard_text};

fn main() -> anyhow::Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(DASHBOARD_PATH);
    let want = dashboard_text();
    match std::env::args().nth(1).as_deref() {
        None => {
            std::fs::write(&path, &want).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {DASHBOARD_PATH}");
        }
        Some("--check") => {
            let got = std::fs::read_to_string(&path).unwrap_or_default();
            if got != want {
                bail!("{DASHBOARD_PATH} is not the generated dashboard: run gen-dashboard");
            }
            println!("{DASHBOARD_PATH} is the generated dashboard");
        }
        Some(other) => bail!("unknown argument {other:?} (usage: gen-dashboard [--check])"),
    }
    Ok(())
}
