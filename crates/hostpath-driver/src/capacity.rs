//! GetCapacity: the free space of a kind of volume (`--capacity`) over the nodes a topology
//! segment names.

use csi_proto::v1 as csi;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::plan;

impl Driver {
    /// GetCapacity: what the kind of volume named by the parameters has free on the nodes
    /// the topology names (all of them without one), summed, and the largest free on one.
    pub(crate) fn capacity(
        &self,
        req: &csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse> {
        if self.cfg.capacity.is_empty() {
            return Err(Error::NotServed(
                "GetCapacity (start the driver with --capacity)",
            ));
        }
        for cap in &req.volume_capabilities {
            plan::check_capability(&self.cfg, cap)?;
        }
        for key in req.parameters.keys() {
            if key != plan::KIND_PARAMETER && !plan::METADATA_PARAMETERS.contains(&key.as_str()) {
                return Err(Error::UnknownParameter(key.clone()));
            }
        }
        let kind = req
            .parameters
            .get(plan::KIND_PARAMETER)
            .cloned()
            .unwrap_or_default();
        let Some(total) = self.cfg.capacity.get(&kind).copied() else {
            let known: Vec<String> = self.cfg.capacity.keys().map(|k| format!("{k:?}")).collect();
            return Err(Error::UnknownKind {
                kind,
                known: known.join(", "),
            });
        };
        let nodes: Vec<Option<&str>> = match (&req.accessible_topology, &self.cfg.topology_key) {
            (None, None) => vec![None],
            (Some(_), None) => {
                return Err(Error::InvalidTopology(
                    "topology is disabled in this driver".into(),
                ));
            }
            (None, Some(_)) => self.cfg.nodes.iter().map(|n| Some(n.id.as_str())).collect(),
            (Some(topology), Some(key)) => {
                if let Some(other) = topology.segments.keys().find(|k| *k != key) {
                    return Err(Error::InvalidTopology(format!(
                        "unknown topology key {other:?}, expected {key:?}"
                    )));
                }
                match topology.segments.get(key) {
                    None => self.cfg.nodes.iter().map(|n| Some(n.id.as_str())).collect(),
                    Some(value) => self
                        .cfg
                        .nodes
                        .iter()
                        .filter(|n| &n.topology_value == value)
                        .map(|n| Some(n.id.as_str()))
                        .collect(),
                }
            }
        };
        let (free, _) = self.store.read(|table| {
            nodes
                .iter()
                .map(|node| (total - table.used(&kind, *node)).max(0))
                .collect::<Vec<i64>>()
        });
        let available = free.iter().fold(0i64, |sum, f| sum.saturating_add(*f));
        let largest = free.iter().copied().max().unwrap_or(0);
        let maximum = match self.cfg.max_volume_size {
            Some(max) => largest.min(max),
            None => largest,
        };
        Ok(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(maximum),
            minimum_volume_size: None,
        })
    }
}
