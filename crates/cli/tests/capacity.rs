//! `--enable-capacity` and `--node-deployment` against our API server and the reference
//! driver, with the real `csi-provisioner` binary.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Cluster, DRIVER, free_port};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

const KEY: &str = "topology.hostpath.csi.volstack.dev/node";
const WAIT: Duration = Duration::from_secs(30);

/// Our objects, as (class, node) → (name, capacity, maximum).
async fn published(
    cluster: &Cluster,
) -> BTreeMap<(String, String), (String, String, Option<String>)> {
    let api: Api<CSIStorageCapacity> = Api::namespaced(cluster.client.clone(), "kube-system");
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| {
            let node = o
                .node_topology
                .as_ref()
                .and_then(|t| t.match_labels.as_ref())
                .and_then(|l| l.get(KEY).cloned())
                .unwrap_or_default();
            (
                (o.storage_class_name.clone(), node),
                (
                    o.metadata.name.clone().unwrap(),
                    o.capacity.map(|q| q.0).unwrap_or_default(),
                    o.maximum_volume_size.map(|q| q.0),
                ),
            )
        })
        .collect()
}

/// Waits until the published (class, node) → capacity is exactly `want`.
async fn wait_published(cluster: &Cluster, want: &[(&str, &str, &str)]) {
    let want: BTreeMap<(String, String), String> = want
        .iter()
        .map(|(c, n, q)| ((c.to_string(), n.to_string()), q.to_string()))
        .collect();
    let what = format!("published {want:?}");
    common::poll_for(
        &what,
        WAIT,
        || cluster.provisioner_log(),
        || async {
            let have: BTreeMap<(String, String), String> = published(cluster)
                .await
                .into_iter()
                .map(|(k, (_, q, _))| (k, q))
                .collect();
            if have == want {
                Ok(())
            } else {
                Err(format!("{have:?}"))
            }
        },
    )
    .await;
}

async fn register_node(cluster: &Cluster, name: &str) {
    cluster
        .apply_cluster::<Node>(json!({"metadata": {"name": name, "labels": {KEY: name}}}))
        .await;
    cluster
        .apply_cluster::<CSINode>(json!({
            "metadata": {"name": name},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "topologyKeys": [KEY]}]}
        }))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_objects_follow_classes_nodes_and_provisioned_volumes() {
    let port = free_port();
    let cluster = Cluster::start_with(
        &["--capacity=10Gi", "--max-volume-size=6Gi"],
        &[
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            // Nothing waits for a poll: every change below is noticed at once.
            "--capacity-poll-interval=1h",
            &format!("--http-endpoint=127.0.0.1:{port}"),
        ],
        true,
        |o| o.extra_nodes = vec!["node-2".into()],
    )
    .await;
    cluster
        .class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    cluster.class("now", json!({})).await;
    // One object per node for the late-binding class; none for the Immediate one.
    wait_published(
        &cluster,
        &[("late", "node-1", "10Gi"), ("late", "node-2", "10Gi")],
    )
    .await;
    let objects: Api<CSIStorageCapacity> = Api::namespaced(cluster.client.clone(), "kube-system");
    let first = objects.list(&ListParams::default()).await.unwrap().items;
    for o in &first {
        let labels = o.metadata.labels.clone().unwrap();
        assert_eq!(labels["csi.storage.k8s.io/drivername"], DRIVER);
        assert_eq!(
            labels["csi.storage.k8s.io/managed-by"],
            "external-provisioner"
        );
        assert!(o.metadata.name.as_deref().unwrap().starts_with("csisc-"));
        assert_eq!(o.maximum_volume_size.as_ref().unwrap().0, "6Gi");
        assert_eq!(o.metadata.owner_references, None, "level -1: no owner");
    }

    // A volume provisioned on node-2: its object is refreshed at once (the poll is an hour
    // away); node-1's is not touched.
    let node1_name = published(&cluster).await[&("late".into(), "node-1".into())]
        .0
        .clone();
    cluster
        .claim(
            "data",
            "late",
            "3Gi",
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-2"}}}),
            false,
        )
        .await;
    cluster.wait_bound("data", WAIT).await;
    wait_published(
        &cluster,
        &[("late", "node-1", "10Gi"), ("late", "node-2", "7Gi")],
    )
    .await;
    // And deleted: back to 10Gi.
    Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), "default")
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    wait_published(
        &cluster,
        &[("late", "node-1", "10Gi"), ("late", "node-2", "10Gi")],
    )
    .await;

    // Someone deletes an object: it is made again (a new name).
    objects
        .delete(&node1_name, &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .wait_until("node-1's object made again", WAIT, || async {
            published(&cluster)
                .await
                .get(&("late".into(), "node-1".into()))
                .is_some_and(|(name, _, _)| *name != node1_name)
        })
        .await;

    // A node registers: its segment gets an object (the driver has no volumes there: 0). It
    // leaves (its CSINode no longer lists the driver): the object goes.
    register_node(&cluster, "node-3").await;
    wait_published(
        &cluster,
        &[
            ("late", "node-1", "10Gi"),
            ("late", "node-2", "10Gi"),
            ("late", "node-3", "0"),
        ],
    )
    .await;
    Api::<CSINode>::all(cluster.client.clone())
        .delete("node-3", &DeleteParams::default())
        .await
        .unwrap();
    wait_published(
        &cluster,
        &[("late", "node-1", "10Gi"), ("late", "node-2", "10Gi")],
    )
    .await;

    // Upstream's gauges.
    let metrics = metrics_once_published(port).await;
    for line in [
        "csistoragecapacities_desired_goal 2",
        "csistoragecapacities_desired_current 2",
        "csistoragecapacities_obsolete 0",
    ] {
        assert!(
            sidecar_kit::testing::has_metric(&metrics, line),
            "{line} missing:\n{metrics}"
        );
    }

    // A second class: two more; the first class deleted: its objects go.
    cluster
        .class(
            "late-2",
            json!({"volumeBindingMode": "WaitForFirstConsumer"}),
        )
        .await;
    wait_published(
        &cluster,
        &[
            ("late", "node-1", "10Gi"),
            ("late", "node-2", "10Gi"),
            ("late-2", "node-1", "10Gi"),
            ("late-2", "node-2", "10Gi"),
        ],
    )
    .await;
    Api::<StorageClass>::all(cluster.client.clone())
        .delete("late", &DeleteParams::default())
        .await
        .unwrap();
    wait_published(
        &cluster,
        &[("late-2", "node-1", "10Gi"), ("late-2", "node-2", "10Gi")],
    )
    .await;
}

/// The metrics page once its gauges say the two objects are published (the endpoint needs no
/// token; it may not be listening yet at first).
async fn metrics_once_published(port: u16) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let out = sidecar_kit::http::get_local(port, "/metrics")
            .await
            .unwrap_or_default();
        // The gauges are refreshed every two seconds.
        if sidecar_kit::testing::has_metric(&out, "csistoragecapacities_desired_goal 2")
            && sidecar_kit::testing::has_metric(&out, "csistoragecapacities_obsolete 0")
        {
            return out;
        }
        assert!(tokio::time::Instant::now() < deadline, "metrics: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_needs_get_capacity_and_says_so_at_start_up() {
    // Without --capacity the driver does not advertise GET_CAPACITY.
    let cluster = Cluster::start(&[], &["--enable-capacity"], false).await;
    cluster
        .wait_until("the start-up error", WAIT, || async {
            cluster
                .provisioner_log()
                .contains("--enable-capacity: driver \"hostpath.csi.volstack.dev\" does not advertise the GET_CAPACITY controller capability")
        })
        .await;
    let mut cluster = cluster;
    common::poll_for("the provisioner to exit", WAIT, String::new, || {
        let exited = cluster.exited();
        async move {
            if exited {
                Ok(())
            } else {
                Err("still running".into())
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_node_provisioner_serves_its_node_only() {
    let mut cluster = Cluster::start_with(&["--capacity=10Gi"], &[], true, |o| {
        o.extra_nodes = vec!["node-2".into()]
    })
    .await;
    // The provisioner of node-2: node-2's driver socket, NODE_NAME, capacity for its segment.
    cluster.kill_provisioner();
    let node2 = cluster.stack.node_sockets[0].clone();
    for arg in cluster.provisioner_args.iter_mut() {
        if arg.starts_with("--csi-address=") {
            *arg = format!("--csi-address={node2}");
        }
    }
    cluster.provisioner_args.extend(
        [
            "--node-deployment",
            "--node-deployment-base-delay=50ms",
            "--node-deployment-max-delay=500ms",
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-for-immediate-binding",
        ]
        .map(String::from),
    );
    cluster
        .provisioner_env
        .push(("NODE_NAME".into(), "node-2".into()));
    cluster.start_provisioner();
    cluster
        .class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    cluster.class("now", json!({})).await;
    // Capacity for node-2's segment only, managed by external-provisioner-node-2.
    wait_published(
        &cluster,
        &[
            ("hostpath", "node-2", "10Gi"),
            ("late", "node-2", "10Gi"),
            ("now", "node-2", "10Gi"),
        ],
    )
    .await;
    let objects: Api<CSIStorageCapacity> = Api::namespaced(cluster.client.clone(), "kube-system");
    for o in objects.list(&ListParams::default()).await.unwrap().items {
        assert_eq!(
            o.metadata.labels.unwrap()["csi.storage.k8s.io/managed-by"],
            "external-provisioner-node-2"
        );
    }
    let selected = |node: &str| json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}});
    // node-1's claim first, then node-2's: only node-2's is provisioned here.
    cluster
        .claim("for-node-1", "late", "1Gi", selected("node-1"), false)
        .await;
    cluster
        .claim("for-node-2", "late", "1Gi", selected("node-2"), false)
        .await;
    cluster.wait_bound("for-node-2", WAIT).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), "default");
    let other = claims.get("for-node-1").await.unwrap();
    assert!(
        other.spec.unwrap().volume_name.is_none(),
        "node-1's claim was left alone"
    );
    // An Immediate claim: node-2's provisioner takes it (it has room) and provisions it there.
    cluster
        .claim("anywhere", "now", "1Gi", json!({}), false)
        .await;
    cluster.wait_bound("anywhere", WAIT).await;
    let taken = claims.get("anywhere").await.unwrap();
    assert_eq!(
        taken.metadata.annotations.clone().unwrap()["volume.kubernetes.io/selected-node"],
        "node-2"
    );
    let pv = cluster.pv_for(&taken).await.unwrap();
    let affinity = serde_json::to_string(&pv.spec.unwrap().node_affinity).unwrap();
    assert!(affinity.contains("node-2"), "{affinity}");
    // Too large for node-2 (10Gi, 2Gi used): not taken; it stays unselected.
    cluster
        .claim("too-big", "now", "20Gi", json!({}), false)
        .await;
    cluster
        .wait_until("the capacity check refusing", WAIT, || async {
            cluster.provisioner_log().contains("not enough capacity")
        })
        .await;
    let big = claims.get("too-big").await.unwrap();
    assert!(
        !big.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("volume.kubernetes.io/selected-node")
    );
    // Its own volume is deleted by it.
    claims
        .delete("for-node-2", &DeleteParams::default())
        .await
        .unwrap();
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(cluster.client.clone());
    cluster
        .wait_until("node-2's volume deleted", WAIT, || async {
            pvs.list(&ListParams::default()).await.unwrap().items.len() == 1
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_owned_by_the_level_of_the_provisioners_pod_asked_for() {
    // Level 2 from the Pod: Pod → ReplicaSet → Deployment.
    let mut cluster = Cluster::start(&["--capacity=1Gi"], &[], false).await;
    cluster.kill_provisioner();
    let client = cluster.client.clone();
    let create = |kind: &'static str, value: serde_json::Value| {
        let client = client.clone();
        async move {
            let (group, version, plural) = match kind {
                "Deployment" => ("apps", "v1", "deployments"),
                "ReplicaSet" => ("apps", "v1", "replicasets"),
                _ => ("", "v1", "pods"),
            };
            let resource = kube::api::ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: if group.is_empty() {
                    version.into()
                } else {
                    format!("{group}/{version}")
                },
                kind: kind.into(),
                plural: plural.into(),
            };
            let api: Api<kube::api::DynamicObject> =
                Api::namespaced_with(client, "kube-system", &resource);
            let mut object: kube::api::DynamicObject = serde_json::from_value(value).unwrap();
            object.types = Some(kube::api::TypeMeta {
                api_version: resource.api_version.clone(),
                kind: kind.into(),
            });
            api.create(&kube::api::PostParams::default(), &object)
                .await
                .unwrap()
                .metadata
                .uid
                .unwrap()
        }
    };
    let deployment = create(
        "Deployment",
        json!({"metadata": {"name": "csi-provisioner"}, "spec": {"selector": {"matchLabels": {"app": "p"}},
               "template": {"metadata": {"labels": {"app": "p"}}, "spec": {"containers": [{"name": "p", "image": "p"}]}}}}),
    )
    .await;
    let owner = |kind: &str, name: &str, uid: &str| json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true}]);
    let replicaset = create(
        "ReplicaSet",
        json!({"metadata": {"name": "csi-provisioner-7d9", "ownerReferences": owner("Deployment", "csi-provisioner", &deployment)},
               "spec": {"selector": {"matchLabels": {"app": "p"}},
                        "template": {"metadata": {"labels": {"app": "p"}}, "spec": {"containers": [{"name": "p", "image": "p"}]}}}}),
    )
    .await;
    create(
        "Pod",
        json!({"metadata": {"name": "csi-provisioner-7d9-x", "ownerReferences": owner("ReplicaSet", "csi-provisioner-7d9", &replicaset)},
               "spec": {"containers": [{"name": "p", "image": "p"}]}}),
    )
    .await;
    cluster
        .provisioner_args
        .extend(["--enable-capacity", "--capacity-ownerref-level=2"].map(String::from));
    cluster
        .provisioner_env
        .push(("POD_NAME".into(), "csi-provisioner-7d9-x".into()));
    cluster.start_provisioner();
    cluster
        .class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    wait_published(&cluster, &[("late", "node-1", "1Gi")]).await;
    let objects: Api<CSIStorageCapacity> = Api::namespaced(cluster.client.clone(), "kube-system");
    let object = objects
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .remove(0);
    let refs = object.metadata.owner_references.unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(
        (
            refs[0].kind.as_str(),
            refs[0].name.as_str(),
            refs[0].uid.as_str()
        ),
        ("Deployment", "csi-provisioner", deployment.as_str())
    );
    assert_eq!(refs[0].controller, Some(true));
    // A level above the chain: the provisioner stops with upstream's words. Walking past the
    // ReplicaSet reads the Deployment, which the manifests' rules (upstream's) do not grant:
    // a user asking for that level grants it, as here.
    let grant: Vec<serde_json::Value> = cli::manifests::parse(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: owners, namespace: kube-system}\nrules: [{apiGroups: [apps], resources: [deployments], verbs: [get]}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: owners, namespace: kube-system}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: owners}\nsubjects: [{kind: ServiceAccount, name: csi-provisioner, namespace: kube-system}]\n",
    )
    .unwrap();
    cli::manifests::apply(&cluster.client, &grant)
        .await
        .unwrap();
    cluster.kill_provisioner();
    for arg in cluster.provisioner_args.iter_mut() {
        if arg == "--capacity-ownerref-level=2" {
            *arg = "--capacity-ownerref-level=3".into();
        }
    }
    cluster.start_provisioner();
    cluster
        .wait_until("the owner error", WAIT, || async {
            cluster
                .provisioner_log()
                .contains("has no controlling owner, cannot unwind the ownership further")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_placed_on_stale_capacity_is_placed_again_after_the_driver_refuses() {
    use csi_proto::v1 as csi;
    use k8s_openapi::api::core::v1::Pod;
    let cluster = Cluster::start_with(
        &["--capacity=10Gi"],
        &[
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-poll-interval=1h",
            // Only the selected node: the driver cannot fall back to another one.
            "--strict-topology",
        ],
        true,
        |o| {
            o.extra_nodes = vec!["node-2".into()];
            o.storage_capacity = true;
        },
    )
    .await;
    cluster
        .class("late", json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    wait_published(
        &cluster,
        &[("late", "node-1", "10Gi"), ("late", "node-2", "10Gi")],
    )
    .await;
    // 8Gi of node-1 taken behind the provisioner's back: its object still says 10Gi.
    let channel = sidecar_kit::csi::connect(&cluster.socket).await.unwrap();
    let topology = |node: &str| csi::Topology {
        segments: [(KEY.to_string(), node.to_string())].into(),
    };
    csi::controller_client::ControllerClient::new(channel)
        .create_volume(csi::CreateVolumeRequest {
            name: "outside".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 8 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![csi::VolumeCapability::mount(
                "",
                csi::volume_capability::access_mode::Mode::SingleNodeWriter,
            )],
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![topology("node-1")],
                preferred: vec![topology("node-1")],
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    // A 5Gi claim: the scheduler believes node-1, the driver refuses (RESOURCE_EXHAUSTED), the
    // provisioner gives the claim back and refreshes node-1's object, and the scheduler places
    // the Pod again, on node-2.
    cluster.claim("data", "late", "5Gi", json!({}), false).await;
    cluster
        .apply::<Pod>(json!({
            "metadata": {"name": "app"},
            "spec": {"containers": [{"name": "a", "image": "busybox"}],
                     "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
        }))
        .await;
    cluster
        .wait_event("data", "ProvisioningFailed", "code = ResourceExhausted")
        .await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    cluster
        .wait_until("the Pod on node-2", WAIT, || async {
            pods.get("app")
                .await
                .unwrap()
                .spec
                .and_then(|s| s.node_name)
                .as_deref()
                == Some("node-2")
        })
        .await;
    wait_published(
        &cluster,
        &[("late", "node-1", "2Gi"), ("late", "node-2", "5Gi")],
    )
    .await;
}
