//! Clients without the token, idle or malformed: they get a Status and cannot take the server away.

use super::*;

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
