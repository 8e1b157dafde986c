//! What every controller of the project shares: the CSI connection and Kubernetes quantities.
//! (Work queue, leader election, event recorder and the HTTP endpoint join it as the
//! controllers that need them land.)

#![forbid(unsafe_code)]

pub mod api_errors;
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
pub mod kubeclient;
pub mod leader;
pub mod metrics;
pub mod process;
pub mod pv_csi;
pub mod quantity;
pub mod ratelimit;
pub mod recoverable;
pub mod runtime;
pub mod secrets;
pub mod selectors;
pub mod update;
pub mod vocabulary;
pub mod watch;
pub mod workqueue;
