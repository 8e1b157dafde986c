//! The server as a process: restarts, its token, its fault admin.

use super::*;

#[tokio::test]
async fn acknowledged_writes_survive_a_restart_and_versions_keep_increasing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client, stop) = start(Some(dir.path().to_path_buf())).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut last = 0u64;
    for i in 0..20 {
        let c = api
            .create(&PostParams::default(), &cm(&format!("d{i}")))
            .await
            .unwrap();
        last = c.metadata.resource_version.unwrap().parse().unwrap();
    }
    let _ = stop.send(());
    server.join().await;
    let (_server, client, _stop) = start(Some(dir.path().to_path_buf())).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        20
    );
    let next = api
        .create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    let rv: u64 = next.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv > last, "resourceVersion {rv} must continue after {last}");
}

#[tokio::test]
async fn requests_need_the_token() {
    let (server, _client, _stop) = start(None).await;
    let kc = server.kubeconfig().replace(server.token(), "wrong-token");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kc).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let bad = kube::Client::try_from(config).unwrap();
    let err = Api::<ConfigMap>::namespaced(bad, "default")
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 401),
        "{err:?}"
    );
}

#[tokio::test]
async fn faults_switch_on_and_off_and_close_watches() {
    use apiserver::faults::FaultRule;
    let (server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rule = |verb: &str, error: Option<u16>, latency_ms: u64| FaultRule {
        resource: "configmaps".into(),
        verb: verb.into(),
        latency_ms,
        error,
        probability: 1.0,
    };
    server.set_faults(vec![rule("CREATE", Some(500), 0)]);
    let err = api
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 500),
        "{err:?}"
    );
    server.set_faults(vec![rule("CREATE", Some(409), 0)]);
    let err = api
        .create(&PostParams::default(), &cm("x"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );
    server.set_faults(vec![rule("LIST", None, 300)]);
    let started = std::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    server.set_faults(Vec::new());
    api.create(&PostParams::default(), &cm("x")).await.unwrap();

    // 429 carries Retry-After, as kube-apiserver's.
    server.set_faults(vec![rule("GET", Some(429), 0)]);
    let out = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            &format!("Authorization: Bearer {}", server.token()),
            &format!("{}/api/v1/namespaces/default/configmaps/x", server.url()),
        ])
        .output()
        .await
        .unwrap();
    let headers = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(
        headers.contains(" 429") && headers.contains("retry-after: 1"),
        "{headers}"
    );
    server.set_faults(Vec::new());

    // Closing watches ends open streams.
    let stream = api
        .watch(&WatchParams::default().timeout(60), "0")
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let first = stream.next().await.unwrap().unwrap();
    assert!(matches!(first, WatchEvent::Added(_)));
    server.close_watches(Some("configmaps"));
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(item) = stream.next().await {
            if item.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch was closed");
}
