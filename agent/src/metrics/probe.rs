//! The probe lane: when every HTTP slot of the metrics port is taken, a
//! few more connections are read with a fixed 1 KiB buffer and answered
//! only for `/healthz` and `/readyz` (everything else gets 503). The
//! kubelet's probes keep their answer however many clients hold the port,
//! and the lane's memory is fixed.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest request line the lane keeps (the rest of a longer one is read
/// and dropped).
const LINE_MAX: usize = 256;

const HEALTHY: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n";
const READY: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 6\r\nconnection: close\r\n\r\nready\n";
const NOT_READY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 10\r\nconnection: close\r\n\r\nnot ready\n";
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\nretry-after: 1\r\nconnection: close\r\n\r\ntoo many connections\n";

/// The answer to a request line (`GET /healthz HTTP/1.1`) on the lane.
pub fn probe_answer(request_line: &[u8], ready: bool) -> &'static [u8] {
    let mut parts = request_line.split(|b| *b == b' ');
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|t| t.split(|b| *b == b'?').next().unwrap_or(t));
    match (method, path) {
        (Some(b"GET" | b"HEAD"), Some(b"/healthz")) => HEALTHY,
        (Some(b"GET" | b"HEAD"), Some(b"/readyz")) if ready => READY,
        (Some(b"GET" | b"HEAD"), Some(b"/readyz")) => NOT_READY,
        _ => BUSY,
    }
}

/// Reads one request head (up to the blank line, within `timeout`) and
/// answers it. The whole head is read before the answer so that closing
/// the socket sends FIN, not RST (unread input makes the kernel reset,
/// which can lose the answer at the client).
pub async fn serve_probe(mut stream: TcpStream, ready: impl Fn() -> bool, timeout: Duration) {
    let mut line = [0u8; LINE_MAX];
    let mut line_len = 0usize;
    let mut line_done = false;
    let mut buf = [0u8; 1024];
    // Last bytes seen, to find "\r\n\r\n" across reads.
    let mut tail = [0u8; 4];
    let head = async {
        loop {
            let n = match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            for &b in &buf[..n] {
                if !line_done {
                    if b == b'\r' || b == b'\n' {
                        line_done = true;
                    } else if line_len < LINE_MAX {
                        line[line_len] = b;
                        line_len += 1;
                    }
                }
                tail = [tail[1], tail[2], tail[3], b];
                if &tail == b"\r\n\r\n" || tail[2..] == *b"\n\n" {
                    return true;
                }
            }
        }
    };
    if !matches!(tokio::time::timeout(timeout, head).await, Ok(true)) {
        return;
    }
    let answer = probe_answer(&line[..line_len], ready());
    let _ = tokio::time::timeout(timeout, async {
        let _ = stream.write_all(answer).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(probe_answer(b"GET /healthz HTTP/1.1", false), HEALTHY);
        assert_eq!(probe_answer(b"GET /healthz?x=1 HTTP/1.1", false), HEALTHY);
        assert_eq!(probe_answer(b"HEAD /healthz HTTP/1.1", false), HEALTHY);
        assert_eq!(probe_answer(b"GET /readyz HTTP/1.1", true), READY);
        assert_eq!(probe_answer(b"GET /readyz HTTP/1.1", false), NOT_READY);
        assert_eq!(probe_answer(b"GET /metrics HTTP/1.1", true), BUSY);
        assert_eq!(probe_answer(b"POST /healthz HTTP/1.1", true), BUSY);
        assert_eq!(probe_answer(b"", true), BUSY);
        assert_eq!(probe_answer(b"GET", true), BUSY);
    }

    #[test]
    fn content_lengths_match_bodies() {
        for r in [HEALTHY, READY, NOT_READY, BUSY] {
            let text = std::str::from_utf8(r).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(len, body.len(), "{head}");
        }
    }
}
