//! The volume's finalizer: when it goes.

use super::*;

#[test]
fn the_volume_finalizer_goes_once_the_volume_is_deleted_and_no_attachment_names_it() {
    let mut p = pv();
    p.metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into(), F.into()]);
    assert_eq!(
        volume::release(&p, F, DRIVER, false),
        None,
        "not being deleted"
    );
    p.metadata.deletion_timestamp = Some(time());
    assert_eq!(volume::release(&p, F, DRIVER, true), None, "still named");
    assert_eq!(
        volume::release(&p, F, DRIVER, false).map(|ops| serde_json::to_value(ops).unwrap()),
        Some(json!([
            {"op": "test", "path": "/metadata/finalizers/1", "value": F},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ]))
    );
    p.metadata.finalizers = None;
    assert_eq!(volume::release(&p, F, DRIVER, false), None, "not ours");
}

/// As upstream: an in-tree PV of a migrated plugin that is not marked migrated to our driver
/// (CSI migration turned off, or rolled back) loses our finalizer once no attachment names it,
/// although it is not being deleted, so the in-tree attach/detach controller has it back.
#[test]
fn an_in_tree_volume_no_longer_migrated_to_us_loses_the_finalizer() {
    const EBS: &str = "ebs.csi.aws.com";
    let ours = "external-attacher/ebs-csi-aws-com";
    let mut ebs = pv();
    ebs.metadata.finalizers = Some(vec![ours.into()]);
    let spec = ebs.spec.as_mut().unwrap();
    spec.csi = None;
    spec.aws_elastic_block_store = Some(
        k8s_openapi::api::core::v1::AWSElasticBlockStoreVolumeSource {
            volume_id: "aws://us-east-1a/vol-0abc".into(),
            ..Default::default()
        },
    );
    let migrated = |to: Option<&str>| {
        let mut p = ebs.clone();
        p.metadata.annotations =
            to.map(|d| BTreeMap::from([("pv.kubernetes.io/migrated-to".to_string(), d.into())]));
        p
    };
    // (PV, named by an attachment, releasable); released when releasable and not named.
    let cases = [
        (migrated(Some(EBS)), false, false),
        (migrated(Some("other.csi.example.com")), false, true),
        (migrated(None), false, true),
        (migrated(None), true, true),
    ];
    for (i, (p, named, releasable)) in cases.into_iter().enumerate() {
        assert_eq!(volume::releasable(&p, EBS), releasable, "case {i}");
        assert_eq!(
            volume::release(&p, ours, EBS, named).is_some(),
            releasable && !named,
            "case {i}"
        );
    }
    // A CSI PV is never handed back.
    let mut csi = pv();
    csi.metadata.finalizers = Some(vec![F.into()]);
    assert!(!volume::releasable(&csi, DRIVER));
}
