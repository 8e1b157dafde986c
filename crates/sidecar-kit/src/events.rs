//! A core/v1 Event recorder, as client-go's: same reasons, `source.component`, counts and
//! timestamps, so `kubectl describe` shows our events exactly as the Go sidecar's.
//!
//! Unlike client-go, identical events (same object, type, reason and message) within a window
//! are not written again: a retry loop against a failing driver does not become an event storm
//! (client-go patches the count of such an event on every repeat, one API write each time).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// `Normal`.
    Normal,
    /// `Warning`.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Writes events; one per (object, type, reason, message) per window.
pub struct Recorder {
    client: kube::Client,
    component: String,
    host: String,
    window: Duration,
    recent: Mutex<HashMap<(String, EventType, String, String), tokio::time::Instant>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder reporting as `component` from `host`.
    pub fn new(
        client: kube::Client,
        component: impl Into<String>,
        host: impl Into<String>,
    ) -> Self {
        Recorder {
            client,
            component: component.into(),
            host: host.into(),
            window: Duration::from_secs(600),
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event about `object`. Failures are logged, never returned: an event is
    /// information, not a step of the protocol.
    pub async fn record(
        &self,
        object: &ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
    ) {
        let uid = object.uid.clone().unwrap_or_default();
        let key = (uid, kind, reason.to_string(), message.to_string());
        {
            let mut recent = self.recent.lock();
            let now = tokio::time::Instant::now();
            if recent
                .get(&key)
                .is_some_and(|at| now.duration_since(*at) < self.window)
            {
                return;
            }
            if recent.len() > 10_000 {
                let window = self.window;
                recent.retain(|_, at| now.duration_since(*at) < window);
            }
            recent.insert(key, now);
        }
        let event = self.build(object, kind, reason, message, Timestamp::now());
        let namespace = object
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(error) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(%error, reason, object = ?object.name, "failed to record event");
        }
    }

    /// The Event object (separate for tests).
    pub fn build(
        &self,
        object: &ObjectReference,
        kind: EventType,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) -> Event {
        let name = object.name.clone().unwrap_or_default();
        let suffix = format!("{:x}", now.as_nanosecond());
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{suffix}")),
                namespace: object
                    .namespace
                    .clone()
                    .filter(|n| !n.is_empty())
                    .or(Some("default".into())),
                ..Default::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(kind.as_str().to_string()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            count: Some(1),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            action: None,
            related: None,
            series: None,
        }
    }
}
