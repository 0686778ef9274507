//! A real control plane on loopback: etcd and kube-apiserver built from Go
//! modules by `tests/control-plane/build.sh`.
//!
//! - No controller-manager, scheduler or kubelet. Tests bind pods themselves
//!   (`spec.nodeName`); the apiserver still runs all its validation and admission.
//! - The `ServiceAccount` admission plugin stays on (pods get a service account
//!   and a projected token volume, as on a real cluster, which TokenRequest
//!   bound to a pod relies on). Without the controller-manager nobody creates
//!   the `default` ServiceAccount, so [`ControlPlane::namespace`] creates it.
//! - Namespaces are never deleted: without the namespace controller they would
//!   stay `Terminating` forever; the whole etcd dies with the run anyway.
//! - Processes are spawned through [`crate::process::spawn_guarded`]: they die
//!   with the test binary however it ends.
//!
//! Environment: `HEADROOM_CACHE_DIR` (binaries in `$HEADROOM_CACHE_DIR/bin`,
//! default `<repo>/.cache`), `HEADROOM_APISERVER_VERSION` (default apiserver
//! version, `v1.37.2`), `HEADROOM_CP_READY_TIMEOUT_SECS` (default 180),
//! `HEADROOM_KEEP_CP_DIR=1` (keep temp dirs with logs and etcd data).

use std::collections::HashMap;
use std::fs::File;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use secrecy::SecretString;

use crate::certs::Pki;
use crate::process::{kill_at_exit, spawn_guarded};

pub const ETCD_VERSION: &str = "v3.6.16";
pub const DEFAULT_APISERVER_VERSION: &str = "v1.37.2";

/// What a control plane is started with.
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// `--feature-gates` entries, e.g. `("InPlacePodLevelResourcesVerticalScaling", false)`.
    pub feature_gates: Vec<(String, bool)>,
    /// Which cached kube-apiserver binary to run, e.g. `v1.37.2`.
    pub apiserver_version: String,
    /// Appended to the kube-apiserver command line (later flags win).
    pub extra_args: Vec<String>,
    /// A full cluster for real kubelets: the Node authorizer and
    /// NodeRestriction admission (kubelets authenticate as `system:node:<n>`),
    /// plus kube-controller-manager and kube-scheduler, so ServiceAccounts,
    /// the root-CA ConfigMap, DaemonSets and scheduling work as on a real cluster.
    pub full_cluster: bool,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            feature_gates: Vec::new(),
            apiserver_version: std::env::var("HEADROOM_APISERVER_VERSION")
                .unwrap_or_else(|_| DEFAULT_APISERVER_VERSION.to_string()),
            extra_args: Vec::new(),
            full_cluster: false,
        }
    }
}

impl ControlPlaneOptions {
    pub fn with_gate(mut self, name: &str, enabled: bool) -> Self {
        self.feature_gates.push((name.to_string(), enabled));
        self
    }
}

/// A running etcd + kube-apiserver. Dropping it kills both and removes its
/// temp dir; shared instances live until the test binary exits.
pub struct ControlPlane {
    tmp: Option<tempfile::TempDir>,
    dir: PathBuf,
    base_url: String,
    kubeconfig: PathBuf,
    config: Config,
    ca_pem: String,
    ca_der: Vec<u8>,
    children: Mutex<Vec<Child>>,
    /// Every child's pid, apiserver-side first (the order they are killed in).
    pids: Vec<u32>,
    pki: Pki,
    etcd_pid: u32,
    /// Changes when [`ControlPlane::start_apiserver`] starts a new one.
    apiserver_pid: AtomicU32,
    etcd_log: PathBuf,
    apiserver_log: PathBuf,
    /// etcd's loopback client URL (gRPC and its HTTP/JSON gateway).
    etcd_client_url: String,
    /// How the apiserver was started, to start it again the same way.
    api_bin: PathBuf,
    api_args: Vec<String>,
    /// How many times the apiserver was started (names its log files).
    api_starts: AtomicU32,
    ready_after: Duration,
    apiserver_version: String,
}

/// Kills children on early return from `start`.
struct Guard(Vec<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Directory holding the cached binaries.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("HEADROOM_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache"))
        .join("bin")
}

fn binary(name: &str, version: &str) -> anyhow::Result<PathBuf> {
    let path = bin_dir().join(format!("{name}-{version}"));
    if !path.is_file() {
        bail!(
            "{} not found: run tests/control-plane/build.sh{}",
            path.display(),
            if version == DEFAULT_APISERVER_VERSION || name == "etcd" {
                String::new()
            } else {
                format!(" with HEADROOM_EXTRA_APISERVERS={version}")
            }
        );
    }
    Ok(path)
}

const DIR_PREFIX: &str = "headroom-cp-";
/// Pid of the test process that owns a temp dir. Dirs without it (kept on
/// purpose) are never swept.
const OWNER_FILE: &str = "owner.pid";

/// Removes temp dirs left by test processes that were killed (SIGKILL and
/// SIGTERM skip every cleanup hook; the kernel still kills the children).
fn sweep_stale_dirs() {
    if std::env::var_os("HEADROOM_KEEP_CP_DIR").is_some() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let owner = std::fs::read_to_string(entry.path().join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(pid) = owner
            && crate::process::process_gone(pid, "")
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Distinct free loopback ports: all listeners are held until every port is chosen.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Last `n` lines of a log file, for error messages.
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

fn ready_timeout() -> Duration {
    let secs = std::env::var("HEADROOM_CP_READY_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    Duration::from_secs(secs)
}

fn spawn_logged(bin: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    spawn_guarded(cmd).with_context(|| format!("spawning {}", bin.display()))
}

/// Error for a process that exited before the control plane was ready.
fn exited_early(name: &str, status: std::process::ExitStatus, log: &Path) -> anyhow::Error {
    anyhow!(
        "{name} exited early ({status}); log {}:\n{}",
        log.display(),
        log_tail(log, 40)
    )
}

fn kubeconfig_yaml(base_url: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    crate::certs::Kubeconfig {
        server: base_url,
        ca: &ca.display().to_string(),
        user: crate::certs::ADMIN_CN,
        auth: crate::certs::KubeconfigAuth::Cert {
            cert: &cert.display().to_string(),
            key: &key.display().to_string(),
        },
        namespace: Some("default"),
    }
    .yaml()
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits for `/readyz`. Retries a few
    /// times when a freshly chosen port was taken in the meantime.
    pub async fn start(opts: ControlPlaneOptions) -> anyhow::Result<ControlPlane> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(&opts).await {
                Ok(cp) => return Ok(cp),
                Err(e) if format!("{e:#}").contains("address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("control plane did not start")))
    }

    async fn start_once(opts: &ControlPlaneOptions) -> anyhow::Result<ControlPlane> {
        let started = Instant::now();
        let etcd_bin = binary("etcd", ETCD_VERSION)?;
        let api_bin = binary("kube-apiserver", &opts.apiserver_version)?;
        sweep_stale_dirs();
        let tmp = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .context("creating control-plane temp dir")?;
        let dir = tmp.path().to_path_buf();
        std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string())?;
        let pki = Pki::generate()?;
        let files = pki.write_to(&dir)?;
        let ports = free_ports(3)?;
        let (etcd_port, peer_port, api_port) = (ports[0], ports[1], ports[2]);
        let etcd_log = dir.join("etcd.log");
        let apiserver_log = dir.join("kube-apiserver.log");
        let mut guard = Guard(Vec::new());
        // Keep the dir (logs) when start fails.
        let fail = |e: anyhow::Error, tmp: tempfile::TempDir| -> anyhow::Error {
            let kept = tmp.keep();
            let _ = std::fs::remove_file(kept.join(OWNER_FILE));
            e.context(format!(
                "control plane failed to start; logs kept in {}",
                kept.display()
            ))
        };

        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args: Vec<String> = vec![
            "--name=default".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // Test data only: skip fsync for speed.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ];
        let etcd = match spawn_logged(&etcd_bin, &etcd_args, &etcd_log) {
            Ok(c) => c,
            Err(e) => return Err(fail(e, tmp)),
        };
        let etcd_pid = etcd.id();
        guard.0.push(etcd);

        // Wait until etcd accepts connections, so a slow etcd start is
        // reported as such rather than as an apiserver timeout.
        let deadline = Instant::now() + ready_timeout();
        loop {
            if let Some(status) = guard.0[0].try_wait()? {
                return Err(fail(exited_early("etcd", status, &etcd_log), tmp));
            }
            if TcpStream::connect(("127.0.0.1", etcd_port)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let e = anyhow!(
                    "etcd not listening on {client_url} after {:?}; log {}:\n{}",
                    ready_timeout(),
                    etcd_log.display(),
                    log_tail(&etcd_log, 40)
                );
                return Err(fail(e, tmp));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let mut api_args: Vec<String> = vec![
            format!("--etcd-servers={client_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", files.serving_cert.display()),
            format!("--tls-private-key-file={}", files.serving_key.display()),
            format!("--client-ca-file={}", files.ca.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", files.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                files.sa_key.display()
            ),
            if opts.full_cluster {
                "--authorization-mode=Node,RBAC".into()
            } else {
                "--authorization-mode=RBAC".into()
            },
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--profiling=false".into(),
            // The default lease reconciler refuses a loopback advertise address,
            // and nothing here routes Service traffic anyway.
            "--endpoint-reconciler-type=none".into(),
        ];
        if opts.full_cluster {
            api_args.push("--enable-admission-plugins=NodeRestriction".into());
        }
        if !opts.feature_gates.is_empty() {
            let gates: Vec<String> = opts
                .feature_gates
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            api_args.push(format!("--feature-gates={}", gates.join(",")));
        }
        api_args.extend(opts.extra_args.iter().cloned());
        let api = match spawn_logged(&api_bin, &api_args, &apiserver_log) {
            Ok(c) => c,
            Err(e) => return Err(fail(e, tmp)),
        };
        let apiserver_pid = api.id();
        guard.0.push(api);

        let base_url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&base_url, &files.ca, &files.admin_cert, &files.admin_key),
        )?;
        let config = match Self::config_from_kubeconfig(&kubeconfig).await {
            Ok(c) => c,
            Err(e) => return Err(fail(e, tmp)),
        };
        let client = Client::try_from(config.clone())?;

        loop {
            if let Some(status) = guard.0[1].try_wait()? {
                return Err(fail(
                    exited_early("kube-apiserver", status, &apiserver_log),
                    tmp,
                ));
            }
            if let Some(status) = guard.0[0].try_wait()? {
                return Err(fail(exited_early("etcd", status, &etcd_log), tmp));
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            let last_err = match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => break,
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                let e = anyhow!(
                    "kube-apiserver not ready after {:?} (last /readyz: {last_err}); \
                     log {}:\n{}\netcd log: {}",
                    ready_timeout(),
                    apiserver_log.display(),
                    log_tail(&apiserver_log, 40),
                    etcd_log.display()
                );
                return Err(fail(e, tmp));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let ready_after = started.elapsed();
        if opts.full_cluster {
            match start_controllers(&dir, &files, &kubeconfig, &opts.apiserver_version) {
                Ok(children) => guard.0.extend(children),
                Err(e) => return Err(fail(e, tmp)),
            }
            // The controllers are up once the ServiceAccount controller has made
            // `default/default`; a controller that exits (a bad flag) fails here,
            // not later as a DaemonSet that never gets pods.
            let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
            let names = ["kube-controller-manager", "kube-scheduler"];
            loop {
                for (i, name) in names.iter().enumerate() {
                    if let Some(status) = guard.0[2 + i].try_wait()? {
                        let log = dir.join(format!("{name}.log"));
                        return Err(fail(exited_early(name, status, &log), tmp));
                    }
                }
                if sas.get_opt("default").await.ok().flatten().is_some() {
                    break;
                }
                if Instant::now() > deadline + Duration::from_secs(60) {
                    let log = dir.join("kube-controller-manager.log");
                    let e = anyhow!(
                        "kube-controller-manager made no default ServiceAccount; log {}:\n{}",
                        log.display(),
                        log_tail(&log, 40)
                    );
                    return Err(fail(e, tmp));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let mut pids: Vec<u32> = guard.0.iter().map(Child::id).collect();
        pids.reverse();

        Ok(ControlPlane {
            pids,
            tmp: Some(tmp),
            dir,
            base_url,
            kubeconfig,
            config,
            ca_pem: pki.ca_pem.clone(),
            ca_der: pki.ca_der.clone(),
            pki,
            children: Mutex::new(std::mem::take(&mut guard.0)),
            etcd_pid,
            apiserver_pid: AtomicU32::new(apiserver_pid),
            etcd_log,
            apiserver_log,
            etcd_client_url: client_url,
            api_bin,
            api_args,
            api_starts: AtomicU32::new(1),
            ready_after,
            apiserver_version: opts.apiserver_version.clone(),
        })
    }

    async fn config_from_kubeconfig(path: &Path) -> anyhow::Result<Config> {
        let kc = Kubeconfig::read_from(path)?;
        Ok(Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
    }

    /// The control plane shared by every test of this test binary (default
    /// options), started on first use. Blocks the calling thread while it starts.
    pub fn shared() -> &'static ControlPlane {
        Self::shared_with("default", ControlPlaneOptions::default())
    }

    /// A shared control plane per `key` (first caller's `opts` win), for suites
    /// that need other feature gates. Start-up runs on its own thread and
    /// runtime: each `#[tokio::test]` has a runtime of its own that dies with
    /// the test, so nothing of a shared instance may live on one.
    /// Panics (failing the calling test) if the control plane cannot start.
    pub fn shared_with(key: &str, opts: ControlPlaneOptions) -> &'static ControlPlane {
        type Slot = OnceLock<Result<ControlPlane, String>>;
        static SLOTS: OnceLock<Mutex<HashMap<String, &'static Slot>>> = OnceLock::new();
        let slot: &'static Slot = {
            let mut slots = SLOTS
                .get_or_init(|| Mutex::new(HashMap::new()))
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            slots
                .entry(key.to_string())
                .or_insert_with(|| Box::leak(Box::new(OnceLock::new())))
        };
        let res = slot.get_or_init(|| {
            let started = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(ControlPlane::start(opts))
                    .map_err(|e| format!("{e:#}"))
            })
            .join()
            .unwrap_or_else(|_| Err("control plane start-up thread panicked".to_string()));
            started.map(|mut cp| {
                cp.leak_to_exit();
                cp
            })
        });
        match res {
            Ok(cp) => cp,
            Err(e) => panic!("shared control plane {key:?} failed to start: {e}"),
        }
    }

    /// Hands the processes and temp dir to the at-exit cleanup (for an
    /// instance that lives in a static and is never dropped).
    fn leak_to_exit(&mut self) {
        let keep = std::env::var_os("HEADROOM_KEEP_CP_DIR").is_some();
        let dir = self.tmp.take().map(|t| t.keep());
        if keep {
            let _ = std::fs::remove_file(self.dir.join(OWNER_FILE));
        }
        kill_at_exit(self.pids.clone(), if keep { None } else { dir });
    }

    /// A client certificate (PEM cert, PEM key) signed by this cluster's CA,
    /// for `cn` in the groups `orgs`.
    pub fn client_cert(&self, cn: &str, orgs: &[&str]) -> anyhow::Result<(String, String)> {
        self.pki.sign_client(cn, orgs)
    }

    /// Every process of this control plane (controllers, apiserver, etcd).
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// The apiserver's loopback port.
    pub fn port(&self) -> u16 {
        self.base_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("base_url ends in a port")
    }

    /// A fresh admin client (cluster-admin via `system:masters`). Build one
    /// per test: a client is bound to the tokio runtime it was created on.
    pub async fn client(&self) -> Client {
        Client::try_from(self.config.clone()).expect("admin client from a known-good config")
    }

    /// A client authenticating with a bearer token (e.g. a ServiceAccount token).
    pub fn client_for_token(&self, token: &str) -> anyhow::Result<Client> {
        let mut config = Config::new(self.base_url.parse()?);
        config.root_cert = Some(vec![self.ca_der.clone()]);
        config.auth_info.token = Some(SecretString::from(token.to_string()));
        Ok(Client::try_from(config)?)
    }

    /// A new namespace named `<prefix>-<n>` with its `default` ServiceAccount.
    pub async fn namespace(&self, prefix: &str) -> String {
        match self.try_namespace(prefix).await {
            Ok(ns) => ns,
            Err(e) => panic!("creating a namespace: {e:#}"),
        }
    }

    pub async fn try_namespace(&self, prefix: &str) -> anyhow::Result<String> {
        static N: AtomicU64 = AtomicU64::new(0);
        let clean: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let clean = clean.trim_matches('-');
        let name = format!(
            "{}-{}",
            if clean.is_empty() { "t" } else { clean },
            N.fetch_add(1, Ordering::Relaxed)
        );
        let client = self.client().await;
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "default"}
        }))?;
        // With kube-controller-manager running (a full cluster) its
        // ServiceAccount controller may create it first: that is fine.
        match Api::<ServiceAccount>::namespaced(client, &name)
            .create(&PostParams::default(), &sa)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("creating ServiceAccount default in {name}")));
            }
        }
        Ok(name)
    }

    /// Kubeconfig with the admin identity (file paths to the certs), for
    /// processes such as the agent.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The CA that signed the serving and client certificates.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Temp dir holding certs, kubeconfig, logs and etcd data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn etcd_pid(&self) -> u32 {
        self.etcd_pid
    }

    /// Pid of the running kube-apiserver (the latest one after a restart).
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver_pid.load(Ordering::SeqCst)
    }

    /// etcd's loopback client URL, e.g. `http://127.0.0.1:2379`.
    pub fn etcd_client_url(&self) -> &str {
        &self.etcd_client_url
    }

    /// SIGKILLs the kube-apiserver and reaps it; etcd and its data stay.
    /// Clients (agents, simulated kubelets) see connection errors until
    /// [`ControlPlane::start_apiserver`]. For a private instance only: a
    /// shared one serves other tests (refused with an error).
    pub fn kill_apiserver(&self) -> anyhow::Result<()> {
        if self.tmp.is_none() {
            bail!("kill_apiserver on a shared control plane would break other tests");
        }
        let pid = self.apiserver_pid();
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        let Some(i) = children.iter().position(|c| c.id() == pid) else {
            bail!("kube-apiserver (pid {pid}) is not running");
        };
        let mut c = children.remove(i);
        let killed = c.kill();
        c.wait().context("reaping kube-apiserver")?;
        killed.context("SIGKILL kube-apiserver")
    }

    /// Starts kube-apiserver again with the command line of the first start
    /// (same port, certificates and etcd), after [`ControlPlane::kill_apiserver`],
    /// and waits for `/readyz`. Its log goes to `kube-apiserver.<n>.log`
    /// beside the first one. Returns the time until ready.
    pub async fn start_apiserver(&self) -> anyhow::Result<Duration> {
        if self.tmp.is_none() {
            bail!("start_apiserver on a shared control plane");
        }
        let started = Instant::now();
        let n = self.api_starts.fetch_add(1, Ordering::SeqCst) + 1;
        let log = self.dir.join(format!("kube-apiserver.{n}.log"));
        let mut child = spawn_logged(&self.api_bin, &self.api_args, &log)?;
        let pid = child.id();
        let client = Client::try_from(self.config.clone())?;
        let deadline = Instant::now() + ready_timeout();
        let res: anyhow::Result<()> = loop {
            if let Some(status) = child.try_wait()? {
                break Err(exited_early("kube-apiserver", status, &log));
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            let last = match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => break Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                break Err(anyhow!(
                    "restarted kube-apiserver not ready after {:?} (last /readyz: {last}); log {}:\n{}",
                    ready_timeout(),
                    log.display(),
                    log_tail(&log, 40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if let Err(e) = res {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        self.apiserver_pid.store(pid, Ordering::SeqCst);
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(child);
        Ok(started.elapsed())
    }

    /// Compacts etcd's history up to its current revision and returns that
    /// revision: every older revision is gone, so a watch resuming from an
    /// older `resourceVersion` is answered `410 Gone` ("too old resource
    /// version") by a watch served from etcd. Done through etcd's HTTP/JSON
    /// gateway (`/v3/kv/range` for the revision, `/v3/kv/compaction` with
    /// `physical: true`, which returns once the compaction is done), so no
    /// etcd client crate is needed. Chosen over a short
    /// `--etcd-compaction-interval` on the apiserver, which compacts at
    /// moments of its own and only up to the revision of its previous
    /// cycle: a test could not place the compaction where it wants it.
    pub async fn compact_etcd(&self) -> anyhow::Result<i64> {
        let port: u16 = self
            .etcd_client_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("etcd client URL has no port")?;
        // Any key: the response header carries the store's current revision.
        let range = http_post_json(port, "/v3/kv/range", r#"{"key":"AA==","limit":1}"#).await?;
        let rev: i64 = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .or_else(|| range["header"]["revision"].as_i64())
            .with_context(|| format!("no revision in etcd range answer: {range}"))?;
        let body = format!(r#"{{"revision":"{rev}","physical":true}}"#);
        let out = http_post_json(port, "/v3/kv/compaction", &body).await?;
        if out.get("error").is_some() || out.get("code").is_some() {
            bail!("etcd compaction at {rev} failed: {out}");
        }
        Ok(rev)
    }

    /// (etcd log, kube-apiserver log)
    pub fn log_paths(&self) -> (&Path, &Path) {
        (&self.etcd_log, &self.apiserver_log)
    }

    /// Time from `start` until `/readyz` answered `ok`.
    pub fn ready_after(&self) -> Duration {
        self.ready_after
    }

    pub fn apiserver_version(&self) -> &str {
        &self.apiserver_version
    }

    /// Creates (or updates) a Linux Node with the given allocatable CPU and
    /// memory and `status.declaredFeatures`, and waits until resize admission
    /// sees it. Idempotent.
    ///
    /// Needed because kube-apiserver 1.37's `PodResizeValidator` admission
    /// plugin refuses (403) any resize of a pod whose `spec.nodeName` is not a
    /// Node in its informer cache (`node "x" not found`), on a non-Linux node,
    /// or whose new requests exceed the node's allocatable; and its
    /// `NodeDeclaredFeatures` plugin refuses a pod-level resize unless the
    /// Node declares `InPlacePodLevelResourcesVerticalScaling`.
    pub async fn ensure_node(
        &self,
        name: &str,
        cpu: &str,
        memory: &str,
        declared_features: &[&str],
    ) -> anyhow::Result<()> {
        let client = self.client().await;
        let nodes = Api::<Node>::all(client);
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux"}}
        }))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(anyhow!(e).context(format!("creating Node {name}"))),
        }
        let res = serde_json::json!({"cpu": cpu, "memory": memory, "pods": "110"});
        let status = serde_json::json!({"status": {
            "capacity": res, "allocatable": res, "declaredFeatures": declared_features
        }});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .with_context(|| format!("setting status of Node {name}"))?;
        self.wait_node_admissible(name).await
    }

    /// Waits (bounded) until a resize of a pod bound to Node `name` is no
    /// longer refused with `node "<name>" not found`, i.e. the resize
    /// admission plugin's node cache has the Node. Probes with a dry-run
    /// resize of a throwaway pod.
    pub async fn wait_node_admissible(&self, name: &str) -> anyhow::Result<()> {
        let ns = self.try_namespace("node-probe").await?;
        let pods = Api::<Pod>::namespaced(self.client().await, &ns);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "probe"},
            "spec": {"nodeName": name, "containers": [{
                "name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "1m"}, "limits": {"cpu": "2m"}}
            }]}
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let patch = Patch::Strategic(serde_json::json!({"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"cpu": "3m"}}}
        ]}}));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match resize(&pods, "probe", &patch, true).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.message.contains("not found") => {
                    if Instant::now() > deadline {
                        bail!(
                            "Node {name} still unknown to resize admission: {}",
                            s.message
                        );
                    }
                }
                Err(e) => return Err(anyhow!(e).context("probe resize")),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// kube-controller-manager and kube-scheduler on loopback, as admin (the
/// test cluster has no separate controller identities to care about).
fn start_controllers(
    dir: &Path,
    files: &crate::certs::PkiFiles,
    kubeconfig: &Path,
    version: &str,
) -> anyhow::Result<Vec<Child>> {
    let kcm = binary("kube-controller-manager", version)?;
    let sched = binary("kube-scheduler", version)?;
    let ports = free_ports(2)?;
    let kc = kubeconfig.display().to_string();
    let kcm_args: Vec<String> = vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", ports[0]),
        format!("--cert-dir={}", dir.join("kcm-certs").display()),
        format!(
            "--service-account-private-key-file={}",
            files.sa_key.display()
        ),
        format!("--root-ca-file={}", files.ca.display()),
        "--use-service-account-credentials=false".into(),
        "--leader-elect=false".into(),
        // Pod CIDRs are the node VMs' own (their CNI config), not allocated.
        "--allocate-node-cidrs=false".into(),
        "--controllers=*,-nodeipam".into(),
        "--profiling=false".into(),
    ];
    let sched_args: Vec<String> = vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={}", ports[1]),
        format!("--cert-dir={}", dir.join("scheduler-certs").display()),
        "--leader-elect=false".into(),
        "--profiling=false".into(),
    ];
    let mut children = vec![spawn_logged(
        &kcm,
        &kcm_args,
        &dir.join("kube-controller-manager.log"),
    )?];
    children.push(spawn_logged(
        &sched,
        &sched_args,
        &dir.join("kube-scheduler.log"),
    )?);
    Ok(children)
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        // apiserver first, then etcd.
        for c in children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::env::var_os("HEADROOM_KEEP_CP_DIR").is_some()
            && let Some(tmp) = self.tmp.take()
        {
            let _ = std::fs::remove_file(tmp.keep().join(OWNER_FILE));
        }
    }
}

/// `POST path` with a JSON body to `127.0.0.1:port` over plain HTTP/1.1
/// (etcd's gateway), returning the JSON answer; non-2xx is an error.
async fn http_post_json(port: u16, path: &str, body: &str) -> anyhow::Result<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP header end in answer to {path}"))?;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status code in answer to {path}"))?;
    let json = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        crate::agent::dechunk(rest)
    } else {
        rest.to_string()
    };
    if !(200..300).contains(&code) {
        bail!("POST {path} answered {code}: {json}");
    }
    serde_json::from_str(json.trim()).with_context(|| format!("JSON of POST {path}: {json}"))
}

/// A `resize` subresource patch on a pod; `dry_run` sends `dryRun=All`.
pub async fn resize(
    api: &Api<Pod>,
    name: &str,
    patch: &Patch<serde_json::Value>,
    dry_run: bool,
) -> kube::Result<Pod> {
    let pp = PatchParams {
        dry_run,
        ..PatchParams::default()
    };
    api.patch_subresource("resize", name, &pp, patch).await
}

/// The Status message of an API error (`None` for other errors).
pub fn api_message(err: &kube::Error) -> Option<&str> {
    match err {
        kube::Error::Api(status) => Some(status.message.as_str()),
        _ => None,
    }
}
