//! Generic ephemeral volumes (`spec.volumes[].ephemeral.volumeClaimTemplate`), as
//! kube-controller-manager's ephemeral-volume controller and garbage collector treat them: each
//! such volume of a Pod gets the claim `<pod>-<volume>`, owned by the Pod (its controller), with
//! the template's labels, annotations and spec; the claim goes when its Pod is gone. A claim of
//! that name that the Pod does not own is never taken over: the Pod waits, and is told why.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// What a Pod's ephemeral volumes need.
#[derive(Debug, Clone, PartialEq)]
pub enum EphemeralAction {
    /// Create this claim.
    Create(Box<PersistentVolumeClaim>),
    /// A claim of the name exists and is not the Pod's.
    NotOwned {
        /// The claim's name.
        claim: String,
    },
}

/// The owner reference that makes a claim the Pod's.
fn owner(pod: &Pod) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The UID of the Pod that controls `claim`, if a Pod does.
pub fn owning_pod(claim: &PersistentVolumeClaim) -> Option<(&str, &str)> {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == "Pod" && r.api_version == "v1")
        .map(|r| (r.name.as_str(), r.uid.as_str()))
}

/// What the Pod's ephemeral volumes need, given the claims of its namespace by name (nothing
/// for a Pod being deleted, or not yet given a UID).
pub fn ephemeral_claims<'a>(
    pod: &Pod,
    existing: impl Fn(&str) -> Option<&'a PersistentVolumeClaim>,
) -> Vec<EphemeralAction> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() || uid.is_empty() {
        return Vec::new();
    }
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut actions = Vec::new();
    for volume in volumes.into_iter().flatten() {
        let Some(template) = volume
            .ephemeral
            .as_ref()
            .and_then(|e| e.volume_claim_template.as_ref())
        else {
            continue;
        };
        let name = format!("{pod_name}-{}", volume.name);
        match existing(&name) {
            Some(claim) if owning_pod(claim).map(|(_, owner)| owner) == Some(uid) => {}
            Some(_) => actions.push(EphemeralAction::NotOwned { claim: name }),
            None => {
                let meta = template.metadata.clone().unwrap_or_default();
                actions.push(EphemeralAction::Create(Box::new(PersistentVolumeClaim {
                    metadata: ObjectMeta {
                        name: Some(name),
                        namespace: pod.metadata.namespace.clone(),
                        labels: meta.labels,
                        annotations: meta.annotations,
                        owner_references: Some(vec![owner(pod)]),
                        ..ObjectMeta::default()
                    },
                    spec: Some(template.spec.clone()),
                    status: None,
                })));
            }
        }
    }
    actions
}

/// Whether a claim a Pod controls is to be deleted: its Pod (`pod`, as read) is gone, or is
/// another Pod of the same name. A claim no Pod controls is never deleted here.
pub fn claim_orphaned(claim: &PersistentVolumeClaim, pod: Option<&Pod>) -> bool {
    match owning_pod(claim) {
        None => false,
        Some((_, uid)) => pod.and_then(|p| p.metadata.uid.as_deref()) != Some(uid),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        EphemeralVolumeSource, PersistentVolumeClaimSpec, PersistentVolumeClaimTemplate, Volume,
    };
    use std::collections::BTreeMap;

    fn pod(uid: &str, volumes: &[&str]) -> Pod {
        let mut pod = sidecar_kit::testing::pod("web").uid(uid).build();
        pod.metadata.namespace = Some("default".into());
        let template = PersistentVolumeClaimTemplate {
            metadata: Some(ObjectMeta {
                labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
                annotations: Some(BTreeMap::from([("note".to_string(), "x".to_string())])),
                ..ObjectMeta::default()
            }),
            spec: PersistentVolumeClaimSpec {
                storage_class_name: Some("fast".into()),
                ..PersistentVolumeClaimSpec::default()
            },
        };
        let spec = pod.spec.get_or_insert_default();
        spec.volumes = Some(
            volumes
                .iter()
                .map(|name| Volume {
                    name: name.to_string(),
                    ephemeral: Some(EphemeralVolumeSource {
                        volume_claim_template: Some(template.clone()),
                    }),
                    ..Volume::default()
                })
                .chain(std::iter::once(Volume {
                    name: "cache".into(),
                    empty_dir: Some(Default::default()),
                    ..Volume::default()
                }))
                .collect(),
        );
        pod
    }

    fn claim_owned_by(name: &str, uid: Option<&str>) -> PersistentVolumeClaim {
        let mut claim = sidecar_kit::testing::claim(name, "");
        claim.metadata.owner_references = uid.map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: "web".into(),
                uid: uid.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        });
        claim
    }

    #[test]
    fn each_ephemeral_volume_gets_its_pods_claim_and_a_strangers_is_never_taken() {
        let p = pod("u1", &["data", "logs"]);
        let mine = claim_owned_by("web-logs", Some("u1"));
        let actions = ephemeral_claims(&p, |name| (name == "web-logs").then_some(&mine));
        assert_eq!(
            actions.len(),
            1,
            "logs exists already, cache is not a claim"
        );
        let EphemeralAction::Create(made) = &actions[0] else {
            panic!("{actions:?}")
        };
        assert_eq!(made.metadata.name.as_deref(), Some("web-data"));
        assert_eq!(made.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(made.metadata.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(made.metadata.annotations.as_ref().unwrap()["note"], "x");
        assert_eq!(owning_pod(made), Some(("web", "u1")));
        assert_eq!(
            made.spec.as_ref().unwrap().storage_class_name.as_deref(),
            Some("fast")
        );
        // The name is taken by a claim the Pod does not own (none, or another Pod's).
        for stranger in [
            claim_owned_by("web-data", None),
            claim_owned_by("web-data", Some("u0")),
        ] {
            let actions = ephemeral_claims(&pod("u1", &["data"]), |_| Some(&stranger));
            assert_eq!(
                actions,
                vec![EphemeralAction::NotOwned {
                    claim: "web-data".into()
                }]
            );
        }
        // A Pod being deleted, or without a UID yet, gets nothing.
        let mut going = pod("u1", &["data"]);
        going.metadata.deletion_timestamp = Some(sidecar_kit::vocabulary::now());
        assert!(ephemeral_claims(&going, |_| None).is_empty());
        assert!(ephemeral_claims(&pod("", &["data"]), |_| None).is_empty());
    }

    #[test]
    fn a_pods_claim_goes_with_its_pod_and_no_other_claim_does() {
        let owned = claim_owned_by("web-data", Some("u1"));
        assert!(!claim_orphaned(&owned, Some(&pod("u1", &[]))));
        assert!(claim_orphaned(&owned, None), "the Pod is gone");
        assert!(
            claim_orphaned(&owned, Some(&pod("u2", &[]))),
            "a new Pod of the name"
        );
        assert!(
            !claim_orphaned(&claim_owned_by("data", None), None),
            "nobody's claim"
        );
    }
}
