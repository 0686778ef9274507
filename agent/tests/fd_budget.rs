//! Kept file handles under the open-file limit a container starts with
//! (issue 50): containerd 2.x gives containers a soft `RLIMIT_NOFILE` of
//! 1,024, which leaves the kept handles 512 slots. At 500 pods every file a
//! light tick reads must still be read through a kept handle: the audit's
//! full scans, which read every file of every pod, keep theirs only in the
//! slots the light tick's files leave. The agent also raises its soft limit
//! to the hard one at start.
//!
//! Its own test binary: the limit is the process's.

use headroom::cgroup::read::{Handles, fd_budget, raise_fd_limit};
use headroom::cgroup::{Depth, Scanner, discover};
use headroom::testkit::calm_node::CalmNode;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

const PODS: usize = 500;

#[test]
fn at_500_pods_and_a_soft_limit_of_1024_every_hot_file_is_read_through_a_kept_handle() {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    assert!(
        hard > 1024,
        "the test needs a hard limit above 1024: {hard}"
    );
    setrlimit(Resource::RLIMIT_NOFILE, 1024, hard).expect("soft limit 1024");
    assert_eq!(fd_budget(), 512, "half the soft limit");

    let t = tempfile::tempdir().expect("tempdir");
    drop(CalmNode::new(t.path(), PODS));
    let layout = discover(t.path()).expect("layout");
    let mut sc = Scanner::new(t.path(), Handles::keeping(fd_budget()));
    let index = sc.scan(&layout, 0).expect("full scan");
    assert_eq!(index.pods.len(), PODS);
    assert!(index.pods.iter().all(|p| p.sample.is_ok()), "a pod failed");
    // Every pod managed: a light tick reads the root's and kubepods'
    // counters and each pod's cpu.stat, 503 files (of the 5,000 the full
    // scan read).
    let hot = 3 + PODS as u64;
    let tick = |sc: &mut Scanner, at: u64| {
        let snap = sc
            .rescan(&index, at, |_, _| Depth::Stat)
            .expect("light tick");
        assert!(snap.pods.iter().all(|p| p.sample.is_ok()), "a pod failed");
    };
    tick(&mut sc, 1);
    // And the audit again, between light ticks: it takes no slot.
    sc.scan(&layout, 2).expect("full scan");
    let (kept, opened) = (sc.handles().kept_reads, sc.handles().opened_reads);
    tick(&mut sc, 3);
    let h = sc.handles();
    assert_eq!(
        (h.kept_reads - kept, h.opened_reads - opened),
        (hot, 0),
        "every file of the light tick through a kept handle, none opened"
    );
    assert_eq!(h.len(), fd_budget(), "the audit's files in the slots left");
    assert_eq!((h.len() - h.cold_len()) as u64, hot);

    // At start the agent lifts the soft limit to the hard one.
    assert_eq!(raise_fd_limit().expect("raise"), (1024, hard));
    assert_eq!(fd_budget(), (hard as usize / 2).min(4096));
}
