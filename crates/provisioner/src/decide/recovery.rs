//! How the provisioner finds, after a crash at any instant, every volume it may have made
//! without a PV, so that none is leaked:
//! - **intent log**: a record written before each CreateVolume (one API write per volume when
//!   claims come one at a time; shared by the claims of a burst);
//! - **listed volumes**: with a driver that follows the recoverable-volumes convention
//!   ([`sidecar_kit::recoverable`]), each CreateVolume carries marks (this cluster's identity,
//!   the volume's serial, the claim, the secret's reference) that the driver lists with the
//!   volume; at start the provisioner lists the driver's volumes and takes back those of this
//!   cluster without a PV whose serial is not below the *settled* mark. Nothing is written
//!   before CreateVolume.
//!
//! What is settled ([`Settled`]): every volume whose serial is below a mark, except the few
//! listed as unsettled (in flight when the mark was written), has had its PV saved, or
//! certainly does not exist. A marked volume without a PV that is settled had a PV that was
//! deleted without DeleteVolume (a `Retain` volume kept on purpose) and is never taken. It is
//! written when a PV whose reclaim policy is not `Delete` is saved or seen (a `Delete` PV's
//! volume is deleted with it, so nothing need be written for it).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::PersistentVolume;
use sidecar_kit::key::ObjectKey;
use sidecar_kit::recoverable;
use sidecar_kit::secrets::SecretRef;

/// `--in-flight-recovery`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecoveryFlag {
    /// Listed volumes when the driver follows the convention, else the intent log.
    Auto,
    /// Always the intent log.
    IntentLog,
    /// Listed volumes; refused at start when the driver does not follow the convention.
    ListVolumes,
}

/// How in-flight volumes are recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// A record in the intent log before each CreateVolume.
    IntentLog,
    /// Marks on each CreateVolume; ListVolumes at start.
    ListVolumes,
}

/// The way chosen for a driver that does or does not follow the convention (and advertise
/// LIST_VOLUMES); the refusal names the flag.
pub fn choose(flag: RecoveryFlag, driver_follows: bool) -> Result<Recovery, String> {
    match (flag, driver_follows) {
        (RecoveryFlag::IntentLog, _) | (RecoveryFlag::Auto, false) => Ok(Recovery::IntentLog),
        (RecoveryFlag::Auto | RecoveryFlag::ListVolumes, true) => Ok(Recovery::ListVolumes),
        (RecoveryFlag::ListVolumes, false) => Err(format!(
            "--in-flight-recovery=list-volumes: the driver does not follow the recoverable-volumes convention (LIST_VOLUMES and the GetPluginInfo manifest key {}={}); use auto or intent-log",
            recoverable::MANIFEST_KEY,
            recoverable::VERSION
        )),
    }
}

/// When a volume was asked for: the provisioner's start (`epoch`, one more at each start)
/// and the number of the request since that start. Ordered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Serial {
    /// The start.
    pub epoch: u64,
    /// The request since that start.
    pub sequence: u64,
}

impl fmt::Display for Serial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch, self.sequence)
    }
}

impl FromStr for Serial {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let number = |part: &str| {
            (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
                .then(|| part.parse::<u64>().ok())
                .flatten()
        };
        text.split_once('.')
            .and_then(|(epoch, sequence)| {
                Some(Serial {
                    epoch: number(epoch)?,
                    sequence: number(sequence)?,
                })
            })
            .ok_or_else(|| format!("{text:?} is not <epoch>.<sequence>"))
    }
}

/// The most serials kept as exceptions; with more in flight the mark stays below them all.
pub const MAX_UNSETTLED: usize = 1000;

/// What is settled: every serial below `mark` except those in `unsettled` has had its PV
/// saved, or certainly does not exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Serials from here on may be without a PV.
    pub mark: Serial,
    /// Serials below the mark that may still be without a PV (in flight when it was written).
    pub unsettled: BTreeSet<Serial>,
}

impl Settled {
    /// What is settled while `in_flight` are the serials in flight and `next` the serial the
    /// next volume gets: everything below `next` but those in flight (at most
    /// [`MAX_UNSETTLED`] of them; with more, the lowest of them is the mark).
    pub fn now(in_flight: impl IntoIterator<Item = Serial>, next: Serial) -> Settled {
        let unsettled: BTreeSet<Serial> = in_flight.into_iter().filter(|s| *s < next).collect();
        if unsettled.len() > MAX_UNSETTLED {
            let mark = unsettled.first().copied().unwrap_or(next);
            return Settled {
                mark,
                unsettled: BTreeSet::new(),
            };
        }
        Settled {
            mark: next,
            unsettled,
        }
    }

    /// Whether a listed volume with this serial may have been left without a PV (and is
    /// taken back), rather than had a PV that was deleted without DeleteVolume.
    pub fn may_be_in_flight(&self, serial: Serial) -> bool {
        serial >= self.mark || self.unsettled.contains(&serial)
    }

    /// The exceptions as stored (`,`-separated serials).
    pub fn unsettled_text(&self) -> String {
        let serials: Vec<String> = self.unsettled.iter().map(Serial::to_string).collect();
        serials.join(",")
    }

    /// Reads the mark and the exceptions as stored.
    pub fn read(mark: &str, unsettled: &str) -> Result<Settled, String> {
        let unsettled = unsettled
            .split(',')
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<BTreeSet<Serial>, String>>()?;
        Ok(Settled {
            mark: mark.parse()?,
            unsettled,
        })
    }
}

/// Whether `pv`, a PV of `driver`, may be deleted without its volume (its reclaim policy is
/// not `Delete`): once it is saved, what is settled must be written, or a restart could take
/// its volume for one left in flight after the PV is gone.
pub fn outlives_its_pv(
    pv: &PersistentVolume,
    driver: &str,
    migrated_from: Option<sidecar_kit::migration::Plugin>,
) -> bool {
    let Some(spec) = pv.spec.as_ref() else {
        return false;
    };
    // Ours: a CSI volume of the driver, or an in-tree volume of the plugin it stands in for.
    let ours = spec.csi.as_ref().is_some_and(|csi| csi.driver == driver)
        || migrated_from.is_some_and(|p| sidecar_kit::migration::Plugin::of_spec(spec) == Some(p));
    let kept = spec
        .persistent_volume_reclaim_policy
        .as_deref()
        .is_some_and(|policy| policy != "Delete");
    ours && kept
}

/// What a volume's marks say it was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    /// This cluster's identity.
    pub cluster: &'a str,
    /// The volume's serial.
    pub serial: Serial,
    /// The claim (a set's name, cluster-scoped, for a set's volume).
    pub claim: &'a ObjectKey,
    /// The claim's UID (a set's token).
    pub claim_uid: &'a str,
    /// The secret CreateVolume and DeleteVolume use.
    pub secret: Option<&'a SecretRef>,
}

/// Adds the marks to a CreateVolume's parameters.
pub fn mark(parameters: &mut HashMap<String, String>, owner: &Owner<'_>) {
    parameters.insert(recoverable::CLUSTER.to_string(), owner.cluster.to_string());
    parameters.insert(recoverable::SERIAL.to_string(), owner.serial.to_string());
    parameters.insert(recoverable::CLAIM.to_string(), owner.claim.to_string());
    parameters.insert(
        recoverable::CLAIM_UID.to_string(),
        owner.claim_uid.to_string(),
    );
    if let Some(secret) = owner.secret {
        parameters.insert(
            recoverable::SECRET.to_string(),
            format!("{}/{}", secret.namespace, secret.name),
        );
    }
}

/// A listed volume this cluster made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The CreateVolume name (the PV's name).
    pub name: String,
    /// The driver's id.
    pub volume_id: String,
    /// Its serial.
    pub serial: Serial,
    /// The claim (or set) it was made for.
    pub claim: ObjectKey,
    /// That claim's UID (or the set's token).
    pub claim_uid: String,
    /// The secret DeleteVolume uses.
    pub secret: Option<SecretRef>,
}

/// The volume as this cluster's, or None: another cluster's, unmarked, or with marks that do
/// not read (never taken for ours: only a volume proven ours may be deleted).
pub fn listed(volume: &csi::Volume, cluster: &str) -> Option<Listed> {
    let context = &volume.volume_context;
    let get = |key: &str| context.get(key).filter(|v| !v.is_empty());
    if cluster.is_empty() || get(recoverable::CLUSTER)? != cluster || volume.volume_id.is_empty() {
        return None;
    }
    let claim = get(recoverable::CLAIM)?;
    let claim = match claim.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            ObjectKey::new(Some(namespace), name)
        }
        Some(_) => return None,
        None => ObjectKey::cluster(claim),
    };
    let secret = match context.get(recoverable::SECRET) {
        None => None,
        Some(text) => match text.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
                Some(SecretRef {
                    name: name.to_string(),
                    namespace: namespace.to_string(),
                })
            }
            _ => return None,
        },
    };
    Some(Listed {
        name: get(recoverable::NAME)?.clone(),
        volume_id: volume.volume_id.clone(),
        serial: get(recoverable::SERIAL)?.parse().ok()?,
        claim,
        claim_uid: get(recoverable::CLAIM_UID)?.clone(),
        secret,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_way_follows_the_flag_and_the_driver() {
        use Recovery::*;
        use RecoveryFlag as F;
        for (flag, follows, want) in [
            (F::Auto, true, Some(ListVolumes)),
            (F::Auto, false, Some(IntentLog)),
            (F::IntentLog, true, Some(IntentLog)),
            (F::IntentLog, false, Some(IntentLog)),
            (F::ListVolumes, true, Some(ListVolumes)),
            (F::ListVolumes, false, None),
        ] {
            let got = choose(flag, follows);
            assert_eq!(got.as_ref().ok(), want.as_ref(), "{flag:?} {follows}");
            if let Err(message) = got {
                assert!(message.contains("--in-flight-recovery"), "{message}");
            }
        }
    }

    /// The context a following driver returns for a CreateVolume with these parameters.
    fn echoed(name: &str, id: &str, parameters: &HashMap<String, String>) -> csi::Volume {
        let mut volume_context: HashMap<String, String> = parameters
            .iter()
            .filter(|(k, _)| recoverable::is_mark(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        volume_context.insert(recoverable::NAME.into(), name.into());
        volume_context.insert("kind".into(), "fast".into());
        csi::Volume {
            volume_id: id.into(),
            volume_context,
            ..Default::default()
        }
    }

    #[test]
    fn marked_volumes_read_back_as_made_and_only_for_their_cluster() {
        let claim = ObjectKey::new(Some("ns"), "data");
        let set = ObjectKey::cluster("pool");
        let secret = SecretRef {
            name: "creds".into(),
            namespace: "vault".into(),
        };
        for (key, uid, secret) in [(&claim, "uid-1", Some(&secret)), (&set, "token-1", None)] {
            let mut parameters: HashMap<String, String> = [("kind".into(), "fast".into())].into();
            mark(
                &mut parameters,
                &Owner {
                    cluster: "cluster-a",
                    serial: Serial {
                        epoch: 3,
                        sequence: 41,
                    },
                    claim: key,
                    claim_uid: uid,
                    secret,
                },
            );
            let volume = echoed("pvc-1", "vol-1", &parameters);
            assert_eq!(
                listed(&volume, "cluster-a"),
                Some(Listed {
                    name: "pvc-1".into(),
                    volume_id: "vol-1".into(),
                    serial: Serial {
                        epoch: 3,
                        sequence: 41,
                    },
                    claim: key.clone(),
                    claim_uid: uid.into(),
                    secret: secret.cloned(),
                })
            );
            assert_eq!(listed(&volume, "cluster-b"), None, "another cluster's");
            assert_eq!(listed(&volume, ""), None, "no identity, nothing is ours");
        }
    }

    #[test]
    fn volumes_whose_marks_do_not_read_are_never_taken_for_ours() {
        let mut parameters = HashMap::new();
        let claim = ObjectKey::new(Some("ns"), "data");
        mark(
            &mut parameters,
            &Owner {
                cluster: "c",
                serial: Serial::default(),
                claim: &claim,
                claim_uid: "u",
                secret: None,
            },
        );
        let good = echoed("pvc-1", "vol-1", &parameters);
        assert!(listed(&good, "c").is_some());
        let broken: Vec<(&str, Option<&str>)> = vec![
            (recoverable::NAME, None),
            (recoverable::NAME, Some("")),
            (recoverable::CLUSTER, None),
            (recoverable::CLAIM, None),
            (recoverable::CLAIM, Some("ns/")),
            (recoverable::CLAIM, Some("/data")),
            (recoverable::CLAIM_UID, None),
            (recoverable::SERIAL, None),
            (recoverable::SERIAL, Some("7")),
            (recoverable::SERIAL, Some("7.")),
            (recoverable::SERIAL, Some("-1.2")),
            (recoverable::SERIAL, Some("1.2.3")),
            (recoverable::SECRET, Some("no-slash")),
            (recoverable::SECRET, Some("/name")),
        ];
        for (key, value) in broken {
            let mut volume = good.clone();
            match value {
                None => {
                    volume.volume_context.remove(key);
                }
                Some(v) => {
                    volume.volume_context.insert(key.into(), v.into());
                }
            }
            assert_eq!(listed(&volume, "c"), None, "{key}={value:?}");
        }
        let mut no_id = good.clone();
        no_id.volume_id.clear();
        assert_eq!(listed(&no_id, "c"), None, "no id");
        assert_eq!(
            listed(&csi::Volume::default(), "c"),
            None,
            "an unmarked volume"
        );
    }

    #[test]
    fn serials_order_by_start_then_request_and_read_back() {
        let s = |epoch, sequence| Serial { epoch, sequence };
        assert!(s(1, 900) < s(2, 0));
        assert!(s(2, 3) < s(2, 10), "numbers, not text");
        for serial in [s(0, 0), s(1, 2), s(u64::MAX, 7)] {
            assert_eq!(serial.to_string().parse::<Serial>(), Ok(serial));
        }
        for text in [
            "",
            "1",
            "1.",
            ".1",
            "a.1",
            "1.b",
            "+1.2",
            "1.2.3",
            "99999999999999999999.1",
        ] {
            assert!(text.parse::<Serial>().is_err(), "{text:?}");
        }
    }

    #[test]
    fn what_is_settled_excludes_every_volume_in_flight() {
        let s = |epoch, sequence| Serial { epoch, sequence };
        let next = s(4, 20);
        let many: Vec<Serial> = (0..=MAX_UNSETTLED as u64).map(|n| s(3, n)).collect();
        for (in_flight, mark, unsettled) in [
            (vec![], next, vec![]),
            (vec![s(4, 12), s(2, 700)], next, vec![s(2, 700), s(4, 12)]),
            (many.clone(), s(3, 0), vec![]),
        ] {
            let settled = Settled::now(in_flight.clone(), next);
            assert_eq!(settled.mark, mark);
            assert_eq!(settled.unsettled, unsettled.iter().copied().collect());
            for serial in &in_flight {
                assert!(settled.may_be_in_flight(*serial), "{serial} is in flight");
            }
            assert!(settled.may_be_in_flight(next), "the next volume");
            let read = Settled::read(&settled.mark.to_string(), &settled.unsettled_text());
            assert_eq!(read, Ok(settled.clone()));
        }
        let settled = Settled::now([s(4, 12)], next);
        for (serial, taken) in [
            (s(4, 11), false),
            (s(4, 12), true),
            (s(4, 13), false),
            (s(1, 999), false),
            (s(4, 20), true),
            (s(5, 0), true),
        ] {
            assert_eq!(settled.may_be_in_flight(serial), taken, "{serial}");
        }
        assert_eq!(
            Settled::read("1.2", ""),
            Ok(Settled {
                mark: s(1, 2),
                unsettled: BTreeSet::new()
            })
        );
        assert!(Settled::read("1.2", "1.0,x").is_err());
        assert!(Settled::read("", "").is_err());
    }

    #[test]
    fn only_our_volumes_kept_at_their_pvs_deletion_need_what_is_settled_written() {
        let pv = |driver: &str, policy: Option<&str>| -> PersistentVolume {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "pvc-1"},
                "spec": {
                    "csi": {"driver": driver, "volumeHandle": "v"},
                    "persistentVolumeReclaimPolicy": policy,
                },
            }))
            .unwrap()
        };
        for (driver, policy, want) in [
            ("ours", Some("Retain"), true),
            ("ours", Some("Recycle"), true),
            ("ours", Some("Delete"), false),
            ("ours", None, false),
            ("theirs", Some("Retain"), false),
        ] {
            assert_eq!(
                outlives_its_pv(&pv(driver, policy), "ours", None),
                want,
                "{driver} {policy:?}"
            );
        }
        assert!(!outlives_its_pv(&PersistentVolume::default(), "ours", None));
        // An in-tree volume of the plugin the driver stands in for (CSI migration) is ours.
        let ebs: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-2"},
            "spec": {"awsElasticBlockStore": {"volumeID": "vol-1"},
                     "persistentVolumeReclaimPolicy": "Retain"},
        }))
        .unwrap();
        use sidecar_kit::migration::Plugin;
        assert!(outlives_its_pv(
            &ebs,
            "ebs.csi.aws.com",
            Some(Plugin::AwsEbs)
        ));
        assert!(!outlives_its_pv(&ebs, "ebs.csi.aws.com", None));
        assert!(!outlives_its_pv(
            &ebs,
            "ebs.csi.aws.com",
            Some(Plugin::GcePd)
        ));
    }
}
