//! The Lease behind listed volumes (`<lease-name>-listed`, beside the intent log's): its UID
//! is this cluster's identity in the marks, annotation [`EPOCH`] counts the provisioner's
//! starts (each start's serials use a new one, made durable before the first mark), and
//! annotations [`SETTLED`] and [`UNSETTLED`] say what is settled ([`Settled`]).

use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;

use crate::decide::recovery::{Serial, Settled};

/// The annotation counting starts.
pub const EPOCH: &str = "volstack.dev/epoch";
/// The annotation holding the settled mark.
pub const SETTLED: &str = "volstack.dev/settled";
/// The annotation listing the serials below the mark that may still be without a PV.
pub const UNSETTLED: &str = "volstack.dev/unsettled";

/// Why the Lease could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// The API call failed.
    #[error("failed to {action} the Lease {name}: {source}")]
    Api {
        /// What was tried.
        action: &'static str,
        /// The Lease.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// An annotation does not read: refusing to guess which volumes are settled.
    #[error("the Lease {name} has annotation {key}={value:?}, which does not read")]
    Corrupt {
        /// The Lease.
        name: String,
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// The API server stored the Lease without a UID.
    #[error("the Lease {0} has no UID to identify this cluster by")]
    NoUid(String),
}

/// What the Lease said at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// This cluster's identity.
    pub identity: String,
    /// What is settled (nothing when never written: every marked volume is looked at).
    pub settled: Settled,
}

/// The Lease of a running provisioner that marks its CreateVolumes.
#[derive(Debug)]
pub struct Listing {
    api: Api<Lease>,
    name: String,
    /// What was read at start.
    pub found: Found,
    /// This start's epoch.
    epoch: u64,
    /// The next sequence number (taken under the in-flight table's lock, so the settled mark
    /// never passes a serial that is about to be in flight).
    next: AtomicU64,
    /// The Lease as last written, and what it says is settled.
    last: Mutex<(Lease, Settled)>,
}

fn annotation<'a>(lease: &'a Lease, key: &str) -> Option<&'a str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Maps a failed API call on the Lease `name`.
fn failed(name: &str, action: &'static str) -> impl FnOnce(kube::Error) -> ListingError {
    let name = name.to_string();
    move |source| ListingError::Api {
        action,
        name,
        source,
    }
}

fn read(lease: &Lease, name: &str) -> Result<(Found, u64), ListingError> {
    let corrupt = |key, value: &str| ListingError::Corrupt {
        name: name.to_string(),
        key,
        value: value.to_string(),
    };
    let identity = lease
        .metadata
        .uid
        .clone()
        .filter(|uid| !uid.is_empty())
        .ok_or_else(|| ListingError::NoUid(name.to_string()))?;
    let epoch = match annotation(lease, EPOCH) {
        None => 0,
        // An epoch that cannot grow (u64::MAX) does not read either: the next would wrap.
        Some(text) => text
            .parse::<u64>()
            .ok()
            .filter(|epoch| epoch.checked_add(1).is_some())
            .ok_or_else(|| corrupt(EPOCH, text))?,
    };
    let settled = match annotation(lease, SETTLED) {
        None => Settled::default(),
        Some(mark) => {
            let unsettled = annotation(lease, UNSETTLED).unwrap_or_default();
            Settled::read(mark, unsettled).map_err(|_| {
                corrupt(
                    UNSETTLED,
                    &format!("{SETTLED}={mark:?} {UNSETTLED}={unsettled:?}"),
                )
            })?
        }
    };
    Ok((Found { identity, settled }, epoch))
}

fn annotate(lease: &mut Lease, key: &str, value: String) {
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_string(), value);
}

impl Listing {
    /// Reads the Lease (made when missing), and writes this start's epoch into it before any
    /// volume is marked with it.
    pub async fn start(
        client: kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<Self, ListingError> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let mut lease = match api.get_opt(name).await.map_err(failed(name, "read"))? {
            Some(lease) => lease,
            None => {
                let new = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        ..Default::default()
                    },
                    spec: None,
                };
                match api.create(&PostParams::default(), &new).await {
                    Ok(made) => made,
                    Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {
                        api.get(name).await.map_err(failed(name, "read"))?
                    }
                    Err(source) => return Err(failed(name, "create")(source)),
                }
            }
        };
        let (found, epoch) = read(&lease, name)?;
        let epoch = epoch + 1;
        annotate(&mut lease, EPOCH, epoch.to_string());
        let lease = api
            .replace(name, &PostParams::default(), &lease)
            .await
            .map_err(failed(name, "write"))?;
        Ok(Listing {
            api,
            name: name.to_string(),
            last: Mutex::new((lease, found.settled.clone())),
            found,
            epoch,
            next: AtomicU64::new(0),
        })
    }

    /// What the Lease says, without writing (to finish volumes a run with listed volumes left
    /// when this one records in the intent log); None when there is no Lease.
    pub async fn peek(
        client: kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Found>, ListingError> {
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let lease = api.get_opt(name).await.map_err(failed(name, "read"))?;
        lease
            .map(|lease| read(&lease, name).map(|(found, _)| found))
            .transpose()
    }

    /// A new serial. The caller holds the in-flight table's lock and puts the volume in it.
    pub fn take_serial(&self) -> Serial {
        Serial {
            epoch: self.epoch,
            sequence: self.next.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The serial the next volume gets (read under the in-flight table's lock).
    pub fn next_serial(&self) -> Serial {
        Serial {
            epoch: self.epoch,
            sequence: self.next.load(Ordering::Relaxed),
        }
    }

    /// Writes what is settled when it changed. Only the leader writes; a conflict is an error
    /// (retried from the Lease as stored).
    pub async fn settle(&self, settled: &Settled) -> Result<bool, ListingError> {
        let mut lease = {
            let last = self.last.lock();
            if last.1 == *settled {
                return Ok(false);
            }
            last.0.clone()
        };
        annotate(&mut lease, SETTLED, settled.mark.to_string());
        annotate(&mut lease, UNSETTLED, settled.unsettled_text());
        let written = match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => written,
            Err(error) if sidecar_kit::api_errors::is_conflict(&error) => {
                // Written by someone else meanwhile: the retry starts from what is stored.
                let stored = self
                    .api
                    .get(&self.name)
                    .await
                    .map_err(failed(&self.name, "read"))?;
                self.last.lock().0 = stored;
                return Err(failed(&self.name, "write")(error));
            }
            Err(source) => return Err(failed(&self.name, "write")(source)),
        };
        *self.last.lock() = (written, settled.clone());
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(epoch: Option<&str>) -> Lease {
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some("p-listed".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        if let Some(epoch) = epoch {
            annotate(&mut lease, EPOCH, epoch.to_string());
        }
        lease
    }

    #[test]
    fn the_epoch_reads_when_it_can_grow() {
        let rows: [(Option<&str>, Option<u64>); 6] = [
            (None, Some(0)),
            (Some("0"), Some(0)),
            (Some("41"), Some(41)),
            (Some("18446744073709551614"), Some(u64::MAX - 1)),
            // The next start's epoch would wrap to 0 and reuse its serials.
            (Some("18446744073709551615"), None),
            (Some("x"), None),
        ];
        for (stored, want) in rows {
            let got = read(&lease(stored), "p-listed");
            match want {
                Some(epoch) => assert_eq!(got.ok().map(|(_, e)| e), Some(epoch), "{stored:?}"),
                None => assert!(
                    matches!(got, Err(ListingError::Corrupt { key: EPOCH, .. })),
                    "{stored:?}: {got:?}"
                ),
            }
        }
    }
}
