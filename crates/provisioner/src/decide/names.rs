//! Names the provisioner derives: the PV (and CreateVolume) name, and the identity attribute.

/// Why a naming flag is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// `--volume-name-prefix` is empty.
    #[error("--volume-name-prefix must not be empty")]
    EmptyPrefix,
    /// `--volume-name-uuid-length` is out of range.
    #[error("--volume-name-uuid-length must be -1 (whole UID) or between 1 and 32, got {0}")]
    UuidLength(i32),
}

/// How PV names are made: `<prefix>-<uid>` (uid with dashes, `uuid_length` -1) or
/// `<prefix>-<first N chars of the uid without dashes>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeNaming {
    prefix: String,
    uuid_length: i32,
}

impl VolumeNaming {
    /// Validates the two flags. Upstream crashes on a length above 32; we refuse it.
    pub fn new(prefix: &str, uuid_length: i32) -> Result<Self, NameError> {
        if prefix.is_empty() {
            return Err(NameError::EmptyPrefix);
        }
        if uuid_length != -1 && !(1..=32).contains(&uuid_length) {
            return Err(NameError::UuidLength(uuid_length));
        }
        Ok(VolumeNaming {
            prefix: prefix.to_string(),
            uuid_length,
        })
    }

    /// The PV name for a claim UID; it is also the CreateVolume name (the idempotency key).
    pub fn pv_name(&self, claim_uid: &str) -> String {
        if self.uuid_length < 0 {
            return format!("{}-{claim_uid}", self.prefix);
        }
        // By characters: a UID is ASCII from any real API server, and one that is not cannot
        // cut a character in two.
        let n = usize::try_from(self.uuid_length).unwrap_or(0);
        let compact: String = claim_uid.chars().filter(|c| *c != '-').take(n).collect();
        format!("{}-{compact}", self.prefix)
    }
}

/// The `storage.kubernetes.io/csiProvisionerIdentity` value: `<unix-ms>-<rand 0..9999>-<driver>`.
pub fn provisioner_identity(unix_ms: u128, random: u32, driver: &str) -> String {
    format!("{unix_ms}-{}-{driver}", random % 10_000)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const UID: &str = "3f2c1c9e-4a51-4d8e-9c1e-0d7f1b2a3c4d";

    #[test]
    fn pv_names_follow_the_uid_rule() {
        let table = [
            ("pvc", -1, "pvc-3f2c1c9e-4a51-4d8e-9c1e-0d7f1b2a3c4d"),
            ("pvc", 8, "pvc-3f2c1c9e"),
            ("vol", 12, "vol-3f2c1c9e4a51"),
            ("pvc", 32, "pvc-3f2c1c9e4a514d8e9c1e0d7f1b2a3c4d"),
        ];
        for (prefix, len, want) in table {
            assert_eq!(VolumeNaming::new(prefix, len).unwrap().pv_name(UID), want);
        }
        // A UID shorter than the length, or not ASCII (no real API server makes one), is cut
        // by characters.
        let naming = VolumeNaming::new("pvc", 4).unwrap();
        assert_eq!(naming.pv_name("ab"), "pvc-ab");
        assert_eq!(naming.pv_name("aé-bcd"), "pvc-aébc");
    }

    #[test]
    fn invalid_naming_flags_are_refused() {
        assert_eq!(VolumeNaming::new("", -1), Err(NameError::EmptyPrefix));
        assert_eq!(VolumeNaming::new("pvc", 40), Err(NameError::UuidLength(40)));
        assert_eq!(VolumeNaming::new("pvc", 0), Err(NameError::UuidLength(0)));
        assert_eq!(VolumeNaming::new("pvc", -2), Err(NameError::UuidLength(-2)));
    }

    #[test]
    fn identity_has_time_random_and_driver() {
        assert_eq!(
            provisioner_identity(1_700_000_000_000, 123_456, "d.csi"),
            "1700000000000-3456-d.csi"
        );
    }
}
