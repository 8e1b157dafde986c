//! Keys remembered for a while (a window): the provisioner's deleted volume handles and
//! finished PVs, the event recorder's recent events. Expired keys are dropped by a scan that
//! runs only when the map has doubled since the last one, so each insert costs constant time
//! on average. (A scan on every insert beyond 10,000 keys, with nothing old enough to drop
//! within the window, made a storm of 100,000 claims quadratic in both places.) A bounded map
//! ([`Recent::bounded`]) instead drops, whenever one key more than its limit comes, the expired
//! keys and then, unless that left at most half the limit, all but the newest half: also
//! constant time a key on average.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Fewest keys before the first scan.
const FIRST_SCAN: usize = 10_000;

#[derive(Debug)]
struct Inner<K, V> {
    /// When each key was last remembered, and what is kept with it.
    at: HashMap<K, (Instant, V)>,
    /// The size at which the next scan for expired keys runs.
    scan_at: usize,
}

/// Keys remembered for `window`, each with a value `V` (none by default).
#[derive(Debug)]
pub struct Recent<K, V = ()> {
    window: Duration,
    /// Most keys kept, if bounded: beyond it the older half is forgotten early.
    limit: Option<usize>,
    inner: Mutex<Inner<K, V>>,
}

impl<K: Hash + Eq> Recent<K> {
    /// Remembers `key` from now on.
    pub fn remember(&self, key: K) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        self.insert(&mut inner, key, now, ());
    }

    /// Remembers `key` unless it is remembered already; true when it was not (the caller goes
    /// on), false when it was (a repeat within the window).
    pub fn first_time(&self, key: K) -> bool {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if inner
            .at
            .get(&key)
            .is_some_and(|(at, ())| now.saturating_duration_since(*at) < self.window)
        {
            return false;
        }
        self.insert(&mut inner, key, now, ());
        true
    }
}

impl<K: Hash + Eq, V> Recent<K, V> {
    /// Nothing remembered yet; keys are forgotten `window` after they were last remembered.
    pub fn new(window: Duration) -> Self {
        Recent {
            window,
            limit: None,
            inner: Mutex::new(Inner {
                at: HashMap::new(),
                scan_at: FIRST_SCAN,
            }),
        }
    }

    /// As [`Recent::new`], keeping at most `limit` keys (at least 2): when one more comes, the
    /// expired keys go, then if need be the older half, as a bounded cache does (client-go's
    /// event correlator keeps 4,096). For what may be remembered again at worst, not for what
    /// must not happen twice.
    pub fn bounded(window: Duration, limit: usize) -> Self {
        Recent {
            limit: Some(limit.max(2)),
            ..Recent::new(window)
        }
    }

    /// A repeat of `key` within the window (since it was last remembered) gets its value to
    /// change (`repeat`), and the key is renewed; otherwise `key` is remembered from now on
    /// with the value `first` makes. What `repeat` returns, or None for a first time.
    pub fn renew_or_insert<R>(
        &self,
        key: K,
        first: impl FnOnce() -> V,
        repeat: impl FnOnce(&mut V) -> R,
    ) -> Option<R> {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if let Some((at, value)) = inner.at.get_mut(&key)
            && now.saturating_duration_since(*at) < self.window
        {
            *at = now;
            return Some(repeat(value));
        }
        self.insert(&mut inner, key, now, first());
        None
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
            .is_some_and(|(at, _)| at.elapsed() < self.window)
    }

    /// Forgets `key` before its window ends (what it guarded against cannot happen any more).
    pub fn forget<Q>(&self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.lock().at.remove(key);
    }

    /// Hands every value remembered within the window to `f`, under the map's lock.
    pub fn for_each_mut(&self, mut f: impl FnMut(&mut V)) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        for (at, value) in inner.at.values_mut() {
            if now.saturating_duration_since(*at) < self.window {
                f(value);
            }
        }
    }

    /// Keys remembered now (expired ones included until the next scan).
    pub fn len(&self) -> usize {
        self.inner.lock().at.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&self, inner: &mut Inner<K, V>, key: K, now: Instant, value: V) {
        inner.at.insert(key, (now, value));
        if let Some(limit) = self.limit
            && inner.at.len() > limit
        {
            let window = self.window;
            inner
                .at
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < window);
            // Unless the expired keys made room for half the limit, the older keys go too, so
            // that the next pass is at least half the limit of inserts away (constant time a
            // key on average, however the keys expire).
            if inner.at.len() > limit / 2 {
                // The newest half stays: those remembered at or after the median time.
                let mut times: Vec<Instant> = inner.at.values().map(|(at, _)| *at).collect();
                let newest = limit / 2;
                let cut = times.len() - newest;
                let (_, median, _) = times.select_nth_unstable(cut);
                let median = *median;
                inner.at.retain(|_, (at, _)| *at >= median);
                if inner.at.len() > newest {
                    // More than half remembered at that same instant: those go too.
                    inner.at.retain(|_, (at, _)| *at > median);
                }
            }
            return;
        }
        if inner.at.len() >= inner.scan_at {
            let window = self.window;
            inner
                .at
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < window);
            inner.scan_at = FIRST_SCAN.max(inner.at.len() * 2);
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
        tokio::time::advance(Duration::from_secs(600)).await;
        recent.remember("d".into());
        assert!(!recent.contains("b") && !recent.contains("c") && recent.contains("d"));
        recent.forget("d");
        assert!(!recent.contains("d"), "forgotten on purpose");
    }

    /// Expired keys go in a scan that runs when the map has doubled: a map that keeps filling
    /// within the window is scanned a logarithmic number of times, not on every insert.
    #[tokio::test(start_paused = true)]
    async fn expired_keys_are_dropped_by_scans_when_the_map_doubles() {
        let recent: Recent<u32> = Recent::new(Duration::from_secs(10));
        for k in 0..(FIRST_SCAN as u32 - 1) {
            recent.remember(k);
        }
        assert_eq!(recent.len(), FIRST_SCAN - 1);
        tokio::time::advance(Duration::from_secs(10)).await;
        recent.remember(u32::MAX);
        assert_eq!(
            recent.len(),
            1,
            "the scan at the threshold dropped the expired keys"
        );
        assert_eq!(recent.inner.lock().scan_at, FIRST_SCAN);
        for k in 0..(3 * FIRST_SCAN as u32) {
            recent.remember(k);
        }
        assert_eq!(
            recent.len(),
            3 * FIRST_SCAN + 1,
            "nothing expired within the window"
        );
        assert!(recent.inner.lock().scan_at > 3 * FIRST_SCAN);
    }

    /// A bounded map never holds more than its limit: past it the expired keys go, then the
    /// older half, and the newest keys are still remembered.
    #[tokio::test(start_paused = true)]
    async fn a_bounded_map_forgets_its_older_half_past_the_limit() {
        let recent: Recent<u32> = Recent::bounded(Duration::from_secs(600), 100);
        for k in 0..1000u32 {
            recent.remember(k);
            tokio::time::advance(Duration::from_millis(1)).await;
            assert!(recent.len() <= 100, "{} keys after {k}", recent.len());
        }
        assert!(recent.len() >= 50, "the newer half stays: {}", recent.len());
        assert!(
            (950..1000).all(|k| recent.contains(&k)),
            "the newest 50 stay"
        );
        assert!(!recent.contains(&0) && !recent.contains(&899));
        // Expired keys go first: after the window, a new key leaves only the new ones.
        tokio::time::advance(Duration::from_secs(600)).await;
        for k in 2000..2051u32 {
            recent.remember(k);
        }
        assert!((2000..2051).all(|k| recent.contains(&k)));
        assert_eq!(
            recent.len(),
            51,
            "the 100 old keys expired: {}",
            recent.len()
        );
        // Keys remembered at one instant (the clock stands still) still keep to the limit.
        let still: Recent<u32> = Recent::bounded(Duration::from_secs(600), 4);
        for k in 0..20u32 {
            still.remember(k);
            assert!(still.len() <= 4, "{} keys after {k}", still.len());
        }
    }

    /// A repeat within the window changes the value and renews the key (the window counts
    /// from the last repeat); after the window the key starts again with a new value.
    #[tokio::test(start_paused = true)]
    async fn a_repeat_renews_its_key_and_changes_its_value() {
        let recent: Recent<u64, u32> = Recent::new(Duration::from_secs(10));
        let bump = |count: &mut u32| {
            *count += 1;
            *count
        };
        assert_eq!(recent.renew_or_insert(7, || 1, bump), None);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(recent.renew_or_insert(7, || 1, bump), Some(2));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(
            recent.renew_or_insert(7, || 1, bump),
            Some(3),
            "renewed 6 s ago"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(recent.renew_or_insert(7, || 1, bump), None, "a new series");
        assert_eq!(recent.renew_or_insert(7, || 1, bump), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn every_value_within_the_window_is_visited() {
        let recent: Recent<u64, u32> = Recent::new(Duration::from_secs(10));
        recent.renew_or_insert(1, || 1, |_| ());
        tokio::time::advance(Duration::from_secs(6)).await;
        recent.renew_or_insert(2, || 2, |_| ());
        tokio::time::advance(Duration::from_secs(6)).await;
        let mut seen = Vec::new();
        recent.for_each_mut(|v| {
            *v += 10;
            seen.push(*v);
        });
        assert_eq!(seen, [12], "key 1 expired, key 2 changed");
        assert_eq!(recent.renew_or_insert(2, || 0, |v| *v), Some(12));
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
