//! A guard that takes a task's key out of one of the server's sets of running tasks.

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
