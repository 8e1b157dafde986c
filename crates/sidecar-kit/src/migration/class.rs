//! StorageClass translation, in-tree → CSI, per plugin. Parameter keys are matched without
//! regard to case; keys a plugin does not know keep their case and value.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{BETA_ZONE, GA_ZONE};
use super::{Plugin, TranslateError};

/// The in-tree filesystem parameter.
const FSTYPE: &str = "fstype";
/// The CSI filesystem parameter.
pub(super) const CSI_FSTYPE: &str = "csi.storage.k8s.io/fstype";

/// vSphere's parameters kept by the translation, and the CSI key each becomes.
const VSPHERE_KEPT: [(&str, &str); 10] = [
    ("fstype", CSI_FSTYPE),
    ("storagepolicyname", "storagepolicyname"),
    ("datastore", "datastore-migrationparam"),
    ("diskformat", "diskformat-migrationparam"),
    (
        "hostfailurestotolerate",
        "hostfailurestotolerate-migrationparam",
    ),
    ("forceprovisioning", "forceprovisioning-migrationparam"),
    ("cachereservation", "cachereservation-migrationparam"),
    ("diskstripes", "diskstripes-migrationparam"),
    (
        "objectspacereservation",
        "objectspacereservation-migrationparam",
    ),
    ("iopslimit", "iopslimit-migrationparam"),
];

/// Portworx's secret parameters and the six CSI secret parameters each fills.
const PORTWORX_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
const PORTWORX_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";
const CSI_SECRETS: [&str; 6] = [
    "csi.storage.k8s.io/provisioner-secret",
    "csi.storage.k8s.io/controller-publish-secret",
    "csi.storage.k8s.io/node-publish-secret",
    "csi.storage.k8s.io/node-stage-secret",
    "csi.storage.k8s.io/controller-expand-secret",
    "csi.storage.k8s.io/node-expand-secret",
];

/// The class as the plugin's CSI driver's.
pub(super) fn to_csi(plugin: Plugin, class: &StorageClass) -> Result<StorageClass, TranslateError> {
    let mut class = class.clone();
    let params = class.parameters.clone().unwrap_or_default();
    match plugin {
        Plugin::AwsEbs | Plugin::GcePd | Plugin::AzureDisk | Plugin::Cinder => {
            let mut out = BTreeMap::new();
            let mut zones: Option<Vec<String>> = None;
            for (key, value) in &params {
                match key.to_lowercase().as_str() {
                    FSTYPE if plugin != Plugin::AzureDisk => {
                        out.insert(CSI_FSTYPE.to_string(), value.clone());
                    }
                    "zone" if plugin != Plugin::Cinder => zones = Some(vec![value.clone()]),
                    "zones" if plugin != Plugin::Cinder => {
                        zones = Some(value.split(',').map(str::to_string).collect());
                    }
                    "iopspergb" if plugin == Plugin::AwsEbs => {
                        out.insert(key.clone(), value.clone());
                        out.insert("allowautoiopspergbincrease".into(), "true".into());
                    }
                    _ => {
                        out.insert(key.clone(), value.clone());
                    }
                }
            }
            let zone_key = plugin.zone_key().unwrap_or_default();
            class.allowed_topologies = match zones {
                Some(values) => {
                    if class
                        .allowed_topologies
                        .as_ref()
                        .is_some_and(|t| !t.is_empty())
                    {
                        return Err(TranslateError::ZonesAndTopologies);
                    }
                    Some(vec![TopologySelectorTerm {
                        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                            key: zone_key.to_string(),
                            values,
                        }]),
                    }])
                }
                None => rename_zone_keys(class.allowed_topologies.take(), zone_key),
            };
            if plugin == Plugin::AzureDisk {
                blank_numeric_zones(class.allowed_topologies.as_mut(), zone_key);
            }
            class.parameters = Some(out);
        }
        Plugin::AzureFile => {}
        Plugin::VsphereVolume => {
            let mut out = BTreeMap::new();
            for (key, value) in &params {
                let lower = key.to_lowercase();
                if let Some((_, csi_key)) = VSPHERE_KEPT.iter().find(|(k, _)| *k == lower) {
                    out.insert(csi_key.to_string(), value.clone());
                }
            }
            out.insert("csimigration".into(), "true".into());
            class.parameters = Some(out);
            class.allowed_topologies = rename_zone_keys(
                class.allowed_topologies.take(),
                plugin.zone_key().unwrap_or_default(),
            );
        }
        Plugin::Portworx => {
            let mut out = BTreeMap::new();
            for (key, value) in &params {
                let suffix = match key.as_str() {
                    PORTWORX_SECRET_NAME => "-name",
                    PORTWORX_SECRET_NAMESPACE => "-namespace",
                    _ => {
                        out.insert(key.clone(), value.clone());
                        continue;
                    }
                };
                for secret in CSI_SECRETS {
                    out.insert(format!("{secret}{suffix}"), value.clone());
                }
            }
            if !out.is_empty() {
                class.parameters = Some(out);
            }
            class.provisioner = plugin.csi_name().to_string();
        }
    }
    Ok(class)
}

/// `allowedTopologies` with the Kubernetes zone labels (GA and beta) under the driver's key.
fn rename_zone_keys(
    terms: Option<Vec<TopologySelectorTerm>>,
    zone_key: &str,
) -> Option<Vec<TopologySelectorTerm>> {
    let mut terms = terms?;
    for requirement in terms
        .iter_mut()
        .flat_map(|t| t.match_label_expressions.iter_mut().flatten())
    {
        if requirement.key == GA_ZONE || requirement.key == BETA_ZONE {
            requirement.key = zone_key.to_string();
        }
    }
    Some(terms)
}

/// Azure's non-zoned regions: an all-digit zone value under its key is the empty zone.
fn blank_numeric_zones(terms: Option<&mut Vec<TopologySelectorTerm>>, zone_key: &str) {
    for requirement in terms
        .into_iter()
        .flatten()
        .flat_map(|t| t.match_label_expressions.iter_mut().flatten())
        .filter(|r| r.key == zone_key)
    {
        for value in &mut requirement.values {
            if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                value.clear();
            }
        }
    }
}
