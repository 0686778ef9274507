//! The label sets and label values of the `headroom_` families: the fixed
//! vocabularies (result, direction, error class, scan error kind) a
//! dashboard or alert matches on.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::model::Name;
pub use crate::policy::Direction;

/// A label value shared with the pod view it names: a pod's series are
/// looked up every tick, and a shared name is a reference count, not a copy
/// of the string.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct SharedValue(pub Name);

impl EncodeLabelValue for SharedValue {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&&*self.0, encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub namespace: SharedValue,
    pub pod: SharedValue,
}

/// `container` is empty for the pod cgroup (the cAdvisor convention).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CgroupLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ResizeResult {
    /// Patch accepted by the apiserver.
    applied,
    /// Refused by validation/admission (the apiserver said why).
    refused,
    /// Transport or server error.
    error,
    /// Seen in `cpu.max` after the kubelet finished.
    verified,
    /// Not seen in `cpu.max` within the grace period.
    unverified,
    /// Replaced before it was verified: by a newer patch of the same pod
    /// (the newer one is followed instead), or by another writer's change
    /// of its limits (Headroom yields the pod to it).
    superseded,
    /// The pod was deleted (or left the node) before it was verified.
    pod_gone,
    /// Computed but not sent (`--dry-run`).
    dry_run,
}

/// `direction="raise"` / `"lower"`: the policy's own type, so the reconciler
/// needs no second one.
impl EncodeLabelValue for Direction {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = match self {
            Direction::Raise => "raise",
            Direction::Lower => "lower",
        };
        EncodeLabelValue::encode(&s, encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResizeLabels {
    pub result: ResizeResult,
    pub direction: Direction,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PatchErrorClass {
    refused,
    conflict,
    not_found,
    forbidden,
    /// No HTTP answer: connection refused or reset, TLS, timeout.
    transport,
    /// 403 while the Node is re-registered (resize admission cannot find it).
    node_not_found,
    throttled,
    server_error,
    /// An HTTP status the agent has no rule for.
    unexpected,
}

impl PatchErrorClass {
    /// Every class, for tests that each one is reachable and exported.
    pub const ALL: [PatchErrorClass; 9] = [
        PatchErrorClass::refused,
        PatchErrorClass::conflict,
        PatchErrorClass::not_found,
        PatchErrorClass::forbidden,
        PatchErrorClass::transport,
        PatchErrorClass::node_not_found,
        PatchErrorClass::throttled,
        PatchErrorClass::server_error,
        PatchErrorClass::unexpected,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PatchErrorLabels {
    pub class: PatchErrorClass,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PodState {
    managed,
    unmanaged,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodStateLabels {
    pub state: PodState,
    /// Why a pod is unmanaged (a fixed set from the policy); empty for managed.
    pub reason: String,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum CgroupKind {
    pod,
    container,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftEventLabels {
    pub cgroup: CgroupKind,
}

/// What a lowering made for a pod short of CPU bought, once checked
/// (`crate::signal::contention::effect`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum LoweringEffect {
    /// The owed pod got more CPU or waited less.
    helped,
    /// It did not: the lowering was undone.
    no_effect,
    /// Its own need changed across the windows: not held, not blocked.
    need_changed,
    /// Never applied in `cpu.max`, or the owed pod went unread: not judged.
    unjudged,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoweringLabels {
    pub effect: LoweringEffect,
}

/// What went wrong reading cgroups. The first three fail a whole tick;
/// the others are one file or directory, the tick goes on without it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ScanErrorKind {
    /// kubepods' own files unusable: the tick was skipped.
    kubepods,
    /// The scan did not finish within the tick deadline: the tick was skipped.
    timeout,
    /// kubepods `usage_usec` went backwards: that interval's usage was skipped.
    counter_reset,
    permission_denied,
    malformed,
    missing,
    /// A symlink, FIFO or device where a regular file belongs.
    not_regular_file,
    too_large,
    io,
}

impl ScanErrorKind {
    pub fn of(e: &crate::cgroup::CgroupError) -> Self {
        use crate::cgroup::CgroupError as E;
        match e {
            E::PermissionDenied { .. } => Self::permission_denied,
            E::Malformed { .. } => Self::malformed,
            E::Missing(_) | E::Vanished(_) => Self::missing,
            E::NotRegular { .. } => Self::not_regular_file,
            E::TooLarge { .. } => Self::too_large,
            E::Io { .. } => Self::io,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScanErrorLabels {
    pub kind: ScanErrorKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BuildLabels {
    pub(super) version: String,
}

pub(super) fn pod_labels(namespace: &Name, pod: &Name) -> PodLabels {
    PodLabels {
        namespace: SharedValue(namespace.clone()),
        pod: SharedValue(pod.clone()),
    }
}

#[cfg(test)]
mod tests {
    /// The match is exhaustive, so a new class does not build until it is
    /// given a position here; `ALL` must hold each class at its position,
    /// and the positions must run 0..ALL.len() without a gap.
    #[test]
    fn all_holds_each_class_at_its_position() {
        use super::PatchErrorClass;
        fn position(c: PatchErrorClass) -> usize {
            match c {
                PatchErrorClass::refused => 0,
                PatchErrorClass::conflict => 1,
                PatchErrorClass::not_found => 2,
                PatchErrorClass::forbidden => 3,
                PatchErrorClass::transport => 4,
                PatchErrorClass::node_not_found => 5,
                PatchErrorClass::throttled => 6,
                PatchErrorClass::server_error => 7,
                PatchErrorClass::unexpected => 8,
            }
        }
        for (i, c) in PatchErrorClass::ALL.iter().enumerate() {
            assert_eq!(position(*c), i, "{c:?}");
        }
        let highest = PatchErrorClass::ALL.iter().map(|c| position(*c)).max();
        assert_eq!(highest, Some(PatchErrorClass::ALL.len() - 1));
    }

    use std::path::PathBuf;

    use super::ScanErrorKind;
    use crate::cgroup::CgroupError as E;
    use crate::cgroup::parse::ParseError;

    /// Each cgroup error counts under the label it always had.
    #[test]
    fn scan_error_kind_of_each_cgroup_error() {
        let p = || PathBuf::from("x");
        let io = |errno| std::io::Error::from_raw_os_error(errno).into();
        let cases = [
            (E::Vanished(p()), ScanErrorKind::missing),
            (E::Missing(p()), ScanErrorKind::missing),
            (
                E::Malformed {
                    path: p(),
                    source: ParseError::Invalid("bad".into()),
                },
                ScanErrorKind::malformed,
            ),
            (
                E::PermissionDenied {
                    path: p(),
                    source: io(nix::libc::EACCES),
                },
                ScanErrorKind::permission_denied,
            ),
            (
                E::NotRegular {
                    path: p(),
                    what: "a FIFO",
                },
                ScanErrorKind::not_regular_file,
            ),
            (
                E::TooLarge {
                    path: p(),
                    limit: 1,
                },
                ScanErrorKind::too_large,
            ),
            (
                E::Io {
                    path: p(),
                    source: io(nix::libc::EIO),
                },
                ScanErrorKind::io,
            ),
        ];
        for (e, kind) in cases {
            assert_eq!(ScanErrorKind::of(&e), kind, "{e}");
        }
    }
}
