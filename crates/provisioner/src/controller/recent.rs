//! Names remembered for a while: the volume handles DeleteVolume already removed and the PVs
//! whose deletion this process finished, so a retry or a stale cache event does not do the
//! work twice. Entries are forgotten oldest first, in constant time per name: the deletion of
//! 100,000 volumes within ten minutes remembers 100,000 names, and scanning all of them on
//! each insert (as a `retain` beyond a size did) made the deletion path quadratic.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How long a name is remembered.
pub(crate) const REMEMBER_FOR: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
struct Inner {
    /// When each name was last remembered.
    at: HashMap<Arc<str>, Instant>,
    /// The same names in the order they were remembered (a name remembered again appears
    /// twice; the older entry is skipped when it expires).
    order: VecDeque<(Instant, Arc<str>)>,
}

/// Names remembered for [`REMEMBER_FOR`].
#[derive(Debug, Default)]
pub(crate) struct Recent {
    inner: Mutex<Inner>,
}

impl Recent {
    /// Remembers `name` from now on.
    pub(crate) fn remember(&self, name: &str) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        Self::expire(&mut inner, now);
        let name: Arc<str> = Arc::from(name);
        inner.at.insert(name.clone(), now);
        inner.order.push_back((now, name));
    }

    /// Whether `name` was remembered less than [`REMEMBER_FOR`] ago.
    pub(crate) fn contains(&self, name: &str) -> bool {
        let inner = self.inner.lock();
        inner
            .at
            .get(name)
            .is_some_and(|at| at.elapsed() < REMEMBER_FOR)
    }

    /// Names remembered now (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().at.len()
    }

    fn expire(inner: &mut Inner, now: Instant) {
        while let Some((at, _)) = inner.order.front() {
            if now.saturating_duration_since(*at) < REMEMBER_FOR {
                break;
            }
            let Some((at, name)) = inner.order.pop_front() else {
                break;
            };
            // Remembered again since: the newer entry stays.
            if inner.at.get(&name) == Some(&at) {
                inner.at.remove(&name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn names_are_remembered_for_a_while_and_forgotten_oldest_first() {
        let recent = Recent::default();
        recent.remember("a");
        tokio::time::advance(Duration::from_secs(300)).await;
        recent.remember("b");
        assert!(recent.contains("a") && recent.contains("b"));
        tokio::time::advance(Duration::from_secs(300)).await;
        assert!(!recent.contains("a"), "600 s after: forgotten");
        assert!(recent.contains("b"));
        // Remembering again renews the name; its old entry expiring does not drop it.
        recent.remember("b");
        tokio::time::advance(Duration::from_secs(301)).await;
        recent.remember("c");
        assert!(recent.contains("b"), "renewed 301 s ago");
        assert_eq!(recent.len(), 2, "a expired and was dropped when c came");
        tokio::time::advance(Duration::from_secs(600)).await;
        recent.remember("d");
        assert_eq!(recent.len(), 1);
        assert!(!recent.contains("b") && !recent.contains("c") && recent.contains("d"));
    }
}
