#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use serde_json::json;

use sidecar_kit::testing;

use super::attach_detach::{World, actions, unique_name, wanted};
use super::protection::{self, PV_PROTECTION, PVC_PROTECTION, Protection};

const D: &str = "hostpath.csi.volstack.dev";

fn pod(name: &str, node: &str, phase: &str, claims: &[&str]) -> Pod {
    claims
        .iter()
        .fold(testing::pod(name).node(node).phase(phase), |p, c| {
            p.claim(&format!("v-{c}"), c, false)
        })
        .build()
}

fn claim(name: &str, volume: &str) -> PersistentVolumeClaim {
    testing::claim(name, volume)
}

fn pv(name: &str, driver: &str) -> PersistentVolume {
    testing::csi_volume(name, driver).phase("Bound").build()
}

fn va(name: &str, node: &str, volume: &str) -> VolumeAttachment {
    testing::attachment(name, D, node, volume).build()
}

#[test]
fn attachments_follow_the_pods_that_use_attachable_volumes() {
    let claims_list = [
        claim("c1", "pv1"),
        claim("c2", "pv2"),
        claim("c3", "pv3"),
        claim("pending", ""),
    ];
    let volumes_list = [pv("pv1", D), pv("pv2", D), pv("pv3", "noattach.example")];
    let no_attach: CSIDriver = testing::csi_driver("noattach.example", false, false);
    let claims: HashMap<_, _> = claims_list
        .iter()
        .map(|c| {
            (
                (
                    c.metadata.namespace.as_deref().unwrap(),
                    c.metadata.name.as_deref().unwrap(),
                ),
                c,
            )
        })
        .collect();
    let volumes: HashMap<_, _> = volumes_list
        .iter()
        .map(|v| (v.metadata.name.as_deref().unwrap(), v))
        .collect();
    let drivers: HashMap<_, _> = [("noattach.example", &no_attach)].into();
    let mut busy: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
    busy.status = Some(Default::default());
    busy.status.as_mut().unwrap().volumes_in_use = Some(vec![unique_name(D, "h-pv2")]);
    let nodes: HashMap<_, _> = [("n2", &busy)].into();
    let world = World {
        claims: &claims,
        volumes: &volumes,
        drivers: &drivers,
        nodes: &nodes,
    };

    let pods = [
        pod("a", "n1", "Running", &["c1", "c3", "pending", "missing"]),
        pod("b", "n1", "Pending", &["c1"]),
        pod("unscheduled", "", "Pending", &["c2"]),
        pod("done", "n2", "Succeeded", &["c2"]),
    ];
    let want = wanted(pods.iter(), world);
    let names: Vec<(&str, &str)> = want
        .iter()
        .map(|w| (w.volume.as_str(), w.node.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![("pv1", "n1")],
        "one per volume and node; not the non-attachable driver, unbound claims, unscheduled or finished pods"
    );
    let first = want.iter().next().unwrap();
    assert_eq!(
        first.name,
        sidecar_kit::pv_csi::attachment_name("h-pv1", D, "n1")
    );

    let stale_n1 = va("stale-n1", "n1", "pv2");
    let in_use_n2 = va("in-use-n2", "n2", "pv2");
    let mut leaving = va("leaving", "n1", "pv2");
    leaving.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-23T00:00:00Z".parse().unwrap(),
        ));
    let kept = va(&first.name, "n1", "pv1");
    let a = actions(&want, [&stale_n1, &in_use_n2, &leaving], world);
    assert_eq!(a.create, want.iter().cloned().collect::<Vec<_>>());
    assert_eq!(
        a.delete,
        vec!["stale-n1".to_string()],
        "not the one the node still uses, not one being deleted"
    );
    let a = actions(&want, [&kept], world);
    assert!(a.create.is_empty() && a.delete.is_empty());
}

#[test]
fn claims_and_volumes_are_protected_while_in_use() {
    let mut c = claim("c1", "pv1");
    let added = protection::claim(&c, []);
    assert!(
        matches!(added, Protection::Add(ref ops) if serde_json::to_value(ops.last().unwrap()).unwrap()["value"] == json!([PVC_PROTECTION])),
        "{added:?}"
    );
    c.metadata.finalizers = Some(vec![PVC_PROTECTION.into()]);
    assert_eq!(
        protection::claim(&c, []),
        Protection::Keep,
        "not being deleted"
    );
    c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-11-23T00:00:00Z".parse().unwrap(),
    ));
    let users = [pod("a", "n1", "Running", &["c1"])];
    assert_eq!(
        protection::claim(&c, users.iter()),
        Protection::Keep,
        "a running pod uses it"
    );
    let gone_users = [
        pod("done", "n1", "Succeeded", &["c1"]),
        pod("unscheduled", "", "Pending", &["c1"]),
        pod("other", "n1", "Running", &["c2"]),
    ];
    assert!(matches!(
        protection::claim(&c, gone_users.iter()),
        Protection::Release(_)
    ));

    let mut ephemeral = pod("eph", "n1", "Running", &[]);
    ephemeral.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(
            json!({"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
        )
        .unwrap(),
    ]);
    assert_eq!(
        protection::claims_of(&ephemeral),
        vec!["eph-scratch".to_string()]
    );

    let mut v = pv("pv1", D);
    v.metadata.finalizers = Some(vec![PV_PROTECTION.into()]);
    v.metadata.deletion_timestamp = c.metadata.deletion_timestamp.clone();
    assert_eq!(protection::volume(&v), Protection::Keep, "Bound");
    v.status.as_mut().unwrap().phase = Some("Released".into());
    assert!(matches!(protection::volume(&v), Protection::Release(_)));
}

#[test]
fn pods_waiting_on_a_failed_attach_hear_why_and_others_do_not() {
    let claims_list = [claim("c1", "pv1"), claim("c2", "pv2")];
    let claims: HashMap<_, _> = claims_list
        .iter()
        .map(|c| {
            (
                (
                    c.metadata.namespace.as_deref().unwrap(),
                    c.metadata.name.as_deref().unwrap(),
                ),
                c,
            )
        })
        .collect();
    let mut failed = va("a1", "n1", "pv1");
    failed.status = Some(
        serde_json::from_value(json!({"attached": false, "attachError": {"message": "rpc error: code = ResourceExhausted desc = full"}})).unwrap(),
    );
    let fine = va("a2", "n1", "pv2");
    let (p1, p2) = (
        pod("a", "n1", "Pending", &["c1"]),
        pod("b", "n1", "Pending", &["c2"]),
    );
    let pods = [&p1, &p2];
    let got: Vec<(String, String)> =
        super::attach_detach::attach_failures([&failed, &fine], &pods, &claims)
            .into_iter()
            .map(|(p, m)| (p.metadata.name.clone().unwrap(), m))
            .collect();
    assert_eq!(
        got,
        vec![(
            "a".to_string(),
            "AttachVolume.Attach failed for volume \"pv1\" : rpc error: code = ResourceExhausted desc = full".to_string()
        )]
    );
}
