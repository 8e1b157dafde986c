//! Custom resources are checked against their definition's schema, with kube-apiserver's
//! messages, through kubectl.

#![allow(clippy::unwrap_used)]

mod common;

use common::{kubectl, start};

const CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "pools.example.volstack.dev"},
  "spec": {
    "group": "example.volstack.dev",
    "names": {"kind": "Pool", "listKind": "PoolList", "plural": "pools", "singular": "pool"},
    "scope": "Cluster",
    "versions": [{
      "name": "v1", "served": true, "storage": true,
      "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.minimum", "statusReplicasPath": ".status.count"}},
      "schema": {"openAPIV3Schema": {
        "type": "object",
        "required": ["spec"],
        "properties": {
          "spec": {
            "type": "object",
            "required": ["minimum"],
            "properties": {
              "minimum": {"type": "integer", "minimum": 0},
              "mode": {"type": "string", "enum": ["Filesystem", "Block"]}
            }
          },
          "status": {"type": "object", "properties": {"count": {"type": "integer", "minimum": 0}}}
        }
      }}
    }]
  }
}"#;

/// Applies the Pool definition `crd` and waits until kubectl finds the type (once discovery
/// has it).
async fn define_pools(f: &common::Fixture, crd: &str) {
    let (ok, _, err) = kubectl(f, &["apply", "-f", "-"], Some(crd)).await;
    assert!(ok, "{err}");
    let mut served = false;
    for _ in 0..100 {
        if kubectl(f, &["get", "pools"], None).await.0 {
            served = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(served, "the Pool type is served");
}

fn pool(spec: &str) -> String {
    format!("apiVersion: example.volstack.dev/v1\nkind: Pool\nmetadata:\n  name: p\nspec:\n{spec}")
}

#[tokio::test]
async fn custom_resources_are_refused_when_their_schema_says_so() {
    let f = start().await;
    define_pools(&f, CRD).await;

    let (ok, _, err) = kubectl(
        &f,
        &["apply", "-f", "-"],
        Some(&pool("  minimum: -1\n  mode: Sideways\n")),
    )
    .await;
    assert!(!ok);
    // Two errors, two causes: kubectl lists them, as it lists kube-apiserver's.
    for line in [
        r#"The Pool "p" is invalid: "#,
        "* spec.minimum: Invalid value: -1: spec.minimum in body should be greater than or equal to 0",
        r#"* spec.mode: Unsupported value: "Sideways": supported values: "Filesystem", "Block""#,
    ] {
        assert!(err.contains(line), "{line}: {err}");
    }
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(&pool("  mode: Block\n"))).await;
    assert!(!ok && err.contains("spec.minimum: Required value"), "{err}");

    let (ok, _, err) = kubectl(
        &f,
        &["apply", "-f", "-"],
        Some(&pool("  minimum: 2\n  mode: Block\n")),
    )
    .await;
    assert!(ok, "{err}");
    // The status subresource is checked too.
    let (ok, _, err) = kubectl(
        &f,
        &[
            "patch",
            "pool",
            "p",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"count":-5}}"#,
        ],
        None,
    )
    .await;
    assert!(
        !ok && err.contains("status.count: Invalid value: -5"),
        "{err}"
    );
    // A server-side dry run of a scale answers and changes nothing; then a real one.
    let (ok, out, err) = kubectl(
        &f,
        &["scale", "pool", "p", "--replicas=7", "--dry-run=server"],
        None,
    )
    .await;
    assert!(ok && out.contains("(server dry run)"), "{out} {err}");
    let minimum = || async {
        let (ok, out, err) = kubectl(
            &f,
            &["get", "pool", "p", "-o", "jsonpath={.spec.minimum}"],
            None,
        )
        .await;
        assert!(ok, "{err}");
        out
    };
    assert_eq!(minimum().await, "2");
    let (ok, _, err) = kubectl(&f, &["scale", "pool", "p", "--replicas=3"], None).await;
    assert!(ok, "{err}");
    assert_eq!(minimum().await, "3");
}

/// A definition in a group of the Kubernetes project must name its API review, as
/// kube-apiserver requires: the snapshot definitions were refused there for lacking it.
#[tokio::test]
async fn a_definition_in_a_protected_group_needs_the_approval_annotation() {
    let f = start().await;
    let protected = CRD
        .replace("pools.example.volstack.dev", "pools.example.k8s.io")
        .replace("\"example.volstack.dev\"", "\"example.k8s.io\"");
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&protected)).await;
    assert!(!ok);
    assert!(
        err.contains(r#"metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation "api-approved.kubernetes.io", see https://github.com/kubernetes/enhancements/pull/1111"#),
        "{err}"
    );
    let approved = protected.replace(
        r#""metadata": {"name": "pools.example.k8s.io"}"#,
        r#""metadata": {"name": "pools.example.k8s.io", "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/1111"}}"#,
    );
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&approved)).await;
    assert!(ok, "{err}");
    // Its name must be its plural and group, with kube-apiserver's message.
    let misnamed = CRD.replace(
        r#""metadata": {"name": "pools.example.volstack.dev"}"#,
        r#""metadata": {"name": "tanks.example.volstack.dev"}"#,
    );
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(&misnamed)).await;
    assert!(!ok);
    assert!(
        err.contains(r#"The CustomResourceDefinition "tanks.example.volstack.dev" is invalid: metadata.name: Invalid value: "tanks.example.volstack.dev": must be spec.names.plural+"."+spec.group"#),
        "{err}"
    );
}

/// A definition whose schema lists `metadata` with a few properties (as generated schemas do)
/// still has every ObjectMeta field: kubectl's strict apply (which adds its last-applied
/// annotation), a second apply and a replace of the object read back all pass, and the labels
/// stay; a field ObjectMeta does not have is refused.
#[tokio::test]
async fn a_schema_that_lists_metadata_keeps_every_metadata_field() {
    let f = start().await;
    let listed = CRD.replace(
        r#""properties": {
          "spec": {"#,
        r#""properties": {
          "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}}},
          "spec": {"#,
    );
    assert_ne!(listed, CRD, "the schema lists metadata");
    define_pools(&f, &listed).await;
    let labelled = "apiVersion: example.volstack.dev/v1\nkind: Pool\nmetadata:\n  name: p\n  labels: {tier: gold}\n  finalizers: [example.dev/keep]\nspec:\n  minimum: 1\n";
    for _ in 0..2 {
        let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(labelled)).await;
        assert!(ok, "{err}");
    }
    let (ok, read_back, err) = kubectl(&f, &["get", "pool", "p", "-o", "json"], None).await;
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&f, &["replace", "-f", "-"], Some(&read_back)).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(
        &f,
        &[
            "get",
            "pool",
            "p",
            "-o",
            "jsonpath={.metadata.labels.tier} {.metadata.finalizers}",
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, r#"gold ["example.dev/keep"]"#);
    let bogus = labelled.replace("  name: p\n", "  name: p\n  bogus: 1\n");
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(&bogus)).await;
    assert!(
        !ok && err.contains(r#"unknown field "metadata.bogus""#),
        "{err}"
    );
    release(&f, "p").await;
}

/// Takes pool `name`'s finalizers off.
async fn release(f: &common::Fixture, name: &str) {
    let (ok, _, err) = kubectl(
        f,
        &[
            "patch",
            "pool",
            name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
}

/// Polls kubectl until `args` prints `want` (its standard output, trimmed), for up to 60 s.
async fn kubectl_until(f: &common::Fixture, args: &[&str], want: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, out, err) = kubectl(f, args, None).await;
        if out.trim() == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl {args:?} never printed {want:?}; last: {out}{err}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A deleted definition goes as kube-apiserver's does: marked (finalizer, `Terminating`), its
/// custom resources deleted (one held by a finalizer waits for it), no new one created
/// meanwhile, then gone; defined again, it does not bring the old objects back.
#[tokio::test]
async fn a_deleted_definition_deletes_its_custom_resources_first() {
    let f = start().await;
    define_pools(&f, CRD).await;
    for (name, finalizers) in [("held", "[example.volstack.dev/hold]"), ("free", "[]")] {
        let pool = format!(
            "apiVersion: example.volstack.dev/v1\nkind: Pool\nmetadata:\n  name: {name}\n  finalizers: {finalizers}\nspec:\n  minimum: 1\n"
        );
        let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(&pool)).await;
        assert!(ok, "{err}");
    }
    let crd = "crd/pools.example.volstack.dev";
    let (ok, _, err) = kubectl(&f, &["delete", crd, "--wait=false"], None).await;
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(
        &f,
        &[
            "get",
            crd,
            "-o",
            r#"jsonpath={.metadata.generation}|{.metadata.deletionGracePeriodSeconds}|{.metadata.finalizers} {.status.conditions[?(@.type=="Terminating")].reason} {.status.conditions[?(@.type=="Terminating")].message}"#,
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        // As kube-apiserver v1.36.2 marks it: the generation kept, no grace period.
        r#"1||["customresourcecleanup.apiextensions.k8s.io"] InstanceDeletionInProgress CustomResource deletion is in progress"#
    );
    // The free one goes, the held one waits for its finalizer.
    kubectl_until(
        &f,
        &["get", "pools", "-o", "name"],
        "pool.example.volstack.dev/held",
    )
    .await;
    // Deleted one after the other: the held one is marked soon after the free one goes.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, out, _) = kubectl(
            &f,
            &[
                "get",
                "pool",
                "held",
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ],
            None,
        )
        .await;
        if !out.trim().is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the held pool is never marked as being deleted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let late = "apiVersion: example.volstack.dev/v1\nkind: Pool\nmetadata:\n  name: late\nspec:\n  minimum: 1\n";
    let (ok, _, err) = kubectl(&f, &["create", "-f", "-"], Some(late)).await;
    assert!(!ok);
    assert!(
        err.contains(r#"pools.example.volstack.dev "late" is forbidden: create not allowed while custom resource definition is terminating"#),
        "{err}"
    );
    // Its finalizer off, the last pool goes, then the definition.
    release(&f, "held").await;
    kubectl_until(&f, &["get", crd, "-o", "name", "--ignore-not-found"], "").await;
    // Defined again, it starts empty.
    define_pools(&f, CRD).await;
    let (ok, out, err) = kubectl(&f, &["get", "pools", "-o", "name"], None).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "");
}

/// A definition none of whose versions is served: its objects cannot be reached (nor their
/// finalizers taken off), so deleting it removes them outright, and a definition of the same
/// name starts empty.
#[tokio::test]
async fn a_deleted_definition_serving_no_version_leaves_no_objects_behind() {
    let f = start().await;
    define_pools(&f, CRD).await;
    let held = "apiVersion: example.volstack.dev/v1\nkind: Pool\nmetadata:\n  name: held\n  finalizers: [example.volstack.dev/hold]\nspec:\n  minimum: 1\n";
    let (ok, _, err) = kubectl(&f, &["apply", "-f", "-"], Some(held)).await;
    assert!(ok, "{err}");
    let crd = "crd/pools.example.volstack.dev";
    let (ok, _, err) = kubectl(
        &f,
        &[
            "patch",
            crd,
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/versions/0/served","value":false}]"#,
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = kubectl(&f, &["delete", crd, "--wait=false"], None).await;
    assert!(ok, "{err}");
    kubectl_until(&f, &["get", crd, "-o", "name", "--ignore-not-found"], "").await;
    define_pools(&f, CRD).await;
    let (ok, out, err) = kubectl(&f, &["get", "pools", "-o", "name"], None).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "");
}
