//! Zones and regions of migrated PVs: in-tree volumes say where they are with the Kubernetes
//! zone and region labels (on the PV and in its node affinity), CSI volumes with the driver's
//! topology key in the node affinity.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, VolumeNodeAffinity,
};

/// The GA zone label.
pub(super) const GA_ZONE: &str = "topology.kubernetes.io/zone";
/// The GA region label.
pub(super) const GA_REGION: &str = "topology.kubernetes.io/region";
/// The beta zone label.
pub(super) const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// The beta region label.
pub(super) const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Several zones in one label value.
const ZONES_SEPARATOR: &str = "__";

/// A region from a set of zones (the plugin's naming of zones), or why not.
pub(super) type RegionOf = fn(&[String]) -> Result<String, String>;

fn requirements(pv: &PersistentVolume) -> impl Iterator<Item = &NodeSelectorRequirement> {
    pv.spec
        .iter()
        .filter_map(|s| s.node_affinity.as_ref())
        .filter_map(|a| a.required.as_ref())
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
}

fn requirements_mut(
    pv: &mut PersistentVolume,
) -> impl Iterator<Item = &mut NodeSelectorRequirement> {
    pv.spec
        .iter_mut()
        .filter_map(|s| s.node_affinity.as_mut())
        .filter_map(|a| a.required.as_mut())
        .flat_map(|r| r.node_selector_terms.iter_mut())
        .flat_map(|t| t.match_expressions.iter_mut().flatten())
}

/// Whether the node affinity has a requirement on `key` with values.
fn affinity_has(pv: &PersistentVolume, key: &str) -> bool {
    requirements(pv).any(|r| r.key == key && r.values.as_ref().is_some_and(|v| !v.is_empty()))
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn rename(pv: &mut PersistentVolume, from: &str, to: &str) {
    for requirement in requirements_mut(pv).filter(|r| r.key == from) {
        requirement.key = to.to_string();
    }
}

/// The zone and region labels the PV speaks: GA, unless only the beta ones are used (in its
/// node affinity first, then its labels).
fn flavour(pv: &PersistentVolume) -> (&'static str, &'static str) {
    if affinity_has(pv, GA_ZONE) {
        (GA_ZONE, GA_REGION)
    } else if affinity_has(pv, BETA_ZONE) {
        (BETA_ZONE, BETA_REGION)
    } else if label(pv, GA_ZONE).is_some() {
        (GA_ZONE, GA_REGION)
    } else if label(pv, BETA_ZONE).is_some() {
        (BETA_ZONE, BETA_REGION)
    } else {
        (GA_ZONE, GA_REGION)
    }
}

/// Appends `requirement` to every required term (making one when there is none).
fn require_everywhere(pv: &mut PersistentVolume, requirement: NodeSelectorRequirement) {
    let Some(spec) = pv.spec.as_mut() else {
        return;
    };
    let affinity = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
}

fn requirement_in(key: &str, values: Vec<String>) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".into(),
        values: Some(values),
    }
}

/// In-tree → CSI for the plugins with a zone key (EBS, GCE PD, Cinder): the zone requirement
/// under the driver's key (from the node affinity, else from the zone label, split on `__`),
/// and a beta region requirement under the GA label.
pub(super) fn to_csi(pv: &mut PersistentVolume, csi_zone: &str) {
    let (zone, region) = flavour(pv);
    if affinity_has(pv, zone) {
        rename(pv, zone, csi_zone);
    } else if let Some(value) = label(pv, zone) {
        let zones: BTreeSet<String> = value
            .split(ZONES_SEPARATOR)
            .map(|z| z.trim().to_string())
            .filter(|z| !z.is_empty())
            .collect();
        if !zones.is_empty() {
            require_everywhere(pv, requirement_in(csi_zone, zones.into_iter().collect()));
        }
    }
    if region == BETA_REGION && affinity_has(pv, BETA_REGION) {
        rename(pv, BETA_REGION, GA_REGION);
    }
}

/// CSI → in-tree for the plugins with a zone key: the driver's key back to the zone label, a
/// region requirement per term from its zones (when the plugin names regions), and the zone
/// and region labels when the PV has none.
pub(super) fn to_in_tree(
    pv: &mut PersistentVolume,
    csi_zone: &str,
    region_of: Option<RegionOf>,
) -> Result<(), String> {
    let (zone, region) = flavour(pv);
    rename(pv, csi_zone, zone);
    let mut regions = BTreeSet::new();
    if let Some(region_of) = region_of
        && let Some(terms) = pv
            .spec
            .as_mut()
            .and_then(|s| s.node_affinity.as_mut())
            .and_then(|a| a.required.as_mut())
            .map(|r| &mut r.node_selector_terms)
    {
        for term in terms.iter_mut() {
            let expressions = term.match_expressions.get_or_insert_with(Vec::new);
            if expressions.iter().any(|r| r.key == region) {
                continue;
            }
            let zones: Vec<String> = expressions
                .iter()
                .filter(|r| r.key == zone)
                .flat_map(|r| r.values.iter().flatten().cloned())
                .collect();
            if zones.is_empty() {
                continue;
            }
            let name = region_of(&zones)?;
            regions.insert(name.clone());
            expressions.push(requirement_in(region, vec![name]));
        }
    }
    let labels = pv.metadata.labels.get_or_insert_with(Default::default);
    if regions.len() == 1 && !labels.contains_key(region) {
        labels.extend(regions.into_iter().map(|r| (region.to_string(), r)));
    }
    let zones: BTreeSet<String> = requirements(pv)
        .filter(|r| r.key == zone)
        .flat_map(|r| r.values.iter().flatten().cloned())
        .collect();
    let labels = pv.metadata.labels.get_or_insert_with(Default::default);
    if !zones.is_empty() && !labels.contains_key(zone) {
        let joined: Vec<String> = zones.into_iter().collect();
        labels.insert(zone.to_string(), joined.join(ZONES_SEPARATOR));
    }
    if labels.is_empty() {
        pv.metadata.labels = None;
    }
    Ok(())
}

/// vSphere in-tree → CSI: zone and region under the driver's keys, from the node affinity or
/// else from the whole label value (never split).
pub(super) fn vsphere_to_csi(pv: &mut PersistentVolume, csi_zone: &str, csi_region: &str) {
    let (zone, region) = flavour(pv);
    for (label_key, csi_key) in [(zone, csi_zone), (region, csi_region)] {
        if affinity_has(pv, label_key) {
            rename(pv, label_key, csi_key);
        } else if let Some(value) = label(pv, label_key).map(str::to_string) {
            require_everywhere(pv, requirement_in(csi_key, vec![value]));
        }
    }
}

/// vSphere CSI → in-tree: the driver's keys back to the labels, and a missing zone or region
/// label set to the first value.
pub(super) fn vsphere_to_in_tree(pv: &mut PersistentVolume, csi_zone: &str, csi_region: &str) {
    let (zone, region) = flavour(pv);
    for (csi_key, label_key) in [(csi_zone, zone), (csi_region, region)] {
        rename(pv, csi_key, label_key);
        let first = requirements(pv)
            .filter(|r| r.key == label_key)
            .find_map(|r| r.values.as_ref().and_then(|v| v.first().cloned()));
        if let Some(first) = first {
            pv.metadata
                .labels
                .get_or_insert_with(Default::default)
                .entry(label_key.to_string())
                .or_insert(first);
        }
    }
}

/// GCE's region of zones `<locale>-<region>-<zone>`: exactly one.
pub(super) fn gce_region(zones: &[String]) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".into());
    }
    let mut regions = BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ));
        }
        regions.insert(format!("{}-{}", parts[0], parts[1]));
    }
    single(regions, zones)
}

/// AWS's region of zones (`us-west-2a`, `us-west-2-lax-1a`, local and wavelength zones):
/// exactly one.
pub(super) fn aws_region(zones: &[String]) -> Result<String, String> {
    let mut regions = BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        let region = match parts.len() {
            3 | 4 if parts.last().is_some_and(|p| p.len() == 2) => {
                let mut region = zone.clone();
                region.pop();
                region
            }
            5 | 7 => parts[..3].join("-"),
            _ => {
                return Err(format!(
                    "Unexpected zone format: {zone} is not a valid AWS zone"
                ));
            }
        };
        regions.insert(region);
    }
    single(regions, zones)
}

fn single(regions: BTreeSet<String>, zones: &[String]) -> Result<String, String> {
    if regions.len() != 1 {
        return Err(format!(
            "multiple or no regions gotten from zones, got: {zones:?}"
        ));
    }
    Ok(regions.into_iter().next().unwrap_or_default())
}
