//! Shortens the JSON of cached objects by replacing the keys and values every claim and volume
//! repeats with one byte each.
//!
//! Compact JSON as `serde_json` writes it never holds a byte below 0x20: there is no
//! whitespace between tokens and control characters inside strings are escaped (`\n`,
//! `\u0001`). Bytes 0x01 to 0x1F are therefore free to stand for the 31 entries of
//! [`DICTIONARY`]; everything else is copied as it is.

/// Why cached bytes could not be expanded (a bug of ours: they are our own encoding).
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// A byte below 0x20 that names no dictionary entry.
    #[error("byte {byte:#04x} at offset {offset} names no dictionary entry")]
    UnknownToken {
        /// The byte.
        byte: u8,
        /// Where.
        offset: usize,
    },
}

/// What bytes 0x01 to 0x1F stand for, in that order: what serde_json writes for the fields of
/// `k8s-openapi` claims and volumes that every one of them has, and the annotations and
/// finalizers Kubernetes and the provisioner put on them.
const DICTIONARY: [&str; 31] = [
    r#"{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"#,
    r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"#,
    r#""annotations":{"#,
    r#""pv.kubernetes.io/bind-completed":"yes""#,
    r#""pv.kubernetes.io/bound-by-controller":"yes""#,
    r#""pv.kubernetes.io/provisioned-by":""#,
    r#""volume.beta.kubernetes.io/storage-provisioner":""#,
    r#""volume.kubernetes.io/storage-provisioner":""#,
    r#""volume.kubernetes.io/selected-node":""#,
    r#""finalizers":["kubernetes.io/pvc-protection""#,
    r#""finalizers":["kubernetes.io/pv-protection""#,
    r#""external-provisioner.volume.kubernetes.io/finalizer""#,
    r#""name":""#,
    r#""namespace":""#,
    r#""resourceVersion":""#,
    r#""uid":""#,
    r#""spec":{"accessModes":["ReadWriteOnce"]"#,
    r#""resources":{"requests":{"storage":""#,
    r#""storageClassName":""#,
    r#""volumeMode":"Filesystem""#,
    r#""volumeName":""#,
    r#""status":{"phase":""#,
    r#""claimRef":{"apiVersion":"v1","kind":"PersistentVolumeClaim","#,
    r#""persistentVolumeReclaimPolicy":"Delete""#,
    r#""csi":{"driver":""#,
    r#""volumeHandle":""#,
    r#""fsType":""#,
    r#""deletionTimestamp":""#,
    r#""creationTimestamp":""#,
    r#""volume.kubernetes.io/provisioner-deletion-secret-"#,
    r#""spec":{"#,
];

/// The token of dictionary entry `index`.
fn token(index: usize) -> u8 {
    // The dictionary has 31 entries, so the token is at most 0x1F.
    u8::try_from(index + 1).unwrap_or(u8::MAX)
}

/// Replaces dictionary entries in `json` (longest first where several start at one place).
pub fn shorten(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() / 2);
    let mut at = 0;
    while let Some(&byte) = json.get(at) {
        let rest = &json[at..];
        let best = if byte == b'"' || byte == b'{' {
            DICTIONARY
                .iter()
                .enumerate()
                .filter(|(_, entry)| rest.starts_with(entry.as_bytes()))
                .max_by_key(|(_, entry)| entry.len())
        } else {
            None
        };
        match best {
            Some((index, entry)) => {
                out.push(token(index));
                at += entry.len();
            }
            None => {
                out.push(byte);
                at += 1;
            }
        }
    }
    out
}

/// The JSON [`shorten`] was given.
pub fn expand(short: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(short.len() * 3);
    for (offset, &byte) in short.iter().enumerate() {
        if byte >= 0x20 {
            out.push(byte);
            continue;
        }
        let entry = usize::from(byte)
            .checked_sub(1)
            .and_then(|index| DICTIONARY.get(index))
            .ok_or(CodecError::UnknownToken { byte, offset })?;
        out.extend_from_slice(entry.as_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_is_json_text_without_control_bytes_and_entries_are_distinct() {
        for (i, entry) in DICTIONARY.iter().enumerate() {
            assert!(entry.bytes().all(|b| b >= 0x20), "entry {i}");
            assert!(
                entry.starts_with('"') || entry.starts_with('{'),
                "entry {i}"
            );
            assert_eq!(
                DICTIONARY.iter().filter(|e| e == &entry).count(),
                1,
                "{entry}"
            );
        }
    }

    #[test]
    fn shortened_json_expands_to_the_same_bytes() {
        let cases = [
            r#"{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"annotations":{"pv.kubernetes.io/bind-completed":"yes","volume.kubernetes.io/storage-provisioner":"hostpath.csi.volstack.dev"},"finalizers":["kubernetes.io/pvc-protection"],"name":"data","namespace":"default","resourceVersion":"7","uid":"u"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}},"storageClassName":"fast","volumeMode":"Filesystem"},"status":{"phase":"Pending"}}"#,
            // Entries inside string values, escapes, a prefix of an entry, and an empty object.
            r#"{"name":"\"name\":\"","x":"\u0001\n","namespac":"","spec":{}}"#,
            r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"#,
            "",
            "\"",
        ];
        for case in cases {
            let short = shorten(case.as_bytes());
            assert!(short.len() <= case.len(), "{case}");
            assert_eq!(expand(&short).expect("expands"), case.as_bytes(), "{case}");
        }
        let claim = shorten(cases[0].as_bytes());
        assert!(claim.len() * 2 < cases[0].len(), "{} bytes", claim.len());
    }

    #[test]
    fn the_longest_entry_wins_where_several_start_at_one_place() {
        let json = r#""spec":{"accessModes":["ReadWriteOnce"],"spec":{"a":1}"#;
        let short = shorten(json.as_bytes());
        assert_eq!(short[0], token(16));
        assert_eq!(expand(&short).expect("expands"), json.as_bytes());
    }

    #[test]
    fn a_byte_naming_no_entry_is_an_error() {
        assert!(matches!(
            expand(b"ab\0"),
            Err(CodecError::UnknownToken { byte: 0, offset: 2 })
        ));
        assert!(expand(&[0x1f]).is_ok());
    }
}
