//! The README's "Does it help?" table is the one the last benefit run wrote
//! (`scripts/benefit` → docs/benefit/table.md from runs.csv), not figures
//! copied by hand.

use std::path::Path;

#[test]
fn readme_benefit_table_is_the_recorded_runs_table() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let table = std::fs::read_to_string(repo.join("docs/benefit/table.md")).unwrap();
    let section = readme
        .split("## Does it help?")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a 'Does it help?' section");
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
    assert!(rows.len() >= 3, "table.md has no table");
    let readme_rows: Vec<&str> = section.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(
        readme_rows, rows,
        "README table differs from docs/benefit/table.md"
    );
}
