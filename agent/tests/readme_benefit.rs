//! The README's "Does it help?" tables and their goal lines (medians against
//! the static limit) are the ones the benefit runs wrote (`scripts/benefit`
//! → docs/benefit/table.md from runs.csv and summary.json; the tuning run's
//! in docs/benefit/tuning/).

use std::path::Path;

fn assert_section_holds(table_md: &str) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let table = std::fs::read_to_string(repo.join(table_md)).unwrap();
    let section = readme
        .split("## Does it help?")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a 'Does it help?' section");
    assert!(
        table.lines().any(|l| l.starts_with('|')),
        "{table_md} has no table"
    );
    // The whole file, goal lines included: the README's figures are the run's.
    assert!(
        section.contains(table.trim_end()),
        "README 'Does it help?' does not hold {table_md} verbatim"
    );
}

#[test]
fn readme_benefit_table_and_goal_lines_are_the_recorded_runs() {
    assert_section_holds("docs/benefit/table.md");
}

#[test]
fn readme_tuning_table_is_the_recorded_tuning_run() {
    assert_section_holds("docs/benefit/tuning/table.md");
}
