//! The intent log: before CreateVolume, the request is recorded in a Lease object
//! (`<lease-name>-intents`, annotation `volstack.dev/in-flight`), so that after a crash at any
//! instant the next leader knows every volume that may exist without a PV, and finishes or
//! undoes it. Records are written in batches: every worker waiting at that moment shares one
//! API write (group commit), so the cost per volume shrinks as load grows. Removals are
//! written with the next batch; a stale record only costs an idempotent CreateVolume and
//! DeleteVolume after a crash.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use csi_proto::v1 as csi;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};

/// The annotation holding the records.
pub const ANNOTATION: &str = "volstack.dev/in-flight";

/// One record, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
    /// CreateVolumeRequest without secrets, protobuf, base64.
    pub request: String,
    /// Secret namespace/name for Create/DeleteVolume ("" for none).
    #[serde(default)]
    pub secret: String,
}

impl Record {
    /// Encodes a request.
    pub fn new(
        namespace: &str,
        name: &str,
        uid: &str,
        request: &csi::CreateVolumeRequest,
        secret: Option<(String, String)>,
    ) -> Record {
        let mut bare = request.clone();
        bare.secrets.clear();
        Record {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            request: base64::engine::general_purpose::STANDARD.encode(bare.encode_to_vec()),
            secret: secret
                .map(|(ns, n)| format!("{ns}/{n}"))
                .unwrap_or_default(),
        }
    }

    /// Decodes the request.
    pub fn request(&self) -> Option<csi::CreateVolumeRequest> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.request)
            .ok()?;
        csi::CreateVolumeRequest::decode(bytes.as_slice()).ok()
    }

    /// The secret reference.
    pub fn secret(&self) -> Option<(String, String)> {
        self.secret
            .split_once('/')
            .map(|(ns, n)| (ns.to_string(), n.to_string()))
    }
}

/// Why the log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// API failure.
    #[error("failed to {action} the intent log: {source}")]
    Api {
        /// What.
        action: &'static str,
        /// Why.
        source: kube::Error,
    },
    /// The writer stopped.
    #[error("the intent log writer stopped")]
    Stopped,
}

struct State {
    records: BTreeMap<String, Record>,
    version: u64,
    waiters: usize,
}

/// The log.
pub struct IntentLog {
    api: Api<Lease>,
    /// The Lease as last read or written, so a write needs no read first.
    last: tokio::sync::Mutex<Option<Lease>>,
    name: String,
    state: Mutex<State>,
    dirty: Notify,
    written: watch::Sender<(u64, Option<String>)>,
}

impl std::fmt::Debug for IntentLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntentLog")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl IntentLog {
    /// Reads the log (creating nothing yet) and starts its writer.
    pub async fn open(
        client: kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<IntentLog>, IntentError> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let existing = api.get_opt(name).await.map_err(|source| IntentError::Api {
            action: "read",
            source,
        })?;
        let records: BTreeMap<String, Record> = existing
            .as_ref()
            .and_then(|l| l.metadata.annotations.as_ref())
            .and_then(|a| a.get(ANNOTATION))
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default();
        let (written, _) = watch::channel((0, None));
        let log = Arc::new(IntentLog {
            last: tokio::sync::Mutex::new(existing.clone()),
            api,
            name: name.to_string(),
            state: Mutex::new(State {
                records,
                version: 0,
                waiters: 0,
            }),
            dirty: Notify::new(),
            written,
        });
        tokio::spawn(log.clone().writer());
        Ok(log)
    }

    /// The records found at start (and since).
    pub fn records(&self) -> BTreeMap<String, Record> {
        lock(&self.state).records.clone()
    }

    /// Records an intent and waits until it is stored.
    pub async fn record(&self, volume: &str, record: Record) -> Result<(), IntentError> {
        let version = {
            let mut state = lock(&self.state);
            if state.records.get(volume) == Some(&record) {
                // Already stored (a retry of the same request) unless a write is pending.
                state.version
            } else {
                state.records.insert(volume.to_string(), record);
                state.version += 1;
                state.version
            }
        };
        let mut rx = self.written.subscribe();
        lock(&self.state).waiters += 1;
        self.dirty.notify_one();
        let waited = rx
            .wait_for(|(done, failed)| *done >= version || failed.is_some())
            .await
            .map(|r| r.clone());
        lock(&self.state).waiters -= 1;
        let result = waited.map_err(|_| IntentError::Stopped)?;
        match &result.1 {
            Some(reason) if result.0 < version => Err(IntentError::Api {
                action: "write",
                source: kube::Error::Api(Box::new(kube::core::Status::failure(
                    reason,
                    "InternalError",
                ))),
            }),
            _ => Ok(()),
        }
    }

    /// Forgets an intent. Not written by itself: removals ride along with the next batch of
    /// records, or go out after a quiet period, so they cost no write per volume.
    pub fn forget(&self, volume: &str) {
        let mut state = lock(&self.state);
        if state.records.remove(volume).is_some() {
            state.version += 1;
        }
    }

    async fn writer(self: Arc<Self>) {
        let mut written_version = 0;
        loop {
            let (version, waiting) = {
                let state = lock(&self.state);
                (state.version, state.waiters)
            };
            if version == written_version {
                self.dirty.notified().await;
                continue;
            }
            if waiting == 0 {
                // Only removals are pending: give a record up to ten seconds to take them along.
                tokio::select! {
                    () = self.dirty.notified() => continue,
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
            let (version, text) = {
                let state = lock(&self.state);
                (
                    state.version,
                    serde_json::to_string(&state.records).unwrap_or_else(|_| "{}".into()),
                )
            };
            match self.store(&text).await {
                Ok(()) => {
                    written_version = version;
                    self.written.send_modify(|w| *w = (version, None));
                }
                Err(error) => {
                    tracing::warn!(%error, "failed to write the intent log; retrying");
                    self.written.send_modify(|w| w.1 = Some(error.to_string()));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    self.written.send_modify(|w| w.1 = None);
                }
            }
        }
    }

    async fn store(&self, text: &str) -> Result<(), IntentError> {
        let mut last = self.last.lock().await;
        for _ in 0..5 {
            let result = match last.clone() {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            annotations: Some(BTreeMap::from([(
                                ANNOTATION.to_string(),
                                text.to_string(),
                            )])),
                            ..Default::default()
                        },
                        spec: None,
                    };
                    self.api.create(&PostParams::default(), &lease).await
                }
                Some(mut lease) => {
                    lease.metadata.managed_fields = None;
                    lease
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(ANNOTATION.to_string(), text.to_string());
                    self.api
                        .replace(&self.name, &PostParams::default(), &lease)
                        .await
                }
            };
            match result {
                Ok(written) => {
                    *last = Some(written);
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    // Someone else wrote it (or it was removed): read it again and retry.
                    *last =
                        self.api
                            .get_opt(&self.name)
                            .await
                            .map_err(|source| IntentError::Api {
                                action: "read",
                                source,
                            })?;
                }
                Err(source) => {
                    return Err(IntentError::Api {
                        action: "write",
                        source,
                    });
                }
            }
        }
        Err(IntentError::Api {
            action: "write",
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("the intent log kept changing", "Conflict")
                    .with_code(409),
            )),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_the_request_without_secrets() {
        let request = csi::CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 5,
                limit_bytes: 0,
            }),
            secrets: [("password".to_string(), "hunter2".to_string())].into(),
            ..Default::default()
        };
        let r = Record::new("ns", "c", "uid", &request, Some(("ns".into(), "s".into())));
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("hunter2"));
        let back: Record = serde_json::from_str(&text).unwrap();
        let decoded = back.request().unwrap();
        assert_eq!(decoded.name, "pvc-1");
        assert!(decoded.secrets.is_empty());
        assert_eq!(back.secret(), Some(("ns".into(), "s".into())));
    }
}
