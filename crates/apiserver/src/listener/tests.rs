#![allow(clippy::unwrap_used)]
use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn limits() -> Limits {
    Limits {
        max_connections: 8,
        handshake: Duration::from_secs(1),
        headers: Duration::from_secs(5),
        unauthenticated: 2,
        unauthenticated_life: Duration::from_secs(5),
        idle: Duration::from_secs(20),
    }
}

/// `/healthz` answers anyone; `/authed` marks its connection as the handler does for a
/// request with a valid token; `/watch` too, and its body never ends.
fn router() -> axum::Router {
    let authed = |request: &axum::extract::Request| {
        request.extensions().get::<Authenticated>().unwrap().mark();
    };
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/authed",
            axum::routing::get(move |request: axum::extract::Request| async move {
                authed(&request);
                "yes"
            }),
        )
        .route(
            "/watch",
            axum::routing::get(move |request: axum::extract::Request| async move {
                authed(&request);
                let never = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
                axum::body::Body::from_stream(never)
            }),
        )
}

/// A connection served in the background, and the sender that evicts it; the task
/// resolves when the server lets the connection go.
fn serve(
    server_side: tokio::io::DuplexStream,
) -> (
    tokio::sync::watch::Sender<bool>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (evict, evicted) = oneshot::channel();
    let connection = Connection {
        router: router(),
        limits: limits(),
        accepted: Instant::now(),
        evicted,
        on_authenticated: Arc::new(|| {}),
    };
    let task = tokio::spawn(connection.serve(server_side, stopped));
    (stop, evict, task)
}

async fn get(client: &mut tokio::io::DuplexStream, path: &str) -> String {
    client
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = client.read(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

async fn closed_within(task: tokio::task::JoinHandle<()>, within: Duration, what: &str) {
    tokio::time::timeout(within, task)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_client_that_never_sends_a_request_is_cut_off() {
    // Nothing at all after the handshake.
    let (_client, server) = tokio::io::duplex(4096);
    let (_stop, _evict, task) = serve(server);
    closed_within(
        task,
        Duration::from_secs(60),
        "a silent connection must be closed",
    )
    .await;
    // HTTP/2: the preface, then silence (the HTTP/1 header timeout does not apply).
    let (mut client, server) = tokio::io::duplex(4096);
    let (_stop, _evict, task) = serve(server);
    client
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let what = "an HTTP/2 connection without a request must be closed";
    closed_within(task, Duration::from_secs(60), what).await;
}

#[tokio::test(start_paused = true)]
async fn unauthenticated_health_checks_do_not_keep_a_connection() {
    // Health checks every 2 s, each within HTTP/1's header limit: the connection is still
    // closed when its unauthenticated life (5 s) is over.
    let (mut client, server) = tokio::io::duplex(4096);
    let (_stop, _evict, task) = serve(server);
    let started = Instant::now();
    while !task.is_finished() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "an unauthenticated connection that keeps asking must still be closed"
        );
        let answer = get(&mut client, "/healthz").await;
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 200"),
            "{answer}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "not before its life is over"
    );
}

#[tokio::test(start_paused = true)]
async fn an_authenticated_client_is_kept_past_the_unauthenticated_life_until_it_is_idle() {
    let (mut client, server) = tokio::io::duplex(4096);
    let (_stop, _evict, task) = serve(server);
    // Requests at 0 s and 4 s; at 8 s the connection is past its unauthenticated life
    // and not idle for 20 s: it must still be open.
    for _ in 0..2 {
        let answer = get(&mut client, "/authed").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    assert!(
        !task.is_finished(),
        "a connection that authenticated is kept"
    );
    // Idle HTTP/1 closes at the header limit (5 s here) or the idle limit, whichever comes
    // first.
    closed_within(
        task,
        Duration::from_secs(60),
        "an idle connection must be closed",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn http2_connections_close_when_idle_and_not_while_a_watch_streams() {
    use http_body_util::BodyExt;
    let (client, server) = tokio::io::duplex(1 << 16);
    let (_stop, _evict, task) = serve(server);
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .handshake::<_, http_body_util::Empty<bytes::Bytes>>(TokioIo::new(client))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = |path: &str| {
        hyper::Request::get(format!("http://x{path}"))
            .body(http_body_util::Empty::new())
            .unwrap()
    };
    let answer = sender.send_request(request("/authed")).await.unwrap();
    assert_eq!(
        answer.into_body().collect().await.unwrap().to_bytes(),
        "yes"
    );
    // A watch: its stream is a request in flight, for much longer than the idle limit.
    let watch = sender.send_request(request("/watch")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert!(
        !task.is_finished(),
        "a streaming watch keeps its connection"
    );
    // Once it ends, the connection is idle and closed.
    drop(watch);
    closed_within(
        task,
        Duration::from_secs(60),
        "an idle HTTP/2 connection must be closed",
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_evicted_connection_closes() {
    let (mut client, server) = tokio::io::duplex(4096);
    let (_stop, evict, task) = serve(server);
    assert!(
        get(&mut client, "/healthz")
            .await
            .starts_with("HTTP/1.1 200")
    );
    evict.send(()).unwrap();
    closed_within(
        task,
        Duration::from_secs(1),
        "an evicted connection must close",
    )
    .await;
}

#[test]
fn new_unauthenticated_connections_close_the_oldest_beyond_the_share() {
    let pending = Pending::default();
    let mut first = pending.add(1, 2);
    let mut second = pending.add(2, 2);
    pending.remove(2); // authenticated
    let mut third = pending.add(3, 2);
    assert!(first.try_recv().is_err(), "two pending: room for the third");
    assert!(matches!(
        second.try_recv(),
        Err(oneshot::error::TryRecvError::Closed)
    ));
    let _fourth = pending.add(4, 2);
    assert_eq!(first.try_recv(), Ok(()), "the oldest makes way");
    assert!(third.try_recv().is_err());
    assert_eq!(Limits::unauthenticated_share(8), 2);
    assert_eq!(Limits::unauthenticated_share(1), 1);
}

#[test]
fn the_connection_limit_stays_below_the_file_limit() {
    let limits = Limits::for_this_process();
    let files = open_file_limit().unwrap_or(1024);
    assert!((limits.max_connections as u64) < files.max(16));
    assert!(limits.max_connections >= 8);
    assert!(limits.unauthenticated < limits.max_connections);
}
