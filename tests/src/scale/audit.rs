//! The kube-apiserver's audit log (JSON lines, `--audit-log-path`) as the
//! scale bench reads it: who made which request when. The bench's policy
//! logs only the agents' and the central watcher's users at `Metadata`, so
//! their requests are counted exactly and apart from the simulated
//! kubelets' and the churn driver's, which share the apiserver.
//!
//! A request is counted once: a watch when its response starts (it then
//! stays open until its `ResponseComplete`), anything else when it
//! completes; a watch refused before it started counts when it completes.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The audit policy: `Metadata` for the users of `groups`, nothing else;
/// `RequestReceived` omitted (every request then logs one line, a watch two).
pub fn policy_yaml(groups: &[&str]) -> String {
    let groups = groups
        .iter()
        .map(|g| format!("\"{g}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: Metadata
  userGroups: [{groups}]
- level: None
"
    )
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AuditError {
    #[error("not an audit event: {0}")]
    Json(String),
    #[error("bad timestamp {0:?}")]
    Timestamp(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    verb: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    user: RawUser,
    #[serde(default)]
    object_ref: Option<RawRef>,
    request_received_timestamp: String,
}

#[derive(Deserialize)]
struct RawUser {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct RawRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub id: String,
    pub stage: String,
    pub verb: String,
    pub user: String,
    /// `verb resource[/subresource]`, or `verb <path>` for a non-resource URL.
    pub key: String,
    /// Microseconds since the Unix epoch the request was received.
    pub received_us: i64,
}

/// Parses one JSON line of the audit log.
pub fn parse_line(line: &str) -> Result<Line, AuditError> {
    let e: RawEvent = serde_json::from_str(line).map_err(|e| AuditError::Json(e.to_string()))?;
    let ts: k8s_openapi::jiff::Timestamp = e
        .request_received_timestamp
        .parse()
        .map_err(|_| AuditError::Timestamp(e.request_received_timestamp.clone()))?;
    let what = match &e.object_ref {
        Some(r) => match &r.subresource {
            Some(s) => format!("{}/{s}", r.resource),
            None => r.resource.clone(),
        },
        None => e
            .request_uri
            .split('?')
            .next()
            .unwrap_or_default()
            .to_string(),
    };
    Ok(Line {
        key: format!("{} {what}", e.verb),
        id: e.audit_id,
        stage: e.stage,
        verb: e.verb,
        user: e.user.username,
        received_us: ts.as_microsecond(),
    })
}

/// A counted request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub user: String,
    pub key: String,
    pub received_us: i64,
}

/// Requests seen so far and the watches still open.
#[derive(Debug, Default)]
pub struct Tally {
    pub requests: Vec<Request>,
    /// Open watch audit id → user.
    open: HashMap<String, String>,
    /// Lines that were not audit events (counted, skipped).
    pub malformed: usize,
}

impl Tally {
    /// Takes one log line into account.
    pub fn feed(&mut self, text: &str) {
        let l = match parse_line(text) {
            Ok(l) => l,
            Err(_) => {
                self.malformed += 1;
                return;
            }
        };
        let count = |t: &mut Tally, l: &Line| {
            t.requests.push(Request {
                user: l.user.clone(),
                key: l.key.clone(),
                received_us: l.received_us,
            })
        };
        let first = match l.stage.as_str() {
            "ResponseStarted" => self.open.insert(l.id.clone(), l.user.clone()).is_none(),
            // A watch that started was counted then; anything else now.
            "ResponseComplete" | "Panic" => self.open.remove(&l.id).is_none(),
            _ => false,
        };
        if first {
            count(self, &l);
        }
    }

    /// Watches open now whose user passes `who`.
    pub fn open_watches(&self, who: impl Fn(&str) -> bool) -> usize {
        self.open.values().filter(|u| who(u)).count()
    }

    fn matching<'a>(
        &'a self,
        who: &'a impl Fn(&str) -> bool,
        from_us: i64,
        to_us: i64,
    ) -> impl Iterator<Item = &'a Request> + 'a {
        self.requests
            .iter()
            .filter(move |r| who(&r.user) && r.received_us >= from_us && r.received_us < to_us)
    }

    /// Requests by key of users passing `who`, received in `[from_us, to_us)`.
    pub fn counts(
        &self,
        who: impl Fn(&str) -> bool,
        from_us: i64,
        to_us: i64,
    ) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for r in self.matching(&who, from_us, to_us) {
            *out.entry(r.key.clone()).or_insert(0) += 1;
        }
        out
    }

    /// Requests per whole second of `[from_us, to_us)` (a last partial
    /// second included), of users passing `who`.
    pub fn per_second(&self, who: impl Fn(&str) -> bool, from_us: i64, to_us: i64) -> Vec<u64> {
        if to_us <= from_us {
            return Vec::new();
        }
        let n = ((to_us - from_us) as u64).div_ceil(1_000_000) as usize;
        let mut out = vec![0; n];
        for r in self.matching(&who, from_us, to_us) {
            out[((r.received_us - from_us) / 1_000_000) as usize] += 1;
        }
        out
    }

    /// Time of the last request of users passing `who` in the range.
    pub fn last(&self, who: impl Fn(&str) -> bool, from_us: i64, to_us: i64) -> Option<i64> {
        self.matching(&who, from_us, to_us)
            .map(|r| r.received_us)
            .max()
    }
}

/// Reads what the apiserver appended to its audit log since the last call.
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl Tail {
    pub fn new(path: &Path) -> Tail {
        Tail {
            path: path.to_path_buf(),
            offset: 0,
            partial: String::new(),
        }
    }

    /// Feeds every complete new line into `tally`; a missing file is no
    /// lines yet (the apiserver creates it on its first audited request).
    pub fn read_into(&mut self, tally: &mut Tally) -> std::io::Result<()> {
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        while let Some(i) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=i).collect();
            let line = line.trim();
            if !line.is_empty() {
                tally.feed(line);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: &str, stage: &str, verb: &str, user: &str, obj: &str, at: &str) -> String {
        format!(
            r#"{{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"{id}","stage":"{stage}","requestURI":"/api/v1/pods?watch=true","verb":"{verb}","user":{{"username":"{user}","groups":["g"]}},{obj}"requestReceivedTimestamp":"{at}","stageTimestamp":"{at}"}}"#
        )
    }

    const PODS: &str = r#""objectRef":{"resource":"pods","apiVersion":"v1"},"#;
    const RESIZE: &str =
        r#""objectRef":{"resource":"pods","subresource":"resize","name":"p","apiVersion":"v1"},"#;

    #[test]
    fn a_line_parses_to_user_key_and_time() {
        let l = parse_line(&ev(
            "a",
            "ResponseComplete",
            "patch",
            "agent-1",
            RESIZE,
            "2026-12-02T13:00:01.500000Z",
        ))
        .unwrap();
        assert_eq!(l.key, "patch pods/resize");
        assert_eq!(l.user, "agent-1");
        assert_eq!(l.received_us % 1_000_000, 500_000);
    }

    #[test]
    fn a_non_resource_request_is_keyed_by_its_path() {
        let l = parse_line(&ev(
            "a",
            "ResponseComplete",
            "get",
            "u",
            "",
            "2026-12-02T13:00:00Z",
        ))
        .unwrap();
        assert_eq!(l.key, "get /api/v1/pods");
    }

    #[test]
    fn a_watch_counts_once_and_stays_open_until_it_completes() {
        let mut t = Tally::default();
        let at = "2026-12-02T13:00:00Z";
        t.feed(&ev("w", "ResponseStarted", "watch", "agent-1", PODS, at));
        assert_eq!(t.open_watches(|u| u.starts_with("agent")), 1);
        t.feed(&ev("w", "ResponseComplete", "watch", "agent-1", PODS, at));
        assert_eq!(t.open_watches(|_| true), 0);
        assert_eq!(t.requests.len(), 1);
        // Refused before starting: counted at completion.
        t.feed(&ev("x", "ResponseComplete", "watch", "agent-1", PODS, at));
        assert_eq!(t.requests.len(), 2);
    }

    #[test]
    fn counts_and_per_second_respect_user_and_range() {
        let mut t = Tally::default();
        t.feed(&ev(
            "1",
            "ResponseComplete",
            "list",
            "agent-1",
            PODS,
            "2026-12-02T13:00:00.100Z",
        ));
        t.feed(&ev(
            "2",
            "ResponseComplete",
            "list",
            "agent-2",
            PODS,
            "2026-12-02T13:00:00.900Z",
        ));
        t.feed(&ev(
            "3",
            "ResponseComplete",
            "patch",
            "agent-1",
            RESIZE,
            "2026-12-02T13:00:02.000Z",
        ));
        t.feed(&ev(
            "4",
            "ResponseComplete",
            "list",
            "central",
            PODS,
            "2026-12-02T13:00:00.500Z",
        ));
        let t0 = parse_line(&ev(
            "t",
            "ResponseComplete",
            "get",
            "u",
            "",
            "2026-12-02T13:00:00Z",
        ))
        .unwrap()
        .received_us;
        let agents = |u: &str| u.starts_with("agent");
        let c = t.counts(agents, t0, t0 + 3_000_000);
        assert_eq!(c.get("list pods"), Some(&2));
        assert_eq!(c.get("patch pods/resize"), Some(&1));
        assert_eq!(t.counts(agents, t0, t0 + 1_000_000).len(), 1);
        assert_eq!(t.per_second(agents, t0, t0 + 2_500_000), vec![2, 0, 1]);
        assert_eq!(t.last(agents, t0, t0 + 3_000_000), Some(t0 + 2_000_000));
        assert_eq!(t.per_second(agents, t0, t0), Vec::<u64>::new());
    }

    #[test]
    fn garbage_lines_are_counted_and_skipped() {
        let mut t = Tally::default();
        t.feed("not json");
        t.feed(r#"{"kind":"Event"}"#);
        assert_eq!(t.malformed, 2);
        assert!(t.requests.is_empty());
    }

    #[test]
    fn the_tail_reads_only_complete_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.log");
        let mut tail = Tail::new(&p);
        let mut t = Tally::default();
        tail.read_into(&mut t).unwrap(); // no file yet
        let at = "2026-12-02T13:00:00Z";
        let a = ev("1", "ResponseComplete", "list", "u", PODS, at);
        let b = ev("2", "ResponseComplete", "list", "u", PODS, at);
        std::fs::write(&p, format!("{a}\n{}", &b[..10])).unwrap();
        tail.read_into(&mut t).unwrap();
        assert_eq!(t.requests.len(), 1);
        std::fs::write(&p, format!("{a}\n{b}\n")).unwrap();
        tail.read_into(&mut t).unwrap();
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.malformed, 0);
    }

    #[test]
    fn the_policy_names_the_groups() {
        let y = policy_yaml(&["a", "b"]);
        assert!(y.contains(r#"userGroups: ["a", "b"]"#), "{y}");
        assert!(y.trim_end().ends_with("- level: None"));
    }
}
