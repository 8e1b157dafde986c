//! Pods as each server stores them: the same Pods, from bare to every defaulted field set,
//! made on kube-apiserver and on ours; each must answer the same spec and status (defaults,
//! the default admission plugins, the QoS class). The Pods opt out of the ServiceAccount
//! token volume, which ours does not mount. Then the same specs as workloads' Pod templates,
//! and Nodes' capacities.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// The Pods' specs (each gets `automountServiceAccountToken: false`).
fn specs() -> Vec<Value> {
    vec![
        json!({"containers": [{"name": "c", "image": "busybox"}]}),
        json!({
            "containers": [{
                "name": "web", "image": "registry.example:5000/team/web:v2",
                "ports": [{"containerPort": 8080}, {"containerPort": 53, "protocol": "UDP"}],
                "livenessProbe": {"httpGet": {"port": 8080}, "periodSeconds": 5},
                "readinessProbe": {"exec": {"command": ["true"]}},
                "startupProbe": {"tcpSocket": {"port": 8080}, "failureThreshold": 30},
                "lifecycle": {"preStop": {"httpGet": {"port": 8080, "path": "/stop"}}},
                "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "resources": {"limits": {"cpu": "1000m", "memory": "1024Mi"}},
            }],
        }),
        json!({
            "hostNetwork": true,
            "initContainers": [{"name": "init", "image": "busybox:latest",
                                "resources": {"limits": {"memory": "64Mi"}}}],
            "containers": [{
                "name": "c", "image": "busybox@sha256:4b6ad3a68d34da29bf7c8ccb5d355ba8b4babcad1f99798204e7abb43e54ee3d",
                "ports": [{"containerPort": 9100}],
                "resources": {"requests": {"cpu": "0.5", "memory": "100000000"},
                              "limits": {"cpu": "1", "memory": "1Gi"}},
            }],
        }),
        json!({
            "containers": [{"name": "c", "image": "busybox:1.36", "imagePullPolicy": "",
                            "livenessProbe": {"grpc": {"port": 9090}},
                            "resources": {"limits": {}},
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [
                {"name": "bare"},
                {"name": "secret", "secret": {"secretName": "s"}},
                {"name": "config", "configMap": {"name": "m", "defaultMode": 256}},
                {"name": "downward", "downwardAPI": {"items": [
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                {"name": "projected", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}},
                    {"downwardAPI": {"items": [{"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
                ]}},
                {"name": "host", "hostPath": {"path": "/var/data"}},
                {"name": "scratch", "emptyDir": {"sizeLimit": "1024Mi"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "generic", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                    "resources": {"requests": {"storage": "2048Mi"}}}}}},
            ],
        }),
        json!({
            "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "Never",
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "resources": {"requests": {"cpu": "100m"}}}],
            "dnsPolicy": "Default", "restartPolicy": "Never", "securityContext": {"runAsUser": 1000},
            "terminationGracePeriodSeconds": 0, "schedulerName": "other-scheduler",
            "enableServiceLinks": false, "serviceAccountName": "builder",
            "priorityClassName": "system-node-critical",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                            {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}],
        }),
    ]
}

/// Each Pod's spec and status as `client`'s server stored them.
async fn stored(client: &kube::Client) -> Vec<(Value, Value)> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    for name in ["default", "builder"] {
        let account = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        // `default` may already be there.
        let _ = accounts.create(&PostParams::default(), &account).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut answers = Vec::new();
    for (i, mut spec) in specs().into_iter().enumerate() {
        spec["automountServiceAccountToken"] = json!(false);
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": format!("p-{i}")}, "spec": spec}))
                .unwrap();
        let made = pods.create(&PostParams::default(), &pod).await.unwrap();
        let made = serde_json::to_value(&made).unwrap();
        answers.push((made["spec"].clone(), made["status"].clone()));
    }
    // The bare Pod written again without what admission gave it: the priority is kept, the
    // tolerations given again, and the spec (so the generation) unchanged.
    let mut again = serde_json::to_value(pods.get("p-0").await.unwrap()).unwrap();
    let spec = again["spec"].as_object_mut().unwrap();
    for field in [
        "priority",
        "preemptionPolicy",
        "tolerations",
        "restartPolicy",
    ] {
        spec.remove(field);
    }
    let again: Pod = serde_json::from_value(again).unwrap();
    let replaced = pods
        .replace("p-0", &PostParams::default(), &again)
        .await
        .unwrap();
    let replaced = serde_json::to_value(&replaced).unwrap();
    answers.push((
        replaced["spec"].clone(),
        json!({"generation": replaced["metadata"]["generation"]}),
    ));
    answers
}

#[tokio::test]
async fn pods_are_stored_with_kube_apiservers_defaults() {
    let plane = crate::bed::bare_control_plane().await;
    let theirs = stored(&plane.admin().await.unwrap()).await;
    let ours = stored(&crate::bed::our_server("pods-test").await.client).await;
    let differences = differences(&theirs, &ours);
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // The check compares something: kube-apiserver defaulted the bare Pod.
    assert_eq!(theirs[0].0["restartPolicy"], "Always", "{:?}", theirs[0]);
    assert_eq!(theirs[1].1["qosClass"], "Guaranteed", "{:?}", theirs[1]);
    assert_eq!(theirs[5].0["priority"], 0, "{:?}", theirs[5]);
}

/// Each Deployment's Pod template spec (one per spec of [`specs`]), then a StatefulSet's Pod
/// template spec and claim templates, then two Nodes' status, as `client`'s server stored
/// them.
async fn stored_others(client: &kube::Client) -> Vec<Value> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let mut answers = Vec::new();
    for (i, mut spec) in specs().into_iter().enumerate() {
        // A Deployment's Pods restart always (kube-apiserver refuses any other policy).
        spec["restartPolicy"] = json!("Always");
        let labels = json!({"app": format!("d-{i}")});
        let deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": format!("d-{i}")},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": spec}},
        }))
        .unwrap();
        let made = deployments
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
        answers.push(serde_json::to_value(&made).unwrap()["spec"]["template"]["spec"].clone());
    }
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let labels = json!({"app": "s"});
    let set: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {"selector": {"matchLabels": labels}, "serviceName": "s",
                 "template": {"metadata": {"labels": labels}, "spec": specs()[0]},
                 "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1024Mi"}}}}]},
    }))
    .unwrap();
    let made =
        serde_json::to_value(sets.create(&PostParams::default(), &set).await.unwrap()).unwrap();
    answers.push(made["spec"]["template"]["spec"].clone());
    answers.push(made["spec"]["volumeClaimTemplates"].clone());
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, status) in [
        (
            "n-1",
            json!({"capacity": {"cpu": "4000m", "memory": "8192Mi", "pods": "110"}}),
        ),
        (
            "n-2",
            json!({"capacity": {"cpu": "4", "memory": "8Gi"}, "allocatable": {"cpu": "3.5", "memory": "7168Mi"}}),
        ),
    ] {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name}, "status": status})).unwrap();
        let made = nodes.create(&PostParams::default(), &node).await.unwrap();
        answers.push(serde_json::to_value(&made).unwrap()["status"].clone());
    }
    answers
}

#[tokio::test]
async fn templates_and_nodes_are_stored_as_kube_apiserver_stores_them() {
    let plane = crate::bed::bare_control_plane().await;
    let theirs = stored_others(&plane.admin().await.unwrap()).await;
    let ours = stored_others(&crate::bed::our_server("templates-test").await.client).await;
    let differences = differences(&theirs, &ours);
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // The check compares something: kube-apiserver defaulted the templates and kept the
    // Nodes' status.
    assert_eq!(theirs[0]["restartPolicy"], "Always", "{theirs:?}");
    assert_eq!(theirs[7]["allocatable"]["memory"], "8Gi", "{theirs:?}");
}

/// Each answer of ours that is not kube-apiserver's, with its index and both as JSON.
fn differences<T: PartialEq + serde::Serialize>(theirs: &[T], ours: &[T]) -> Vec<String> {
    theirs
        .iter()
        .zip(ours)
        .enumerate()
        .filter(|(_, (want, got))| want != got)
        .map(|(i, (want, got))| {
            format!(
                "{i}:\n  kube-apiserver {}\n  ours           {}",
                json!(want),
                json!(got)
            )
        })
        .collect()
}

/// What `client`'s server answers to Pods giving their own priority or preemption policy, or
/// naming a PriorityClass that does not exist (one of them by generateName): each refusal's
/// code and message.
async fn refusals(client: &kube::Client) -> Vec<(u16, String)> {
    let mut answers = Vec::new();
    // (namespace, metadata, what the spec gives): the one by generateName shows a refusal
    // names the object as it was asked for; in a namespace that does not exist the namespace
    // is what is refused, before the class.
    for (namespace, metadata, extra) in [
        ("default", json!({"name": "r-0"}), json!({"priority": 5})),
        (
            "default",
            json!({"name": "r-1"}),
            json!({"priorityClassName": "system-node-critical", "priority": 0}),
        ),
        (
            "default",
            json!({"name": "r-2"}),
            json!({"preemptionPolicy": "Never"}),
        ),
        (
            "default",
            json!({"name": "r-3"}),
            json!({"priorityClassName": "batch-low"}),
        ),
        (
            "default",
            json!({"generateName": "r-gen-"}),
            json!({"priorityClassName": "batch-low", "priority": 5}),
        ),
        (
            "nowhere",
            json!({"name": "r-5"}),
            json!({"priorityClassName": "batch-low"}),
        ),
    ] {
        let mut spec = specs()[0].clone();
        spec["automountServiceAccountToken"] = json!(false);
        for (field, value) in extra.as_object().unwrap() {
            spec[field] = value.clone();
        }
        let pod: Pod = serde_json::from_value(json!({"metadata": metadata, "spec": spec})).unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        match pods.create(&PostParams::default(), &pod).await {
            Err(kube::Error::Api(status)) => answers.push((status.code, status.message)),
            other => answers.push((0, format!("not refused: {other:?}"))),
        }
    }
    answers
}

#[tokio::test]
async fn a_pod_giving_its_own_priority_is_refused_as_kube_apiserver_refuses_it() {
    let plane = crate::bed::bare_control_plane().await;
    let admin = plane.admin().await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let account = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    let _ = accounts.create(&PostParams::default(), &account).await;
    let theirs = refusals(&admin).await;
    let ours = refusals(&crate::bed::our_server("refusals-test").await.client).await;
    let differences = differences(&theirs, &ours);
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // The check compares something: kube-apiserver refused each with a 403, but the Pod in a
    // namespace that does not exist with a 404.
    let codes: Vec<u16> = theirs.iter().map(|(code, _)| *code).collect();
    assert_eq!(codes, [403, 403, 403, 403, 403, 404], "{theirs:?}");
}
