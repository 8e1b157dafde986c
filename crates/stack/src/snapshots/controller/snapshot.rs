//! A VolumeSnapshot's reconcile: its world from the caches, `decide::decide_snapshot`, and the
//! steps carried out (its finalizers, class, content, status and the claim's protection).

use super::*;

impl SnapshotController {
    pub(super) async fn sync_snapshot(
        &self,
        key: &ObjectRef<VolumeSnapshot>,
    ) -> Result<Next, SyncError> {
        let Some(snapshot) = self.snapshots.get(key) else {
            return Ok(Next::Done);
        };
        let namespace = snapshot.metadata.namespace.clone().unwrap_or_default();
        let content = self
            .contents
            .get(&ObjectRef::new(&decide::wanted_content(&snapshot)));
        let classes = self.classes.state();
        let class_refs: Vec<&VolumeSnapshotClass> = classes.iter().map(|c| c.as_ref()).collect();
        let claim_name = snapshot.spec.source.persistent_volume_claim_name.clone();
        let claim = claim_name
            .as_ref()
            .and_then(|n| self.claims.get(&ObjectRef::new(n).within(&namespace)));
        let volume = claim
            .as_ref()
            .and_then(|c| c.spec.as_ref())
            .and_then(|s| s.volume_name.clone())
            .and_then(|n| self.volumes.get(&ObjectRef::new(&n)));
        let snapshot_name = snapshot.metadata.name.as_deref().unwrap_or_default();
        let claims = self
            .restoring_claims
            .cached(&self.claims, &namespace, snapshot_name);
        let restoring = decide::restoring(&snapshot, claims.iter().map(|c| c.as_ref()));
        let snapshots = claim_name
            .as_deref()
            .map(|c| {
                self.snapshots_of_claim
                    .cached(&self.snapshots, &namespace, c)
            })
            .unwrap_or_default();
        let claim_busy = decide::claim_busy(&snapshot, snapshots.iter().map(|s| s.as_ref()));
        let now = sidecar_kit::vocabulary::now_rfc3339();
        let plan = decide::decide_snapshot(&SnapshotWorld {
            snapshot: &snapshot,
            content: content.as_deref(),
            classes: &class_refs,
            claim: claim.as_deref(),
            volume: volume.as_deref(),
            restoring,
            claim_busy,
            driver: &self.settings.driver,
            now: &now,
        });
        // Finalizer patches of one plan build on each other (indexes, the empty list).
        let mut finalizers = snapshot.metadata.finalizers.clone().unwrap_or_default();
        for step in plan.steps {
            self.snapshot_step(&snapshot, &mut finalizers, step).await?;
        }
        Ok(match plan.outcome {
            Outcome::Done => Next::Done,
            Outcome::Retry => Next::Retry,
        })
    }

    async fn snapshot_step(
        &self,
        snapshot: &VolumeSnapshot,
        finalizers: &mut Vec<String>,
        step: SnapshotStep,
    ) -> Result<(), SyncError> {
        let namespace = snapshot.metadata.namespace.clone().unwrap_or_default();
        let name = snapshot.metadata.name.clone().unwrap_or_default();
        let snapshots: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &namespace);
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let params = PatchParams::default();
        match step {
            SnapshotStep::AddFinalizer(f) => {
                let rv = snapshot.metadata.resource_version.as_deref();
                if let Some(ops) = add_finalizer(finalizers, f, rv) {
                    patch_finalizers(&snapshots, &name, ops, "add a snapshot finalizer").await?;
                    finalizers.push(f.to_string());
                }
            }
            SnapshotStep::RemoveFinalizer(f) => {
                if let Some(ops) = remove_finalizer(finalizers, f) {
                    patch_finalizers(&snapshots, &name, ops, "remove a snapshot finalizer").await?;
                    finalizers.retain(|x| x != f);
                }
            }
            SnapshotStep::SetClass(class) => {
                snapshots
                    .patch(
                        &name,
                        &params,
                        &Patch::Merge(json!({"spec": {"volumeSnapshotClassName": class}})),
                    )
                    .await
                    .map_err(api("set the default snapshot class"))?;
            }
            SnapshotStep::ProtectClaim(claim) => {
                self.claim_finalizer(&namespace, &claim, true).await?
            }
            SnapshotStep::ReleaseClaim(claim) => {
                self.claim_finalizer(&namespace, &claim, false).await?
            }
            SnapshotStep::CreateContent(content) => {
                let created = contents.create(&PostParams::default(), &content).await;
                if let Err(e) = done_if(created, sidecar_kit::api_errors::is_already_exists) {
                    let message = format!("Failed to create snapshot content with error {e}");
                    self.event(
                        &reference(snapshot),
                        EventType::Warning,
                        "CreateSnapshotContentFailed",
                        &message,
                    );
                    return Err(api("create the snapshot content")(e));
                }
            }
            SnapshotStep::BindContent { content, uid } => {
                contents
                    .patch(
                        &content,
                        &params,
                        &Patch::Merge(json!({"spec": {"volumeSnapshotRef": {"uid": uid}}})),
                    )
                    .await
                    .map_err(api("bind the snapshot content"))?;
            }
            SnapshotStep::SetStatus(status) => {
                snapshots
                    .patch_status(&name, &params, &status_patch(&status)?)
                    .await
                    .map_err(api("update the snapshot status"))?;
            }
            SnapshotStep::MarkBeingDeleted(content) => {
                contents
                    .patch(
                        &content,
                        &params,
                        &Patch::Merge(
                            json!({"metadata": {"annotations": {ANN_BEING_DELETED: "yes"}}}),
                        ),
                    )
                    .await
                    .map_err(api("mark the content as being deleted"))?;
            }
            SnapshotStep::DeleteContent(content) => {
                let deleted = contents.delete(&content, &DeleteParams::default()).await;
                if let Err(e) = done_if(deleted, sidecar_kit::api_errors::is_not_found) {
                    let message = format!("Failed to delete snapshot content: {e}");
                    self.event(
                        &reference(snapshot),
                        EventType::Warning,
                        "SnapshotContentObjectDeleteError",
                        &message,
                    );
                    return Err(api("delete the snapshot content")(e));
                }
            }
            SnapshotStep::Event(kind, reason, message) => {
                self.event(&reference(snapshot), kind, reason, &message);
            }
        }
        Ok(())
    }

    /// Adds (`protect`) or removes the source-protection finalizer of a claim being
    /// snapshotted; nothing when it is already so, or the claim is gone.
    async fn claim_finalizer(
        &self,
        namespace: &str,
        claim: &str,
        protect: bool,
    ) -> Result<(), SyncError> {
        let Some(cached) = self.claims.get(&ObjectRef::new(claim).within(namespace)) else {
            return Ok(());
        };
        let list = cached.metadata.finalizers.clone().unwrap_or_default();
        let has = list.iter().any(|f| f == FINALIZER_CLAIM);
        let patch = match (protect, has) {
            (true, false) => add_finalizer(
                &list,
                FINALIZER_CLAIM,
                cached.metadata.resource_version.as_deref(),
            ),
            (false, true) => remove_finalizer(&list, FINALIZER_CLAIM),
            (true, true) | (false, false) => None,
        };
        if let Some(ops) = patch {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(self.client.clone(), namespace);
            patch_finalizers(&claims, claim, ops, "update the claim's snapshot finalizer").await?;
        }
        Ok(())
    }
}
