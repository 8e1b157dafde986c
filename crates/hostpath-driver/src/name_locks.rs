//! One CreateVolume at a time per volume name: a repeat of a request that is still making its
//! volume waits for it, and then finds the volume (or, if the first failed, makes it itself).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use tokio::sync::OwnedMutexGuard;

/// Locks by name; an entry lives only while someone holds or waits for it.
#[derive(Debug, Default)]
pub struct NameLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Held while a name is being worked on.
#[derive(Debug)]
pub struct NameGuard<'a> {
    owner: &'a NameLocks,
    name: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl NameLocks {
    /// Waits until no one else works on `name`.
    pub async fn lock(&self, name: &str) -> NameGuard<'_> {
        let lock = {
            let mut locks = self.locks.lock();
            locks.entry(name.to_string()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        NameGuard {
            owner: self,
            name: name.to_string(),
            guard: Some(guard),
        }
    }

    /// Names currently locked or waited for.
    pub fn len(&self) -> usize {
        self.locks.lock().len()
    }

    /// Whether no name is locked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for NameGuard<'_> {
    fn drop(&mut self) {
        self.guard = None;
        let mut locks = self.owner.locks.lock();
        // The map and this guard's lock are the only references: nobody waits.
        if locks
            .get(&self.name)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            locks.remove(&self.name);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_waits_for_the_first_and_entries_are_removed() {
        let locks = Arc::new(NameLocks::default());
        let first = locks.lock("a").await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _second = locks.lock("a").await;
                tx.send("second").unwrap();
            })
        };
        // Another name is independent.
        drop(locks.lock("b").await);
        assert!(
            rx.try_recv().is_err(),
            "the second holder got in while the first held it"
        );
        drop(first);
        assert_eq!(rx.recv().await, Some("second"));
        waiter.await.unwrap();
        assert!(locks.is_empty());
    }
}
