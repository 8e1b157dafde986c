//! The capacity controller around `decide`: watches of classes, CSINodes, Nodes and our
//! CSIStorageCapacity objects; one queue of (class, segment) items whose worker calls
//! GetCapacity and writes the object; one queue with a single key that works out which items
//! exist when classes or the topology change.
//!
//! Unlike upstream, which queues every item on one timer (a burst of GetCapacity calls and
//! writes each interval, and updates minutes late at 2,000 nodes), each item is polled at its
//! own phase of the interval, and what a change makes stale (a volume provisioned or deleted in
//! a segment, a new node or class, an object someone deleted) is queued at once, ahead of the
//! polls that are not due.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{Node, VolumeNodeAffinity};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use parking_lot::Mutex;
use sidecar_kit::csi::{CallError, Caller};
use sidecar_kit::key::ObjectKey;
use sidecar_kit::runtime::Controller;
use sidecar_kit::watch::{Watches, empty};

use super::topology_events::{CsiNodeKeys, NodeLabels, class_changes_topology};
use sidecar_kit::watch_index::{Feed, WatchIndex, listed};
use sidecar_kit::workqueue::{Backoff, Next, QueueMetrics, WorkQueue};
use tonic::transport::Channel;

use super::decide::{
    Action, Item, LABEL_DRIVER, LABEL_MANAGED_BY, Segment, Template, Wanted, affinity_segments,
    item_of, items, next_poll, ours, reconcile, segments, stale_items, tracked_classes,
};
use super::gauges::Gauges;

/// Settings of the capacity controller.
#[derive(Debug, Clone)]
pub struct CapacitySettings {
    /// Namespace, driver, manager and owner of the objects.
    pub template: Template,
    /// `--capacity-poll-interval`.
    pub poll_interval: Duration,
    /// `--capacity-threads`.
    pub workers: usize,
    /// `--capacity-for-immediate-binding`.
    pub immediate_binding: bool,
    /// `--timeout` of each GetCapacity.
    pub timeout: Duration,
    /// Retry bounds after a failed GetCapacity or write.
    pub backoff: Backoff,
    /// Node deployment: the one segment of this node (from NodeGetInfo); central mode: None,
    /// the segments come from CSINodes and Nodes.
    pub fixed_segment: Option<Segment>,
}

/// Why an item could not be brought up to date (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// GetCapacity failed.
    #[error("CSI GetCapacity for {item}: {source}")]
    GetCapacity {
        /// The item.
        item: Item,
        /// The call's error.
        source: CallError,
    },
    /// Creating, updating or deleting the object failed.
    #[error("{action} CSIStorageCapacity for {item}: {source}")]
    Write {
        /// create, update or delete.
        action: &'static str,
        /// The item.
        item: Item,
        /// The API error.
        source: kube::Error,
    },
}

/// The running capacity controller.
pub struct CapacityTracker {
    settings: CapacitySettings,
    /// Writes of CSIStorageCapacity objects (`--kube-api-capacity-qps`/`-burst`).
    writer: kube::Client,
    csi: Channel,
    calls: Caller,
    classes: Store<StorageClass>,
    csinodes: Store<CSINode>,
    nodes: Store<Node>,
    objects: Store<CSIStorageCapacity>,
    items: WorkQueue<Item>,
    topology: WorkQueue<&'static str>,
    /// The items that should have an object.
    wanted: Mutex<BTreeSet<Item>>,
    /// Objects we wrote that the watch has not shown yet, by item: a refresh right after a
    /// create must not create a second object.
    written: Mutex<HashMap<Item, CSIStorageCapacity>>,
    /// Names of the cached objects of each item (a sync reads its item's objects without a
    /// scan of all of them).
    index: Mutex<HashMap<Item, BTreeSet<String>>>,
    /// Feeds `index` from the watch of objects (a re-list resets it).
    object_feed: Feed,
    started: tokio::time::Instant,
    gauges: Gauges,
}

impl std::fmt::Debug for CapacityTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapacityTracker")
            .field("driver", &self.settings.template.driver)
            .finish_non_exhaustive()
    }
}

const TOPOLOGY: &str = "topology";

/// The part of a Node the segments need: its labels.
fn shrink_node(node: &mut Node) {
    node.spec = None;
    node.status = None;
    node.metadata.annotations = None;
}

fn resource_version(object: &CSIStorageCapacity) -> Option<u64> {
    object.metadata.resource_version.as_deref()?.parse().ok()
}

impl CapacityTracker {
    /// Starts the watches (on `watches`, so they stop with the provisioner's controller).
    /// `reader` watches; `writer` is the client limited by the capacity QPS.
    pub fn new(
        reader: kube::Client,
        writer: kube::Client,
        csi: Channel,
        settings: CapacitySettings,
        watches: &Watches,
        metrics: &sidecar_kit::metrics::Metrics,
    ) -> Result<Arc<Self>, prometheus::Error> {
        let gauges = Gauges::register(metrics)?;
        let items_q: WorkQueue<Item> = WorkQueue::new(settings.backoff)
            .with_metrics(QueueMetrics::new(metrics, "csistoragecapacity"));
        let topology_q: WorkQueue<&'static str> = WorkQueue::new(settings.backoff)
            .with_metrics(QueueMetrics::new(metrics, "csitopology"));
        let q = topology_q.clone();
        let classes = watches.reflect(Api::<StorageClass>::all(reader.clone()), move |event| {
            if class_changes_topology(event) {
                q.add_now(TOPOLOGY);
            }
        });
        let (csinodes, nodes) = if settings.fixed_segment.is_some() {
            (empty(), empty())
        } else {
            let q = topology_q.clone();
            let keys = Mutex::new(CsiNodeKeys::new(&settings.template.driver));
            let csinodes = watches.reflect(Api::<CSINode>::all(reader.clone()), move |event| {
                if keys.lock().changes_topology(event) {
                    q.add_now(TOPOLOGY);
                }
            });
            let q = topology_q.clone();
            let labels = Mutex::new(NodeLabels::default());
            let nodes = watches.reflect_trimmed(
                Api::<Node>::all(reader.clone()),
                shrink_node,
                move |event| {
                    if labels.lock().changes_topology(event) {
                        q.add_now(TOPOLOGY);
                    }
                },
            );
            (csinodes, nodes)
        };
        let selector = format!(
            "{LABEL_DRIVER}={},{LABEL_MANAGED_BY}={}",
            settings.template.driver, settings.template.managed_by
        );
        let this = Arc::new_cyclic(|weak: &std::sync::Weak<CapacityTracker>| {
            let weak = weak.clone();
            let objects = watches.reflect_with(
                Api::<CSIStorageCapacity>::namespaced(reader.clone(), &settings.template.namespace),
                watcher::Config::default().labels(&selector),
                |_: &mut CSIStorageCapacity| {},
                move |event| {
                    if let Some(this) = weak.upgrade() {
                        this.on_object_event(event);
                    }
                },
            );
            CapacityTracker {
                calls: Caller::new(
                    &settings.template.driver,
                    settings.timeout,
                    Some(metrics.clone()),
                ),
                settings,
                writer,
                csi,
                classes,
                csinodes,
                nodes,
                objects,
                items: items_q,
                topology: topology_q,
                wanted: Mutex::new(BTreeSet::new()),
                written: Mutex::new(HashMap::new()),
                index: Mutex::new(HashMap::new()),
                object_feed: Feed::default(),
                started: tokio::time::Instant::now(),
                gauges,
            }
        });
        Ok(this)
    }

    /// Adds the capacity caches, queues and metrics pass to `controller`.
    pub fn attach(self: &Arc<Self>, controller: Controller) -> Controller {
        let (items, topology, gauges) = (self.clone(), self.clone(), self.clone());
        self.topology.add_now(TOPOLOGY);
        controller
            .wait_for(&self.classes)
            .wait_for(&self.csinodes)
            .wait_for(&self.nodes)
            .wait_for(&self.objects)
            .reconcile("topology", self.topology.clone(), 1, move |_key| {
                let this = topology.clone();
                async move {
                    this.sync_topology();
                    Ok::<Next, std::convert::Infallible>(Next::Done)
                }
            })
            .reconcile(
                "csistoragecapacity",
                self.items.clone(),
                self.settings.workers,
                move |item| {
                    let this = items.clone();
                    async move { this.sync_item(item).await }
                },
            )
            .every(Duration::from_secs(2), move || gauges.update_gauges())
    }

    /// A volume of `class` was provisioned or deleted: the objects of its segments (all of the
    /// class's when the volume has no affinity) are refreshed now.
    pub fn volume_changed(&self, class: &str, affinity: Option<&VolumeNodeAffinity>) {
        self.refresh_segments(class, &affinity_segments(affinity));
    }

    /// The objects of `class` in `segment` (every segment of the class with None) are
    /// refreshed now.
    pub fn refresh(&self, class: &str, segment: Option<Segment>) {
        self.refresh_segments(class, &segment.into_iter().collect::<Vec<_>>());
    }

    fn refresh_segments(&self, class: &str, segments: &[Segment]) {
        let stale = stale_items(self.wanted.lock().iter(), class, segments);
        tracing::debug!(class, ?segments, items = stale.len(), "capacity refresh");
        for item in stale {
            self.items.add_first(item);
        }
    }

    fn on_object_event(&self, event: &watcher::Event<CSIStorageCapacity>) {
        self.object_feed.event(event, self);
    }

    /// The watch showed `object` (`deleted`: its delete event).
    fn object_seen(&self, object: &CSIStorageCapacity, deleted: bool) {
        let item = item_of(object);
        let name = object.metadata.name.clone().unwrap_or_default();
        {
            let mut index = self.index.lock();
            if deleted {
                if let Some(names) = index.get_mut(&item) {
                    names.remove(&name);
                    if names.is_empty() {
                        index.remove(&item);
                    }
                }
            } else {
                index.entry(item.clone()).or_default().insert(name);
            }
        }
        {
            let mut written = self.written.lock();
            if let Some(mine) = written.get(&item)
                && mine.metadata.name == object.metadata.name
                && (deleted || resource_version(object) >= resource_version(mine))
            {
                written.remove(&item);
            }
        }
        let wanted = self.wanted.lock().contains(&item);
        // Someone deleted an object still wanted: make it again. An object for an item not
        // wanted: delete it. Our own writes need nothing.
        if deleted == wanted {
            self.items.add_first(item);
        }
    }

    /// The end of a re-list of objects: those it did not show were deleted while the watch
    /// was away; the wanted items among theirs are made again.
    fn objects_listed(&self, keep: &HashSet<ObjectKey>) {
        let namespace = self.settings.template.namespace.as_str();
        let mut emptied = Vec::new();
        {
            let mut index = self.index.lock();
            index.retain(|item, names| {
                let before = names.len();
                names.retain(|name| listed(keep, Some(namespace), name));
                if names.len() < before {
                    emptied.push(item.clone());
                }
                !names.is_empty()
            });
        }
        let wanted = self.wanted.lock();
        for item in emptied.into_iter().filter(|item| wanted.contains(item)) {
            self.items.add_first(item);
        }
    }

    /// Works out the wanted items from the classes and the topology; new items are synced at
    /// once, and so are items no longer wanted (their objects are deleted).
    fn sync_topology(&self) {
        let segments: Vec<Segment> = match &self.settings.fixed_segment {
            Some(segment) => vec![segment.clone()],
            None => {
                let csinodes = self.csinodes.state();
                let nodes = self.nodes.state();
                let csinodes: Vec<&CSINode> = csinodes.iter().map(AsRef::as_ref).collect();
                let nodes: Vec<&Node> = nodes.iter().map(AsRef::as_ref).collect();
                segments(&self.settings.template.driver, &csinodes, &nodes)
            }
        };
        let classes = self.classes.state();
        let classes: Vec<&StorageClass> = classes.iter().map(AsRef::as_ref).collect();
        let tracked = tracked_classes(
            &self.settings.template.driver,
            &classes,
            self.settings.immediate_binding,
        );
        let next = items(&tracked, &segments);
        // Objects of items nobody wants any more (also those left by an earlier run).
        let obsolete: Vec<Item> = self
            .index
            .lock()
            .keys()
            .filter(|i| !next.contains(i))
            .cloned()
            .collect();
        let total = next.len();
        let changed: Vec<Item> = {
            let mut wanted = self.wanted.lock();
            let changed = wanted.symmetric_difference(&next).cloned().collect();
            *wanted = next;
            changed
        };
        if !changed.is_empty() {
            tracing::info!(
                items = total,
                changed = changed.len(),
                "CSIStorageCapacity items changed"
            );
        }
        // Ahead of the polls, in their order (each add_first goes before the one before it).
        for item in changed.into_iter().chain(obsolete).rev() {
            self.items.add_first(item);
        }
    }

    /// The objects of an item: the cache's, with our write the cache has not shown yet.
    fn objects_of(&self, item: &Item) -> Vec<CSIStorageCapacity> {
        let names: Vec<String> = self
            .index
            .lock()
            .get(item)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default();
        let namespace = &self.settings.template.namespace;
        let mut found: Vec<CSIStorageCapacity> = names
            .iter()
            .filter_map(|name| self.objects.get(&ObjectRef::new(name).within(namespace)))
            .filter(|o| &item_of(o) == item && ours(o, &self.settings.template))
            .map(|o| (*o).clone())
            .collect();
        if let Some(mine) = self.written.lock().get(item) {
            match found
                .iter_mut()
                .find(|o| o.metadata.name == mine.metadata.name)
            {
                Some(cached) => *cached = mine.clone(),
                None => found.push(mine.clone()),
            }
        }
        found
    }

    async fn get_capacity(
        &self,
        item: &Item,
        class: &StorageClass,
    ) -> Result<Wanted, CapacityError> {
        let request = csi::GetCapacityRequest {
            // Capacity does not depend on the capabilities (as upstream: none are sent).
            volume_capabilities: Vec::new(),
            parameters: class
                .parameters
                .clone()
                .unwrap_or_default()
                .into_iter()
                .collect(),
            // A driver without topology has one empty segment; it is asked without topology.
            accessible_topology: (!item.segment.is_empty()).then(|| csi::Topology {
                segments: item.segment.clone().into_iter().collect(),
            }),
        };
        let mut client = csi::controller_client::ControllerClient::new(self.csi.clone());
        let answer = self
            .calls
            .call(
                "/csi.v1.Controller/GetCapacity",
                client.get_capacity(self.calls.request(request)),
            )
            .await
            .map_err(|source| CapacityError::GetCapacity {
                item: item.clone(),
                source,
            })?;
        Ok(Wanted {
            class: item.class.clone(),
            segment: item.segment.clone(),
            capacity: answer.available_capacity,
            maximum: answer.maximum_volume_size,
        })
    }

    async fn sync_item(&self, item: Item) -> Result<Next, CapacityError> {
        let started = std::time::Instant::now();
        let wanted = self.wanted.lock().contains(&item);
        let class = self.classes.get(&ObjectRef::new(&item.class));
        let value = match (wanted, class) {
            (true, Some(class)) => Some(self.get_capacity(&item, &class).await?),
            // A class gone is noticed by the topology pass, which queues the item again.
            (true, None) => return Ok(Next::Done),
            (false, _) => None,
        };
        let existing = self.objects_of(&item);
        let existing: Vec<&CSIStorageCapacity> = existing.iter().collect();
        let actions = reconcile(&self.settings.template, &existing, value.as_slice());
        let asked = started.elapsed();
        let changes = actions.len();
        for action in actions {
            self.apply(&item, action).await?;
        }
        tracing::debug!(%item, changes, ?asked, took = ?started.elapsed(), "capacity item synced");
        if !self.wanted.lock().contains(&item) {
            return Ok(Next::Done);
        }
        let delay = next_poll(&item, self.started.elapsed(), self.settings.poll_interval);
        Ok(Next::After(delay))
    }

    async fn apply(&self, item: &Item, action: Action) -> Result<(), CapacityError> {
        let api: Api<CSIStorageCapacity> =
            Api::namespaced(self.writer.clone(), &self.settings.template.namespace);
        let failed = |action: &'static str| {
            let item = item.clone();
            move |source| CapacityError::Write {
                action,
                item,
                source,
            }
        };
        match action {
            Action::Create(object) => {
                let made = api
                    .create(&PostParams::default(), &object)
                    .await
                    .map_err(failed("create"))?;
                tracing::debug!(name = ?made.metadata.name, %item, "CSIStorageCapacity created");
                self.remember_written(item, made);
            }
            Action::Update {
                name,
                capacity,
                maximum,
                owners,
            } => {
                let mut patch = serde_json::json!({
                    "capacity": capacity,
                    "maximumVolumeSize": maximum,
                });
                if let Some(owners) = owners {
                    patch["metadata"] = serde_json::json!({ "ownerReferences": owners });
                }
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(updated) => self.remember_written(item, updated),
                    Err(error) if sidecar_kit::api_errors::is_not_found(&error) => {
                        // Deleted meanwhile: forget it; the delete event queues the item.
                        self.forget_written(item, &name);
                        self.items.add_now(item.clone());
                    }
                    Err(source) => return Err(failed("update")(source)),
                }
            }
            Action::Delete(name) => {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(error) if sidecar_kit::api_errors::is_not_found(&error) => {}
                    Err(source) => return Err(failed("delete")(source)),
                }
                self.forget_written(item, &name);
            }
        }
        Ok(())
    }

    /// Remembers our write until the watch shows it. The watch may have shown it already
    /// (its event came before the answer): then there is nothing to remember.
    fn remember_written(&self, item: &Item, object: CSIStorageCapacity) {
        let mut written = self.written.lock();
        let name = object.metadata.name.clone().unwrap_or_default();
        let seen = self
            .objects
            .get(&ObjectRef::new(&name).within(&self.settings.template.namespace))
            .is_some_and(|cached| resource_version(&cached) >= resource_version(&object));
        if seen {
            written.remove(item);
        } else {
            written.insert(item.clone(), object);
        }
    }

    fn forget_written(&self, item: &Item, name: &str) {
        let mut written = self.written.lock();
        if written
            .get(item)
            .is_some_and(|o| o.metadata.name.as_deref() == Some(name))
        {
            written.remove(item);
        }
    }

    fn update_gauges(&self) {
        // Lock order: wanted, then index (nothing takes them the other way round).
        let wanted = self.wanted.lock();
        let index = self.index.lock();
        self.gauges.set(&wanted, &index);
    }
}

impl WatchIndex<CSIStorageCapacity> for CapacityTracker {
    fn apply(&self, object: &CSIStorageCapacity) {
        self.object_seen(object, false);
    }

    fn delete(&self, object: &CSIStorageCapacity) {
        self.object_seen(object, true);
    }

    fn reset(&self, keep: &HashSet<ObjectKey>) {
        self.objects_listed(keep);
    }
}
