//! What the benchmark's watches read of claims and volumes: the metadata and the one field each
//! needs (a claim's phase, a volume's claim), instead of decoding whole objects. The benchmark
//! runs on the same cores as the stack it measures, so its own work is kept small.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;

/// A PersistentVolumeClaim as the benchmark watches it.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct ClaimView {
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
}
