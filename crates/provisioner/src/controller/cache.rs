//! Watches feeding in-memory stores of trimmed objects, and the work they queue.

use std::fmt::Debug;
use std::hash::Hash;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// The stores the decisions read.
#[derive(Clone)]
pub struct Caches {
    /// Claims.
    pub claims: Store<PersistentVolumeClaim>,
    /// Volumes.
    pub volumes: Store<PersistentVolume>,
    /// Classes.
    pub classes: Store<StorageClass>,
    /// CSINodes (only with topology).
    pub csinodes: Store<CSINode>,
    /// Nodes (only with topology).
    pub nodes: Store<Node>,
    /// VolumeAttachments (only with PUBLISH_UNPUBLISH_VOLUME).
    pub attachments: Store<VolumeAttachment>,
    /// VolumeAttributesClasses (only with the gate).
    pub vacs: Store<VolumeAttributesClass>,
}

/// Removes what no decision reads, so memory grows slowly with the number of objects.
pub fn trim<K: ResourceExt>(obj: &mut K) {
    obj.managed_fields_mut().clear();
    if let Some(a) = obj.meta_mut().annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Starts a reflector and calls `on_event` for every change (after the store has it).
pub fn reflect<K, F>(api: Api<K>, config: watcher::Config, on_event: F) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    F: Fn(&watcher::Event<K>) + Send + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(trim::<K>)
        .reflect(writer);
    tokio::spawn(async move {
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
    store
}

/// A store that never fills (for a kind the driver or gates make irrelevant).
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
