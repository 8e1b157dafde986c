//! Waiting on observable state with a deadline: every poll of the process tests goes through
//! here, one step, one failure message.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

/// How often a condition is looked at again.
pub const STEP: Duration = Duration::from_millis(50);

fn message(what: &str, seen: &str, context: &str) -> String {
    let seen = if seen.is_empty() {
        String::new()
    } else {
        format!(": last seen {seen}")
    };
    let context = if context.is_empty() {
        String::new()
    } else {
        format!("\n{context}")
    };
    format!("timed out waiting for {what}{seen}{context}")
}

/// Polls `f` until it gives `Ok`; an `Err` says what was seen instead. After `timeout` the
/// test fails naming `what`, the last thing seen and `context()` (a process's log).
pub async fn poll_for<T, F, Fut>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut f: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = match f().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            message(what, &seen, &context())
        );
        tokio::time::sleep(STEP).await;
    }
}

/// Polls `f` until it holds (as [`poll_for`]).
pub async fn poll_until<F, Fut>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut f: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_for(what, timeout, context, || {
        let holds = f();
        async move {
            if holds.await {
                Ok(())
            } else {
                Err(String::new())
            }
        }
    })
    .await
}

/// [`poll_for`] for a test without a runtime: the thread sleeps between looks.
pub fn poll_blocking<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let seen = match f() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            message(what, &seen, "")
        );
        std::thread::sleep(STEP);
    }
}
