//! `cpu.max` parser: never panics; what it accepts is within the kernel's
//! bounds and survives a write/read round trip.
#![no_main]
use headroom::cgroup::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = parse::cpu_max(data) {
        assert!(parse::PERIOD_US.contains(&m.period_us));
        assert!(m.quota_us.is_none_or(|q| q >= parse::MIN_QUOTA_US));
        let _ = m.millicores();
        assert_eq!(parse::cpu_max(parse::format_cpu_max(&m).as_bytes()), Ok(m));
    }
});
