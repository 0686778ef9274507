//! The table of policy-file keys (docs/design.md, "Policy settings") is the
//! code's: same keys, same defaults, and each range's ends accepted, the
//! values just outside refused.

use std::collections::BTreeSet;
use std::path::Path;

use headroom::policy::PolicyConfig;
use serde_json::{Value, json};

struct Row {
    key: String,
    range: String,
    default: String,
}

fn rows() -> Vec<Row> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/design.md"))
            .unwrap();
    let at = doc
        .find("<!-- readme-test: policy-keys -->")
        .expect("marker");
    doc[at..]
        .lines()
        .skip(3) // marker, header, separator
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect();
            Row {
                key: cells[0].trim_matches('`').to_string(),
                range: cells[3].clone(),
                default: cells[4].clone(),
            }
        })
        .collect()
}

/// The default config with `key` set to the string `v`, validated.
fn accepts_word(key: &str, v: &str) -> bool {
    let mut cfg = serde_json::to_value(PolicyConfig::default()).unwrap();
    cfg[key] = json!(v);
    serde_json::from_value::<PolicyConfig>(cfg).is_ok_and(|c| c.validate().is_ok())
}

/// The default config with `key` set to `v`, validated.
fn accepts(key: &str, v: f64) -> bool {
    let mut cfg = serde_json::to_value(PolicyConfig::default()).unwrap();
    let is_int = cfg[key].is_u64();
    cfg[key] = if is_int {
        if v < 0.0 || v.fract() != 0.0 {
            return false; // not representable: refused at parse time
        }
        json!(v as u64)
    } else {
        json!(v)
    };
    serde_json::from_value::<PolicyConfig>(cfg).is_ok_and(|c| c.validate().is_ok())
}

#[test]
fn the_table_lists_every_key_with_its_default() {
    let defaults = serde_json::to_value(PolicyConfig::default()).unwrap();
    let Value::Object(map) = &defaults else {
        panic!()
    };
    let code: BTreeSet<&str> = map.keys().map(String::as_str).collect();
    let rows = rows();
    let table: BTreeSet<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(table, code);
    for r in &rows {
        if let Some(word) = map[&r.key].as_str() {
            assert_eq!(r.default, word, "default of {}", r.key);
            continue;
        }
        let d: f64 = r.default.parse().unwrap();
        assert_eq!(map[&r.key].as_f64(), Some(d), "default of {}", r.key);
    }
}

#[test]
fn the_table_gives_each_keys_range() {
    for r in rows() {
        if r.key == "floor" {
            // A word, not a number: each listed word parses, nothing else does.
            for word in r.range.split(", ") {
                assert!(accepts_word(&r.key, word), "{} = {word}", r.key);
            }
            assert!(!accepts_word(&r.key, "limit"));
            continue;
        }
        let (lo, hi) = r
            .range
            .split_once('–')
            .unwrap_or_else(|| panic!("{}: range {:?} is not lo–hi", r.key, r.range));
        let (lo, hi): (f64, f64) = (lo.parse().unwrap(), hi.parse().unwrap());
        assert!(accepts(&r.key, lo), "{} = {lo}", r.key);
        assert!(accepts(&r.key, hi), "{} = {hi}", r.key);
        let step = if lo.fract() != 0.0 { 0.001 } else { 1.0 };
        assert!(!accepts(&r.key, lo - step), "{} below {lo}", r.key);
        assert!(!accepts(&r.key, hi + step), "{} above {hi}", r.key);
    }
}
