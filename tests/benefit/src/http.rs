//! The little HTTP/1.1 the service and the load generator speak: `GET
//! /burn?us=N` with keep-alive, a fixed `ok` answer. Framing only.

use std::io::{self, BufRead, Read, Write};

pub const OK_RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
pub const BAD_RESPONSE: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbad\n";
/// Longest request head accepted: bounded memory per connection.
pub const MAX_HEAD: usize = 8192;

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Burn this many µs of CPU (`None`: the server's default).
    Burn(Option<u64>),
    /// A health probe: answer without burning.
    Health,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("connection closed")]
    Closed,
    #[error("request head longer than {MAX_HEAD} bytes")]
    TooLong,
    #[error("bad request line {0:?}")]
    BadRequest(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Reads one request head; `Closed` when the peer closed between requests.
pub fn read_request(r: &mut impl BufRead) -> Result<Request, HttpError> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let n = r
            .by_ref()
            .take((MAX_HEAD + 1 - before) as u64)
            .read_until(b'\n', &mut head)?;
        if n == 0 {
            return Err(if head.is_empty() {
                HttpError::Closed
            } else {
                HttpError::Io(io::ErrorKind::UnexpectedEof.into())
            });
        }
        if head.len() > MAX_HEAD {
            return Err(HttpError::TooLong);
        }
        if head.ends_with(b"\r\n\r\n") || head.ends_with(b"\n\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or_default();
    parse_request_line(line)
}

/// `GET /burn?us=1000 HTTP/1.1` → `Burn(Some(1000))`.
pub fn parse_request_line(line: &str) -> Result<Request, HttpError> {
    let bad = || HttpError::BadRequest(line.chars().take(100).collect());
    let mut parts = line.split_whitespace();
    let (Some("GET"), Some(target), Some(v)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    if !v.starts_with("HTTP/1.") {
        return Err(bad());
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/healthz" => Ok(Request::Health),
        "/burn" | "/" => {
            let mut us = None;
            for kv in query.split('&').filter(|s| !s.is_empty()) {
                if let Some(v) = kv.strip_prefix("us=") {
                    let n: u64 = v.parse().map_err(|_| bad())?;
                    // At most 10 s of CPU per request.
                    if n > 10_000_000 {
                        return Err(bad());
                    }
                    us = Some(n);
                }
            }
            Ok(Request::Burn(us))
        }
        _ => Err(bad()),
    }
}

/// Writes `GET /burn?us=N` (keep-alive).
pub fn write_request(w: &mut impl Write, host: &str, burn_us: u64) -> io::Result<()> {
    write!(w, "GET /burn?us={burn_us} HTTP/1.1\r\nHost: {host}\r\n\r\n")?;
    w.flush()
}

/// Reads one response; true if it was a 200. Bodies are `Content-Length` only.
pub fn read_response(r: &mut impl BufRead) -> Result<bool, HttpError> {
    let mut status = String::new();
    let mut len = 0usize;
    let mut first = true;
    let mut total = 0usize;
    loop {
        let mut line = String::new();
        let n = Read::take(&mut *r, MAX_HEAD as u64).read_line(&mut line)?;
        if n == 0 {
            return Err(HttpError::Closed);
        }
        total += n;
        if total > MAX_HEAD {
            return Err(HttpError::TooLong);
        }
        let l = line.trim_end();
        if first {
            status = l.to_string();
            first = false;
            continue;
        }
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v
                .trim()
                .parse()
                .map_err(|_| HttpError::BadRequest(l.into()))?;
            if len > MAX_HEAD {
                return Err(HttpError::TooLong);
            }
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(status.split_whitespace().nth(1) == Some("200"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse_request_line("GET /burn?us=1500 HTTP/1.1").unwrap(),
            Request::Burn(Some(1500))
        );
        assert_eq!(
            parse_request_line("GET / HTTP/1.0").unwrap(),
            Request::Burn(None)
        );
        assert_eq!(
            parse_request_line("GET /healthz HTTP/1.1").unwrap(),
            Request::Health
        );
        for bad in [
            "POST / HTTP/1.1",
            "GET /x HTTP/1.1",
            "GET /burn?us=abc HTTP/1.1",
            "GET /burn?us=99999999 HTTP/1.1",
            "GET /",
            "",
        ] {
            assert!(parse_request_line(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_request_and_response_round_trip() {
        let mut buf = Vec::new();
        write_request(&mut buf, "svc", 10_000).unwrap();
        buf.extend_from_slice(b"GET /healthz HTTP/1.1\r\n\r\n");
        let mut r = io::Cursor::new(buf);
        assert_eq!(read_request(&mut r).unwrap(), Request::Burn(Some(10_000)));
        assert_eq!(read_request(&mut r).unwrap(), Request::Health);
        assert!(matches!(read_request(&mut r), Err(HttpError::Closed)));

        let mut two = OK_RESPONSE.to_vec();
        two.extend_from_slice(BAD_RESPONSE);
        let mut r = io::Cursor::new(two);
        assert!(read_response(&mut r).unwrap());
        assert!(!read_response(&mut r).unwrap());
        assert!(matches!(read_response(&mut r), Err(HttpError::Closed)));
    }

    #[test]
    fn an_endless_head_is_refused_not_buffered() {
        let mut r = io::Cursor::new(vec![b'a'; 100_000]);
        assert!(matches!(read_request(&mut r), Err(HttpError::TooLong)));
    }
}
