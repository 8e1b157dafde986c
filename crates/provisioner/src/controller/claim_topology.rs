//! The topology of a claim's CreateVolume (the selected node's and the cluster's segments,
//! computed once per claim and node), and telling the capacity controller which segments a
//! refused CreateVolume made stale.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::ObjectRef;

use super::Provisioner;
use super::claims::ClaimError;
use crate::decide::topology::{
    NodeTopology, Requirement, TopologyInput, accessibility_requirements,
};

impl Provisioner {
    /// A CreateVolume refused for good (often RESOURCE_EXHAUSTED): the published capacity of
    /// the segment asked for first (of every segment of the class without topology) is stale.
    pub(crate) fn capacity_changed(&self, class: &str, topology: Option<&Requirement>) {
        let Some(capacity) = &self.capacity else {
            return;
        };
        let first = topology
            .and_then(|(requisite, preferred)| preferred.first().or(requisite.first()).cloned());
        capacity.refresh(class, first);
    }

    fn node_topology(&self, name: &str) -> Option<NodeTopology> {
        let node = self.caches.nodes.get(&ObjectRef::new(name))?;
        Some(self.topology_of(&node))
    }

    fn topology_of(&self, node: &k8s_openapi::api::core::v1::Node) -> NodeTopology {
        let name = node.metadata.name.clone().unwrap_or_default();
        let keys = self
            .caches
            .csinodes
            .get(&ObjectRef::new(&name))
            .and_then(|csinode| {
                csinode
                    .spec
                    .drivers
                    .iter()
                    .find(|d| d.name == self.cfg.caps.name)
                    .map(|d| d.topology_keys.clone().unwrap_or_default())
            });
        NodeTopology {
            name,
            keys,
            labels: node.metadata.labels.clone().unwrap_or_default(),
        }
    }

    pub(crate) fn topology_for(
        &self,
        claim: &PersistentVolumeClaim,
        class: &k8s_openapi::api::storage::v1::StorageClass,
        selected: Option<&str>,
    ) -> Result<Option<Requirement>, ClaimError> {
        if !(self.cfg.topology && self.cfg.caps.accessibility) {
            return Ok(None);
        }
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let selected_name = selected.unwrap_or("").to_string();
        let cache_key = super::claim_key(claim);
        if let Some(cached) = self.topology.get(&cache_key, &uid, &selected_name) {
            return Ok(cached);
        }
        let selected_topology = match selected {
            Some(name) => Some(
                self.node_topology(name)
                    .ok_or_else(|| ClaimError::NodeNotFound(name.to_string()))?,
            ),
            None => None,
        };
        let cluster: Vec<NodeTopology> = self
            .caches
            .nodes
            .state()
            .iter()
            .map(|n| self.topology_of(n))
            .collect();
        let allowed = class.allowed_topologies.clone().unwrap_or_default();
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let requirement = accessibility_requirements(&TopologyInput {
            selected: selected_topology.as_ref(),
            strict: self.cfg.strict_topology,
            immediate_topology: self.cfg.immediate_topology,
            allowed: &allowed,
            cluster: &cluster,
            claim_name: &claim_name,
        })?;
        self.topology
            .insert(cache_key, &uid, &selected_name, requirement.clone());
        Ok(requirement)
    }
}
