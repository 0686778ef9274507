//! The example alerts of docs/operations.md are the shipped PrometheusRule's rules.

use std::path::Path;

#[test]
fn readme_alerts_are_the_shipped_rules() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(repo.join("docs/operations.md")).unwrap();
    let rule = std::fs::read_to_string(repo.join("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let at = doc.find("<!-- readme-test: alerts -->").expect("marker");
    let block = doc[at..]
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("yaml block");
    // The list under `rules:`, dedented to the list's own indentation.
    let mut lines = rule.lines().skip_while(|l| l.trim() != "rules:");
    let indent = lines.next().map(|l| l.len() - l.trim_start().len() + 2);
    let indent = indent.expect("a rules: key");
    let shipped: String = lines
        .map(|l| format!("{}\n", l.get(indent..).unwrap_or("")))
        .collect();
    assert_eq!(block.trim_end(), shipped.trim_end());
}
