//! Tables of the storage kinds' checks, with kube-apiserver's messages.
#![allow(clippy::unwrap_used)]
use serde_json::json;

use super::*;

#[test]
fn a_capacitys_class_and_segment_are_fixed_once_made() {
    let old = json!({"storageClassName": "a", "capacity": "1Gi", "nodeTopology": {"matchLabels": {"zone": "z1"}}});
    let mut grown = old.clone();
    grown["capacity"] = json!("2Gi");
    assert_eq!(storage_capacity(&grown, Some(&old)), Ok(()));
    let mut moved = old.clone();
    moved["storageClassName"] = json!("b");
    assert_eq!(
        storage_capacity(&moved, Some(&old)),
        Err(r#"storageClassName: Invalid value: "b": field is immutable"#.to_string())
    );
    let mut elsewhere = old.clone();
    elsewhere["nodeTopology"] = json!({"matchLabels": {"a": "b"}});
    assert_eq!(
        storage_capacity(&elsewhere, Some(&old)),
        Err(
            r#"nodeTopology: Invalid value: {"matchLabels":{"a":"b"}}: field is immutable"#
                .to_string()
        )
    );
}

#[test]
fn a_volumes_source_is_fixed_once_made() {
    let pv = |source: Value| {
        let mut spec = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]});
        for (key, value) in source.as_object().unwrap() {
            spec[key] = value.clone();
        }
        json!({"metadata": {"name": "pv"}, "spec": spec})
    };
    let csi = pv(json!({"csi": {"driver": "d", "volumeHandle": "h"}}));
    let refused = "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation";
    let rows = [
        (csi.clone(), csi.clone(), Ok(())),
        (
            csi.clone(),
            pv(json!({"csi": {"driver": "d", "volumeHandle": "h2"}})),
            Err(refused.to_string()),
        ),
        (
            csi.clone(),
            pv(json!({"hostPath": {"path": "/x"}})),
            Err(refused.to_string()),
        ),
        // The one change allowed: a node-expansion secret where there was none.
        (
            csi.clone(),
            pv(
                json!({"csi": {"driver": "d", "volumeHandle": "h", "nodeExpandSecretRef": {"name": "s", "namespace": "n"}}}),
            ),
            Ok(()),
        ),
        // A hostPath stored without a type reads as type "".
        (
            pv(json!({"hostPath": {"path": "/x"}})),
            pv(json!({"hostPath": {"path": "/x", "type": ""}})),
            Ok(()),
        ),
    ];
    for (old, new, want) in rows {
        assert_eq!(persistent_volume(&new, Some(&old)), want, "{old} -> {new}");
    }
}

#[test]
fn each_type_is_checked_with_kube_apiservers_words() {
    let pv = |spec: Value| json!({"metadata": {"name": "pv"}, "spec": spec});
    let csi = json!({"driver": "d", "volumeHandle": "h"});
    let cases: Vec<(Check, Option<&str>)> = vec![
        (
            persistent_volume(
                &pv(
                    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": csi}),
                ),
                None,
            ),
            None,
        ),
        (
            persistent_volume(
                &pv(json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]})),
                None,
            ),
            Some("spec: Required value: must specify a volume type"),
        ),
        (
            persistent_volume(
                &pv(
                    json!({"capacity": {"storage": "0"}, "accessModes": ["ReadWriteOnce"], "csi": csi}),
                ),
                None,
            ),
            Some("spec.capacity[storage]: Invalid value: \"0\": must be greater than zero"),
        ),
        (
            persistent_volume(
                &pv(
                    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": csi, "persistentVolumeReclaimPolicy": "Bogus"}),
                ),
                None,
            ),
            Some(
                "spec.persistentVolumeReclaimPolicy: Unsupported value: \"Bogus\": supported values: \"Delete\", \"Recycle\", \"Retain\"",
            ),
        ),
        (
            persistent_volume(
                &pv(
                    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d"}}),
                ),
                None,
            ),
            Some("spec.csi.volumeHandle: Required value"),
        ),
        (
            persistent_volume(
                &pv(
                    json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "csi": csi, "hostPath": {"path": "/"}}),
                ),
                None,
            ),
            Some("spec.csi: Forbidden: may not specify more than 1 volume type"),
        ),
        (
            storage_class(
                &json!({"provisioner": "p", "volumeBindingMode": "Later"}),
                None,
            ),
            Some(
                "volumeBindingMode: Unsupported value: \"Later\": supported values: \"Immediate\", \"WaitForFirstConsumer\"",
            ),
        ),
        (
            storage_class(
                &json!({"provisioner": "p", "reclaimPolicy": "Recycle"}),
                None,
            ),
            Some(
                "reclaimPolicy: Unsupported value: \"Recycle\": supported values: \"Delete\", \"Retain\"",
            ),
        ),
        (
            storage_class(&json!({"provisioner": "p q"}), None),
            Some("provisioner: Invalid value: \"p q\""),
        ),
        (
            storage_class(
                &json!({"provisioner": "p", "parameters": {"a": "2"}}),
                Some(&json!({"provisioner": "p", "parameters": {"a": "1"}})),
            ),
            Some("parameters: Forbidden: updates to parameters are forbidden."),
        ),
        (
            csi_driver(
                &json!({"metadata": {"name": "d"}, "spec": {"fsGroupPolicy": "Some"}}),
                None,
            ),
            Some("spec.fsGroupPolicy: Unsupported value: \"Some\""),
        ),
        (
            csi_driver(
                &json!({"metadata": {"name": "d"}, "spec": {"attachRequired": false}}),
                Some(&json!({"spec": {"attachRequired": true}})),
            ),
            Some("spec.attachRequired: Invalid value: false: field is immutable"),
        ),
        (
            csi_node(
                &json!({"spec": {"drivers": [{"name": "d", "nodeID": "n"}, {"name": "d", "nodeID": "n"}]}}),
                None,
            ),
            Some("spec.drivers[1].name: Duplicate value: \"d\""),
        ),
        (
            csi_node(&json!({"spec": {"drivers": [{"name": "d"}]}}), None),
            Some("spec.drivers[0].nodeID: Required value"),
        ),
        (
            csi_node(
                &json!({"spec": {"drivers": [{"name": "d", "nodeID": "n", "topologyKeys": ["bad key"]}]}}),
                None,
            ),
            Some("spec.drivers[0].topologyKeys[0]: Invalid value: \"bad key\""),
        ),
        (
            volume_attachment(
                &json!({"spec": {"attacher": "a", "nodeName": "n", "source": {}}}),
                None,
            ),
            Some(
                "spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName",
            ),
        ),
        (
            volume_attachment(
                &json!({"spec": {"attacher": "a", "nodeName": "m", "source": {"persistentVolumeName": "p"}}}),
                Some(
                    &json!({"spec": {"attacher": "a", "nodeName": "n", "source": {"persistentVolumeName": "p"}}}),
                ),
            ),
            Some("spec: Invalid value"),
        ),
        (
            storage_capacity(
                &json!({"storageClassName": "fast", "capacity": "-1Gi"}),
                None,
            ),
            Some("capacity: Invalid value: \"-1Gi\": must be greater than or equal to 0"),
        ),
        (
            storage_capacity(&json!({"capacity": "1Gi"}), None),
            Some("storageClassName: Required value"),
        ),
        (
            lease(&json!({"spec": {"leaseDurationSeconds": 0}})),
            Some("spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"),
        ),
        (
            core_event(
                &json!({"metadata": {"namespace": "a"}, "involvedObject": {"namespace": "b"}}),
            ),
            Some("involvedObject.namespace: Invalid value: \"b\": does not match event.namespace"),
        ),
        (
            core_event(&json!({"metadata": {"namespace": "a"}, "type": "Fatal"})),
            Some("type: Unsupported value: \"Fatal\""),
        ),
        (
            event(
                &json!({"eventTime": "2026-11-23T10:00:00.000000Z", "reportingController": "c", "reportingInstance": "i", "action": "A", "reason": "R"}),
            ),
            Some("type: Required value"),
        ),
    ];
    for (i, (got, expected)) in cases.into_iter().enumerate() {
        match expected {
            None => assert_eq!(got, Ok(()), "case {i}"),
            Some(expected) => {
                let error = got.unwrap_err();
                assert!(error.starts_with(expected), "case {i}: {error}");
            }
        }
    }
}

#[test]
fn a_listed_drivers_node_id_and_topology_keys_are_fixed() {
    let old = json!({"spec": {"drivers": [
        {"name": "d.example.com", "nodeID": "n1", "topologyKeys": ["zone"], "allocatable": {"count": 3}}]}});
    let rows = [
        (
            json!({"spec": {"drivers": [{"name": "d.example.com", "nodeID": "n1", "topologyKeys": ["zone"], "allocatable": {"count": 5}}]}}),
            None,
        ),
        (
            json!({"spec": {"drivers": [{"name": "d.example.com", "nodeID": "n2"}]}}),
            Some(
                r#"spec.drivers: Invalid value: {"Name":"d.example.com","NodeID":"n2","TopologyKeys":null,"Allocatable":null}: field is immutable"#,
            ),
        ),
        (
            json!({"spec": {"drivers": [{"name": "d.example.com", "nodeID": "n1", "topologyKeys": ["zone", "rack"]}]}}),
            Some(
                r#"spec.drivers: Invalid value: {"Name":"d.example.com","NodeID":"n1","TopologyKeys":["zone","rack"],"Allocatable":null}: field is immutable"#,
            ),
        ),
        (
            json!({"spec": {"drivers": [{"name": "other.example.com", "nodeID": "n9"}]}}),
            None,
        ),
        (json!({"spec": {}}), None),
    ];
    for (node, want) in rows {
        assert_eq!(csi_node(&node, Some(&old)).err().as_deref(), want, "{node}");
    }
    let no_keys = json!({"spec": {"drivers": [{"name": "d", "nodeID": "n", "topologyKeys": []}]}});
    let absent = json!({"spec": {"drivers": [{"name": "d", "nodeID": "n"}]}});
    assert_eq!(csi_node(&absent, Some(&no_keys)), Ok(()));
}
