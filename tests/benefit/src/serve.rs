//! The service: a thread per keep-alive connection reads requests and hands
//! each to a fixed pool of workers that burn its CPU time, like a server with
//! a bounded worker pool.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::burn::burn_cpu;
use crate::http::{self, HttpError, Request};

/// Open connections beyond this are closed at once: bounded threads.
pub const MAX_CONNECTIONS: usize = 1024;

type Job = (Duration, SyncSender<()>);

#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub workers: usize,
    /// CPU per request when the request names none.
    pub default_burn: Duration,
}

/// Serves forever on `listener`.
pub fn serve(listener: TcpListener, cfg: ServeConfig) {
    let (tx, rx) = sync_channel::<Job>(4096);
    let rx = Arc::new(Mutex::new(rx));
    for _ in 0..cfg.workers.max(1) {
        let rx = Arc::clone(&rx);
        std::thread::spawn(move || worker(&rx));
    }
    let open = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (tx, open, default) = (tx.clone(), Arc::clone(&open), cfg.default_burn);
        std::thread::spawn(move || {
            let _ = connection(conn, &tx, default);
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((amount, done)) = job else { return };
        burn_cpu(amount);
        let _ = done.send(());
    }
}

fn connection(conn: TcpStream, jobs: &SyncSender<Job>, default: Duration) -> Result<(), HttpError> {
    conn.set_nodelay(true)?;
    // An idle keep-alive connection is dropped after a minute.
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut out = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        match http::read_request(&mut r) {
            Ok(Request::Health) => out.write_all(http::OK_RESPONSE)?,
            Ok(Request::Burn(us)) => {
                let amount = us.map(Duration::from_micros).unwrap_or(default);
                let (done_tx, done_rx) = sync_channel(1);
                if jobs.send((amount, done_tx)).is_err() || done_rx.recv().is_err() {
                    return Ok(());
                }
                out.write_all(http::OK_RESPONSE)?;
            }
            Err(HttpError::Closed) => return Ok(()),
            Err(e) => {
                let _ = out.write_all(http::BAD_RESPONSE);
                return Err(e);
            }
        }
    }
}
