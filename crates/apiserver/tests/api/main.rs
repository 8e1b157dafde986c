//! The server driven by kube-rs, the client our controllers use.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

mod concurrency;
mod namespaces;
mod objects;
mod server;
mod watches;

async fn start(
    data_dir: Option<std::path::PathBuf>,
) -> (
    apiserver::RunningServer,
    kube::Client,
    tokio::sync::oneshot::Sender<()>,
) {
    start_with(apiserver::Config {
        data_dir,
        ..Default::default()
    })
    .await
}

async fn start_with(
    config: apiserver::Config,
) -> (
    apiserver::RunningServer,
    kube::Client,
    tokio::sync::oneshot::Sender<()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(config, async {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let client = client_for(&server).await;
    (server, client, tx)
}

async fn client_for(server: &apiserver::RunningServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

fn pvc(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap()
}
