//! The CSI Node service: makes a volume's directory (or block image) visible at the target path,
//! by a bind mount when permitted, else by a symlink (documented fallback: no root needed, but
//! read-only is then not enforced by the kernel).

use std::path::{Path, PathBuf};

use csi::node_server::Node;
use csi::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::v1 as csi;
use tonic::{Request, Response, Status};

use crate::driver::{Driver, fs_error};
use crate::error::{Error, Result};
use crate::plan;
use crate::state::{Change, NodeTarget, VolumeRecord};

type Reply<T> = std::result::Result<Response<T>, Status>;

pub(crate) const BIND: &str = "bind";
pub(crate) const SYMLINK: &str = "symlink";

/// Whether `mount --bind` works here (root with CAP_SYS_ADMIN); tried once at start.
pub async fn bind_mounts_work(state_dir: &Path) -> bool {
    let probe = state_dir.join(".bind-probe");
    let (src, dst) = (probe.join("src"), probe.join("dst"));
    if std::fs::create_dir_all(&src).is_err() || std::fs::create_dir_all(&dst).is_err() {
        return false;
    }
    let mounted = run(
        "mount",
        &["--bind", &src.to_string_lossy(), &dst.to_string_lossy()],
    )
    .await
    .is_ok();
    if mounted {
        let _ = run("umount", &[&dst.to_string_lossy()]).await;
    }
    let _ = std::fs::remove_dir_all(&probe);
    mounted
}

async fn run(program: &str, args: &[&str]) -> std::result::Result<(), String> {
    let output = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| format!("{program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

use sidecar_kit::mounts::is_mount_point;

/// Whether `target` shows `source` now: a mount point (bind) or a link to it (symlink). After
/// a reboot, or an unmount behind the driver's back, a recorded target may show nothing.
pub(crate) fn exposed(how: &str, source: &Path, target: &Path) -> bool {
    match how {
        BIND => is_mount_point(target),
        _ => std::fs::read_link(target).is_ok_and(|link| link == source),
    }
}

impl Driver {
    /// The checks NodeStageVolume and NodePublishVolume share: the volume id and the path
    /// (`path`: its field name and value) given, a valid capability, the volume known and of the
    /// requested access type (else the error `mismatch` makes), and usable on this node.
    pub(crate) async fn node_volume(
        &self,
        volume_id: &str,
        path: (&'static str, &str),
        cap: Option<&csi::VolumeCapability>,
        mismatch: fn(String) -> Error,
    ) -> Result<VolumeRecord> {
        if volume_id.is_empty() {
            return Err(Error::Missing("volume_id"));
        }
        if path.1.is_empty() {
            return Err(Error::Missing(path.0));
        }
        let cap = cap.ok_or(Error::Missing("volume_capability"))?;
        let checked = plan::check_capability(&self.cfg, cap)?;
        let record = self.volume(volume_id).await?;
        if record.block != checked.block {
            return Err(mismatch(format!(
                "volume {:?} is a {} volume",
                record.id,
                if record.block { "block" } else { "mount" }
            )));
        }
        self.check_local(&record)?;
        Ok(record)
    }

    async fn node_publish(
        &self,
        req: csi::NodePublishVolumeRequest,
    ) -> Result<csi::NodePublishVolumeResponse> {
        if crate::ephemeral::is_ephemeral(&req.volume_context) {
            if req.target_path.is_empty() {
                return Err(Error::Missing("target_path"));
            }
            let segment = self
                .cfg
                .topology_key
                .as_deref()
                .map(|key| (key, self.cfg.node.topology_value.as_str()));
            let create = crate::ephemeral::create_request(&req, segment)?;
            self.create_as(create, true).await?;
        }
        let record = self
            .node_volume(
                &req.volume_id,
                ("target_path", &req.target_path),
                req.volume_capability.as_ref(),
                Error::Precondition,
            )
            .await?;
        // Ephemeral volumes are never staged (kubelet publishes them directly).
        if self.cfg.features.stage_unstage && !record.ephemeral {
            if req.staging_target_path.is_empty() {
                return Err(Error::Precondition(
                    "staging_target_path is not set: this driver stages volumes (STAGE_UNSTAGE_VOLUME)"
                        .into(),
                ));
            }
            if !record.staged.contains_key(&req.staging_target_path) {
                return Err(Error::Precondition(format!(
                    "volume {:?} is not staged at {:?}: NodeStageVolume first",
                    record.id, req.staging_target_path
                )));
            }
        }
        let target = PathBuf::from(&req.target_path);
        let wanted = NodeTarget {
            readonly: req.readonly,
            block: record.block,
            how: if self.bind_mounts { BIND } else { SYMLINK }.to_string(),
        };
        // A staged mount volume is published from its staging path, as a real driver publishes
        // the filesystem it mounted there; a block volume from its image.
        let source = if record.block {
            self.store
                .volume_dir(&record.id)
                .join(crate::content::BLOCK_IMAGE)
        } else if self.cfg.features.stage_unstage && !record.ephemeral {
            PathBuf::from(&req.staging_target_path)
        } else {
            self.content_dir(&record).await?
        };
        if let Some(existing) = record.targets.get(&req.target_path) {
            if existing.readonly != wanted.readonly || existing.block != wanted.block {
                return Err(Error::PublishConflict(format!(
                    "volume {:?} is already published at {:?} with readonly={}",
                    record.id, req.target_path, existing.readonly
                )));
            }
            // Recorded: published again only if the target no longer shows the volume.
            if !exposed(&existing.how, &source, &target) {
                tracing::warn!(volume_id = %record.id, target = %req.target_path, "a published target shows nothing (a reboot or an unmount); publishing it again");
                expose(
                    existing.how == BIND,
                    &source,
                    &target,
                    record.block,
                    req.readonly,
                )
                .await?;
            }
            return Ok(csi::NodePublishVolumeResponse {});
        }
        let (other, _) = self.store.read(|t| {
            t.iter()
                .find(|v| v.id != record.id && v.targets.contains_key(&req.target_path))
                .map(|v| v.id.clone())
        });
        if let Some(other) = other {
            return Err(Error::PublishConflict(format!(
                "target path {:?} already holds volume {other:?}",
                req.target_path
            )));
        }
        // Recorded before anything is put at the target: what NodeUnpublishVolume may undo is
        // only ever what the driver put there for this volume.
        let id = record.id.clone();
        let path = req.target_path.clone();
        let ((), seq) = self.store.mutate(|table| {
            let Some(current) = table.get(&id) else {
                return Err(Error::VolumeNotFound(id.clone()));
            };
            let mut updated = current.clone();
            updated.targets.insert(path.clone(), wanted.clone());
            // Its directory exists now: staged first, or made by content_dir.
            updated.lazy_content = false;
            Ok(((), vec![Change::Put(updated)]))
        })?;
        self.store.wait_durable(seq).await?;
        if let Err(error) = expose(
            self.bind_mounts,
            &source,
            &target,
            record.block,
            req.readonly,
        )
        .await
        {
            self.forget_target(&record.id, &req.target_path).await;
            return Err(error);
        }
        tracing::info!(volume_id = %record.id, target = %req.target_path, how = %wanted.how, "volume published");
        Ok(csi::NodePublishVolumeResponse {})
    }

    /// Removes a target from a volume's record (best effort: a publish that failed).
    async fn forget_target(&self, id: &str, path: &str) {
        let forgotten = self.store.mutate(|table| {
            let Some(current) = table.get(id) else {
                return Ok(((), Vec::new()));
            };
            let mut updated = current.clone();
            updated.targets.remove(path);
            Ok::<_, Error>(((), vec![Change::Put(updated)]))
        });
        if let Ok(((), seq)) = forgotten {
            let _ = self.store.wait_durable(seq).await;
        }
    }

    async fn node_unpublish(
        &self,
        req: csi::NodeUnpublishVolumeRequest,
    ) -> Result<csi::NodeUnpublishVolumeResponse> {
        if req.volume_id.is_empty() {
            return Err(Error::Missing("volume_id"));
        }
        if req.target_path.is_empty() {
            return Err(Error::Missing("target_path"));
        }
        let record = self.volume(&req.volume_id).await?;
        // Only a target recorded for this volume is touched (it is recorded before anything is
        // put there); any other path is left as it is, whatever it holds.
        if record.targets.contains_key(&req.target_path) {
            clear_target(&PathBuf::from(&req.target_path), false).await?;
            let id = record.id.clone();
            let ((), seq) = self.store.mutate(|table| {
                let Some(current) = table.get(&id) else {
                    return Ok(((), Vec::new()));
                };
                let mut updated = current.clone();
                updated.targets.remove(&req.target_path);
                Ok::<_, Error>(((), vec![Change::Put(updated)]))
            })?;
            self.store.wait_durable(seq).await?;
            tracing::info!(volume_id = %record.id, target = %req.target_path, "volume unpublished");
        }
        // An ephemeral volume goes with its (only) target; also when the target was never
        // recorded (a publish that failed or crashed before it).
        if record.ephemeral {
            let (left, _) = self
                .store
                .read(|t| t.get(&record.id).map(|r| r.targets.len()));
            if left == Some(0) {
                self.delete(csi::DeleteVolumeRequest {
                    volume_id: record.id.clone(),
                    secrets: Default::default(),
                })
                .await?;
            }
        }
        Ok(csi::NodeUnpublishVolumeResponse {})
    }

    fn node_info(&self) -> csi::NodeGetInfoResponse {
        csi::NodeGetInfoResponse {
            node_id: self.cfg.node.id.clone(),
            max_volumes_per_node: self.cfg.max_volumes_per_node,
            accessible_topology: self.cfg.topology_key.as_ref().map(|key| csi::Topology {
                segments: [(key.clone(), self.cfg.node.topology_value.clone())]
                    .into_iter()
                    .collect(),
            }),
        }
    }
}

/// Makes `source` visible at `target`: a bind mount, or a symlink where mounts are not
/// permitted.
pub(crate) async fn expose(
    bind_mounts: bool,
    source: &Path,
    target: &Path,
    block: bool,
    readonly: bool,
) -> Result<()> {
    if bind_mounts {
        bind(source, target, block, readonly).await
    } else {
        link(source, target)
    }
}

/// Removes what `expose` put at `path` (unmounting it first); with `keep_dir`, leaves an empty
/// directory behind, as an unmounted mount point is left.
pub(crate) async fn clear_target(path: &Path, keep_dir: bool) -> Result<()> {
    if is_mount_point(path) {
        run("umount", &[&path.to_string_lossy()])
            .await
            .map_err(fs_error("unmount", path))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() || meta.is_file() => {
            std::fs::remove_file(path).map_err(|e| fs_error("remove", path)(e.to_string()))?;
            if keep_dir {
                std::fs::create_dir_all(path)
                    .map_err(|e| fs_error("create", path)(e.to_string()))?;
            }
        }
        Ok(meta) if meta.is_dir() && !keep_dir => {
            std::fs::remove_dir(path).map_err(|e| fs_error("remove", path)(e.to_string()))?
        }
        _ => {}
    }
    Ok(())
}

async fn bind(source: &Path, target: &Path, block: bool, readonly: bool) -> Result<()> {
    if !target.exists() {
        if block {
            std::fs::File::create(target).map_err(|e| fs_error("create", target)(e.to_string()))?;
        } else {
            std::fs::create_dir_all(target)
                .map_err(|e| fs_error("create", target)(e.to_string()))?;
        }
    }
    if is_mount_point(target) {
        return Ok(());
    }
    let (src, dst) = (source.to_string_lossy(), target.to_string_lossy());
    run("mount", &["--bind", &src, &dst])
        .await
        .map_err(fs_error("bind mount", target))?;
    if readonly && let Err(detail) = run("mount", &["-o", "remount,bind,ro", &dst]).await {
        let _ = run("umount", &[&dst]).await;
        return Err(fs_error("remount read-only", target)(detail));
    }
    Ok(())
}

fn link(source: &Path, target: &Path) -> Result<()> {
    match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.file_type().is_symlink() => {
            if std::fs::read_link(target).ok().as_deref() == Some(source) {
                return Ok(());
            }
            return Err(fs_error("publish at", target)(
                "a different symlink is there".into(),
            ));
        }
        // The CO may have made the target directory; an empty one is replaced by the link.
        Ok(meta) if meta.is_dir() => std::fs::remove_dir(target)
            .map_err(|e| fs_error("replace the directory", target)(e.to_string()))?,
        Ok(_) => {
            return Err(fs_error("publish at", target)(
                "a file is in the way".into(),
            ));
        }
        Err(_) => {}
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| fs_error("create", parent)(e.to_string()))?;
    }
    std::os::unix::fs::symlink(source, target)
        .map_err(|e| fs_error("symlink", target)(e.to_string()))
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Reply<csi::NodeStageVolumeResponse> {
        let req = request.into_inner();
        self.call("NodeStageVolume", async move {
            self.cfg.check_secrets("NodeStageVolume", &req.secrets)?;
            crate::staging::node_stage(self, req).await
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Reply<csi::NodeUnstageVolumeResponse> {
        self.call(
            "NodeUnstageVolume",
            crate::staging::node_unstage(self, request.into_inner()),
        )
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Reply<csi::NodePublishVolumeResponse> {
        let req = request.into_inner();
        self.call("NodePublishVolume", async move {
            self.cfg.check_secrets("NodePublishVolume", &req.secrets)?;
            self.node_publish(req).await
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Reply<csi::NodeUnpublishVolumeResponse> {
        self.call(
            "NodeUnpublishVolume",
            self.node_unpublish(request.into_inner()),
        )
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Reply<csi::NodeGetVolumeStatsResponse> {
        self.call(
            "NodeGetVolumeStats",
            crate::stats::volume_stats(self, request.into_inner()),
        )
        .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Reply<csi::NodeExpandVolumeResponse> {
        self.call(
            "NodeExpandVolume",
            crate::expansion::node_expand(self, request.into_inner()),
        )
        .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Reply<csi::NodeGetCapabilitiesResponse> {
        let multi = self.cfg.single_node_multi_writer;
        let features = self.cfg.features;
        self.call("NodeGetCapabilities", async move {
            let rpcs: Vec<NodeRpc> = [
                (multi, NodeRpc::SingleNodeMultiWriter),
                (features.stage_unstage, NodeRpc::StageUnstageVolume),
                (features.volume_stats, NodeRpc::GetVolumeStats),
                (features.expansion, NodeRpc::ExpandVolume),
                (features.volume_condition, NodeRpc::VolumeCondition),
            ]
            .into_iter()
            .filter_map(|(on, rpc)| on.then_some(rpc))
            .collect();
            Ok(csi::NodeGetCapabilitiesResponse {
                capabilities: rpcs
                    .into_iter()
                    .map(|rpc| csi::NodeServiceCapability {
                        r#type: Some(csi::node_service_capability::Type::Rpc(
                            csi::node_service_capability::Rpc { r#type: rpc as i32 },
                        )),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Reply<csi::NodeGetInfoResponse> {
        self.call("NodeGetInfo", async { Ok(self.node_info()) })
            .await
    }
}
