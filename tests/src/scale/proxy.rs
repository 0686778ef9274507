//! A loopback TCP relay in front of the apiserver that counts the bytes
//! each client receives and sends: one relay per measured client (an agent,
//! the central watcher), so bytes are counted at the client side of the
//! wire. TLS passes through untouched, so the counts are TLS bytes (records
//! and handshakes included), what the network would carry.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Bytes through a relay so far, and its open connections.
#[derive(Debug, Default)]
pub struct Counters {
    /// apiserver → client.
    pub received: AtomicU64,
    /// client → apiserver.
    pub sent: AtomicU64,
    pub connections: AtomicU64,
    pub open: AtomicU64,
}

impl Counters {
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }
}

/// A running relay; dropping it stops accepting (open connections end
/// when either side closes).
pub struct Relay {
    pub port: u16,
    pub counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    /// Listens on a free loopback port and relays every connection to
    /// `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        c.connections.fetch_add(1, Ordering::Relaxed);
                        c.open.fetch_add(1, Ordering::Relaxed);
                        relay(client, server, &c).await;
                        c.open.fetch_sub(1, Ordering::Relaxed);
                    }
                });
            }
        });
        Ok(Relay {
            port,
            counters,
            task,
        })
    }
}

async fn relay(client: TcpStream, server: TcpStream, c: &Counters) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            c.sent.fetch_add(n as u64, Ordering::Relaxed);
        }
        let _ = sw.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = sr.read(&mut buf).await {
            if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            c.received.fetch_add(n as u64, Ordering::Relaxed);
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_each_way_are_counted_and_relayed_unchanged() {
        // An upstream that answers every message with twice its bytes.
        let up = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_port = up.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = up.accept().await.unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        });
        let relay = Relay::start(up_port).await.unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 10];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hellohello");
        drop(c);
        // The counters move after the relay wrote; wait for the close.
        for _ in 0..100 {
            if relay.counters.open() == 0 && relay.counters.received() == 10 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(relay.counters.sent(), 5);
        assert_eq!(relay.counters.received(), 10);
        assert_eq!(relay.counters.connections.load(Ordering::Relaxed), 1);
        assert_eq!(relay.counters.open(), 0);
    }

    #[tokio::test]
    async fn an_unreachable_upstream_closes_the_client() {
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_port = dead.local_addr().unwrap().port();
        drop(dead);
        let relay = Relay::start(dead_port).await.unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), c.read(&mut buf))
            .await
            .expect("the relay closes the connection")
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert_eq!(relay.counters.connections.load(Ordering::Relaxed), 0);
    }
}
