//! Every relative link in README.md and docs/**/*.md resolves: the file or
//! directory it names exists in the repository, and its `#anchor` (in the
//! same file or in `file.md#anchor`) names a heading there, by GitHub's
//! rules. The alerts' `runbook_url`s name their runbook's heading the same way.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// GitHub's anchor of a heading's text: lowercased; letters, digits, `-` and
/// `_` kept, each space a `-`, everything else dropped.
fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// A heading's text as rendered: `[text](target)` is `text`.
fn rendered(md: &str) -> String {
    let mut out = String::new();
    let mut rest = md;
    while let Some(open) = rest.find('[') {
        let Some((text, after)) = rest[open + 1..].split_once("](") else {
            break;
        };
        let Some(close) = after.find(')') else { break };
        out.push_str(&rest[..open]);
        out.push_str(text);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Whether `line` opens or closes a fenced code block.
fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// The lines of `doc` outside fenced code blocks, with their numbers (from 1).
fn prose(doc: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in doc.lines().enumerate() {
        if is_fence(line) {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The anchors of `doc`'s headings; a repeated one gets `-1`, `-2`, … as on
/// GitHub.
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose(doc) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(text) = line.get(hashes..).and_then(|t| t.strip_prefix(' ')) else {
            continue;
        };
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let text = text.trim().trim_end_matches('#').trim_end();
        let base = slug(&rendered(text));
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

/// The targets of `doc`'s inline links and images (`[text](target)`,
/// `![alt](target)`) and link definitions (`[label]: target`), outside code
/// blocks and code spans and HTML comments, with their line numbers.
fn links(doc: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(doc) {
        // Code spans: the text between backticks is code.
        let text: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        if text.trim_start().starts_with("<!--") {
            continue;
        }
        if let Some(def) = text.trim_start().strip_prefix('[')
            && let Some((label, target)) = def.split_once("]:")
            && !label.contains([']', '('])
            && let Some(target) = target.split_whitespace().next()
        {
            out.push((n, target.to_string()));
            continue;
        }
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n, target.trim_matches(['<', '>']).to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// `base`/`rel` without `.` and `..`; `None` when it climbs out of `root`.
fn resolve(root: &Path, base: &Path, rel: &str) -> Option<PathBuf> {
    let mut path = base.to_path_buf();
    for c in Path::new(&rel.replace("%20", " ")).components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !path.pop() {
                    return None;
                }
            }
            Component::Normal(part) => path.push(part),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    path.starts_with(root).then_some(path)
}

/// The links of the Markdown file `file` (under `root`) that do not resolve,
/// one line each: `file:line: target: why`.
fn broken(root: &Path, file: &Path) -> Vec<String> {
    let doc = std::fs::read_to_string(file).unwrap();
    let name = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let mut out = Vec::new();
    for (line, target) in links(&doc) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let why = if target.is_empty() {
            Some("empty link".to_string())
        } else if path.is_empty() {
            anchor
                .filter(|a| !anchors(&doc).contains(*a))
                .map(|a| format!("no heading #{a} in this file"))
        } else {
            match resolve(root, file.parent().unwrap(), path) {
                None => Some("outside the repository".to_string()),
                Some(p) if !p.exists() => Some(format!("no such file {}", p.display())),
                Some(p) => match anchor {
                    Some(a) if p.extension().is_some_and(|e| e == "md") => {
                        let there = std::fs::read_to_string(&p).unwrap();
                        (!anchors(&there).contains(a)).then(|| format!("no heading #{a} there"))
                    }
                    _ => None,
                },
            }
        };
        if let Some(why) = why {
            out.push(format!("{name}:{line}: {target}: {why}"));
        }
    }
    out
}

/// README.md and every Markdown file under docs/.
fn documents(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut out);
    out.sort();
    out
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let root = repo();
    let docs = documents(&root);
    assert!(
        docs.iter()
            .any(|d| d.ends_with("docs/kubelet-behaviour.md")),
        "{docs:?}"
    );
    let checked: usize = docs
        .iter()
        .map(|d| links(&std::fs::read_to_string(d).unwrap()).len())
        .sum();
    assert!(checked > 20, "only {checked} links found");
    let bad: Vec<String> = docs.iter().flat_map(|d| broken(&root, d)).collect();
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// Each alert's `runbook_url` (the rules as shipped by kustomize and Helm,
/// and the promtool tests' expectations) is the repository's URL of a
/// document plus the anchor of the heading named after the alert.
#[test]
fn alert_runbook_urls_name_the_runbook_headings() {
    const BASE: &str = "https://github.com/headroom-dev/headroom/blob/main/";
    let root = repo();
    for file in [
        "deploy/monitoring/prometheusrule.yaml",
        "deploy/helm/headroom/files/prometheus-rules.yaml",
        "tests/alerts/headroom.test.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let (mut alert, mut alerts, mut urls) = (None, 0, 0);
        for line in text.lines().map(str::trim) {
            let line = line.trim_start_matches("- ");
            if let Some(name) = line
                .strip_prefix("alert: ")
                .or_else(|| line.strip_prefix("alertname: "))
            {
                alerts += usize::from(line.starts_with("alert: "));
                alert = Some(name.trim().to_string());
            }
            let Some(url) = line.strip_prefix("runbook_url: ") else {
                continue;
            };
            urls += 1;
            let (path, anchor) = url
                .strip_prefix(BASE)
                .and_then(|u| u.split_once('#'))
                .unwrap_or_else(|| panic!("{file}: {url} is not {BASE}<file>#<anchor>"));
            let name = alert.as_deref().expect("a runbook_url after its alert");
            assert_eq!(anchor, slug(name), "{file}: {name}'s runbook is {url}");
            let doc = std::fs::read_to_string(root.join(path))
                .unwrap_or_else(|e| panic!("{file}: {url}: {path}: {e}"));
            assert!(
                anchors(&doc).contains(anchor),
                "{file}: {url}: no heading #{anchor} in {path}"
            );
        }
        assert!(urls > 0, "{file}: no runbook_url");
        if alerts > 0 {
            assert_eq!(urls, alerts, "{file}: an alert without a runbook_url");
        }
    }
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("HeadroomCgroupDrift"), "headroomcgroupdrift");
    assert_eq!(
        slug("8. CPU pressure, throttling and contention"),
        "8-cpu-pressure-throttling-and-contention"
    );
    assert_eq!(
        slug("Extrapolation to 5,000 nodes × 110 pods"),
        "extrapolation-to-5000-nodes--110-pods"
    );
    assert_eq!(slug("Does it help?"), "does-it-help");
    assert_eq!(slug("The agent's cost"), "the-agents-cost");
    assert_eq!(slug("snake_case and-dash"), "snake_case-and-dash");
    assert_eq!(
        slug(&rendered("See [the docs](x.md) now")),
        "see-the-docs-now"
    );
    let doc = "# A\n## B\n```\n# not a heading\n```\n## B\n### `c` ###\n#nope\n";
    let got: Vec<String> = anchors(doc).into_iter().collect();
    assert_eq!(got, ["a", "b", "b-1", "c"]);
}

/// The checker fails on what is broken and passes what is not.
#[test]
fn the_checker_reports_broken_links_and_anchors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("docs/data")).unwrap();
    std::fs::write(root.join("docs/other.md"), "# Other\n## Part two\n").unwrap();
    std::fs::write(root.join("docs/data/x.csv"), "a,b\n").unwrap();
    let doc = "\
# Title
## Here

[ok file](other.md) [ok anchor](other.md#part-two) [ok here](#here)
![ok image](data/x.csv) [ok dir](data/) [external](https://example.com/missing)
`[in code](missing.md)`

```
[in a fence](missing.md)
```

[missing file](missing.md)
[missing anchor](other.md#part-three) [missing here](#there)
[outside](../../../../../../../../etc/passwd)
[def]: nowhere.md
";
    let file = root.join("docs/a.md");
    std::fs::write(&file, doc).unwrap();
    let bad = broken(&root, &file);
    let targets: Vec<&str> = bad
        .iter()
        .map(|b| b.split(": ").nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        targets,
        [
            "missing.md",
            "other.md#part-three",
            "#there",
            "../../../../../../../../etc/passwd",
            "nowhere.md"
        ],
        "{bad:#?}"
    );
    assert!(bad[0].starts_with("docs/a.md:12: "), "{}", bad[0]);
    std::fs::write(&file, "# Fine\n[ok](other.md#other) [ok](#fine)\n").unwrap();
    assert_eq!(broken(&root, &file), Vec::<String>::new());
}
