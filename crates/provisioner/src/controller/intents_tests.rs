//! The intent log's shard names, merges of concurrent writers' records, and annotations that
//! do not parse.
#![allow(clippy::unwrap_used)]

use super::*;
use csi_proto::v1 as csi;

fn rec(name: &str) -> Record {
    Record::new(
        "ns",
        name,
        "uid",
        &csi::CreateVolumeRequest::default(),
        None,
        false,
    )
}

#[test]
fn shard_names_are_the_base_and_numbered_suffixes() {
    let cases = [
        ("p-intents", Some(0)),
        ("p-intents-1", Some(1)),
        ("p-intents-12", Some(12)),
        ("p-intents-4095", Some(4095)),
        // Past MAX_SHARDS: not one of the log's, however it is named.
        ("p-intents-4096", None),
        ("p-intents-99999999999", None),
        ("p-intents-99999999999999999999999", None),
        ("p-intents-0", None),
        ("p-intents-", None),
        ("p-intents-x", None),
        ("p-intentsx", None),
        ("other", None),
    ];
    for (name, want) in cases {
        assert_eq!(shard_number("p-intents", name), want, "{name}");
    }
    assert_eq!(shard_name("p-intents", 0), "p-intents");
    assert_eq!(shard_name("p-intents", 3), "p-intents-3");
}

#[test]
fn a_merge_keeps_records_this_writer_did_not_remove() {
    let stored = BTreeMap::from([
        ("theirs".to_string(), rec("t")),
        ("removed-here".to_string(), rec("r")),
        ("both".to_string(), rec("old")),
    ]);
    let mine = BTreeMap::from([
        ("mine".to_string(), rec("m")),
        ("both".to_string(), rec("new")),
    ]);
    let removed = BTreeSet::from(["removed-here".to_string()]);
    let merged = merge(stored, &mine, &removed);
    let keys: Vec<&str> = merged.keys().map(String::as_str).collect();
    assert_eq!(keys, vec!["both", "mine", "theirs"]);
    assert_eq!(merged["both"].name, "new", "this writer's own record wins");
}

#[test]
fn an_annotation_that_does_not_parse_is_an_error_not_an_empty_log() {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("p-intents".into()),
            annotations: Some(BTreeMap::from([(
                ANNOTATION.to_string(),
                "{not json".into(),
            )])),
            ..Default::default()
        },
        spec: None,
    };
    assert!(matches!(
        stored_records(&lease),
        Err(IntentError::Corrupt { .. })
    ));
}
