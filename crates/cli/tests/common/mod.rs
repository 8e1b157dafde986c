//! A whole cluster on loopback for scenario tests: our API server and driver in-process, the
//! real `csi-provisioner` binary as a child process, and the PV controller as a task.

#![allow(dead_code, clippy::unwrap_used)]

pub mod up;

pub use sidecar_kit::testing::{poll_blocking, poll_for, poll_until};

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

pub const DRIVER: &str = "hostpath.csi.volstack.dev";

pub struct Cluster {
    pub client: kube::Client,
    pub stack: cli::embedded::Stack,
    pub socket: String,
    provisioner: Option<Child>,
    pub provisioner_args: Vec<String>,
    /// Environment of the provisioner process (NAMESPACE, POD_NAME, NODE_NAME).
    pub provisioner_env: Vec<(String, String)>,
    /// The chaos seed, written into the driver's fault file (see [`Cluster::seed_chaos`]).
    fault_seed: std::sync::Mutex<Option<u64>>,
    /// Last: removed after everything using it has stopped.
    pub dir: tempfile::TempDir,
}

/// A port free on loopback now (for a flag that needs one before the process starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The values of a PV's node affinity (the segments it is in), every term's in order.
pub fn affinity_values(pv: &PersistentVolume) -> Vec<String> {
    pv.spec
        .iter()
        .filter_map(|s| s.node_affinity.as_ref()?.required.as_ref())
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
        .flat_map(|e| e.values.clone().unwrap_or_default())
        .collect()
}

/// The seed of a chaos run: `CHAOS_SEED` when set, else a new one; printed with how to
/// replay it.
pub fn chaos_seed(test: &str) -> u64 {
    let seed = match std::env::var("CHAOS_SEED") {
        Ok(text) => text
            .parse()
            .expect("CHAOS_SEED must be an unsigned integer"),
        Err(_) => rand::random(),
    };
    eprintln!("{test}: seed {seed} (replay with CHAOS_SEED={seed})");
    seed
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut p) = self.provisioner.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

impl Cluster {
    /// Starts everything; `driver_args` go to the driver, `provisioner_args` to csi-provisioner.
    pub async fn start(
        driver_args: &[&str],
        provisioner_args: &[&str],
        with_pv_controller: bool,
    ) -> Cluster {
        Cluster::start_with(driver_args, provisioner_args, with_pv_controller, |_| {}).await
    }

    /// Like [`Cluster::start`], with the stack's options changed by `tweak`.
    pub async fn start_with(
        driver_args: &[&str],
        provisioner_args: &[&str],
        with_pv_controller: bool,
        tweak: impl FnOnce(&mut cli::embedded::StackOptions),
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut options = stack_options(dir.path(), "scenario-test/0.1", driver_args);
        options.pv_controller = with_pv_controller.then_some((
            4,
            sidecar_kit::workqueue::Backoff {
                start: Duration::from_millis(100),
                max: Duration::from_secs(2),
            },
        ));
        tweak(&mut options);
        let stack = cli::embedded::Stack::start(options).await.unwrap();
        let mut args = stack.provisioner_args();
        // Defaults a test may set otherwise (a flag given twice is refused).
        for default in [
            "--retry-interval-start=100ms",
            "--retry-interval-max=1s",
            "--kube-api-qps=0",
        ] {
            let flag = default.split('=').next().unwrap_or(default);
            if !provisioner_args
                .iter()
                .any(|a| a.split('=').next() == Some(flag))
            {
                args.push(default.to_string());
            }
        }
        args.extend(provisioner_args.iter().map(|s| s.to_string()));
        let mut cluster = Cluster {
            client: stack.client.clone(),
            socket: stack.socket.clone(),
            dir,
            stack,
            provisioner: None,
            provisioner_args: args,
            provisioner_env: vec![("NAMESPACE".into(), "kube-system".into())],
            fault_seed: std::sync::Mutex::new(None),
        };
        cluster.start_provisioner();
        cluster
    }

    pub fn start_provisioner(&mut self) {
        // Appended: the log of every process the test started, crashed ones included.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("provisioner.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
            .args(&self.provisioner_args)
            .envs(self.provisioner_env.iter().cloned())
            .env("RUST_LOG", "info,rustls=warn,kube_client=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.provisioner = Some(child);
    }

    /// Restarts the provisioner if it exited, as kubelet restarts a crashed container.
    pub fn ensure_running(&mut self) -> bool {
        let exited = match self.provisioner.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(Some(_))),
            None => true,
        };
        if exited {
            self.provisioner = None;
            self.start_provisioner();
        }
        exited
    }

    /// Whether the provisioner process has exited (it is not restarted).
    pub fn exited(&mut self) -> bool {
        self.provisioner
            .as_mut()
            .is_none_or(|child| matches!(child.try_wait(), Ok(Some(_))))
    }

    pub fn provisioner_pid(&self) -> Option<u32> {
        self.provisioner.as_ref().map(|p| p.id())
    }

    pub fn kill_provisioner(&mut self) {
        if let Some(mut p) = self.provisioner.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    pub fn provisioner_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("provisioner.log")).unwrap_or_default()
    }

    /// Replaces the driver's fault control file (seeded when the run is:
    /// [`Cluster::seed_chaos`]).
    pub fn faults(&self, text: &str) {
        match *self.fault_seed.lock().unwrap() {
            Some(seed) if !text.is_empty() => {
                write_faults(self.dir.path(), &format!("seed={seed}\n{text}"))
            }
            _ => write_faults(self.dir.path(), text),
        }
    }

    /// Seeds every random choice of a chaos run: the driver's and the API server's fault
    /// draws, and the returned generator for the test's own choices. The seed is
    /// `CHAOS_SEED` when set (to replay a run), else a new one; it is printed either way.
    pub fn seed_chaos(&self, test: &str) -> rand::rngs::StdRng {
        let seed = chaos_seed(test);
        self.stack.server.set_fault_seed(seed);
        *self.fault_seed.lock().unwrap() = Some(seed);
        rand::SeedableRng::seed_from_u64(seed)
    }

    pub async fn driver_volumes(&self) -> usize {
        self.driver_volume_ids().await.len()
    }

    /// Volume ids the driver holds.
    pub async fn driver_volume_ids(&self) -> Vec<String> {
        let channel = sidecar_kit::csi::connect(&self.socket).await.unwrap();
        let mut client = csi_proto::v1::controller_client::ControllerClient::new(channel);
        let r = client
            .list_volumes(csi_proto::v1::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner();
        r.entries
            .into_iter()
            .filter_map(|e| e.volume.map(|v| v.volume_id))
            .collect()
    }

    pub async fn apply<K>(&self, value: Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let obj: K = serde_json::from_value(value).unwrap();
        Api::<K>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &obj)
            .await
            .unwrap()
    }

    pub async fn apply_cluster<K>(&self, value: Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let obj: K = serde_json::from_value(value).unwrap();
        Api::<K>::all(self.client.clone())
            .create(&PostParams::default(), &obj)
            .await
            .unwrap()
    }

    pub async fn class(&self, name: &str, extra: Value) {
        let mut sc =
            json!({"metadata": {"name": name}, "provisioner": DRIVER, "reclaimPolicy": "Delete"});
        merge(&mut sc, &extra);
        self.apply_cluster::<k8s_openapi::api::storage::v1::StorageClass>(sc)
            .await;
    }

    /// A claim; `annotate` adds the storage-provisioner annotation as the PV controller would.
    pub async fn claim(
        &self,
        name: &str,
        class: &str,
        size: &str,
        extra: Value,
        annotate: bool,
    ) -> PersistentVolumeClaim {
        let mut pvc = json!({
            "metadata": {"name": name},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
        });
        if annotate {
            pvc["metadata"]["annotations"] =
                json!({"volume.kubernetes.io/storage-provisioner": DRIVER});
        }
        merge(&mut pvc, &extra);
        self.apply::<PersistentVolumeClaim>(pvc).await
    }

    /// Makes claim `name` of `class` whose data source is a populator's kind, and waits for the
    /// provisioner to leave it to the populator (its Normal `Provisioning` event).
    pub async fn populator_claim_left_alone(&self, name: &str, class: &str) {
        self.claim(
            name,
            class,
            "1Gi",
            json!({"spec": {"dataSourceRef": {"kind": "Dataset", "name": "d", "apiGroup": "example.com"}}}),
            false,
        )
        .await;
        self.wait_event(
            name,
            "Provisioning",
            "Assuming an external populator will provision the volume",
        )
        .await;
    }

    pub async fn pv_for(&self, claim: &PersistentVolumeClaim) -> Option<PersistentVolume> {
        let name = format!("pvc-{}", claim.metadata.uid.clone().unwrap());
        Api::<PersistentVolume>::all(self.client.clone())
            .get_opt(&name)
            .await
            .unwrap()
    }

    pub async fn wait_pv(
        &self,
        claim: &PersistentVolumeClaim,
        timeout: Duration,
    ) -> PersistentVolume {
        let what = format!("a PV for {:?}", claim.metadata.name);
        poll_for(
            &what,
            timeout,
            || self.provisioner_log(),
            || async { self.pv_for(claim).await.ok_or_else(String::new) },
        )
        .await
    }

    /// Where the driver keeps a PV's volume, for a test to write into as a pod would. A mount
    /// volume never used has no directory yet (the driver makes it at its first use): it is
    /// made here, as that first use would.
    pub fn volume_dir(&self, pv: &PersistentVolume) -> std::path::PathBuf {
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap();
        let dir = self.dir.path().join("driver/volumes").join(handle);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Waits until the Pod `name` (namespace default) is in `phase`.
    pub async fn wait_pod_phase(&self, name: &str, phase: &str, timeout: Duration) {
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), "default");
        self.wait_until(&format!("Pod {name} {phase}"), timeout, || async {
            pods.get(name)
                .await
                .unwrap()
                .status
                .and_then(|s| s.phase)
                .as_deref()
                == Some(phase)
        })
        .await;
    }

    /// Deletes the claim `name` (namespace default).
    pub async fn delete_claim(&self, name: &str) {
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), "default")
            .delete(name, &kube::api::DeleteParams::default())
            .await
            .unwrap();
    }

    /// Waits until the PV `name` is in `phase`.
    pub async fn wait_pv_phase(&self, name: &str, phase: &str, timeout: Duration) {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        self.wait_until(&format!("PV {name} {phase}"), timeout, || async {
            pvs.get_opt(name)
                .await
                .unwrap()
                .and_then(|p| p.status)
                .and_then(|s| s.phase)
                .as_deref()
                == Some(phase)
        })
        .await;
    }

    /// Waits until the PV `name` is gone.
    pub async fn wait_pv_gone(&self, name: &str, timeout: Duration) {
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        self.wait_until(&format!("PV {name} gone"), timeout, || async {
            pvs.get_opt(name).await.unwrap().is_none()
        })
        .await;
    }

    /// The driver's snapshot `name` of the volume `volume_id`, made over CSI: its handle.
    pub async fn driver_snapshot(&self, volume_id: &str, name: &str) -> String {
        let channel = sidecar_kit::csi::connect(&self.socket).await.unwrap();
        csi_proto::v1::controller_client::ControllerClient::new(channel)
            .create_snapshot(csi_proto::v1::CreateSnapshotRequest {
                source_volume_id: volume_id.to_string(),
                name: name.to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id
    }

    /// Waits until the claim `name` (namespace default) is Bound.
    pub async fn wait_bound(&self, name: &str, timeout: Duration) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), "default");
        self.wait_until(&format!("{name} Bound"), timeout, || async {
            claims
                .get(name)
                .await
                .unwrap()
                .status
                .and_then(|s| s.phase)
                .as_deref()
                == Some("Bound")
        })
        .await;
    }

    pub async fn events_for(&self, name: &str) -> Vec<(String, String)> {
        let events = Api::<Event>::namespaced(self.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap();
        events
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }

    /// Waits for an event with `reason` on `name` whose message contains `words`.
    pub async fn wait_event(&self, name: &str, reason: &str, words: &str) -> String {
        let what = format!("a {reason} event containing {words:?} for {name}");
        let timeout = Duration::from_secs(15);
        poll_for(
            &what,
            timeout,
            || self.provisioner_log(),
            || async {
                let events = self.events_for(name).await;
                events
                    .iter()
                    .find(|(r, m)| r == reason && m.contains(words))
                    .map(|(_, m)| m.clone())
                    .ok_or_else(|| format!("events {events:?}"))
            },
        )
        .await
    }

    /// Waits until the provisioner's log holds `words`.
    pub async fn wait_log(&self, words: &str) {
        let what = format!("{words:?} in the provisioner's log");
        poll_until(&what, Duration::from_secs(30), String::new, || async {
            self.provisioner_log().contains(words)
        })
        .await;
    }

    pub async fn wait_until<F, Fut>(&self, what: &str, timeout: Duration, f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        poll_until(what, timeout, || self.provisioner_log(), f).await;
    }

    /// The intent log as stored: per Lease that holds one, (its annotations' total bytes, the
    /// volumes it records).
    pub async fn intent_shards(&self) -> Vec<(usize, Vec<String>)> {
        let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::all(self.client.clone())
            .list(&Default::default())
            .await
            .unwrap();
        let mut shards = Vec::new();
        for lease in leases.items {
            let annotations = lease.metadata.annotations.unwrap_or_default();
            let Some(text) = annotations.get(provisioner::controller::intents::ANNOTATION) else {
                continue;
            };
            let records: BTreeMap<String, Value> = serde_json::from_str(text).unwrap();
            let bytes = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
            shards.push((bytes, records.into_keys().collect()));
        }
        shards
    }

    pub fn api_writes(&self, client: &str) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for ((verb, resource, _code, c), n) in self.stack.server.request_counts() {
            if c == client && matches!(verb.as_str(), "CREATE" | "UPDATE" | "PATCH" | "DELETE") {
                *out.entry((verb, resource)).or_default() += n;
            }
        }
        out
    }
}

/// The stack of a scenario test in `dir`: the driver with a fault control file
/// (`<dir>/faults`, see [`Cluster::faults`]) and symlink publishing, plus `driver_args`.
pub fn stack_options(
    dir: &std::path::Path,
    user_agent: &'static str,
    driver_args: &[&str],
) -> cli::embedded::StackOptions {
    let mut options = cli::embedded::StackOptions::new(dir.to_path_buf(), user_agent);
    options.driver_args = vec![
        format!("--fault-file={}", dir.join("faults").display()),
        "--publish-mode=symlink".to_string(),
    ];
    options
        .driver_args
        .extend(driver_args.iter().map(|s| s.to_string()));
    options
}

/// Replaces the driver's fault control file in `dir` atomically (see [`stack_options`]).
pub fn write_faults(dir: &std::path::Path, text: &str) {
    let tmp = dir.join("faults.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join("faults")).unwrap();
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
