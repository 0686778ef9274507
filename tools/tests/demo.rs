//! `scripts/demo` end to end, shortened: it runs the real control plane,
//! simulated kubelet and agent, records a raise and a lowering, and leaves a
//! valid PNG chart.

use std::path::Path;
use std::process::Command;

/// PNG signature, then an IHDR chunk of 13 bytes with a non-zero size, and
/// an IEND chunk at the end.
fn png_size(b: &[u8]) -> Option<(u32, u32)> {
    const SIG: &[u8] = b"\x89PNG\r\n\x1a\n";
    let rest = b.strip_prefix(SIG)?;
    if rest.get(0..8)? != b"\x00\x00\x00\x0dIHDR" || !b.ends_with(b"IEND\xae\x42\x60\x82") {
        return None;
    }
    let w = u32::from_be_bytes(rest.get(8..12)?.try_into().ok()?);
    let h = u32::from_be_bytes(rest.get(12..16)?.try_into().ok()?);
    (w > 0 && h > 0).then_some((w, h))
}

#[test]
fn the_demo_raises_and_lowers_limits_and_draws_a_chart() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(repo.join("scripts/demo"));
    testkit::agent::clean_cargo_env(&mut cmd);
    let run = cmd
        .args(["--duration", "15", "--out"])
        .arg(out.path())
        .current_dir(&repo)
        .output()
        .expect("scripts/demo runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let png = std::fs::read(out.path().join("demo.png")).expect("chart written");
    let (w, h) = png_size(&png).expect("a valid PNG");
    assert!(w >= 320 && h >= 160, "{w}×{h}");
    // web: declared 600m; opens up, falls back while the neighbour is busy.
    let csv = std::fs::read_to_string(out.path().join("demo.csv")).unwrap();
    let web: Vec<u64> = csv
        .lines()
        .filter(|l| l.split(',').nth(1) == Some("web"))
        .filter_map(|l| l.split(',').nth(3)?.parse().ok())
        .collect();
    let top = web.iter().position(|&l| l > 600).expect("web raised");
    assert!(
        web[top..].iter().any(|&l| l < 600),
        "web lowered later: {web:?}"
    );
    assert!(stdout.contains("the agent's resizes"), "{stdout}");
}
