//! Field ownership (`metadata.managedFields`) across plain updates, as kube-apiserver keeps it:
//! a client that leaves the field out or sends an empty list (one that trims its cache) keeps
//! it; only a list of one empty entry clears it.

#![allow(clippy::unwrap_used)]

mod common;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::{Api, Patch, PatchParams, PostParams};

fn managers(map: &ConfigMap) -> Vec<String> {
    map.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test]
async fn an_update_without_field_ownership_keeps_it_and_one_empty_entry_clears_it() {
    let f = common::start().await;
    let client = kube::Client::new(
        f.server.local_service("ownership-test/1.0").unwrap(),
        "default",
    );
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let applied: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "owned"},
        "data": {"k": "v"},
    }))
    .unwrap();
    let made = maps
        .patch(
            "owned",
            &PatchParams::apply("alice"),
            &Patch::Apply(&applied),
        )
        .await
        .unwrap();
    assert_eq!(managers(&made), vec!["alice"]);

    // As a controller whose cache trimmed the field writes the object back: an empty list.
    let mut trimmed = made.clone();
    trimmed.metadata.managed_fields = Some(Vec::new());
    // Alice keeps `data.k`: the update only adds a key.
    trimmed.data = Some(
        [("k", "v"), ("k2", "w")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
    );
    let kept = maps
        .replace("owned", &PostParams::default(), &trimmed)
        .await
        .unwrap();
    assert!(
        managers(&kept).contains(&"alice".to_string()),
        "an empty list cleared the field ownership: {:?}",
        kept.metadata.managed_fields
    );

    // Left out altogether.
    let mut without = kept.clone();
    without.metadata.managed_fields = None;
    without.data = Some(
        [("k", "v"), ("k3", "x")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
    );
    let kept = maps
        .replace("owned", &PostParams::default(), &without)
        .await
        .unwrap();
    assert!(managers(&kept).contains(&"alice".to_string()));

    // One empty entry: cleared.
    let mut reset = kept.clone();
    reset.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
    let cleared = maps
        .replace("owned", &PostParams::default(), &reset)
        .await
        .unwrap();
    assert_eq!(managers(&cleared), Vec::<String>::new());
    assert_eq!(
        maps.get("owned").await.unwrap().metadata.managed_fields,
        None
    );
}
