//! The benchmark's own background tasks (watches, samplers): aborted when the run that started
//! them ends, fails or is interrupted, so none keeps running against a stack that is gone.

use std::fmt::Debug;

use futures::{Stream, StreamExt};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Tasks aborted on drop.
#[derive(Debug, Default)]
pub(super) struct Background(Vec<tokio::task::AbortHandle>);

impl Background {
    /// Runs `task` until this is dropped.
    pub(super) fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.0.push(tokio::spawn(task).abort_handle());
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The events of every object of `api`, resuming with backoff after an error: a watch without
/// one retries at once, and against a stack that is gone it spins and never yields.
pub(super) fn watch<K>(api: Api<K>) -> impl Stream<Item = watcher::Event<K>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(|item| async move { item.ok() })
}
