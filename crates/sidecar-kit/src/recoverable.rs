//! The recoverable-volumes convention between a provisioner and a CSI driver that lets the
//! provisioner find, after a crash, every volume it may have made without writing anything
//! before CreateVolume (the intent log costs one API write per volume otherwise).
//!
//! A driver follows the convention when its GetPluginInfo `manifest` has [`MANIFEST_KEY`] set
//! to [`VERSION`] and it advertises LIST_VOLUMES. It then:
//! - accepts CreateVolume parameters whose key starts with [`PREFIX`] (the provisioner's
//!   marks), keeps them with the volume, and ignores them when it compares a repeated
//!   CreateVolume with the volume it already made (the first call's marks stay);
//! - returns them in the volume's `volume_context` from CreateVolume and ListVolumes, with
//!   [`NAME`] set to the CreateVolume name;
//! - lists a volume from the moment a CreateVolume may have made it.
//!
//! The provisioner marks each volume with its cluster's identity ([`CLUSTER`]), its serial
//! ([`SERIAL`]: volumes whose serial is below the provisioner's durable *settled* mark have
//! had a PV, so one whose PV is gone was retained on purpose), the claim ([`CLAIM`],
//! [`CLAIM_UID`]) and the reference of the secret DeleteVolume needs ([`SECRET`]; a
//! reference, never a secret's data), and removes every mark from the context before it
//! writes the PV.

use std::collections::HashMap;

/// The manifest key a driver sets to [`VERSION`] to say it follows the convention.
pub const MANIFEST_KEY: &str = "volstack.dev/recoverable-volumes";
/// The convention's version.
pub const VERSION: &str = "v1";
/// Every mark's key starts with this.
pub const PREFIX: &str = "volstack.dev/";
/// Set by the driver in the volume's context: the CreateVolume name.
pub const NAME: &str = "volstack.dev/name";
/// The identity of the cluster whose provisioner made the volume.
pub const CLUSTER: &str = "volstack.dev/cluster";
/// `<epoch>.<sequence>`: when, in the provisioner's numbering, the volume was asked for.
pub const SERIAL: &str = "volstack.dev/serial";
/// `namespace/name` of the claim (a bare name for a volume set's volume).
pub const CLAIM: &str = "volstack.dev/claim";
/// The claim's UID (a volume set's token for a set's volume).
pub const CLAIM_UID: &str = "volstack.dev/claim-uid";
/// `namespace/name` of the secret CreateVolume and DeleteVolume use, when there is one.
pub const SECRET: &str = "volstack.dev/secret";

/// Whether a parameter or context key is a mark.
pub fn is_mark(key: &str) -> bool {
    key.starts_with(PREFIX)
}

/// Whether a GetPluginInfo manifest says the driver follows the convention.
pub fn follows(manifest: &HashMap<String, String>) -> bool {
    manifest.get(MANIFEST_KEY).map(String::as_str) == Some(VERSION)
}

/// Removes the marks from a volume's context (what is left goes to the PV).
pub fn strip(context: &mut HashMap<String, String>) {
    context.retain(|key, _| !is_mark(key));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_the_prefixed_keys_and_only_they_are_stripped() {
        let mut context: HashMap<String, String> = [
            (NAME, "pvc-1"),
            (CLUSTER, "c"),
            ("kind", "fast"),
            ("volstack.devx/other", "kept"),
            ("csi.storage.k8s.io/pv/name", "pvc-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        strip(&mut context);
        let mut left: Vec<&str> = context.keys().map(String::as_str).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            ["csi.storage.k8s.io/pv/name", "kind", "volstack.devx/other"]
        );
    }

    #[test]
    fn a_driver_follows_only_with_the_known_version() {
        let manifest = |v: &str| -> HashMap<String, String> {
            [(MANIFEST_KEY.to_string(), v.to_string())].into()
        };
        assert!(follows(&manifest(VERSION)));
        assert!(!follows(&manifest("v2")));
        assert!(!follows(&manifest("")));
        assert!(!follows(&HashMap::new()));
    }
}
