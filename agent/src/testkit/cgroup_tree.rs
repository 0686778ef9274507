//! Writing a cgroup v2 tree of plain files for whole-tick tests and benches:
//! the interface files the agent reads, idle unless a test says otherwise.

use std::path::Path;

/// `cpu.pressure` of a cgroup nothing ever waited in.
pub const PSI_IDLE: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n\
                            full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";

/// Writes `text` to `dir/file`, making `dir` first. Panics on failure: a
/// test's tree that cannot be written is the test's failure.
pub fn write(dir: &Path, file: &str, text: &str) {
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join(file), text).expect("write");
}

/// A `cpu.stat` whose CPU time is `usage_usec`, never throttled.
pub fn cpu_stat(usage_usec: u64) -> String {
    format!(
        "usage_usec {usage_usec}\nuser_usec {usage_usec}\nsystem_usec 0\n\
         nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
    )
}

/// A cgroup with its `cpu.max`, an idle `cpu.stat` and `cpu.pressure`.
pub fn cgroup(dir: &Path, cpu_max: &str) {
    write(dir, "cpu.max", &format!("{cpu_max}\n"));
    write(dir, "cpu.stat", &cpu_stat(0));
    write(dir, "cpu.pressure", PSI_IDLE);
}
