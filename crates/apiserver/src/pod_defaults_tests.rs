use serde_json::json;

use super::*;

#[test]
fn a_bare_pod_gets_kube_apiservers_defaults() {
    let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    defaults(&mut pod);
    crate::admission::pod(&mut pod).unwrap();
    assert_eq!(
        pod["spec"],
        json!({
            "containers": [{
                "name": "c", "image": "busybox", "imagePullPolicy": "Always", "resources": {},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            }],
            "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "securityContext": {},
            "terminationGracePeriodSeconds": 30, "schedulerName": "default-scheduler",
            "enableServiceLinks": true, "serviceAccountName": "default", "serviceAccount": "default",
            "priority": 0, "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        })
    );
    assert_eq!(
        initial_status(&pod),
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
}

#[test]
fn what_the_user_set_is_kept() {
    let spec = json!({
        "containers": [{"name": "c", "image": "i:1", "imagePullPolicy": "Never",
                        "terminationMessagePolicy": "FallbackToLogsOnError"}],
        "dnsPolicy": "Default", "restartPolicy": "Never", "securityContext": {"runAsUser": 1},
        "terminationGracePeriodSeconds": 0, "schedulerName": "mine", "enableServiceLinks": false,
        "serviceAccountName": "builder", "priorityClassName": "system-cluster-critical",
        "tolerations": [{"operator": "Exists"}],
    });
    let mut pod = json!({"spec": spec.clone()});
    defaults(&mut pod);
    crate::admission::pod(&mut pod).unwrap();
    for field in [
        "dnsPolicy",
        "restartPolicy",
        "securityContext",
        "terminationGracePeriodSeconds",
        "schedulerName",
        "enableServiceLinks",
        "serviceAccountName",
        "priorityClassName",
        // A Pod tolerating every taint gets no toleration added.
        "tolerations",
    ] {
        assert_eq!(pod["spec"][field], spec[field], "{field}");
    }
    assert_eq!(pod["spec"]["serviceAccount"], "builder");
    assert_eq!(pod["spec"]["priority"], 2_000_000_000);
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["imagePullPolicy"], "Never");
    assert_eq!(
        container["terminationMessagePolicy"],
        "FallbackToLogsOnError"
    );
}

#[test]
fn the_image_pull_policy_follows_the_tag() {
    // (image, policy)
    let table = [
        ("busybox", "Always"),
        ("busybox:latest", "Always"),
        ("busybox:1.36", "IfNotPresent"),
        ("registry:5000/team/app", "Always"),
        ("registry:5000/team/app:v2", "IfNotPresent"),
        ("app@sha256:0123", "IfNotPresent"),
        ("app:latest@sha256:0123", "Always"),
        ("", "IfNotPresent"),
    ];
    for (image, policy) in table {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": image}]}});
        defaults(&mut pod);
        assert_eq!(
            pod["spec"]["containers"][0]["imagePullPolicy"], policy,
            "{image}"
        );
    }
}

#[test]
fn containers_ports_probes_and_references_are_defaulted() {
    let mut pod = json!({"spec": {
        "hostNetwork": true,
        "containers": [{
            "name": "c", "image": "i:1",
            "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP", "hostPort": 5353}],
            "livenessProbe": {"httpGet": {"port": 80}, "periodSeconds": 5},
            "readinessProbe": {"exec": {"command": ["true"]}},
            "lifecycle": {"preStop": {"httpGet": {"port": 80, "path": "/stop"}}},
            "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        }],
        "ephemeralContainers": [{"name": "debug", "image": "busybox"}],
    }});
    defaults(&mut pod);
    let container = &pod["spec"]["containers"][0];
    assert_eq!(
        container["ports"],
        json!([
            {"containerPort": 80, "protocol": "TCP", "hostPort": 80},
            {"containerPort": 53, "protocol": "UDP", "hostPort": 5353},
        ])
    );
    assert_eq!(
        container["livenessProbe"],
        json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "periodSeconds": 5,
               "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3})
    );
    assert_eq!(container["readinessProbe"]["periodSeconds"], 10);
    assert_eq!(
        container["lifecycle"]["preStop"]["httpGet"],
        json!({"port": 80, "path": "/stop", "scheme": "HTTP"})
    );
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["apiVersion"],
        "v1"
    );
    let debug = &pod["spec"]["ephemeralContainers"][0];
    assert_eq!(debug["imagePullPolicy"], "Always");
    assert_eq!(debug["terminationMessagePath"], "/dev/termination-log");
}

#[test]
fn volumes_are_defaulted_by_their_source() {
    let mut pod = json!({"spec": {"containers": [], "volumes": [
        {"name": "bare"},
        {"name": "s", "secret": {"secretName": "x"}},
        {"name": "m", "configMap": {"name": "x", "defaultMode": 256}},
        {"name": "d", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        {"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
        {"name": "h", "hostPath": {"path": "/data"}},
        {"name": "e", "emptyDir": {"sizeLimit": "1024Mi"}},
        {"name": "g", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2048Mi"}}}}}},
    ]}});
    defaults(&mut pod);
    let volumes = &pod["spec"]["volumes"];
    assert_eq!(volumes[0], json!({"name": "bare", "emptyDir": {}}));
    assert_eq!(volumes[1]["secret"]["defaultMode"], 420);
    assert_eq!(volumes[2]["configMap"]["defaultMode"], 256);
    assert_eq!(volumes[3]["downwardAPI"]["defaultMode"], 420);
    assert_eq!(
        volumes[3]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"],
        "v1"
    );
    assert_eq!(
        volumes[4]["projected"],
        json!({"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 3600}}], "defaultMode": 420})
    );
    assert_eq!(volumes[5]["hostPath"]["type"], "");
    assert_eq!(volumes[6]["emptyDir"]["sizeLimit"], "1Gi");
    assert_eq!(
        volumes[7]["ephemeral"]["volumeClaimTemplate"]["metadata"],
        json!({})
    );
    let template = &volumes[7]["ephemeral"]["volumeClaimTemplate"]["spec"];
    assert_eq!(template["volumeMode"], "Filesystem");
    assert_eq!(template["resources"]["requests"]["storage"], "2Gi");
}

#[test]
fn requests_come_from_limits_and_are_written_canonically() {
    let mut pod = json!({"spec": {
        "containers": [{"name": "c", "image": "i:1", "resources": {
            "limits": {"cpu": "1000m", "memory": "1024Mi"}, "requests": {"cpu": "0.5"}}}],
        "initContainers": [{"name": "i", "image": "i:1", "resources": {"limits": {"memory": "64Mi"}}}],
        "overhead": {"cpu": "0.25"},
    }});
    defaults(&mut pod);
    assert_eq!(
        pod["spec"]["containers"][0]["resources"],
        json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m", "memory": "1Gi"}})
    );
    assert_eq!(
        pod["spec"]["initContainers"][0]["resources"]["requests"],
        json!({"memory": "64Mi"})
    );
    assert_eq!(pod["spec"]["overhead"]["cpu"], "250m");
}

#[test]
fn the_qos_class_is_kube_apiservers() {
    let container = |requests: Value, limits: Value| json!({"name": "c", "image": "i:1", "resources": {"requests": requests, "limits": limits}});
    // (containers after defaults, class)
    let table = [
        (json!([{"name": "c"}]), "BestEffort"),
        (
            json!([container(json!({"cpu": "0"}), json!({}))]),
            "BestEffort",
        ),
        (
            json!([container(
                json!({"cpu": "1", "memory": "1Gi"}),
                json!({"cpu": "1", "memory": "1Gi"})
            )]),
            "Guaranteed",
        ),
        // Equal in value, written differently.
        (
            json!([container(
                json!({"cpu": "1000m", "memory": "1024Mi"}),
                json!({"cpu": "1", "memory": "1Gi"})
            )]),
            "Guaranteed",
        ),
        (
            json!([container(
                json!({"cpu": "500m", "memory": "1Gi"}),
                json!({"cpu": "1", "memory": "1Gi"})
            )]),
            "Burstable",
        ),
        // A limit on CPU only is not enough.
        (
            json!([container(json!({"cpu": "1"}), json!({"cpu": "1"}))]),
            "Burstable",
        ),
        // Other resources do not count.
        (
            json!([container(
                json!({"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"}),
                json!({"cpu": "1", "memory": "1Gi"})
            )]),
            "Guaranteed",
        ),
        (
            json!([container(json!({"ephemeral-storage": "1Gi"}), json!({}))]),
            "BestEffort",
        ),
        // Every container needs both limits.
        (
            json!([
                container(
                    json!({"cpu": "1", "memory": "1Gi"}),
                    json!({"cpu": "1", "memory": "1Gi"})
                ),
                container(json!({"cpu": "1"}), json!({"cpu": "1"})),
            ]),
            "Burstable",
        ),
    ];
    for (containers, class) in table {
        let spec = json!({"containers": containers});
        assert_eq!(qos_class(&spec), class, "{spec}");
    }
    // Limits alone: requests are taken from them first.
    let mut pod = json!({"spec": {"containers": [container(json!(null), json!({"cpu": "2", "memory": "1Gi"}))]}});
    pod["spec"]["containers"][0]["resources"]
        .as_object_mut()
        .unwrap()
        .remove("requests");
    defaults(&mut pod);
    assert_eq!(initial_status(&pod)["qosClass"], "Guaranteed");
}

#[test]
fn empty_texts_count_as_unset_and_numbers_as_their_text() {
    let mut pod = json!({"spec": {
        "dnsPolicy": "", "restartPolicy": "", "schedulerName": "",
        "containers": [{"name": "c", "image": "i:1", "imagePullPolicy": "", "terminationMessagePath": "",
                        "terminationMessagePolicy": "", "ports": [{"containerPort": 80, "protocol": ""}],
                        "env": [{"name": "N", "valueFrom": {"fieldRef": {"apiVersion": "", "fieldPath": "spec.nodeName"}}}],
                        "resources": {"limits": {"cpu": 1, "memory": 1073741824}}}],
    }});
    defaults(&mut pod);
    let spec = &pod["spec"];
    assert_eq!(spec["dnsPolicy"], "ClusterFirst");
    assert_eq!(spec["restartPolicy"], "Always");
    assert_eq!(spec["schedulerName"], "default-scheduler");
    let container = &spec["containers"][0];
    assert_eq!(container["imagePullPolicy"], "IfNotPresent");
    assert_eq!(container["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(container["terminationMessagePolicy"], "File");
    assert_eq!(container["ports"][0]["protocol"], "TCP");
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["apiVersion"],
        "v1"
    );
    assert_eq!(
        container["resources"],
        json!({"limits": {"cpu": "1", "memory": "1073741824"}, "requests": {"cpu": "1", "memory": "1073741824"}})
    );
    assert_eq!(initial_status(&pod)["qosClass"], "Guaranteed");
}

#[test]
fn empty_limits_add_no_requests_and_grpc_probes_get_a_service() {
    let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "i:1",
        "resources": {"limits": {}}, "livenessProbe": {"grpc": {"port": 9090}}}]}});
    defaults(&mut pod);
    let container = &pod["spec"]["containers"][0];
    // Nor is an empty map stored, as kube-apiserver writes none.
    assert_eq!(container["resources"], json!({}));
    assert_eq!(
        container["livenessProbe"]["grpc"],
        json!({"port": 9090, "service": ""})
    );
}

#[test]
fn admission_gives_built_in_classes_their_priority_and_null_tolerations_the_defaults() {
    // (class, priority)
    let table = [
        ("", 0),
        ("system-node-critical", 2_000_001_000),
        ("system-cluster-critical", 2_000_000_000),
    ];
    for (class, priority) in table {
        let mut pod =
            json!({"spec": {"containers": [], "priorityClassName": class, "tolerations": null}});
        crate::admission::pod(&mut pod).unwrap();
        assert_eq!(pod["spec"]["priority"].as_i64(), Some(priority), "{class}");
        assert_eq!(
            pod["spec"]["preemptionPolicy"].as_str(),
            Some("PreemptLowerPriority"),
            "{class}"
        );
        assert_eq!(
            pod["spec"]["tolerations"].as_array().map(Vec::len),
            Some(2),
            "{class}"
        );
    }
}
