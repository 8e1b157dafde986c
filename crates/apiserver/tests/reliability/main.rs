//! The API server keeps every acknowledged write and nothing else, across a full disk and
//! restarts; refuses what it could not read back; keeps its files private; and cannot be
//! exhausted or crashed by clients without the token or with malformed requests.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

mod clients;
mod durability;

struct Server {
    server: apiserver::RunningServer,
    client: kube::Client,
    stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(config: apiserver::Config) -> Server {
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(config, async {
        let _ = rx.await;
    })
    .await
    .unwrap();
    let client = client_for(&server, true).await;
    Server {
        server,
        client,
        stop,
    }
}

async fn restart(s: Server, dir: &Path) -> Server {
    let _ = s.stop.send(());
    s.server.join().await;
    start(durable(dir)).await
}

fn durable(dir: &Path) -> apiserver::Config {
    apiserver::Config {
        data_dir: Some(dir.to_path_buf()),
        ..Default::default()
    }
}

async fn client_for(server: &apiserver::RunningServer, with_token: bool) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    if !with_token {
        config.auth_info.token = None;
    }
    // kube retries 503 and 504 by default; these tests look at the answers themselves.
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// GET/POST/PATCH a raw path; returns (status code, body).
async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    agent: &str,
) -> (u16, String) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .header("user-agent", agent)
        .body(body)
        .unwrap();
    match client.request_text(request).await {
        Ok(text) => (200, text),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(other) => panic!("{method} {path}: {other:?}"),
    }
}

fn cm(name: &str, payload: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": payload}})).unwrap()
}

/// A tmpfs of `size` at `dir`, unmounted on drop; None where mounting is not permitted.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The resourceVersion of a list of config maps.
async fn list_rv(api: &Api<ConfigMap>) -> u64 {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap()
}
