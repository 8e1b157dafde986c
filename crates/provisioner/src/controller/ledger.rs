//! The in-flight ledger: every volume that may exist at the driver without a PV, from the
//! moment before its CreateVolume is sent ([`Ledger::open`]) or a crashed predecessor's record
//! is taken back ([`Ledger::take_back`]) until its PV is saved or it certainly does not exist
//! ([`Ledger::settle`], which also forgets its intent-log record). Nothing else adds or removes
//! an entry; the claim path, the set manager, cloning protection and the settled mark read it.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use csi_proto::v1 as csi;
use parking_lot::Mutex;

use super::ClaimKey;
use super::in_flight::InFlight;
use super::intents::IntentLog;
use super::listing::Listing;
use crate::decide::recovery::{self, Owner, Serial};

/// Volumes that may exist without a PV, by PV name, and the intent log their records go to.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    table: Mutex<HashMap<String, InFlight>>,
    /// Opened when the workers start (with listed volumes only its earlier records are
    /// finished and forgotten).
    intents: OnceLock<Arc<IntentLog>>,
}

impl Ledger {
    /// Puts `volume` in flight before its CreateVolume and returns the request to send. With
    /// listed volumes (`listing`), the request is marked with this cluster's identity, the
    /// volume's serial (the one it was first asked for with when it is in flight already: the
    /// driver keeps the first marks), the claim (or set) and the secret's reference. The serial
    /// is taken under the ledger's lock, so what is written as settled never includes it while
    /// it may exist.
    pub(crate) fn open(
        &self,
        volume: &str,
        mut flight: InFlight,
        listing: Option<&Listing>,
    ) -> csi::CreateVolumeRequest {
        let mut table = self.table.lock();
        if let Some(listing) = listing {
            let serial = table
                .get(volume)
                .and_then(|f| f.serial)
                .unwrap_or_else(|| listing.take_serial());
            recovery::mark(
                &mut flight.request.parameters,
                &Owner {
                    cluster: &listing.found.identity,
                    serial,
                    claim: &flight.claim,
                    claim_uid: &flight.claim_uid,
                    secret: flight.secret.as_ref(),
                },
            );
            flight.serial = Some(serial);
        }
        let request = flight.request.clone();
        table.insert(volume.to_string(), flight);
        request
    }

    /// Puts back in flight a volume a predecessor left (from its intent record or the driver's
    /// listing).
    pub(crate) fn take_back(&self, volume: String, flight: InFlight) {
        self.table.lock().insert(volume, flight);
    }

    /// The volume has a PV or certainly does not exist: its entry and its intent record go.
    pub(crate) fn settle(&self, volume: &str) {
        self.table.lock().remove(volume);
        if let Some(log) = self.intents.get() {
            log.forget(volume);
        }
    }

    /// Keeps the intent log (once, when the workers start).
    pub(crate) fn keep_intents(&self, log: Arc<IntentLog>) {
        self.intents.get_or_init(|| log);
    }

    /// The intent log, once kept.
    pub(crate) fn intents(&self) -> Option<&IntentLog> {
        self.intents.get().map(|log| &**log)
    }

    /// The entry of `volume`.
    pub(crate) fn get(&self, volume: &str) -> Option<InFlight> {
        self.table.lock().get(volume).cloned()
    }

    /// Whether `volume` is in flight.
    pub(crate) fn contains(&self, volume: &str) -> bool {
        self.table.lock().contains_key(volume)
    }

    /// The volumes in flight for the claim `key`.
    pub(crate) fn of_claim(&self, key: &ClaimKey) -> Vec<(String, InFlight)> {
        self.matching(|f| &f.claim == key)
    }

    /// The volumes in flight for the PersistentVolumeSet `set`.
    pub(crate) fn of_pool(&self, set: &str) -> Vec<(String, InFlight)> {
        self.matching(|f| f.pool() == Some(set))
    }

    fn matching(&self, wanted: impl Fn(&InFlight) -> bool) -> Vec<(String, InFlight)> {
        self.table
            .lock()
            .iter()
            .filter(|(_, f)| wanted(f))
            .map(|(n, f)| (n.clone(), f.clone()))
            .collect()
    }

    /// Whether a CreateVolume copying the volume `handle` is in flight.
    pub(crate) fn copying_from(&self, handle: &str) -> bool {
        self.table.lock().values().any(|f| {
            matches!(
                f.request.volume_content_source.as_ref().and_then(|s| s.r#type.as_ref()),
                Some(csi::volume_content_source::Type::Volume(v)) if v.volume_id == handle
            )
        })
    }

    /// The serials of the volumes in flight (those not settled yet).
    pub(crate) fn serials(&self) -> Vec<Serial> {
        self.table
            .lock()
            .values()
            .filter_map(|f| f.serial)
            .collect()
    }

    /// Volume → claim (`namespace/name`, or a set's name).
    #[cfg(test)]
    fn summary(&self) -> std::collections::BTreeMap<String, String> {
        self.table
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.claim.to_string()))
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn flight(claim: &str, copying: Option<&str>) -> InFlight {
        InFlight {
            claim: ClaimKey::new(Some("default"), claim),
            claim_uid: format!("uid-{claim}"),
            request: csi::CreateVolumeRequest {
                name: format!("pvc-{claim}"),
                volume_content_source: copying.map(|id| csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Volume(
                        csi::volume_content_source::VolumeSource {
                            volume_id: id.into(),
                        },
                    )),
                }),
                ..Default::default()
            },
            secret: None,
            listed: None,
            serial: None,
            migrated: false,
        }
    }

    #[test]
    fn an_entry_lives_from_open_to_settle_and_is_found_by_claim_and_source() {
        let ledger = Ledger::default();
        let request = ledger.open("pvc-a", flight("a", None), None);
        assert_eq!(
            request.name, "pvc-a",
            "without listing the request is sent as opened"
        );
        ledger.take_back("pvc-b".into(), flight("b", Some("vol-a")));
        assert!(ledger.contains("pvc-a"));
        assert_eq!(
            ledger.of_claim(&ClaimKey::new(Some("default"), "b"))[0].0,
            "pvc-b"
        );
        assert!(ledger.copying_from("vol-a"));
        assert!(!ledger.copying_from("vol-b"));
        assert!(ledger.serials().is_empty(), "no serials without listing");
        ledger.settle("pvc-b");
        assert!(!ledger.copying_from("vol-a"));
        assert_eq!(
            ledger.summary(),
            std::collections::BTreeMap::from([("pvc-a".to_string(), "default/a".to_string())])
        );
        assert!(ledger.get("pvc-b").is_none());
    }
}
