//! The API server's way into the node VMs' pod networks, as konnectivity is on
//! clusters whose control plane cannot route to pods: kube-apiserver's egress
//! selector sends "cluster" traffic (pod and service proxy) as HTTP CONNECT
//! over a Unix socket to this proxy, which picks the node whose pod CIDR holds
//! the target and tunnels through that VM's sshd (`ssh -W ip:port`). Nothing
//! leaves the machine: the tunnel ends inside the guest, on its bridge.
//!
//! Kubelet connections (logs, exec) are not routed: every guest's node IP is
//! the same user-mode address, so a CONNECT to it is answered 502.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::Context;

/// One route: a pod CIDR and the ssh arguments that reach its node.
#[derive(Clone, Debug)]
struct Route {
    net: u32,
    mask: u32,
    ssh: Vec<OsString>,
}

/// `a.b.c.d/n` → (network, mask).
pub fn parse_cidr(cidr: &str) -> Option<(u32, u32)> {
    let (ip, bits) = cidr.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let bits: u32 = bits.parse().ok().filter(|b| *b <= 32)?;
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    Some((u32::from(ip) & mask, mask))
}

/// The host part of a CONNECT target, if it is an IPv4 address.
pub fn connect_target(request_line: &str) -> Option<(Ipv4Addr, u16)> {
    let mut parts = request_line.split_whitespace();
    if parts.next()? != "CONNECT" {
        return None;
    }
    let (host, port) = parts.next()?.rsplit_once(':')?;
    Some((host.parse().ok()?, port.parse().ok()?))
}

#[derive(Clone)]
pub struct EgressProxy {
    socket: PathBuf,
    routes: Arc<Mutex<Vec<Route>>>,
}

impl EgressProxy {
    /// Listens on `socket` (a thread of its own; it lives as long as the
    /// process, like the shared cluster it serves).
    pub fn start(socket: &Path) -> anyhow::Result<EgressProxy> {
        let _ = std::fs::remove_file(socket);
        let listener =
            UnixListener::bind(socket).with_context(|| format!("binding {}", socket.display()))?;
        let proxy = EgressProxy {
            socket: socket.to_path_buf(),
            routes: Arc::new(Mutex::new(Vec::new())),
        };
        let routes = proxy.routes.clone();
        std::thread::Builder::new()
            .name("egress-proxy".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    let routes = routes.clone();
                    let _ = std::thread::Builder::new()
                        .name("egress-conn".into())
                        .spawn(move || {
                            let _ = serve(conn, &routes);
                        });
                }
            })?;
        Ok(proxy)
    }

    /// Routes `pod_cidr` through the VM that `ssh` reaches. A tunnel is a
    /// connection of its own: `-W` through the shared control master hung
    /// here, so any `ControlPath` option is dropped.
    pub fn add_route(&self, pod_cidr: &str, ssh: Vec<OsString>) -> anyhow::Result<()> {
        let mut own = Vec::with_capacity(ssh.len() + 2);
        let mut it = ssh.into_iter().peekable();
        while let Some(a) = it.next() {
            if a == "-o"
                && it
                    .peek()
                    .is_some_and(|v| v.to_string_lossy().starts_with("ControlPath="))
            {
                it.next();
                continue;
            }
            own.push(a);
        }
        own.extend(["-o".into(), "ControlPath=none".into()]);
        let ssh = own;
        let (net, mask) =
            parse_cidr(pod_cidr).with_context(|| format!("bad pod CIDR {pod_cidr}"))?;
        self.routes
            .lock()
            .map_err(|_| anyhow::anyhow!("egress routes lock poisoned"))?
            .push(Route { net, mask, ssh });
        Ok(())
    }

    /// kube-apiserver's `--egress-selector-config-file` content.
    pub fn apiserver_config(&self) -> String {
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
  - name: cluster
    connection:
      proxyProtocol: HTTPConnect
      transport:
        uds:
          udsName: {}
",
            self.socket.display()
        )
    }
}

fn serve(mut conn: UnixStream, routes: &Mutex<Vec<Route>>) -> anyhow::Result<()> {
    // The request head: a CONNECT line and headers, at most 8 KiB.
    let mut reader = BufReader::new((&conn).take(8192));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let route = connect_target(&line).and_then(|(ip, port)| {
        let ip = u32::from(ip);
        routes
            .lock()
            .ok()?
            .iter()
            .find(|r| ip & r.mask == r.net)
            .map(|r| (r.ssh.clone(), Ipv4Addr::from(ip), port))
    });
    let Some((ssh, ip, port)) = route else {
        (&conn).write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")?;
        return Ok(());
    };
    let mut child = Command::new("ssh")
        .args(&ssh)
        .args(["-o", "ConnectTimeout=20", "-W", &format!("{ip}:{port}")])
        .arg("root@127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    (&conn).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    let (mut to_guest, mut from_guest) = (
        child.stdin.take().context("ssh stdin")?,
        child.stdout.take().context("ssh stdout")?,
    );
    // Bytes the reader buffered past the head belong to the tunnel.
    let early = reader.buffer().to_vec();
    drop(reader);
    to_guest.write_all(&early)?;
    let mut up = conn.try_clone()?;
    let uploader = std::thread::spawn(move || {
        let _ = pump(&mut up, &mut to_guest);
    });
    let _ = pump(&mut from_guest, &mut conn);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    let _ = child.kill();
    let _ = child.wait();
    let _ = uploader.join();
    Ok(())
}

/// Copies until EOF with read/write. Not `std::io::copy`: between a socket
/// and a pipe it uses splice(2), which holds the pipe's lock while it waits
/// on the socket — ssh, reading that pipe, then blocks (state D) until the
/// next byte arrives: a request/response tunnel deadlocks.
fn pump(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<()> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
        to.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_and_connect_lines_parse() {
        assert_eq!(
            parse_cidr("10.244.1.0/24"),
            Some((u32::from(Ipv4Addr::new(10, 244, 1, 0)), 0xffff_ff00))
        );
        assert_eq!(parse_cidr("10.244.1.0/33"), None);
        assert_eq!(
            connect_target("CONNECT 10.244.2.7:9464 HTTP/1.1\r\n"),
            Some((Ipv4Addr::new(10, 244, 2, 7), 9464))
        );
        assert_eq!(connect_target("GET / HTTP/1.1"), None);
        assert_eq!(connect_target("CONNECT node-a:10250 HTTP/1.1"), None);
    }
}
