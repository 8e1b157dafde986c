//! What every controller of the project shares: the CSI connection, the controller runtime
//! (reflectors, work queue, backoff, leader election, shutdown), the event recorder, the HTTP
//! endpoint, the API server's error vocabulary, Kubernetes quantities and the host's mount table.

#![forbid(unsafe_code)]

pub mod api_errors;
pub mod assume;
pub mod compact;
pub mod csi;
pub mod custom_resource;
pub mod driver;
pub mod duration;
pub mod events;
pub mod finalizers;
pub mod flags;
pub mod goflags;
pub mod http;
pub mod key;
pub mod klog;
pub mod kubeclient;
pub mod leader;
pub mod metrics;
pub mod migration;
pub mod mounts;
pub mod patch_ops;
pub mod process;
pub mod pv_csi;
pub mod quantity;
pub mod ratelimit;
pub mod recent;
pub mod recoverable;
pub mod runtime;
pub mod secrets;
pub mod selectors;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod update;
pub mod vocabulary;
pub mod watch;
pub mod watch_index;
mod watch_shared;
pub mod workqueue;
pub mod yaml;
