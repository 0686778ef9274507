//! A bare hyper 1 HTTP/1 server: `/metrics`, `/healthz`, `/readyz`.
//!
//! Anyone who can reach the pod IP can open connections, and the agent has
//! a 64 MiB memory limit, so what clients can hold is bounded: at most
//! [`ConnLimits::max_connections`] served at once (one request each, 8 KiB
//! read buffer, a deadline for the request head and for the whole
//! exchange), [`ConnLimits::probe_slots`] more that may only ask
//! `/healthz` or `/readyz` (so probes pass while the port is saturated),
//! and every further connection closed at once.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::negotiate::wants_openmetrics;
use crate::metrics::probe::serve_probe;
use crate::metrics::registry::Metrics;

/// Default `--metrics-addr`, as in deploy/base. 9464 is also the
/// OpenTelemetry SDK exporter's default, but the agent runs in its own pod
/// network namespace (no hostNetwork), so nothing else binds it there; see
/// docs/operations.md, "Metrics".
pub const DEFAULT_ADDR: &str = "0.0.0.0:9464";

const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What clients of the metrics port may hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections served by the HTTP server at once. Prometheus (one or
    /// two replicas) and the kubelet need a handful.
    pub max_connections: usize,
    /// Connections beyond that which may only ask `/healthz` / `/readyz`.
    pub probe_slots: usize,
    /// Time a client has to send its request head.
    pub header_read_timeout: Duration,
    /// The same on the probe lane: the kubelet sends its probe at once and
    /// gives up after 1 s (`timeoutSeconds`), so a slot held longer is held
    /// by someone else.
    pub probe_read_timeout: Duration,
    /// Longest a connection may live (head, answer, and a slow reader).
    pub connection_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 32,
            probe_slots: 8,
            header_read_timeout: Duration::from_secs(3),
            probe_read_timeout: Duration::from_secs(1),
            connection_timeout: Duration::from_secs(15),
        }
    }
}

/// Smallest read buffer hyper accepts; request heads of scrapers and
/// probes are a few hundred bytes.
const READ_BUF_MAX: usize = 8192;

/// Consecutive failed ticks after which `/readyz` answers 503 by default.
pub const DEFAULT_UNREADY_AFTER: u32 = 3;

/// Shared readiness: ready once the pod watch has synced and the first
/// cgroup scan is done, and until `unready_after` ticks in a row fail (a
/// stuck or unreadable cgroup tree must not look healthy). Set by the run
/// loop, read by `/readyz`.
#[derive(Debug)]
pub struct Readiness {
    pods_synced: AtomicBool,
    first_scan_done: AtomicBool,
    failed_ticks: AtomicU32,
    unready_after: u32,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::new(DEFAULT_UNREADY_AFTER)
    }
}

impl Readiness {
    /// `unready_after` is at least 1.
    pub fn new(unready_after: u32) -> Self {
        Readiness {
            pods_synced: AtomicBool::new(false),
            first_scan_done: AtomicBool::new(false),
            failed_ticks: AtomicU32::new(0),
            unready_after: unready_after.max(1),
        }
    }

    pub fn set_pods_synced(&self) {
        self.pods_synced.store(true, Ordering::Release);
    }

    pub fn set_first_scan_done(&self) {
        self.first_scan_done.store(true, Ordering::Release);
    }

    /// Records one tick's outcome: a success resets the failure streak.
    pub fn tick_done(&self, ok: bool) {
        if ok {
            self.failed_ticks.store(0, Ordering::Release);
        } else {
            self.failed_ticks.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub fn failed_ticks(&self) -> u32 {
        self.failed_ticks.load(Ordering::Acquire)
    }

    pub fn is_ready(&self) -> bool {
        self.pods_synced.load(Ordering::Acquire)
            && self.first_scan_done.load(Ordering::Acquire)
            && self.failed_ticks() < self.unready_after
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Routes one request; pure apart from reading the shared state.
pub fn respond<B>(
    req: &Request<B>,
    metrics: &Metrics,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut()
            .insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match req.uri().path() {
        "/metrics" => {
            let accept: Vec<&str> = req
                .headers()
                .get_all(ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            let openmetrics = wants_openmetrics(&accept);
            let (body, ct) = if openmetrics {
                (metrics.encode_openmetrics(), OPENMETRICS_CONTENT_TYPE)
            } else {
                (metrics.encode_prometheus(), PROMETHEUS_CONTENT_TYPE)
            };
            let mut r = text(StatusCode::OK, body);
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if readiness.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" if readiness.failed_ticks() >= readiness.unready_after => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: the last {} ticks failed to read the cgroup tree\n",
                readiness.failed_ticks()
            ),
        ),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for pod watch sync and first cgroup scan\n",
        ),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// Binds `addr` (port 0 picks a free port; see `local_addr()`).
pub async fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Binds and serves until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    serve_listener(bind(addr).await?, metrics, readiness, shutdown).await
}

/// Serves on a bound listener until `shutdown` resolves, with the default
/// [`ConnLimits`]; connections in flight finish on their own tasks.
pub async fn serve_listener(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    serve_listener_with(
        listener,
        metrics,
        readiness,
        ConnLimits::default(),
        shutdown,
    )
    .await
}

/// As [`serve_listener`], with explicit limits.
pub async fn serve_listener_with(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let http_slots = Arc::new(Semaphore::new(limits.max_connections));
    let probe_slots = Arc::new(Semaphore::new(limits.probe_slots));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Per-connection errors (EMFILE, ECONNABORTED) must not
                // stop the server.
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Ok(permit) = http_slots.clone().try_acquire_owned() {
            tokio::spawn(serve_http(
                stream,
                peer,
                metrics.clone(),
                readiness.clone(),
                limits,
                permit,
            ));
        } else if let Ok(permit) = probe_slots.clone().try_acquire_owned() {
            let readiness = readiness.clone();
            tokio::spawn(async move {
                serve_probe(stream, || readiness.is_ready(), limits.probe_read_timeout).await;
                drop(permit);
            });
        } else {
            // Closed at once: queueing would let clients grow memory again.
            drop(stream);
        }
    }
}

/// One connection, one request (no keep-alive: a held connection is a
/// slot taken), within the limits' deadlines.
async fn serve_http(
    stream: TcpStream,
    peer: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    limits: ConnLimits,
    _permit: OwnedSemaphorePermit,
) {
    let svc = service_fn(move |req: Request<Incoming>| {
        let r = respond(&req, &metrics, &readiness);
        async move { Ok::<_, Infallible>(r) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .keep_alive(false)
        .max_buf_size(READ_BUF_MAX)
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), svc);
    match tokio::time::timeout(limits.connection_timeout, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics: connection error"),
        Err(_) => tracing::debug!(%peer, "metrics: connection timed out"),
    }
}
