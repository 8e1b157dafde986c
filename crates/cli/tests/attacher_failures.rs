//! `csi-attacher` failures: errors and missing secrets in the status, detaches that cannot be
//! marked, conflicting writes. The real binary against our API server and the reference
//! driver with `--enable-attach`.

#![allow(clippy::unwrap_used)]

mod attacher_env;
mod common;

use attacher_env::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_missing_secrets_are_written_to_the_status_and_retried() {
    let env = Env::start(
        &[
            "--enable-attach",
            "--require-secret=ControllerPublishVolume:token=s3cret-publish-token",
            "--require-secret=ControllerUnpublishVolume:token=s3cret-publish-token",
        ],
        &[],
    )
    .await;
    let secret_ref = json!({"spec": {"csi": {"controllerPublishSecretRef": {"name": "publish", "namespace": "default"}}}});
    let id = env.volume("pv-s", secret_ref).await;

    // No CSINode for the node, and no secret yet: as upstream, which reads the secret before
    // it looks for the node's id, the secret is what the attachment reports.
    let missing_secret = r#"failed to load secret "default/publish": secrets "publish" not found"#;
    env.attach("va-ghost", "pv-s", "ghost", &[]).await;
    env.wait_error("va-ghost", false, missing_secret).await;
    // As upstream, the volume is protected as soon as it is read, before the node is looked
    // up: the PV carries our finalizer although the attach could not be tried.
    let finalizers = env.pv("pv-s").await.unwrap().metadata.finalizers;
    assert!(
        finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == FINALIZER),
        "the volume is protected before the node is looked up"
    );

    env.attach("va-s", "pv-s", "node-1", &[]).await;
    env.wait_error("va-s", false, missing_secret).await;
    // As upstream, the secret comes before the attachment's finalizer: without it there is
    // nothing to detach, and the attachment could be deleted at once.
    let finalizers = env.va("va-s").await.unwrap().metadata.finalizers;
    assert!(
        finalizers.unwrap_or_default().is_empty(),
        "no finalizer before the secret is found"
    );
    let secrets: Api<Secret> = Api::namespaced(env.client(), "default");
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "publish"}, "stringData": {"token": "wrong"}}),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let error = env
        .wait_error("va-s", false, "rpc error: code = InvalidArgument")
        .await;
    assert!(
        !error.to_string().contains("wrong"),
        "secret values never appear: {error}"
    );
    // With the secret there, the node without a CSINode is what remains.
    env.wait_error(
        "va-ghost",
        false,
        r#"csinode.storage.k8s.io "ghost" not found"#,
    )
    .await;
    env.detach("va-ghost").await;
    // Long enough not to turn up by chance in a log of UIDs and hashes, as "abc" can.
    let fix = json!({"stringData": {"token": "s3cret-publish-token"}});
    secrets
        .patch("publish", &PatchParams::default(), &Patch::Merge(&fix))
        .await
        .unwrap();
    env.wait_attached("va-s").await;
    assert!(env.published().await.contains_key(&id));
    assert!(
        !env.log().contains("s3cret-publish-token"),
        "secret values are never logged"
    );

    // An injected error on detach: detachError, then a retry once it is gone.
    env.faults("ControllerUnpublishVolume=error:UNAVAILABLE\n");
    env.detach("va-s").await;
    env.wait_error("va-s", true, "rpc error: code = Unavailable")
        .await;
    assert!(env.published().await.contains_key(&id), "still published");
    env.faults("");
    env.wait_until("va-s gone", || async { env.va("va-s").await.is_none() })
        .await;
    assert!(env.published().await.is_empty());

    // An injected error on attach: attachError with the code, then attached.
    env.faults("ControllerPublishVolume=error:RESOURCE_EXHAUSTED\n");
    env.attach("va-t", "pv-s", "node-1", &[]).await;
    let error = env
        .wait_error("va-t", false, "rpc error: code = ResourceExhausted")
        .await;
    assert_eq!(error["errorCode"], json!(8));
    env.faults("");
    let va = env.wait_attached("va-t").await;
    assert!(
        va.status.unwrap().attach_error.is_none(),
        "cleared once attached"
    );
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("AttachFailed")
                && e.involved_object.name.as_deref() == Some("va-t")),
        "a Warning event names the failure"
    );
}

/// A detach whose driver call succeeded but whose attachment cannot be marked detached (its
/// finalizer not removed) says so, in upstream's words, and is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_that_cannot_be_marked_says_so_and_is_retried() {
    let env = Env::start(&["--enable-attach"], &[]).await;
    let id = env.volume("pv-m", json!({})).await;
    env.attach("va-m", "pv-m", "node-1", &[]).await;
    env.wait_attached("va-m").await;
    // Every write of a VolumeAttachment fails: the status cannot hold the error, the event
    // does.
    env.stack.server.set_faults(vec![
        serde_json::from_value(
            json!({"resource": "volumeattachments", "verb": "PATCH", "error": 500}),
        )
        .unwrap(),
    ]);
    env.detach("va-m").await;
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client(), "default");
    let message = common::poll_for(
        "a DetachFailed event on va-m",
        WAIT,
        || env.log(),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("DetachFailed")
                        && e.involved_object.name.as_deref() == Some("va-m")
                })
                .and_then(|e| e.message)
                .ok_or_else(|| "no event yet".to_string())
        },
    )
    .await;
    assert!(
        message.starts_with("could not mark as detached: "),
        "{message}"
    );
    assert!(
        !env.published().await.contains_key(&id),
        "the driver detached it"
    );
    env.stack.server.set_faults(Vec::new());
    env.wait_until("va-m gone", || async { env.va("va-m").await.is_none() })
        .await;
}

/// A write that conflicts (the object changed meanwhile) is not a failure: the attacher looks
/// again at once, as the PV controller does, instead of backing off and counting a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_writes_are_looked_at_again_not_backed_off() {
    let port = common::free_port();
    let env = Env::start(
        &["--enable-attach"],
        &[&format!("--http-endpoint=127.0.0.1:{port}")],
    )
    .await;
    // Every other write of a VolumeAttachment (its finalizer, its status) answered 409.
    env.stack.server.set_faults(vec![
        serde_json::from_value(json!({"resource": "volumeattachments", "verb": "PATCH", "error": 409, "probability": 0.5})).unwrap(),
    ]);
    for i in 0..6 {
        env.volume(&format!("pv-c{i}"), json!({})).await;
        env.attach(&format!("va-c{i}"), &format!("pv-c{i}"), "node-1", &[])
            .await;
    }
    for i in 0..6 {
        env.wait_attached(&format!("va-c{i}")).await;
    }
    env.stack.server.set_faults(Vec::new());
    let conflicts: u64 = env
        .stack
        .server
        .request_counts()
        .iter()
        .filter(|((verb, resource, code, _), _)| {
            verb == "PATCH" && resource == "volumeattachments" && *code == 409
        })
        .map(|(_, n)| n)
        .sum();
    assert!(conflicts > 0, "the faults were injected");
    let page = sidecar_kit::testing::http_get(port, "/metrics").await;
    let retries: f64 = page
        .lines()
        .filter(|l| l.starts_with("workqueue_retries_total{name=\"csi-attacher-va\"}"))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|n| n.parse::<f64>().ok())
        .sum();
    assert_eq!(
        retries, 0.0,
        "{conflicts} conflicts counted as failures:\n{page}"
    );
}
