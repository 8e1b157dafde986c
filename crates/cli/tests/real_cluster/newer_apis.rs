//! A cluster without the newer APIs the provisioner can use: kube-apiserver not serving
//! VolumeAttributesClass (`--runtime-config`), and neither the snapshot nor the Gateway API
//! CRDs installed. The provisioner starts with its defaults (the VolumeAttributesClass gate on)
//! and provisions and deletes as usual: it watches none of them; it reads a claim's class
//! of attributes, snapshot or ReferenceGrant only for a claim that names one.

use std::time::Duration;

use kube::Api;
use serde_json::json;

use crate::bed::{Bed, Setup};

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn the_provisioner_works_on_a_cluster_without_attributes_classes_snapshots_or_grants() {
    let mut bed = Bed::start(Setup {
        api_server_args: &["--runtime-config=storage.k8s.io/v1/volumeattributesclasses=false"],
        ..Default::default()
    })
    .await;
    // The premise: none of the three is served.
    let served = bed
        .plane
        .kubectl(&["api-resources", "-o", "name"])
        .unwrap_or_else(|e| panic!("{e}"));
    for missing in [
        "volumeattributesclasses.storage.k8s.io",
        "volumesnapshots.snapshot.storage.k8s.io",
        "referencegrants.gateway.networking.k8s.io",
    ] {
        assert!(
            !served.lines().any(|l| l == missing),
            "{missing} is served:\n{served}"
        );
    }
    assert!(
        served.lines().any(|l| l == "csinodes.storage.k8s.io"),
        "the list is whole:\n{served}"
    );

    bed.provisioner("csi-provisioner", &[], &[]).await;
    bed.class("fast", json!({"volumeBindingMode": "Immediate"}))
        .await;
    bed.claim("data", "fast", "1Gi", json!({})).await;
    bed.bound("data", WAIT).await;
    // A claim that names a class of attributes: an event says it is not there.
    bed.claim(
        "gold",
        "fast",
        "1Gi",
        json!({"spec": {"volumeAttributesClassName": "gold"}}),
    )
    .await;
    bed.until_event(
        "a ProvisioningFailed event on claim gold",
        "gold",
        WAIT,
        |e| {
            e.reason.as_deref() == Some("ProvisioningFailed")
                && e.message.as_deref().is_some_and(|m| m.contains("\"gold\""))
        },
    )
    .await;
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        bed.admin.clone(),
        "default",
    )
    .delete("gold", &Default::default())
    .await
    .unwrap();
    bed.delete_claim("data", WAIT).await;
    bed.until("the driver's volume deleted", WAIT, || async {
        bed.driver_volumes().await.is_empty()
    })
    .await;
    bed.finish().await;
}
