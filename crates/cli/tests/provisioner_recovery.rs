//! csi-provisioner's recovery of volumes in flight: a crash between CreateVolume and the PV,
//! with the intent log or with listed volumes, and the claims and volumes that change meanwhile.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Cluster, DRIVER};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

const T: Duration = Duration::from_secs(15);

/// A volume the driver made while the provisioner saw an error, a crash, the claim deleted
/// while the provisioner is down: after the restart the volume is deleted. `mode` is the
/// `--in-flight-recovery` way (`restarted` the restart's); with `list-volumes` a volume of
/// another cluster is made first (its id is returned).
async fn crash_with_a_volume_in_flight(mode: &str, restarted: &str) -> (Cluster, Option<String>) {
    let mut c = Cluster::start(
        &[],
        &["--timeout=500ms", &format!("--in-flight-recovery={mode}")],
        false,
    )
    .await;
    c.class("plain", json!({})).await;
    // Another cluster's provisioner made this volume on the same driver, for a claim this
    // cluster never had.
    let foreign = if mode == "list-volumes" {
        Some(foreign_volume(&c).await)
    } else {
        None
    };
    // The driver makes the volume but answers UNAVAILABLE: the provisioner must assume it exists.
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("victim", "plain", "1Gi", json!({}), true).await;
    c.wait_event("victim", "ProvisioningFailed", "Unavailable")
        .await;
    let made = usize::from(foreign.is_some()) + 1;
    assert_eq!(c.driver_volumes().await, made);
    c.kill_provisioner();
    c.delete_claim("victim").await;
    c.faults("");
    for arg in &mut c.provisioner_args {
        if arg.starts_with("--in-flight-recovery=") {
            *arg = format!("--in-flight-recovery={restarted}");
        }
    }
    c.start_provisioner();
    c.wait_until(
        "the volume of the deleted claim to be deleted after the restart",
        T,
        || async { c.driver_volumes().await == made - 1 },
    )
    .await;
    let pvs = Api::<PersistentVolume>::all(c.client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    assert!(pvs.items.is_empty(), "and no PV was made for it");
    (c, foreign)
}

/// A log written to a file, checked to carry no terminal colour sequences (`ESC [ ... m`):
/// colours are for terminals only.
fn plain_log(log: &str) -> String {
    assert!(
        !log.contains('\u{1b}'),
        "a log written to a file carries colour codes: {log}"
    );
    log.to_string()
}

/// A volume marked as another cluster's (the recoverable-volumes convention), for a claim
/// named `default/gone`; returns its id.
async fn foreign_volume(c: &Cluster) -> String {
    use sidecar_kit::recoverable;
    let channel = sidecar_kit::csi::connect(&c.socket).await.unwrap();
    let mut client = csi_proto::v1::controller_client::ControllerClient::new(channel);
    let parameters = [
        (recoverable::CLUSTER, "another-cluster"),
        (recoverable::SERIAL, "1.0"),
        (recoverable::CLAIM, "default/gone"),
        (
            recoverable::CLAIM_UID,
            "0d1e2f30-0000-4000-8000-000000000000",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let request = csi_proto::v1::CreateVolumeRequest {
        name: "pvc-0d1e2f30-0000-4000-8000-000000000000".into(),
        capacity_range: Some(csi_proto::v1::CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![csi_proto::v1::VolumeCapability::mount(
            "",
            csi_proto::v1::volume_capability::access_mode::Mode::SingleNodeWriter,
        )],
        parameters,
        ..Default::default()
    };
    client
        .create_volume(request)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

#[tokio::test]
async fn a_crash_while_a_volume_is_in_flight_and_a_deleted_claim_leave_no_volume_with_the_intent_log()
 {
    let (c, _) = crash_with_a_volume_in_flight("intent-log", "intent-log").await;
    assert!(
        c.provisioner_log()
            .contains("recovered in-flight volumes from the intent log"),
        "the restart found the volume in the log"
    );
}

#[tokio::test]
async fn a_crash_while_a_volume_is_in_flight_and_a_deleted_claim_leave_no_volume_with_listed_volumes()
 {
    let (c, foreign) = crash_with_a_volume_in_flight("list-volumes", "list-volumes").await;
    let log = plain_log(&c.provisioner_log());
    assert!(
        log.contains("the claim of a listed volume is gone"),
        "the restart found the volume among the driver's: {log}"
    );
    // The same listing saw the other cluster's volume and took back only this cluster's.
    assert!(log.contains(TOOK_BACK_ONE), "{log}");
    let foreign = foreign.unwrap();
    assert_eq!(
        c.driver_volume_ids().await,
        vec![foreign],
        "another cluster's volume is left alone"
    );
    // Nothing was recorded before CreateVolume: the only Lease writes made the listed
    // volumes' Lease and wrote each start's epoch in it.
    let writes = c.api_writes("csi-provisioner");
    let leases = |verb: &str| {
        writes
            .get(&(verb.to_string(), "leases".to_string()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!((leases("CREATE"), leases("UPDATE")), (1, 2), "{writes:?}");
    assert_eq!(
        writes
            .iter()
            .filter(|((_, resource), _)| resource == "leases")
            .map(|(_, n)| n)
            .sum::<u64>(),
        3,
        "{writes:?}"
    );
    assert!(c.intent_shards().await.iter().all(|(_, v)| v.is_empty()));
}

/// A listed volume whose claim and provisioning secret were both deleted while the
/// provisioner was down is deleted all the same (DeleteVolume without the secret), as a PV's
/// deletion goes on without an unreadable secret; it used to wait for the secret for ever.
#[tokio::test]
async fn a_listed_volume_whose_claim_and_secret_are_gone_is_deleted_without_the_secret() {
    let mut c = Cluster::start(
        &[],
        &["--timeout=500ms", "--in-flight-recovery=list-volumes"],
        false,
    )
    .await;
    c.apply::<k8s_openapi::api::core::v1::Secret>(
        json!({"metadata": {"name": "creds"}, "stringData": {"password": "hunter2"}}),
    )
    .await;
    c.class(
        "guarded",
        json!({"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "creds",
                              "csi.storage.k8s.io/provisioner-secret-namespace": "default"}}),
    )
    .await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("orphan", "guarded", "1Gi", json!({}), true).await;
    c.wait_event("orphan", "ProvisioningFailed", "Unavailable")
        .await;
    assert_eq!(c.driver_volumes().await, 1);
    c.kill_provisioner();
    c.delete_claim("orphan").await;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client.clone(), "default")
        .delete("creds", &DeleteParams::default())
        .await
        .unwrap();
    c.faults("");
    c.start_provisioner();
    c.wait_until(
        "the listed volume deleted without its secret",
        T,
        || async { c.driver_volumes().await == 0 },
    )
    .await;
    assert!(
        c.provisioner_log()
            .contains("deleting the volume without its deletion secret"),
        "the secret was asked for and missed"
    );
}

#[tokio::test]
async fn a_switch_either_way_after_a_crash_finishes_what_the_other_way_left() {
    for (before, after) in [
        ("list-volumes", "intent-log"),
        ("intent-log", "list-volumes"),
    ] {
        let (c, _) = crash_with_a_volume_in_flight(before, after).await;
        let log = plain_log(&c.provisioner_log());
        let found = if before == "list-volumes" {
            "the claim of a listed volume is gone"
        } else {
            "recovered in-flight volumes from the intent log"
        };
        assert!(log.contains(found), "{before} then {after}: {log}");
    }
}

#[tokio::test]
async fn a_listed_volume_whose_claim_stays_becomes_its_pv_and_the_marks_stay_off_the_pv() {
    let mut c = Cluster::start(
        &[],
        &["--timeout=500ms", "--in-flight-recovery=list-volumes"],
        false,
    )
    .await;
    c.class("plain", json!({})).await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    let claim = c.claim("kept", "plain", "1Gi", json!({}), true).await;
    c.wait_event("kept", "ProvisioningFailed", "Unavailable")
        .await;
    let made = c.driver_volume_ids().await;
    assert_eq!(made.len(), 1);
    c.kill_provisioner();
    c.faults("");
    c.start_provisioner();
    let pv = c.wait_pv(&claim, T).await;
    let csi = pv.spec.and_then(|s| s.csi).unwrap();
    assert_eq!(
        vec![csi.volume_handle],
        made,
        "the volume made before the crash"
    );
    let attributes = csi.volume_attributes.unwrap_or_default();
    assert!(
        attributes
            .keys()
            .all(|k| !sidecar_kit::recoverable::is_mark(k)),
        "{attributes:?}"
    );
    assert!(plain_log(&c.provisioner_log()).contains(TOOK_BACK_ONE));
}

#[tokio::test]
async fn a_volume_in_flight_when_a_retained_one_settles_is_still_taken_back() {
    let mut c = Cluster::start(&[], &["--in-flight-recovery=list-volumes"], true).await;
    // The first attempt's retry is an hour away: its volume stays in flight.
    c.kill_provisioner();
    for arg in &mut c.provisioner_args {
        if arg.starts_with("--retry-interval-") {
            *arg = format!("{}=1h", arg.split('=').next().unwrap_or_default());
        }
    }
    c.start_provisioner();
    c.class("keep", json!({"reclaimPolicy": "Retain"})).await;
    c.class("drop", json!({})).await;
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("stuck", "drop", "1Gi", json!({}), false).await;
    c.wait_event("stuck", "ProvisioningFailed", "Unavailable")
        .await;
    c.faults("");
    let stuck = c.driver_volume_ids().await;
    assert_eq!(stuck.len(), 1);
    let kept = c.claim("kept", "keep", "1Gi", json!({}), false).await;
    let kept_pv = c.wait_pv(&kept, T).await;
    c.wait_until("what is settled to pass the retained volume", T, || async {
        settled(&c).await == Some(("1.2".to_string(), "1.0".to_string()))
    })
    .await;
    c.kill_provisioner();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    for claim in ["stuck", "kept"] {
        claims
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
    }
    let kept_name = kept_pv.metadata.name.clone().unwrap();
    pvs.delete(&kept_name, &DeleteParams::default())
        .await
        .unwrap();
    c.wait_until("the retained PV to go", T, || async {
        pvs.get_opt(&kept_name).await.unwrap().is_none()
    })
    .await;
    c.start_provisioner();
    c.wait_until("the volume in flight to be deleted", T, || async {
        c.driver_volumes().await == 1
    })
    .await;
    let handle = kept_pv.spec.and_then(|s| s.csi).unwrap().volume_handle;
    assert_eq!(
        c.driver_volume_ids().await,
        vec![handle],
        "the retained one stays"
    );
    assert!(plain_log(&c.provisioner_log()).contains(TOOK_BACK_ONE));
}

/// What the provisioner logs when its start-up listing took back one volume.
const TOOK_BACK_ONE: &str =
    "listed the driver's volumes: took back this cluster's without a PV volumes=1";

/// The settled mark in the listed volumes' Lease.
async fn settled_mark(c: &Cluster) -> Option<String> {
    settled(c).await.map(|(mark, _)| mark)
}

/// The settled mark and the unsettled serials in the listed volumes' Lease.
async fn settled(c: &Cluster) -> Option<(String, String)> {
    let name = format!("{}-listed", sidecar_kit::leader::lease_name(DRIVER));
    Api::<k8s_openapi::api::coordination::v1::Lease>::all(c.client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|l| l.metadata.name.as_deref() == Some(name.as_str()))
        .and_then(|l| l.metadata.annotations)
        .and_then(|a| {
            let mark = a.get("volstack.dev/settled")?.clone();
            Some((mark, a.get("volstack.dev/unsettled")?.clone()))
        })
}

#[tokio::test]
async fn retained_volumes_whose_pv_and_claim_are_deleted_are_never_taken_back() {
    let mut c = Cluster::start(&[], &["--in-flight-recovery=list-volumes"], true).await;
    c.class("keep", json!({"reclaimPolicy": "Retain"})).await;
    c.class("drop", json!({})).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let pvs: Api<PersistentVolume> = Api::all(c.client.clone());
    // Retain from the start: the settled mark passes the volume once its PV is saved.
    let kept = c.claim("kept", "keep", "1Gi", json!({}), false).await;
    let kept_pv = c.wait_pv(&kept, T).await;
    c.wait_until("the settled mark to pass the first volume", T, || async {
        settled_mark(&c).await.as_deref() == Some("1.1")
    })
    .await;
    // Delete, then changed to Retain: the mark moves when the change is seen.
    let changed = c.claim("changed", "drop", "1Gi", json!({}), false).await;
    let changed_pv = c.wait_pv(&changed, T).await;
    let changed_name = changed_pv.metadata.name.clone().unwrap();
    pvs.patch(
        &changed_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
    )
    .await
    .unwrap();
    c.wait_until("the settled mark to pass the second volume", T, || async {
        settled_mark(&c).await.as_deref() == Some("1.2")
    })
    .await;
    for (claim, pv) in [("kept", &kept_pv), ("changed", &changed_pv)] {
        claims
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
        let name = pv.metadata.name.clone().unwrap();
        pvs.delete(&name, &DeleteParams::default()).await.unwrap();
        c.wait_until("the PV to go", T, || async {
            pvs.get_opt(&name).await.unwrap().is_none()
        })
        .await;
    }
    assert_eq!(c.driver_volumes().await, 2);
    c.kill_provisioner();
    c.start_provisioner();
    c.wait_until("the restart's listing", T, || async {
        plain_log(&c.provisioner_log())
            .matches("listed the driver's volumes: took back this cluster's without a PV volumes=0")
            .count()
            == 2
    })
    .await;
    assert_eq!(c.driver_volumes().await, 2, "both volumes are kept");
}

/// A crash while a claim's volume is in flight, and the claim bound to another volume before the
/// restart (a pool's, or one a person made): the volume made for it is deleted and its record
/// dropped. Before, the bound claim was skipped and both stayed for ever.
#[tokio::test]
async fn a_volume_in_flight_for_a_claim_bound_elsewhere_meanwhile_is_deleted_after_a_crash() {
    let mut c = Cluster::start(
        &[],
        &["--timeout=500ms", "--in-flight-recovery=intent-log"],
        false,
    )
    .await;
    c.class("plain", json!({})).await;
    // The driver makes the volume but answers UNAVAILABLE: the provisioner must assume it exists.
    c.faults("CreateVolume=error:UNAVAILABLE:1:after\n");
    c.claim("victim", "plain", "1Gi", json!({}), true).await;
    c.wait_event("victim", "ProvisioningFailed", "Unavailable")
        .await;
    assert_eq!(c.driver_volumes().await, 1);
    c.kill_provisioner();
    // While it is down, the claim is bound to a volume someone made by hand.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), "default");
    let uid = claims.get("victim").await.unwrap().metadata.uid.unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "by-hand"},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "plain",
            "claimRef": {"namespace": "default", "name": "victim", "uid": uid},
            "csi": {"driver": DRIVER, "volumeHandle": "made-by-hand"}
        }
    }))
    .unwrap();
    Api::<PersistentVolume>::all(c.client.clone())
        .create(&Default::default(), &pv)
        .await
        .unwrap();
    claims
        .patch(
            "victim",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeName": "by-hand"}})),
        )
        .await
        .unwrap();
    c.faults("");
    c.start_provisioner();
    c.wait_until(
        "the volume made for the claim deleted and its record dropped",
        T,
        || async { c.driver_volumes().await == 0 && intent_volumes(&c).await.is_empty() },
    )
    .await;
    assert!(
        c.provisioner_log()
            .contains("recovered in-flight volumes from the intent log"),
        "the restart found the volume in the log"
    );
}

/// Names of the volumes the intent log records.
async fn intent_volumes(c: &Cluster) -> Vec<String> {
    c.intent_shards()
        .await
        .into_iter()
        .flat_map(|(_, volumes)| volumes)
        .collect()
}

#[tokio::test]
async fn already_exists_keeps_the_intent_and_the_volume_is_cleaned_up_when_the_claim_goes() {
    let c = Cluster::start(&[], &["--in-flight-recovery=intent-log"], false).await;
    c.class("plain", json!({})).await;
    // A volume of this name exists with other parameters (as far as the driver says).
    c.faults("CreateVolume=error:ALREADY_EXISTS:1:after\n");
    let claim = c.claim("clash", "plain", "1Gi", json!({}), true).await;
    let name = format!("pvc-{}", claim.metadata.uid.clone().unwrap());
    c.wait_event("clash", "ProvisioningFailed", "AlreadyExists")
        .await;
    // The conflict is reported and the record kept: a volume of that name exists.
    assert!(
        intent_volumes(&c).await.contains(&name),
        "the intent record was dropped on ALREADY_EXISTS"
    );
    assert_eq!(c.driver_volumes().await, 1);
    Api::<PersistentVolumeClaim>::namespaced(c.client.clone(), "default")
        .delete("clash", &DeleteParams::default())
        .await
        .unwrap();
    c.faults("");
    c.wait_until("the conflicting volume to be deleted", T, || async {
        c.driver_volumes().await == 0
    })
    .await;
    c.wait_until(
        "the intent record to go",
        Duration::from_secs(30),
        || async { !intent_volumes(&c).await.contains(&name) },
    )
    .await;
}

/// A volume in flight for a claim that is gone, found in the intent log while the driver
/// cannot create or delete (no CREATE_DELETE_VOLUME): the record is kept and tried again, and
/// no try reads its secret or announces a deletion it cannot make.
#[tokio::test]
async fn a_record_in_flight_stays_unread_while_the_driver_cannot_provision() {
    use provisioner::controller::intents::Record;
    let mut c = Cluster::start(
        &["--disable=create-delete"],
        &["--timeout=500ms", "--in-flight-recovery=intent-log"],
        false,
    )
    .await;
    c.apply::<k8s_openapi::api::core::v1::Secret>(
        json!({"metadata": {"name": "creds"}, "stringData": {"password": "hunter2"}}),
    )
    .await;
    c.kill_provisioner();
    // What a predecessor against a driver that could provision left: a CreateVolume in
    // flight for a claim deleted since.
    let volume = "pvc-0d1e2f30-0000-4000-8000-000000000002";
    let request = csi_proto::v1::CreateVolumeRequest {
        name: volume.into(),
        capacity_range: Some(csi_proto::v1::CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let record = Record::new(
        "default",
        "gone",
        "0d1e2f30-0000-4000-8000-000000000002",
        &request,
        Some(("default".into(), "creds".into())),
        false,
    );
    let records = json!({ volume: record }).to_string();
    let shard = format!("{}-intents", sidecar_kit::leader::lease_name(DRIVER));
    let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        c.client.clone(),
        "kube-system",
    );
    let annotations = json!({provisioner::controller::intents::ANNOTATION: records});
    if leases.get_opt(&shard).await.unwrap().is_some() {
        leases
            .patch(
                &shard,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .unwrap();
    } else {
        let lease = serde_json::from_value(json!({
            "metadata": {"name": shard, "namespace": "kube-system", "annotations": annotations},
        }))
        .unwrap();
        leases.create(&Default::default(), &lease).await.unwrap();
    }
    c.start_provisioner();
    let words = "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported";
    // The start's warning, then two tries refused.
    c.wait_until("two tries refused in upstream's words", T, || async {
        c.provisioner_log().matches(words).count() >= 3
    })
    .await;
    let log = plain_log(&c.provisioner_log());
    assert!(
        log.contains("recovered in-flight volumes from the intent log"),
        "{log}"
    );
    assert!(
        !log.contains("claim is gone while its volume may exist: deleting the volume"),
        "a deletion announced that cannot be made: {log}"
    );
    let secret_reads: u64 = c
        .stack
        .server
        .request_counts()
        .into_iter()
        .filter(|((_, resource, _, client), _)| {
            client == "csi-provisioner" && resource == "secrets"
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(secret_reads, 0, "the secret was read for a call never made");
    let kept = c.intent_shards().await;
    assert!(
        kept.iter()
            .any(|(_, volumes)| volumes == &[volume.to_string()]),
        "the record stays: {kept:?}"
    );
}
