//! `cpuset.cpus.effective`: the CPUs a cgroup may run on, as a kernel CPU
//! list (`0-3,6`). The one parser of CPU lists (bounded: a CPU number above
//! [`MAX_CPU`] is malformed, not a huge allocation) and the one reader of
//! cpuset files, for the node's CPU count (`signal::usage::online_cpus_at`)
//! and the static CPU manager's shared pool (`signal::shared_pool`).

use std::collections::BTreeSet;
use std::path::Path;

use super::read::{self, ReadError};
use super::{CgroupError, file, parse::ParseError};

/// The CPUs of `rel`'s `cpuset.cpus.effective` under `root` (`rel` empty:
/// the root cgroup's). A file that is gone says the cgroup vanished.
pub fn read_cpus(root: &Path, rel: &Path) -> Result<BTreeSet<u32>, CgroupError> {
    let path = root.join(rel).join(file::CPUSET_CPUS_EFFECTIVE);
    match read::read(&path) {
        Ok(bytes) => parse_cpus(&rel.join(file::CPUSET_CPUS_EFFECTIVE), &bytes),
        Err(ReadError::NotFound(_)) => Err(CgroupError::Vanished(rel.to_path_buf())),
        Err(e) => Err(CgroupError::from_read(
            rel.join(file::CPUSET_CPUS_EFFECTIVE),
            e,
        )),
    }
}

/// The CPUs of a `cpuset.cpus.effective` file's bytes; `path` names it in
/// the error.
pub fn parse_cpus(path: &Path, bytes: &[u8]) -> Result<BTreeSet<u32>, CgroupError> {
    let malformed = |source| CgroupError::Malformed {
        path: path.to_path_buf(),
        source,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| malformed(ParseError::NotUtf8(e)))?;
    parse_cpu_list(text).map_err(|why| malformed(ParseError::Invalid(why)))
}

/// Highest CPU number accepted in a list (the kernel's `NR_CPUS` is at most
/// 8192 on x86_64): a larger one is malformed, not a huge allocation.
pub const MAX_CPU: u32 = 8191;

/// Parses a kernel CPU list (`0-3,6,8-9`, a trailing newline allowed) into
/// its CPUs. Errors name what is wrong; an empty list is an error (a
/// container that may run nowhere is not a pool).
pub fn parse_cpu_list(text: &str) -> Result<BTreeSet<u32>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty CPU list".into());
    }
    let mut set = BTreeSet::new();
    for part in text.split(',') {
        let num = |s: &str| -> Result<u32, String> {
            let n: u32 = s
                .trim()
                .parse()
                .map_err(|_| format!("{:?} is not a CPU number", quote(s)))?;
            if n > MAX_CPU {
                return Err(format!("CPU {n} is above {MAX_CPU}"));
            }
            Ok(n)
        };
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let a = num(part)?;
                (a, a)
            }
        };
        if b < a {
            return Err(format!("range {:?} runs backwards", quote(part)));
        }
        set.extend(a..=b);
    }
    Ok(set)
}

/// A set as a kernel CPU list, ranges merged (`0-1,4`).
pub fn format_cpu_list(set: &BTreeSet<u32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = set.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end += 1;
            it.next();
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    out.join(",")
}

/// At most 32 bytes of untrusted text, for error messages.
fn quote(s: &str) -> String {
    s.chars().take(32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print_back() {
        let s = parse_cpu_list("0-1,4\n").unwrap();
        assert_eq!(s.iter().copied().collect::<Vec<_>>(), [0, 1, 4]);
        assert_eq!(format_cpu_list(&s), "0-1,4");
        assert_eq!(
            format_cpu_list(&parse_cpu_list("3,1,2,7").unwrap()),
            "1-3,7"
        );
        assert_eq!(format_cpu_list(&parse_cpu_list("5").unwrap()), "5");
    }

    #[test]
    fn malformed_cpu_lists_are_errors_that_say_why() {
        for (text, why) in [
            ("", "empty"),
            ("\n", "empty"),
            ("x", "not a CPU number"),
            ("0-", "not a CPU number"),
            ("-3", "not a CPU number"),
            ("0,,1", "not a CPU number"),
            ("3-1", "runs backwards"),
            ("0-99999999999", "not a CPU number"),
            ("0-9000", "above 8191"),
            ("1 2", "not a CPU number"),
        ] {
            let e = parse_cpu_list(text).expect_err(text);
            assert!(e.contains(why), "{text:?}: {e}");
        }
        // A long garbage string is quoted short.
        let e = parse_cpu_list(&"z".repeat(10_000)).unwrap_err();
        assert!(e.len() < 80, "{e}");
    }

    #[test]
    fn any_bytes_parse_without_panicking() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..64))| {
            let _ = parse_cpus(Path::new("c"), &bytes);
        });
    }

    #[test]
    fn the_count_of_a_list_is_its_cpus() {
        let n = |t: &str| parse_cpu_list(t).ok().map(|s| s.len());
        assert_eq!(n("0-3\n"), Some(4));
        assert_eq!(n("0-3,6,8-9"), Some(7));
        assert_eq!(n("5"), Some(1));
        assert_eq!(n(""), None);
        assert_eq!(n("3-1"), None);
        assert_eq!(n("x"), None);
    }
}
