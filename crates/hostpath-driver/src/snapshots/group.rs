//! The CSI GroupController service: snapshots of several volumes at once. The members are
//! copied first, then the members and the group are logged in one critical section, members
//! first; a crash between their records leaves members without their group, which the next
//! start drops (`Table::drop_incomplete_groups`), so a group is never half there.

use csi::group_controller_server::GroupController;
use csi::group_controller_service_capability::rpc::Type as GroupRpc;
use csi_proto::v1 as csi;
use tonic::{Request, Response, Status};

use super::plan::{self, Plan};
use crate::driver::{Driver, now_ms};
use crate::error::{Error, Result};
use crate::features::served;
use crate::state::Change;

type Reply<T> = std::result::Result<Response<T>, Status>;

async fn create_group(
    driver: &Driver,
    req: csi::CreateVolumeGroupSnapshotRequest,
) -> Result<csi::CreateVolumeGroupSnapshotResponse> {
    served(
        driver.cfg.features.group_snapshots,
        "CreateVolumeGroupSnapshot",
    )?;
    let _name = driver.creating.lock(&format!("group/{}", req.name)).await;
    let (planned, seq) = driver
        .store
        .read(|table| plan::plan_group(table, &req, || uuid::Uuid::new_v4().to_string(), now_ms()));
    let (group, members) = match planned? {
        Plan::Existing(found) => {
            driver.store.wait_durable(seq).await?;
            found
        }
        Plan::New((group, members)) => {
            let seq = super::store_copies(driver, &members, vec![Change::PutGroup(group.clone())])
                .await?;
            driver.store.wait_durable(seq).await?;
            tracing::info!(name = %group.name, group_snapshot_id = %group.id, volumes = members.len(), "group snapshot created");
            (group, members)
        }
    };
    Ok(csi::CreateVolumeGroupSnapshotResponse {
        group_snapshot: Some(plan::to_csi_group(&group, &members)),
    })
}

async fn delete_group(
    driver: &Driver,
    req: csi::DeleteVolumeGroupSnapshotRequest,
) -> Result<csi::DeleteVolumeGroupSnapshotResponse> {
    served(
        driver.cfg.features.group_snapshots,
        "DeleteVolumeGroupSnapshot",
    )?;
    let (changes, seq) = driver.store.mutate(|table| {
        let changes = plan::plan_delete_group(table, &req)?;
        Ok::<_, Error>((changes.clone(), changes))
    })?;
    driver.store.wait_durable(seq).await?;
    super::remove_snapshot_dirs(driver, &changes).await;
    Ok(csi::DeleteVolumeGroupSnapshotResponse {})
}

async fn get_group(
    driver: &Driver,
    req: csi::GetVolumeGroupSnapshotRequest,
) -> Result<csi::GetVolumeGroupSnapshotResponse> {
    served(
        driver.cfg.features.group_snapshots,
        "GetVolumeGroupSnapshot",
    )?;
    let (found, seq) = driver.store.read(|table| plan::get_group(table, &req));
    let (group, members) = found?;
    driver.store.wait_durable(seq).await?;
    Ok(csi::GetVolumeGroupSnapshotResponse {
        group_snapshot: Some(plan::to_csi_group(&group, &members)),
    })
}

#[tonic::async_trait]
impl GroupController for Driver {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Reply<csi::GroupControllerGetCapabilitiesResponse> {
        let on = self.cfg.features.group_snapshots;
        self.call("GroupControllerGetCapabilities", async move {
            let rpcs = if on {
                vec![GroupRpc::CreateDeleteGetVolumeGroupSnapshot]
            } else {
                Vec::new()
            };
            Ok(csi::GroupControllerGetCapabilitiesResponse {
                capabilities: rpcs
                    .into_iter()
                    .map(|rpc| csi::GroupControllerServiceCapability {
                        r#type: Some(csi::group_controller_service_capability::Type::Rpc(
                            csi::group_controller_service_capability::Rpc { r#type: rpc as i32 },
                        )),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Reply<csi::CreateVolumeGroupSnapshotResponse> {
        let (this, req) = (self.clone(), request.into_inner());
        self.call(
            "CreateVolumeGroupSnapshot",
            self.detached(async move { create_group(&this, req).await }),
        )
        .await
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Reply<csi::DeleteVolumeGroupSnapshotResponse> {
        let (this, req) = (self.clone(), request.into_inner());
        self.call(
            "DeleteVolumeGroupSnapshot",
            self.detached(async move { delete_group(&this, req).await }),
        )
        .await
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Reply<csi::GetVolumeGroupSnapshotResponse> {
        self.call(
            "GetVolumeGroupSnapshot",
            get_group(self, request.into_inner()),
        )
        .await
    }
}
