//! docs/coexistence.md names what the code does: the reason label, the
//! annotation, the Event reasons (yielded; drift, beside koordlet), the skew
//! it allows, and its HPA example adds up by HPA's own rule.

use std::path::Path;

use headroom::kube::events::{REASON_DRIFT, REASON_YIELDED};
use headroom::model::ANN_RESUME;
use headroom::policy::Unmanaged;
use headroom::policy::writers::RESUME_SKEW_S;

fn doc() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/coexistence.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_doc_names_the_reason_annotation_event_and_skew_the_code_uses() {
    let d = doc();
    assert!(d.starts_with("# Running beside VPA, HPA and koordlet\n"));
    for s in [
        format!("reason=\"{}\"", Unmanaged::OtherWriter.reason()),
        format!("{ANN_RESUME}=$(date -u +%Y-%m-%dT%H:%M:%SZ)"),
        format!("`{REASON_YIELDED}`"),
        format!("more than {} minutes ahead", RESUME_SKEW_S / 60),
        "controlledValues: RequestsOnly".to_string(),
        // Beside koordlet: what a cut of its lasting past the grace raises.
        format!("`{REASON_DRIFT}` Event"),
    ] {
        assert!(d.contains(&s), "docs/coexistence.md does not say {s:?}");
    }
}

/// HPA: desired = ceil(replicas × utilisation / target), utilisation = usage / request.
fn desired(replicas: u64, usage_m: u64, request_m: u64, target_pct: u64) -> u64 {
    (replicas * usage_m * 100).div_ceil(request_m * target_pct)
}

#[test]
fn the_hpa_worked_example_adds_up() {
    let d = doc();
    // 2 replicas, request 250m, target 80 %: capped at the static 500m, or 900m under a raised limit.
    assert_eq!(desired(2, 500, 250, 80), 5);
    assert_eq!(desired(2, 900, 250, 80), 9);
    assert!(d.contains("| usage per pod | 500m (capped, throttled) | 900m |"));
    assert!(d.contains("| utilisation (usage / 250m) | 200 % | 360 % |"));
    assert!(d.contains("ceil(5.0) = **5** | ceil(9.0) = **9** |"));
    // Target at the static cap (request 200m, limit 300m, 150 %): never above it;
    // 600m under a raised limit doubles the replicas.
    assert_eq!(desired(2, 300, 200, 150), 2);
    assert_eq!(desired(2, 600, 200, 150), 4);
    assert!(d.contains("utilisation is 300 % and HPA doubles"));
}
