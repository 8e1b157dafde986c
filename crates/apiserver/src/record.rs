//! The store's log records: `[u32 LE key length][key][object JSON, empty for a deletion]`,
//! and a snapshot's records.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::store::StoreError;

/// A record: `[u32 LE key length][key][object JSON, empty for a deletion]`.
pub(crate) fn encode(key: &str, object: Option<&Value>) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(key.len() + 256);
    let len = u32::try_from(key.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    if let Some(object) = object {
        serde_json::to_writer(&mut out, object)?;
    }
    Ok(out)
}

/// The object's JSON in a record (empty for a deletion or a record cut short).
pub(crate) fn object_json(record: &[u8]) -> &[u8] {
    let len = record
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, |b| u32::from_le_bytes(b) as usize);
    record.get(4 + len..).unwrap_or_default()
}

/// A record's key and object (`None` for a deletion).
pub(crate) fn decode(record: &[u8]) -> Result<(String, Option<Value>), StoreError> {
    let bad = StoreError::Malformed;
    let len_bytes: [u8; 4] = record
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(bad("a record shorter than its key length"))?;
    let len = u32::from_le_bytes(len_bytes) as usize;
    let key = record
        .get(4..4 + len)
        .ok_or(bad("a record shorter than its key"))?;
    let key = String::from_utf8_lossy(key).into_owned();
    let body = &record[4 + len..];
    if body.is_empty() {
        return Ok((key, None));
    }
    let object = serde_json::from_slice(body).map_err(|source| StoreError::Replay {
        key: key.clone(),
        source,
    })?;
    Ok((key, Some(object)))
}

/// The records of a snapshot: the published objects with the overlay's writes applied.
pub(crate) fn snapshot_entries(
    mut objects: BTreeMap<String, Arc<Value>>,
    overlay: Vec<(String, Option<Arc<Value>>)>,
) -> durable_log::Snapshot {
    for (key, object) in overlay {
        match object {
            Some(object) => objects.insert(key, object),
            None => objects.remove(&key),
        };
    }
    // Encoded one by one as the snapshot is written (one that fails to encode leaves the
    // snapshot short of its count, and the compaction fails without harm).
    durable_log::Snapshot::new(
        objects.len(),
        objects
            .into_iter()
            .filter_map(|(key, object)| encode(&key, Some(&object)).ok()),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_round_trip_and_bad_ones_are_errors() {
        let object = json!({"metadata": {"name": "x"}});
        let record = encode("k\u{0}ns\u{0}x", Some(&object)).unwrap();
        assert_eq!(
            decode(&record).unwrap(),
            ("k\u{0}ns\u{0}x".into(), Some(object))
        );
        let deletion = encode("k", None).unwrap();
        assert_eq!(decode(&deletion).unwrap(), ("k".into(), None));
        assert!(decode(&[1, 0]).is_err());
        assert!(decode(&[9, 0, 0, 0, b'a']).is_err());
    }

    #[test]
    fn a_record_gives_its_object_json() {
        let object = json!({"metadata": {"name": "x"}});
        let record = encode("k\u{0}ns\u{0}x", Some(&object)).unwrap();
        assert_eq!(object_json(&record), serde_json::to_vec(&object).unwrap());
        assert!(object_json(&encode("k", None).unwrap()).is_empty());
        assert!(object_json(&[9, 0, 0, 0, b'a']).is_empty());
    }
}
