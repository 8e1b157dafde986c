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

/// POSTs a JSON body.
async fn post_json(client: &kube::Client, path: &str, body: &Value) -> (u16, String) {
    raw(
        client,
        "POST",
        path,
        "application/json",
        body.to_string().into_bytes(),
        "t",
    )
    .await
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

#[tokio::test]
async fn a_failed_log_write_is_never_visible_and_later_writes_are_refused_until_restart() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("small");
    std::fs::create_dir(&dir).unwrap();
    // A full disk is a 2 MiB tmpfs: the tests run as root (as CI does); without the right to
    // mount one this test fails, it does not pass without running.
    let _tmpfs = Tmpfs::mount(&dir, "2m")
        .expect("mounting a tmpfs is not permitted here: run the tests as root (CAP_SYS_ADMIN)");
    let data = dir.join("data");
    let s = start(durable(&data)).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let payload = "x".repeat(200 * 1024);
    let mut acknowledged = Vec::new();
    let mut failed = None;
    for i in 0..40 {
        let name = format!("fill{i}");
        match api
            .create(&PostParams::default(), &cm(&name, &payload))
            .await
        {
            Ok(_) => acknowledged.push(name),
            Err(kube::Error::Api(status)) => {
                assert!(status.code >= 500, "{status:?}");
                failed = Some(name);
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let failed = failed.expect("the 2 MiB disk never filled");
    assert!(!acknowledged.is_empty());
    // Not visible, not a conflict on retry, and every later write is refused with 503.
    assert!(api.get_opt(&failed).await.unwrap().is_none());
    let retry = api
        .create(&PostParams::default(), &cm(&failed, "small"))
        .await
        .unwrap_err();
    assert!(
        matches!(retry, kube::Error::Api(ref s) if s.code == 503),
        "{retry:?}"
    );
    let (code, body) = raw(&s.client, "GET", "/readyz", "text/plain", Vec::new(), "t").await;
    assert_ne!(code, 200, "readyz: {body}");
    // After a restart (with room again) exactly the acknowledged objects are there.
    assert_eq!(names(&api).await, sorted(acknowledged.clone()));
    let copy = root.path().join("copy");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let _ = s.stop.send(());
    s.server.join().await;
    let s = start(durable(&copy)).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    assert_eq!(names(&api).await, sorted(acknowledged));
    api.create(&PostParams::default(), &cm(&failed, "small"))
        .await
        .unwrap();
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

/// Names of the config maps, in the server's (sorted) order.
async fn names(api: &Api<ConfigMap>) -> Vec<String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn nested(levels: usize) -> Value {
    let mut v = json!("leaf");
    for _ in 0..levels {
        v = json!({ "n": v });
    }
    v
}

#[tokio::test]
async fn deeply_nested_objects_are_refused_and_later_writes_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(durable(dir.path())).await;
    let path = "/api/v1/namespaces/default/configmaps";
    let deep = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep"}, "extra": nested(125)});
    let (code, message) = post_json(&s.client, path, &deep).await;
    assert_eq!(code, 400, "{message}");
    assert!(message.contains("nested"), "{message}");
    let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok"}, "extra": nested(90)});
    let (code, message) = post_json(&s.client, path, &ok).await;
    assert_eq!(code, 200, "{message}");
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    api.create(&PostParams::default(), &cm("later", "v"))
        .await
        .unwrap();
    // A merge patch cannot nest an object past the limit either.
    let patch = json!({"extra": nested(105)});
    let err = api
        .patch("ok", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400),
        "{err:?}"
    );
    let s = restart(s, dir.path()).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    assert!(api.get_opt("ok").await.unwrap().is_some());
    assert!(api.get_opt("later").await.unwrap().is_some());
}

#[tokio::test]
async fn versions_increase_across_restarts_and_a_watch_from_the_future_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(durable(dir.path())).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let mut seen = 0u64;
    for i in 0..5 {
        let c = api
            .create(&PostParams::default(), &cm(&format!("a{i}"), "v"))
            .await
            .unwrap();
        seen = seen.max(c.metadata.resource_version.unwrap().parse().unwrap());
        api.delete(&format!("a{i}"), &Default::default())
            .await
            .unwrap();
    }
    let listed = list_rv(&api).await;
    seen = seen.max(listed);
    let s = restart(s, dir.path()).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let after = api
        .create(&PostParams::default(), &cm("b", "v"))
        .await
        .unwrap();
    let rv: u64 = after.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv > seen, "{rv} after {seen}");
    let future = rv + 1000;
    let (code, message) = raw(
        &s.client,
        "GET",
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={future}"),
        "application/json",
        Vec::new(),
        "t",
    )
    .await;
    assert_eq!(code, 504, "{message}");
    assert!(message.contains("Too large resource version"), "{message}");
}

#[tokio::test]
async fn the_data_directory_and_every_file_in_it_are_private() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let s = start(apiserver::Config {
        kubeconfig_path: Some(dir.join("kubeconfig")),
        ..durable(&dir)
    })
    .await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    api.create(&PostParams::default(), &cm("c", "v"))
        .await
        .unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
        files += 1;
    }
    assert!(
        files >= 4,
        "token, certificate, key, kubeconfig and the log: {files}"
    );
}

#[tokio::test]
async fn clients_without_the_token_get_401_everywhere_and_one_metrics_label() {
    let s = start(apiserver::Config::default()).await;
    let anonymous = client_for(&s.server, false).await;
    for (i, path) in [
        "/api/v1/namespaces",
        "/no/such/path",
        "/metrics",
        "/debug/faults",
    ]
    .iter()
    .enumerate()
    {
        let (code, _) = raw(
            &anonymous,
            "GET",
            path,
            "application/json",
            Vec::new(),
            &format!("agent-{i}\"x"),
        )
        .await;
        assert_eq!(code, 401, "{path}");
    }
    for i in 0..100 {
        let (code, _) = raw(
            &anonymous,
            "GET",
            "/api",
            "application/json",
            Vec::new(),
            &format!("bot{i}"),
        )
        .await;
        assert_eq!(code, 401);
    }
    // Authenticated clients with hostile or numerous agents stay within bounded labels.
    raw(
        &s.client,
        "GET",
        "/api",
        "application/json",
        Vec::new(),
        "evil\"agent\\",
    )
    .await;
    for i in 0..100 {
        raw(
            &s.client,
            "GET",
            "/api",
            "application/json",
            Vec::new(),
            &format!("client{i}"),
        )
        .await;
    }
    let (code, metrics) = raw(&s.client, "GET", "/metrics", "text/plain", Vec::new(), "t").await;
    assert_eq!(code, 200);
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .collect();
    let unauthenticated: Vec<&&str> = series
        .iter()
        .filter(|l| l.contains("client=\"unauthenticated\""))
        .collect();
    assert_eq!(unauthenticated.len(), 1, "{unauthenticated:?}");
    assert!(
        unauthenticated[0].ends_with(" 104"),
        "{}",
        unauthenticated[0]
    );
    let clients: std::collections::BTreeSet<&str> = series
        .iter()
        .filter_map(|l| l.split("client=\"").nth(1)?.split('"').next())
        .collect();
    assert!(
        clients.len() <= apiserver::access::MAX_CLIENT_LABELS + 2,
        "{}",
        clients.len()
    );
    // Every series parses: name{labels} value, with no stray quote.
    for line in &series {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<u64>().is_ok(), "{line}");
        assert!(
            labels.ends_with('}') && labels.matches('"').count() % 2 == 0,
            "{line}"
        );
    }
}

#[tokio::test]
async fn idle_connections_cannot_take_the_server_away_from_health_checks() {
    let s = start(apiserver::Config {
        listener: apiserver::listener::Limits {
            max_connections: 8,
            handshake: Duration::from_millis(500),
            headers: Duration::from_secs(1),
            ..apiserver::listener::Limits::for_this_process()
        },
        ..Default::default()
    })
    .await;
    let addr = s.server.local_addr();
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // With every slot held by a client that never completes the handshake, a health check
    // still gets through once their deadlines expire.
    let (code, body) = tokio::time::timeout(
        Duration::from_secs(60),
        raw(&s.client, "GET", "/healthz", "text/plain", Vec::new(), "t"),
    )
    .await
    .expect("healthz never answered");
    assert_eq!((code, body.as_str()), (200, "ok"));
    drop(idle);
}

#[tokio::test]
async fn health_checks_without_a_token_cannot_keep_the_slots_an_authenticated_client_needs() {
    // Eight clients without a token, each on its own kept-alive connection, asking /healthz
    // every 200 ms (well under the 30 s header limit that closes idle HTTP/1 connections),
    // against --max-connections 8: before, they held every slot and kubectl waited forever.
    let s = start(apiserver::Config {
        listener: apiserver::listener::Limits {
            max_connections: 8,
            unauthenticated: apiserver::listener::Limits::unauthenticated_share(8),
            ..apiserver::listener::Limits::for_this_process()
        },
        ..Default::default()
    })
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut holders = Vec::new();
    for _ in 0..8 {
        let anonymous = client_for(&s.server, false).await;
        let stop = stop.clone();
        holders.push(tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let request = http::Request::get("/healthz").body(Vec::new()).unwrap();
                // Answered, or cut off to make room: either way it asks again.
                let _ = anonymous.request_text(request).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A client with a token gets in within the deadline (a try cut off while it was still
    // unauthenticated by a burst of new connections is tried again, as client-go does).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let fresh = client_for(&s.server, true).await;
        let api: Api<ConfigMap> = Api::namespaced(fresh, "default");
        match tokio::time::timeout(Duration::from_secs(5), api.list(&ListParams::default())).await {
            Ok(Ok(_)) => break,
            Ok(Err(error)) => eprintln!("try failed: {error}"),
            Err(_) => eprintln!("try timed out"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "an authenticated client never got a connection slot"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for holder in holders {
        holder.await.unwrap();
    }
}

#[tokio::test]
async fn malformed_patches_and_unsupported_subresource_verbs_get_a_status() {
    let s = start(apiserver::Config::default()).await;
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(s.client.clone(), "default");
    let claim = serde_json::from_value(json!({
        "metadata": {"name": "c"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &claim).await.unwrap();
    let path = "/api/v1/namespaces/default/persistentvolumeclaims/c";
    let cases: [(&str, &str, u16); 5] = [
        ("application/merge-patch+json", "5", 400),
        ("application/merge-patch+json", "{\"metadata\":\"x\"}", 422),
        ("application/strategic-merge-patch+json", "[1]", 400),
        (
            "application/json-patch+json",
            "[{\"op\":\"replace\",\"path\":\"\",\"value\":5}]",
            422,
        ),
        ("application/json-patch+json", "{\"op\":1}", 400),
    ];
    for (content_type, body, want) in cases {
        let (code, message) = raw(
            &s.client,
            "PATCH",
            path,
            content_type,
            body.as_bytes().to_vec(),
            "t",
        )
        .await;
        assert_eq!(code, want, "{content_type} {body}: {message}");
    }
    let (code, message) = raw(
        &s.client,
        "DELETE",
        &format!("{path}/status"),
        "application/json",
        Vec::new(),
        "t",
    )
    .await;
    assert_eq!(code, 405, "{message}");
    assert!(
        api.get_opt("c").await.unwrap().is_some(),
        "DELETE on status must not delete the claim"
    );
    // The server is still serving.
    assert!(api.get_opt("c").await.unwrap().is_some());
}

#[tokio::test]
async fn list_resource_versions_are_served_refused_or_gone_as_kube_apiserver_does() {
    let s = start(apiserver::Config::default()).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    api.create(&PostParams::default(), &cm("a", "v"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &cm("b", "v"))
        .await
        .unwrap();
    let current = list_rv(&api).await;
    let path = "/api/v1/namespaces/default/configmaps";
    let get = |query: String| {
        let client = s.client.clone();
        async move {
            raw(
                &client,
                "GET",
                &format!("{path}?{query}"),
                "application/json",
                Vec::new(),
                "t",
            )
            .await
        }
    };
    let (code, _) = get(format!(
        "resourceVersion={current}&resourceVersionMatch=Exact"
    ))
    .await;
    assert_eq!(code, 200);
    let (code, _) = get("resourceVersion=0".into()).await;
    assert_eq!(code, 200);
    let (code, message) = get(format!(
        "resourceVersion={}&resourceVersionMatch=Exact",
        current - 1
    ))
    .await;
    assert_eq!(code, 410, "{message}");
    let (code, message) = get(format!(
        "resourceVersion={}&resourceVersionMatch=NotOlderThan",
        current + 1000
    ))
    .await;
    assert_eq!(code, 504, "{message}");
    assert!(message.contains("Too large resource version"), "{message}");
    let (code, message) = get("resourceVersionMatch=Exact".into()).await;
    assert_eq!(code, 400, "{message}");
}

/// An object larger than etcd stores (1.5 MiB as kube-apiserver stores it: protobuf for
/// built-in kinds) is refused as kube-apiserver refuses it, by create and by update, and
/// nothing of it is kept.
#[tokio::test]
async fn objects_larger_than_etcd_stores_are_refused() {
    let s = start(apiserver::Config::default()).await;
    let client = client_for(&s.server, true).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let big = "x".repeat(1600 * 1024);
    let err = configmaps
        .create(&PostParams::default(), &cm("big", &big))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(st) if st.code == 500 && st.message == "etcdserver: request is too large"),
        "{err:?}"
    );
    assert!(configmaps.get_opt("big").await.unwrap().is_none());
    // Just under the limit is fine, and growing it past the limit by an update is refused.
    let fits = "x".repeat(1400 * 1024);
    configmaps
        .create(&PostParams::default(), &cm("grows", &fits))
        .await
        .unwrap();
    let patch = json!({"data": {"more": "y".repeat(200 * 1024)}});
    let err = configmaps
        .patch("grows", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(st) if st.code == 500),
        "{err:?}"
    );
    // A Secret's data is base64 in JSON (1.87 MiB here) but raw bytes in etcd (1.4 MiB).
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client, "default");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "binary"},
        "data": {"blob": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, vec![7u8; 1400 * 1024])},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// The log is compacted into a snapshot as it grows; a restart reads the snapshot and the log
/// after it and sees exactly the acknowledged objects (with a small threshold, many
/// compactions happen during the run).
#[tokio::test]
async fn a_compacted_log_restarts_to_exactly_the_acknowledged_objects() {
    let dir = tempfile::tempdir().unwrap();
    let config = |dir: &Path| apiserver::Config {
        data_dir: Some(dir.to_path_buf()),
        log: durable_log::Options {
            compact_min_bytes: 16 * 1024,
            ..durable_log::Options::default()
        },
        ..Default::default()
    };
    let s = start(config(dir.path())).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..300 {
        let name = format!("cm-{i}");
        api.create(&PostParams::default(), &cm(&name, &"x".repeat(200)))
            .await
            .unwrap();
        expected.insert(name.clone(), "x".repeat(200));
        if i % 3 == 0 {
            api.delete(&name, &Default::default()).await.unwrap();
            expected.remove(&name);
        } else if i % 3 == 1 {
            let patch = json!({"data": {"k": format!("updated-{i}")}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
            expected.insert(name, format!("updated-{i}"));
        }
    }
    let files = durable_log::files::list(dir.path()).unwrap();
    assert!(
        files.snapshots.last().copied().unwrap_or(0) > 0,
        "the log was compacted"
    );
    let _ = s.stop.send(());
    s.server.join().await;
    let s = start(config(dir.path())).await;
    let api: Api<ConfigMap> = Api::namespaced(s.client.clone(), "default");
    let found: std::collections::BTreeMap<String, String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.unwrap(),
                c.data.unwrap_or_default().remove("k").unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(found, expected);
}
