//! Watches feeding in-memory stores of trimmed objects, shared by every controller.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::compact::CompactStore;
pub use crate::watch_shared::SharedWatches;

/// Removes what no decision reads, so memory grows slowly with the number of objects: the
/// field ownership and kubectl's last-applied configuration. A controller that writes such an
/// object back whole (an update) would remove that annotation: it uses
/// [`Watches::reflect_for_updates`].
pub fn trim<K: ResourceExt>(obj: &mut K) {
    drop_field_ownership(obj);
    if let Some(a) = obj.meta_mut().annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Drops `metadata.managedFields`: the field is left out, not emptied. An update that leaves
/// it out keeps the object's field ownership; one that sends an empty list clears it
/// (kube-apiserver's field manager, and ours), so an object written back whole must not carry
/// `[]`.
pub(crate) fn drop_field_ownership<K: ResourceExt>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// What runs when a controller's watches stop.
type OnStop = Box<dyn FnOnce() + Send>;

/// The watches a controller started. They stop together with it ([`Watches::stop`], called
/// by the runtime after the workers finished), so none outlives the controller and retries
/// against an API server that is going away.
#[derive(Clone, Default)]
pub struct Watches {
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    /// What else stops with them: leaving shared watches.
    on_stop: Arc<Mutex<Vec<OnStop>>>,
    /// The shared watches [`Watches::reflect`] and [`Watches::reflect_for_updates`] join.
    shared: Option<SharedWatches>,
}

impl Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("tasks", &self.tasks.lock().len())
            .field("shared", &self.shared)
            .finish()
    }
}

impl Watches {
    /// Watches of a controller in a process whose controllers share a watch per kind:
    /// [`Watches::reflect`] and [`Watches::reflect_for_updates`] join the kind's shared watch
    /// while it has not started (see [`SharedWatches`]), so their objects keep every annotation;
    /// the other watches are the controller's own.
    pub fn sharing(shared: &SharedWatches) -> Self {
        Watches {
            shared: Some(shared.clone()),
            ..Watches::default()
        }
    }

    /// Starts a reflector of trimmed objects and calls `on_event` for every change, after the
    /// store has it. Watch errors are logged and the watch resumes with backoff. On watches
    /// [`Watches::sharing`] a process's, before those start, it joins the kind's shared watch
    /// instead, whose objects keep every annotation (only the field ownership is dropped), and
    /// its store is the kind's, shared with other controllers: wait for it with
    /// [`crate::runtime::Cache::synced`], not `Store::wait_until_ready` (which wakes only the
    /// last of several waiters).
    pub fn reflect<K, F>(&self, api: Api<K>, on_event: F) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        match self.join_shared(api.clone(), on_event) {
            Ok(store) => store,
            Err(on_event) => self.reflect_trimmed(api, |_: &mut K| {}, on_event),
        }
    }

    /// The shared watch of `K`, if this controller shares watches and they have not started;
    /// else `on_event` back.
    fn join_shared<K, F>(&self, api: Api<K>, on_event: F) -> Result<Store<K>, F>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        match &self.shared {
            Some(shared) => shared.join(api, on_event, self),
            None => Err(on_event),
        }
    }

    /// Starts a reflector of StorageClasses: a class that appears, changes or goes may unblock
    /// claims waiting for it, so every claim not bound yet for which `waits_for(claim, class)`
    /// holds is passed to `requeue`; and whatever else waits for classes hears of it through
    /// `also` (each class of an event).
    /// `claims` lists the claims (a pass over the claims cache).
    pub fn reflect_classes<L, W, R, A>(
        &self,
        api: Api<StorageClass>,
        claims: L,
        waits_for: W,
        requeue: R,
        also: A,
    ) -> Store<StorageClass>
    where
        L: Fn() -> Vec<Arc<PersistentVolumeClaim>> + Send + 'static,
        W: Fn(&PersistentVolumeClaim, &StorageClass) -> bool + Send + 'static,
        R: Fn(&PersistentVolumeClaim) + Send + 'static,
        A: Fn(&StorageClass) + Send + 'static,
    {
        self.reflect(api, move |event| {
            each(event, |class| {
                also(class);
                for claim in claims() {
                    let unbound = claim
                        .spec
                        .as_ref()
                        .and_then(|s| s.volume_name.as_deref())
                        .is_none_or(str::is_empty);
                    if unbound && waits_for(&claim, class) {
                        requeue(&claim);
                    }
                }
            });
        })
    }

    /// Like [`Watches::reflect`], for a controller that writes the objects it caches back whole
    /// (updates, not patches): only the field ownership is dropped, and every annotation is
    /// kept, so a write does not remove kubectl's last-applied configuration.
    pub fn reflect_for_updates<K, F>(&self, api: Api<K>, on_event: F) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        match self.join_shared(api.clone(), on_event) {
            Ok(store) => store,
            Err(on_event) => self.reflect_modified(
                api,
                watcher::Config::default(),
                drop_field_ownership::<K>,
                on_event,
            ),
        }
    }

    /// Like [`Watches::reflect`], with a kind-specific `shrink` that also drops fields no
    /// decision of the caller reads (memory per object is what limits a sidecar with 10,000
    /// volumes).
    pub fn reflect_trimmed<K, S, F>(&self, api: Api<K>, shrink: S, on_event: F) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        S: Fn(&mut K) + Send + 'static,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        self.reflect_with(api, watcher::Config::default(), shrink, on_event)
    }

    /// Like [`Watches::reflect_trimmed`], watching only what `config` selects (e.g. a label
    /// selector).
    pub fn reflect_with<K, S, F>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        shrink: S,
        on_event: F,
    ) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        S: Fn(&mut K) + Send + 'static,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        self.reflect_modified(
            api,
            config,
            move |obj: &mut K| {
                trim(obj);
                shrink(obj);
            },
            on_event,
        )
    }

    /// A reflector whose objects pass through `modify` before the store and `on_event` see them.
    fn reflect_modified<K, M, F>(
        &self,
        api: Api<K>,
        config: watcher::Config,
        modify: M,
        on_event: F,
    ) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        M: FnMut(&mut K) + Send + 'static,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        let (store, writer) = reflector::store();
        let stream = watcher(api, config)
            .default_backoff()
            .modify(modify)
            .reflect(writer);
        self.spawn_events(stream, on_event);
        store
    }

    /// Like [`Watches::reflect_trimmed`], into a [`CompactStore`]: each object is kept as its
    /// JSON, for the kinds a controller holds one of per volume and reads by key; `words` are
    /// strings its objects repeat (see [`CompactStore::with_words`]).
    pub fn reflect_compact<K, S, F>(
        &self,
        api: Api<K>,
        words: &[&str],
        shrink: S,
        on_event: F,
    ) -> CompactStore<K>
    where
        K: Resource + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        S: Fn(&mut K) + Send + 'static,
        F: Fn(&watcher::Event<K>) + Send + 'static,
    {
        let (store, mut writer) = CompactStore::with_words(words);
        self.watch_only(api, shrink, move |event| {
            writer.apply(event);
            on_event(event);
        });
        store
    }

    /// A watch without a cache, for a kind a controller only indexes: `on_event` sees every
    /// event (a re-list's included), each object trimmed and passed through `shrink` first.
    pub fn watch_only<K, S, F>(&self, api: Api<K>, shrink: S, on_event: F)
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
        S: Fn(&mut K) + Send + 'static,
        F: FnMut(&watcher::Event<K>) + Send + 'static,
    {
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(move |obj: &mut K| {
                trim(obj);
                shrink(obj);
            });
        self.spawn_events(stream, on_event);
    }

    /// Runs a watch stream until stopped, calling `on_event` for every event; errors are
    /// logged and the watch resumes with its backoff.
    pub(crate) fn spawn_events<K, St, F>(&self, stream: St, mut on_event: F)
    where
        K: Resource + 'static,
        K::DynamicType: Default,
        St: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
        F: FnMut(&watcher::Event<K>) + Send + 'static,
    {
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(event) => on_event(&event),
                    Err(error) => {
                        tracing::warn!(kind = %K::kind(&K::DynamicType::default()), %error, "watch failed; retrying")
                    }
                }
            }
        });
        self.adopt(task.abort_handle());
    }

    /// Stops `task` with the others.
    pub(crate) fn adopt(&self, task: tokio::task::AbortHandle) {
        self.tasks.lock().push(task);
    }

    /// Whether any watch started here still runs.
    pub(crate) fn running(&self) -> bool {
        self.tasks.lock().iter().any(|task| !task.is_finished())
    }

    /// Runs `f` when these watches stop.
    pub(crate) fn on_stop(&self, f: impl FnOnce() + Send + 'static) {
        self.on_stop.lock().push(Box::new(f));
    }

    /// Stops every watch started so far, and leaves the shared ones.
    pub fn stop(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        let leave = std::mem::take(&mut *self.on_stop.lock());
        for f in leave {
            f();
        }
    }
}

/// A store that is ready and stays empty (for a kind a configuration makes irrelevant).
pub fn empty<K>() -> Store<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

/// Calls `f` with the object of an apply or delete event.
pub fn each<K>(event: &watcher::Event<K>, mut f: impl FnMut(&K)) {
    match event {
        watcher::Event::Apply(o) | watcher::Event::Delete(o) | watcher::Event::InitApply(o) => f(o),
        watcher::Event::Init | watcher::Event::InitDone => {}
    }
}
