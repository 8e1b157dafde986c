//! The server's cleanup tasks (a namespace's emptying, a definition's custom resources): the
//! guard that takes a task's key out of its set, and the pause between rounds.

use std::time::Duration;

use parking_lot::Mutex;

use super::App;

/// Takes `key` out of one of the server's sets of running tasks (`which`) when dropped,
/// however the task holding it ends, so a later request may start another; the server is held
/// weakly, as the task holds it.
pub(crate) struct LeavesSet {
    app: std::sync::Weak<App>,
    which: fn(&App) -> &Mutex<std::collections::HashSet<String>>,
    key: String,
    armed: bool,
}

impl LeavesSet {
    pub(crate) fn new(
        app: std::sync::Weak<App>,
        which: fn(&App) -> &Mutex<std::collections::HashSet<String>>,
        key: String,
    ) -> Self {
        LeavesSet {
            app,
            which,
            key,
            armed: true,
        }
    }

    /// The task left the set itself (under the set's lock): dropped, this removes nothing, as
    /// the key may by then be a new task's.
    pub(crate) fn defuse(mut self) {
        self.armed = false;
    }
}

impl Drop for LeavesSet {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(app) = self.app.upgrade() {
            (self.which)(&app).lock().remove(&self.key);
        }
    }
}

/// The pause after round `round` of a cleanup task (a namespace's emptying, a definition's
/// custom resources): soon at first, then every second, then every 5 seconds (a round reads
/// every stored key, or every object of a type).
pub(crate) fn round_pause(round: u32) -> Duration {
    match round {
        0..10 => Duration::from_millis(200),
        10..60 => Duration::from_secs(1),
        _ => Duration::from_secs(5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cleanup_task_pauses_longer_as_it_waits() {
        let rows = [
            (0, 200),
            (9, 200),
            (10, 1000),
            (59, 1000),
            (60, 5000),
            (u32::MAX, 5000),
        ];
        for (round, millis) in rows {
            assert_eq!(
                round_pause(round),
                Duration::from_millis(millis),
                "round {round}"
            );
        }
    }
}
