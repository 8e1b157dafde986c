//! Closing watches (the fault admin's `closeWatches`, `RunningServer::close_watches`) ends them
//! before any later change: a test that closes a client's watch and then writes relies on the
//! client not seeing that write until it watches again, however late the server's watch task
//! runs.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

/// More than a watch's send buffer holds (512 KiB, plus what the connection buffers): the watch task
/// is still sending the initial objects (blocked until the client reads) when the watch is
/// closed and the next write is made, so both are waiting for it when it gets to them.
const FILLER: usize = 200;
/// Bytes of data in each filler object: 200 of them are 3.2 MB.
const FILLER_BYTES: usize = 16 * 1024;

fn filler(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"filler": "x".repeat(FILLER_BYTES)},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_closed_watch_passes_on_no_change_made_after_the_close() {
    let f = common::start().await;
    let client = kube::Client::new(f.server.local_service("close-test").unwrap(), "default");
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..FILLER {
        maps.create(&PostParams::default(), &filler(&format!("filler-{i}")))
            .await
            .unwrap();
    }
    // The watch task, held up sending, finds the close and the change both waiting. Taken in a
    // random order among its five arms, each round would pass the change on 2 times in 5;
    // 12 rounds all passing would be about 1 in 460. A close of another resource comes after
    // this watch's own: a task that kept only the last close would miss its own every time.
    for round in 0..12 {
        let stream = maps
            .watch(&WatchParams::default().timeout(60), "0")
            .await
            .unwrap();
        futures::pin_mut!(stream);
        // The first event read lets the watch task run up to its full buffer.
        let mut names = match stream.next().await.unwrap().unwrap() {
            WatchEvent::Added(map) => Vec::from_iter(map.metadata.name),
            other => panic!("round {round}: expected ADDED first, got {other:?}"),
        };
        tokio::task::yield_now().await;
        f.server.close_watches(Some("configmaps"));
        f.server.close_watches(Some("secrets"));
        let late = format!("after-close-{round}");
        maps.create(&PostParams::default(), &config_map(&late))
            .await
            .unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(event) = stream.next().await {
                if let Ok(WatchEvent::Added(map) | WatchEvent::Modified(map)) = event {
                    names.extend(map.metadata.name);
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "round {round}: the closed watch must end");
        assert!(
            names.len() >= FILLER,
            "round {round}: the objects listed before the close are all passed on ({} of them)",
            names.len()
        );
        assert!(
            !names.contains(&late),
            "round {round}: {late} was written after the close and must not be passed on"
        );
    }
}
