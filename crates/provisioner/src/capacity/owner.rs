//! The owner of the CSIStorageCapacity objects (`--capacity-ownerref-level`): -1 none, 0 the
//! provisioner's Pod, 1 the Pod's controller (ReplicaSet, StatefulSet, DaemonSet), 2 that
//! object's controller (Deployment), and so on. Objects are then garbage-collected with the
//! deployment that made them. As upstream, the reference names apiVersion, kind, name and UID
//! and is a controller reference; `blockOwnerDeletion` is not set.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

/// Why the owner could not be found; the provisioner does not start.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// `NAMESPACE` is not set.
    #[error("need NAMESPACE env variable for CSIStorageCapacity objects")]
    NoNamespace,
    /// `POD_NAME` is not set while the level asks for an owner.
    #[error(
        "need POD_NAME env variable to determine CSIStorageCapacity owner (or --capacity-ownerref-level=-1)"
    )]
    NoPodName,
    /// Reading an object of the chain failed.
    #[error("look up owner(s) of pod: get {kind} {namespace}/{name}: {source}")]
    Get {
        /// Kind read.
        kind: String,
        /// The owner's namespace.
        namespace: String,
        /// The owner's name.
        name: String,
        /// The API error.
        source: Box<kube::Error>,
    },
    /// An object of the chain has no controller reference: the level is too high.
    #[error(
        "look up owner(s) of pod: {api_version}/{kind} {name:?} in namespace {namespace:?} has no controlling owner, cannot unwind the ownership further"
    )]
    NoController {
        /// apiVersion of the object.
        api_version: String,
        /// Kind of the object.
        kind: String,
        /// The object's name.
        name: String,
        /// The object's namespace.
        namespace: String,
    },
    /// An owner reference names an apiVersion that does not parse.
    #[error("look up owner(s) of pod: owner reference with apiVersion {0:?}")]
    BadApiVersion(String),
}

/// The controller reference among `refs`, reduced to what the capacity objects carry.
pub fn controlling_owner(meta: &ObjectMeta) -> Option<OwnerReference> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| reference(&r.api_version, &r.kind, &r.name, &r.uid))
}

/// A controller reference to an object.
pub fn reference(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn resource_of(owner: &OwnerReference) -> Result<ApiResource, OwnerError> {
    let (group, version) = match owner.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", owner.api_version.as_str()),
    };
    if version.is_empty() || owner.kind.is_empty() {
        return Err(OwnerError::BadApiVersion(owner.api_version.clone()));
    }
    Ok(ApiResource::from_gvk(&GroupVersionKind::gvk(
        group,
        version,
        &owner.kind,
    )))
}

/// Walks up `level` controller references from the Pod `pod` in `namespace`.
pub async fn resolve(
    client: &kube::Client,
    namespace: &str,
    pod: Option<&str>,
    level: i32,
) -> Result<Option<OwnerReference>, OwnerError> {
    if level < 0 {
        return Ok(None);
    }
    let pod = pod.ok_or(OwnerError::NoPodName)?;
    let object = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(pod)
        .await
        .map_err(|source| OwnerError::Get {
            kind: "Pod".into(),
            namespace: namespace.into(),
            name: pod.into(),
            source: Box::new(source),
        })?;
    let mut current = reference(
        "v1",
        "Pod",
        pod,
        object.metadata.uid.as_deref().unwrap_or_default(),
    );
    let mut meta = object.metadata;
    for step in 0..level {
        let Some(next) = controlling_owner(&meta) else {
            return Err(OwnerError::NoController {
                api_version: current.api_version,
                kind: current.kind,
                name: current.name,
                namespace: namespace.into(),
            });
        };
        current = next;
        // The last step needs only the reference; the ones before it read the object.
        if step + 1 < level {
            let resource = resource_of(&current)?;
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            meta = api
                .get(&current.name)
                .await
                .map_err(|source| OwnerError::Get {
                    kind: current.kind.clone(),
                    namespace: namespace.into(),
                    name: current.name.clone(),
                    source: Box::new(source),
                })?
                .metadata;
        }
    }
    Ok(Some(current))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (kind, name, controller).
    type Ref<'a> = (&'a str, &'a str, bool);

    fn meta(refs: &[Ref]) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(
                refs.iter()
                    .map(|(kind, name, controller)| OwnerReference {
                        api_version: "apps/v1".into(),
                        kind: kind.to_string(),
                        name: name.to_string(),
                        uid: format!("uid-{name}"),
                        controller: Some(*controller),
                        block_owner_deletion: Some(true),
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn the_controller_reference_is_the_owner_without_block_owner_deletion() {
        type Case<'a> = (&'a [Ref<'a>], Option<(&'a str, &'a str)>);
        let cases: &[Case] = &[
            (&[], None),
            (&[("ReplicaSet", "rs", false)], None),
            (
                &[("ReplicaSet", "other", false), ("ReplicaSet", "rs", true)],
                Some(("ReplicaSet", "rs")),
            ),
            (&[("DaemonSet", "ds", true)], Some(("DaemonSet", "ds"))),
        ];
        for (refs, want) in cases {
            let got = controlling_owner(&meta(refs));
            assert_eq!(
                got.as_ref().map(|r| (r.kind.as_str(), r.name.as_str())),
                *want,
                "{refs:?}"
            );
            if let Some(r) = got {
                assert_eq!(r.controller, Some(true));
                assert_eq!(r.block_owner_deletion, None);
                assert_eq!(r.uid, format!("uid-{}", r.name));
            }
        }
        assert_eq!(controlling_owner(&ObjectMeta::default()), None);
    }

    #[test]
    fn owner_kinds_map_to_their_resources() {
        let rs = reference("apps/v1", "ReplicaSet", "x", "u");
        let resource = resource_of(&rs).ok();
        assert_eq!(
            resource.map(|r| (r.group, r.version, r.plural)),
            Some(("apps".into(), "v1".into(), "replicasets".into()))
        );
        assert!(resource_of(&reference("", "Pod", "x", "u")).is_err());
    }
}
