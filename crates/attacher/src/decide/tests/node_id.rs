//! The node id: where it is read from, and when the Node is read at all.

use super::*;

fn node_with_ids(ids: Option<&str>) -> k8s_openapi::api::core::v1::Node {
    k8s_openapi::api::core::v1::Node {
        metadata: ObjectMeta {
            name: Some("node-1".into()),
            annotations: ids.map(|ids| {
                BTreeMap::from([(sidecar_kit::vocabulary::ANN_NODE_IDS.into(), ids.into())])
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn the_node_id_is_the_csinodes_then_the_nodes_and_a_detach_prefers_the_id_it_attached_with() {
    let with_ids = |ids: &str| Some(node_with_ids(Some(ids)));
    let mut annotated = va(&[], false);
    annotated.metadata.annotations = Some(BTreeMap::from([(ANN_NODE_ID.into(), "from-va".into())]));
    let ours = format!(r#"{{"{DRIVER}":"from-node","other.csi":"x"}}"#);
    // (CSINode's id, Node, attachment annotated with its id at attach) → attach's answer,
    // detach's answer.
    type Row<'a> = (
        Option<&'a str>,
        Option<k8s_openapi::api::core::v1::Node>,
        bool,
        Result<&'a str, &'a str>,
        Result<&'a str, &'a str>,
    );
    let rows: Vec<Row> = vec![
        (
            Some("from-csinode"),
            with_ids(&ours),
            true,
            Ok("from-csinode"),
            Ok("from-csinode"),
        ),
        (
            None,
            with_ids(&ours),
            false,
            Ok("from-node"),
            Ok("from-node"),
        ),
        (None, with_ids(&ours), true, Ok("from-node"), Ok("from-va")),
        (
            None,
            with_ids(r#"{"other.csi":"x"}"#),
            false,
            Err("does not contain driver"),
            Err("does not contain driver"),
        ),
        (
            None,
            with_ids(r#"{"other.csi":"x"}"#),
            true,
            Err("does not contain driver"),
            Ok("from-va"),
        ),
        (
            None,
            Some(node_with_ids(None)),
            true,
            Err("does not contain driver"),
            Ok("from-va"),
        ),
        (
            None,
            None,
            true,
            Err("does not contain driver"),
            Ok("from-va"),
        ),
        (
            None,
            with_ids("not json"),
            false,
            Err("failed to parse the csi.volume.kubernetes.io/nodeid annotation"),
            Err("failed to parse"),
        ),
        (
            None,
            with_ids(&format!(r#"{{"{DRIVER}":""}}"#)),
            false,
            Err("does not contain driver"),
            Err("does not contain driver"),
        ),
    ];
    for (i, (csinode_id, node, annotated_va, attach_wants, detach_wants)) in
        rows.into_iter().enumerate()
    {
        let n = csinode(csinode_id);
        let v = if annotated_va {
            annotated.clone()
        } else {
            va(&[], false)
        };
        let check =
            |got: Result<String, String>, wants: Result<&str, &str>, what: &str| match (got, wants)
            {
                (Ok(id), Ok(want)) => assert_eq!(id, want, "row {i} {what}"),
                (Err(error), Err(want)) => assert!(error.contains(want), "row {i} {what}: {error}"),
                (got, want) => panic!("row {i} {what}: got {got:?}, wanted {want:?}"),
            };
        check(
            attach::node_id(&v, Some(&n), node.as_ref(), DRIVER),
            attach_wants,
            "attach",
        );
        check(
            attach::node_id_for_detach(&v, Some(&n), node.as_ref(), DRIVER),
            detach_wants,
            "detach",
        );
    }
}

#[test]
fn the_node_is_read_only_when_the_plan_will_look_for_the_id_there() {
    let d = driver();
    let (with_id, without) = (csinode(Some("n1")), csinode(None));
    let annotated = |mut v: VolumeAttachment| {
        v.metadata.annotations = Some(BTreeMap::from([(ANN_NODE_ID.into(), "n1".into())]));
        v
    };
    // (attachment, CSINode, force) → read the Node
    let rows: Vec<(VolumeAttachment, Option<&CSINode>, bool, bool, &str)> = vec![
        (va(&[], false), Some(&without), false, true, "an attach"),
        (
            va(&[], false),
            None,
            false,
            true,
            "an attach, no CSINode at all",
        ),
        (
            va(&[], false),
            Some(&with_id),
            false,
            false,
            "the CSINode has the id",
        ),
        (
            va(&[F], true),
            Some(&without),
            false,
            false,
            "attached: nothing to call",
        ),
        (
            va(&[F], true),
            Some(&without),
            true,
            true,
            "attached but forced",
        ),
        (
            deleting_va(&[F], true),
            Some(&without),
            false,
            true,
            "a detach without the id",
        ),
        (
            annotated(deleting_va(&[F], true)),
            Some(&without),
            false,
            false,
            "a detach with it",
        ),
    ];
    for (v, n, force, wanted, why) in rows {
        assert_eq!(attach::needs_node(&v, n, &d, force), wanted, "{why}");
    }
    let mut no_publish = driver();
    no_publish.publish_unpublish = false;
    assert!(
        !attach::needs_node(&va(&[], false), None, &no_publish, false),
        "only marked attached"
    );
}
