//! What `kubectl get` shows, ours against kube-apiserver's: the same objects are made on both
//! servers and the Table each answers (the columns, their priorities, the cells; times left
//! out) must be the same, for every kind both serve.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// (API path of the collection, namespace, object, status written through the subresource).
fn objects() -> Vec<(&'static str, Option<&'static str>, Value, Option<Value>)> {
    let t = "2026-11-20T10:00:00Z";
    vec![
        // Without kube-controller-manager, a Pod needs its namespace's `default` account made.
        (
            "/api/v1/namespaces/default/serviceaccounts",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
            None,
        ),
        (
            "/api/v1/nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/storage": ""}}, "spec": {"unschedulable": true}}),
            Some(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready", "lastHeartbeatTime": t, "lastTransitionTime": t}],
                                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}, {"type": "Hostname", "address": "n1"}],
                                "nodeInfo": {"kubeletVersion": "v1.36.2", "osImage": "Debian", "kernelVersion": "6.1.0", "containerRuntimeVersion": "containerd://2.0",
                                             "machineID": "m", "systemUUID": "s", "bootID": "b", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}}),
            ),
        ),
        (
            "/api/v1/nodes",
            None,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}}),
            None,
        ),
        (
            "/api/v1/namespaces/default/pods",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}}),
            Some(
                json!({"status": {"phase": "Running", "podIP": "10.1.0.5", "containerStatuses": [
             {"name": "a", "ready": true, "restartCount": 2, "image": "i", "imageID": "", "state": {"running": {"startedAt": t}}},
             {"name": "b", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}),
            ),
        ),
        (
            "/api/v1/namespaces/default/persistentvolumeclaims",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "volumeName": "v", "resources": {"requests": {"storage": "1Gi"}}}}),
            Some(
                json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}}),
            ),
        ),
        (
            "/api/v1/persistentvolumes",
            None,
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "v"}, "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "fast", "hostPath": {"path": "/tmp/v"},
                "claimRef": {"namespace": "default", "name": "c"}}}),
            Some(json!({"status": {"phase": "Released", "reason": "Lost"}})),
        ),
        (
            "/apis/storage.k8s.io/v1/storageclasses",
            None,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fast"}, "provisioner": "d.example.com", "allowVolumeExpansion": true}),
            None,
        ),
        (
            "/apis/storage.k8s.io/v1/csidrivers",
            None,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "d.example.com"}, "spec": {"attachRequired": true, "volumeLifecycleModes": ["Persistent", "Ephemeral"], "tokenRequests": [{"audience": "a"}]}}),
            None,
        ),
        (
            "/apis/storage.k8s.io/v1/csinodes",
            None,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n1"}, "spec": {"drivers": [{"name": "d.example.com", "nodeID": "n1"}]}}),
            None,
        ),
        (
            "/apis/storage.k8s.io/v1/namespaces/default/csistoragecapacities",
            Some("default"),
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": {"name": "cap"}, "storageClassName": "fast", "capacity": "10Gi"}),
            None,
        ),
        (
            "/apis/storage.k8s.io/v1/volumeattachments",
            None,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "va"}, "spec": {"attacher": "d.example.com", "nodeName": "n1", "source": {"persistentVolumeName": "v"}}}),
            Some(json!({"status": {"attached": true}})),
        ),
        (
            "/apis/storage.k8s.io/v1/volumeattributesclasses",
            None,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttributesClass", "metadata": {"name": "gold"}, "driverName": "d.example.com", "parameters": {"iops": "3000"}}),
            None,
        ),
        (
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            Some("default"),
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}),
            None,
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}}),
            None,
        ),
        (
            "/api/v1/namespaces/default/secrets",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "MQ=="}}),
            None,
        ),
        (
            "/api/v1/namespaces/default/serviceaccounts",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa"}}),
            None,
        ),
        (
            "/apis/apps/v1/namespaces/default/deployments",
            Some("default"),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "x", "image": "img:1"}, {"name": "y", "image": "img:2"}]}}}}),
            Some(
                json!({"status": {"replicas": 3, "readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 1}}),
            ),
        ),
        (
            "/apis/apps/v1/namespaces/default/statefulsets",
            Some("default"),
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "ss"}, "spec": {"replicas": 2, "serviceName": "s", "selector": {"matchLabels": {"a": "c"}},
                "template": {"metadata": {"labels": {"a": "c"}}, "spec": {"containers": [{"name": "x", "image": "img:1"}]}}}}),
            Some(json!({"status": {"replicas": 2, "readyReplicas": 1}})),
        ),
        (
            "/apis/apps/v1/namespaces/default/daemonsets",
            Some("default"),
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"}, "spec": {"selector": {"matchLabels": {"a": "d"}},
                "template": {"metadata": {"labels": {"a": "d"}}, "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "x", "image": "img:1"}]}}}}),
            Some(
                json!({"status": {"desiredNumberScheduled": 4, "currentNumberScheduled": 3, "numberReady": 2, "updatedNumberScheduled": 3, "numberAvailable": 2, "numberMisscheduled": 0}}),
            ),
        ),
        (
            "/apis/apps/v1/namespaces/default/replicasets",
            Some("default"),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"}, "spec": {"replicas": 2, "selector": {"matchLabels": {"a": "e"}},
                "template": {"metadata": {"labels": {"a": "e"}}, "spec": {"containers": [{"name": "x", "image": "img:1"}]}}}}),
            Some(json!({"status": {"replicas": 2, "readyReplicas": 1}})),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            None,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cr"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
            None,
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            None,
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "crb"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cr"},
                "subjects": [{"kind": "User", "name": "alice"}, {"kind": "Group", "name": "devs"}, {"kind": "ServiceAccount", "name": "sa", "namespace": "default"}]}),
            None,
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
            Some("default"),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
            None,
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            Some("default"),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rb"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                "subjects": [{"kind": "User", "name": "bob"}]}),
            None,
        ),
        (
            "/api/v1/namespaces/default/events",
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default", "fieldPath": "spec.containers{a}"},
                "reason": "Started", "message": "started", "type": "Normal", "source": {"component": "kubelet", "host": "n1"}, "count": 3,
                "firstTimestamp": t, "lastTimestamp": t}),
            None,
        ),
    ]
}

/// The columns kube-apiserver fills with times (their cells differ between two servers).
const TIMES: [&str; 4] = ["Age", "Created At", "Last Seen", "First Seen"];

/// A Table of one object: (column, priority) headers, and its cells as printed, times blank.
async fn table(client: &kube::Client, path: &str, name: &str) -> (Vec<String>, Vec<String>) {
    let request = http::Request::get(format!("{path}/{name}"))
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .unwrap();
    let text = client
        .request_text(request)
        .await
        .unwrap_or_else(|e| panic!("{path}/{name}: {e}"));
    let table: Value = serde_json::from_str(&text).unwrap();
    let columns: Vec<(String, i64)> = table["columnDefinitions"]
        .as_array()
        .unwrap_or_else(|| panic!("{path}: {table}"))
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["priority"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    let cells: Vec<String> = table["rows"][0]["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(&columns)
        .map(|(cell, (column, _))| {
            if TIMES.contains(&column.as_str()) {
                String::new()
            } else {
                match cell {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }
            }
        })
        .collect();
    let headers = columns
        .into_iter()
        .map(|(c, p)| format!("{c}:{p}"))
        .collect();
    (headers, cells)
}

async fn make(
    client: &kube::Client,
    path: &str,
    namespace: Option<&str>,
    object: &Value,
    status: &Option<Value>,
) {
    let resource = kube::api::ApiResource {
        group: object["apiVersion"]
            .as_str()
            .unwrap()
            .split_once('/')
            .map_or("", |(g, _)| g)
            .into(),
        version: object["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .into(),
        api_version: object["apiVersion"].as_str().unwrap().into(),
        kind: object["kind"].as_str().unwrap().into(),
        plural: path.rsplit('/').next().unwrap().into(),
    };
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let dynamic: DynamicObject = serde_json::from_value(object.clone()).unwrap();
    api.create(&PostParams::default(), &dynamic)
        .await
        .unwrap_or_else(|e| panic!("create {object}: {e}"));
    if let Some(status) = status {
        let name = object["metadata"]["name"].as_str().unwrap();
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap_or_else(|e| panic!("status of {name}: {e}"));
    }
}

#[tokio::test]
async fn kubectl_get_shows_the_same_table_on_both_servers() {
    let plane = crate::bed::bare_control_plane().await;
    let theirs = plane.admin().await.unwrap();
    let server = crate::bed::our_server("tables-test").await;
    let ours = server.client.clone();
    let mut differences = Vec::new();
    for (path, namespace, object, status) in objects() {
        make(&theirs, path, namespace, &object, &status).await;
        make(&ours, path, namespace, &object, &status).await;
        let name = object["metadata"]["name"].as_str().unwrap();
        let want = table(&theirs, path, name).await;
        let got = table(&ours, path, name).await;
        if want != got {
            differences.push(format!(
                "{path}/{name}:\n  kube-apiserver {want:?}\n  ours           {got:?}"
            ));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}
