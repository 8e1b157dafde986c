//! kube-controller-manager's recycler for hostPath and NFS volumes (issue 33, the Recycle
//! hand-off): a Released volume with policy `Recycle` is scrubbed by a Pod named after it,
//! once no Pod uses its claim; the Pod's end decides. The test plays kubelet: it moves the
//! recycler Pods to their end and writes their events.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use pv_controller::controller::{PvController, default_backoff};
use pv_controller::decide::recycle::{
    PluginRecycler, RECYCLER_IMAGE, RecyclerConfig, default_template,
};
use serde_json::{Value, json};

use common::{serve, wait_for};

const WAIT: Duration = Duration::from_secs(60);

struct Cluster {
    admin: kube::Client,
    pvs: Api<PersistentVolume>,
    claims: Api<PersistentVolumeClaim>,
    pods: Api<Pod>,
    stop: tokio::sync::oneshot::Sender<()>,
    running: tokio::task::JoinHandle<()>,
    server: apiserver::RunningServer,
}

impl Cluster {
    /// The API server, and the controller `make` gives running on it with a resync every
    /// second (a recycle that could not run is tried again soon).
    async fn start(make: impl FnOnce(kube::Client) -> std::sync::Arc<PvController>) -> Cluster {
        let (server, admin, client) = serve().await;
        let controller = make(client);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(controller.run_with(4, Duration::from_secs(1), async {
            let _ = stopped.await;
        }));
        Cluster {
            pvs: Api::all(admin.clone()),
            claims: Api::namespaced(admin.clone(), "default"),
            pods: Api::namespaced(admin.clone(), "default"),
            admin,
            stop,
            running,
            server,
        }
    }

    /// Stops the controller; it must stop (a recycle in progress included).
    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(WAIT, self.running)
            .await
            .unwrap()
            .unwrap();
    }

    async fn create<K>(&self, api: &Api<K>, object: Value)
    where
        K: kube::Resource
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let object: K = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    /// A volume with policy Recycle and its claim, bound.
    async fn bound_volume(&self, name: &str, source: Value, claim: &str) {
        let mut spec = json!({"capacity": {"storage": "3Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Recycle", "storageClassName": ""});
        for (k, v) in source.as_object().unwrap() {
            spec[k] = v.clone();
        }
        self.create(&self.pvs, json!({"metadata": {"name": name}, "spec": spec}))
            .await;
        self.create(
            &self.claims,
            json!({"metadata": {"name": claim}, "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "",
                "volumeName": name}}),
        )
        .await;
        self.phase_is(name, "Bound").await;
    }

    async fn phase_is(&self, pv: &str, phase: &str) -> PersistentVolume {
        wait_for(&format!("{pv} {phase}"), WAIT, || async {
            let got = self.pvs.get_opt(pv).await.unwrap()?;
            (got.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(got)
        })
        .await
    }

    /// The recycler Pod, once it is there (and not being deleted).
    async fn recycler(&self, pv: &str) -> Pod {
        let name = format!("recycler-for-{pv}");
        wait_for(&format!("pod {name}"), WAIT, || async {
            let pod = self.pods.get_opt(&name).await.unwrap()?;
            pod.metadata.deletion_timestamp.is_none().then_some(pod)
        })
        .await
    }

    async fn gone(&self, pod: &Pod) {
        let name = pod.metadata.name.clone().unwrap();
        let uid = pod.metadata.uid.clone();
        wait_for(&format!("pod {name} deleted"), WAIT, || async {
            let now = self.pods.get_opt(&name).await.unwrap();
            now.is_none_or(|p| p.metadata.uid != uid).then_some(())
        })
        .await;
    }

    /// What kubelet does at a Pod's end: its phase (and message).
    async fn finish(&self, pod: &str, status: Value) {
        self.pods
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap();
    }

    /// The volume's event of `reason` whose message is `message`.
    async fn event(&self, pv: &str, kind: &str, reason: &str, message: &str) {
        let events: Api<Event> = Api::all(self.admin.clone());
        wait_for(
            &format!("{pv}'s {kind} {reason} event {message:?}"),
            WAIT,
            || async {
                let all = events.list(&Default::default()).await.unwrap().items;
                all.iter()
                    .any(|e| {
                        e.involved_object.name.as_deref() == Some(pv)
                            && e.involved_object.kind.as_deref() == Some("PersistentVolume")
                            && e.type_.as_deref() == Some(kind)
                            && e.reason.as_deref() == Some(reason)
                            && e.message.as_deref() == Some(message)
                    })
                    .then_some(())
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostpath_and_nfs_volumes_are_recycled_by_a_pod_and_a_failed_recycle_is_tried_again() {
    let metrics = sidecar_kit::metrics::Metrics::new().unwrap();
    let cluster = Cluster::start(|client| {
        PvController::with_metrics(
            client,
            default_backoff(),
            &metrics,
            Some(RecyclerConfig::default()),
        )
    })
    .await;

    // A hostPath volume whose claim a running Pod still uses: not scrubbed until it ends.
    cluster
        .bound_volume(
            "pv-hp",
            json!({"hostPath": {"path": "/data/pv-hp", "type": "DirectoryOrCreate"}}),
            "c-hp",
        )
        .await;
    cluster
        .create(
            &cluster.pods,
            json!({"metadata": {"name": "user"}, "spec": {"containers": [{"name": "c", "image": "i"}],
                "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "c-hp"}}]}}),
        )
        .await;
    cluster.finish("user", json!({"phase": "Running"})).await;
    cluster
        .claims
        .delete("c-hp", &Default::default())
        .await
        .unwrap();
    cluster
        .event(
            "pv-hp",
            "Normal",
            "VolumeFailedRecycle",
            "Volume is used by pods: default/user",
        )
        .await;
    cluster.finish("user", json!({"phase": "Succeeded"})).await;
    let pod = cluster.recycler("pv-hp").await;
    let spec = serde_json::to_value(pod.spec.clone().unwrap()).unwrap();
    assert_eq!(spec["activeDeadlineSeconds"], 90, "{spec}");
    assert_eq!(
        spec["volumes"],
        // The API server gives it `type: ""`, as kube-apiserver does.
        json!([{"name": "vol", "hostPath": {"path": "/data/pv-hp", "type": ""}}])
    );
    assert_eq!(spec["containers"][0]["image"], RECYCLER_IMAGE);
    // Its events are passed on to the volume.
    cluster
        .create(
            &Api::<Event>::namespaced(cluster.admin.clone(), "default"),
            json!({"metadata": {"name": "recycler-for-pv-hp.1"},
                "involvedObject": {"kind": "Pod", "namespace": "default", "name": "recycler-for-pv-hp"},
                "type": "Warning", "reason": "BackOff", "message": "Back-off pulling image"}),
        )
        .await;
    cluster
        .event(
            "pv-hp",
            "Warning",
            "RecyclerPod",
            "Recycler pod: Back-off pulling image",
        )
        .await;
    // Its watches end (the server's timeout, a dropped connection): opened again, they pass
    // on what came meanwhile. The events' first: a new event comes through.
    cluster.server.close_watches(Some("events"));
    cluster
        .create(
            &Api::<Event>::namespaced(cluster.admin.clone(), "default"),
            json!({"metadata": {"name": "recycler-for-pv-hp.2"},
                "involvedObject": {"kind": "Pod", "namespace": "default", "name": "recycler-for-pv-hp"},
                "type": "Normal", "reason": "Pulled", "message": "Image pulled"}),
        )
        .await;
    cluster
        .event(
            "pv-hp",
            "Normal",
            "RecyclerPod",
            "Recycler pod: Image pulled",
        )
        .await;
    // Then the Pod's, which ends while its watch is away.
    cluster.server.close_watches(Some("pods"));
    cluster
        .finish("recycler-for-pv-hp", json!({"phase": "Succeeded"}))
        .await;
    let recycled = cluster.phase_is("pv-hp", "Available").await;
    let spec = recycled.spec.unwrap();
    assert!(spec.claim_ref.is_none(), "{:?}", spec.claim_ref);
    assert!(
        !recycled
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("pv.kubernetes.io/bound-by-controller")
    );
    cluster
        .event("pv-hp", "Normal", "VolumeRecycled", "Volume recycled")
        .await;
    cluster.gone(&pod).await;

    // An NFS volume whose recycler Pod fails: Failed with the Pod's message, then tried again
    // (a new Pod), which succeeds.
    cluster
        .bound_volume(
            "pv-nfs",
            json!({"nfs": {"server": "10.0.0.2", "path": "/exports/a"}}),
            "c-nfs",
        )
        .await;
    cluster
        .claims
        .delete("c-nfs", &Default::default())
        .await
        .unwrap();
    let first = cluster.recycler("pv-nfs").await;
    let spec = serde_json::to_value(first.spec.clone().unwrap()).unwrap();
    assert_eq!(spec["activeDeadlineSeconds"], 300, "{spec}");
    assert_eq!(
        spec["volumes"],
        json!([{"name": "vol", "nfs": {"server": "10.0.0.2", "path": "/exports/a"}}])
    );
    cluster
        .finish(
            "recycler-for-pv-nfs",
            json!({"phase": "Failed", "message": "scrub failed"}),
        )
        .await;
    let failed = cluster.phase_is("pv-nfs", "Failed").await;
    let message = "Recycle failed: failed to recycle volume: scrub failed";
    assert_eq!(
        failed.status.and_then(|s| s.message).as_deref(),
        Some(message)
    );
    cluster
        .event("pv-nfs", "Warning", "VolumeFailedRecycle", message)
        .await;
    cluster.gone(&first).await;
    let second = cluster.recycler("pv-nfs").await;
    assert_ne!(second.metadata.uid, first.metadata.uid);
    cluster
        .finish("recycler-for-pv-nfs", json!({"phase": "Succeeded"}))
        .await;
    cluster.phase_is("pv-nfs", "Available").await;

    // A Pod of that name left by an earlier try: deleted, the volume Failed for now, then
    // recycled by a new Pod.
    cluster
        .create(
            &cluster.pods,
            json!({"metadata": {"name": "recycler-for-pv-old"},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        )
        .await;
    let old = cluster.pods.get("recycler-for-pv-old").await.unwrap();
    cluster
        .bound_volume(
            "pv-old",
            json!({"hostPath": {"path": "/data/old"}}),
            "c-old",
        )
        .await;
    cluster
        .claims
        .delete("c-old", &Default::default())
        .await
        .unwrap();
    cluster
        .event(
            "pv-old",
            "Warning",
            "VolumeFailedRecycle",
            "Recycle failed: old recycler pod found, will retry later",
        )
        .await;
    cluster.gone(&old).await;
    let new = cluster.recycler("pv-old").await;
    assert_ne!(new.metadata.uid, old.metadata.uid);
    cluster
        .finish("recycler-for-pv-old", json!({"phase": "Succeeded"}))
        .await;
    cluster.phase_is("pv-old", "Available").await;

    // A recycle whose Pod never ends (no node takes it) stops with the controller.
    cluster
        .bound_volume(
            "pv-stuck",
            json!({"hostPath": {"path": "/data/stuck"}}),
            "c-stuck",
        )
        .await;
    cluster
        .claims
        .delete("c-stuck", &Default::default())
        .await
        .unwrap();
    cluster.recycler("pv-stuck").await;
    cluster.stop().await;
}

/// A recycler Pod no node runs never ends by itself (its deadline is kubelet's to enforce):
/// past its deadline and the controller's margin it is deleted, the volume marked Failed with
/// the wait in the message, and a later resync tries again with a new Pod. (Before the margin
/// was a setting, this path had no test: kube-controller-manager's recycler waits without end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycler_pod_that_never_ends_is_given_up_past_its_deadline_and_tried_again() {
    let metrics = sidecar_kit::metrics::Metrics::new().unwrap();
    let config = RecyclerConfig {
        host_path: PluginRecycler {
            template: default_template(),
            minimum_timeout: 1,
            timeout_increment: 0,
        },
        past_deadline: Duration::from_secs(2),
        ..RecyclerConfig::default()
    };
    let cluster = Cluster::start(|client| {
        PvController::with_metrics(client, default_backoff(), &metrics, Some(config))
    })
    .await;
    cluster
        .bound_volume(
            "pv-late",
            json!({"hostPath": {"path": "/data/late"}}),
            "c-late",
        )
        .await;
    cluster
        .claims
        .delete("c-late", &Default::default())
        .await
        .unwrap();
    let first = cluster.recycler("pv-late").await;
    let spec = serde_json::to_value(first.spec.clone().unwrap()).unwrap();
    assert_eq!(spec["activeDeadlineSeconds"], 1, "{spec}");
    let message =
        "Recycle failed: failed to recycle volume: recycler pod did not finish within 3 s";
    let failed = cluster.phase_is("pv-late", "Failed").await;
    assert_eq!(
        failed.status.and_then(|s| s.message).as_deref(),
        Some(message)
    );
    cluster
        .event("pv-late", "Warning", "VolumeFailedRecycle", message)
        .await;
    cluster.gone(&first).await;
    // Tried again with a new Pod (which would time out in turn: only the try is checked).
    let second = cluster.recycler("pv-late").await;
    assert_ne!(second.metadata.uid, first.metadata.uid);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_recyclers_a_hostpath_volume_is_marked_failed_as_kube_controller_manager_does() {
    let cluster = Cluster::start(|client| {
        PvController::new(
            client,
            default_backoff(),
            false,
            sidecar_kit::watch::Watches::default(),
        )
    })
    .await;
    cluster
        .bound_volume(
            "pv-hp",
            json!({"hostPath": {"path": "/data/pv-hp"}}),
            "c-hp",
        )
        .await;
    cluster
        .claims
        .delete("c-hp", &Default::default())
        .await
        .unwrap();
    let failed = cluster.phase_is("pv-hp", "Failed").await;
    assert_eq!(
        failed.status.and_then(|s| s.message).as_deref(),
        Some("No recycler plugin found for the volume!")
    );
    cluster.stop().await;
}
