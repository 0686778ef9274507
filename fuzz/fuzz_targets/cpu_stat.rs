//! `cpu.stat` parser: never panics; what it accepts round-trips.
#![no_main]
use headroom::cgroup::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = parse::cpu_stat(data) {
        assert_eq!(
            parse::cpu_stat(parse::format_cpu_stat(&s).as_bytes()),
            Ok(s)
        );
    }
});
