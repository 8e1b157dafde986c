//! The attacher tests' harness: our API server and the reference driver with
//! `--enable-attach`, the real `csi-attacher` binary pointed at them, and what the tests read
//! (attachments, the driver's published volumes, events, the attacher's log).

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::merge;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

pub const DRIVER: &str = "hostpath.csi.volstack.dev";
pub const FINALIZER: &str = "external-attacher/hostpath-csi-volstack-dev";
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Env {
    pub stack: cli::embedded::Stack,
    pub attacher: Option<Child>,
    pub args: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.kill_attacher();
    }
}

impl Env {
    pub async fn start(driver_args: &[&str], attacher_args: &[&str]) -> Env {
        Env::start_with(driver_args, attacher_args, |_| {}).await
    }

    /// [`Env::start`] with the stack's options changed by `adjust`.
    pub async fn start_with(
        driver_args: &[&str],
        attacher_args: &[&str],
        adjust: impl FnOnce(&mut cli::embedded::StackOptions),
    ) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let mut options =
            crate::common::stack_options(dir.path(), "attacher-test/0.1", driver_args);
        options.extra_nodes = vec!["node-2".into()];
        options.pv_controller = None;
        adjust(&mut options);
        let stack = cli::embedded::Stack::start(options).await.unwrap();
        let mut args = stack.attacher_args();
        args.extend(
            [
                "--retry-interval-start=100ms",
                "--retry-interval-max=1s",
                "--kube-api-qps=0",
                "--reconcile-sync=1s",
            ]
            .map(String::from),
        );
        args.extend(attacher_args.iter().map(|s| s.to_string()));
        let mut env = Env {
            stack,
            attacher: None,
            args,
            dir,
        };
        env.start_attacher();
        env
    }

    pub fn start_attacher(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("attacher.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
            .args(&self.args)
            .env("RUST_LOG", "info,rustls=warn,kube_client=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.attacher = Some(child);
    }

    /// SIGKILL.
    pub fn kill_attacher(&mut self) {
        if let Some(mut p) = self.attacher.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("attacher.log")).unwrap_or_default()
    }

    pub fn faults(&self, text: &str) {
        crate::common::write_faults(self.dir.path(), text);
    }

    pub fn client(&self) -> kube::Client {
        self.stack.client.clone()
    }

    pub async fn controller(
        &self,
    ) -> csi::controller_client::ControllerClient<tonic::transport::Channel> {
        let channel = sidecar_kit::csi::connect(&self.stack.socket).await.unwrap();
        csi::controller_client::ControllerClient::new(channel)
    }

    /// A volume made at the driver and its PV (Retain, no claim).
    pub async fn volume(&self, name: &str, extra: Value) -> String {
        let mut client = self.controller().await;
        let cap = csi::VolumeCapability::mount(
            "",
            csi::volume_capability::access_mode::Mode::SingleNodeWriter,
        );
        let id = client
            .create_volume(csi::CreateVolumeRequest {
                name: name.into(),
                volume_capabilities: vec![cap],
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 1 << 20,
                    limit_bytes: 0,
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        let mut pv = json!({
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "csi": {"driver": DRIVER, "volumeHandle": id},
            }
        });
        merge(&mut pv, &extra);
        let pv: PersistentVolume = serde_json::from_value(pv).unwrap();
        Api::<PersistentVolume>::all(self.client())
            .create(&PostParams::default(), &pv)
            .await
            .unwrap();
        id
    }

    pub async fn attach(&self, name: &str, pv: &str, node: &str, finalizers: &[&str]) {
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": name, "finalizers": finalizers},
            "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": pv}},
        }))
        .unwrap();
        Api::<VolumeAttachment>::all(self.client())
            .create(&PostParams::default(), &va)
            .await
            .unwrap();
    }

    pub async fn va(&self, name: &str) -> Option<VolumeAttachment> {
        Api::<VolumeAttachment>::all(self.client())
            .get_opt(name)
            .await
            .unwrap()
    }

    pub async fn pv(&self, name: &str) -> Option<PersistentVolume> {
        Api::<PersistentVolume>::all(self.client())
            .get_opt(name)
            .await
            .unwrap()
    }

    pub async fn detach(&self, name: &str) {
        Api::<VolumeAttachment>::all(self.client())
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// The driver's published nodes per volume (volumes published nowhere left out).
    pub async fn published(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut client = self.controller().await;
        let r = client
            .list_volumes(csi::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner();
        r.entries
            .into_iter()
            .filter_map(|e| {
                let nodes: BTreeSet<String> = e.status?.published_node_ids.into_iter().collect();
                (!nodes.is_empty()).then(|| (e.volume.unwrap().volume_id, nodes))
            })
            .collect()
    }

    pub async fn wait_until<F, Fut>(&self, what: &str, f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        crate::common::poll_until(what, WAIT, || self.log(), f).await;
    }

    pub async fn wait_attached(&self, name: &str) -> VolumeAttachment {
        self.wait_until(&format!("{name} attached"), || async {
            self.va(name)
                .await
                .and_then(|v| v.status)
                .is_some_and(|s| s.attached)
        })
        .await;
        self.va(name).await.unwrap()
    }

    /// Waits for an attach (or detach) error containing `words`; returns the whole error.
    pub async fn wait_error(&self, name: &str, detach: bool, words: &str) -> Value {
        let field = if detach { "detachError" } else { "attachError" };
        let what = format!("{field} with {words:?} on {name}");
        crate::common::poll_for(
            &what,
            WAIT,
            || self.log(),
            || async {
                let status =
                    serde_json::to_value(self.va(name).await.and_then(|v| v.status)).unwrap();
                let error = status[field].clone();
                if error["message"].as_str().is_some_and(|m| m.contains(words)) {
                    Ok(error)
                } else {
                    Err(error.to_string())
                }
            },
        )
        .await
    }

    pub fn writes(&self) -> u64 {
        self.stack
            .server
            .request_counts()
            .into_iter()
            .filter(|((verb, _, _, client), _)| {
                client.starts_with("csi-attacher")
                    && matches!(verb.as_str(), "CREATE" | "UPDATE" | "PATCH" | "DELETE")
            })
            .map(|(_, n)| n)
            .sum()
    }
}

pub fn finalizers(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<String> {
    meta.finalizers.clone().unwrap_or_default()
}
