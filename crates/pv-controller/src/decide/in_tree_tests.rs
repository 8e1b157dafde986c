//! Classes of the in-tree plugins kube-controller-manager registers (helpers from the binder's
//! tests).

use super::*;

/// nfs, local-volume and csi are found but do not provision; hostPath does, and that is off in
/// kube-controller-manager by default: the claim is annotated first, then refused (a data
/// source before the annotations, mount options, or provisioning disabled).
#[test]
fn in_tree_plugin_classes_are_refused_in_kube_controller_managers_words() {
    // The plugins kube-controller-manager registers: found, but only hostPath provisions,
    // and that is off there by default (annotated first, then refused).
    let mut registered = Vec::new();
    for (name, plugin) in [
        ("nfs", "kubernetes.io/nfs"),
        ("local", "kubernetes.io/local-volume"),
        ("csi", "kubernetes.io/csi"),
        ("host", "kubernetes.io/host-path"),
    ] {
        registered.push(sc(name, plugin, false));
    }
    let mut mounted = sc("host-mounted", "kubernetes.io/host-path", false);
    mounted.mount_options = Some(vec!["ro".into(), "noatime".into()]);
    registered.push(mounted);
    for name in ["nfs", "local", "csi"] {
        assert_eq!(
            dc(&claim("c", Some(name), "1Gi"), &[], &registered, None),
            ClaimAction::provisioning_failed("no provisionable volume plugin matched".into()),
            "{name}"
        );
    }
    assert_eq!(
        dc(&claim("c", Some("host"), "1Gi"), &[], &registered, None),
        ClaimAction::ProvisionRefused {
            provisioner: "kubernetes.io/host-path".into(),
            annotated: false,
            message: "Failed to create provisioner: provisioning in volume plugin \"kubernetes.io/host-path\" is disabled".into(),
        }
    );
    let mut annotated = claim("c", Some("host-mounted"), "1Gi");
    annotated.metadata.annotations = Some(BTreeMap::from([(
        ANN_STORAGE_PROVISIONER.to_string(),
        "kubernetes.io/host-path".to_string(),
    )]));
    assert_eq!(
        dc(&annotated, &[], &registered, None),
        ClaimAction::ProvisionRefused {
            provisioner: "kubernetes.io/host-path".into(),
            annotated: true,
            message: "Mount options are not supported by the provisioner but StorageClass \"host-mounted\" has mount options [ro noatime]".into(),
        }
    );
    let mut cloned = claim("c", Some("host"), "1Gi");
    cloned.spec.as_mut().unwrap().data_source = Some(Default::default());
    assert_eq!(
        dc(&cloned, &[], &registered, None),
        ClaimAction::provisioning_failed(
            "plugin \"kubernetes.io/host-path\" is not a CSI plugin. Only CSI plugin can provision a claim with a datasource".into()
        )
    );
}
