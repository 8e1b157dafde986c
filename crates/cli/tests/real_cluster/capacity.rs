//! Storage capacity: `--enable-capacity` with its owner found up the chain Pod → ReplicaSet →
//! Deployment that kube-controller-manager made, CSIStorageCapacity objects kube-scheduler
//! places Pods by, and kube-controller-manager's garbage collector removing them with their
//! owner (a Go client acting on what we wrote).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::bed::{Bed, Setup, manifest};
use crate::provisioning::{pod, scheduled};

const WAIT: Duration = Duration::from_secs(90);

/// The Deployment of `deploy/kubernetes/storage-capacity.yaml`, applied unchanged: its Pods
/// never run (no kubelet), but kube-controller-manager makes their ReplicaSet and the Pods,
/// one of which the provisioner is told it is (POD_NAME), as the downward API would.
async fn owner_chain(bed: &Bed) -> String {
    bed.plane
        .kubectl(&[
            "apply",
            "-f",
            &manifest("storage-capacity.yaml").display().to_string(),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    let pods: Api<Pod> = Api::namespaced(bed.admin.clone(), "default");
    bed.until_some("the Deployment's Pod", WAIT, || async {
        pods.list(&ListParams::default().labels("app=csi-provisioner"))
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
            .and_then(|p| p.metadata.name)
    })
    .await
}

#[tokio::test]
async fn capacity_is_published_owned_by_the_deployment_and_used_by_kube_scheduler() {
    let mut bed = Bed::start(Setup {
        nodes: &["node-1", "node-2"],
        driver_args: &["--capacity=10Gi"],
        storage_capacity: true,
        ..Default::default()
    })
    .await;
    bed.class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let pod_name = owner_chain(&bed).await;
    bed.provisioner(
        "csi-provisioner",
        &[
            "--enable-capacity",
            "--capacity-ownerref-level=2",
            "--capacity-poll-interval=5s",
        ],
        &[("POD_NAME", &pod_name), ("NAMESPACE", "default")],
    )
    .await;
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(bed.admin.clone(), "default");
    bed.until(
        "a CSIStorageCapacity per node, owned by the Deployment",
        WAIT,
        || async {
            let items = capacities.list(&ListParams::default()).await.unwrap().items;
            items.len() == 2
                && items.iter().all(|c| {
                    c.metadata.owner_references.as_ref().is_some_and(|o| {
                        o.len() == 1 && o[0].kind == "Deployment" && o[0].name == "csi-provisioner"
                    })
                })
        },
    )
    .await;

    // Larger than any node holds: kube-scheduler says so, from the published capacity.
    bed.claim("huge", "late", "20Gi", json!({})).await;
    bed.create::<Pod>("default", pod("too-big", "huge", None))
        .await;
    // Read from the Pod's PodScheduled condition, which kube-scheduler rewrites at every
    // attempt: its FailedScheduling Event keeps the message of the first attempt (a repeat
    // only counts up the Event's series), and a first attempt may fail for another reason,
    // such as the claim not yet in kube-scheduler's cache.
    let pods: Api<Pod> = Api::namespaced(bed.admin.clone(), "default");
    bed.until("kube-scheduler to find no node with room", WAIT, || async {
        let pod = pods.get("too-big").await.unwrap();
        pod.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message
                        .as_deref()
                        .is_some_and(|m| m.contains("did not have enough free storage"))
            })
    })
    .await;

    // 6 of node-1's 10 GiB used; the next 6 GiB fit on node-2 only.
    bed.claim("first", "late", "6Gi", json!({})).await;
    bed.create::<Pod>("default", pod("on-one", "first", Some("node-1")))
        .await;
    bed.bound("first", WAIT).await;
    bed.until("node-1's capacity to show the volume", WAIT, || async {
        capacities
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .any(|c| {
                let on_one = c
                    .node_topology
                    .as_ref()
                    .and_then(|t| t.match_labels.as_ref())
                    .is_some_and(|l| l.values().any(|v| v == "node-1"));
                on_one && c.capacity.as_ref().map(|q| q.0.as_str()) == Some("4Gi")
            })
    })
    .await;
    bed.claim("second", "late", "6Gi", json!({})).await;
    bed.create::<Pod>("default", pod("anywhere", "second", None))
        .await;
    assert_eq!(scheduled(&bed, "anywhere").await, "node-2");
    bed.bound("second", WAIT).await;

    // The garbage collector of kube-controller-manager removes the capacity objects with their
    // owner (the provisioner is stopped first: it would publish them again).
    bed.kill("csi-provisioner");
    Api::<Deployment>::namespaced(bed.admin.clone(), "default")
        .delete("csi-provisioner", &Default::default())
        .await
        .unwrap();
    bed.until(
        "the capacity objects collected with their owner",
        WAIT,
        || async {
            capacities
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        },
    )
    .await;
    bed.finish().await;
}
