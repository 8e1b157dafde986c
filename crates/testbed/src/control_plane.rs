//! One real control plane per test: etcd with its data on tmpfs, kube-apiserver with RBAC, a
//! static token for the administrator and an audit log, kube-controller-manager and
//! kube-scheduler, all on loopback with ports of their own. Identities other than the
//! administrator get ServiceAccount tokens from the TokenRequest API, as a Pod would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

use crate::Error;
use crate::audit::{self, Refusal};
use crate::binaries::{Binaries, io};
use crate::pki::{Pki, write_private};
use crate::process::Process;

/// The administrator's user name (group `system:masters`).
pub const ADMIN: &str = "testbed-admin";

/// What to start besides etcd and kube-apiserver.
#[derive(Debug, Clone)]
pub struct Options {
    /// kube-controller-manager's `--controllers` (None: it does not run). The default runs
    /// every controller but the node lifecycle controller, which would taint Nodes that no
    /// kubelet keeps alive.
    pub controllers: Option<String>,
    /// Whether kube-scheduler runs.
    pub scheduler: bool,
    /// More kube-apiserver flags (e.g. `--runtime-config` to stop serving an API).
    pub api_server_args: Vec<String>,
    /// More kube-controller-manager flags (e.g. its `--kube-api-qps`).
    pub controller_manager_args: Vec<String>,
    /// Whether kube-apiserver writes its audit log of every request (what
    /// [`ControlPlane::refusals`] reads). On by default; a benchmark may turn it off, as a
    /// cluster without an audit policy runs.
    pub audit: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controllers: Some("*,-node-lifecycle-controller".into()),
            scheduler: true,
            api_server_args: Vec::new(),
            controller_manager_args: Vec::new(),
            audit: true,
        }
    }
}

/// A running control plane; dropping it stops every process and removes its directory.
#[derive(Debug)]
pub struct ControlPlane {
    url: String,
    pki: Pki,
    admin_kubeconfig: PathBuf,
    /// None when started without one ([`Options::audit`]).
    audit_log: Option<PathBuf>,
    /// etcd, kube-apiserver, then the controllers: stopped in the reverse order.
    processes: Vec<Process>,
    /// Last: removed after every process has stopped.
    dir: tempfile::TempDir,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.kill();
        }
    }
}

/// How long a control plane may take to become ready on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);

impl ControlPlane {
    /// Starts a control plane and waits until it serves and (with kube-controller-manager)
    /// its controllers run. Call it from the test's own thread (see [`Process::spawn`]).
    pub async fn start(options: Options) -> Result<ControlPlane, Error> {
        let binaries = Binaries::locate()?;
        // tmpfs where there is one: etcd's fsyncs then cost nothing.
        let base = Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("testbed-");
        let dir = if base.is_dir() {
            builder.tempdir_in(base)
        } else {
            builder.tempdir()
        }
        .map_err(io("create", base))?;
        let root = dir.path().to_path_buf();
        let pki = Pki::write(&root)?;
        let admin_token = random_hex(32);
        let tokens = root.join("tokens.csv");
        write_private(
            &tokens,
            format!("{admin_token},{ADMIN},{ADMIN},\"system:masters\"\n").as_bytes(),
        )?;
        let audit_log = match options.audit {
            true => {
                let policy = root.join("audit-policy.yaml");
                write_private(&policy, audit::POLICY.as_bytes())?;
                Some((policy, root.join("audit.log")))
            }
            false => None,
        };
        let [client_port, peer_port, secure_port] = free_ports()?;
        let url = format!("https://127.0.0.1:{secure_port}");
        let mut plane = ControlPlane {
            url: url.clone(),
            admin_kubeconfig: root.join("admin.kubeconfig"),
            pki,
            audit_log: audit_log.as_ref().map(|(_, log)| log.clone()),
            processes: Vec::new(),
            dir,
        };
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        plane.spawn(
            &binaries,
            "etcd",
            vec![
                format!("--data-dir={}", root.join("etcd").display()),
                "--name=testbed".into(),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=testbed={peer_url}"),
                "--log-level=warn".into(),
            ],
        )?;
        plane.spawn(
            &binaries,
            "kube-apiserver",
            vec![
                format!("--etcd-servers={etcd_url}"),
                format!("--secure-port={secure_port}"),
                "--bind-address=127.0.0.1".into(),
                format!("--tls-cert-file={}", plane.pki.cert.display()),
                format!("--tls-private-key-file={}", plane.pki.key.display()),
                format!("--service-account-key-file={}", plane.pki.sa_pub.display()),
                format!(
                    "--service-account-signing-key-file={}",
                    plane.pki.sa_key.display()
                ),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                "--authorization-mode=RBAC".into(),
                format!("--token-auth-file={}", tokens.display()),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--v=1".into(),
            ]
            .into_iter()
            .chain(audit_log.iter().flat_map(|(policy, log)| {
                [
                    format!("--audit-policy-file={}", policy.display()),
                    format!("--audit-log-path={}", log.display()),
                    "--audit-log-mode=blocking".into(),
                ]
            }))
            .chain(options.api_server_args.iter().cloned())
            .collect(),
        )?;
        let kubeconfig = plane.kubeconfig_text(ADMIN, &admin_token);
        write_private(&plane.admin_kubeconfig, kubeconfig.as_bytes())?;
        let client = plane.client_for(&kubeconfig).await?;
        plane
            .wait("kube-apiserver to answer /readyz", || async {
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string());
                match request {
                    Ok(request) => client.request_text(request).await.is_ok_and(|t| t == "ok"),
                    Err(_) => false,
                }
            })
            .await?;
        let admin = format!("--kubeconfig={}", plane.admin_kubeconfig.display());
        if let Some(controllers) = &options.controllers {
            plane.spawn(
                &binaries,
                "kube-controller-manager",
                vec![
                    admin.clone(),
                    "--leader-elect=false".into(),
                    format!("--controllers={controllers}"),
                    format!(
                        "--service-account-private-key-file={}",
                        plane.pki.sa_key.display()
                    ),
                    format!("--root-ca-file={}", plane.pki.cert.display()),
                    "--use-service-account-credentials=false".into(),
                    "--secure-port=0".into(),
                    "--v=1".into(),
                ]
                .into_iter()
                .chain(options.controller_manager_args.iter().cloned())
                .collect(),
            )?;
        }
        if options.scheduler {
            plane.spawn(
                &binaries,
                "kube-scheduler",
                vec![
                    admin,
                    "--leader-elect=false".into(),
                    "--secure-port=0".into(),
                    "--v=1".into(),
                ],
            )?;
        }
        if options
            .controllers
            .as_deref()
            .is_some_and(|c| !c.contains("-serviceaccount-controller"))
        {
            // The ServiceAccount controller makes `default` in every namespace: once it is
            // there, kube-controller-manager's controllers run.
            let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
            plane
                .wait("kube-controller-manager's controllers to run", || async {
                    matches!(accounts.get_opt("default").await, Ok(Some(_)))
                })
                .await?;
        }
        Ok(plane)
    }

    fn spawn(&mut self, binaries: &Binaries, name: &str, args: Vec<String>) -> Result<(), Error> {
        let process = Process::spawn(name, &binaries.path(name), &args, &[], self.dir.path())?;
        self.processes.push(process);
        Ok(())
    }

    /// Polls `ready` every 100 ms until it holds; fails when a process of the control plane
    /// exits or after [`START_TIMEOUT`], with the logs.
    async fn wait<F, Fut>(&mut self, what: &str, mut ready: F) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if ready().await {
                return Ok(());
            }
            for process in &mut self.processes {
                if let Some(status) = process.exited() {
                    return Err(Error::Exited {
                        program: process.name().to_string(),
                        status: status.to_string(),
                        log: tail(&process.log()),
                    });
                }
            }
            if tokio::time::Instant::now() > deadline {
                let logs = self
                    .processes
                    .iter()
                    .map(|p| format!("--- {}\n{}", p.name(), tail(&p.log())))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(Error::Timeout {
                    what: what.to_string(),
                    logs,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The name and process id of each of its processes still running (etcd, kube-apiserver,
    /// kube-controller-manager, kube-scheduler).
    pub fn process_ids(&self) -> Vec<(String, u32)> {
        self.processes
            .iter()
            .filter_map(Process::name_and_id)
            .collect()
    }

    /// The server's URL (`https://127.0.0.1:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory holding the control plane's files (logs, kubeconfigs); tests may put
    /// their own files there.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The logs of the control plane's processes (etcd, kube-apiserver, kube-controller-manager,
    /// kube-scheduler, those started) and kube-apiserver's audit log, if it writes one.
    pub fn logs(&self) -> Vec<&Path> {
        self.processes
            .iter()
            .map(Process::log_path)
            .chain(self.audit_log.as_deref())
            .collect()
    }

    /// The administrator's kubeconfig (group `system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A client with the administrator's identity.
    pub async fn admin(&self) -> Result<kube::Client, Error> {
        let text = std::fs::read_to_string(&self.admin_kubeconfig)
            .map_err(io("read", &self.admin_kubeconfig))?;
        self.client_for(&text).await
    }

    /// A kubeconfig text for `user` with `token`.
    pub fn kubeconfig_text(&self, user: &str, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: {user:?}\n  user:\n    token: {token}\ncontexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {user:?}\n    namespace: default\ncurrent-context: testbed\n",
            self.url,
            self.pki.ca_data()
        )
    }

    async fn client_for(&self, kubeconfig: &str) -> Result<kube::Client, Error> {
        let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
            .map_err(|e| Error::Client(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
            .await
            .map_err(|e| Error::Client(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
    }

    /// A token of the ServiceAccount `namespace/name` (which must exist) from the TokenRequest
    /// API, valid for a day.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<String, Error> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.admin().await?, namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(86_400),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .map_err(|e| Error::Client(format!("TokenRequest for {namespace}/{name}: {e}")))?;
        answer
            .status
            .map(|s| s.token)
            .ok_or_else(|| Error::Client(format!("TokenRequest for {namespace}/{name}: no token")))
    }

    /// Writes a kubeconfig with the ServiceAccount `namespace/name`'s token and returns its
    /// path (`<dir>/kubeconfigs/<namespace>.<name>`).
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, Error> {
        let token = self.service_account_token(namespace, name).await?;
        let dir = self.dir.path().join("kubeconfigs");
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let path = dir.join(format!("{namespace}.{name}"));
        let text = self.kubeconfig_text(&service_account_user(namespace, name), &token);
        // A second kubeconfig for the same account replaces the first (a fresh token).
        let _ = std::fs::remove_file(&path);
        write_private(&path, text.as_bytes())?;
        Ok(path)
    }

    /// Runs kubectl as the administrator; returns its standard output, or its error output
    /// as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, Error> {
        kubectl_with(&self.admin_kubeconfig, args)
    }

    /// Every request answered 403 to a user `who` selects, from the audit log; an error when
    /// the control plane writes none or it cannot be read (never an empty answer for it).
    pub fn refusals(&self, who: impl Fn(&str) -> bool) -> Result<Vec<Refusal>, Error> {
        let path = self.audit_log.as_deref().ok_or(Error::NoAuditLog)?;
        audit::refusals_in(path, who)
    }

    /// The log of a control-plane process (`etcd`, `kube-apiserver`, ...).
    pub fn log(&self, program: &str) -> String {
        self.processes
            .iter()
            .find(|p| p.name() == program)
            .map(Process::log)
            .unwrap_or_default()
    }
}

/// The user name of a ServiceAccount.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// Runs kubectl with `kubeconfig`; its standard output, or its error output as the error.
pub fn kubectl_with(kubeconfig: &Path, args: &[&str]) -> Result<String, Error> {
    // Its own discovery cache beside the kubeconfig: the shared one is keyed by a port another
    // control plane may have used.
    let cache = kubeconfig
        .parent()
        .unwrap_or(Path::new("."))
        .join("kubectl-cache");
    let output = std::process::Command::new("kubectl")
        .arg(format!("--cache-dir={}", cache.display()))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .map_err(io("run", Path::new("kubectl")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Kubectl {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// The last 60 lines of a log.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// Free loopback ports (bound, read and released; a port taken meanwhile by another test
/// makes a process fail to start, which [`ControlPlane::start`] reports).
fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0u16; N];
    for port in &mut ports {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(io("bind", Path::new("127.0.0.1:0")))?;
        *port = listener
            .local_addr()
            .map_err(io("bind", Path::new("127.0.0.1:0")))?
            .port();
        listeners.push(listener);
    }
    Ok(ports)
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}
