//! Changing a volume after it is made: `expansion` (a claim's request grown, with a Pod using
//! it and without, through the resizer's ControllerExpandVolume and the node's
//! NodeExpandVolume) and `modify` (a claim moved to a VolumeAttributesClass of the given
//! parameters, through ControllerModifyVolume).

use csi::node_service_capability::rpc::Type as NodeRpc;
use csi::plugin_capability::volume_expansion::Type as Expansion;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use sidecar_kit::quantity::{format_binary_si, parse_bytes};

use super::{Checked, Done, FILE, Rpc, World};

/// The VolumeAttributesClass `modify` makes.
const VAC: &str = "conf-vac";

impl World {
    /// The plugin's VolumeExpansion capabilities (ONLINE, OFFLINE).
    async fn expansion_modes(&self) -> Result<Vec<Expansion>, String> {
        let mut identity =
            csi::identity_client::IdentityClient::new(self.channel(&self.socket).await?);
        let answer = identity
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
            .await
            .map_err(|s| format!("GetPluginCapabilities: {s}"))?
            .into_inner();
        Ok(answer
            .capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(csi::plugin_capability::Type::VolumeExpansion(e)) => {
                    Expansion::try_from(e.r#type).ok()
                }
                _ => None,
            })
            .collect())
    }

    /// Grows claim `name` to `to` and waits until its status records the new capacity; with
    /// `pending_pod` (Pod, claim), that Pod is made once the node's part is pending (an
    /// offline expansion finishes when a Pod mounts the volume). A size the driver refused
    /// for good fails the wait; a retried error shows in what the wait waits for.
    async fn grow(&self, name: &str, to: i64, pending_pod: Option<(&str, &str)>) -> Checked {
        let patch = json!({"spec": {"resources": {"requests": {"storage": format_binary_si(to)}}}});
        self.claims()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("grow claim {name}: {e}"))?;
        let mut pod_started = false;
        let claims = self.claims();
        loop {
            let claim = claims
                .get(name)
                .await
                .map_err(|e| format!("read claim {name}: {e}"))?;
            if let Some(error) = resize_error(&claim) {
                return Err(format!("claim {name}: {error}"));
            }
            if capacity(&claim) >= to {
                return Ok(());
            }
            let node_pending = claim
                .status
                .as_ref()
                .and_then(|s| s.allocated_resource_statuses.as_ref())
                .and_then(|s| s.get("storage"))
                .is_some_and(|s| s == "NodeResizePending");
            if let (true, false, Some((pod, claim_name))) = (node_pending, pod_started, pending_pod)
            {
                // Offline: the node's part happens when a Pod mounts the volume.
                self.pod(pod, claim_name).await?;
                pod_started = true;
            }
            let state = claim
                .status
                .as_ref()
                .and_then(|s| s.allocated_resource_statuses.as_ref())
                .and_then(|s| s.get("storage"))
                .map_or("no resize status", String::as_str);
            let errors: Vec<String> = ["ControllerResizeError", "NodeResizeError"]
                .iter()
                .filter_map(|kind| condition_message(&claim, kind).map(|m| format!("{kind}: {m}")))
                .collect();
            *self.waiting.lock() = format!(
                "claim {name}'s capacity {} ({state}{}{})",
                format_binary_si(to),
                if errors.is_empty() { "" } else { "; " },
                errors.join("; ")
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// `expansion`: a claim in use by a running Pod grown (online, unless the plugin says
    /// OFFLINE only), and one in use by none grown (offline), each to twice the volume size; the claim's capacity, the PV's and the file
    /// written before must follow. Declined when neither the controller nor the node expands.
    pub(super) async fn expansion(&mut self) -> Result<Done, String> {
        let mut node = csi::node_client::NodeClient::new(self.channel(&self.node_socket).await?);
        let node_expands = self
            .node_rpcs(&mut node)
            .await?
            .contains(&NodeRpc::ExpandVolume);
        let controller_expands = self.info.has(Rpc::ExpandVolume);
        if !(controller_expands || node_expands) {
            return Ok(Done::Declined(
                "the driver advertises neither EXPAND_VOLUME (controller) nor EXPAND_VOLUME (node)"
                    .into(),
            ));
        }
        // ONLINE: volumes may also grow while published (CSI spec, VolumeExpansion); OFFLINE
        // only: never while published. Growing an unpublished volume is always allowed.
        let modes = self.expansion_modes().await?;
        let online = modes.is_empty() || modes.contains(&Expansion::Online);
        let size =
            parse_bytes(&self.size).map_err(|e| format!("--volume-size {}: {e}", self.size))?;
        let to = size.saturating_mul(2);
        let mut done = Vec::new();
        if online {
            let (claim, pod) = ("conf-grow-online", "conf-grow-online-pod");
            self.claim(claim, None).await?;
            self.bound(claim).await?;
            self.pod(pod, claim).await?;
            let dir = self.published(pod, claim).await?;
            std::fs::write(dir.join(FILE), &self.content)
                .map_err(|e| format!("write {}: {e}", dir.join(FILE).display()))?;
            self.grow(claim, to, None).await?;
            self.grown_volume(claim, to).await?;
            let read = std::fs::read_to_string(dir.join(FILE)).map_err(|e| {
                format!("read {} after the expansion: {e}", dir.join(FILE).display())
            })?;
            if read != self.content {
                return Err(format!(
                    "{FILE} changed with the online expansion: {read:?}"
                ));
            }
            self.delete_pod(pod).await?;
            done.push("online (in use by a running Pod)");
        }
        {
            let (claim, pod) = ("conf-grow-offline", "conf-grow-offline-pod");
            self.claim(claim, None).await?;
            self.bound(claim).await?;
            self.touched
                .lock()
                .extend([claim.to_string(), pod.to_string()]);
            self.grow(claim, to, Some((pod, claim))).await?;
            self.grown_volume(claim, to).await?;
            if self.pods().get_opt(pod).await.ok().flatten().is_some() {
                self.published(pod, claim).await?;
                self.delete_pod(pod).await?;
                done.push("offline (the node's part when a Pod mounted it)");
            } else {
                done.push("offline (no node part needed)");
            }
        }
        let parts = if controller_expands {
            "ControllerExpandVolume"
        } else {
            "no controller part"
        };
        let node_part = if node_expands {
            ", NodeExpandVolume"
        } else {
            ""
        };
        Ok(Done::Passed(format!(
            "{} to {}: {} ({parts}{node_part})",
            self.size,
            format_binary_si(to),
            done.join("; ")
        )))
    }

    /// The claim's PV has at least `to` bytes.
    async fn grown_volume(&self, claim: &str, to: i64) -> Checked {
        let volume = self
            .claims()
            .get(claim)
            .await
            .ok()
            .and_then(|c| c.spec?.volume_name)
            .ok_or_else(|| format!("claim {claim} has no volume"))?;
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get(&volume)
            .await
            .map_err(|e| format!("read volume {volume}: {e}"))?;
        let size = pv
            .spec
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").cloned())
            .and_then(|q| parse_bytes(&q.0).ok())
            .unwrap_or(0);
        if size < to {
            return Err(format!(
                "volume {volume} has {}, the claim records {}",
                format_binary_si(size),
                format_binary_si(to)
            ));
        }
        Ok(())
    }

    /// `modify`: a VolumeAttributesClass of the `--modify-parameter`s made, and a Bound claim
    /// moved to it: the claim's current class and its PV's become that class. Declined without
    /// parameters (which keys a driver accepts is its own business).
    pub(super) async fn modify(&mut self) -> Result<Done, String> {
        if self.modify_parameters.is_empty() {
            return Ok(Done::Declined(
                "no --modify-parameter given: the check needs a mutable parameter the driver accepts"
                    .into(),
            ));
        }
        let classes: Api<VolumeAttributesClass> = Api::all(self.client.clone());
        self.create(
            &classes,
            json!({
                "metadata": {"name": VAC},
                "driverName": self.driver,
                "parameters": self.modify_parameters,
            }),
        )
        .await?;
        let claim = "conf-modify";
        self.claim(claim, None).await?;
        let pv = self.bound(claim).await?;
        let patch = json!({"spec": {"volumeAttributesClassName": VAC}});
        self.claims()
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("name class {VAC} on claim {claim}: {e}"))?;
        let claims = self.claims();
        let outcome = self
            .until(&format!("claim {claim}'s current class {VAC}"), || async {
                let c = claims.get(claim).await.ok()?;
                let status = c.status.as_ref()?;
                if status.current_volume_attributes_class_name.as_deref() == Some(VAC) {
                    return Some(Ok(()));
                }
                let refused = status
                    .modify_volume_status
                    .as_ref()
                    .is_some_and(|m| m.status == "Infeasible");
                refused.then(|| {
                    Err(format!(
                        "the driver refused the class for good: {}",
                        condition_message(&c, "ModifyVolumeError").unwrap_or_default()
                    ))
                })
            })
            .await?;
        outcome?;
        let name = pv.metadata.name.clone().unwrap_or_default();
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get(&name)
            .await
            .map_err(|e| format!("read volume {name}: {e}"))?;
        let recorded = pv.spec.and_then(|s| s.volume_attributes_class_name);
        if recorded.as_deref() != Some(VAC) {
            return Err(format!(
                "volume {name} records class {recorded:?}, not {VAC:?}"
            ));
        }
        let keys: Vec<&str> = self.modify_parameters.keys().map(String::as_str).collect();
        Ok(Done::Passed(format!("parameters {}", keys.join(", "))))
    }
}

/// The claim's recorded capacity in bytes (0 without one).
fn capacity(claim: &PersistentVolumeClaim) -> i64 {
    claim
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| parse_bytes(&q.0).ok())
        .unwrap_or(0)
}

/// The message of a condition of `kind` on the claim.
fn condition_message(claim: &PersistentVolumeClaim, kind: &str) -> Option<String> {
    claim
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.message.clone().unwrap_or_default())
}

/// Why an expansion failed for good: the driver refused the size (ControllerResizeInfeasible,
/// NodeResizeInfeasible), with its error condition's message.
fn resize_error(claim: &PersistentVolumeClaim) -> Option<String> {
    let status = claim
        .status
        .as_ref()?
        .allocated_resource_statuses
        .as_ref()?
        .get("storage")?;
    let condition = match status.as_str() {
        "ControllerResizeInfeasible" => "ControllerResizeError",
        "NodeResizeInfeasible" => "NodeResizeError",
        _ => return None,
    };
    Some(format!(
        "{status}: {}",
        condition_message(claim, condition).unwrap_or_default()
    ))
}
