//! Field ownership (`metadata.managedFields`) across plain updates, as kube-apiserver's field
//! manager treats it (`isResetManagedFields`): a write that leaves the field out keeps it; a
//! present empty list or a list of one empty entry clears it.

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

fn data(pairs: &[(&str, &str)]) -> Option<std::collections::BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[tokio::test]
async fn an_update_that_leaves_field_ownership_out_keeps_it_and_an_empty_list_clears_it() {
    let f = common::start().await;
    let client = kube::Client::new(
        f.server.local_service("ownership-test/1.0").unwrap(),
        "default",
    );
    let maps: Api<ConfigMap> = Api::namespaced(client, "default");
    let apply = |name: &str| {
        serde_json::from_value::<ConfigMap>(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name},
            "data": {"k": "v"},
        }))
        .unwrap()
    };
    for name in ["left-out", "empty", "one-empty-entry"] {
        maps.patch(
            name,
            &PatchParams::apply("alice"),
            &Patch::Apply(&apply(name)),
        )
        .await
        .unwrap();
    }
    let cases: [(&str, Option<Vec<ManagedFieldsEntry>>, bool); 3] = [
        ("left-out", None, true),
        ("empty", Some(Vec::new()), false),
        (
            "one-empty-entry",
            Some(vec![ManagedFieldsEntry::default()]),
            false,
        ),
    ];
    for (name, sent, kept) in cases {
        let mut map = maps.get(name).await.unwrap();
        assert_eq!(managers(&map), vec!["alice"]);
        map.metadata.managed_fields = sent;
        // Alice keeps `data.k`: the update only adds a key.
        map.data = data(&[("k", "v"), ("k2", "w")]);
        let written = maps
            .replace(name, &PostParams::default(), &map)
            .await
            .unwrap();
        assert_eq!(
            managers(&written).contains(&"alice".to_string()),
            kept,
            "{name}: {:?}",
            written.metadata.managed_fields
        );
    }
}
