//! What kube-apiserver adds to a Node's status at every write (compared with kube-apiserver
//! v1.36.2 by `cli/tests/real_cluster/pods.rs`): `SetDefaults_NodeStatus` (what a Node can
//! give is what it has, unless it says), and the parts of the status that are structs, not
//! pointers, in its types and so are always written (the kubelet's endpoint, the node's
//! info with every text empty). Its quantities are written canonically by
//! [`crate::quantities::canonicalize`].

use serde_json::{Value, json};

/// The texts of `status.nodeInfo`, each written even when empty.
const NODE_INFO: [&str; 10] = [
    "architecture",
    "bootID",
    "containerRuntimeVersion",
    "kernelVersion",
    "kubeProxyVersion",
    "kubeletVersion",
    "machineID",
    "operatingSystem",
    "osImage",
    "systemUUID",
];

/// The defaults of a Node being written (created or updated).
pub fn defaults(node: &mut Value) {
    let Some(object) = node.as_object_mut() else {
        return;
    };
    let status = object.entry("status").or_insert(Value::Null);
    if !status.is_object() {
        *status = json!({});
    }
    let Some(status) = status.as_object_mut() else {
        return;
    };
    if status.get("capacity").is_some_and(Value::is_object)
        && status.get("allocatable").is_none_or(Value::is_null)
    {
        let capacity = status["capacity"].clone();
        status.insert("allocatable".into(), capacity);
    }
    let endpoints = status.entry("daemonEndpoints").or_insert_with(|| json!({}));
    if let Some(endpoints) = endpoints.as_object_mut() {
        let kubelet = endpoints
            .entry("kubeletEndpoint")
            .or_insert_with(|| json!({}));
        if let Some(kubelet) = kubelet.as_object_mut() {
            kubelet.entry("Port").or_insert(json!(0));
        }
    }
    let info = status.entry("nodeInfo").or_insert_with(|| json!({}));
    if let Some(info) = info.as_object_mut() {
        for field in NODE_INFO {
            info.entry(field).or_insert(json!(""));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_status_is_completed_as_kube_apiserver_completes_it() {
        let mut node = json!({"metadata": {"name": "n"}, "status": {"capacity": {"cpu": "4"}}});
        defaults(&mut node);
        assert_eq!(node["status"]["allocatable"], json!({"cpu": "4"}));
        assert_eq!(
            node["status"]["daemonEndpoints"],
            json!({"kubeletEndpoint": {"Port": 0}})
        );
        assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "");
        assert_eq!(
            node["status"]["nodeInfo"].as_object().map(|m| m.len()),
            Some(10)
        );
        // What the Node says is kept.
        let mut node = json!({"status": {
            "capacity": {"cpu": "4"}, "allocatable": {"cpu": "3"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.36.2"},
        }});
        defaults(&mut node);
        assert_eq!(node["status"]["allocatable"], json!({"cpu": "3"}));
        assert_eq!(
            node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            10250
        );
        assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.36.2");
        // A Node without a status gets the parts that are always written.
        let mut node = json!({"metadata": {"name": "n"}});
        defaults(&mut node);
        assert!(node["status"].get("allocatable").is_none(), "{node}");
        assert_eq!(
            node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            0
        );
    }
}
