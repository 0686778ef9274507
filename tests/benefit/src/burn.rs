//! Burning CPU time, measured on the calling thread's CPU clock. Under an
//! emulated guest a wall-clock loop would burn a varying amount of CPU; the
//! thread CPU clock is what CFS accounts and throttles.

use std::time::Duration;

/// CPU time this thread has consumed (CLOCK_THREAD_CPUTIME_ID).
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Spins until this thread has used `amount` more CPU time; returns a value
/// derived from the work so the optimiser cannot drop it.
pub fn burn_cpu(amount: Duration) -> u64 {
    let start = thread_cpu_time();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    loop {
        // A few thousand cheap steps between clock reads: the read is a
        // syscall, costly under emulation.
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        if thread_cpu_time().saturating_sub(start) >= amount {
            return std::hint::black_box(x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burn_uses_at_least_the_asked_cpu_time() {
        let before = thread_cpu_time();
        burn_cpu(Duration::from_millis(20));
        let used = thread_cpu_time() - before;
        assert!(used >= Duration::from_millis(20), "used {used:?}");
    }

    #[test]
    fn sleeping_does_not_count_as_cpu_time() {
        let before = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(50));
        assert!(thread_cpu_time() - before < Duration::from_millis(25));
    }
}
