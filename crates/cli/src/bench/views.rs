//! What the benchmark's watches read of claims and volumes: the metadata and the one field each
//! needs (a claim's phase, a volume's claim), instead of decoding whole objects. The benchmark
//! runs on the same cores as the stack it measures, so its own work is kept small.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};

/// A PersistentVolumeClaim as the benchmark watches it.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct ClaimView {
    #[serde(deserialize_with = "lean_meta")]
    pub(super) metadata: ObjectMeta,
    #[serde(default)]
    status: Option<ClaimStatusView>,
}

#[derive(Debug, Clone, Deserialize)]
struct ClaimStatusView {
    #[serde(default)]
    phase: Option<String>,
}

impl ClaimView {
    /// Whether the claim's phase is Bound.
    pub(super) fn bound(&self) -> bool {
        self.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
    }
}

/// A PersistentVolume as the benchmark watches it.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct VolumeView {
    #[serde(deserialize_with = "lean_meta")]
    pub(super) metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<VolumeSpecView>,
}

#[derive(Debug, Clone, Deserialize)]
struct VolumeSpecView {
    #[serde(default, rename = "claimRef")]
    claim_ref: Option<ClaimRefView>,
}

#[derive(Debug, Clone, Deserialize)]
struct ClaimRefView {
    #[serde(default)]
    name: Option<String>,
}

impl VolumeView {
    /// The name of the claim the volume is bound (or pre-bound) to.
    pub(super) fn claim(&self) -> Option<&str> {
        self.spec.as_ref()?.claim_ref.as_ref()?.name.as_deref()
    }
}

/// The metadata a watch needs: the name, the namespace and the resourceVersion it resumes
/// from; the rest (labels, annotations, finalizers, times) is skipped, not decoded.
fn lean_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    struct Lean {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        namespace: Option<String>,
        #[serde(default, rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    let lean = Lean::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: lean.name,
        namespace: lean.namespace,
        resource_version: lean.resource_version,
        ..ObjectMeta::default()
    })
}

/// `kube::Resource` for a view of a core/v1 kind, read from the full kind's.
macro_rules! view_of {
    ($view:ty, $full:ty, $scope:ty) => {
        impl Resource for $view {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::KIND.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::VERSION.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

view_of!(
    ClaimView,
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
    k8s_openapi::NamespaceResourceScope
);
view_of!(
    VolumeView,
    k8s_openapi::api::core::v1::PersistentVolume,
    k8s_openapi::ClusterResourceScope
);

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn views_read_the_phase_and_the_claim_and_ignore_the_rest() {
        let claim: ClaimView = serde_json::from_value(json!({
            "metadata": {"name": "bench-1", "namespace": "default"},
            "spec": {"resources": {"requests": {"storage": "1Mi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Mi"}},
        }))
        .unwrap();
        assert!(claim.bound());
        let pending: ClaimView =
            serde_json::from_value(json!({"metadata": {"name": "bench-2"}, "status": {}})).unwrap();
        assert!(!pending.bound());
        let volume: VolumeView = serde_json::from_value(json!({
            "metadata": {"name": "pvc-1"},
            "spec": {"claimRef": {"name": "bench-1", "namespace": "default"}, "csi": {"driver": "d", "volumeHandle": "h"}},
        }))
        .unwrap();
        assert_eq!(volume.claim(), Some("bench-1"));
        let free: VolumeView = serde_json::from_value(json!({"metadata": {"name": "pv"}})).unwrap();
        assert_eq!(free.claim(), None);
        assert_eq!(
            ClaimView::url_path(&(), Some("default")),
            "/api/v1/namespaces/default/persistentvolumeclaims"
        );
        assert_eq!(VolumeView::url_path(&(), None), "/api/v1/persistentvolumes");
    }

    #[test]
    fn views_keep_the_name_namespace_and_resource_version_and_skip_the_rest_of_the_metadata() {
        // A time that would not parse shows the rest is skipped, not decoded.
        let claim: ClaimView = serde_json::from_value(json!({
            "metadata": {
                "name": "bench-1", "namespace": "default", "resourceVersion": "42",
                "uid": "u-1", "creationTimestamp": "not a time",
                "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
                "labels": {"a": "b"}, "finalizers": ["kubernetes.io/pvc-protection"],
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        assert_eq!(claim.metadata.name.as_deref(), Some("bench-1"));
        assert_eq!(claim.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(claim.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(claim.metadata.uid, None);
        assert_eq!(claim.metadata.annotations, None);
        assert_eq!(claim.metadata.labels, None);
        assert_eq!(claim.metadata.finalizers, None);
        assert_eq!(claim.metadata.creation_timestamp, None);
        assert!(claim.bound());
        let volume: VolumeView = serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "resourceVersion": "7", "annotations": {"x": "y"}},
            "spec": {"claimRef": {"name": "bench-1"}},
        }))
        .unwrap();
        assert_eq!(volume.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(volume.metadata.annotations, None);
        assert_eq!(volume.claim(), Some("bench-1"));
    }
}
