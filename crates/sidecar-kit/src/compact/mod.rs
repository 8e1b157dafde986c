//! A cache that keeps each object as its JSON bytes instead of the decoded `k8s-openapi`
//! struct, for the kinds a controller holds one of per volume.
//!
//! A decoded `PersistentVolume` is 3,472 bytes before any of its strings (every volume source
//! of the spec is an inline `Option`), and a `PersistentVolumeClaim` 1,008; with their maps and
//! strings a provisioner held about 7 KiB per volume in its two caches. The JSON of the same
//! trimmed objects is under 1 KiB each. Reading decodes the object again (a few microseconds),
//! which is what a reconcile does once per key; a pass over every object decodes them all, so
//! the kinds cached here are the ones read by key. The JSON is shortened further by
//! [`codec`], which replaces the keys and values every claim and volume repeats with one byte,
//! UUIDs with their 16 bytes and the store's words (the driver's name) with two; each object
//! is one allocation holding its key and these bytes ([`entry`]). The 20,000 objects of a
//! 10,000-claim storm took 5.9 MB (heaptrack, before the words).

mod codec;
mod entry;

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use parking_lot::RwLock;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::key::ObjectKey;
use entry::Entry;

/// Objects of kind `K` by namespace and name, stored as JSON. Cloning shares the cache.
pub struct CompactStore<K> {
    shared: Arc<Shared>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for CompactStore<K> {
    fn clone(&self) -> Self {
        CompactStore {
            shared: self.shared.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> Debug for CompactStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactStore")
            .field("objects", &self.shared.entries.read().len())
            .finish()
    }
}

/// Entries are shared (`Arc`) so that readers decode them after releasing the lock: a pass
/// over every object does not hold up the watch writing the store.
type Entries = HashSet<Entry>;

struct Shared {
    entries: RwLock<Entries>,
    words: codec::Words,
    ready: tokio::sync::watch::Sender<bool>,
}

/// What a store is read by: kube's `ObjectRef` or our [`ObjectKey`].
pub trait Lookup<K> {
    /// The key, as the store holds it: `namespace/name` or `name`.
    fn key(&self) -> Cow<'_, str>;
}

impl<K: Resource> Lookup<K> for ObjectRef<K> {
    fn key(&self) -> Cow<'_, str> {
        crate::key::key_text(self.namespace.as_deref(), &self.name)
    }
}

impl<K> Lookup<K> for ObjectKey {
    fn key(&self) -> Cow<'_, str> {
        Cow::Borrowed(self.as_str())
    }
}

impl<K> CompactStore<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    /// An empty store, not ready until a [`CompactWriter`] applies its first full list.
    pub fn new() -> (CompactStore<K>, CompactWriter<K>) {
        Self::with_words(std::iter::empty::<&str>())
    }

    /// An empty store that also stores each of `words` (at most 256) as two bytes wherever
    /// its objects hold it: strings they all repeat that no fixed dictionary knows, such as
    /// the driver's name.
    pub fn with_words<W: AsRef<str>>(
        words: impl IntoIterator<Item = W>,
    ) -> (CompactStore<K>, CompactWriter<K>) {
        let (ready, _) = tokio::sync::watch::channel(false);
        let store = CompactStore {
            shared: Arc::new(Shared {
                entries: RwLock::new(HashSet::new()),
                words: codec::Words::new(words),
                ready,
            }),
            kind: PhantomData,
        };
        let writer = CompactWriter {
            store: store.clone(),
            buffer: None,
        };
        (store, writer)
    }

    /// The object `key` names, decoded.
    pub fn get(&self, key: &impl Lookup<K>) -> Option<Arc<K>> {
        let wanted = key.key();
        let entry = self.shared.entries.read().get(wanted.as_bytes()).cloned()?;
        decode(&entry, &self.shared.words)
    }

    /// Whether the store holds the object `key` names (without decoding it).
    pub fn contains(&self, key: &impl Lookup<K>) -> bool {
        self.shared.entries.read().contains(key.key().as_bytes())
    }

    /// Every object, decoded (a pass over all of them: costs a decode each).
    pub fn state(&self) -> Vec<Arc<K>> {
        let entries: Vec<Entry> = self.shared.entries.read().iter().cloned().collect();
        entries
            .iter()
            .filter_map(|entry| decode(entry, &self.shared.words))
            .collect()
    }

    /// How many objects the store holds.
    pub fn len(&self) -> usize {
        self.shared.entries.read().len()
    }

    /// Whether the store holds no object.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once the first full list is in.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.shared.ready.subscribe();
        // The sender lives in the store itself, so the channel cannot close while we wait.
        let _ = ready.wait_for(|ready| *ready).await;
    }
}

impl<K> crate::runtime::Cache for CompactStore<K>
where
    K: Resource + Serialize + DeserializeOwned + 'static,
{
    fn synced(&self) -> crate::runtime::Boxed<()> {
        let store = self.clone();
        Box::pin(async move { store.wait_until_ready().await })
    }
}

/// Why an object could not be cached or read back (a bug of ours either way: the objects come
/// decoded from the API, the bytes are our own encoding). Logged; the object is then absent.
#[derive(Debug, thiserror::Error)]
enum CacheError {
    /// The object did not serialize.
    #[error("failed to encode the object: {0}")]
    Encode(#[source] serde_json::Error),
    /// Its namespace and name are longer than an entry can say (65,535 bytes).
    #[error("its namespace and name are too long to cache")]
    KeyTooLong,
    /// The stored bytes did not expand to JSON.
    #[error("failed to expand the stored bytes: {0}")]
    Expand(#[source] codec::CodecError),
    /// The JSON did not deserialize.
    #[error("failed to decode the object: {0}")]
    Decode(#[source] serde_json::Error),
}

thread_local! {
    /// The buffers a thread encodes and decodes objects in, kept from one object to the next
    /// (a storm of 100,000 claims passes 600,000 events through a provisioner's two stores):
    /// the JSON, and its shortened form or the entry being built.
    static BUFFERS: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// A buffer of [`BUFFERS`] holding more than this after use is let go instead of kept (one
/// huge object does not pin its size for good).
const KEPT_BUFFER: usize = 64 * 1024;

/// Runs `f` with this thread's two buffers, emptied (fresh ones if they are in use).
fn with_buffers<T>(f: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>) -> T) -> T {
    BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
        Ok(mut buffers) => {
            let (first, second) = &mut *buffers;
            first.clear();
            second.clear();
            let out = f(first, second);
            for buffer in [first, second] {
                if buffer.capacity() > KEPT_BUFFER {
                    *buffer = Vec::new();
                }
            }
            out
        }
        Err(_) => f(&mut Vec::new(), &mut Vec::new()),
    })
}

/// Decodes what [`encode`] wrote; a failure is logged and the object treated as absent.
fn decode<K: DeserializeOwned>(entry: &Entry, words: &codec::Words) -> Option<Arc<K>> {
    let decoded = with_buffers(|json, _| {
        codec::expand_into(entry.body(), words, json).map_err(CacheError::Expand)?;
        serde_json::from_slice::<K>(json).map_err(CacheError::Decode)
    });
    match decoded {
        Ok(object) => Some(Arc::new(object)),
        Err(error) => {
            let key = String::from_utf8_lossy(entry.key());
            tracing::error!(object = %key, %error, "a cached object does not decode; ignoring it");
            None
        }
    }
}

/// Encodes an object for the store with its key; `None` (logged) when it has no name or does
/// not encode.
fn encode<K: Resource + Serialize>(object: &K, words: &codec::Words) -> Option<Entry> {
    let meta = object.meta();
    let name = meta.name.as_deref()?;
    let key = ObjectKey::new(meta.namespace.as_deref(), name);
    let entry = with_buffers(|json, scratch| {
        serde_json::to_writer(&mut *json, object).map_err(CacheError::Encode)?;
        Entry::build(key.as_str(), scratch, |body| {
            codec::shorten_into(json, words, body)
        })
        .ok_or(CacheError::KeyTooLong)
    });
    match entry {
        Ok(entry) => Some(entry),
        Err(error) => {
            tracing::error!(object = %key, %error, "an object does not encode; not caching it");
            None
        }
    }
}

/// Applies watch events to a [`CompactStore`], as kube's reflector writer does to its store: a
/// relist is buffered and swapped in whole once complete.
pub struct CompactWriter<K> {
    store: CompactStore<K>,
    buffer: Option<Entries>,
}

impl<K> CompactWriter<K>
where
    K: Resource + Serialize + DeserializeOwned,
{
    /// Applies one watch event.
    pub fn apply(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) => {
                if let Some(entry) = encode(object, &self.store.shared.words) {
                    self.store.shared.entries.write().replace(entry);
                }
            }
            watcher::Event::Delete(object) => {
                let meta = object.meta();
                if let Some(name) = meta.name.as_deref() {
                    let key = ObjectKey::new(meta.namespace.as_deref(), name);
                    self.store
                        .shared
                        .entries
                        .write()
                        .remove(key.as_str().as_bytes());
                }
            }
            watcher::Event::Init => self.buffer = Some(HashSet::new()),
            watcher::Event::InitApply(object) => {
                if let Some(entry) = encode(object, &self.store.shared.words) {
                    self.buffer.get_or_insert_default().replace(entry);
                }
            }
            watcher::Event::InitDone => {
                let mut listed = self.buffer.take().unwrap_or_default();
                listed.shrink_to_fit();
                *self.store.shared.entries.write() = listed;
                self.store.shared.ready.send_replace(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn claim(namespace: &str, name: &str, class: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                annotations: Some([("a".to_string(), "b".to_string())].into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
                storage_class_name: Some(class.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn objects_read_back_equal_to_what_was_applied_and_deletes_and_relists_apply() {
        let (store, mut writer) = CompactStore::<PersistentVolumeClaim>::new();
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(claim("a", "one", "fast")));
        // Nothing is visible before the list is complete.
        assert!(store.is_empty());
        writer.apply(&watcher::Event::InitDone);
        writer.apply(&watcher::Event::Apply(claim("b", "one", "slow")));
        let key = ObjectRef::new("one").within("a");
        assert_eq!(store.get(&key).as_deref(), Some(&claim("a", "one", "fast")));
        assert_eq!(
            store.get(&ObjectRef::new("one").within("b")).as_deref(),
            Some(&claim("b", "one", "slow"))
        );
        // A cluster-scoped key does not find a namespaced object of the same name.
        assert_eq!(store.get(&ObjectRef::new("one")), None);
        writer.apply(&watcher::Event::Delete(claim("a", "one", "fast")));
        assert_eq!(store.get(&key), None);
        assert!(!store.contains(&key));
        assert!(store.contains(&ObjectRef::new("one").within("b")));
        // Our own key finds the same entry.
        let ours = crate::key::ObjectKey::new(Some("b"), "one");
        assert!(store.contains(&ours));
        assert_eq!(
            store.get(&ours),
            store.get(&ObjectRef::new("one").within("b"))
        );
        assert_eq!(store.len(), 1);
        // A relist replaces everything at once.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(claim("c", "two", "x")));
        assert_eq!(store.len(), 1, "the old state stays until the list is done");
        writer.apply(&watcher::Event::InitDone);
        let all = store.state();
        assert_eq!(all.len(), 1);
        assert_eq!(*all[0], claim("c", "two", "x"));
    }

    #[test]
    fn a_cached_volume_takes_a_fraction_of_the_decoded_struct() {
        let mut pv = PersistentVolume::default();
        pv.metadata.name = Some("pvc-0a1b2c3d-0000-4000-8000-000000000001".into());
        let (store, mut writer) = CompactStore::<PersistentVolume>::new();
        writer.apply(&watcher::Event::Apply(pv.clone()));
        let bytes: usize = store.shared.entries.read().iter().map(Entry::size).sum();
        assert!(
            bytes < std::mem::size_of::<PersistentVolume>() / 10,
            "{bytes} bytes cached"
        );
        let name = pv.metadata.name.clone().unwrap_or_default();
        assert_eq!(store.get(&ObjectRef::new(&name)).as_deref(), Some(&pv));
    }

    #[test]
    fn a_huge_object_reads_back_and_its_buffers_are_not_kept() {
        let mut big = claim("a", "big", "fast");
        big.metadata.annotations = Some([("note".to_string(), "x".repeat(200_000))].into());
        let (store, mut writer) = CompactStore::<PersistentVolumeClaim>::new();
        writer.apply(&watcher::Event::Apply(big.clone()));
        let key = ObjectRef::new("big").within("a");
        assert_eq!(store.get(&key).as_deref(), Some(&big));
        let kept = BUFFERS.with(|b| {
            let b = b.borrow();
            (b.0.capacity(), b.1.capacity())
        });
        // Smaller than the object: what held it was let go.
        assert!(kept.0 < 200_000 && kept.1 < 200_000, "{kept:?}");
        // A small object afterwards still reads back from the same thread's buffers.
        writer.apply(&watcher::Event::Apply(claim("a", "small", "slow")));
        let small = store.get(&ObjectRef::new("small").within("a"));
        assert_eq!(small.as_deref(), Some(&claim("a", "small", "slow")));
    }

    #[test]
    fn buffers_in_use_are_not_shared_with_a_nested_call() {
        let outer = with_buffers(|first, second| {
            first.extend_from_slice(b"outer");
            second.extend_from_slice(b"held");
            let inner = with_buffers(|f, s| {
                let empty = f.is_empty() && s.is_empty();
                f.extend_from_slice(b"inner");
                empty
            });
            (inner, first.clone(), second.clone())
        });
        assert_eq!(outer, (true, b"outer".to_vec(), b"held".to_vec()));
        // Emptied for the next caller.
        assert!(with_buffers(|f, s| f.is_empty() && s.is_empty()));
    }

    #[test]
    fn a_stores_words_shorten_what_it_holds_and_read_back_the_same() {
        let driver = "hostpath.csi.volstack.dev";
        let mut pv = PersistentVolume::default();
        pv.metadata.name = Some("pv-1".into());
        pv.metadata.annotations = Some(
            [(
                "pv.kubernetes.io/provisioned-by".to_string(),
                driver.to_string(),
            )]
            .into(),
        );
        let size = |store: &CompactStore<PersistentVolume>| -> usize {
            store.shared.entries.read().iter().map(Entry::size).sum()
        };
        let (plain, mut plain_writer) = CompactStore::<PersistentVolume>::new();
        let (worded, mut worded_writer) = CompactStore::<PersistentVolume>::with_words([driver]);
        plain_writer.apply(&watcher::Event::Apply(pv.clone()));
        worded_writer.apply(&watcher::Event::Apply(pv.clone()));
        assert_eq!(size(&worded), size(&plain) - (driver.len() - 2));
        assert_eq!(worded.get(&ObjectRef::new("pv-1")).as_deref(), Some(&pv));
        assert_eq!(worded.state().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn ready_once_the_first_list_is_in() {
        // Paused time: a wait that times out here does so because nothing could make it
        // resolve, not because the machine was slow.
        let not_ready = |store: &CompactStore<PersistentVolume>| {
            let store = store.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_secs(1), store.wait_until_ready())
                    .await
                    .is_err()
            }
        };
        let (store, mut writer) = CompactStore::<PersistentVolume>::new();
        let waiting = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await }
        });
        assert!(not_ready(&store).await, "ready before any list");
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(PersistentVolume::default()));
        assert!(
            not_ready(&store).await,
            "ready in the middle of the first list"
        );
        assert!(
            !waiting.is_finished(),
            "a waiter let through before the list"
        );
        writer.apply(&watcher::Event::InitDone);
        tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
            .await
            .expect("ready after the list")
            .expect("the waiter ran");
        // Once ready, a later waiter resolves at once.
        assert!(!not_ready(&store).await, "still ready");
    }
}
