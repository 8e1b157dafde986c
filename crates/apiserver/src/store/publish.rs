//! Making durable changes visible: the store's objects, its watch history and the live feeds
//! of watchers, in resourceVersion order, as the log reports what is on disk.

use std::sync::{Arc, Weak};

use super::{Change, Core, Inner, Pending, Stored};

/// The log's report that `rv` is on disk: publishes up to it, if the store is still there.
pub(super) fn publish_weak(core: &Weak<Core>, rv: u64) {
    if let Some(core) = core.upgrade() {
        let mut inner = core.inner.lock();
        let released = publish(&core, &mut inner, rv);
        // Freeing the old objects (whole JSON trees) is not done under the lock every write
        // takes.
        drop(inner);
        drop(released);
    }
}

/// What publishing lets go of: the objects replaced or deleted, the pending copies of those
/// published, and the changes that left the history. Dropped by the caller once the store's
/// lock is released (a popped change no watcher listens to, and the slots a feed overwrites,
/// are still freed under it).
#[derive(Default)]
pub(super) struct Released {
    objects: Vec<Stored>,
    changes: Vec<Arc<Change>>,
}

/// Makes every pending change up to `durable` visible, in order, and tells watchers.
pub(super) fn publish(core: &Core, inner: &mut Inner, durable: u64) -> Released {
    let mut released = Released::default();
    while inner
        .pending
        .front()
        .is_some_and(|p| p.change.rv <= durable)
    {
        let Some(Pending {
            key,
            change,
            bytes,
            stored,
        }) = inner.pending.pop_front()
        else {
            break;
        };
        let replaced = match stored {
            Some(stored) => inner.objects.insert(key.clone(), stored),
            None => inner.objects.remove(&key),
        };
        released.objects.extend(replaced);
        if inner
            .overlay
            .get(&key)
            .is_some_and(|(rv, _)| *rv == change.rv)
            && let Some((_, pending)) = inner.overlay.remove(&key)
        {
            released.objects.extend(pending);
        }
        inner.visible_rv = change.rv;
        for observer in core.observers.read().iter() {
            observer(&change);
        }
        core.visible.send_replace(change.rv);
        inner
            .history
            .push_back((Arc::new(change.without_json()), bytes));
        inner.history_bytes += bytes;
        while inner.history.len() > core.history_cap || inner.history_bytes > core.history_budget {
            let Some((old, size)) = inner.history.pop_front() else {
                break;
            };
            inner.history_bytes -= size;
            inner.compacted = old.rv;
            released.changes.push(old);
        }
        if let Some(feed) = inner.feeds.get(&change.resource) {
            if feed.receiver_count() > 0 {
                let _ = feed.send(change);
            } else {
                inner.feeds.remove(&change.resource);
            }
        }
    }
    released
}
