//! CPU list (`cpuset.cpus.effective`) parser: never panics; a count is > 0.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data)
        && let Some(n) = headroom::node_slack::cpu_list_len(s)
    {
        assert!(n > 0);
    }
});
