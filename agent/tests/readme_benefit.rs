//! The README's "Does it help?" table and its goal lines (medians against
//! the static limit) are the ones the last benefit run wrote (`scripts/benefit`
//! → docs/benefit/table.md from runs.csv and summary.json).

use std::path::Path;

#[test]
fn readme_benefit_table_and_goal_lines_are_the_recorded_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let table = std::fs::read_to_string(repo.join("docs/benefit/table.md")).unwrap();
    let section = readme
        .split("## Does it help?")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a 'Does it help?' section");
    assert!(
        table.lines().any(|l| l.starts_with('|')),
        "table.md has no table"
    );
    // The whole file, goal lines included: the README's figures are the run's.
    assert!(
        section.contains(table.trim_end()),
        "README 'Does it help?' does not hold docs/benefit/table.md verbatim"
    );
}
