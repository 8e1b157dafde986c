//! In-process clients (`RunningServer::local_service`): the same API as over the network,
//! counted under their own name, and refused once the server stops.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"k": "v"},
    }))
    .unwrap()
}

#[tokio::test]
async fn an_in_process_client_reads_writes_and_watches() {
    let f = common::start().await;
    let client = kube::Client::new(f.server.local_service("local-test/1.0").unwrap(), "default");
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let made = maps
        .create(&PostParams::default(), &config_map("one"))
        .await
        .unwrap();
    let rv = made.metadata.resource_version.clone().unwrap();
    let read = maps.get("one").await.unwrap();
    assert_eq!(read.data.unwrap()["k"], "v");
    // A watch from the version just written sees the next change, through a streamed body.
    let mut events = maps
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    maps.create(&PostParams::default(), &config_map("two"))
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(30), events.try_next())
        .await
        .expect("the watch must deliver the change")
        .unwrap()
        .unwrap();
    match event {
        WatchEvent::Added(map) => assert_eq!(map.metadata.name.as_deref(), Some("two")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    // Counted like any client, under its User-Agent.
    let counts = f.server.request_counts();
    let created = counts
        .iter()
        .filter(|((verb, resource, code, client), _)| {
            verb == "CREATE" && resource == "configmaps" && *code == 201 && client == "local-test"
        })
        .map(|(_, n)| *n)
        .sum::<u64>();
    assert_eq!(created, 2, "{counts:?}");
    // The token is the server's: the kubeconfig's client sees what the local one wrote.
    let (ok, out, err) =
        common::kubectl(&f, &["get", "configmap", "two", "-o", "name"], None).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "configmap/two");
}

#[tokio::test]
async fn an_in_process_client_is_refused_once_the_server_stops() {
    let f = common::start().await;
    let client = kube::Client::new(f.server.local_service("local-test/1.0").unwrap(), "default");
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    maps.create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    let common::Fixture { server, _stop, .. } = f;
    drop(_stop);
    server.join().await;
    let error = maps
        .create(&PostParams::default(), &config_map("after"))
        .await
        .expect_err("a stopped server must not take writes");
    assert!(
        error.to_string().contains("the API server has stopped"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_user_agent_that_is_no_header_value_is_refused() {
    let f = common::start().await;
    let error = f.server.local_service("bad\nagent").unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid User-Agent for an in-process client"
    );
}

#[tokio::test]
async fn an_in_process_watch_ends_when_the_server_stops() {
    let f = common::start().await;
    let client = kube::Client::new(f.server.local_service("local-test/1.0").unwrap(), "default");
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut events = maps
        .watch(&WatchParams::default().timeout(290), "0")
        .await
        .unwrap()
        .boxed();
    let common::Fixture { server, _stop, .. } = f;
    drop(_stop);
    server.join().await;
    let end = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(_)) = events.try_next().await {}
    })
    .await;
    assert!(end.is_ok(), "the watch must end with the server");
}

#[tokio::test]
async fn the_server_prints_without_its_token() {
    let f = common::start().await;
    let printed = format!("{:?}", f.server);
    assert!(!printed.contains(f.server.token()), "{printed}");
    assert!(printed.contains("RunningServer"), "{printed}");
}
