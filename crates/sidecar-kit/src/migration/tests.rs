#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

use super::*;

fn class(provisioner: &str, params: Value, topologies: Value) -> StorageClass {
    serde_json::from_value(json!({
        "metadata": {"name": "c"},
        "provisioner": provisioner,
        "parameters": params,
        "allowedTopologies": topologies,
    }))
    .unwrap()
}

fn pv(spec: Value, labels: Value, annotations: Value) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": "pv-1", "labels": labels, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn value<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap()
}

#[test]
fn every_plugin_has_its_driver_and_back() {
    for plugin in Plugin::ALL {
        assert_eq!(
            Plugin::from_in_tree_name(plugin.in_tree_name()),
            Some(plugin)
        );
        assert_eq!(Plugin::from_csi_name(plugin.csi_name()), Some(plugin));
    }
    // (in-tree name, driver)
    let table = [
        ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
        ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
        ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
        ("kubernetes.io/azure-file", "file.csi.azure.com"),
        ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
        ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
        ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
    ];
    for (in_tree, driver) in table {
        assert_eq!(
            Plugin::from_in_tree_name(in_tree).unwrap().csi_name(),
            driver
        );
    }
    assert_eq!(Plugin::from_csi_name("hostpath.csi.volstack.dev"), None);
    assert_eq!(
        Plugin::from_in_tree_name("kubernetes.io/AWS-EBS"),
        None,
        "exact"
    );
}

#[test]
fn classes_are_translated_as_each_plugin_does() {
    let zone_term = |key: &str, values: Value| json!([{"matchLabelExpressions": [{"key": key, "values": values}]}]);
    // (provisioner, parameters, allowedTopologies, parameters after, allowedTopologies after)
    let table = [
        (
            "kubernetes.io/aws-ebs",
            json!({"FsType": "xfs", "type": "gp3", "iopsPerGB": "10", "zones": "us-east-1a,us-east-1b"}),
            Value::Null,
            json!({"csi.storage.k8s.io/fstype": "xfs", "type": "gp3", "iopsPerGB": "10", "allowautoiopspergbincrease": "true"}),
            zone_term(
                "topology.ebs.csi.aws.com/zone",
                json!(["us-east-1a", "us-east-1b"]),
            ),
        ),
        (
            "kubernetes.io/aws-ebs",
            json!({"type": "gp2"}),
            zone_term(
                "failure-domain.beta.kubernetes.io/zone",
                json!(["us-east-1a"]),
            ),
            json!({"type": "gp2"}),
            zone_term("topology.ebs.csi.aws.com/zone", json!(["us-east-1a"])),
        ),
        (
            "kubernetes.io/gce-pd",
            json!({"fstype": "ext4", "replication-type": "regional-pd", "zone": "europe-west1-b"}),
            Value::Null,
            json!({"csi.storage.k8s.io/fstype": "ext4", "replication-type": "regional-pd"}),
            zone_term("topology.gke.io/zone", json!(["europe-west1-b"])),
        ),
        (
            "kubernetes.io/azure-disk",
            json!({"fstype": "ext4", "skuname": "Premium_LRS"}),
            zone_term("topology.kubernetes.io/zone", json!(["westeurope-1", "0"])),
            json!({"fstype": "ext4", "skuname": "Premium_LRS"}),
            zone_term(
                "topology.disk.csi.azure.com/zone",
                json!(["westeurope-1", ""]),
            ),
        ),
        (
            "kubernetes.io/azure-file",
            json!({"skuName": "Standard_LRS"}),
            Value::Null,
            json!({"skuName": "Standard_LRS"}),
            Value::Null,
        ),
        (
            "kubernetes.io/cinder",
            json!({"fstype": "ext4", "availability": "nova", "zone": "z"}),
            zone_term("topology.kubernetes.io/zone", json!(["nova"])),
            json!({"csi.storage.k8s.io/fstype": "ext4", "availability": "nova", "zone": "z"}),
            zone_term("topology.cinder.csi.openstack.org/zone", json!(["nova"])),
        ),
        (
            "kubernetes.io/vsphere-volume",
            json!({"fstype": "ext4", "StoragePolicyName": "gold", "datastore": "ds1", "diskformat": "thin", "unknown": "x"}),
            Value::Null,
            json!({"csi.storage.k8s.io/fstype": "ext4", "storagepolicyname": "gold", "datastore-migrationparam": "ds1", "diskformat-migrationparam": "thin", "csimigration": "true"}),
            Value::Null,
        ),
    ];
    for (provisioner, params, topologies, want_params, want_topologies) in table {
        let translated =
            class_to_csi(provisioner, &class(provisioner, params.clone(), topologies)).unwrap();
        assert_eq!(
            value(&translated.parameters),
            want_params,
            "{provisioner} {params}"
        );
        assert_eq!(
            value(&translated.allowed_topologies),
            want_topologies,
            "{provisioner} {params}"
        );
        assert_eq!(
            translated.provisioner, provisioner,
            "the class keeps its provisioner"
        );
    }
    // Portworx: its secret names fill the six CSI secrets, and the provisioner is the driver.
    let px = class_to_csi(
        "kubernetes.io/portworx-volume",
        &class(
            "kubernetes.io/portworx-volume",
            json!({"repl": "2", "openstorage.io/auth-secret-name": "px", "openstorage.io/auth-secret-namespace": "kube-system"}),
            Value::Null,
        ),
    )
    .unwrap();
    let params = px.parameters.unwrap();
    assert_eq!(params.len(), 13, "{params:?}");
    assert_eq!(params["csi.storage.k8s.io/provisioner-secret-name"], "px");
    assert_eq!(
        params["csi.storage.k8s.io/node-expand-secret-namespace"],
        "kube-system"
    );
    assert!(!params.contains_key("openstorage.io/auth-secret-name"));
    assert_eq!(px.provisioner, "pxd.portworx.com");
    // Refused: zones beside allowedTopologies, a plugin that is not migrated.
    let both = class(
        "kubernetes.io/aws-ebs",
        json!({"zone": "a"}),
        zone_term("topology.kubernetes.io/zone", json!(["b"])),
    );
    assert_eq!(
        class_to_csi("kubernetes.io/aws-ebs", &both)
            .unwrap_err()
            .to_string(),
        "cannot simultaneously set allowed topologies and zone/zones parameters"
    );
    assert_eq!(
        class_to_csi("kubernetes.io/nfs", &both)
            .unwrap_err()
            .to_string(),
        "could not find in-tree storage class parameter translation logic for \"kubernetes.io/nfs\""
    );
}

#[test]
fn in_tree_volumes_become_csi_volumes_of_the_driver() {
    let affinity = |key: &str, values: Value| json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]}});
    // (spec, labels, annotations, csi source after, node affinity after, access modes after)
    let table = [
        (
            json!({"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0abc", "fsType": "ext4", "partition": 2, "readOnly": true}, "accessModes": ["ReadWriteOnce"]}),
            json!({"topology.kubernetes.io/zone": "us-east-1a"}),
            Value::Null,
            json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0abc", "fsType": "ext4", "readOnly": true, "volumeAttributes": {"partition": "2"}}),
            affinity("topology.ebs.csi.aws.com/zone", json!(["us-east-1a"])),
            json!(["ReadWriteOnce"]),
        ),
        (
            json!({"gcePersistentDisk": {"pdName": "disk-1"}, "accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                   "nodeAffinity": affinity("failure-domain.beta.kubernetes.io/zone", json!(["europe-west1-b"]))}),
            json!({"failure-domain.beta.kubernetes.io/zone": "europe-west1-b"}),
            Value::Null,
            json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/zones/europe-west1-b/disks/disk-1", "volumeAttributes": {"partition": ""}}),
            affinity("topology.gke.io/zone", json!(["europe-west1-b"])),
            json!(["ReadWriteOnce"]),
        ),
        (
            json!({"gcePersistentDisk": {"pdName": "regional"}}),
            json!({"topology.kubernetes.io/zone": "europe-west1-b__europe-west1-c"}),
            Value::Null,
            json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/UNSPECIFIED/regions/europe-west1/disks/regional", "volumeAttributes": {"partition": ""}}),
            affinity(
                "topology.gke.io/zone",
                json!(["europe-west1-b", "europe-west1-c"]),
            ),
            Value::Null,
        ),
        (
            json!({"azureDisk": {"diskName": "d", "diskURI": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d", "cachingMode": "ReadOnly", "fsType": "ext4", "kind": "Managed"}}),
            Value::Null,
            Value::Null,
            json!({"driver": "disk.csi.azure.com", "volumeHandle": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d", "fsType": "ext4",
                   "volumeAttributes": {"kind": "Managed", "cachingmode": "ReadOnly", "fstype": "ext4"}}),
            Value::Null,
            Value::Null,
        ),
        (
            json!({"azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": "apps"}}),
            Value::Null,
            json!({"kubernetes.io/azure-file-resource-group": "rg"}),
            json!({"driver": "file.csi.azure.com", "volumeHandle": "rg#acct#share#pv-1#apps", "volumeAttributes": {"sharename": "share"},
                   "nodeStageSecretRef": {"name": "azure-storage-account-acct-secret", "namespace": "apps"}}),
            Value::Null,
            Value::Null,
        ),
        (
            json!({"cinder": {"volumeID": "c-1", "fsType": "ext4"}}),
            json!({"topology.kubernetes.io/zone": "nova"}),
            Value::Null,
            json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "c-1", "fsType": "ext4", "volumeAttributes": {}}),
            affinity("topology.cinder.csi.openstack.org/zone", json!(["nova"])),
            Value::Null,
        ),
        (
            json!({"vsphereVolume": {"volumePath": "[ds1] kubevols/x.vmdk", "fsType": "ext4", "storagePolicyName": "gold"}}),
            json!({"topology.kubernetes.io/zone": "z1"}),
            Value::Null,
            json!({"driver": "csi.vsphere.vmware.com", "volumeHandle": "[ds1] kubevols/x.vmdk", "fsType": "ext4", "volumeAttributes": {"storagepolicyname": "gold"}}),
            affinity("topology.csi.vmware.com/zone", json!(["z1"])),
            Value::Null,
        ),
        (
            json!({"portworxVolume": {"volumeID": "px-1", "fsType": "ext4", "readOnly": true}}),
            Value::Null,
            json!({"openstorage.io/auth-secret-name": "s", "openstorage.io/auth-secret-namespace": "ns"}),
            json!({"driver": "pxd.portworx.com", "volumeHandle": "px-1", "fsType": "ext4", "volumeAttributes": {},
                   "controllerPublishSecretRef": {"name": "s", "namespace": "ns"}, "nodeStageSecretRef": {"name": "s", "namespace": "ns"},
                   "nodePublishSecretRef": {"name": "s", "namespace": "ns"}, "controllerExpandSecretRef": {"name": "s", "namespace": "ns"},
                   "nodeExpandSecretRef": {"name": "s", "namespace": "ns"}}),
            Value::Null,
            Value::Null,
        ),
    ];
    for (spec, labels, annotations, want_csi, want_affinity, want_modes) in table {
        let before = pv(spec.clone(), labels.clone(), annotations);
        assert!(is_migratable(&before));
        let after = pv_to_csi(&before).unwrap();
        let s = after.spec.as_ref().unwrap();
        assert_eq!(value(&s.csi), want_csi, "{spec}");
        assert_eq!(value(&s.node_affinity), want_affinity, "{spec}");
        assert_eq!(value(&s.access_modes), want_modes, "{spec}");
        assert_eq!(
            Plugin::of_spec(s),
            None,
            "the in-tree source is gone: {spec}"
        );
        assert_eq!(value(&after.metadata.labels), labels, "labels kept: {spec}");
    }
}

#[test]
fn csi_volumes_of_a_migrated_driver_become_in_tree_volumes() {
    let affinity = |key: &str, values: Value| json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]}});
    // (csi source, node affinity, in-tree source after, labels after, node affinity after)
    let table = [
        (
            json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0abc", "fsType": "ext4", "volumeAttributes": {"partition": "1"}}),
            affinity("topology.ebs.csi.aws.com/zone", json!(["us-west-2a"])),
            (
                "awsElasticBlockStore",
                json!({"volumeID": "vol-0abc", "fsType": "ext4", "partition": 1}),
            ),
            json!({"topology.kubernetes.io/zone": "us-west-2a", "topology.kubernetes.io/region": "us-west-2"}),
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-west-2"]}]}]}}),
        ),
        (
            json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones/europe-west1-b/disks/disk-1", "volumeAttributes": {"partition": ""}}),
            affinity("topology.gke.io/zone", json!(["europe-west1-b"])),
            ("gcePersistentDisk", json!({"pdName": "disk-1"})),
            json!({"topology.kubernetes.io/zone": "europe-west1-b", "topology.kubernetes.io/region": "europe-west1"}),
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["europe-west1-b"]},
                {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["europe-west1"]}]}]}}),
        ),
        (
            json!({"driver": "disk.csi.azure.com", "volumeHandle": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d1", "volumeAttributes": {"CachingMode": "None"}}),
            Value::Null,
            (
                "azureDisk",
                json!({"diskName": "d1", "diskURI": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d1",
                                  "cachingMode": "None", "fsType": "", "readOnly": false, "kind": "Managed"}),
            ),
            Value::Null,
            Value::Null,
        ),
        (
            json!({"driver": "file.csi.azure.com", "volumeHandle": "rg#acct#share#pv#ns"}),
            Value::Null,
            (
                "azureFile",
                json!({"secretName": "azure-storage-account-acct-secret", "shareName": "share", "secretNamespace": "default"}),
            ),
            Value::Null,
            Value::Null,
        ),
        (
            json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "c-1"}),
            affinity("topology.cinder.csi.openstack.org/zone", json!(["nova"])),
            ("cinder", json!({"volumeID": "c-1"})),
            json!({"topology.kubernetes.io/zone": "nova"}),
            affinity("topology.kubernetes.io/zone", json!(["nova"])),
        ),
        (
            json!({"driver": "csi.vsphere.vmware.com", "volumeHandle": "h", "volumeAttributes": {"initialvolumefilepath": "[ds1] x.vmdk"}}),
            affinity("topology.csi.vmware.com/zone", json!(["z1", "z2"])),
            ("vsphereVolume", json!({"volumePath": "[ds1] x.vmdk"})),
            json!({"topology.kubernetes.io/zone": "z1"}),
            affinity("topology.kubernetes.io/zone", json!(["z1", "z2"])),
        ),
        (
            json!({"driver": "pxd.portworx.com", "volumeHandle": "px-1", "readOnly": true}),
            Value::Null,
            (
                "portworxVolume",
                json!({"volumeID": "px-1", "readOnly": true}),
            ),
            Value::Null,
            Value::Null,
        ),
    ];
    for (csi, affinity_before, (field, want_source), want_labels, want_affinity) in table {
        let before = pv(
            json!({"csi": csi, "nodeAffinity": affinity_before}),
            Value::Null,
            Value::Null,
        );
        let after = pv_to_in_tree(&before).unwrap();
        let spec = value(after.spec.as_ref().unwrap());
        assert_eq!(spec[field], want_source, "{csi}");
        assert_eq!(spec.get("csi"), None, "{csi}");
        assert_eq!(value(&after.metadata.labels), want_labels, "{csi}");
        assert_eq!(
            spec.get("nodeAffinity").cloned().unwrap_or(Value::Null),
            want_affinity,
            "{csi}"
        );
        assert!(is_migratable(&after));
    }
    // The Azure file resource group comes back as the annotation.
    let file = pv_to_in_tree(&pv(
        json!({"csi": {"driver": "file.csi.azure.com", "volumeHandle": "rg#acct#share#pv#ns"}}),
        Value::Null,
        Value::Null,
    ))
    .unwrap();
    assert_eq!(
        file.metadata.annotations.unwrap()["kubernetes.io/azure-file-resource-group"],
        "rg"
    );
}

#[test]
fn translations_that_cannot_be_made_say_why() {
    let in_tree = |spec: Value| {
        pv_to_csi(&pv(spec, Value::Null, Value::Null))
            .unwrap_err()
            .to_string()
    };
    let to_tree = |csi: Value| {
        pv_to_in_tree(&pv(json!({"csi": csi}), Value::Null, Value::Null))
            .unwrap_err()
            .to_string()
    };
    // (what it says, the error)
    let table = [
        (
            in_tree(json!({"nfs": {"server": "s", "path": "/"}})),
            "could not find in-tree plugin translation logic for \"pv-1\"",
        ),
        (
            in_tree(json!({"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/disk-9"}})),
            "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://us-east-1a/disk-9)",
        ),
        (
            in_tree(json!({"azureDisk": {"diskName": "d", "diskURI": "u", "kind": "Shared"}})),
            "kind(Shared) is not supported in csi migration",
        ),
        (
            in_tree(json!({"azureFile": {"secretName": "s", "shareName": "x"}})),
            "could not find a secret namespace in PersistentVolumeSource or ClaimRef",
        ),
        (
            to_tree(json!({"driver": "hostpath.csi.volstack.dev", "volumeHandle": "h"})),
            "could not find in-tree plugin translation logic for hostpath.csi.volstack.dev",
        ),
        (
            to_tree(
                json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/disks/d"}),
            ),
            "failed to get id components.Got: 4, wanted 6 components or more. ",
        ),
        (
            to_tree(
                json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "volumeAttributes": {"partition": "x"}}),
            ),
            "failed to convert partition x to integer",
        ),
        (
            to_tree(json!({"driver": "disk.csi.azure.com", "volumeHandle": "not-a-uri"})),
            "could not get disk name from not-a-uri",
        ),
        (
            to_tree(json!({"driver": "file.csi.azure.com", "volumeHandle": "only#one"})),
            "error parsing volume id: \"only#one\", should at least contain two #",
        ),
    ];
    for (error, want) in table {
        assert!(
            error.starts_with(want),
            "{error:?} does not start with {want:?}"
        );
    }
    let no_csi = pv_to_in_tree(&pv(json!({}), Value::Null, Value::Null)).unwrap_err();
    assert_eq!(no_csi, TranslateError::NoCsiSource);
}

#[test]
fn a_round_trip_gives_back_the_in_tree_volume() {
    let before = pv(
        json!({"awsElasticBlockStore": {"volumeID": "vol-0abc", "fsType": "ext4"},
               "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]},
                   {"key": "topology.kubernetes.io/region", "operator": "In", "values": ["us-east-1"]}]}]}}}),
        json!({"topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1"}),
        Value::Null,
    );
    let back = pv_to_in_tree(&pv_to_csi(&before).unwrap()).unwrap();
    let mut want = value(&before);
    want["spec"]["awsElasticBlockStore"]["partition"] = json!(0);
    assert_eq!(value(&back), want);
}

#[test]
fn regions_are_told_from_zones_as_each_cloud_names_them() {
    let z = |zones: &[&str]| zones.iter().map(|z| z.to_string()).collect::<Vec<_>>();
    assert_eq!(
        topology::aws_region(&z(&["us-west-2a"])).unwrap(),
        "us-west-2"
    );
    assert_eq!(
        topology::aws_region(&z(&["us-west-2-lax-1a"])).unwrap(),
        "us-west-2",
        "a local zone"
    );
    assert_eq!(
        topology::aws_region(&z(&["us-gov-east-1a"])).unwrap(),
        "us-gov-east-1"
    );
    assert_eq!(
        topology::aws_region(&z(&["us-east-1-wl1-bos-wlz-1"])).unwrap(),
        "us-east-1"
    );
    assert!(
        topology::aws_region(&z(&["nowhere"]))
            .unwrap_err()
            .contains("is not a valid AWS zone")
    );
    assert!(
        topology::aws_region(&z(&["us-west-2a", "us-east-1a"]))
            .unwrap_err()
            .contains("multiple or no regions")
    );
    assert_eq!(
        topology::gce_region(&z(&["europe-west1-b", "europe-west1-c"])).unwrap(),
        "europe-west1"
    );
    assert!(
        topology::gce_region(&z(&["a-b"]))
            .unwrap_err()
            .contains("expected: {locale}-{region}-{zone}")
    );
    assert_eq!(topology::gce_region(&[]).unwrap_err(), "no zones specified");
}
