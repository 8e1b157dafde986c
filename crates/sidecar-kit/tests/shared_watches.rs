//! Shared watches against our API server: controllers that join before the start share one
//! watch and one cache per kind, ready for each one's waiter; one that comes later
//! watches on its own; one that stops is told nothing more.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::Event;
use parking_lot::Mutex;
use sidecar_kit::runtime::Cache;
use sidecar_kit::watch::{SharedWatches, Watches, each};

/// Names each listener was told of, in order.
type Heard = Arc<Mutex<Vec<String>>>;

fn listener(heard: &Heard) -> impl Fn(&Event<ConfigMap>) + Send + 'static {
    let heard = heard.clone();
    move |event| {
        each(event, |cm| {
            heard
                .lock()
                .push(cm.metadata.name.clone().unwrap_or_default())
        })
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config_map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.annotations = Some(
        [(
            "kubectl.kubernetes.io/last-applied-configuration".to_string(),
            "{}".to_string(),
        )]
        .into(),
    );
    cm
}

#[tokio::test]
async fn controllers_joining_before_the_start_share_one_watch() {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(apiserver::Config::default(), async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &config_map("before"))
        .await
        .unwrap();
    let watches_of_config_maps = || {
        server
            .request_counts()
            .into_iter()
            .filter(|((verb, resource, _, _), _)| verb == "WATCH" && resource == "configmaps")
            .map(|(_, n)| n)
            .sum::<u64>()
    };

    let shared = SharedWatches::default();
    let (a, b) = (Watches::sharing(&shared), Watches::sharing(&shared));
    let (heard_a, heard_b): (Heard, Heard) = Default::default();
    let store_a = a.reflect(api.clone(), listener(&heard_a));
    let store_b = b.reflect_for_updates(api.clone(), listener(&heard_b));
    // Each controller waits for the kind's cache on a task of its own, before the watch
    // starts, as the runtime does: every one of them must be woken (kube-runtime's own wait
    // wakes only the last).
    let waiting: Vec<_> = [store_a.clone(), store_b.clone()]
        .into_iter()
        .map(|store| tokio::spawn(store.synced()))
        .collect();
    shared.start();
    for waiter in waiting {
        let ready = tokio::time::timeout(Duration::from_secs(30), waiter).await;
        assert!(matches!(ready, Ok(Ok(()))), "a cache never became ready");
    }
    until("both listeners hear the listed object", || {
        heard_a.lock().contains(&"before".to_string())
            && heard_b.lock().contains(&"before".to_string())
    })
    .await;
    api.create(&PostParams::default(), &config_map("x"))
        .await
        .unwrap();
    until("both listeners hear the new object", || {
        heard_a.lock().contains(&"x".to_string()) && heard_b.lock().contains(&"x".to_string())
    })
    .await;
    // Both caches hold the same objects; the annotations are kept for both, the field
    // ownership dropped.
    let (mut names_a, mut names_b): (Vec<_>, Vec<_>) = (
        store_a
            .state()
            .iter()
            .map(|c| c.metadata.name.clone())
            .collect(),
        store_b
            .state()
            .iter()
            .map(|c| c.metadata.name.clone())
            .collect(),
    );
    names_a.sort();
    names_b.sort();
    assert_eq!(names_a, vec![Some("before".into()), Some("x".into())]);
    assert_eq!(names_a, names_b);
    let x = store_a
        .state()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("x"));
    let x = x.unwrap();
    // One cache for the kind: both controllers read the same object, decoded once.
    let x_of_b = store_b
        .state()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("x"));
    assert!(
        Arc::ptr_eq(&x, &x_of_b.unwrap()),
        "two copies of one object"
    );
    assert!(x.metadata.managed_fields.is_none());
    assert!(
        x.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key("kubectl.kubernetes.io/last-applied-configuration")
    );
    assert_eq!(
        watches_of_config_maps(),
        1,
        "one watch for both controllers"
    );

    // A controller asking after the start watches on its own and still gets everything.
    let c = Watches::sharing(&shared);
    let heard_c: Heard = Default::default();
    let store_c = c.reflect(api.clone(), listener(&heard_c));
    until("the late controller lists both objects", || {
        heard_c.lock().len() >= 2 && store_c.state().len() == 2
    })
    .await;
    until("the late controller watches on its own", || {
        watches_of_config_maps() == 2
    })
    .await;
    // Its own watch trims as `reflect` does.
    let late_x = store_c
        .state()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some("x"));
    let late_x = late_x.unwrap();
    assert!(
        late_x
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| a.is_empty())
    );

    // A stopped controller is told nothing more: `a` joined before `b`, and each event is
    // passed to the listeners in that order, so once `b` heard "y", `a` would have too.
    a.stop();
    api.create(&PostParams::default(), &config_map("y"))
        .await
        .unwrap();
    until("the other listener hears the next object", || {
        heard_b.lock().contains(&"y".to_string())
    })
    .await;
    assert!(!heard_a.lock().contains(&"y".to_string()));
    assert_eq!(heard_a.lock().as_slice(), ["before", "x"]);

    // The shared watch runs while one of its controllers does, and stops with the last.
    assert_eq!(shared.running(), 1);
    b.stop();
    until("the shared watch stops with its last controller", || {
        shared.running() == 0
    })
    .await;
    c.stop();
    let _ = stop.send(());
    server.join().await;
}
