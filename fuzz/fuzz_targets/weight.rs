//! `cpu.weight` parser: never panics; accepted weights are in 1..=10000.
#![no_main]
use headroom::cgroup::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(w) = parse::weight(data) {
        assert!((1..=10000).contains(&w));
    }
});
