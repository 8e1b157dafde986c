//! Progress on the terminal while a scenario runs: claims created, Bound and deleted. On a
//! terminal one line is rewritten twice a second; otherwise (a log, CI) a line every 5 s.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Stops printing when dropped (and ends a rewritten line).
pub(super) struct Progress {
    task: tokio::task::JoinHandle<()>,
    terminal: bool,
}

/// One progress line.
pub(super) fn line(
    label: &str,
    elapsed: Duration,
    total: usize,
    counts: (usize, usize, usize),
) -> String {
    let (created, bound, deleted) = counts;
    format!(
        "{label}: {:>7.1} s  created {created}/{total}  Bound {bound}  deleted {deleted}",
        elapsed.as_secs_f64()
    )
}

impl Progress {
    /// Starts printing `label`'s counts, read from `counts`, against `total` claims.
    pub(super) fn start(
        label: String,
        total: usize,
        counts: impl Fn() -> (usize, usize, usize) + Send + 'static,
    ) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let every = if terminal {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(5)
        };
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let text = line(&label, started.elapsed(), total, counts());
                let mut err = std::io::stderr().lock();
                let _ = if terminal {
                    write!(err, "\r{text}\x1b[K")
                } else {
                    writeln!(err, "{text}")
                };
                let _ = err.flush();
            }
        });
        Progress { task, terminal }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
        if self.terminal {
            let _ = writeln!(std::io::stderr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_every_count() {
        assert_eq!(
            line(
                "storm run 1",
                Duration::from_millis(12_340),
                10_000,
                (10_000, 4_211, 3)
            ),
            "storm run 1:    12.3 s  created 10000/10000  Bound 4211  deleted 3"
        );
    }
}
