//! The test bed of the real-control-plane suite: a control plane from `testbed`, the RBAC
//! manifests applied unchanged, the reference driver as a process, and our sidecars as
//! processes under their ServiceAccounts' tokens. Nodes are objects made as kubelet would make
//! them (there is no kubelet). [`Bed::finish`] fails the test if any request of ours was
//! answered 403.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testbed::{ControlPlane, Options, Process};

pub const DRIVER: &str = "hostpath.csi.volstack.dev";
pub const TOPOLOGY_KEY: &str = "topology.hostpath.csi.volstack.dev/node";
pub const VOLSTACK: &str = env!("CARGO_BIN_EXE_volstack");
pub const PROVISIONER: &str = env!("CARGO_BIN_EXE_csi-provisioner");
pub const ATTACHER: &str = env!("CARGO_BIN_EXE_csi-attacher");

/// The repository's `deploy/kubernetes/<name>`.
pub fn manifest(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/kubernetes")
        .join(name)
}

/// A fixture of the suite (`tests/real_cluster/fixtures/<name>`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/real_cluster/fixtures")
        .join(name)
}

/// What a scenario needs.
pub struct Setup<'a> {
    /// Manifests applied with `kubectl apply -f`, in order.
    pub manifests: Vec<PathBuf>,
    /// Nodes (the driver's own first); each is registered as kubelet would.
    pub nodes: &'a [&'a str],
    /// Flags of the reference driver besides its socket, state and nodes.
    pub driver_args: &'a [&'a str],
    /// The CSIDriver's `attachRequired` and `storageCapacity`.
    pub attach_required: bool,
    pub storage_capacity: bool,
    /// kube-controller-manager's `--controllers`.
    pub controllers: Option<String>,
    /// More kube-apiserver flags.
    pub api_server_args: &'a [&'a str],
}

impl Setup<'_> {
    /// kube-controller-manager without its binder, and the RBAC of `volstack pv-controller`,
    /// which takes its place (started with [`Bed::pv_controller`]).
    pub fn our_binder() -> Self {
        Setup {
            manifests: vec![manifest("rbac.yaml"), manifest("pv-controller-rbac.yaml")],
            controllers: Some(
                "*,-node-lifecycle-controller,-persistentvolume-binder-controller".into(),
            ),
            ..Default::default()
        }
    }
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            manifests: vec![manifest("rbac.yaml")],
            nodes: &["node-1"],
            driver_args: &[],
            attach_required: false,
            storage_capacity: false,
            controllers: Options::default().controllers,
            api_server_args: &[],
        }
    }
}

pub struct Bed {
    pub admin: kube::Client,
    pub socket: String,
    driver: Process,
    sidecars: Vec<Process>,
    /// Last: the control plane stops after everything that talks to it.
    pub plane: ControlPlane,
}

impl Bed {
    pub async fn start(setup: Setup<'_>) -> Bed {
        let plane = ControlPlane::start(Options {
            controllers: setup.controllers.clone(),
            scheduler: true,
            api_server_args: setup
                .api_server_args
                .iter()
                .map(|a| a.to_string())
                .collect(),
            ..Options::default()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let admin = plane.admin().await.unwrap_or_else(|e| panic!("{e}"));
        for path in &setup.manifests {
            plane
                .kubectl(&["apply", "-f", &path.display().to_string()])
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let socket = plane.dir().join("csi.sock").display().to_string();
        let mut args = vec![
            "driver".to_string(),
            format!("--endpoint=unix://{socket}"),
            format!("--state-dir={}", plane.dir().join("driver").display()),
            format!("--nodeid={}", setup.nodes[0]),
            "--publish-mode=symlink".to_string(),
        ];
        args.extend(setup.nodes[1..].iter().map(|n| format!("--extra-node={n}")));
        args.extend(setup.driver_args.iter().map(|s| s.to_string()));
        let driver = Process::spawn(
            "driver",
            Path::new(VOLSTACK),
            &args,
            &[("RUST_LOG".into(), "info".into())],
            plane.dir(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let bed = Bed {
            admin,
            socket,
            driver,
            sidecars: Vec::new(),
            plane,
        };
        for node in setup.nodes {
            bed.register_node(node).await;
        }
        bed.create_cluster::<CSIDriver>(json!({
            "metadata": {"name": DRIVER},
            "spec": {"attachRequired": setup.attach_required, "storageCapacity": setup.storage_capacity}
        }))
        .await;
        bed
    }

    /// A Node, Ready and schedulable, with the driver's topology label and a CSINode listing the
    /// driver, as kubelet and node-driver-registrar would make them.
    pub async fn register_node(&self, name: &str) {
        let node: Node = self
            .create_cluster(json!({
                "metadata": {
                    "name": name,
                    "labels": {"kubernetes.io/hostname": name, TOPOLOGY_KEY: name},
                    "annotations": {
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                        "csi.volume.kubernetes.io/nodeid": json!({DRIVER: name}).to_string(),
                    },
                },
            }))
            .await;
        let resources = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
        let status = json!({"status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready",
                            "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
        }});
        Api::<Node>::all(self.admin.clone())
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        // kube-apiserver's admission taints a new Node not-ready; the node lifecycle
        // controller (not running: it would taint Nodes no kubelet keeps alive) removes the
        // taint once the Node is Ready.
        Api::<Node>::all(self.admin.clone())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await
            .unwrap();
        self.create_cluster::<CSINode>(json!({
            "metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}]},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "topologyKeys": [TOPOLOGY_KEY]}]},
        }))
        .await;
    }

    /// A kubeconfig with the token of the ServiceAccount `default/<account>`.
    pub async fn kubeconfig_of(&self, account: &str) -> PathBuf {
        self.plane
            .service_account_kubeconfig("default", account)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `csi-provisioner` under the ServiceAccount `default/csi-provisioner` with `args`
    /// and `env`; `name` names its log.
    pub async fn provisioner(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) {
        let kubeconfig = self.kubeconfig_of("csi-provisioner").await;
        let mut argv = vec![
            format!("--csi-address={}", self.socket),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--retry-interval-start=100ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "--kube-api-qps=100".to_string(),
            "--kube-api-burst=200".to_string(),
            "--v=5".to_string(),
        ];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.spawn(name, PROVISIONER, argv, env);
    }

    /// Starts `csi-attacher` under the ServiceAccount `default/csi-attacher`.
    pub async fn attacher(&mut self, name: &str, args: &[&str]) {
        let kubeconfig = self.kubeconfig_of("csi-attacher").await;
        let mut argv = vec![
            format!("--csi-address={}", self.socket),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--retry-interval-start=100ms".to_string(),
            "--retry-interval-max=2s".to_string(),
            "--v=5".to_string(),
        ];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.spawn(name, ATTACHER, argv, &[]);
    }

    fn spawn(&mut self, name: &str, program: &str, args: Vec<String>, env: &[(&str, &str)]) {
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.push((
            "RUST_LOG".into(),
            "info,kube_client=warn,rustls=warn".into(),
        ));
        let process = Process::spawn(name, Path::new(program), &args, &env, self.plane.dir())
            .unwrap_or_else(|e| panic!("{e}"));
        self.sidecars.push(process);
    }

    /// Kills the sidecar started as `name` (SIGKILL).
    pub fn kill(&mut self, name: &str) {
        if let Some(p) = self.sidecars.iter_mut().find(|p| p.name() == name) {
            p.kill();
        }
    }

    /// Starts `volstack pv-controller` under the ServiceAccount `default/pv-controller` with
    /// `args`; `name` names its log.
    pub async fn pv_controller(&mut self, name: &str, args: &[&str]) {
        let kubeconfig = self.kubeconfig_of("pv-controller").await;
        let mut argv = vec![
            "pv-controller".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
        ];
        argv.extend(args.iter().map(|s| s.to_string()));
        self.spawn(name, VOLSTACK, argv, &[]);
    }

    /// Every log of ours and the end of the control plane's controllers' logs, for a
    /// failure's message.
    pub fn logs(&self) -> String {
        let ours = std::iter::once(&self.driver)
            .chain(&self.sidecars)
            .map(|p| format!("--- {}\n{}", p.name(), tail(&p.log(), 80)));
        let theirs = ["kube-controller-manager", "kube-scheduler"]
            .into_iter()
            .map(|p| format!("--- {p}\n{}", tail(&self.plane.log(p), 40)));
        let events = self
            .plane
            .kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"])
            .unwrap_or_else(|e| e.to_string());
        ours.chain(theirs)
            .chain(std::iter::once(format!("--- events\n{events}")))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The log of the sidecar started as `name`.
    pub fn log(&self, name: &str) -> String {
        self.sidecars
            .iter()
            .find(|p| p.name() == name)
            .map(Process::log)
            .unwrap_or_default()
    }

    /// A namespaced object made from JSON as the administrator.
    pub async fn create<K>(&self, namespace: &str, value: Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        made(Api::namespaced(self.admin.clone(), namespace), value).await
    }

    /// A cluster-scoped object made from JSON as the administrator.
    pub async fn create_cluster<K>(&self, value: Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        made(Api::all(self.admin.clone()), value).await
    }

    /// A StorageClass of the driver; `extra` is merged into it.
    pub async fn class(&self, name: &str, extra: Value) {
        let mut class =
            json!({"metadata": {"name": name}, "provisioner": DRIVER, "reclaimPolicy": "Delete"});
        merge(&mut class, &extra);
        self.create_cluster::<k8s_openapi::api::storage::v1::StorageClass>(class)
            .await;
    }

    /// A claim in `default`; `extra` is merged into it.
    pub async fn claim(&self, name: &str, class: &str, size: &str, extra: Value) {
        let mut claim = json!({
            "metadata": {"name": name},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}
        });
        merge(&mut claim, &extra);
        self.create::<PersistentVolumeClaim>("default", claim).await;
    }

    pub async fn get_claim(&self, name: &str) -> Option<PersistentVolumeClaim> {
        Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), "default")
            .get_opt(name)
            .await
            .unwrap()
    }

    /// Waits until the claim is Bound; returns its volume.
    pub async fn bound(&self, name: &str, timeout: Duration) -> PersistentVolume {
        let volume = self
            .until_some(&format!("claim {name} Bound"), timeout, || async {
                let claim = self.get_claim(name).await?;
                let bound = claim.status.as_ref()?.phase.as_deref() == Some("Bound");
                bound.then(|| claim.spec?.volume_name).flatten()
            })
            .await;
        Api::<PersistentVolume>::all(self.admin.clone())
            .get(&volume)
            .await
            .unwrap()
    }

    /// Deletes the claim and waits until its volume is gone from the cluster and the driver.
    pub async fn delete_claim(&self, name: &str, timeout: Duration) {
        let volume = self
            .get_claim(name)
            .await
            .and_then(|c| c.spec)
            .and_then(|s| s.volume_name)
            .unwrap_or_default();
        Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), "default")
            .delete(name, &Default::default())
            .await
            .unwrap();
        let pvs: Api<PersistentVolume> = Api::all(self.admin.clone());
        self.until(&format!("volume {volume} deleted"), timeout, || async {
            pvs.get_opt(&volume).await.unwrap().is_none()
        })
        .await;
    }

    /// Deletes the claim (its volume stays, by its reclaim policy).
    pub async fn delete_claim_only(&self, name: &str) {
        Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), "default")
            .delete(name, &Default::default())
            .await
            .unwrap();
    }

    /// The VolumeAttachments of the cluster.
    pub async fn attachments(&self) -> Vec<k8s_openapi::api::storage::v1::VolumeAttachment> {
        Api::<k8s_openapi::api::storage::v1::VolumeAttachment>::all(self.admin.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items
    }

    /// Waits until no VolumeAttachment is left (each detached and deleted).
    pub async fn no_attachments(&self, timeout: Duration) {
        self.until("every attachment detached and deleted", timeout, || async {
            self.attachments().await.is_empty()
        })
        .await;
    }

    /// The volume ids the driver holds.
    pub async fn driver_volumes(&self) -> Vec<String> {
        let channel = sidecar_kit::csi::connect(&self.socket).await.unwrap();
        let mut client = csi_proto::v1::controller_client::ControllerClient::new(channel);
        client
            .list_volumes(csi_proto::v1::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .entries
            .into_iter()
            .filter_map(|e| e.volume.map(|v| v.volume_id))
            .collect()
    }

    /// Polls `f` every 100 ms until it holds; after `timeout` the test fails with our logs.
    pub async fn until<F, Fut>(&self, what: &str, timeout: Duration, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        self.until_some(what, timeout, || {
            let ready = f();
            async move { ready.await.then_some(()) }
        })
        .await
    }

    /// Polls `f` until it gives a value; after `timeout` the test fails with our logs.
    pub async fn until_some<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        sidecar_kit::testing::poll_for(
            what,
            timeout,
            || self.logs(),
            || {
                let value = f();
                async move { value.await.ok_or_else(String::new) }
            },
        )
        .await
    }

    /// Waits until an event in `default` about the object `name` satisfies `matches`; after
    /// `timeout` the test fails with our logs.
    pub async fn until_event(
        &self,
        what: &str,
        name: &str,
        timeout: Duration,
        matches: impl Fn(&k8s_openapi::api::core::v1::Event) -> bool,
    ) {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.admin.clone(), "default");
        self.until(what, timeout, || async {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .any(|e| e.involved_object.name.as_deref() == Some(name) && matches(e))
        })
        .await;
    }

    /// A custom resource (or any kind kube's typed structs lack) from JSON.
    pub async fn create_dynamic(
        &self,
        resource: &kube::api::ApiResource,
        namespace: Option<&str>,
        value: Value,
    ) -> DynamicObject {
        let object: DynamicObject = serde_json::from_value(value).unwrap();
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.admin.clone(), ns, resource),
            None => Api::all_with(self.admin.clone(), resource),
        };
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("create {object:?}: {e}"))
    }

    /// Fails the test if any request of our ServiceAccounts was answered 403; stops everything.
    pub async fn finish(mut self) {
        let refusals = self
            .plane
            .refusals(|user| user.starts_with("system:serviceaccount:default:csi-"))
            .expect("read kube-apiserver's audit log");
        let logs = self.logs();
        // Written to files, our logs are plain text (no terminal colour codes).
        for process in std::iter::once(&self.driver).chain(&self.sidecars) {
            assert!(
                !process.log().contains('\u{1b}'),
                "{}'s log has colour codes",
                process.name()
            );
        }
        for sidecar in &mut self.sidecars {
            sidecar.kill();
        }
        self.driver.kill();
        assert!(
            refusals.is_empty(),
            "requests of our sidecars were answered 403:\n{}\n{logs}",
            refusals
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

async fn made<K>(api: Api<K>, value: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {object:?}: {e}"))
}

fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        _ => *target = patch.clone(),
    }
}

/// kube-apiserver and etcd alone (no controllers, no scheduler), for tests that compare what
/// the two servers answer.
pub async fn bare_control_plane() -> ControlPlane {
    ControlPlane::start(Options {
        controllers: None,
        scheduler: false,
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Our API server, in memory, with a client calling itself `agent`; it stops when dropped.
pub struct OurServer {
    pub client: kube::Client,
    _server: apiserver::RunningServer,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub async fn our_server(agent: &str) -> OurServer {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(Default::default(), async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let client = kube::Client::new(server.local_service(agent).unwrap(), "default");
    OurServer {
        client,
        _server: server,
        _stop: stop,
    }
}
