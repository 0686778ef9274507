//! The load generator against the real service on loopback: every scheduled
//! request is accounted for, and queueing behind a saturated server shows in
//! the corrected latencies.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use benefit::load::{LoadConfig, run};
use benefit::schedule;
use benefit::serve::{ServeConfig, serve};

fn service(workers: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        serve(
            l,
            ServeConfig {
                workers,
                default_burn: Duration::from_millis(1),
            },
        )
    });
    addr
}

fn cfg(target: SocketAddr, sched: &str, burn_us: u64, connections: usize) -> LoadConfig {
    LoadConfig {
        target,
        phases: schedule::parse(sched).unwrap(),
        burn_us,
        connections,
        drain: Duration::from_secs(30),
    }
}

#[test]
fn every_scheduled_request_is_answered_and_counted_per_phase() {
    let addr = service(2);
    let s = run(
        &cfg(addr, "quiet:0.5@20,burst:0.5@60", 1000, 8),
        Instant::now(),
    );
    assert_eq!(s.all.count, 40);
    assert_eq!(s.phases[0].count, 10);
    assert_eq!(s.phases[1].count, 30);
    assert_eq!((s.errors, s.unfinished), (0, 0));
    assert_eq!(s.seconds.len(), 1);
}

#[test]
fn a_saturated_server_shows_its_queue_in_the_corrected_latency() {
    // One worker, 50 ms of CPU per request, 50 requests in 1 s: 2.5 s of
    // work. The last request, scheduled near 1 s, is answered near 2.5 s;
    // the latency of a request once sent is only ~50 ms, so an uncorrected
    // p99 would stay near that.
    let addr = service(1);
    let s = run(&cfg(addr, "burst:1@50", 50_000, 4), Instant::now());
    assert_eq!(s.all.count, 50);
    assert_eq!(s.errors, 0);
    assert!(s.all.p99_ms > 800.0, "p99 {} ms", s.all.p99_ms);
    assert!(s.all.p50_ms > 300.0, "p50 {} ms", s.all.p50_ms);
}

#[test]
fn a_server_that_never_answers_leaves_every_request_unfinished() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    // Accepts and holds the connections, never reads.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming() {
            held.push(c);
        }
    });
    let mut c = cfg(addr, "q:0.5@10", 1000, 2);
    c.drain = Duration::from_millis(500);
    let s = run(&c, Instant::now());
    assert_eq!(s.all.count, 5);
    assert_eq!(s.unfinished, 5);
    // Counted at the time they had waited: at least the drain.
    assert!(s.all.p50_ms >= 400.0, "{:?}", s.all);
}

#[test]
fn a_refused_connection_counts_errors_not_a_hang() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let s = run(&cfg(addr, "q:0.5@10", 1000, 1), Instant::now());
    assert_eq!(s.all.count, 5);
    assert_eq!(s.errors, 5);
}
