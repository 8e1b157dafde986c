//! Watches shared by the controllers of one process (the embedded stack's), as
//! kube-controller-manager's controllers share informers: one watch and one cache per kind,
//! each event decoded once, applied to the cache once, then passed to the handler of every
//! controller that asked for the kind.
//!
//! kube-runtime's `Store::wait_until_ready` wakes only the last task that waited on a store;
//! the runtime's wait for a cache ([`crate::runtime::Cache`]) asks again now and then, so
//! every controller waiting on the shared cache starts.
//!
//! Controllers join before the shared watches start ([`SharedWatches::start`]): a controller
//! that asks after that gets a watch of its own, so none misses the initial list. A shared
//! watch lists under the identity of the first controller that asked for its kind, and keeps
//! every annotation (only the field ownership is dropped, as [`Watches::reflect_for_updates`]
//! does), so it serves controllers that write objects back whole and those that only read.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;

use crate::watch::Watches;

/// A controller listening to a shared watch: the number it joined with, its handler.
struct Listener<K> {
    id: u64,
    on_event: Handler<K>,
}

/// What a controller does with each event, after the kind's cache has it.
type Handler<K> = Box<dyn Fn(&watcher::Event<K>) + Send>;

/// The controllers listening to one kind.
type Listeners<K> = Arc<Mutex<Vec<Listener<K>>>>;

/// One kind's shared watch: its listeners, its cache, its task.
type Kind<K> = (Listeners<K>, Store<K>, Watches);

/// Starts one shared watch.
type Starter = Box<dyn FnOnce() + Send>;

/// The shared watches of one process; clones share them.
#[derive(Clone, Default)]
pub struct SharedWatches {
    inner: Arc<Mutex<Inner>>,
}

impl Debug for SharedWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.lock();
        f.debug_struct("SharedWatches")
            .field("kinds", &inner.tasks.len())
            .field("started", &inner.started)
            .finish()
    }
}

#[derive(Default)]
struct Inner {
    /// The `Kind<K>` of each kind, until the start: then only the tasks keep them, so a
    /// kind's cache is freed once its watch has stopped.
    kinds: HashMap<TypeId, Box<dyn Any + Send>>,
    /// The watches to start, one per kind.
    starters: Vec<Starter>,
    started: bool,
    /// The task of each kind's watch: it stops when its last controller stops.
    tasks: Vec<Watches>,
    next_listener: u64,
}

impl SharedWatches {
    /// Joins the shared watch of `K` (made from `api` if it is the first to ask): the kind's
    /// cache, shared by its controllers, gets every event, then `on_event` is called with it,
    /// until `owner` stops.
    /// Gives `on_event` back when the shared watches have already started.
    pub(crate) fn join<K, F>(
        &self,
        api: Api<K>,
        on_event: F,
        owner: &Watches,
    ) -> Result<Store<K>, F>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        let mut inner = self.inner.lock();
        if inner.started {
            return Err(on_event);
        }
        let id = inner.next_listener;
        inner.next_listener += 1;
        let known = inner
            .kinds
            .get(&TypeId::of::<K>())
            .and_then(|kind| kind.downcast_ref::<Kind<K>>())
            .cloned();
        let (listeners, store, task) = match known {
            Some(known) => known,
            None => {
                let listeners: Listeners<K> = Arc::default();
                let task = Watches::default();
                let (store, cache) = reflector::store();
                inner
                    .starters
                    .push(starter(api, cache, listeners.clone(), task.clone()));
                inner.tasks.push(task.clone());
                let kind: Kind<K> = (listeners.clone(), store.clone(), task.clone());
                inner.kinds.insert(TypeId::of::<K>(), Box::new(kind));
                (listeners, store, task)
            }
        };
        listeners.lock().push(Listener {
            id,
            on_event: Box::new(on_event),
        });
        owner.on_stop(move || {
            let mut left = listeners.lock();
            left.retain(|l| l.id != id);
            if left.is_empty() {
                drop(left);
                task.stop();
            }
        });
        Ok(store)
    }

    /// Starts every shared watch (on the current runtime); later controllers watch on their
    /// own.
    pub fn start(&self) {
        let mut inner = self.inner.lock();
        inner.started = true;
        inner.kinds.clear();
        let starters = std::mem::take(&mut inner.starters);
        for start in starters {
            start();
        }
    }

    /// How many kinds' shared watches run.
    pub fn running(&self) -> usize {
        let inner = self.inner.lock();
        inner.tasks.iter().filter(|task| task.running()).count()
    }
}

/// The task of one kind's shared watch: the cache, then each listener's handler.
fn starter<K>(
    api: Api<K>,
    mut cache: reflector::store::Writer<K>,
    listeners: Listeners<K>,
    task: Watches,
) -> Starter
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    Box::new(move || {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(crate::watch::drop_field_ownership::<K>);
        task.spawn_events(stream, move |event| {
            cache.apply_watcher_event(event);
            for listener in listeners.lock().iter() {
                (listener.on_event)(event);
            }
        });
    })
}
