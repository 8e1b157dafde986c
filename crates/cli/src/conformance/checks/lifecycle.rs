//! The volume's lifecycle: provisioned, attached, published into a Pod with a file written,
//! read back after a re-publish, snapshotted and restored, cloned, and deleted with nothing
//! left at the driver.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use stack::snapshots::types::VolumeSnapshot;

use super::{Checked, FILE, NS, Rpc, World};

impl World {
    pub(super) async fn provision(&mut self) -> Checked {
        self.claim("conf-data", None).await?;
        let pv = self.bound("conf-data").await?;
        if self.info.has(Rpc::ListVolumes) {
            let handle = pv
                .spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .unwrap_or_default();
            if !self.driver_volumes().await?.contains(&handle) {
                return Err(format!("ListVolumes does not list {handle:?}"));
            }
        }
        Ok(())
    }

    pub(super) async fn attach(&mut self) -> Checked {
        self.pod("conf-writer", "conf-data").await?;
        let pv = self
            .claims()
            .get("conf-data")
            .await
            .ok()
            .and_then(|c| c.spec?.volume_name)
            .ok_or("claim conf-data has no volume")?;
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        self.until(&format!("a VolumeAttachment of {pv} attached"), || async {
            let list = api.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|va| {
                    va.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str())
                        && va.spec.attacher == self.driver
                        && va.status.as_ref().is_some_and(|s| s.attached)
                })
                .then_some(())
        })
        .await
    }

    pub(super) async fn publish(&mut self) -> Checked {
        self.pod("conf-writer", "conf-data").await?;
        let dir = self.published("conf-writer", "conf-data").await?;
        std::fs::write(dir.join(FILE), &self.content)
            .map_err(|e| format!("write {}: {e}", dir.join(FILE).display()))?;
        let read = std::fs::read_to_string(dir.join(FILE))
            .map_err(|e| format!("read {}: {e}", dir.join(FILE).display()))?;
        (read == self.content)
            .then_some(())
            .ok_or_else(|| "the file read back differs from what was written".to_string())
    }

    pub(super) async fn republish(&mut self) -> Checked {
        self.delete_pod("conf-writer").await?;
        self.read_back("conf-reader", "conf-data").await
    }

    pub(super) async fn snapshot(&mut self) -> Checked {
        let snapshots = kube::api::ApiResource::erase::<VolumeSnapshot>(&());
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.client.clone(), NS, &snapshots);
        self.create(
            &api,
            json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "conf-snap"},
                "spec": {"volumeSnapshotClassName": "csi-hostpath-snapclass",
                         "source": {"persistentVolumeClaimName": "conf-data"}},
            }),
        )
        .await?;
        self.until("VolumeSnapshot conf-snap readyToUse", || async {
            let snap = api.get_opt("conf-snap").await.ok()??;
            (snap.data["status"]["readyToUse"] == json!(true)).then_some(())
        })
        .await?;
        self.claim(
            "conf-restore",
            Some(json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "conf-snap"})),
        )
        .await?;
        self.bound("conf-restore").await?;
        self.read_back("conf-restore-reader", "conf-restore").await
    }

    pub(super) async fn clone_volume(&mut self) -> Checked {
        self.claim(
            "conf-clone",
            Some(json!({"kind": "PersistentVolumeClaim", "name": "conf-data"})),
        )
        .await?;
        self.bound("conf-clone").await?;
        self.read_back("conf-clone-reader", "conf-clone").await
    }

    pub(super) async fn delete(&mut self) -> Checked {
        let pods = self
            .pods()
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        for pod in pods.items.iter().filter_map(|p| p.metadata.name.clone()) {
            self.delete_pod(&pod).await?;
        }
        let snapshots = kube::api::ApiResource::erase::<VolumeSnapshot>(&());
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.client.clone(), NS, &snapshots);
        let _ = api.delete("conf-snap", &DeleteParams::default()).await;
        let claims = self
            .claims()
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        for claim in claims.items.iter().filter_map(|c| c.metadata.name.clone()) {
            if let Err(error) = self.claims().delete(&claim, &DeleteParams::default()).await
                && !sidecar_kit::api_errors::is_not_found(&error)
            {
                return Err(format!("delete claim {claim}: {error}"));
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        self.until("every PV deleted", || async {
            pvs.list(&Default::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        })
        .await?;
        self.until("the snapshot deleted", || async {
            matches!(api.get_opt("conf-snap").await, Ok(None)).then_some(())
        })
        .await?;
        if self.info.has(Rpc::ListVolumes) {
            let left: Vec<String> = self
                .driver_volumes()
                .await?
                .into_iter()
                .filter(|v| self.handles.contains(v))
                .collect();
            if !left.is_empty() {
                return Err(format!("the driver still lists {left:?}"));
            }
        }
        Ok(())
    }
}
