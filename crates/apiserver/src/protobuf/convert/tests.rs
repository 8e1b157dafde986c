use serde_json::json;

use super::decode::format_time;
use super::*;
use crate::protobuf::wire;
use serde_json::Value;

fn schema() -> &'static Schema {
    Schema::builtin()
}

fn round_trip(message: &str, object: Value) -> Value {
    let s = schema();
    let m = s.message(message).unwrap();
    let bytes = encode(s, m, object.as_object().unwrap(), &[], "").unwrap();
    Value::Object(decode(s, m, &bytes, "").unwrap())
}

#[test]
fn objects_survive_json_to_protobuf_and_back() {
    let cases = [
        (
            "PersistentVolume",
            json!({"metadata": {"name": "pv1", "labels": {"a": "b"}, "creationTimestamp": "2026-11-23T10:00:00Z",
                    "managedFields": [{"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
                   "spec": {"capacity": {"storage": "1Gi"}, "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"k": "v"}},
                            "accessModes": ["ReadWriteOnce"], "claimRef": {"name": "c", "namespace": "default", "uid": "u"},
                            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "sc", "volumeMode": "Filesystem",
                            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["x"]}]}]}}},
                   "status": {"phase": "Bound"}}),
        ),
        (
            "PersistentVolumeClaim",
            json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "", "resources": {"requests": {"storage": "5Gi"}}}}),
        ),
        (
            "Secret",
            json!({"metadata": {"name": "s"}, "data": {"p": "cQ=="}, "type": "Opaque"}),
        ),
        (
            "Lease",
            json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "", "leaseDurationSeconds": 15, "leaseTransitions": 0,
                    "renewTime": "2026-11-23T10:00:00.123456Z"}}),
        ),
        (
            "CSIDriver",
            json!({"metadata": {"name": "d"}, "spec": {"attachRequired": false, "podInfoOnMount": true}}),
        ),
        (
            "Deployment",
            json!({"metadata": {"name": "d"}, "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "nginx", "image": "nginx", "resources": {}}]}},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}}}, "status": {}}),
        ),
        (
            "Pod",
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}, {"name": "cm", "configMap": {"name": "x"}}],
                    "securityContext": {"supplementalGroups": [1, 2]}}}),
        ),
        (
            "VolumeAttachment",
            json!({"metadata": {"name": "va"}, "spec": {"attacher": "a", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
                   "status": {"attached": false, "attachError": {"message": "m", "time": "2026-11-23T10:00:00Z"}}}),
        ),
        (
            "SelfSubjectReview",
            json!({"metadata": {}, "status": {"userInfo": {"username": "u", "groups": ["g"], "extra": {"k": ["a", "b"]}}}}),
        ),
    ];
    for (message, object) in cases {
        assert_eq!(round_trip(message, object.clone()), object, "{message}");
    }
}

#[test]
fn zero_values_from_go_are_dropped_unless_the_go_field_is_a_pointer() {
    // What a Go client sends for a claim with an explicit empty class: every string of
    // ObjectMeta is written, empty ones too.
    let s = schema();
    let m = s.message("PersistentVolumeClaim").unwrap();
    let mut meta = Vec::new();
    wire::put_delimited(&mut meta, 1, b"c");
    wire::put_delimited(&mut meta, 2, b"");
    wire::put_delimited(&mut meta, 6, b"");
    wire::put_varint_field(&mut meta, 7, 0);
    let mut time = Vec::new();
    wire::put_varint_field(&mut time, 1, 0);
    wire::put_varint_field(&mut time, 2, 0);
    wire::put_delimited(&mut meta, 8, &time);
    let mut spec = Vec::new();
    wire::put_delimited(&mut spec, 3, b"");
    wire::put_delimited(&mut spec, 5, b"");
    let mut resources = Vec::new();
    wire::put_delimited(&mut spec, 2, &resources);
    resources.clear();
    let mut pvc = Vec::new();
    wire::put_delimited(&mut pvc, 1, &meta);
    wire::put_delimited(&mut pvc, 2, &spec);
    wire::put_delimited(&mut pvc, 3, &[]);
    // A field this server does not know, zero: nothing is lost by skipping it.
    wire::put_varint_field(&mut pvc, 99, 0);
    let object = decode(s, m, &pvc, "").unwrap();
    assert_eq!(
        Value::Object(object),
        json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "", "resources": {}}, "status": {}})
    );
}

#[test]
fn what_cannot_be_converted_is_an_error_naming_the_place() {
    let s = schema();
    let pvc = s.message("PersistentVolumeClaim").unwrap();
    let mut unknown = Vec::new();
    wire::put_varint_field(&mut unknown, 99, 1);
    let e = decode(s, pvc, &unknown, "PersistentVolumeClaim").unwrap_err();
    assert!(
        e.to_string()
            .contains("field number 99 of PersistentVolumeClaim"),
        "{e}"
    );
    let mut wrong = Vec::new();
    wire::put_varint_field(&mut wrong, 1, 1);
    let e = decode(s, pvc, &wrong, "x").unwrap_err();
    assert_eq!(e.to_string(), "x.metadata: not a valid embedded message");
    let cases = [
        (
            json!({"spec": {"bogus": 1}}),
            "x.spec.bogus: no protobuf field",
        ),
        (
            json!({"spec": {"accessModes": "RWO"}}),
            "x.spec.accessModes: expected a list",
        ),
        (
            json!({"metadata": {"creationTimestamp": "yesterday"}}),
            "expected an RFC 3339 time",
        ),
        (
            json!({"metadata": {"generation": "1"}}),
            "expected an integer",
        ),
    ];
    for (object, expected) in cases {
        let e = encode(s, pvc, object.as_object().unwrap(), &[], "x").unwrap_err();
        assert!(e.to_string().contains(expected), "{e}");
    }
}

#[test]
fn times_parse_with_fractions_and_offsets() {
    assert_eq!(parse_time("1970-01-01T00:00:10Z"), Some((10, 0)));
    assert_eq!(
        parse_time("1970-01-01T00:00:10.5Z"),
        Some((10, 500_000_000))
    );
    assert_eq!(parse_time("1970-01-01T01:00:10+01:00"), Some((10, 0)));
    assert_eq!(parse_time("1970-01-01T00:00:10"), None);
    assert_eq!(parse_time("1970-01-01T00:00:10+1"), None);
    assert_eq!(
        format_time(10, 123_456_789, true),
        json!("1970-01-01T00:00:10.123456Z")
    );
    assert_eq!(format_time(0, 0, false), Value::Null);
}
