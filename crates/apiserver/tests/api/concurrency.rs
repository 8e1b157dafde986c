//! Writes to one object at once.

use super::*;

/// Runs `each(0)`, ..., `each(n - 1)` as tasks at once and waits for all; their outputs in
/// that order (a panic in one fails the test).
async fn all_at_once<F, Fut>(n: usize, each: F) -> Vec<Fut::Output>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let tasks = (0..n).map(|w| tokio::spawn(each(w)));
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// That `data` holds `value` under each of `<prefix>0` to `<prefix>{n-1}`.
fn assert_every_key(data: &BTreeMap<String, String>, prefix: &str, n: usize, value: &str) {
    for w in 0..n {
        let key = format!("{prefix}{w}");
        assert_eq!(data.get(&key).map(String::as_str), Some(value), "{data:?}");
    }
}

/// Concurrent updates: those that name no resourceVersion all succeed, each on the version
/// it replaces; of those that name the same one, one wins and the others get a conflict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_updates_with_and_without_resource_versions() {
    let (_server, client, _stop) = start(None).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("u")).await.unwrap();
    all_at_once(16, |w| {
        let api = api.clone();
        async move {
            for i in 0..10 {
                let mut c = cm("u");
                c.data = Some(BTreeMap::from([("k".to_string(), format!("{w}-{i}"))]));
                api.replace("u", &PostParams::default(), &c).await.unwrap();
            }
        }
    })
    .await;
    // With resourceVersions: of two updates from one version, one wins.
    let read = api.get("u").await.unwrap();
    let results = all_at_once(8, |w| {
        let (api, mut c) = (api.clone(), read.clone());
        c.data = Some(BTreeMap::from([("k".to_string(), format!("rv-{w}"))]));
        async move { api.replace("u", &PostParams::default(), &c).await }
    })
    .await;
    let won = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(won, 1, "{results:?}");
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, kube::Error::Api(s) if s.code == 409)),
        "{results:?}"
    );
    let last = api.get("u").await.unwrap();
    let winner = results.iter().find_map(|r| r.as_ref().ok()).unwrap();
    assert_eq!(last.data, winner.data);
}

/// Patches and server-side applies that name no resourceVersion apply to the newest version,
/// durable or not: many at once on one object all succeed (kube-apiserver retries them; none
/// is a conflict). Before, they read the durable version while the write checked the newest,
/// and most failed with "the object keeps changing".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_without_a_resource_version_all_apply() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client, _stop) = start(Some(dir.path().to_path_buf())).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("p")).await.unwrap();
    all_at_once(16, |w| {
        let api = api.clone();
        async move {
            for i in 0..10 {
                let patch = json!({"data": {format!("k{w}"): format!("{i}")}});
                api.patch("p", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        }
    })
    .await;
    assert_every_key(&api.get("p").await.unwrap().data.unwrap(), "k", 16, "9");
    // Server-side applies by as many field managers, each of its own key, the same.
    all_at_once(16, |w| {
        let api = api.clone();
        async move {
            for i in 0..5 {
                let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "p"}, "data": {format!("a{w}"): format!("{i}")}});
                let params = PatchParams::apply(&format!("manager-{w}"));
                api.patch("p", &params, &Patch::Apply(&config))
                    .await
                    .unwrap();
            }
        }
    })
    .await;
    assert_every_key(&api.get("p").await.unwrap().data.unwrap(), "a", 16, "4");
}
