//! JSON patches (RFC 6902) that add or remove one finalizer without clobbering finalizers other
//! controllers add meanwhile: adding appends to an existing list after testing it is the list
//! that was seen, creating the list is guarded by the resourceVersion it was seen at, and
//! removing tests the entry at its index first. A
//! patch that no longer fits (the list changed) fails with a conflict and is retried from the
//! new object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use crate::patch_ops::{self, Op};

/// Whether `meta` lists `finalizer`.
pub fn has(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|list| list.iter().any(|f| f == finalizer))
}

/// Adds `finalizer` to an object read live (for [`crate::update::update_live`]); false when it
/// is there already.
pub fn add(meta: &mut ObjectMeta, finalizer: &str) -> bool {
    if has(meta, finalizer) {
        return false;
    }
    meta.finalizers
        .get_or_insert_default()
        .push(finalizer.to_string());
    true
}

/// Removes every `finalizer` entry from an object read live; false when there is none.
pub fn remove(meta: &mut ObjectMeta, finalizer: &str) -> bool {
    let Some(list) = meta.finalizers.as_mut() else {
        return false;
    };
    let before = list.len();
    list.retain(|f| f != finalizer);
    list.len() != before
}

/// The operations adding `finalizer`, or None when it is there already. Appending tests the
/// list as it was seen first: a writer that added the same finalizer meanwhile makes the patch
/// fail instead of listing it twice.
pub fn add_ops(meta: &ObjectMeta, finalizer: &str) -> Option<Vec<Op>> {
    match &meta.finalizers {
        Some(list) if list.iter().any(|f| f == finalizer) => None,
        Some(list) if !list.is_empty() => Some(vec![
            patch_ops::test(&["metadata", "finalizers"], list.clone()),
            patch_ops::add(&["metadata", "finalizers", "-"], finalizer),
        ]),
        // Creating the list replaces whatever list the object has now: only at the version
        // the empty list was seen at.
        _ => Some(vec![
            patch_ops::test_version(meta),
            patch_ops::add(&["metadata", "finalizers"], vec![finalizer.to_string()]),
        ]),
    }
}

/// The operations removing `finalizer`, or None when it is not there.
pub fn remove_ops(meta: &ObjectMeta, finalizer: &str) -> Option<Vec<Op>> {
    let index = meta
        .finalizers
        .as_ref()?
        .iter()
        .position(|f| f == finalizer)?
        .to_string();
    Some(vec![
        patch_ops::test(&["metadata", "finalizers", &index], finalizer),
        patch_ops::remove(&["metadata", "finalizers", &index]),
    ])
}

/// The operation setting one annotation (the map is created when the object has none).
pub fn annotation_op(meta: &ObjectMeta, key: &str, value: &str) -> Op {
    if meta.annotations.is_none() {
        return patch_ops::add(&["metadata", "annotations"], json!({key: value}));
    }
    patch_ops::add(&["metadata", "annotations", key], value)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::patch_ops::patch;
    use serde_json::Value;

    fn meta(finalizers: Option<&[&str]>) -> ObjectMeta {
        ObjectMeta {
            resource_version: Some("7".into()),
            finalizers: finalizers.map(|f| f.iter().map(|s| s.to_string()).collect()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn live_edits_add_once_and_remove_every_entry() {
        const F: &str = "f";
        // (finalizers before, after add and whether it changed, after remove and whether it changed)
        type Case<'a> = (
            Option<&'a [&'a str]>,
            (&'a [&'a str], bool),
            (&'a [&'a str], bool),
        );
        let cases: Vec<Case> = vec![
            (None, (&[F], true), (&[], false)),
            (Some(&[]), (&[F], true), (&[], false)),
            (Some(&["o"]), (&["o", F], true), (&["o"], false)),
            (Some(&["o", F]), (&["o", F], false), (&["o"], true)),
            (Some(&[F, "o", F]), (&[F, "o", F], false), (&["o"], true)),
        ];
        let list = |m: &ObjectMeta| m.finalizers.clone().unwrap_or_default();
        for (before, (added, add_changed), (removed, remove_changed)) in cases {
            let mut m = meta(before);
            assert_eq!(add(&mut m, F), add_changed, "{before:?}");
            assert_eq!(list(&m), added, "{before:?}");
            let mut m = meta(before);
            assert_eq!(remove(&mut m, F), remove_changed, "{before:?}");
            assert_eq!(list(&m), removed, "{before:?}");
        }
    }

    /// Two writers that saw the same list both add the finalizer: the second patch fails
    /// (its test no longer holds) instead of listing the finalizer twice.
    #[tokio::test]
    async fn two_writers_adding_the_same_finalizer_list_it_once() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, Patch, PatchParams, PostParams};
        let server = apiserver::serve(apiserver::Config::default(), std::future::pending())
            .await
            .unwrap();
        let client = kube::Client::new(server.local_service("finalizers-test").unwrap(), "default");
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let made: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "m", "finalizers": ["other"]}}))
                .unwrap();
        let seen = api.create(&PostParams::default(), &made).await.unwrap();
        let ops = add_ops(&seen.metadata, "example.com/f").unwrap();
        let first = api
            .patch(
                "m",
                &PatchParams::default(),
                &Patch::<()>::Json(patch(ops.clone())),
            )
            .await;
        assert!(first.is_ok(), "{first:?}");
        let second = api
            .patch("m", &PatchParams::default(), &Patch::<()>::Json(patch(ops)))
            .await;
        assert!(second.is_err(), "the second add is refused: {second:?}");
        let list = api.get("m").await.unwrap().metadata.finalizers.unwrap();
        assert_eq!(list, ["other", "example.com/f"]);
    }

    #[test]
    fn adding_appends_or_creates_the_list_at_the_version_seen_and_removing_tests_the_index() {
        const F: &str = "external-attacher/x";
        // (finalizers, the patch adding F, the patch removing it)
        type Case<'a> = (Option<&'a [&'a str]>, Option<Value>, Option<Value>);
        let cases: Vec<Case> = vec![
            (
                None,
                Some(json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                    {"op": "add", "path": "/metadata/finalizers", "value": [F]},
                ])),
                None,
            ),
            (
                Some(&[]),
                Some(json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                    {"op": "add", "path": "/metadata/finalizers", "value": [F]},
                ])),
                None,
            ),
            (
                Some(&["other"]),
                Some(json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": ["other"]},
                    {"op": "add", "path": "/metadata/finalizers/-", "value": F},
                ])),
                None,
            ),
            (
                Some(&["other", F]),
                None,
                Some(json!([
                    {"op": "test", "path": "/metadata/finalizers/1", "value": F},
                    {"op": "remove", "path": "/metadata/finalizers/1"},
                ])),
            ),
        ];
        for (list, add, remove) in cases {
            let m = meta(list);
            let json = |ops: Vec<Op>| serde_json::to_value(ops).unwrap();
            assert_eq!(add_ops(&m, F).map(json), add, "{list:?}");
            assert_eq!(remove_ops(&m, F).map(json), remove, "{list:?}");
            assert_eq!(has(&m, F), list.is_some_and(|l| l.contains(&F)));
        }
    }

    #[test]
    fn an_annotation_is_added_to_the_map_or_creates_it() {
        let mut m = meta(None);
        let json = |op: Op| serde_json::to_value(op).unwrap();
        assert_eq!(
            json(annotation_op(&m, "csi.alpha.kubernetes.io/node-id", "n1")),
            json!({"op": "add", "path": "/metadata/annotations", "value": {"csi.alpha.kubernetes.io/node-id": "n1"}})
        );
        m.annotations = Some(Default::default());
        assert_eq!(
            json(annotation_op(&m, "csi.alpha.kubernetes.io/node-id", "n1")),
            json!({"op": "add", "path": "/metadata/annotations/csi.alpha.kubernetes.io~1node-id", "value": "n1"})
        );
        assert_eq!(
            json(annotation_op(&m, "a~b", "v")),
            json!({"op": "add", "path": "/metadata/annotations/a~0b", "value": "v"})
        );
    }
}
