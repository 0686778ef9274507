//! What a steady tick allocates, counted (issue 40), with a counting
//! allocator for this test binary alone: unchanged pod views and kept file
//! handles allocate nothing, and a whole tick of the agent on a calm node
//! ([`headroom::testkit::calm_node`]: a temp cgroup v2 tree, half the pods
//! managed), counted at two pod counts, may allocate a fixed number of times
//! (a round, a snapshot), never once more per pod.
//!
//! The tick reads cgroups on tokio's blocking pool, so every thread is
//! counted while a test has the counter armed; the tests take turns
//! ([`one_at_a_time`]), so no other test's allocations land in a count.
//! Counts, not times.
//!
//! When the tick's count fails, `HEADROOM_ALLOC_TRACE=0 cargo test -p
//! headroom-agent --test steady_allocs -- --nocapture` prints where each allocation of the
//! larger node's tick came from (the agent's frames of its backtrace);
//! `HEADROOM_ALLOC_TRACE=4096` only those of 4 KiB or more.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use headroom::cgroup::read::{Buf, Handles};
use headroom::kube::view::Views;
use headroom::testkit::calm_node::CalmNode;
use k8s_openapi::api::core::v1::Pod;

struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static TRACE: AtomicBool = AtomicBool::new(false);
/// Traced allocations are those of at least this many bytes.
static TRACE_MIN: AtomicU64 = AtomicU64::new(0);
static TRACES: Mutex<Vec<Backtrace>> = Mutex::new(Vec::new());

thread_local! {
    /// Set while this thread records a backtrace (which allocates).
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

fn counted(size: usize) {
    if !ARMED.load(Ordering::Relaxed) {
        return;
    }
    if IN_TRACE.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    if TRACE.load(Ordering::Relaxed) && size as u64 >= TRACE_MIN.load(Ordering::Relaxed) {
        IN_TRACE.with(|t| t.set(true));
        let bt = Backtrace::force_capture();
        TRACES.lock().unwrap_or_else(|e| e.into_inner()).push(bt);
        IN_TRACE.with(|t| t.set(false));
    }
}

// SAFETY: every call is passed to `System` unchanged; counting touches an
// atomic and, when tracing, a thread-local flag that keeps the tracer's own
// allocations out of the count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        counted(l.size());
        // SAFETY: as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        counted(n);
        // SAFETY: as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Held by each test for its whole run: the counter counts every thread.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocations `f` makes (on any thread).
fn allocs(f: impl FnOnce()) -> u64 {
    ALLOCS.store(0, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    f();
    ARMED.store(false, Ordering::SeqCst);
    ALLOCS.load(Ordering::SeqCst)
}

/// Allocations of one steady tick of `node`, after `warm` ticks.
async fn steady_tick_allocs(node: &mut CalmNode, warm: usize) -> u64 {
    for _ in 0..warm {
        node.tick().await;
    }
    ALLOCS.store(0, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    let round = node.tick().await;
    ARMED.store(false, Ordering::SeqCst);
    let round = round.expect("a round");
    let managed: Vec<_> = round
        .decisions
        .iter()
        .filter(|d| d.managed().is_some())
        .collect();
    assert_eq!(
        managed.len(),
        round.decisions.len().div_ceil(2),
        "half are managed"
    );
    assert!(
        managed
            .iter()
            .all(|d| d.target_m() == d.managed().map(|m| m.ceiling_m)),
        "every managed pod stays at its ceiling"
    );
    assert!(
        managed
            .iter()
            .any(|d| d.managed().is_some_and(|m| m.containers.len() == 3)),
        "some manage three containers"
    );
    ALLOCS.load(Ordering::SeqCst)
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Prints, per call site, how many allocations the agent's own frames made.
fn print_traces() {
    let traces = std::mem::take(&mut *TRACES.lock().unwrap_or_else(|e| e.into_inner()));
    let mut sites: std::collections::BTreeMap<String, u64> = Default::default();
    for bt in traces {
        let text = bt.to_string();
        let frames: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.contains("headroom::") && !l.starts_with("at "))
            .take(7)
            .collect();
        *sites.entry(frames.join("\n    <- ")).or_default() += 1;
    }
    let mut sites: Vec<_> = sites.into_iter().collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.1));
    for (site, n) in sites {
        println!("{n:5}  {site}");
    }
}

/// A steady tick at 120 pods (60 managed) allocates no more often than at
/// 20: nothing in it scales with the pods of a calm node. Not the audit's
/// tick (every `--audit-interval`), whose full scan lists every directory.
#[test]
fn a_steady_tick_allocates_nothing_per_pod() {
    let _one = one_at_a_time();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (t20, t120) = (tempdir(), tempdir());
    let mut small = CalmNode::new(t20.path(), 20);
    let few = rt.block_on(steady_tick_allocs(&mut small, 4));
    let mut large = CalmNode::new(t120.path(), 120);
    // HEADROOM_ALLOC_TRACE=<bytes>: only allocations at least that large.
    if let Some(min) = std::env::var_os("HEADROOM_ALLOC_TRACE") {
        let min = min.to_str().and_then(|m| m.parse().ok()).unwrap_or(0);
        TRACE_MIN.store(min, Ordering::SeqCst);
        TRACE.store(true, Ordering::SeqCst);
    }
    let many = rt.block_on(steady_tick_allocs(&mut large, 4));
    TRACE.store(false, Ordering::SeqCst);
    print_traces();
    println!("one steady tick: {few} allocations at 20 pods, {many} at 120");
    // Equal today; the margin is for the runtime's own housekeeping. One
    // allocation per pod would add at least 50 (the managed pods) here.
    assert!(
        many <= few + 2,
        "a steady tick allocates per pod: {few} allocations at 20 pods, {many} at 120"
    );
}

fn pods(n: usize) -> Vec<Arc<Pod>> {
    (0..n)
        .map(|i| {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("p{i}"), "namespace": "ns",
                                 "uid": format!("uid-{i}"), "resourceVersion": "7"},
                    "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
                        "requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}]},
                    "status": {"phase": "Running"}
                }))
                .expect("pod"),
            )
        })
        .collect()
}

/// A tick whose pods did not change takes their views without reading or
/// allocating anything, at 50 pods as at 500: the views' cost does not grow
/// with the pods of a calm node.
#[test]
fn unchanged_pods_cost_no_allocation_at_any_count() {
    let _one = one_at_a_time();
    for n in [50, 500] {
        let cache = pods(n);
        let mut v = Views::default();
        let first = allocs(|| drop(v.refresh(&cache, "n1", |_, _| {})));
        assert!(first >= n as u64, "{n} pods read once: {first} allocations");
        let again = allocs(|| {
            let list = v.refresh(&cache, "n1", |_, _| {});
            assert_eq!(list.len(), n);
        });
        assert_eq!(again, 0, "{n} unchanged pods: {again} allocations");
    }
}

/// A kept handle is re-read into the reused buffer without allocating:
/// the hot files of a steady tick cost no allocation per file.
#[test]
fn a_kept_file_is_reread_without_allocating() {
    let _one = one_at_a_time();
    let t = tempfile::tempdir().expect("tempdir");
    let files: Vec<_> = (0..20)
        .map(|i| {
            let p = t.path().join(format!("cpu.stat.{i}"));
            std::fs::write(&p, "usage_usec 1\nuser_usec 1\nsystem_usec 0\n").expect("write");
            p
        })
        .collect();
    let mut h = Handles::keeping(64);
    let mut b = Buf::default();
    for p in &files {
        h.read_into(p, &mut b).expect("first read");
    }
    let n = allocs(|| {
        for p in &files {
            h.read_into(p, &mut b).expect("kept read");
        }
        h.sweep();
    });
    assert_eq!(n, 0, "20 kept files re-read: {n} allocations");
    assert_eq!(h.kept_reads, 20);
}
