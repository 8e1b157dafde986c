//! Builders for test fixtures.

#![allow(dead_code)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeSpec, PersistentVolumeStatus, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::claim::{ANN_BETA_STORAGE_PROVISIONER, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER};
use super::provision::{
    ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ANN_PROVISIONED_BY, PV_FINALIZER,
};

pub struct ClaimBuilder(PersistentVolumeClaim);

pub fn claim(name: &str) -> ClaimBuilder {
    ClaimBuilder(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some("3f2c1c9e-4a51-4d8e-9c1e-0d7f1b2a3c4d".into()),
            resource_version: Some("42".into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            ..Default::default()
        }),
        status: None,
    })
}

impl ClaimBuilder {
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    pub fn provisioner(self, p: &str) -> Self {
        self.annotation(ANN_STORAGE_PROVISIONER, p)
    }
    pub fn beta_provisioner(self, p: &str) -> Self {
        self.annotation(ANN_BETA_STORAGE_PROVISIONER, p)
    }
    pub fn selected_node(self, n: &str) -> Self {
        self.annotation(ANN_SELECTED_NODE, n)
    }
    fn spec(&mut self) -> &mut PersistentVolumeClaimSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }
    pub fn class(mut self, c: &str) -> Self {
        self.spec().storage_class_name = Some(c.into());
        self
    }
    pub fn volume_name(mut self, v: &str) -> Self {
        self.spec().volume_name = Some(v.into());
        self
    }
    pub fn access_modes(mut self, modes: &[&str]) -> Self {
        self.spec().access_modes = Some(modes.iter().map(|m| m.to_string()).collect());
        self
    }
    pub fn block(mut self) -> Self {
        self.spec().volume_mode = Some("Block".into());
        self
    }
    pub fn size(mut self, q: &str) -> Self {
        let r = self
            .spec()
            .resources
            .get_or_insert_with(VolumeResourceRequirements::default);
        r.requests
            .get_or_insert_with(BTreeMap::new)
            .insert("storage".into(), Quantity(q.into()));
        self
    }
    pub fn limit(mut self, q: &str) -> Self {
        let r = self
            .spec()
            .resources
            .get_or_insert_with(VolumeResourceRequirements::default);
        r.limits
            .get_or_insert_with(BTreeMap::new)
            .insert("storage".into(), Quantity(q.into()));
        self
    }
    pub fn selector(mut self) -> Self {
        self.spec().selector = Some(Default::default());
        self
    }
    pub fn vac(mut self, name: &str) -> Self {
        self.spec().volume_attributes_class_name = Some(name.into());
        self
    }
    pub fn build(self) -> PersistentVolumeClaim {
        self.0
    }
}

pub struct ClassBuilder(StorageClass);

pub fn class(name: &str, provisioner: &str) -> ClassBuilder {
    ClassBuilder(StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        ..Default::default()
    })
}

impl ClassBuilder {
    pub fn param(mut self, k: &str, v: &str) -> Self {
        self.0
            .parameters
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    pub fn policy(mut self, p: &str) -> Self {
        self.0.reclaim_policy = Some(p.into());
        self
    }
    pub fn mount_options(mut self, opts: &[&str]) -> Self {
        self.0.mount_options = Some(opts.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn wait_for_first_consumer(mut self) -> Self {
        self.0.volume_binding_mode = Some("WaitForFirstConsumer".into());
        self
    }
    pub fn build(self) -> StorageClass {
        self.0
    }
}

pub struct PvBuilder(PersistentVolume);

pub fn pv(name: &str) -> PvBuilder {
    PvBuilder(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec::default()),
        status: None,
    })
}

impl PvBuilder {
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
        self
    }
    pub fn csi_driver(mut self, d: &str) -> Self {
        let name = self.0.metadata.name.clone().unwrap_or_default();
        if let Some(spec) = self.0.spec.as_mut() {
            spec.csi = Some(CSIPersistentVolumeSource {
                driver: d.into(),
                volume_handle: format!("handle-{name}"),
                ..Default::default()
            });
        }
        self
    }
    pub fn ours(self, d: &str) -> Self {
        self.annotation(ANN_PROVISIONED_BY, d).csi_driver(d)
    }
    pub fn policy(mut self, p: &str) -> Self {
        if let Some(spec) = self.0.spec.as_mut() {
            spec.persistent_volume_reclaim_policy = Some(p.into());
        }
        self
    }
    pub fn phase(mut self, p: &str) -> Self {
        self.0.status = Some(PersistentVolumeStatus {
            phase: Some(p.into()),
            ..Default::default()
        });
        self
    }
    pub fn secret(self, name: &str, ns: &str) -> Self {
        self.annotation(ANN_DELETION_SECRET_NAME, name)
            .annotation(ANN_DELETION_SECRET_NAMESPACE, ns)
    }
    pub fn finalizer(mut self) -> Self {
        self.0
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(PV_FINALIZER.into());
        self
    }
    pub fn build(self) -> PersistentVolume {
        self.0
    }
}
