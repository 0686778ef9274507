//! What a steady tick allocates, counted (issue 40): a counting allocator
//! for this test binary alone, counting the allocations of the calling
//! thread only, so tests running beside it on other threads do not count.
//! Counts, not times: nothing here depends on the machine's speed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use headroom::cgroup::read::{Buf, Handles};
use headroom::kube::view::Views;
use k8s_openapi::api::core::v1::Pod;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed to `System` unchanged; the count is a
// thread-local `Cell` (no allocation, no lock).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocs(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
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
