//! The CSI Controller service.

use std::collections::HashMap;

use csi::controller_server::Controller;
use csi::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1 as csi;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::driver::{Driver, now_ms, on_disk};
use crate::error::{Error, Result};
use crate::plan::{self, CreatePlan};
use crate::snapshots;
use crate::state::{ContentSource, Table};

type Reply<T> = std::result::Result<Response<T>, Status>;

impl Driver {
    async fn create(&self, req: csi::CreateVolumeRequest) -> Result<csi::CreateVolumeResponse> {
        self.create_as(req, false).await
    }

    /// CreateVolume; an `ephemeral` volume (made by NodePublishVolume) has its name as its id
    /// and is marked so, and only an ephemeral volume is found again under its name.
    pub(crate) async fn create_as(
        &self,
        req: csi::CreateVolumeRequest,
        ephemeral: bool,
    ) -> Result<csi::CreateVolumeResponse> {
        let parsed = plan::parse_create(&self.cfg, &req)?;
        // A repeat of a request still in progress waits for it, then finds its volume.
        let _name = self.creating.lock(&req.name).await;
        let id = if ephemeral {
            req.name.clone()
        } else {
            uuid::Uuid::new_v4().to_string()
        };
        let (plan, source_unused) = self.store.reserve(|table| {
            if let Some(other) = table.get(&id).filter(|other| other.name != req.name) {
                return Err(Error::Ephemeral(format!(
                    "volume id {:?} is taken by volume {:?}",
                    other.id, other.name
                )));
            }
            let mut plan = plan::plan_create(&self.cfg, table, &parsed, &id, now_ms())?;
            match &mut plan {
                CreatePlan::New(record) => record.ephemeral = ephemeral,
                CreatePlan::Existing(record) if record.ephemeral != ephemeral => {
                    return Err(Error::Ephemeral(format!(
                        "volume {:?} exists and is {}",
                        record.id,
                        if record.ephemeral {
                            "an ephemeral inline volume"
                        } else {
                            "a persistent volume"
                        }
                    )));
                }
                CreatePlan::Existing(_) => {}
            }
            let reserved = match &plan {
                CreatePlan::New(record) => Some(record.clone()),
                CreatePlan::Existing(_) => None,
            };
            let source_unused = plan::copies_unused_volume(table, parsed.source.as_ref());
            Ok::<_, Error>(((plan, source_unused), reserved))
        })?;
        let (record, seq) = match plan {
            CreatePlan::Existing(record) => {
                tracing::debug!(name = %record.name, volume_id = %record.id, "volume exists");
                (record, self.store.read(|_| ()).1)
            }
            CreatePlan::New(record) if record.lazy_content => {
                // Nothing on disk yet: its directory is made when it is first staged or
                // published (node_stage, node_publish).
                let seq = self.confirm_or_cancel(&record)?;
                (record, seq)
            }
            CreatePlan::New(record) => {
                // The directory (made or copied, and fsynced) exists before the record is
                // logged: a crash in between leaves a directory no record names, which the next
                // start removes.
                let job = crate::content::ContentJob {
                    dir: self.store.volume_dir(&record.id),
                    parent: self.store.volumes_dir().to_path_buf(),
                    copy_from: match &record.source {
                        None => None,
                        Some(ContentSource::Snapshot(id)) => Some(self.store.snapshot_dir(id)),
                        Some(ContentSource::Volume(id)) => Some(self.store.volume_dir(id)),
                    },
                    source_unused,
                    image_bytes: record.block.then_some(record.capacity_bytes),
                };
                let dir = self.store.volume_dir(&record.id);
                let made = on_disk("create volume directory", &dir, move || job.run()).await;
                if let Err(error) = made {
                    // A partial copy goes before the reservation does.
                    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
                    self.store.cancel(&record.id);
                    return Err(error);
                }
                let seq = self.confirm_or_cancel(&record)?;
                (record, seq)
            }
        };
        self.store.wait_durable(seq).await?;
        Ok(csi::CreateVolumeResponse {
            volume: Some(plan::to_csi_volume(&self.cfg, &record)),
        })
    }

    /// Logs a reserved volume's record (its content, if any, is on disk and durable); a log
    /// that fails gives the reservation back.
    fn confirm_or_cancel(&self, record: &crate::state::VolumeRecord) -> Result<u64> {
        match self.store.confirm(&record.id) {
            Ok(seq) => {
                tracing::info!(name = %record.name, volume_id = %record.id, bytes = record.capacity_bytes, node = ?record.node, "volume created");
                Ok(seq)
            }
            Err(error) => {
                self.store.cancel(&record.id);
                Err(error.into())
            }
        }
    }

    pub(crate) async fn delete(
        &self,
        req: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse> {
        let ((removed, never_used), seq) = self.store.mutate(|table| {
            let never_used = plan::never_used(table, &req.volume_id);
            let changes = plan::plan_delete(table, &req.volume_id)?;
            Ok::<_, Error>(((!changes.is_empty(), never_used), changes))
        })?;
        self.store.wait_durable(seq).await?;
        if removed {
            let dir = self.store.volume_dir(&req.volume_id);
            let outcome = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
            // A volume never used may have no directory.
            if let Ok(Err(error)) = outcome
                && !(never_used && error.kind() == std::io::ErrorKind::NotFound)
            {
                tracing::warn!(volume_id = %req.volume_id, %error, "volume directory not removed; the next start removes it");
            }
            tracing::info!(volume_id = %req.volume_id, "volume deleted");
        }
        Ok(csi::DeleteVolumeResponse {})
    }

    async fn list(&self, req: csi::ListVolumesRequest) -> Result<csi::ListVolumesResponse> {
        if req.max_entries < 0 {
            return Err(Error::InvalidMaxEntries(req.max_entries));
        }
        if !req.starting_token.is_empty() && !plan::valid_token(&req.starting_token) {
            return Err(Error::InvalidToken(req.starting_token));
        }
        let limit = if req.max_entries == 0 {
            usize::MAX
        } else {
            req.max_entries as usize
        };
        let with_status = self.cfg.enable_attach || self.cfg.features.volume_condition;
        // A volume is listed from the moment a CreateVolume may have made it: creations under
        // way when the listing comes are waited for (a provisioner that died mid-call finds
        // the volume when it lists at its next start).
        let (creating, _) = self.store.read(Table::reserved_ids);
        self.store.wait_settled(&creating).await;
        let ((records, more), seq) = self.store.read(|table| {
            let mut iter = table.after(&req.starting_token).peekable();
            let page: Vec<_> = iter.by_ref().take(limit).cloned().collect();
            (page, iter.peek().is_some())
        });
        // The conditions look at the disk: outside the table's lock.
        let entries: Vec<_> = records
            .iter()
            .map(|record| csi::list_volumes_response::Entry {
                volume: Some(plan::to_csi_volume(&self.cfg, record)),
                status: with_status.then(|| csi::list_volumes_response::VolumeStatus {
                    published_node_ids: record.published.keys().cloned().collect(),
                    volume_condition: crate::stats::controller_condition(self, record),
                }),
            })
            .collect();
        self.store.wait_durable(seq).await?;
        let next_token = match entries.last() {
            Some(last) if more => last
                .volume
                .as_ref()
                .map(|v| v.volume_id.clone())
                .unwrap_or_default(),
            _ => String::new(),
        };
        Ok(csi::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    async fn get_volume(
        &self,
        req: csi::ControllerGetVolumeRequest,
    ) -> Result<csi::ControllerGetVolumeResponse> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing("volume_id"));
        }
        let (record, seq) = self.store.read(|t| t.get(&req.volume_id).cloned());
        let record = record.ok_or_else(|| Error::VolumeNotFound(req.volume_id.clone()))?;
        self.store.wait_durable(seq).await?;
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(plan::to_csi_volume(&self.cfg, &record)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: record.published.keys().cloned().collect(),
                volume_condition: crate::stats::controller_condition(self, &record),
            }),
        })
    }

    fn validate(
        &self,
        req: &csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing("volume_id"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Error::Missing("volume_capabilities"));
        }
        let (record, _) = self.store.read(|t| t.get(&req.volume_id).cloned());
        let record = record.ok_or_else(|| Error::VolumeNotFound(req.volume_id.clone()))?;
        let unconfirmed = |message: String| csi::ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message,
        };
        for cap in &req.volume_capabilities {
            match plan::check_capability(&self.cfg, cap) {
                Err(error) => return Ok(unconfirmed(error.to_string())),
                Ok(checked) if checked.block != record.block => {
                    return Ok(unconfirmed(format!(
                        "volume is a {} volume",
                        if record.block { "block" } else { "mount" }
                    )));
                }
                Ok(_) => {}
            }
        }
        let given: std::collections::BTreeMap<_, _> = req
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !given.is_empty() && given != record.parameters {
            return Ok(unconfirmed(format!(
                "volume was created with parameters {:?}",
                record.parameters
            )));
        }
        if !req.mutable_parameters.is_empty() {
            let given: std::collections::BTreeMap<_, _> = req
                .mutable_parameters
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if given != record.mutable_parameters {
                return Ok(unconfirmed(format!(
                    "volume has mutable parameters {:?}",
                    record.mutable_parameters
                )));
            }
        }
        Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                volume_context: req.volume_context.clone(),
                volume_capabilities: req.volume_capabilities.clone(),
                parameters: req.parameters.clone(),
                mutable_parameters: req.mutable_parameters.clone(),
            }),
            message: String::new(),
        })
    }

    async fn publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<csi::ControllerPublishVolumeResponse> {
        if !self.cfg.enable_attach {
            return Err(Error::NotServed(
                "ControllerPublishVolume (start the driver with --enable-attach)",
            ));
        }
        let parsed = plan::parse_publish(&self.cfg, &req)?;
        let ((), seq) = self
            .store
            .mutate(|table| Ok::<_, Error>(((), plan::plan_publish(&self.cfg, table, &parsed)?)))?;
        self.store.wait_durable(seq).await?;
        let path = self
            .store
            .volume_dir(&parsed.volume_id)
            .display()
            .to_string();
        Ok(csi::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([("hostpath.csi.volstack.dev/path".to_string(), path)]),
        })
    }

    async fn unpublish(
        &self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<csi::ControllerUnpublishVolumeResponse> {
        if !self.cfg.enable_attach {
            return Err(Error::NotServed(
                "ControllerUnpublishVolume (start the driver with --enable-attach)",
            ));
        }
        let ((), seq) = self.store.mutate(|table| {
            Ok::<_, Error>((
                (),
                plan::plan_unpublish(table, &req.volume_id, &req.node_id)?,
            ))
        })?;
        self.store.wait_durable(seq).await?;
        Ok(csi::ControllerUnpublishVolumeResponse {})
    }

    fn capabilities(&self) -> csi::ControllerGetCapabilitiesResponse {
        let mut rpcs = vec![Rpc::ListVolumes, Rpc::GetVolume];
        if self.cfg.features.create_delete {
            rpcs.insert(0, Rpc::CreateDeleteVolume);
        }
        if !self.cfg.capacity.is_empty() {
            rpcs.push(Rpc::GetCapacity);
        }
        if self.cfg.enable_attach {
            rpcs.extend([
                Rpc::PublishUnpublishVolume,
                Rpc::ListVolumesPublishedNodes,
                Rpc::PublishReadonly,
            ]);
        }
        if self.cfg.single_node_multi_writer {
            rpcs.push(Rpc::SingleNodeMultiWriter);
        }
        let features = &self.cfg.features;
        if features.snapshots {
            rpcs.extend([
                Rpc::CreateDeleteSnapshot,
                Rpc::ListSnapshots,
                Rpc::GetSnapshot,
            ]);
        }
        if features.clones {
            rpcs.push(Rpc::CloneVolume);
        }
        if features.expansion {
            rpcs.push(Rpc::ExpandVolume);
        }
        if features.volume_condition {
            rpcs.push(Rpc::VolumeCondition);
        }
        if features.modify {
            rpcs.push(Rpc::ModifyVolume);
        }
        csi::ControllerGetCapabilitiesResponse {
            capabilities: rpcs
                .into_iter()
                .map(|rpc| csi::ControllerServiceCapability {
                    r#type: Some(csi::controller_service_capability::Type::Rpc(
                        csi::controller_service_capability::Rpc { r#type: rpc as i32 },
                    )),
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl Controller for Driver {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Reply<csi::CreateVolumeResponse> {
        let req = request.into_inner();
        let span = tracing::info_span!("create", name = %req.name);
        let this = self.clone();
        let served = self.cfg.features.create_delete;
        self.call(
            "CreateVolume",
            self.detached(async move {
                crate::features::served(served, "CreateVolume")?;
                this.create(req).await
            }),
        )
        .instrument(span)
        .await
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Reply<csi::DeleteVolumeResponse> {
        // Detached: a deletion logged but cut off before its directory is removed would leave
        // the directory until the next start.
        let (this, req) = (self.clone(), request.into_inner());
        let served = self.cfg.features.create_delete;
        self.call(
            "DeleteVolume",
            self.detached(async move {
                crate::features::served(served, "DeleteVolume")?;
                this.delete(req).await
            }),
        )
        .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Reply<csi::ControllerPublishVolumeResponse> {
        let req = request.into_inner();
        self.call("ControllerPublishVolume", async move {
            self.cfg
                .check_secrets("ControllerPublishVolume", &req.secrets)?;
            self.publish(req).await
        })
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Reply<csi::ControllerUnpublishVolumeResponse> {
        let req = request.into_inner();
        self.call("ControllerUnpublishVolume", async move {
            self.cfg
                .check_secrets("ControllerUnpublishVolume", &req.secrets)?;
            self.unpublish(req).await
        })
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<csi::ValidateVolumeCapabilitiesResponse> {
        let req = request.into_inner();
        self.call("ValidateVolumeCapabilities", async { self.validate(&req) })
            .await
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Reply<csi::ListVolumesResponse> {
        self.call("ListVolumes", self.list(request.into_inner()))
            .await
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Reply<csi::GetCapacityResponse> {
        let req = request.into_inner();
        self.call("GetCapacity", async { self.capacity(&req) })
            .await
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Reply<csi::ControllerGetCapabilitiesResponse> {
        self.call("ControllerGetCapabilities", async {
            Ok(self.capabilities())
        })
        .await
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Reply<csi::CreateSnapshotResponse> {
        let req = request.into_inner();
        let span = tracing::info_span!("snapshot", name = %req.name);
        let this = self.clone();
        self.call(
            "CreateSnapshot",
            self.detached(async move { snapshots::make_snapshot(&this, req).await }),
        )
        .instrument(span)
        .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Reply<csi::DeleteSnapshotResponse> {
        let (this, req) = (self.clone(), request.into_inner());
        self.call(
            "DeleteSnapshot",
            self.detached(async move { snapshots::remove_snapshot(&this, req).await }),
        )
        .await
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Reply<csi::ListSnapshotsResponse> {
        self.call(
            "ListSnapshots",
            snapshots::snapshot_page(self, request.into_inner()),
        )
        .await
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Reply<csi::GetSnapshotResponse> {
        self.call(
            "GetSnapshot",
            snapshots::find_snapshot(self, request.into_inner()),
        )
        .await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Reply<csi::ControllerExpandVolumeResponse> {
        self.call(
            "ControllerExpandVolume",
            crate::expansion::controller_expand(self, request.into_inner()),
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Reply<csi::ControllerGetVolumeResponse> {
        self.call("ControllerGetVolume", self.get_volume(request.into_inner()))
            .await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Reply<csi::ControllerModifyVolumeResponse> {
        self.call(
            "ControllerModifyVolume",
            crate::modify::modify(self, request.into_inner()),
        )
        .await
    }
}
