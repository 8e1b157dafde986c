//! The topology of a claim's CreateVolume: the selected node's and the cluster's segments,
//! read from the Node and CSINode caches, computed once per claim and node so that retries
//! send identical requests.

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::runtime::reflector::{ObjectRef, Store};

use super::claims::ClaimError;
use super::topology_cache::TopologyCache;
use super::{ClaimKey, ControllerConfig};
use crate::decide::topology::{
    NodeTopology, Requirement, TopologyInput, accessibility_requirements,
};

/// The claims' topology requirements and what they are computed from.
pub(crate) struct ClaimTopology {
    /// The Topology gate is on and the driver reports accessibility.
    enabled: bool,
    /// `--strict-topology`.
    strict: bool,
    /// `--immediate-topology`.
    immediate: bool,
    /// The driver's name (its entry in each CSINode).
    driver: String,
    pub(crate) csinodes: Store<CSINode>,
    pub(crate) nodes: Store<Node>,
    /// The requirement computed per claim in progress.
    chosen: TopologyCache,
}

impl ClaimTopology {
    pub(crate) fn new(
        cfg: &ControllerConfig,
        csinodes: Store<CSINode>,
        nodes: Store<Node>,
    ) -> Self {
        ClaimTopology {
            enabled: cfg.options.topology && cfg.caps.accessibility,
            strict: cfg.strict_topology,
            immediate: cfg.immediate_topology,
            driver: cfg.caps.name.clone(),
            csinodes,
            nodes,
            chosen: TopologyCache::default(),
        }
    }

    /// Whether CreateVolume carries a topology requirement at all.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// The claim is provisioned or gone, or its CreateVolume failed for good or was sent back
    /// to the scheduler: its requirement is dropped.
    pub(crate) fn forget(&self, key: &ClaimKey) {
        self.chosen.forget(key);
    }

    /// The selected node's topology; a Node not (yet) known has no labels, as upstream's
    /// lookup, which then fails on the first key it misses.
    fn node(&self, name: &str) -> NodeTopology {
        match self.nodes.get(&ObjectRef::new(name)) {
            Some(node) => self.of(&node),
            None => NodeTopology {
                name: name.to_string(),
                keys: self.keys(name),
                labels: Default::default(),
            },
        }
    }

    fn of(&self, node: &Node) -> NodeTopology {
        let name = node.metadata.name.clone().unwrap_or_default();
        NodeTopology {
            keys: self.keys(&name),
            name,
            labels: node.metadata.labels.clone().unwrap_or_default(),
        }
    }

    /// The topology keys the node's CSINode lists for the driver; None when it does not list
    /// the driver.
    fn keys(&self, node: &str) -> Option<Vec<String>> {
        self.csinodes
            .get(&ObjectRef::new(node))
            .and_then(|csinode| {
                crate::decide::topology::driver_topology_keys(&csinode, &self.driver)
            })
    }

    /// The claim's requirement for this selected node (or none): computed the first time,
    /// then the same answer until the claim's UID or its node changes.
    pub(crate) fn for_claim(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        selected: Option<&str>,
    ) -> Result<Option<Requirement>, ClaimError> {
        if !self.enabled {
            return Ok(None);
        }
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let selected_name = selected.unwrap_or("").to_string();
        let cache_key = super::claim_key(claim);
        if let Some(cached) = self.chosen.get(&cache_key, &uid, &selected_name) {
            return Ok(cached);
        }
        // As upstream: no CSINode for the selected node (the node is gone, or its CSINode is
        // not made yet) sends the claim back to the scheduler.
        if let Some(name) = selected
            && self.csinodes.get(&ObjectRef::new(name)).is_none()
        {
            return Err(ClaimError::SelectedCsiNodeGone(name.to_string()));
        }
        let selected_topology = selected.map(|name| self.node(name));
        let cluster: Vec<NodeTopology> = self.nodes.state().iter().map(|n| self.of(n)).collect();
        let allowed = class.allowed_topologies.clone().unwrap_or_default();
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        let requirement = accessibility_requirements(&TopologyInput {
            selected: selected_topology.as_ref(),
            strict: self.strict,
            immediate_topology: self.immediate,
            allowed: &allowed,
            cluster: &cluster,
            claim_name: &claim_name,
        })?;
        self.chosen
            .insert(cache_key, &uid, &selected_name, requirement.clone());
        Ok(requirement)
    }
}
