//! Carrying out the node's plans: stage and publish a Pod's volumes (record first, call, mark
//! the record done) and grow them when their claim awaits the node (`expand`), tear them down (call, then remove the record), sweep what no Pod wants,
//! and report the volumes in use on the Node.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use sidecar_kit::events::EventType;
use sidecar_kit::vocabulary::reference;
use sidecar_kit::workqueue::Next;

use super::decide::{self, PodPlan, PodVolume, VolumeData};
use super::{NodeAgent, NodeError, disk};
use sidecar_kit::vocabulary::now_rfc3339 as now;

impl NodeAgent {
    /// The record of a volume: before the call (`done` false), or after it, with whether
    /// `path` shows the volume then.
    fn record(&self, volume: &PodVolume, done: Option<&Path>) -> VolumeData {
        VolumeData {
            driver_name: volume.driver.clone(),
            volume_handle: volume.handle.clone(),
            spec_vol_id: volume.pv.clone(),
            node_name: self.node.clone(),
            done: done.is_some(),
            mounted: done.is_some_and(sidecar_kit::mounts::shows_a_volume),
            ephemeral: volume.ephemeral,
        }
    }

    /// Stages (when the driver stages) and publishes each volume, then marks the Pod Running.
    pub(super) async fn set_up_pod(
        &self,
        pod: &Pod,
        volumes: &[PodVolume],
    ) -> Result<(), NodeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for volume in volumes {
            if let Err(error) = self.set_up(&uid, volume).await {
                if matches!(
                    error,
                    NodeError::Stage { .. } | NodeError::Publish { .. } | NodeError::Secret(_)
                ) {
                    self.recorder.record(
                        &reference(pod),
                        EventType::Warning,
                        "FailedMount",
                        &error.to_string(),
                    );
                }
                return Err(error);
            }
            self.expand(pod, &uid, volume).await?;
        }
        if decide::running(pod) {
            return Ok(());
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        for volume in volumes {
            tracing::info!(pod = %format!("{namespace}/{name}"), volume = %volume.pv, path = %self.paths.target(&uid, &volume.pv).display(), "pod volume is ready");
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&decide::running_status(pod, &now())),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if sidecar_kit::api_errors::is_not_found(&error) => Ok(()),
            Err(source) => Err(NodeError::Api {
                action: "mark the pod running",
                source,
            }),
        }
    }

    async fn set_up(&self, uid: &str, volume: &PodVolume) -> Result<(), NodeError> {
        let mut staging_target = String::new();
        let mut reported = false;
        if self.stage_unstage && !volume.ephemeral {
            let dir = self.paths.staging(&volume.driver, &volume.handle);
            let target = self.paths.staging_target(&volume.driver, &volume.handle);
            staging_target = target.display().to_string();
            if !disk::read(&dir).is_some_and(|r| r.done) {
                disk::write(&dir, &self.record(volume, None))?;
                // In use before the first call (the attach/detach controller waits for it).
                self.report_in_use().await?;
                reported = true;
                durable_log::files::create_private_dir(&target).map_err(|source| {
                    disk::DiskError {
                        action: "create",
                        path: staging_target.clone(),
                        source,
                    }
                })?;
                let secrets = self.secrets(volume.stage_secret.as_ref()).await?;
                let request = csi::NodeStageVolumeRequest {
                    volume_id: volume.handle.clone(),
                    publish_context: volume.publish_context.clone(),
                    staging_target_path: staging_target.clone(),
                    volume_capability: Some(volume.capability.clone()),
                    secrets,
                    volume_context: volume.attributes.clone(),
                };
                let mut client = self.node_client();
                self.calls
                    .call(
                        "/csi.v1.Node/NodeStageVolume",
                        client.node_stage_volume(self.calls.request(request)),
                    )
                    .await
                    .map_err(|source| NodeError::Stage {
                        pv: volume.pv.clone(),
                        source,
                    })?;
                disk::write(&dir, &self.record(volume, Some(&target)))?;
            }
        }
        let dir = self.paths.pod_volume(uid, &volume.pv);
        if disk::read(&dir).is_some_and(|r| r.done) {
            return Ok(());
        }
        disk::write(&dir, &self.record(volume, None))?;
        if !reported {
            self.report_in_use().await?;
        }
        let secrets = self.secrets(volume.publish_secret.as_ref()).await?;
        let target = self.paths.target(uid, &volume.pv);
        let request = csi::NodePublishVolumeRequest {
            volume_id: volume.handle.clone(),
            publish_context: volume.publish_context.clone(),
            staging_target_path: staging_target,
            target_path: target.display().to_string(),
            volume_capability: Some(volume.capability.clone()),
            readonly: volume.readonly,
            secrets,
            volume_context: volume.publish_attributes.clone(),
        };
        let mut client = self.node_client();
        self.calls
            .call(
                "/csi.v1.Node/NodePublishVolume",
                client.node_publish_volume(self.calls.request(request)),
            )
            .await
            .map_err(|source| NodeError::Publish {
                pv: volume.pv.clone(),
                source,
            })?;
        disk::write(&dir, &self.record(volume, Some(&target)))?;
        Ok(())
    }

    /// Unpublishes every volume of the Pod, unstages what nothing needs, reports the volumes
    /// in use, then (when the Pod is being deleted) deletes it for good.
    pub(super) async fn tear_down_pod(
        &self,
        pod: &Pod,
        finish_deletion: bool,
    ) -> Result<(), NodeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for (dir, data) in disk::published(&self.paths) {
            if decide::pod_uid_of(&self.paths, &dir).as_deref() == Some(uid.as_str()) {
                self.unpublish(&dir, &data).await?;
            }
        }
        self.unstage_unneeded().await?;
        self.report_in_use().await?;
        if !finish_deletion {
            return Ok(());
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{namespace}/{name}"), "pod volumes torn down; pod deleted");
                Ok(())
            }
            Err(error)
                if sidecar_kit::api_errors::is_not_found(&error)
                    || sidecar_kit::api_errors::is_conflict(&error) =>
            {
                Ok(())
            }
            Err(source) => Err(NodeError::Api {
                action: "delete the pod",
                source,
            }),
        }
    }

    async fn unpublish(&self, dir: &Path, data: &VolumeData) -> Result<(), NodeError> {
        let request = csi::NodeUnpublishVolumeRequest {
            volume_id: data.volume_handle.clone(),
            target_path: dir.join("mount").display().to_string(),
        };
        let mut client = self.node_client();
        match self
            .calls
            .call(
                "/csi.v1.Node/NodeUnpublishVolume",
                client.node_unpublish_volume(self.calls.request(request)),
            )
            .await
        {
            Ok(_) => {}
            // An ephemeral volume goes with its unpublish: not found, it went with an earlier
            // one (this agent stopped before removing the record).
            Err(source) if data.ephemeral && source.code == tonic::Code::NotFound => {
                tracing::info!(volume = %data.spec_vol_id, "ephemeral volume already removed by the driver");
            }
            Err(source) => {
                return Err(NodeError::Unpublish {
                    pv: data.spec_vol_id.clone(),
                    source,
                });
            }
        }
        disk::remove(dir, &self.paths.pods())?;
        Ok(())
    }

    /// Unstages the staged volumes no published volume and no Pod that is to run needs.
    async fn unstage_unneeded(&self) -> Result<(), NodeError> {
        if !self.stage_unstage {
            return Ok(());
        }
        let staged = disk::staged(&self.paths, &self.driver);
        if staged.is_empty() {
            return Ok(());
        }
        let published = disk::published(&self.paths);
        let mut wanted = BTreeSet::new();
        for pod in self.pods.state() {
            if let PodPlan::SetUp(volumes) = self.plan(&pod) {
                wanted.extend(volumes.into_iter().map(|v| v.handle));
            }
        }
        for (dir, data) in decide::unneeded_stages(&staged, &published, &wanted) {
            let target = dir.join("globalmount");
            let request = csi::NodeUnstageVolumeRequest {
                volume_id: data.volume_handle.clone(),
                staging_target_path: target.display().to_string(),
            };
            let mut client = self.node_client();
            self.calls
                .call(
                    "/csi.v1.Node/NodeUnstageVolume",
                    client.node_unstage_volume(self.calls.request(request)),
                )
                .await
                .map_err(|source| NodeError::Unstage {
                    pv: data.spec_vol_id.clone(),
                    source,
                })?;
            let _ = std::fs::remove_dir(&target);
            disk::remove(dir, &self.paths.plugin(&self.driver))?;
        }
        Ok(())
    }

    /// What is on disk against the Pods: volumes of Pods that are gone are torn down, stages
    /// nothing needs are undone, and Pods whose volumes are missing are set up again.
    pub(super) async fn sweep(&self) -> Result<Next, NodeError> {
        self.forget_lost_mounts()?;
        let pods = self.pods.state();
        let known: HashMap<String, ObjectRef<Pod>> = pods
            .iter()
            .map(|p| {
                (
                    p.metadata.uid.clone().unwrap_or_default(),
                    ObjectRef::from_obj(p.as_ref()),
                )
            })
            .collect();
        for (dir, data) in disk::published(&self.paths) {
            let Some(uid) = decide::pod_uid_of(&self.paths, &dir) else {
                continue;
            };
            match known.get(&uid) {
                None => {
                    tracing::info!(pod_uid = %uid, volume = %data.spec_vol_id, "sweep: the pod is gone; unpublishing its volume");
                    self.unpublish(&dir, &data).await?;
                }
                // Its own sync tears it down (or finds it set up).
                Some(key) => self.queue.add(super::NodeKey::Pod(key.clone())),
            }
        }
        self.unstage_unneeded().await?;
        self.report_in_use().await?;
        Ok(Next::Done)
    }

    /// Marks the records whose volume is no longer shown (after a reboot, or an unmount behind
    /// the node's back) as not done, so the Pod's sync (which the sweep asks for) stages and
    /// publishes again: kubelet's reconstruction. The mount table is read once per pass.
    fn forget_lost_mounts(&self) -> Result<(), NodeError> {
        let Some(table) = sidecar_kit::mounts::MountTable::read() else {
            return Ok(());
        };
        let shows = |path: &Path| table.shows_a_volume(path);
        let staged = if self.stage_unstage {
            disk::staged(&self.paths, &self.driver)
        } else {
            Vec::new()
        };
        let published = disk::published(&self.paths);
        let lost = decide::lost_mounts(&staged, |d| d.join("globalmount"), shows)
            .into_iter()
            .chain(decide::lost_mounts(&published, |d| d.join("mount"), shows));
        for (dir, data) in lost {
            tracing::warn!(volume = %data.spec_vol_id, path = %dir.display(), "the volume is no longer mounted (a reboot, or an unmount behind the node's back): setting it up again");
            let again = VolumeData {
                done: false,
                mounted: false,
                ..data.clone()
            };
            disk::write(dir, &again)?;
        }
        Ok(())
    }

    /// Writes `status.volumesInUse` from the records on disk when it changed.
    pub(super) async fn report_in_use(&self) -> Result<(), NodeError> {
        let published = disk::published(&self.paths);
        let staged = disk::staged(&self.paths, &self.driver);
        let names = decide::volumes_in_use(published.iter().chain(staged.iter()).map(|(_, d)| d));
        let current = self
            .nodes
            .get(&ObjectRef::new(&self.node))
            .and_then(|n| n.status.as_ref().and_then(|s| s.volumes_in_use.clone()))
            .unwrap_or_default();
        if *self.in_use.lock() == Some(names.clone()) && current == names {
            return Ok(());
        }
        if current == names {
            *self.in_use.lock() = Some(names);
            return Ok(());
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"status": {"volumesInUse": names}});
        api.patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| NodeError::Api {
                action: "report the volumes in use",
                source,
            })?;
        *self.in_use.lock() = Some(names);
        Ok(())
    }
}
