//! How a run waits: for its result, at most its timeout, stopped early by a process that
//! exited (a sidecar that could not start leaves nothing to wait for).

use std::time::Duration;

use testbed::Process;

/// Waits for `done` at most `timeout`, calling `report` every 10 s meanwhile (a run that
/// does not move shows it long before its timeout); `report` may give a reason to stop waiting.
pub(super) async fn wait_reporting<T>(
    timeout: Duration,
    done: impl Future<Output = T>,
    mut report: impl FnMut() -> Option<String>,
) -> Result<T, Unfinished> {
    let period = Duration::from_secs(10);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(done, deadline);
    loop {
        tokio::select! {
            value = &mut done => return Ok(value),
            () = &mut deadline => return Err(Unfinished::TimedOut),
            _ = ticks.tick() => {
                if let Some(why) = report() {
                    return Err(Unfinished::Stopped(why));
                }
            }
        }
    }
}

/// Why [`wait_reporting`] ended without its result.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unfinished {
    /// The timeout passed.
    TimedOut,
    /// The report found a reason to stop waiting (a process that exited).
    Stopped(String),
}

/// The first of `processes` that has exited (a sidecar that could not start, or crashed): its
/// name, exit status and log. The run cannot finish without it.
pub(super) fn first_exited(processes: &mut [Process]) -> Option<String> {
    processes.iter_mut().find_map(|process| {
        let status = process.exited()?;
        Some(format!(
            "{} exited ({status}); its log:\n{}",
            process.name(),
            process.log()
        ))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_its_result_its_timeout_or_a_reason_to_stop() {
        let done = wait_reporting(Duration::from_secs(60), async { 7 }, || None).await;
        assert_eq!(done, Ok(7));
        let pending = std::future::pending::<()>;
        let timed_out = wait_reporting(Duration::from_secs(60), pending(), || None).await;
        assert_eq!(timed_out, Err(Unfinished::TimedOut));
        // The third report stops it, long before the timeout.
        let mut reports = 0;
        let stopped = wait_reporting(Duration::from_secs(3600), pending(), || {
            reports += 1;
            (reports == 3).then(|| "csi-provisioner exited".to_string())
        })
        .await;
        assert_eq!(
            stopped,
            Err(Unfinished::Stopped("csi-provisioner exited".into()))
        );
    }

    #[test]
    fn a_process_that_exited_is_named_with_its_status_and_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut processes = vec![
            Process::spawn(
                "sleeper",
                Path::new("/bin/sleep"),
                &["600".into()],
                &[],
                dir.path(),
            )
            .unwrap(),
            Process::spawn(
                "failing",
                Path::new("/bin/sh"),
                &["-c".into(), "echo cannot start; exit 3".into()],
                &[],
                dir.path(),
            )
            .unwrap(),
        ];
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let why = loop {
            if let Some(why) = first_exited(&mut processes) {
                break why;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the exit was not seen"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(why.starts_with("failing exited (exit status: 3)"), "{why}");
        assert!(why.contains("cannot start"), "{why}");
    }
}
