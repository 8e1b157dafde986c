//! Where volumes live: WaitForFirstConsumer provisioning on the node the scheduler picked, the
//! volume's topology matching that node, and capacity published by GetCapacity and used by the
//! scheduler to turn away a claim no node has room for.

use csi_proto::v1::plugin_capability::service::Type as Service;
use k8s_openapi::api::core::v1::{Event, Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ListParams};
use serde_json::json;

use super::{Done, NS, World};

/// The WaitForFirstConsumer class the checks make, a copy of the driver's class otherwise.
const LATE_CLASS: &str = "conf-late";

impl World {
    async fn late_class(&self) -> Result<(), String> {
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let class = json!({
            "metadata": {"name": LATE_CLASS},
            "provisioner": self.driver,
            "parameters": self.parameters,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
        });
        self.create(&classes, class).await
    }

    /// With WaitForFirstConsumer the volume is made once a Pod is scheduled, on that Pod's
    /// node: the PV's node affinity holds the node's topology labels.
    pub(super) async fn late_binding(&mut self) -> Result<Done, String> {
        if !self.info.serves(Service::VolumeAccessibilityConstraints) {
            return Ok(Done::Declined(
                "the driver does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS".into(),
            ));
        }
        self.late_class().await?;
        let claim = self.claim_json("conf-late", json!({"storageClassName": LATE_CLASS}));
        self.create(&self.claims(), claim).await?;
        self.pod("conf-late-user", "conf-late").await?;
        let pv: PersistentVolume = self.bound("conf-late").await?;
        // The Pod is bound to its node after its claim is: wait for that too.
        let node_name = self
            .until("Pod conf-late-user bound to a node", || async {
                self.pods()
                    .get_opt("conf-late-user")
                    .await
                    .ok()??
                    .spec?
                    .node_name
            })
            .await?;
        let node = Api::<Node>::all(self.client.clone())
            .get(&node_name)
            .await
            .map_err(|e| format!("read node {node_name}: {e}"))?;
        let labels = node.metadata.labels.unwrap_or_default();
        let affinity = pv.spec.and_then(|s| s.node_affinity);
        if affinity
            .as_ref()
            .and_then(|a| a.required.as_ref())
            .is_none()
        {
            return Err("the volume has no node affinity: its topology is unknown".into());
        }
        if !sidecar_kit::selectors::affinity_allows(affinity.as_ref(), &labels) {
            return Err(format!(
                "the volume's node affinity {affinity:?} does not select {node_name} (labels {labels:?})"
            ));
        }
        self.delete_pod("conf-late-user").await?;
        Ok(Done::Passed(format!("provisioned on {node_name}")))
    }

    /// CSIStorageCapacity objects are published for a WaitForFirstConsumer class from
    /// GetCapacity, and a Pod whose claim is larger than any of them is not scheduled.
    pub(super) async fn capacity(&mut self) -> Result<Done, String> {
        self.late_class().await?;
        let capacities: Api<CSIStorageCapacity> = Api::all(self.client.clone());
        let published = self
            .until(
                &format!("CSIStorageCapacity objects for class {LATE_CLASS}"),
                || async {
                    let list = capacities.list(&ListParams::default()).await.ok()?;
                    let ours: Vec<CSIStorageCapacity> = list
                        .items
                        .into_iter()
                        .filter(|c| c.storage_class_name == LATE_CLASS)
                        .collect();
                    (!ours.is_empty()).then_some(ours)
                },
            )
            .await?;
        let largest = published
            .iter()
            .filter_map(|c| c.maximum_volume_size.as_ref().or(c.capacity.as_ref()))
            .map(|q| sidecar_kit::quantity::parse_bytes(&q.0).unwrap_or(0))
            .max()
            .unwrap_or(0);
        // Twice the largest, and at least 1 GiB: more than any node has.
        let request = (largest.max(1 << 29) as i128 * 2).to_string();
        let claim = self.claim_json(
            "conf-huge",
            json!({"storageClassName": LATE_CLASS,
                   "resources": {"requests": {"storage": Quantity(request.clone())}}}),
        );
        self.create(&self.claims(), claim).await?;
        self.pod("conf-huge-user", "conf-huge").await?;
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        self.until("the scheduler to find no node with room", || async {
            let list = events
                .list(
                    &ListParams::default()
                        .fields("involvedObject.name=conf-huge-user,reason=FailedScheduling"),
                )
                .await
                .ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("did not have enough free storage"))
                })
                .then_some(())
        })
        .await?;
        self.delete_pod("conf-huge-user").await?;
        self.delete_claim("conf-huge").await?;
        Ok(Done::Passed(format!(
            "{} object(s) for {LATE_CLASS}; a claim of {request} bytes turned away",
            published.len()
        )))
    }
}
