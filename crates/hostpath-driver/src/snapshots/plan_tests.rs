#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};

use tonic::Code;

use super::*;
use crate::state::{ContentSource, VolumeRecord};

fn volume(id: &str, bytes: i64, block: bool) -> VolumeRecord {
    VolumeRecord {
        id: id.into(),
        name: format!("name-{id}"),
        capacity_bytes: bytes,
        kind: "fast".into(),
        node: Some("n1".into()),
        block,
        parameters: BTreeMap::new(),
        created_ms: 1,
        published: BTreeMap::new(),
        targets: BTreeMap::new(),
        ..VolumeRecord::default()
    }
}

fn snapshot(id: &str, name: &str, source: &str) -> SnapshotRecord {
    SnapshotRecord {
        id: id.into(),
        name: name.into(),
        source_volume_id: source.into(),
        size_bytes: 10,
        block: false,
        kind: String::new(),
        parameters: BTreeMap::new(),
        created_ms: 2_500,
        group_id: None,
    }
}

fn table() -> Table {
    let mut table = Table::from_records([volume("v1", 10, false), volume("v2", 20, true)]);
    table.apply(Change::PutSnapshot(snapshot(
        "00000000-0000-0000-0000-000000000001",
        "s1",
        "v1",
    )));
    table.apply(Change::PutSnapshot(snapshot(
        "00000000-0000-0000-0000-000000000002",
        "s2",
        "v2",
    )));
    table.apply(Change::PutSnapshot(snapshot(
        "00000000-0000-0000-0000-000000000003",
        "s3",
        "v1",
    )));
    table
}

fn create(name: &str, source: &str, params: &[(&str, &str)]) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        secrets: HashMap::new(),
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn create_snapshot_decisions() {
    let t = table();
    // (request, expected: Ok(existing?) or the error code)
    let cases: Vec<(csi::CreateSnapshotRequest, std::result::Result<bool, Code>)> = vec![
        (create("new", "v1", &[]), Ok(false)),
        (
            create(
                "new",
                "v2",
                &[("csi.storage.k8s.io/volumesnapshot/name", "snap")],
            ),
            Ok(false),
        ),
        (create("s1", "v1", &[]), Ok(true)),
        (create("s1", "v2", &[]), Err(Code::AlreadyExists)),
        (create("new", "missing", &[]), Err(Code::NotFound)),
        (create("", "v1", &[]), Err(Code::InvalidArgument)),
        (create("new", "", &[]), Err(Code::InvalidArgument)),
        (
            create("new", "v1", &[("compression", "on")]),
            Err(Code::InvalidArgument),
        ),
    ];
    for (req, expected) in cases {
        let got = plan_snapshot(&t, &req, "id-new", 7_000);
        match (got, expected) {
            (Ok(Plan::Existing(r)), Ok(true)) => assert_eq!(r.name, req.name),
            (Ok(Plan::New(r)), Ok(false)) => {
                let source = t.get(&req.source_volume_id).unwrap();
                assert_eq!(
                    (r.id.as_str(), r.size_bytes, r.block, r.created_ms),
                    ("id-new", source.capacity_bytes, source.block, 7_000)
                );
                assert_eq!(r.group_id, None);
            }
            (Err(error), Err(code)) => assert_eq!(error.code(), code, "{req:?}: {error}"),
            (got, expected) => panic!("{req:?}: got {got:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn delete_snapshot_decisions() {
    let mut t = table();
    let first = "00000000-0000-0000-0000-000000000001";
    assert_eq!(
        plan_delete_snapshot(&t, first).unwrap(),
        vec![Change::DeleteSnapshot(first.into())]
    );
    assert!(plan_delete_snapshot(&t, "unknown").unwrap().is_empty());
    assert_eq!(
        plan_delete_snapshot(&t, "").unwrap_err().code(),
        Code::InvalidArgument
    );
    let mut member = snapshot("00000000-0000-0000-0000-00000000000a", "m", "v1");
    member.group_id = Some("g".into());
    t.apply(Change::PutSnapshot(member.clone()));
    let refused = plan_delete_snapshot(&t, &member.id).unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.to_string().contains("group"), "{refused}");
}

fn list(t: &Table, max: i32, token: &str, id: &str, source: &str) -> Result<(Vec<String>, String)> {
    let req = csi::ListSnapshotsRequest {
        max_entries: max,
        starting_token: token.into(),
        source_volume_id: source.into(),
        snapshot_id: id.into(),
        secrets: HashMap::new(),
    };
    list_snapshots(t, &req).map(|(page, next)| (page.into_iter().map(|s| s.name).collect(), next))
}

#[test]
fn list_snapshots_pages_and_filters() {
    let t = table();
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        list(&t, 0, "", "", "").unwrap(),
        (names(&["s1", "s2", "s3"]), String::new())
    );
    let (page, next) = list(&t, 2, "", "", "").unwrap();
    assert_eq!(page, names(&["s1", "s2"]));
    assert_eq!(next, "00000000-0000-0000-0000-000000000002");
    assert_eq!(
        list(&t, 2, &next, "", "").unwrap(),
        (names(&["s3"]), String::new())
    );
    // Exactly one full page: no next token.
    assert_eq!(list(&t, 3, "", "", "").unwrap().1, "");
    assert_eq!(list(&t, 0, "", "", "v1").unwrap().0, names(&["s1", "s3"]));
    assert_eq!(
        list(&t, 1, "", "", "v1").unwrap(),
        (
            names(&["s1"]),
            "00000000-0000-0000-0000-000000000001".into()
        )
    );
    assert_eq!(
        list(&t, 0, "", "00000000-0000-0000-0000-000000000002", "")
            .unwrap()
            .0,
        names(&["s2"])
    );
    assert!(list(&t, 0, "", "unknown", "").unwrap().0.is_empty());
    assert!(list(&t, 0, "", "", "v9").unwrap().0.is_empty());
    assert_eq!(
        list(&t, 0, "not-a-token", "", "").unwrap_err().code(),
        Code::Aborted
    );
    assert_eq!(
        list(&t, -1, "", "", "").unwrap_err().code(),
        Code::InvalidArgument
    );
}

#[test]
fn snapshots_are_ready_with_their_creation_time() {
    let s = to_csi_snapshot(&snapshot("id", "n", "v1"));
    assert!(s.ready_to_use);
    assert_eq!(
        s.creation_time,
        Some(prost_types::Timestamp {
            seconds: 2,
            nanos: 500_000_000
        })
    );
    assert_eq!(s.group_snapshot_id, "");
}

fn group_request(name: &str, volumes: &[&str]) -> csi::CreateVolumeGroupSnapshotRequest {
    csi::CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: volumes.iter().map(|v| v.to_string()).collect(),
        secrets: HashMap::new(),
        parameters: HashMap::new(),
    }
}

#[test]
fn group_snapshots_are_made_found_again_checked_and_deleted_whole() {
    let mut t = table();
    let mut n = 0;
    let mut ids = || {
        n += 1;
        format!("id-{n}")
    };
    let Plan::New((group, members)) =
        plan_group(&t, &group_request("g", &["v2", "v1"]), &mut ids, 9).unwrap()
    else {
        panic!("a new group");
    };
    assert_eq!(group.id, "id-1");
    assert_eq!(group.source_volume_ids, vec!["v1", "v2"]);
    assert_eq!(members.len(), 2);
    assert!(
        members
            .iter()
            .all(|m| m.group_id.as_deref() == Some("id-1"))
    );
    t.apply(Change::PutSnapshot(members[0].clone()));
    t.apply(Change::PutSnapshot(members[1].clone()));
    t.apply(Change::PutGroup(group.clone()));
    // The same request again finds it; other volumes under that name conflict.
    assert!(matches!(
        plan_group(&t, &group_request("g", &["v1", "v2"]), &mut ids, 10).unwrap(),
        Plan::Existing(_)
    ));
    let errors = [
        (group_request("g", &["v1"]), Code::AlreadyExists),
        (group_request("h", &["v1", "missing"]), Code::NotFound),
        (group_request("h", &["v1", "v1"]), Code::InvalidArgument),
        (group_request("", &["v1"]), Code::InvalidArgument),
        (group_request("h", &[]), Code::InvalidArgument),
    ];
    for (req, code) in errors {
        let error = plan_group(&t, &req, &mut ids, 10).unwrap_err();
        assert_eq!(error.code(), code, "{req:?}: {error}");
    }
    // Get and delete check the members a caller names.
    let member_ids: Vec<String> = members.iter().map(|m| m.id.clone()).collect();
    let get = |ids: Vec<String>| csi::GetVolumeGroupSnapshotRequest {
        group_snapshot_id: "id-1".into(),
        snapshot_ids: ids,
        secrets: HashMap::new(),
    };
    assert_eq!(get_group(&t, &get(Vec::new())).unwrap().1.len(), 2);
    assert_eq!(get_group(&t, &get(member_ids.clone())).unwrap().0, group);
    assert_eq!(
        get_group(&t, &get(vec![member_ids[0].clone()]))
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let mut unknown = get(Vec::new());
    unknown.group_snapshot_id = "nope".into();
    assert_eq!(get_group(&t, &unknown).unwrap_err().code(), Code::NotFound);
    let delete = |ids: Vec<String>| csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: "id-1".into(),
        snapshot_ids: ids,
        secrets: HashMap::new(),
    };
    assert_eq!(
        plan_delete_group(&t, &delete(vec!["other".into()]))
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let changes = plan_delete_group(&t, &delete(member_ids.clone())).unwrap();
    assert_eq!(
        changes,
        vec![
            Change::DeleteSnapshot(member_ids[0].clone()),
            Change::DeleteSnapshot(member_ids[1].clone()),
            Change::DeleteGroup("id-1".into()),
        ]
    );
    for change in changes {
        t.apply(change);
    }
    assert!(
        plan_delete_group(&t, &delete(Vec::new()))
            .unwrap()
            .is_empty()
    );
    assert_eq!(t.snapshots_after("").count(), 3);
}

#[test]
fn sources_in_use_by_a_copy_in_progress_stay() {
    let mut t = table();
    let first = "00000000-0000-0000-0000-000000000001";
    // A restore from the first snapshot and a clone of v2 are being made (reserved).
    let mut restoring = volume("r", 10, false);
    restoring.source = Some(ContentSource::Snapshot(first.into()));
    t.reserve(restoring);
    let mut cloning = volume("c", 20, true);
    cloning.source = Some(ContentSource::Volume("v2".into()));
    t.reserve(cloning);
    assert_eq!(
        plan_delete_snapshot(&t, first).unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert_eq!(
        crate::plan::plan_delete(&t, "v2").unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert!(crate::plan::plan_delete(&t, "v1").is_ok());
    // Once logged (or cancelled), the sources may go.
    t.apply(Change::Delete("c".into()));
    assert!(crate::plan::plan_delete(&t, "v2").is_ok());
    // A snapshot whose source went during its copy is not logged.
    let of_v2 = snapshot("new", "n", "v2");
    assert!(sources_exist(&t, std::slice::from_ref(&of_v2)).is_ok());
    t.apply(Change::Delete("v2".into()));
    assert_eq!(
        sources_exist(&t, &[of_v2]).unwrap_err().code(),
        Code::NotFound
    );
}

#[test]
fn members_of_a_group_never_logged_are_dropped() {
    let mut t = table();
    let mut member = snapshot("00000000-0000-0000-0000-00000000000b", "m", "v1");
    member.group_id = Some("lost-group".into());
    t.apply(Change::PutSnapshot(member.clone()));
    assert_eq!(t.drop_incomplete_groups(), 1);
    assert!(t.snapshot(&member.id).is_none());
    assert_eq!(t.snapshots_after("").count(), 3, "the others stay");
}
