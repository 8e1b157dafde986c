//! The store's log records: `[u32 LE key length][key][object JSON, empty for a deletion]`,
//! and a snapshot's records.

use std::collections::HashSet;
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

/// The length a record gives its key (0 for a record cut short).
fn key_len(record: &[u8]) -> usize {
    record
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map_or(0, |b| u32::from_le_bytes(b) as usize)
}

/// The object's JSON in a record (empty for a deletion or a record cut short).
pub(crate) fn object_json(record: &[u8]) -> &[u8] {
    record.get(4 + key_len(record)..).unwrap_or_default()
}

/// A record's key (empty for a record cut short).
fn record_key(record: &[u8]) -> &[u8] {
    record.get(4..4 + key_len(record)).unwrap_or_default()
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
    published: Vec<Arc<[u8]>>,
    overlay: Vec<(String, Option<Arc<[u8]>>)>,
) -> durable_log::Snapshot {
    let rewritten: HashSet<&[u8]> = overlay.iter().map(|(key, _)| key.as_bytes()).collect();
    let mut entries: Vec<Arc<[u8]>> = published
        .into_iter()
        .filter(|record| !rewritten.contains(record_key(record)))
        .collect();
    entries.extend(overlay.iter().filter_map(|(_, record)| record.clone()));
    durable_log::Snapshot::new(
        entries.len(),
        entries.into_iter().map(|record| record.to_vec()),
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

    #[test]
    fn a_snapshot_is_the_published_records_with_the_pending_ones_applied() {
        let record = |name: &str, generation: u64| -> Arc<[u8]> {
            let object = json!({"metadata": {"name": name, "generation": generation}});
            encode(&format!("r\u{0}ns\u{0}{name}"), Some(&object))
                .unwrap()
                .into()
        };
        let published = vec![record("kept", 1), record("changed", 1), record("gone", 1)];
        let overlay = vec![
            (
                "r\u{0}ns\u{0}changed".to_string(),
                Some(record("changed", 2)),
            ),
            ("r\u{0}ns\u{0}gone".to_string(), None),
            ("r\u{0}ns\u{0}new".to_string(), Some(record("new", 1))),
        ];
        let (count, entries) = snapshot_entries(published, overlay).into_parts();
        let mut state: Vec<(String, Option<Value>)> =
            entries.map(|e| decode(&e).unwrap()).collect();
        state.sort_by(|a, b| a.0.cmp(&b.0));
        let generation_of = |name: &str| {
            let generation = if name == "changed" { 2 } else { 1 };
            json!({"metadata": {"name": name, "generation": generation}})
        };
        let expected: Vec<(String, Option<Value>)> = ["changed", "kept", "new"]
            .iter()
            .map(|n| (format!("r\u{0}ns\u{0}{n}"), Some(generation_of(n))))
            .collect();
        assert_eq!(state, expected);
        assert_eq!(count, 3);
    }
}
