//! Attach and detach: kube-controller-manager's attach/detach controller makes a
//! VolumeAttachment for a Pod's volume on its node, `csi-attacher` attaches it, and detaches it
//! when the Pod is gone; the volume is deleted after.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::bed::{Bed, Setup, manifest};
use crate::provisioning::{delete_pod, pod};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn kube_controller_managers_attachments_are_attached_and_detached_by_our_attacher() {
    let mut bed = Bed::start(Setup {
        manifests: vec![manifest("rbac.yaml"), manifest("attacher-rbac.yaml")],
        driver_args: &["--enable-attach"],
        attach_required: true,
        ..Default::default()
    })
    .await;
    bed.provisioner("csi-provisioner", &[], &[]).await;
    bed.attacher("csi-attacher", &[]).await;
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    bed.claim("data", "fast", "1Gi", json!({})).await;
    let volume = bed.bound("data", WAIT).await;
    let name = volume.metadata.name.clone().unwrap();

    // A Pod already on node-1 (as if scheduled): the attach/detach controller attaches its volume.
    let mut on_node = pod("app", "data", None);
    on_node["spec"]["nodeName"] = json!("node-1");
    bed.create::<Pod>("default", on_node).await;
    let attached = bed
        .until_some("the volume attached to node-1", WAIT, || async {
            bed.attachments().await.into_iter().find(|va| {
                va.spec.source.persistent_volume_name.as_deref() == Some(name.as_str())
                    && va.status.as_ref().is_some_and(|s| s.attached)
            })
        })
        .await;
    assert_eq!(attached.spec.node_name, "node-1");
    let finalizers = attached.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers
            .iter()
            .any(|f| f.starts_with("external-attacher/")),
        "{finalizers:?}"
    );

    delete_pod(&bed, "app").await;
    bed.no_attachments(WAIT).await;
    bed.delete_claim("data", WAIT).await;
    bed.until("the driver's volumes deleted", WAIT, || async {
        bed.driver_volumes().await.is_empty()
    })
    .await;
    bed.finish().await;
}
