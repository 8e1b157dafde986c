//! A VolumeSnapshotContent's reconcile: its world from the caches, `decide::decide_content`,
//! and the steps carried out (CreateSnapshot, ListSnapshots, DeleteSnapshot, its annotations,
//! status and finalizer).

use std::collections::BTreeMap;

use super::*;

impl SnapshotController {
    pub(super) async fn sync_content(&self, name: &str) -> Result<Next, SyncError> {
        let Some(content) = self.contents.get(&ObjectRef::new(name)) else {
            return Ok(Next::Done);
        };
        let class = content
            .spec
            .volume_snapshot_class_name
            .as_ref()
            .and_then(|c| self.classes.get(&ObjectRef::new(c)));
        let r = &content.spec.volume_snapshot_ref;
        let snapshot_exists = match (&r.namespace, &r.name) {
            (Some(ns), Some(n)) => self
                .snapshots
                .get(&snapshot_key(ns, n))
                .is_some_and(|s| r.uid.is_none() || s.metadata.uid == r.uid),
            _ => false,
        };
        let plan = decide::decide_content(&ContentWorld {
            content: &content,
            class: class.as_deref(),
            snapshot_exists,
            driver: &self.settings.driver,
        });
        for step in plan.steps {
            if !self.content_step(&content, step).await? {
                return Ok(Next::Retry);
            }
        }
        Ok(match plan.outcome {
            Outcome::Done => Next::Done,
            Outcome::Retry => Next::Retry,
        })
    }

    /// Carries out one step; false when a CSI call failed (reported; retried with backoff).
    async fn content_step(
        &self,
        content: &VolumeSnapshotContent,
        step: ContentStep,
    ) -> Result<bool, SyncError> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        match step {
            ContentStep::AddFinalizer => {
                if let Some(ops) = add_finalizer(
                    content.metadata.finalizers.as_deref().unwrap_or_default(),
                    FINALIZER_CONTENT,
                    content.metadata.resource_version.as_deref(),
                ) {
                    patch_finalizers(&contents, &name, ops, "add the content finalizer").await?;
                }
            }
            ContentStep::RemoveFinalizer => {
                if let Some(ops) = remove_finalizer(
                    content.metadata.finalizers.as_deref().unwrap_or_default(),
                    FINALIZER_CONTENT,
                ) {
                    patch_finalizers(&contents, &name, ops, "remove the content finalizer").await?;
                }
            }
            ContentStep::CreateSnapshot {
                name: csi_name,
                source_volume_id,
                parameters,
            } => {
                return self
                    .create_snapshot(content, csi_name, source_volume_id, parameters)
                    .await;
            }
            ContentStep::CheckSnapshot(handle) => {
                return self.check_snapshot(content, handle).await;
            }
            ContentStep::DeleteSnapshot(handle) => {
                return self.delete_snapshot(content, handle).await;
            }
            ContentStep::ClearBeingCreated => {
                self.annotate(&name, ANN_BEING_CREATED, None).await?;
            }
            ContentStep::Event(kind, reason, message) => {
                self.event(&reference(content), kind, reason, &message);
            }
        }
        Ok(true)
    }

    /// CreateSnapshot, marked as being created while in flight; false when the driver failed
    /// or the snapshot is not ready yet (asked again after the backoff).
    async fn create_snapshot(
        &self,
        content: &VolumeSnapshotContent,
        csi_name: String,
        source_volume_id: String,
        parameters: BTreeMap<String, String>,
    ) -> Result<bool, SyncError> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let controller = || csi::controller_client::ControllerClient::new(self.csi.clone());
        self.annotate(&name, ANN_BEING_CREATED, Some("yes")).await?;
        let secrets = self.secrets(content).await?;
        let request = csi::CreateSnapshotRequest {
            source_volume_id,
            name: csi_name,
            secrets,
            parameters: parameters.into_iter().collect(),
        };
        let mut client = controller();
        let answer = self
            .caller
            .call(
                "/csi.v1.Controller/CreateSnapshot",
                client.create_snapshot(self.caller.request(request)),
            )
            .await;
        match answer {
            Ok(response) => {
                let Some(s) = response.snapshot else {
                    return Err(SyncError::Invalid(
                        "CreateSnapshot answered without a snapshot".into(),
                    ));
                };
                self.record_snapshot(content, &name, &s).await?;
                self.annotate(&name, ANN_BEING_CREATED, None).await?;
                if !s.ready_to_use {
                    // Asked again after the backoff until the driver says ready.
                    return Ok(false);
                }
            }
            Err(error) => {
                self.content_failed(content, "SnapshotCreationFailed", &error)
                    .await?;
                // Not working on it any more: the being-created annotation may go.
                if sidecar_kit::csi::is_final(error.code) {
                    self.annotate(&name, ANN_BEING_CREATED, None).await?;
                }
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// ListSnapshots for a pre-provisioned or created snapshot; false until it is ready.
    async fn check_snapshot(
        &self,
        content: &VolumeSnapshotContent,
        handle: String,
    ) -> Result<bool, SyncError> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let controller = || csi::controller_client::ControllerClient::new(self.csi.clone());
        let mut client = controller();
        let request = csi::ListSnapshotsRequest {
            snapshot_id: handle.clone(),
            ..Default::default()
        };
        let answer = self
            .caller
            .call(
                "/csi.v1.Controller/ListSnapshots",
                client.list_snapshots(self.caller.request(request)),
            )
            .await;
        let found = match answer {
            Ok(r) => r.entries.into_iter().find_map(|e| e.snapshot),
            Err(error) => {
                self.content_failed(content, "SnapshotContentCheckandUpdateFailed", &error)
                    .await?;
                return Ok(false);
            }
        };
        let Some(s) = found else {
            let error = CallError {
                method: "ListSnapshots",
                code: tonic::Code::NotFound,
                message: format!("snapshot {handle} not found"),
            };
            self.content_failed(content, "SnapshotContentCheckandUpdateFailed", &error)
                .await?;
            return Ok(false);
        };
        self.record_snapshot(content, &name, &s).await?;
        if !s.ready_to_use {
            return Ok(false);
        }
        Ok(true)
    }

    /// DeleteSnapshot, then the content's status cleared; false when the driver failed.
    async fn delete_snapshot(
        &self,
        content: &VolumeSnapshotContent,
        handle: String,
    ) -> Result<bool, SyncError> {
        let name = content.metadata.name.clone().unwrap_or_default();
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let params = PatchParams::default();
        let controller = || csi::controller_client::ControllerClient::new(self.csi.clone());
        let secrets = self.secrets(content).await?;
        let mut client = controller();
        let request = csi::DeleteSnapshotRequest {
            snapshot_id: handle,
            secrets,
        };
        let answer = self
            .caller
            .call(
                "/csi.v1.Controller/DeleteSnapshot",
                client.delete_snapshot(self.caller.request(request)),
            )
            .await;
        if let Err(error) = answer {
            self.event(
                &reference(content),
                EventType::Warning,
                "SnapshotDeleteError",
                &format!("Failed to delete snapshot: {error}"),
            );
            return Ok(false);
        }
        let cleared = json_patch(vec![patch_ops::add(&["status"], json!({}))]);
        match contents.patch_status(&name, &params, &cleared).await {
            Ok(_) => {}
            Err(error) if sidecar_kit::api_errors::is_not_found(&error) => {}
            Err(e) => return Err(api("clear the content status")(e)),
        }
        Ok(true)
    }

    async fn annotate(
        &self,
        content: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), SyncError> {
        Api::<VolumeSnapshotContent>::all(self.client.clone())
            .patch(
                content,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .map_err(api("annotate the content"))?;
        Ok(())
    }

    async fn content_status(
        &self,
        content: &str,
        status: &crate::snapshots::types::VolumeSnapshotContentStatus,
    ) -> Result<(), SyncError> {
        Api::<VolumeSnapshotContent>::all(self.client.clone())
            .patch_status(content, &PatchParams::default(), &status_patch(status)?)
            .await
            .map_err(api("update the content status"))?;
        Ok(())
    }

    /// Reports a failed CSI call: an event on the content and the error in its status.
    async fn content_failed(
        &self,
        content: &VolumeSnapshotContent,
        reason: &'static str,
        error: &CallError,
    ) -> Result<(), SyncError> {
        let message = format!("Failed to check and update snapshot content: {error}");
        let mut status = content.status.clone().unwrap_or_default();
        if status.error.as_ref().and_then(|e| e.message.as_deref()) == Some(message.as_str()) {
            // The same failure again: no new event, no status write.
            return Ok(());
        }
        self.event(&reference(content), EventType::Warning, reason, &message);
        status.ready_to_use = Some(false);
        status.error = Some(SnapshotError {
            time: Some(sidecar_kit::vocabulary::now_rfc3339()),
            message: Some(message),
        });
        let name = content.metadata.name.clone().unwrap_or_default();
        self.content_status(&name, &status).await
    }

    /// The CreateSnapshot/DeleteSnapshot secret named by the content's annotations.
    async fn secrets(
        &self,
        content: &VolumeSnapshotContent,
    ) -> Result<HashMap<String, String>, SyncError> {
        let annotations = content.metadata.annotations.clone().unwrap_or_default();
        let (Some(name), Some(namespace)) = (
            annotations.get(ANN_SECRET_NAME),
            annotations.get(ANN_SECRET_NAMESPACE),
        ) else {
            return Ok(HashMap::new());
        };
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(api("get the snapshotter secret"))?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    /// Writes the content's status from the driver's snapshot (CreateSnapshot's or
    /// ListSnapshots' answer).
    async fn record_snapshot(
        &self,
        content: &VolumeSnapshotContent,
        name: &str,
        snapshot: &csi::Snapshot,
    ) -> Result<(), SyncError> {
        let status = decide::content_status(
            content.status.as_ref(),
            &snapshot.snapshot_id,
            snapshot.ready_to_use,
            nanos(snapshot.creation_time.as_ref()),
            snapshot.size_bytes,
        );
        self.content_status(name, &status).await
    }
}
