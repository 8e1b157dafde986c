//! `csi-attacher` (the real binary) against our API server and the reference driver with
//! `--enable-attach`: attach, detach, failures in the status, secrets, the reconcile repairing
//! drift both ways, the trivial handler, and SIGKILL chaos over 200 attachments.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::merge;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DRIVER: &str = "hostpath.csi.volstack.dev";
const FINALIZER: &str = "external-attacher/hostpath-csi-volstack-dev";
const WAIT: Duration = Duration::from_secs(30);

struct Env {
    stack: cli::embedded::Stack,
    attacher: Option<Child>,
    args: Vec<String>,
    dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.kill_attacher();
    }
}

impl Env {
    async fn start(driver_args: &[&str], attacher_args: &[&str]) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let mut options = common::stack_options(dir.path(), "attacher-test/0.1", driver_args);
        options.extra_nodes = vec!["node-2".into()];
        options.pv_controller = None;
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

    fn start_attacher(&mut self) {
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
    fn kill_attacher(&mut self) {
        if let Some(mut p) = self.attacher.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("attacher.log")).unwrap_or_default()
    }

    fn faults(&self, text: &str) {
        common::write_faults(self.dir.path(), text);
    }

    fn client(&self) -> kube::Client {
        self.stack.client.clone()
    }

    async fn controller(
        &self,
    ) -> csi::controller_client::ControllerClient<tonic::transport::Channel> {
        let channel = sidecar_kit::csi::connect(&self.stack.socket).await.unwrap();
        csi::controller_client::ControllerClient::new(channel)
    }

    /// A volume made at the driver and its PV (Retain, no claim).
    async fn volume(&self, name: &str, extra: Value) -> String {
        let mut client = self.controller().await;
        let cap = csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
        };
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

    async fn attach(&self, name: &str, pv: &str, node: &str, finalizers: &[&str]) {
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

    async fn va(&self, name: &str) -> Option<VolumeAttachment> {
        Api::<VolumeAttachment>::all(self.client())
            .get_opt(name)
            .await
            .unwrap()
    }

    async fn pv(&self, name: &str) -> Option<PersistentVolume> {
        Api::<PersistentVolume>::all(self.client())
            .get_opt(name)
            .await
            .unwrap()
    }

    async fn detach(&self, name: &str) {
        Api::<VolumeAttachment>::all(self.client())
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// The driver's published nodes per volume (volumes published nowhere left out).
    async fn published(&self) -> BTreeMap<String, BTreeSet<String>> {
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

    async fn wait_until<F, Fut>(&self, what: &str, f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        common::poll_until(what, WAIT, || self.log(), f).await;
    }

    async fn wait_attached(&self, name: &str) -> VolumeAttachment {
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
    async fn wait_error(&self, name: &str, detach: bool, words: &str) -> Value {
        let field = if detach { "detachError" } else { "attachError" };
        let what = format!("{field} with {words:?} on {name}");
        common::poll_for(
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

    fn writes(&self) -> u64 {
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

fn finalizers(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Vec<String> {
    meta.finalizers.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_then_detach_protects_the_volume_until_no_attachment_names_it() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let id = env.volume("pv-a", json!({})).await;
    env.attach("va-a", "pv-a", "node-1", &[]).await;
    let va = env.wait_attached("va-a").await;
    assert_eq!(finalizers(&va.metadata), vec![FINALIZER]);
    assert_eq!(
        va.metadata.annotations.unwrap()["csi.alpha.kubernetes.io/node-id"],
        "node-1"
    );
    let status = va.status.unwrap();
    assert!(
        status
            .attachment_metadata
            .unwrap()
            .contains_key("hostpath.csi.volstack.dev/path"),
        "the publish context is the attachment metadata"
    );
    assert!(status.attach_error.is_none());
    assert!(finalizers(&env.pv("pv-a").await.unwrap().metadata).contains(&FINALIZER.to_string()));
    assert_eq!(
        env.published().await[&id],
        BTreeSet::from(["node-1".to_string()])
    );
    // Three writes: the PV's finalizer, the attachment's finalizer and node id, the status.
    assert_eq!(
        env.writes(),
        3,
        "writes for the first attach of a volume: {:?}",
        env.stack.server.request_counts()
    );

    // A second node: the driver refuses a single-node volume on two nodes.
    env.attach("va-b", "pv-a", "node-2", &[]).await;
    let error = env
        .wait_error("va-b", false, "rpc error: code = FailedPrecondition")
        .await;
    assert_eq!(error["errorCode"], json!(9), "{error}");
    assert!(error["time"].is_string());

    // The PV is deleted while attached: it waits for its attachments.
    Api::<PersistentVolume>::all(env.client())
        .delete("pv-a", &DeleteParams::default())
        .await
        .unwrap();
    env.detach("va-a").await;
    env.wait_until("va-a gone", || async { env.va("va-a").await.is_none() })
        .await;
    assert!(
        env.published()
            .await
            .get(&id)
            .is_none_or(|n| !n.contains("node-1")),
        "unpublished from node-1"
    );
    assert!(
        env.pv("pv-a").await.is_some(),
        "va-b still names the PV: it keeps the finalizer"
    );
    env.detach("va-b").await;
    env.wait_until("va-b gone", || async { env.va("va-b").await.is_none() })
        .await;
    env.wait_until("the PV gone once nothing names it", || async {
        env.pv("pv-a").await.is_none()
    })
    .await;
    assert!(env.published().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_driver_in_its_csinode_is_attached_by_its_node_annotation() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let id = env.volume("pv-n", json!({})).await;
    // Node "legacy" has no CSINode; its annotation names node-1's id for the driver (as
    // kubelet writes it), next to another driver's.
    let ids = json!({ DRIVER: "node-1", "other.csi.example.com": "elsewhere" }).to_string();
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(json!({
        "metadata": {"name": "legacy", "annotations": {"csi.volume.kubernetes.io/nodeid": ids}}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    env.attach("va-n", "pv-n", "legacy", &[]).await;
    let va = env.wait_attached("va-n").await;
    assert_eq!(
        va.metadata.annotations.unwrap()["csi.alpha.kubernetes.io/node-id"],
        "node-1",
        "the id came from the Node's annotation"
    );
    assert_eq!(
        env.published().await[&id],
        BTreeSet::from(["node-1".to_string()])
    );
    // Detached through the same id.
    env.detach("va-n").await;
    env.wait_until("va-n gone", || async { env.va("va-n").await.is_none() })
        .await;
    assert!(env.published().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_missing_secrets_are_written_to_the_status_and_retried() {
    let env = Env::start(
        &[
            "--enable-attach",
            "--require-secret=ControllerPublishVolume:token=s3cret-publish-token",
            "--require-secret=ControllerUnpublishVolume:token=s3cret-publish-token",
        ],
        &[],
    )
    .await;
    let secret_ref = json!({"spec": {"csi": {"controllerPublishSecretRef": {"name": "publish", "namespace": "default"}}}});
    let id = env.volume("pv-s", secret_ref).await;

    // No CSINode for the node, and no secret yet: as upstream, which reads the secret before
    // it looks for the node's id, the secret is what the attachment reports.
    let missing_secret = r#"failed to load secret "default/publish": secrets "publish" not found"#;
    env.attach("va-ghost", "pv-s", "ghost", &[]).await;
    env.wait_error("va-ghost", false, missing_secret).await;
    // As upstream, the volume is protected as soon as it is read, before the node is looked
    // up: the PV carries our finalizer although the attach could not be tried.
    let finalizers = env.pv("pv-s").await.unwrap().metadata.finalizers;
    assert!(
        finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == FINALIZER),
        "the volume is protected before the node is looked up"
    );

    env.attach("va-s", "pv-s", "node-1", &[]).await;
    env.wait_error("va-s", false, missing_secret).await;
    // As upstream, the secret comes before the attachment's finalizer: without it there is
    // nothing to detach, and the attachment could be deleted at once.
    let finalizers = env.va("va-s").await.unwrap().metadata.finalizers;
    assert!(
        finalizers.unwrap_or_default().is_empty(),
        "no finalizer before the secret is found"
    );
    let secrets: Api<Secret> = Api::namespaced(env.client(), "default");
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "publish"}, "stringData": {"token": "wrong"}}),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let error = env
        .wait_error("va-s", false, "rpc error: code = InvalidArgument")
        .await;
    assert!(
        !error.to_string().contains("wrong"),
        "secret values never appear: {error}"
    );
    // With the secret there, the node without a CSINode is what remains.
    env.wait_error(
        "va-ghost",
        false,
        r#"csinode.storage.k8s.io "ghost" not found"#,
    )
    .await;
    env.detach("va-ghost").await;
    // Long enough not to turn up by chance in a log of UIDs and hashes, as "abc" can.
    let fix = json!({"stringData": {"token": "s3cret-publish-token"}});
    secrets
        .patch("publish", &PatchParams::default(), &Patch::Merge(&fix))
        .await
        .unwrap();
    env.wait_attached("va-s").await;
    assert!(env.published().await.contains_key(&id));
    assert!(
        !env.log().contains("s3cret-publish-token"),
        "secret values are never logged"
    );

    // An injected error on detach: detachError, then a retry once it is gone.
    env.faults("ControllerUnpublishVolume=error:UNAVAILABLE\n");
    env.detach("va-s").await;
    env.wait_error("va-s", true, "rpc error: code = Unavailable")
        .await;
    assert!(env.published().await.contains_key(&id), "still published");
    env.faults("");
    env.wait_until("va-s gone", || async { env.va("va-s").await.is_none() })
        .await;
    assert!(env.published().await.is_empty());

    // An injected error on attach: attachError with the code, then attached.
    env.faults("ControllerPublishVolume=error:RESOURCE_EXHAUSTED\n");
    env.attach("va-t", "pv-s", "node-1", &[]).await;
    let error = env
        .wait_error("va-t", false, "rpc error: code = ResourceExhausted")
        .await;
    assert_eq!(error["errorCode"], json!(8));
    env.faults("");
    let va = env.wait_attached("va-t").await;
    assert!(
        va.status.unwrap().attach_error.is_none(),
        "cleared once attached"
    );
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("AttachFailed")
                && e.involved_object.name.as_deref() == Some("va-t")),
        "a Warning event names the failure"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_repairs_what_the_driver_lost_and_what_it_kept() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let lost = env.volume("pv-lost", json!({})).await;
    let kept = env.volume("pv-kept", json!({})).await;
    env.attach("va-lost", "pv-lost", "node-1", &[]).await;
    env.attach("va-kept", "pv-kept", "node-1", &["test.volstack.dev/hold"])
        .await;
    env.wait_attached("va-lost").await;
    env.wait_attached("va-kept").await;

    // The driver loses a publication behind the cluster's back: published again.
    let mut client = env.controller().await;
    client
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: lost.clone(),
            node_id: "node-1".into(),
            secrets: Default::default(),
        })
        .await
        .unwrap();
    assert!(!env.published().await.contains_key(&lost));
    env.wait_until("the lost publication repaired", || async {
        env.published().await.contains_key(&lost)
    })
    .await;
    assert!(env.va("va-lost").await.unwrap().status.unwrap().attached);

    // A detached attachment (held by another finalizer) the driver publishes again:
    // unpublished.
    env.detach("va-kept").await;
    env.wait_until("va-kept detached", || async {
        let va = env.va("va-kept").await.unwrap();
        !finalizers(&va.metadata).contains(&FINALIZER.to_string())
            && !va.status.is_some_and(|s| s.attached)
    })
    .await;
    assert!(!env.published().await.contains_key(&kept));
    let cap = csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
    };
    client
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: kept.clone(),
            node_id: "node-1".into(),
            volume_capability: Some(cap),
            ..Default::default()
        })
        .await
        .unwrap();
    env.wait_until("the stray publication removed", || async {
        !env.published().await.contains_key(&kept)
    })
    .await;
    assert!(
        env.log()
            .contains("the driver disagrees with status.attached")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_controller_publish_is_only_marked_attached() {
    let env = Env::start(&[], &[]).await;
    env.volume("pv-t", json!({})).await;
    env.attach("va-t", "pv-t", "node-1", &[]).await;
    let va = env.wait_attached("va-t").await;
    assert!(finalizers(&va.metadata).is_empty(), "no finalizers");
    assert!(va.status.unwrap().attachment_metadata.is_none());
    assert!(finalizers(&env.pv("pv-t").await.unwrap().metadata).is_empty());
    assert!(env.log().contains("using trivial handler"));
    env.detach("va-t").await;
    assert!(env.va("va-t").await.is_none(), "gone at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_chaos_over_200_attachments_ends_matching_the_driver() {
    const N: usize = 200;
    let mut env = Env::start(&["--enable-attach"], &["--worker-threads=8"]).await;
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(env.volume(&format!("pv-{i:03}"), json!({})).await);
    }
    for i in 0..N {
        env.attach(&format!("va-{i:03}"), &format!("pv-{i:03}"), "node-1", &[])
            .await;
    }
    // Kill the attacher at uneven moments while it attaches, and while half the attachments
    // are deleted.
    let mut rng_state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    for round in 0..8 {
        tokio::time::sleep(Duration::from_millis(150 + next() % 400)).await;
        env.kill_attacher();
        if round == 3 {
            for i in (0..N).step_by(2) {
                env.detach(&format!("va-{i:03}")).await;
            }
        }
        env.start_attacher();
    }
    let want: BTreeMap<String, BTreeSet<String>> = (1..N)
        .step_by(2)
        .map(|i| (ids[i].clone(), BTreeSet::from(["node-1".to_string()])))
        .collect();
    let vas: Api<VolumeAttachment> = Api::all(env.client());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let list = vas.list(&ListParams::default()).await.unwrap().items;
        let settled = list.len() == N / 2
            && list
                .iter()
                .all(|v| v.status.as_ref().is_some_and(|s| s.attached));
        if settled && env.published().await == want {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled: {} attachments, {} attached, driver publishes {}\n{}",
            list.len(),
            list.iter()
                .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
                .count(),
            env.published().await.len(),
            env.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in (1..N).step_by(2) {
        let va = env.va(&format!("va-{i:03}")).await.unwrap();
        assert_eq!(finalizers(&va.metadata), vec![FINALIZER], "va-{i:03}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_detaches_do_not_hold_up_attaches() {
    // Two workers per direction; every ControllerUnpublishVolume hangs.
    let env = Env::start(
        &["--enable-attach"],
        &["--worker-threads=2", "--timeout=2m"],
    )
    .await;
    for i in 0..3 {
        env.volume(&format!("pv-{i}"), json!({})).await;
        env.attach(&format!("va-{i}"), &format!("pv-{i}"), "node-1", &[])
            .await;
    }
    for i in 0..3 {
        env.wait_attached(&format!("va-{i}")).await;
    }
    env.faults("ControllerUnpublishVolume=hang\n");
    for i in 0..3 {
        env.detach(&format!("va-{i}")).await;
    }
    // Upstream's one pool would have both workers stuck in the hung detaches.
    env.volume("pv-new", json!({})).await;
    env.attach("va-new", "pv-new", "node-1", &[]).await;
    env.wait_attached("va-new").await;
    assert_eq!(
        env.published().await.len(),
        4,
        "the three hung detaches have not happened"
    );
    env.faults("");
    for i in 0..3 {
        let name = format!("va-{i}");
        env.wait_until(&format!("{name} gone"), || async {
            env.va(&name).await.is_none()
        })
        .await;
    }
    assert_eq!(env.published().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_leads_through_upstreams_lease_and_serves_upstreams_metrics() {
    let port = common::free_port();
    let env = Env::start(
        &["--enable-attach"],
        &[
            "--leader-election",
            &format!("--http-endpoint=127.0.0.1:{port}"),
        ],
    )
    .await;
    env.volume("pv-m", json!({})).await;
    env.attach("va-m", "pv-m", "node-1", &[]).await;
    env.wait_attached("va-m").await;
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(env.client(), "kube-system")
            .get("external-attacher-leader-hostpath-csi-volstack-dev")
            .await
            .unwrap();
    assert!(lease.spec.unwrap().holder_identity.is_some());
    let page = http_get(port, "/metrics").await;
    for wanted in [
        r#"csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.volstack.dev",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume"} 1"#,
        r#"workqueue_adds_total{name="csi-attacher-va"}"#,
        r#"workqueue_adds_total{name="csi-attacher-va-detach"}"#,
        r#"workqueue_adds_total{name="csi-attacher-pv"}"#,
        // csi-lib-utils names no election: the Go sidecar's series is `name=""`.
        r#"leader_election_master_status{name=""}"#,
    ] {
        assert!(page.contains(wanted), "{wanted} missing from\n{page}");
    }
    assert_eq!(http_get(port, "/healthz/leader-election").await, "ok");
}

/// The body of an HTTP/1.0 GET on loopback.
async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// A detach whose driver call succeeded but whose attachment cannot be marked detached (its
/// finalizer not removed) says so, in upstream's words, and is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_that_cannot_be_marked_says_so_and_is_retried() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let id = env.volume("pv-m", json!({})).await;
    env.attach("va-m", "pv-m", "node-1", &[]).await;
    env.wait_attached("va-m").await;
    // Every write of a VolumeAttachment fails: the status cannot hold the error, the event
    // does.
    env.stack.server.set_faults(vec![
        serde_json::from_value(
            json!({"resource": "volumeattachments", "verb": "PATCH", "error": 500}),
        )
        .unwrap(),
    ]);
    env.detach("va-m").await;
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client(), "default");
    let message = common::poll_for(
        "a DetachFailed event on va-m",
        WAIT,
        || env.log(),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("DetachFailed")
                        && e.involved_object.name.as_deref() == Some("va-m")
                })
                .and_then(|e| e.message)
                .ok_or_else(|| "no event yet".to_string())
        },
    )
    .await;
    assert!(
        message.starts_with("could not mark as detached: "),
        "{message}"
    );
    assert!(
        !env.published().await.contains_key(&id),
        "the driver detached it"
    );
    env.stack.server.set_faults(Vec::new());
    env.wait_until("va-m gone", || async { env.va("va-m").await.is_none() })
        .await;
}

/// A write that conflicts (the object changed meanwhile) is not a failure: the attacher looks
/// again at once, as the PV controller does, instead of backing off and counting a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_writes_are_looked_at_again_not_backed_off() {
    let port = common::free_port();
    let env = Env::start(
        &["--enable-attach"],
        &[&format!("--http-endpoint=127.0.0.1:{port}")],
    )
    .await;
    // Every other write of a VolumeAttachment (its finalizer, its status) answered 409.
    env.stack.server.set_faults(vec![
        serde_json::from_value(json!({"resource": "volumeattachments", "verb": "PATCH", "error": 409, "probability": 0.5})).unwrap(),
    ]);
    for i in 0..6 {
        env.volume(&format!("pv-c{i}"), json!({})).await;
        env.attach(&format!("va-c{i}"), &format!("pv-c{i}"), "node-1", &[])
            .await;
    }
    for i in 0..6 {
        env.wait_attached(&format!("va-c{i}")).await;
    }
    env.stack.server.set_faults(Vec::new());
    let conflicts: u64 = env
        .stack
        .server
        .request_counts()
        .iter()
        .filter(|((verb, resource, code, _), _)| {
            verb == "PATCH" && resource == "volumeattachments" && *code == 409
        })
        .map(|(_, n)| n)
        .sum();
    assert!(conflicts > 0, "the faults were injected");
    let page = http_get(port, "/metrics").await;
    let retries: f64 = page
        .lines()
        .filter(|l| l.starts_with("workqueue_retries_total{name=\"csi-attacher-va\"}"))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|n| n.parse::<f64>().ok())
        .sum();
    assert_eq!(
        retries, 0.0,
        "{conflicts} conflicts counted as failures:\n{page}"
    );
}
