//! The server's protobuf checked against an independent implementation of Kubernetes'
//! messages (the k8s-pb crate, generated from Kubernetes' own .proto files): every kind the
//! stack uses goes in as JSON, out as protobuf, through k8s-pb's types, back in as protobuf
//! and out as JSON again, unchanged.

#![allow(clippy::unwrap_used)]

use http_body_util::BodyExt;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::{Value, json};

mod table;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

struct Server {
    _server: apiserver::RunningServer,
    client: kube::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start() -> Server {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(apiserver::Config::default(), async {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    Server {
        _server: server,
        client,
        _stop: tx,
    }
}

struct Answer {
    code: u16,
    content_type: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        assert_eq!(self.content_type, "application/json");
        serde_json::from_slice(&self.body).unwrap()
    }
}

async fn call(
    s: &Server,
    method: &str,
    path: &str,
    content_type: &str,
    accept: &str,
    body: Vec<u8>,
) -> Answer {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .header("accept", accept)
        .body(kube::client::Body::from(body))
        .unwrap();
    let response = s.client.send(request).await.unwrap();
    let code = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Answer {
        code,
        content_type,
        body,
    }
}

/// Wraps a message in kube-apiserver's envelope, with k8s-pb's `runtime.Unknown`.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = b"k8s\0".to_vec();
    unknown.encode(&mut out).unwrap();
    out
}

/// Opens an envelope: (apiVersion, kind, message bytes).
fn open(bytes: &[u8]) -> (String, String, Vec<u8>) {
    let body = bytes.strip_prefix(b"k8s\0").expect("the k8s\\0 prefix");
    let unknown = Unknown::decode(body).unwrap();
    let type_meta = unknown.type_meta.unwrap();
    (
        type_meta.api_version.unwrap(),
        type_meta.kind.unwrap(),
        unknown.raw.unwrap_or_default(),
    )
}

/// The fields that change on every write.
fn comparable(mut object: Value) -> Value {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
        meta.remove("generation");
    }
    object
}

/// JSON in, protobuf out into `T`, `T` back in as protobuf, JSON out: unchanged. Then list
/// and delete in protobuf.
async fn round_trip<T: Message + Default + std::fmt::Debug, L: Message + Default>(
    s: &Server,
    collection: &str,
    api_version: &str,
    kind: &str,
    object: Value,
) {
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let created = call(
        s,
        "POST",
        collection,
        "application/json",
        "application/json",
        object.to_string().into_bytes(),
    )
    .await;
    assert_eq!(
        created.code,
        201,
        "{kind}: {}",
        String::from_utf8_lossy(&created.body)
    );
    let created = created.json();
    let path = format!("{collection}/{name}");

    let got = call(s, "GET", &path, "", &format!("{PROTOBUF}, */*"), Vec::new()).await;
    assert_eq!(
        (got.code, got.content_type.as_str()),
        (200, PROTOBUF),
        "{kind}"
    );
    let (v, k, raw) = open(&got.body);
    assert_eq!((v.as_str(), k.as_str()), (api_version, kind));
    let typed =
        T::decode(raw.as_slice()).unwrap_or_else(|e| panic!("{kind}: k8s-pb cannot read it: {e}"));

    let put = call(
        s,
        "PUT",
        &path,
        PROTOBUF,
        PROTOBUF,
        envelope(api_version, kind, typed.encode_to_vec()),
    )
    .await;
    assert_eq!(
        put.code,
        200,
        "{kind}: {}",
        String::from_utf8_lossy(&put.body)
    );
    assert_eq!(put.content_type, PROTOBUF);
    T::decode(open(&put.body).2.as_slice()).unwrap();

    let after = call(s, "GET", &path, "", "application/json", Vec::new())
        .await
        .json();
    assert_eq!(
        comparable(after),
        comparable(created),
        "{kind} changed on its way through protobuf"
    );

    // A merge patch (patches are JSON by definition), answered in protobuf.
    let patched = call(
        s,
        "PATCH",
        &path,
        "application/merge-patch+json",
        PROTOBUF,
        br#"{"metadata":{"labels":{"patched":"yes"}}}"#.to_vec(),
    )
    .await;
    assert_eq!(
        (patched.code, patched.content_type.as_str()),
        (200, PROTOBUF),
        "{kind}"
    );
    let typed = T::decode(open(&patched.body).2.as_slice()).unwrap();
    assert!(
        format!("{typed:?}").contains("\"patched\""),
        "{kind}: {typed:?}"
    );
    // A watch from the beginning sends it as a protobuf frame k8s-pb reads.
    let (event_type, raw) = first_watch_event(s, collection).await;
    assert_eq!(event_type, "ADDED", "{kind}");
    let (_, watched_kind, raw) = open(&raw);
    assert_eq!(watched_kind, kind);
    T::decode(raw.as_slice()).unwrap();

    let list = call(s, "GET", collection, "", PROTOBUF, Vec::new()).await;
    assert_eq!(list.code, 200);
    let (_, list_kind, raw) = open(&list.body);
    assert_eq!(list_kind, format!("{kind}List"));
    let list = L::decode(raw.as_slice()).unwrap();
    assert!(!list.encode_to_vec().is_empty());

    let options = meta::DeleteOptions {
        propagation_policy: Some("Background".into()),
        ..Default::default()
    };
    let deleted = call(
        s,
        "DELETE",
        &path,
        PROTOBUF,
        PROTOBUF,
        envelope("meta.k8s.io/v1", "DeleteOptions", options.encode_to_vec()),
    )
    .await;
    assert_eq!(
        deleted.code,
        200,
        "{kind}: {}",
        String::from_utf8_lossy(&deleted.body)
    );
    // The fixture has a finalizer: the object is being deleted and says so.
    let deleting = T::decode(open(&deleted.body).2.as_slice()).unwrap();
    assert!(
        format!("{deleting:?}").contains("deletion_timestamp: Some"),
        "{kind}: {deleting:?}"
    );
    let gone = call(
        s,
        "GET",
        &format!("{collection}/missing"),
        "",
        PROTOBUF,
        Vec::new(),
    )
    .await;
    assert_eq!(gone.code, 404);
    let (_, status_kind, raw) = open(&gone.body);
    assert_eq!(status_kind, "Status");
    let status = meta::Status::decode(raw.as_slice()).unwrap();
    assert_eq!(status.reason.as_deref(), Some("NotFound"));
    assert_eq!(status.code, Some(404));
}

/// The first event of a protobuf watch of `collection` from the beginning: its type and the
/// enveloped object.
async fn first_watch_event(s: &Server, collection: &str) -> (String, Vec<u8>) {
    let mut watch = ProtobufWatch::open(s, collection).await;
    watch.next().await
}

/// A protobuf watch from the beginning (`resourceVersion=0`), read frame by frame.
struct ProtobufWatch {
    body: kube::client::Body,
    buffer: Vec<u8>,
}

impl ProtobufWatch {
    async fn open(s: &Server, collection: &str) -> Self {
        let request = http::Request::builder()
            .uri(format!("{collection}?watch=true&resourceVersion=0"))
            .header("accept", format!("{PROTOBUF}, */*"))
            .body(kube::client::Body::empty())
            .unwrap();
        let response = s.client.send(request).await.unwrap();
        assert_eq!(
            response.headers()["content-type"],
            "application/vnd.kubernetes.protobuf;stream=watch"
        );
        ProtobufWatch {
            body: response.into_body(),
            buffer: Vec::new(),
        }
    }

    /// The next event: its type and the enveloped object.
    async fn next(&mut self) -> (String, Vec<u8>) {
        loop {
            let b = &self.buffer;
            if b.len() >= 4 {
                let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
                if b.len() >= 4 + len {
                    let event = meta::WatchEvent::decode(&b[4..4 + len]).unwrap();
                    self.buffer.drain(..4 + len);
                    return (event.r#type.unwrap(), event.object.unwrap().raw.unwrap());
                }
            }
            let frame = self.body.frame().await.unwrap().unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }
}

#[tokio::test]
async fn every_kind_the_stack_uses_round_trips_through_protobuf() {
    use k8s_pb::api::coordination::v1 as coordination;
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::api::events::v1 as events;
    use k8s_pb::api::storage::v1 as storage;
    let s = start().await;
    let time = "2026-11-23T10:00:00Z";
    let micro = "2026-11-23T10:00:00.123456Z";
    let meta = |name: &str| {
        json!({"name": name, "labels": {"app": "x"}, "annotations": {"a": "b"}, "finalizers": ["example.com/f"],
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u1", "controller": false, "blockOwnerDeletion": true}]})
    };
    let core_ns = "/api/v1/namespaces/default";
    round_trip::<core::PersistentVolume, core::PersistentVolumeList>(&s, "/api/v1/persistentvolumes", "v1", "PersistentVolume", json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": meta("pv1"),
        "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "csi": {"driver": "hostpath.csi.volstack.dev", "volumeHandle": "h1", "readOnly": true, "fsType": "ext4",
                "volumeAttributes": {"k": "v"}, "nodeStageSecretRef": {"name": "s", "namespace": "n"},
                "controllerExpandSecretRef": {"name": "s2", "namespace": "n"}},
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "c", "uid": "u", "apiVersion": "v1", "resourceVersion": "5"},
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast", "mountOptions": ["ro"], "volumeMode": "Block",
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "topology/zone", "operator": "In", "values": ["a", "b"]}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}},
            "volumeAttributesClassName": "gold"}})).await;
    round_trip::<core::PersistentVolumeClaim, core::PersistentVolumeClaimList>(&s, &format!("{core_ns}/persistentvolumeclaims"), "v1", "PersistentVolumeClaim", json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta("c1"),
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}},
            "selector": {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "k", "operator": "Exists"}]},
            "storageClassName": "", "volumeMode": "Filesystem",
            "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s"},
            "dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s"}}})).await;
    round_trip::<storage::StorageClass, storage::StorageClassList>(&s, "/apis/storage.k8s.io/v1/storageclasses", "storage.k8s.io/v1", "StorageClass", json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta("fast"), "provisioner": "p",
        "parameters": {"csi.storage.k8s.io/fstype": "xfs"}, "reclaimPolicy": "Retain", "mountOptions": ["noatime"],
        "allowVolumeExpansion": false, "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]}]})).await;
    round_trip::<storage::CSIDriver, storage::CSIDriverList>(&s, "/apis/storage.k8s.io/v1/csidrivers", "storage.k8s.io/v1", "CSIDriver", json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": meta("d.example.com"),
        "spec": {"attachRequired": false, "podInfoOnMount": true, "volumeLifecycleModes": ["Persistent", "Ephemeral"], "storageCapacity": true,
            "fsGroupPolicy": "File", "tokenRequests": [{"audience": "a", "expirationSeconds": 3600}], "requiresRepublish": true,
            "seLinuxMount": false, "nodeAllocatableUpdatePeriodSeconds": 60}})).await;
    round_trip::<storage::CSINode, storage::CSINodeList>(&s, "/apis/storage.k8s.io/v1/csinodes", "storage.k8s.io/v1", "CSINode", json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": meta("node1"),
        "spec": {"drivers": [{"name": "d", "nodeID": "node1", "topologyKeys": ["zone"], "allocatable": {"count": 0}}]}})).await;
    round_trip::<storage::CSIStorageCapacity, storage::CSIStorageCapacityList>(&s, "/apis/storage.k8s.io/v1/namespaces/default/csistoragecapacities", "storage.k8s.io/v1", "CSIStorageCapacity", json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": meta("cap1"),
        "nodeTopology": {"matchLabels": {"zone": "a"}}, "storageClassName": "fast", "capacity": "100Gi", "maximumVolumeSize": "10Gi"})).await;
    round_trip::<storage::VolumeAttachment, storage::VolumeAttachmentList>(&s, "/apis/storage.k8s.io/v1/volumeattachments", "storage.k8s.io/v1", "VolumeAttachment", json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": meta("va1"),
        "spec": {"attacher": "d", "nodeName": "node1", "source": {"persistentVolumeName": "pv1"}},
        "status": {"attached": false, "attachmentMetadata": {"dev": "/dev/x"},
            "attachError": {"time": time, "message": "m", "errorCode": 5}, "detachError": {"message": "n"}}})).await;
    round_trip::<coordination::Lease, coordination::LeaseList>(&s, "/apis/coordination.k8s.io/v1/namespaces/default/leases", "coordination.k8s.io/v1", "Lease", json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta("lead"),
        "spec": {"holderIdentity": "", "leaseDurationSeconds": 15, "acquireTime": micro, "renewTime": micro, "leaseTransitions": 0}})).await;
    round_trip::<core::Event, core::EventList>(&s, &format!("{core_ns}/events"), "v1", "Event", json!({
        "apiVersion": "v1", "kind": "Event", "metadata": meta("e1"),
        "involvedObject": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "c", "uid": "u", "apiVersion": "v1", "resourceVersion": "1"},
        "reason": "Provisioning", "message": "m", "source": {"component": "csi-provisioner", "host": "h"},
        "firstTimestamp": time, "lastTimestamp": time, "count": 2, "type": "Normal", "eventTime": micro,
        "series": {"count": 3, "lastObservedTime": micro}, "action": "Provision",
        "reportingComponent": "", "reportingInstance": ""})).await;
    round_trip::<events::Event, events::EventList>(&s, "/apis/events.k8s.io/v1/namespaces/default/events", "events.k8s.io/v1", "Event", json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("e2"), "eventTime": micro,
        "series": {"count": 2, "lastObservedTime": micro}, "reportingController": "c", "reportingInstance": "i",
        "action": "Provision", "reason": "R", "regarding": {"kind": "Pod", "name": "p"}, "note": "n", "type": "Warning",
        "deprecatedSource": {"component": "x"}, "deprecatedFirstTimestamp": time, "deprecatedLastTimestamp": time, "deprecatedCount": 4})).await;
    round_trip::<core::Secret, core::SecretList>(&s, &format!("{core_ns}/secrets"), "v1", "Secret", json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": meta("s1"), "data": {"p": "cQ==", "empty": ""}, "type": "Opaque", "immutable": false})).await;
    round_trip::<k8s_pb::api::apps::v1::StatefulSet, k8s_pb::api::apps::v1::StatefulSetList>(&s, "/apis/apps/v1/namespaces/default/statefulsets", "apps/v1", "StatefulSet", json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("db"),
        "spec": {"replicas": 0, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "postgres",
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 1}},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"}}})).await;
    round_trip::<core::ConfigMap, core::ConfigMapList>(&s, &format!("{core_ns}/configmaps"), "v1", "ConfigMap", json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("c1"), "data": {"a": "b"}, "binaryData": {"bin": "AAE="}})).await;
}

#[tokio::test]
async fn a_protobuf_watch_sends_length_prefixed_watch_events() {
    use k8s_pb::api::coordination::v1::Lease;
    let s = start().await;
    let collection = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let lease = |name: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": {"holderIdentity": "me"}});
    let first = call(
        &s,
        "POST",
        collection,
        "application/json",
        "application/json",
        lease("a").to_string().into_bytes(),
    )
    .await;
    assert_eq!(first.code, 201);
    let mut watch = ProtobufWatch::open(&s, collection).await;
    let second = call(
        &s,
        "POST",
        collection,
        "application/json",
        "application/json",
        lease("b").to_string().into_bytes(),
    )
    .await;
    assert_eq!(second.code, 201);
    let mut events = Vec::new();
    while events.len() < 2 {
        let (event_type, raw) = watch.next().await;
        let (_, kind, raw) = open(&raw);
        assert_eq!(kind, "Lease");
        let lease = Lease::decode(raw.as_slice()).unwrap();
        events.push((event_type, lease.metadata.unwrap().name.unwrap()));
    }
    assert_eq!(
        events,
        vec![
            ("ADDED".to_string(), "a".to_string()),
            ("ADDED".to_string(), "b".to_string())
        ]
    );
}

#[tokio::test]
async fn kinds_without_a_protobuf_form_are_refused_in_protobuf_and_answered_in_json() {
    // CustomResourceDefinitions (and custom resources) are served as JSON only.
    let s = start().await;
    let collection = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let body = envelope(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        Vec::new(),
    );
    let refused = call(&s, "POST", collection, PROTOBUF, "application/json", body).await;
    assert_eq!(refused.code, 415);
    let status = refused.json();
    assert_eq!(status["reason"], "UnsupportedMediaType");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("accepted media types include: application/json"),
        "{status}"
    );
    let only_protobuf = call(&s, "GET", collection, "", PROTOBUF, Vec::new()).await;
    assert_eq!(only_protobuf.code, 406);
    let either = call(
        &s,
        "GET",
        collection,
        "",
        &format!("{PROTOBUF}, */*"),
        Vec::new(),
    )
    .await;
    assert_eq!(either.code, 200);
    assert_eq!(either.json()["kind"], "CustomResourceDefinitionList");
    let garbage = call(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        PROTOBUF,
        "application/json",
        b"k8s\0\x0a\xff".to_vec(),
    )
    .await;
    assert_eq!(garbage.code, 400);
    assert!(
        garbage.json()["message"]
            .as_str()
            .unwrap()
            .contains("protobuf")
    );
    let cbor = call(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/cbor",
        "application/json",
        vec![0xa0],
    )
    .await;
    assert_eq!(cbor.code, 415);
}
