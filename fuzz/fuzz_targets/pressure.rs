//! `cpu.pressure` parser: never panics; accepted averages are percentages.
#![no_main]
use headroom::cgroup::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = parse::pressure(data) {
        for l in std::iter::once(&p.some).chain(p.full.as_ref()) {
            for v in [l.avg10, l.avg60, l.avg300] {
                assert!((0.0..=100.0).contains(&v), "{v}");
            }
        }
    }
});
