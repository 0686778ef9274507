//! The benefit figures are the ones the benefit runs wrote (`scripts/benefit`
//! → scripts/lib/benefit_table.py → docs/benefit/table.md and headline.md
//! from runs.csv, summary.json and meta.json; the tuning run's in
//! docs/benefit/tuning/): docs/benefit.md holds the tables and their goal
//! lines, the README's "Does it help?" the headline.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The part of `doc` from the heading `from` to the next heading of the same
/// level (or the end).
fn section<'a>(doc: &'a str, from: &str) -> &'a str {
    let level = from.split(' ').next().unwrap_or("##");
    let rest = doc
        .split_once(&format!("{from}\n"))
        .unwrap_or_else(|| panic!("no section {from:?}"))
        .1;
    rest.split(&format!("\n{level} ")).next().unwrap_or(rest)
}

/// `section` holds the generated file `generated` verbatim.
fn assert_holds(doc_path: &str, section_of: fn(&str) -> &str, generated: &str) {
    let doc = std::fs::read_to_string(repo().join(doc_path)).unwrap();
    let text = std::fs::read_to_string(repo().join(generated)).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with('|')),
        "{generated} has no table"
    );
    // The whole file, goal lines included: the document's figures are the run's.
    assert!(
        section_of(&doc).contains(text.trim_end()),
        "{doc_path} does not hold {generated} verbatim (scripts/lib/benefit_table.py writes it)"
    );
}

#[test]
fn readme_benefit_table_and_goal_lines_are_the_recorded_runs() {
    // Everything above the tuning run's section.
    assert_holds(
        "docs/benefit.md",
        |d| d.split("\n## Tuning\n").next().unwrap_or(d),
        "docs/benefit/table.md",
    );
}

#[test]
fn readme_tuning_table_is_the_recorded_tuning_run() {
    assert_holds(
        "docs/benefit.md",
        |d| section(d, "## Tuning"),
        "docs/benefit/tuning/table.md",
    );
}

#[test]
fn readme_benefit_headline_is_the_recorded_run() {
    assert_holds(
        "README.md",
        |d| section(d, "## Does it help?"),
        "docs/benefit/headline.md",
    );
}

/// The committed headline is what the table script makes of the committed
/// run (its summary.json and meta.json), so it cannot drift from the data.
#[test]
fn benefit_headline_is_generated_from_the_committed_summary() {
    let data = repo().join("docs/benefit");
    let dir = tempfile::tempdir().unwrap();
    for f in ["runs.csv", "summary.json", "meta.json"] {
        std::fs::copy(data.join(f), dir.path().join(f)).unwrap();
    }
    let out = match Command::new("python3")
        .arg(repo().join("scripts/lib/benefit_table.py"))
        .arg(dir.path())
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("skipped: no python3 to run scripts/lib/benefit_table.py");
            return;
        }
        Err(e) => panic!("python3: {e}"),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read_to_string(dir.path().join("headline.md")).unwrap();
    let committed = std::fs::read_to_string(data.join("headline.md")).unwrap();
    assert_eq!(
        got, committed,
        "docs/benefit/headline.md is not what scripts/lib/benefit_table.py docs/benefit writes"
    );
}
