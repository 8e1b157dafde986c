#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec, SecretReference,
};
use k8s_openapi::api::storage::v1::{
    CSINode, CSINodeDriver, CSINodeSpec, VolumeAttachment, VolumeAttachmentSource,
    VolumeAttachmentSpec, VolumeAttachmentStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::json;

use super::attach::{Plan, World, plan};
use super::*;

const DRIVER: &str = "hostpath.csi.k8s.io";
const F: &str = "external-attacher/hostpath-csi-k8s-io";

fn driver() -> DriverView {
    DriverView {
        name: DRIVER.into(),
        publish_unpublish: true,
        publish_readonly: true,
        single_node_multi_writer: false,
        list_published: true,
    }
}

fn time() -> Time {
    Time("2026-11-23T00:00:00Z".parse().unwrap())
}

fn va(finalizers: &[&str], attached: bool) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some("csi-abc".into()),
            resource_version: Some("3".into()),
            finalizers: (!finalizers.is_empty())
                .then(|| finalizers.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: DRIVER.into(),
            node_name: "node-1".into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some("pv-1".into()),
                ..Default::default()
            },
        },
        status: Some(VolumeAttachmentStatus {
            attached,
            ..Default::default()
        }),
    }
}

fn pv() -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pv-1".into()),
            resource_version: Some("9".into()),
            finalizers: Some(vec!["kubernetes.io/pv-protection".into()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            mount_options: Some(vec!["noatime".into()]),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.into(),
                volume_handle: "vol-1".into(),
                fs_type: Some("ext4".into()),
                read_only: Some(true),
                volume_attributes: Some(BTreeMap::from([("tier".into(), "fast".into())])),
                controller_publish_secret_ref: Some(SecretReference {
                    name: Some("publish".into()),
                    namespace: Some("ns".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

fn csinode(node_id: Option<&str>) -> CSINode {
    CSINode {
        metadata: ObjectMeta {
            name: Some("node-1".into()),
            ..Default::default()
        },
        spec: CSINodeSpec {
            drivers: node_id
                .map(|id| CSINodeDriver {
                    name: DRIVER.into(),
                    node_id: id.into(),
                    ..Default::default()
                })
                .into_iter()
                .collect(),
        },
    }
}

fn deleting_va(finalizers: &[&str], attached: bool) -> VolumeAttachment {
    let mut v = va(finalizers, attached);
    v.metadata.deletion_timestamp = Some(time());
    v
}

#[test]
fn names_follow_upstream() {
    assert_eq!(finalizer(DRIVER), F);
    assert_eq!(finalizer("x.y-"), "external-attacher/x-y-X");
    assert_eq!(
        lease(DRIVER),
        "external-attacher-leader-hostpath-csi-k8s-io"
    );
}

#[test]
fn in_tree_volumes_of_a_migrated_plugin_are_attached_and_detached_by_their_csi_handle() {
    let d = DriverView {
        name: "ebs.csi.aws.com".into(),
        ..driver()
    };
    let o = Options::default();
    let mut ebs = pv();
    let spec = ebs.spec.as_mut().unwrap();
    spec.csi = None;
    spec.aws_elastic_block_store = Some(
        k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource {
            volume_id: "aws://us-east-1a/vol-0abc".into(),
            fs_type: Some("xfs".into()),
            ..Default::default()
        },
    );
    let mut bad = ebs.clone();
    bad.spec
        .as_mut()
        .unwrap()
        .aws_elastic_block_store
        .as_mut()
        .unwrap()
        .volume_id = "aws://us-east-1a/disk-9".into();
    let mut n = csinode(Some("i-1"));
    n.spec.drivers[0].name = "ebs.csi.aws.com".into();
    let world = |p| World {
        volume: Some(p),
        csinode: Some(&n),
        node: None,
        driver: &d,
        options: &o,
    };
    let mut attachment = va(&[], false);
    attachment.spec.attacher = "ebs.csi.aws.com".into();
    let Plan::Attach(a) = plan(&attachment, world(&ebs), false) else {
        panic!("an attach")
    };
    assert_eq!(a.publish.volume_id, "vol-0abc");
    assert_eq!(a.publish.node_id, "i-1");
    assert!(a.publish.migrated, "counted as migrated in the metrics");
    assert_eq!(
        a.publish.context.get("partition").map(String::as_str),
        Some("0")
    );
    let mut detaching = attachment.clone();
    detaching.metadata.deletion_timestamp = Some(time());
    detaching.metadata.finalizers = Some(vec![finalizer("ebs.csi.aws.com")]);
    let Plan::Detach(detach) = plan(&detaching, world(&ebs), false) else {
        panic!("a detach")
    };
    assert_eq!(detach.volume_id, "vol-0abc");
    assert!(detach.migrated);
    // A source that does not translate: the attach fails, saying why; the PV gets the
    // finalizer all the same (upstream adds it before translating).
    assert!(matches!(
        plan(&attachment, world(&bad), false),
        Plan::AttachFailed { message, protect_volume: Some(_), .. } if message.starts_with("failed to translate in tree pv to CSI: failed to translate Kubernetes ID to EBS Volume ID")
    ));
    // Being deleted and not translating: the deletion is what it says.
    let mut leaving = bad.clone();
    leaving.metadata.deletion_timestamp = Some(time());
    assert!(matches!(
        plan(&attachment, world(&leaving), false),
        Plan::AttachFailed { message, .. } if message.ends_with("is marked for deletion")
    ));
    // A PV with neither a CSI source nor a migrated plugin's.
    let mut nfs = pv();
    let spec = nfs.spec.as_mut().unwrap();
    spec.csi = None;
    spec.nfs = Some(k8s_openapi::api::core::v1::NFSVolumeSource {
        server: "s".into(),
        path: "/".into(),
        read_only: None,
    });
    assert!(matches!(
        plan(&attachment, world(&nfs), false),
        Plan::AttachFailed { .. }
    ));
}

#[test]
fn an_attach_protects_the_volume_and_the_attachment_before_publishing() {
    let (d, o) = (driver(), Options::default());
    let (p, n) = (pv(), csinode(Some("n1")));
    let world = World {
        volume: Some(&p),
        csinode: Some(&n),
        node: None,
        driver: &d,
        options: &o,
    };
    let Plan::Attach(a) = plan(&va(&[], false), world, false) else {
        panic!("an attach")
    };
    assert!(!a.publish.migrated, "a CSI PV is not counted as migrated");
    let json = |ops: Vec<sidecar_kit::patch_ops::Op>| serde_json::to_value(ops).unwrap();
    assert_eq!(
        a.protect_volume.map(|(pv, ops)| (pv, json(ops))),
        Some((
            "pv-1".into(),
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["kubernetes.io/pv-protection"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": F},
            ])
        ))
    );
    assert_eq!(
        a.protect_attachment.map(json),
        Some(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "3"},
            {"op": "add", "path": "/metadata/finalizers", "value": [F]},
            {"op": "add", "path": "/metadata/annotations", "value": {ANN_NODE_ID: "n1"}},
        ]))
    );
    let p2 = &a.publish;
    assert_eq!(
        (p2.volume_id.as_str(), p2.node_id.as_str()),
        ("vol-1", "n1")
    );
    assert!(p2.readonly, "spec.csi.readOnly with PUBLISH_READONLY");
    assert_eq!(p2.context.get("tier").map(String::as_str), Some("fast"));
    assert_eq!(
        p2.secret,
        Some(super::attach::SecretRef {
            namespace: "ns".into(),
            name: "publish".into()
        })
    );
    let Some(csi_proto::v1::volume_capability::AccessType::Mount(m)) = &p2.capability.access_type
    else {
        panic!("a mount")
    };
    assert_eq!(
        (m.fs_type.as_str(), m.mount_flags.clone()),
        ("ext4", vec!["noatime".to_string()])
    );
}

#[test]
fn the_reconcile_forces_the_attachments_the_driver_disagrees_with() {
    let p = pv();
    let n = csinode(Some("n1"));
    let named = |name: &str, v: VolumeAttachment| {
        let mut v = v;
        v.metadata.name = Some(name.into());
        v
    };
    let mut other = named("other-driver", va(&[], true));
    other.spec.attacher = "other".into();
    let mut no_pv = named("no-pv", va(&[], true));
    no_pv.spec.source.persistent_volume_name = Some("missing".into());
    let vas = [
        named("lost", va(&[F], true)),
        named("kept", va(&[F], true)),
        named("leftover", deleting_va(&["x"], false)),
        named("pending", va(&[], false)),
        other,
        no_pv,
    ];
    let mut published = reconcile::Published::new();
    published.insert("vol-1".into(), ["n1".to_string()].into());
    // Every attachment names vol-1 on n1: the driver says it is published there.
    let drift = reconcile::drift(
        vas.iter(),
        |name| (name == "pv-1").then_some(&p),
        |_| Some(&n),
        DRIVER,
        &published,
    );
    assert_eq!(drift, vec!["leftover".to_string(), "pending".to_string()]);
    let drift = reconcile::drift(
        vas.iter(),
        |name| (name == "pv-1").then_some(&p),
        |_| Some(&n),
        DRIVER,
        &reconcile::Published::new(),
    );
    assert_eq!(drift, vec!["lost".to_string(), "kept".to_string()]);
}

#[test]
fn the_reconcile_finds_a_migrated_gce_pd_volume_under_its_repaired_handle() {
    const PD: &str = "pd.csi.storage.gke.io";
    let mut gce = pv();
    let spec = gce.spec.as_mut().unwrap();
    spec.csi = None;
    spec.gce_persistent_disk = Some(k8s_openapi::api::core::v1::GCEPersistentDiskVolumeSource {
        pd_name: "disk-1".into(),
        ..Default::default()
    });
    gce.metadata.labels = Some(
        [(
            "topology.kubernetes.io/zone".to_string(),
            "us-central1-b".to_string(),
        )]
        .into(),
    );
    let node_id = "projects/p1/zones/us-central1-b/instances/vm-1";
    let mut n = csinode(Some(node_id));
    n.spec.drivers[0].name = PD.into();
    let mut attached = va(&[F], true);
    attached.metadata.name = Some("gce".into());
    attached.spec.attacher = PD.into();
    // The driver lists the disk under its project; the translated handle says UNSPECIFIED.
    let mut published = reconcile::Published::new();
    published.insert(
        "projects/p1/zones/us-central1-b/disks/disk-1".into(),
        [node_id.to_string()].into(),
    );
    let drift = |published: &reconcile::Published| {
        reconcile::drift(
            [&attached],
            |name| (name == "pv-1").then_some(&gce),
            |_| Some(&n),
            PD,
            published,
        )
    };
    assert_eq!(drift(&published), Vec::<String>::new(), "found: no drift");
    assert_eq!(
        drift(&reconcile::Published::new()),
        vec!["gce".to_string()],
        "not listed: lost"
    );
}

#[test]
fn a_forced_sync_stands_only_on_the_version_it_judged_with_no_own_write_pending() {
    // (judged, current, own write pending) -> force
    let rows = [
        (Some("5"), Some("5"), false, true),
        // An attach in flight: the pass saw the object before our status write reached the
        // cache; the driver already had the volume published.
        (Some("5"), Some("5"), true, false),
        // The object changed since the pass judged it (our status write, someone's edit).
        (Some("5"), Some("7"), false, false),
        (Some("5"), None, false, false),
        (None, None, false, false),
    ];
    for (judged, current, pending, want) in rows {
        assert_eq!(
            reconcile::force_stands(judged, current, pending),
            want,
            "judged {judged:?}, current {current:?}, own write pending {pending}"
        );
    }
}

#[test]
fn status_writes_are_upstreams() {
    let ctx = [("devicePath".to_string(), "/dev/x".to_string())].into();
    assert_eq!(
        status::attached(None, &ctx),
        json!({"status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"}, "attachError": null}})
    );
    assert_eq!(
        status::attached(None, &Default::default())["status"]["attachmentMetadata"],
        serde_json::Value::Null
    );
    // Published again with another context: the keys of the last one that it lacks go.
    let before = [
        ("devicePath".to_string(), "/dev/old".to_string()),
        ("lun".to_string(), "3".to_string()),
    ]
    .into();
    assert_eq!(
        status::attached(Some(&before), &ctx)["status"]["attachmentMetadata"],
        json!({"devicePath": "/dev/x", "lun": null})
    );
    assert_eq!(
        status::attached(Some(&before), &Default::default())["status"]["attachmentMetadata"],
        serde_json::Value::Null
    );
    assert_eq!(
        status::attach_error("T", "m", Some(8)),
        json!({"status": {"attachError": {"time": "T", "message": "m", "errorCode": 8}}})
    );
    assert_eq!(
        status::attach_error("T", "m", None),
        json!({"status": {"attachError": {"time": "T", "message": "m", "errorCode": null}}})
    );
    assert_eq!(
        status::detach_error("T", "m"),
        json!({"status": {"detachError": {"time": "T", "message": "m"}}})
    );
    let err = sidecar_kit::csi::CallError {
        method: "ControllerPublishVolume",
        code: tonic::Code::ResourceExhausted,
        message: "too many".into(),
    };
    assert_eq!(
        err.status_text(),
        "rpc error: code = ResourceExhausted desc = too many"
    );
}

#[test]
fn only_meaningful_changes_change_the_fingerprint() {
    let a = va(&[F], false);
    let mut errored = a.clone();
    errored.status.as_mut().unwrap().attach_error = Some(Default::default());
    errored.metadata.resource_version = Some("4".into());
    assert_eq!(fingerprint(&a), fingerprint(&errored));
    assert_ne!(fingerprint(&a), fingerprint(&va(&[F], true)));
    assert_ne!(fingerprint(&a), fingerprint(&deleting_va(&[F], false)));
    assert!(ours(&a, DRIVER) && !ours(&a, "other"));
}

mod node_id;
mod plan_table;
mod volume_finalizer;
