#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use super::*;

fn record(id: &str, name: &str, bytes: i64) -> VolumeRecord {
    VolumeRecord {
        id: id.into(),
        name: name.into(),
        capacity_bytes: bytes,
        kind: String::new(),
        node: Some("n1".into()),
        block: false,
        parameters: BTreeMap::new(),
        created_ms: 1,
        published: BTreeMap::new(),
        targets: BTreeMap::new(),
        ..VolumeRecord::default()
    }
}

fn open(dir: &Path, compact_min_bytes: u64) -> Store {
    Store::open(
        dir,
        Options {
            compact_min_bytes,
            ..Options::default()
        },
    )
    .unwrap()
}

async fn put(store: &Store, r: VolumeRecord) {
    let ((), seq) = store
        .mutate(|_| Ok::<_, StoreError>(((), vec![Change::Put(r)])))
        .unwrap();
    store.wait_durable(seq).await.unwrap();
}

async fn delete(store: &Store, id: &str) {
    let ((), seq) = store
        .mutate(|_| Ok::<_, StoreError>(((), vec![Change::Delete(id.into())])))
        .unwrap();
    store.wait_durable(seq).await.unwrap();
}

fn ids(store: &Store) -> Vec<String> {
    store.read(|t| t.iter().map(|r| r.id.clone()).collect()).0
}

#[tokio::test]
async fn acknowledged_changes_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    put(&store, record("a", "va", 10)).await;
    put(&store, record("b", "vb", 20)).await;
    delete(&store, "a").await;
    drop(store);
    let store = open(dir.path(), 1 << 20);
    assert_eq!(ids(&store), vec!["b"]);
    assert_eq!(store.read(|t| t.used("", Some("n1"))).0, 20);
    assert_eq!(
        store
            .read(|t| t.by_name("vb").map(|r| r.id.clone()))
            .0
            .as_deref(),
        Some("b")
    );
}

#[tokio::test]
async fn a_reserved_volume_is_not_logged_until_confirmed_and_can_be_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    store
        .reserve(|_| Ok::<_, StoreError>(((), Some(record("r", "vr", 5)))))
        .unwrap();
    store
        .reserve(|_| Ok::<_, StoreError>(((), Some(record("c", "vc", 5)))))
        .unwrap();
    // Reserved volumes hold their name and capacity in memory...
    assert_eq!(store.read(|t| t.used("", Some("n1"))).0, 10);
    assert!(store.read(|t| t.by_name("vr").is_some()).0);
    // ...but readers (ListVolumes, ControllerGetVolume) do not see them before they are
    // logged: a crash now would make them vanish.
    assert_eq!(
        store
            .read(|t| (t.len(), t.iter().count(), t.get("r").is_none()))
            .0,
        (0, 0, true)
    );
    store.cancel("c");
    let seq = store.confirm("r").unwrap();
    store.wait_durable(seq).await.unwrap();
    assert_eq!(store.read(|t| (t.len(), t.get("r").is_some())).0, (1, true));
    store
        .reserve(|_| Ok::<_, StoreError>(((), Some(record("x", "vx", 5)))))
        .unwrap();
    drop(store);
    // ...but only a confirmed one is on disk.
    let store = open(dir.path(), 1 << 20);
    assert_eq!(ids(&store), vec!["r"]);
}

#[tokio::test]
async fn a_listing_waits_for_the_creations_under_way_when_it_came() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path(), 1 << 20));
    for (id, name) in [("r", "vr"), ("c", "vc")] {
        store
            .reserve(|_| Ok::<_, StoreError>(((), Some(record(id, name, 5)))))
            .unwrap();
    }
    let (creating, _) = store.read(Table::reserved_ids);
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store.wait_settled(&creating).await;
            ids(&store)
        })
    };
    // One thread: the waiter runs exactly when this task yields, so what it waits for is
    // seen without any timing.
    let let_it_run = || async {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    };
    let_it_run().await;
    assert!(!waiter.is_finished(), "two creations under way");
    store.confirm("r").unwrap();
    let_it_run().await;
    assert!(!waiter.is_finished(), "one creation under way");
    // A creation that starts after the listing came is not waited for.
    store
        .reserve(|_| Ok::<_, StoreError>(((), Some(record("later", "vl", 5)))))
        .unwrap();
    store.cancel("c");
    assert_eq!(
        waiter.await.unwrap(),
        vec!["r"],
        "made is listed, cancelled is not"
    );
    store.wait_settled(&[]).await;
}

#[tokio::test]
async fn orphan_volume_directories_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    put(&store, record("kept", "v", 1)).await;
    std::fs::create_dir_all(store.volume_dir("kept")).unwrap();
    std::fs::create_dir_all(store.volume_dir("orphan")).unwrap();
    drop(store);
    let store = open(dir.path(), 1 << 20);
    assert!(store.volume_dir("kept").exists());
    assert!(!store.volume_dir("orphan").exists());
}

#[tokio::test]
async fn compaction_keeps_the_table_and_leaves_reservations_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 512);
    store
        .reserve(|_| Ok::<_, StoreError>(((), Some(record("reserved", "vr", 1)))))
        .unwrap();
    for i in 0..40 {
        put(&store, record(&format!("v{i:02}"), &format!("n{i:02}"), 1)).await;
    }
    for i in 0..10 {
        delete(&store, &format!("v{i:02}")).await;
    }
    drop(store);
    assert!(
        durable_log::files::list(dir.path())
            .unwrap()
            .snapshots
            .last()
            .copied()
            .unwrap_or(0)
            > 0,
        "compaction ran"
    );
    let store = open(dir.path(), 512);
    assert_eq!(store.read(|t| t.len()).0, 30);
    assert_eq!(store.read(|t| t.used("", Some("n1"))).0, 30);
    assert!(store.read(|t| t.get("reserved").is_none()).0);
}

#[tokio::test]
async fn concurrent_writers_are_all_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path(), 1 << 20));
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            put(&store, record(&format!("v{i:03}"), &format!("n{i:03}"), 1)).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(store);
    let store = open(dir.path(), 1 << 20);
    assert_eq!(store.read(|t| t.len()).0, 200);
}

#[test]
fn the_state_directory_and_its_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("state");
    let store = open(&dir, 1 << 20);
    drop(store);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("volumes")), 0o700);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
}

#[tokio::test]
async fn huge_volumes_do_not_overflow_the_pools_total() {
    // Two 7 EiB volumes (an ephemeral volume's size comes from a Pod's attributes): the total
    // passes i64::MAX, reads as i64::MAX, and comes back exactly when one goes.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    let seven_eib = 7 << 60;
    put(&store, record("a", "va", seven_eib)).await;
    put(&store, record("b", "vb", seven_eib)).await;
    assert_eq!(store.read(|t| t.used("", Some("n1"))).0, i64::MAX);
    delete(&store, "a").await;
    assert_eq!(store.read(|t| t.used("", Some("n1"))).0, seven_eib);
}
