//! What the PV controller's process tests share: the API server in process, the controller's
//! client, and waits with deadlines.

#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

/// The controller's client name (its requests are counted under it).
pub const CLIENT: &str = "pv-controller-test";

/// The API server in process, an administrator's client and the controller's client.
pub async fn serve() -> (apiserver::RunningServer, kube::Client, kube::Client) {
    let server = apiserver::serve(apiserver::Config::default(), std::future::pending())
        .await
        .unwrap();
    let admin = kube::Client::new(server.local_service("test-admin").unwrap(), "default");
    let client = kube::Client::new(server.local_service(CLIENT).unwrap(), "default");
    (server, admin, client)
}

/// Polls `f` until it gives a value; fails the test after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    sidecar_kit::testing::poll_for(what, timeout, String::new, || {
        let value = f();
        async move { value.await.ok_or_else(String::new) }
    })
    .await
}

/// Waits until the server has answered the controller's watch of `resource`: from then on the
/// watch is registered where closing watches finds it.
pub async fn watch_open(server: &apiserver::RunningServer, resource: &str) {
    wait_for(
        &format!("the controller's {resource} watch to be open"),
        Duration::from_secs(30),
        || async {
            server
                .request_counts()
                .keys()
                .any(|(verb, r, _, client)| {
                    verb == "WATCH" && r == resource && client.starts_with(CLIENT)
                })
                .then_some(())
        },
    )
    .await;
}
