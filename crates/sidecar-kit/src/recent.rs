//! Keys remembered for a while (a window), forgotten oldest first in constant time per key:
//! the provisioner's deleted volume handles and finished PVs, the event recorder's recent
//! events. Remembering 100,000 keys within a window and scanning all of them on each insert
//! (as a `retain` beyond a size did, in both places) made a storm of 100,000 claims quadratic.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
struct Inner<K> {
    /// When each key was last remembered.
    at: HashMap<K, Instant>,
    /// The same keys in the order they were remembered (a key remembered again appears twice;
    /// the older entry is skipped when it expires).
    order: VecDeque<(Instant, K)>,
}

/// Keys remembered for `window`.
#[derive(Debug)]
pub struct Recent<K> {
    window: Duration,
    inner: Mutex<Inner<K>>,
}

impl<K: Hash + Eq + Clone> Recent<K> {
    /// Nothing remembered yet; keys are forgotten `window` after they were last remembered.
    pub fn new(window: Duration) -> Self {
        Recent {
            window,
            inner: Mutex::new(Inner {
                at: HashMap::new(),
                order: VecDeque::new(),
            }),
        }
    }

    /// Remembers `key` from now on.
    pub fn remember(&self, key: K) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        self.expire(&mut inner, now);
        inner.at.insert(key.clone(), now);
        inner.order.push_back((now, key));
    }

    /// Whether `key` was remembered less than the window ago.
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = self.inner.lock();
        inner
            .at
            .get(key)
            .is_some_and(|at| at.elapsed() < self.window)
    }

    /// Remembers `key` unless it is remembered already; true when it was not (the caller goes
    /// on), false when it was (a repeat within the window).
    pub fn first_time(&self, key: K) -> bool {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if inner
            .at
            .get(&key)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.window)
        {
            return false;
        }
        self.expire(&mut inner, now);
        inner.at.insert(key.clone(), now);
        inner.order.push_back((now, key));
        true
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.inner.lock().at.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expire(&self, inner: &mut Inner<K>, now: Instant) {
        while let Some((at, _)) = inner.order.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            let Some((at, key)) = inner.order.pop_front() else {
                break;
            };
            // Remembered again since: the newer entry stays.
            if inner.at.get(&key) == Some(&at) {
                inner.at.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn keys_are_remembered_for_a_while_and_forgotten_oldest_first() {
        let recent: Recent<String> = Recent::new(Duration::from_secs(600));
        recent.remember("a".into());
        tokio::time::advance(Duration::from_secs(300)).await;
        recent.remember("b".into());
        assert!(recent.contains("a") && recent.contains("b"));
        tokio::time::advance(Duration::from_secs(300)).await;
        assert!(!recent.contains("a"), "600 s after: forgotten");
        assert!(recent.contains("b"));
        // Remembering again renews the key; its old entry expiring does not drop it.
        recent.remember("b".into());
        tokio::time::advance(Duration::from_secs(301)).await;
        recent.remember("c".into());
        assert!(recent.contains("b"), "renewed 301 s ago");
        assert_eq!(recent.len(), 2, "a expired and was dropped when c came");
        tokio::time::advance(Duration::from_secs(600)).await;
        recent.remember("d".into());
        assert_eq!(recent.len(), 1);
        assert!(!recent.contains("b") && !recent.contains("c") && recent.contains("d"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_within_the_window_is_not_a_first_time() {
        let recent: Recent<u64> = Recent::new(Duration::from_secs(10));
        assert!(recent.first_time(7));
        assert!(!recent.first_time(7));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(recent.first_time(7), "after the window it counts again");
        assert_eq!(recent.len(), 1);
    }
}
