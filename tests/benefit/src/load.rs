//! The open-loop load generator: a dispatcher releases each request at its
//! scheduled time into a queue; a fixed set of keep-alive connections take
//! them in order. Latency is measured from the scheduled time
//! ([`crate::record`]), so queueing behind a slow server is counted.

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http;
use crate::record::{Outcome, Recorder, Summary};
use crate::schedule::{self, Phase};

#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub target: SocketAddr,
    pub phases: Vec<Phase>,
    pub burn_us: u64,
    pub connections: usize,
    /// How long after the schedule ends answers are still waited for.
    pub drain: Duration,
}

/// One scheduled request: its offset from the start and its phase.
type Job = (u64, Duration, usize);

struct Shared {
    start: Instant,
    queue: Mutex<Receiver<Job>>,
    in_flight: Mutex<HashMap<u64, (Duration, usize)>>,
    results: Mutex<Recorder>,
    stop: AtomicBool,
    done: AtomicU64,
}

/// Runs the schedule from `start` (an instant now or soon) and returns the
/// latencies. Returns after the schedule plus at most `drain`.
pub fn run(cfg: &LoadConfig, start: Instant) -> Summary {
    let times = schedule::send_times(&cfg.phases);
    let seconds = schedule::total(&cfg.phases).as_secs_f64().ceil() as usize;
    let (tx, rx) = channel::<Job>();
    let shared = Arc::new(Shared {
        start,
        queue: Mutex::new(rx),
        in_flight: Mutex::new(HashMap::new()),
        results: Mutex::new(Recorder::new(cfg.phases.len(), seconds)),
        stop: AtomicBool::new(false),
        done: AtomicU64::new(0),
    });
    for _ in 0..cfg.connections.max(1) {
        let (shared, cfg) = (Arc::clone(&shared), cfg.clone());
        std::thread::spawn(move || connection_loop(&shared, &cfg));
    }
    for (id, (at, phase)) in times.iter().enumerate() {
        let due = start + *at;
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let _ = tx.send((id as u64, *at, *phase));
    }
    let deadline = start + schedule::total(&cfg.phases) + cfg.drain;
    while shared.done.load(Ordering::SeqCst) < times.len() as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    shared.stop.store(true, Ordering::SeqCst);
    // Whatever is left (queued or in flight) waited until now.
    let ended = start.elapsed();
    let mut left: Vec<(Duration, usize)> = Vec::new();
    if let Ok(q) = shared.queue.lock() {
        while let Ok((_, at, phase)) = q.try_recv() {
            left.push((at, phase));
        }
    }
    if let Ok(mut f) = shared.in_flight.lock() {
        left.extend(f.drain().map(|(_, v)| v));
    }
    let mut rec = shared.results.lock().unwrap_or_else(|p| p.into_inner());
    for (at, phase) in left {
        rec.record(at, phase, ended, Outcome::Unfinished);
    }
    rec.summary()
}

fn connect(cfg: &LoadConfig) -> Option<(TcpStream, BufReader<TcpStream>)> {
    let s = TcpStream::connect_timeout(&cfg.target, Duration::from_secs(5)).ok()?;
    s.set_nodelay(true).ok()?;
    // Longer than the whole run: a slow answer is a long latency, never an
    // error; the run's deadline counts what is still unanswered.
    let whole = schedule::total(&cfg.phases) + cfg.drain + Duration::from_secs(5);
    s.set_read_timeout(Some(whole)).ok()?;
    let r = BufReader::new(s.try_clone().ok()?);
    Some((s, r))
}

fn connection_loop(shared: &Shared, cfg: &LoadConfig) {
    let host = cfg.target.to_string();
    let mut conn = None;
    while !shared.stop.load(Ordering::SeqCst) {
        let job = {
            let Ok(q) = shared.queue.lock() else { return };
            q.recv_timeout(Duration::from_millis(50))
        };
        let (id, at, phase) = match job {
            Ok(j) => j,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if let Ok(mut f) = shared.in_flight.lock() {
            f.insert(id, (at, phase));
        }
        if conn.is_none() {
            conn = connect(cfg);
        }
        let ok = match conn.as_mut() {
            Some((w, r)) => {
                http::write_request(w, &host, cfg.burn_us).is_ok()
                    && matches!(http::read_response(r), Ok(true))
            }
            None => false,
        };
        if !ok {
            // Reconnect for the next request; this one counts as an error.
            conn = None;
        }
        let ended = shared.start.elapsed();
        let still_ours = shared
            .in_flight
            .lock()
            .map(|mut f| f.remove(&id).is_some())
            .unwrap_or(false);
        if still_ours {
            let outcome = if ok { Outcome::Ok } else { Outcome::Error };
            if let Ok(mut r) = shared.results.lock() {
                r.record(at, phase, ended, outcome);
            }
            shared.done.fetch_add(1, Ordering::SeqCst);
        }
        if !ok {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
