//! What every controller of the project shares: the CSI connection and Kubernetes quantities.
//! (Work queue, leader election, event recorder and the HTTP endpoint join it as the
//! controllers that need them land.)

#![forbid(unsafe_code)]

pub mod csi;
pub mod duration;
pub mod events;
pub mod goflags;
pub mod http;
pub mod kubeclient;
pub mod leader;
pub mod metrics;
pub mod quantity;
pub mod ratelimit;
pub mod runtime;
pub mod selectors;
pub mod vocabulary;
pub mod watch;
pub mod workqueue;
