//! The embedded stack's node agents in process: what brings a Pod waiting for its volumes back.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Cluster;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// A Pod placed on the node before its claim exists waits; the claim's events bring it back
/// through the agent's index of its Pods by claim. The agent's own retry of waiting Pods and its
/// sweep are an hour apart here, so nothing else brings it back within the deadline (no driver
/// changes, no attachments, no re-list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_pod_is_brought_back_by_its_claims_events() {
    let c = Cluster::start_with(&["--capacity=1Ti"], &[], true, |options| {
        options.kubelet = true;
        options.node_rechecks = stack::node::Rechecks {
            waiting: Duration::from_secs(3600),
            sweep: Duration::from_secs(3600),
        };
    })
    .await;
    c.class("fast", json!({})).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app"},
        "spec": {
            "nodeName": "node-1",
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "later"}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // The agent has looked and waits: its FailedMount event comes on a look at least 10 s
    // after the first, which a change to the Pod brings (its retry would take an hour).
    let mut touches = 0u32;
    let mut last_touch: Option<tokio::time::Instant> = None;
    common::poll_for(
        "a FailedMount event on the Pod naming the missing claim",
        WAIT,
        String::new,
        || {
            let due = last_touch.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
            if due {
                touches += 1;
                last_touch = Some(tokio::time::Instant::now());
            }
            let (pods, c, touch) = (pods.clone(), &c, due.then_some(touches));
            async move {
                // The events are read before touching: no touch is made once the report is
                // seen (a look at a late touch could otherwise set the Pod up by itself).
                let events = c.events_for("app").await;
                if events.iter().any(|(reason, message)| {
                    reason == "FailedMount"
                        && message.contains("persistentvolumeclaim \"later\" not found")
                }) {
                    return Ok(());
                }
                if let Some(n) = touch {
                    let labels = json!({"metadata": {"labels": {"touch": n.to_string()}}});
                    pods.patch("app", &PatchParams::default(), &Patch::Merge(&labels))
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Err(format!("events {events:?}"))
            }
        },
    )
    .await;

    // The claim comes and is bound: its events bring the Pod back, which then runs.
    c.claim("later", "fast", "1Mi", json!({}), false).await;
    c.wait_bound("later", WAIT).await;
    c.wait_pod_phase("app", "Running", Duration::from_secs(30))
        .await;
}
