#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use sidecar_kit::testing;

use super::decide::*;

const D: &str = "hostpath.csi.volstack.dev";

fn pod(node: &str, claims: &[(&str, bool)]) -> Pod {
    claims
        .iter()
        .fold(testing::pod("app").uid("u1").node(node), |p, (c, ro)| {
            p.claim(c, c, *ro)
        })
        .empty_dir("scratch")
        .build()
}

fn claim(name: &str, volume: &str) -> PersistentVolumeClaim {
    testing::claim(name, volume)
}

fn pv(name: &str, driver: &str) -> PersistentVolume {
    testing::csi_volume(name, driver)
        .access_modes(&["ReadWriteOnce"])
        .attribute("kind", "fast")
        .stage_secret("stage", "ns")
        .publish_secret("pub", "ns")
        .build()
}

fn driver(attach: bool, pod_info: bool) -> CSIDriver {
    testing::csi_driver(D, attach, pod_info)
}

fn va(handle: &str, node: &str, attached: bool) -> VolumeAttachment {
    let name = sidecar_kit::pv_csi::attachment_name(handle, D, node);
    testing::attachment(&name, D, node, "x")
        .attached(attached, &[("devicePath", "/dev/x")])
        .build()
}

struct Objects {
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
    drivers: Vec<CSIDriver>,
    attachments: Vec<VolumeAttachment>,
}

fn plan(p: &Pod, o: &Objects) -> PodPlan {
    let claims: BTreeMap<(String, String), &PersistentVolumeClaim> = o
        .claims
        .iter()
        .map(|c| (("default".to_string(), c.metadata.name.clone().unwrap()), c))
        .collect();
    let volumes: BTreeMap<String, &PersistentVolume> = o
        .volumes
        .iter()
        .map(|v| (v.metadata.name.clone().unwrap(), v))
        .collect();
    let drivers: BTreeMap<String, &CSIDriver> = o
        .drivers
        .iter()
        .map(|d| (d.metadata.name.clone().unwrap(), d))
        .collect();
    let attachments: BTreeMap<String, &VolumeAttachment> = o
        .attachments
        .iter()
        .map(|v| (v.metadata.name.clone().unwrap(), v))
        .collect();
    plan_pod(
        p,
        World {
            node: "n1",
            driver: D,
            claims: &claims,
            volumes: &volumes,
            drivers: &drivers,
            attachments: &attachments,
        },
    )
}

fn summary(plan: &PodPlan) -> String {
    match plan {
        PodPlan::Skip => "skip".into(),
        PodPlan::SetUp(v) => format!(
            "set up {}",
            v.iter()
                .map(|v| format!("{}{}", v.pv, if v.readonly { " ro" } else { "" }))
                .collect::<Vec<_>>()
                .join(",")
        ),
        PodPlan::Wait(reason) => format!("wait: {reason}"),
        PodPlan::TearDown { finish_deletion } => format!("tear down, finish={finish_deletion}"),
    }
}

#[test]
fn what_each_pod_needs_before_it_runs_and_when_its_volumes_go() {
    let base = || Objects {
        claims: vec![claim("c1", "pv1"), claim("c2", "pv2"), claim("unbound", "")],
        volumes: vec![pv("pv1", D), pv("pv2", D), pv("other", "other.example")],
        drivers: vec![driver(true, false)],
        attachments: vec![va("h-pv1", "n1", true), va("h-pv2", "n1", false)],
    };
    let mut deleting = pod("n1", &[("c1", false)]);
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-23T00:00:00Z".parse().unwrap(),
        ));
    let mut done = pod("n1", &[("c1", false)]);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let mut no_attach = base();
    no_attach.drivers = vec![driver(false, false)];
    no_attach.attachments.clear();
    let mut foreign = base();
    foreign.claims.push(claim("c3", "other"));
    let not_attached = format!(
        "wait: volume \"pv2\" is not attached to n1 yet (VolumeAttachment {})",
        sidecar_kit::pv_csi::attachment_name("h-pv2", D, "n1")
    );
    let cases: Vec<(&str, Pod, Objects, &str)> = vec![
        (
            "another node's pod",
            pod("n2", &[("c1", false)]),
            base(),
            "skip",
        ),
        (
            "attached volume, read-only claim",
            pod("n1", &[("c1", true)]),
            base(),
            "set up pv1 ro",
        ),
        (
            "not attached yet",
            pod("n1", &[("c1", false), ("c2", false)]),
            base(),
            &not_attached,
        ),
        (
            "no attach needed",
            pod("n1", &[("c1", false), ("c2", false)]),
            no_attach,
            "set up pv1,pv2",
        ),
        (
            "unbound claim",
            pod("n1", &[("unbound", false)]),
            base(),
            "wait: claim \"unbound\" is not bound yet",
        ),
        (
            "missing claim",
            pod("n1", &[("nope", false)]),
            base(),
            "wait: persistentvolumeclaim \"nope\" not found",
        ),
        (
            "another driver's volume",
            pod("n1", &[("c3", false)]),
            foreign,
            "wait: driver name other.example not found in the list of registered CSI drivers",
        ),
        ("being deleted", deleting, base(), "tear down, finish=true"),
        ("finished", done, base(), "tear down, finish=false"),
    ];
    for (name, p, objects, want) in cases {
        assert_eq!(summary(&plan(&p, &objects)), want, "{name}");
    }
}

#[test]
fn a_set_up_carries_the_attachment_secrets_and_pod_info() {
    let objects = Objects {
        claims: vec![claim("c1", "pv1")],
        volumes: vec![pv("pv1", D)],
        drivers: vec![driver(true, true)],
        attachments: vec![va("h-pv1", "n1", true)],
    };
    let PodPlan::SetUp(volumes) = plan(&pod("n1", &[("c1", false)]), &objects) else {
        panic!("set up")
    };
    let v = &volumes[0];
    assert_eq!(
        v.publish_context.get("devicePath").map(String::as_str),
        Some("/dev/x")
    );
    assert_eq!(v.attributes.get("kind").map(String::as_str), Some("fast"));
    assert_eq!(
        v.publish_attributes
            .get("csi.storage.k8s.io/pod.name")
            .map(String::as_str),
        Some("app")
    );
    assert_eq!(
        v.publish_attributes
            .get("csi.storage.k8s.io/pod.uid")
            .map(String::as_str),
        Some("u1")
    );
    assert!(
        !v.attributes.contains_key("csi.storage.k8s.io/pod.name"),
        "not for staging"
    );
    assert_eq!(
        v.stage_secret,
        Some(SecretRef {
            namespace: "ns".into(),
            name: "stage".into()
        })
    );
    assert_eq!(
        v.publish_secret,
        Some(SecretRef {
            namespace: "ns".into(),
            name: "pub".into()
        })
    );
}

#[test]
fn paths_status_and_volumes_in_use_follow_kubelet() {
    let paths = Paths {
        root: PathBuf::from("/k/n1"),
    };
    assert_eq!(
        paths.target("u1", "pv1"),
        PathBuf::from("/k/n1/pods/u1/volumes/kubernetes.io~csi/pv1/mount")
    );
    assert_eq!(
        paths.staging_target(D, "h"),
        PathBuf::from(format!(
            "/k/n1/plugins/kubernetes.io/csi/{D}/{}/globalmount",
            sidecar_kit::pv_csi::sha256_hex(b"h")
        ))
    );
    assert_eq!(
        pod_uid_of(&paths, &paths.pod_volume("u1", "pv1")).as_deref(),
        Some("u1")
    );

    let status = running_status(&pod("n1", &[]), "T");
    assert_eq!(status["status"]["phase"], "Running");
    assert_eq!(status["status"]["containerStatuses"][0]["ready"], true);
    let ready: Vec<_> = status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "True")
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert!(ready.contains(&"Ready") && ready.contains(&"ContainersReady"));

    let rec = |h: &str| VolumeData {
        driver_name: D.into(),
        volume_handle: h.into(),
        spec_vol_id: "pv".into(),
        node_name: "n1".into(),
        done: true,
        mounted: true,
        ephemeral: false,
    };
    assert_eq!(
        volumes_in_use([&rec("b"), &rec("a"), &rec("a")]),
        vec![
            format!("kubernetes.io/csi/{D}^a"),
            format!("kubernetes.io/csi/{D}^b")
        ]
    );
    let staged = vec![
        (PathBuf::from("/s/a"), rec("a")),
        (PathBuf::from("/s/b"), rec("b")),
        (PathBuf::from("/s/c"), rec("c")),
    ];
    let published = vec![(PathBuf::from("/p/a"), rec("a"))];
    let wanted: BTreeSet<String> = ["b".to_string()].into();
    let gone: Vec<&str> = unneeded_stages(&staged, &published, &wanted)
        .iter()
        .map(|(_, d)| d.volume_handle.as_str())
        .collect();
    assert_eq!(
        gone,
        vec!["c"],
        "a published and a wanted volume stay staged"
    );
}

#[test]
fn a_waiting_pod_hears_why_after_ten_seconds_once_per_reason() {
    use std::time::Duration;
    let cases = [
        (Duration::from_secs(3), None, "r1", None),
        (
            Duration::from_secs(10),
            None,
            "r1",
            Some("Unable to attach or mount volumes: r1"),
        ),
        (Duration::from_secs(30), Some("r1"), "r1", None),
        (
            Duration::from_secs(30),
            Some("r1"),
            "r2",
            Some("Unable to attach or mount volumes: r2"),
        ),
    ];
    for (waited, last, reason, want) in cases {
        assert_eq!(
            wait_report(waited, last, reason).as_deref(),
            want,
            "{waited:?} {last:?} {reason}"
        );
    }
}

#[test]
fn only_a_volume_that_was_shown_and_is_no_longer_is_a_lost_mount() {
    let rec = |done: bool, mounted: bool| VolumeData {
        driver_name: D.into(),
        volume_handle: "h".into(),
        spec_vol_id: "pv".into(),
        node_name: "n1".into(),
        done,
        mounted,
        ephemeral: false,
    };
    // (record, whether its path shows a volume now, lost)
    let cases = [
        (rec(true, true), true, false),
        (rec(true, true), false, true),
        (rec(true, false), false, false), // the driver never mounted anything there
        (rec(false, true), false, false), // in flight: its own sync finishes it
        (rec(false, false), false, false),
    ];
    for (i, (data, shows, lost)) in cases.into_iter().enumerate() {
        let dir = PathBuf::from(format!("/p/{i}"));
        let records = vec![(dir.clone(), data.clone())];
        let found = lost_mounts(
            &records,
            |d| d.join("mount"),
            |p| {
                assert_eq!(p, dir.join("mount"), "asked about the record's path");
                shows
            },
        );
        assert_eq!(found.len(), usize::from(lost), "{data:?} shows={shows}");
    }
}

#[test]
fn an_ephemeral_volume_is_set_up_only_from_the_claim_its_pod_owns() {
    let mut p = testing::pod("app").uid("u1").node("n1").build();
    p.spec.get_or_insert_default().volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
        name: "work".into(),
        ephemeral: Some(Default::default()),
        ..Default::default()
    }]);
    let owned_by = |uid: &str| {
        let mut c = claim("app-work", "pv-1");
        c.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: "app".into(),
                uid: uid.into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        c
    };
    let objects = |claim: PersistentVolumeClaim| Objects {
        claims: vec![claim],
        volumes: vec![pv("pv-1", D)],
        drivers: vec![driver(false, false)],
        attachments: vec![],
    };
    assert_eq!(summary(&plan(&p, &objects(owned_by("u1")))), "set up pv-1");
    for stranger in [owned_by("u0"), claim("app-work", "pv-1")] {
        assert_eq!(
            summary(&plan(&p, &objects(stranger))),
            "wait: PVC app-work was not created for the pod"
        );
    }
}

#[test]
fn inline_volumes_are_published_only_for_drivers_that_serve_the_ephemeral_mode() {
    let mut inline = testing::pod("app").uid("u1").node("n1").build();
    let spec = inline.spec.as_mut().unwrap();
    spec.service_account_name = Some("sa".into());
    spec.volumes = Some(vec![
        serde_json::from_value(serde_json::json!({
            "name": "scratch",
            "csi": {"driver": D, "fsType": "ext4", "readOnly": true,
                    "volumeAttributes": {"size": "1Mi"},
                    "nodePublishSecretRef": {"name": "pub"}},
        }))
        .unwrap(),
    ]);
    let with = |modes: Option<&[&str]>, pod_info: bool| {
        let mut d = driver(false, pod_info);
        d.spec.volume_lifecycle_modes = modes.map(|m| m.iter().map(|s| s.to_string()).collect());
        Objects {
            claims: vec![],
            volumes: vec![],
            drivers: vec![d],
            attachments: vec![],
        }
    };
    // (modes, pod info, wait reason or None)
    type Row<'a> = (Option<&'a [&'a str]>, bool, Option<&'a str>);
    let table: [Row; 4] = [
        (
            None,
            true,
            Some(
                "volume mode \"Ephemeral\" not supported by driver hostpath.csi.volstack.dev (only supports [\"Persistent\"])",
            ),
        ),
        (Some(&["Persistent"]), true, Some("not supported")),
        (Some(&["Persistent", "Ephemeral"]), true, None),
        (Some(&["Ephemeral"]), false, None),
    ];
    for (modes, pod_info, want) in table {
        let got = plan(&inline, &with(modes, pod_info));
        match (want, got) {
            (Some(words), PodPlan::Wait(why)) => assert!(why.contains(words), "{why}"),
            (None, PodPlan::SetUp(volumes)) => {
                let v = &volumes[0];
                assert!(v.ephemeral);
                assert_eq!(v.pv, "scratch");
                assert_eq!(
                    v.handle,
                    format!("csi-{}", sidecar_kit::pv_csi::sha256_hex(b"u1scratch")),
                    "kubelet's volume id"
                );
                assert!(v.readonly);
                assert!(v.publish_context.is_empty(), "never attached");
                assert_eq!(v.attributes["size"], "1Mi");
                assert_eq!(
                    v.publish_attributes
                        .get("csi.storage.k8s.io/ephemeral")
                        .map(String::as_str),
                    pod_info.then_some("true"),
                );
                assert_eq!(
                    v.publish_secret,
                    Some(SecretRef {
                        name: "pub".into(),
                        namespace: "default".into()
                    }),
                    "the Pod's namespace"
                );
                assert_eq!(v.stage_secret, None);
            }
            (want, got) => panic!("modes {modes:?}: wanted {want:?}, got {got:?}"),
        }
    }
    // Another driver's inline volume is not this node agent's.
    let mut other = with(Some(&["Ephemeral"]), true);
    other.drivers[0].metadata.name = Some("other.csi".into());
    let mut foreign = inline.clone();
    foreign.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
        .csi
        .as_mut()
        .unwrap()
        .driver = "other.csi".into();
    assert!(
        matches!(plan(&foreign, &other), PodPlan::Wait(why) if why.contains("not found in the list of registered CSI drivers"))
    );
}

#[test]
fn inline_volumes_are_never_reported_in_use() {
    let rec = |h: &str, ephemeral: bool| VolumeData {
        driver_name: "d".into(),
        volume_handle: h.into(),
        spec_vol_id: "x".into(),
        node_name: "n".into(),
        done: true,
        mounted: true,
        ephemeral,
    };
    assert_eq!(
        volumes_in_use([&rec("a", false), &rec("csi-1", true)]),
        vec!["kubernetes.io/csi/d^a".to_string()]
    );
}
