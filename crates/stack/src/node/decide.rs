//! Pure decisions of the node agent (kubelet's volume manager): where a Pod's volumes go on
//! disk, what each of its volumes needs before the Pod can run (a bound claim, a CSI volume
//! of our driver, an attachment when the driver requires one), the Pod's status once they are
//! ready, and what a node reports in use.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// kubelet's directories under the node's root (`<data-dir>/kubelet/<node>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The root.
    pub root: PathBuf,
}

impl Paths {
    /// `pods/`.
    pub fn pods(&self) -> PathBuf {
        self.root.join("pods")
    }

    /// A Pod's CSI volume directory: `pods/<uid>/volumes/kubernetes.io~csi/<pv>`.
    pub fn pod_volume(&self, pod_uid: &str, pv: &str) -> PathBuf {
        self.pods()
            .join(pod_uid)
            .join("volumes")
            .join("kubernetes.io~csi")
            .join(pv)
    }

    /// NodePublishVolume's target: `<pod volume>/mount`.
    pub fn target(&self, pod_uid: &str, pv: &str) -> PathBuf {
        self.pod_volume(pod_uid, pv).join("mount")
    }

    /// The driver's staging directories: `plugins/kubernetes.io/csi/<driver>`.
    pub fn plugin(&self, driver: &str) -> PathBuf {
        self.root
            .join("plugins")
            .join("kubernetes.io")
            .join("csi")
            .join(driver)
    }

    /// A volume's staging directory: `<plugin>/<sha256 of the handle>`.
    pub fn staging(&self, driver: &str, handle: &str) -> PathBuf {
        self.plugin(driver)
            .join(sidecar_kit::pv_csi::sha256_hex(handle.as_bytes()))
    }

    /// Where the recycler stages and publishes a volume: `recycler/<pv>` (`stage`, `mount`).
    pub fn recycler(&self, pv: &str) -> PathBuf {
        self.root.join("recycler").join(pv)
    }

    /// NodeStageVolume's target: `<staging>/globalmount`.
    pub fn staging_target(&self, driver: &str, handle: &str) -> PathBuf {
        self.staging(driver, handle).join("globalmount")
    }
}

/// What the node records next to a staged or published volume (`vol_data.json`), written
/// before the call so that a crash after it still leaves a record to undo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeData {
    /// The driver.
    pub driver_name: String,
    /// The volume handle.
    pub volume_handle: String,
    /// The PV.
    pub spec_vol_id: String,
    /// The node.
    pub node_name: String,
    /// Whether the call succeeded (false: in flight, or failed).
    #[serde(default)]
    pub done: bool,
    /// Whether the path showed a volume (a mount point or a link) right after the call: only
    /// then is a path that shows nothing later a lost mount (a driver may stage without
    /// mounting anything).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mounted: bool,
    /// A CSI ephemeral inline volume (not reported in use: nothing attaches it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
}

/// The records whose volume was shown at `path_of(dir)` when set up and is no longer (a reboot,
/// an unmount behind the node's back): set up again, or a Pod writes into a plain directory.
pub fn lost_mounts(
    records: &[(PathBuf, VolumeData)],
    path_of: impl Fn(&Path) -> PathBuf,
    shows: impl Fn(&Path) -> bool,
) -> Vec<&(PathBuf, VolumeData)> {
    records
        .iter()
        .filter(|(dir, data)| data.done && data.mounted && !shows(&path_of(dir)))
        .collect()
}

pub use sidecar_kit::secrets::SecretRef;

/// One of a Pod's volumes, ready to be staged and published.
#[derive(Debug, Clone, PartialEq)]
pub struct PodVolume {
    /// The PV.
    pub pv: String,
    /// The volume handle.
    pub handle: String,
    /// The driver.
    pub driver: String,
    /// The capability (from the PV).
    pub capability: csi::VolumeCapability,
    /// Read-only: the Pod's claim reference or the PV says so.
    pub readonly: bool,
    /// The attachment's metadata (empty without attach).
    pub publish_context: HashMap<String, String>,
    /// The PV's volume attributes (NodeStageVolume's context).
    pub attributes: HashMap<String, String>,
    /// NodePublishVolume's context: the attributes and, when the CSIDriver asks, the Pod.
    pub publish_attributes: HashMap<String, String>,
    /// `nodeStageSecretRef`.
    pub stage_secret: Option<SecretRef>,
    /// `nodePublishSecretRef`.
    pub publish_secret: Option<SecretRef>,
    /// A CSI ephemeral inline volume (`pv` is the Pod's volume name): never staged nor
    /// attached, made and removed by the driver at publish and unpublish.
    pub ephemeral: bool,
    /// The node's part of an expansion, when its claim awaits it.
    pub expand: Option<super::decide_expand::NodeExpansion>,
    /// `nodeExpandSecretRef`.
    pub expand_secret: Option<SecretRef>,
}

/// What to do for one Pod on this node.
#[derive(Debug, Clone, PartialEq)]
pub enum PodPlan {
    /// Not this node's, or no longer there.
    Skip,
    /// Every volume is ready to be set up.
    SetUp(Vec<PodVolume>),
    /// A volume is not ready (why).
    Wait(String),
    /// The Pod is being deleted or finished: tear its volumes down (and, when deleted,
    /// finish the deletion).
    TearDown {
        /// Delete the Pod object once its volumes are gone.
        finish_deletion: bool,
    },
}

/// The objects a plan reads.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    /// This node.
    pub node: &'a str,
    /// Our driver.
    pub driver: &'a str,
    /// Claims by (namespace, name).
    pub claims: &'a BTreeMap<(String, String), &'a PersistentVolumeClaim>,
    /// Volumes by name.
    pub volumes: &'a BTreeMap<String, &'a PersistentVolume>,
    /// CSIDrivers by name.
    pub drivers: &'a BTreeMap<String, &'a CSIDriver>,
    /// VolumeAttachments by name.
    pub attachments: &'a BTreeMap<String, &'a VolumeAttachment>,
}

/// The plan for one Pod.
pub fn plan_pod(pod: &Pod, world: World<'_>) -> PodPlan {
    let spec = match &pod.spec {
        Some(spec) if spec.node_name.as_deref() == Some(world.node) => spec,
        _ => return PodPlan::Skip,
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return PodPlan::TearDown {
            finish_deletion: true,
        };
    }
    if sidecar_kit::vocabulary::pod_finished(pod) {
        return PodPlan::TearDown {
            finish_deletion: false,
        };
    }
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let mut ready = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        if let Some(inline) = &volume.csi {
            match super::decide_inline::inline_volume(pod, spec, &volume.name, inline, world) {
                Ok(ready_volume) => ready.push(ready_volume),
                Err(why) => return PodPlan::Wait(why),
            }
            continue;
        }
        let (claim_name, claim_readonly) = if let Some(c) = &volume.persistent_volume_claim {
            (c.claim_name.clone(), c.read_only.unwrap_or(false))
        } else if volume.ephemeral.is_some() {
            (format!("{pod_name}-{}", volume.name), false)
        } else {
            // Not a claim (emptyDir, configMap...): nothing for the volume manager here.
            continue;
        };
        let Some(claim) = world.claims.get(&(namespace.clone(), claim_name.clone())) else {
            return PodPlan::Wait(format!("persistentvolumeclaim {claim_name:?} not found"));
        };
        if volume.ephemeral.is_some() && !sidecar_kit::vocabulary::claim_is_for_pod(claim, pod) {
            // As kubelet: a claim of the name that the Pod does not own is not its volume.
            return PodPlan::Wait(format!("PVC {claim_name} was not created for the pod"));
        }
        let Some(pv_name) = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|v| !v.is_empty())
        else {
            return PodPlan::Wait(format!("claim {claim_name:?} is not bound yet"));
        };
        let Some(pv) = world.volumes.get(&pv_name) else {
            return PodPlan::Wait(format!("persistentvolume {pv_name:?} not found"));
        };
        // An in-tree PV of a migrated plugin is set up through its CSI driver, as kubelet does.
        let Some(pv_spec) = sidecar_kit::migration::csi_spec(pv) else {
            return PodPlan::Wait(format!(
                "persistentvolume {pv_name:?} has no CSI source (nor an in-tree one that translates)"
            ));
        };
        let pv_spec = pv_spec.as_ref();
        let source = match sidecar_kit::pv_csi::csi_source(pv_spec) {
            Ok(source) => source,
            Err(error) => return PodPlan::Wait(format!("volume {pv_name:?}: {error}")),
        };
        if source.driver != world.driver {
            return PodPlan::Wait(format!(
                "driver name {} not found in the list of registered CSI drivers",
                source.driver
            ));
        }
        let capability = match sidecar_kit::pv_csi::capability(pv_spec, false, "") {
            Ok(c) => c,
            Err(error) => return PodPlan::Wait(format!("volume {pv_name:?}: {error}")),
        };
        let csi_driver = world.drivers.get(&source.driver);
        let attach = sidecar_kit::pv_csi::attach_required(csi_driver.copied());
        let mut publish_context = HashMap::new();
        if attach {
            let name = sidecar_kit::pv_csi::attachment_name(
                &source.volume_handle,
                &source.driver,
                world.node,
            );
            let status = world
                .attachments
                .get(&name)
                .and_then(|va| va.status.as_ref());
            match status {
                Some(s) if s.attached => {
                    publish_context = s
                        .attachment_metadata
                        .clone()
                        .map(|m| m.into_iter().collect())
                        .unwrap_or_default();
                }
                _ => {
                    return PodPlan::Wait(format!(
                        "volume {pv_name:?} is not attached to {} yet (VolumeAttachment {name})",
                        world.node
                    ));
                }
            }
        }
        let (attributes, publish_attributes) = super::decide_inline::volume_contexts(
            source.volume_attributes.as_ref(),
            csi_driver.copied(),
            pod,
            spec,
            false,
        );
        ready.push(PodVolume {
            pv: pv_name,
            handle: source.volume_handle.clone(),
            driver: source.driver.clone(),
            capability,
            readonly: claim_readonly || source.read_only.unwrap_or(false),
            publish_context,
            attributes,
            publish_attributes,
            stage_secret: SecretRef::of(source.node_stage_secret_ref.as_ref()),
            publish_secret: SecretRef::of(source.node_publish_secret_ref.as_ref()),
            ephemeral: false,
            expand: super::decide_expand::node_expansion(
                claim,
                pv,
                claim_readonly || source.read_only.unwrap_or(false),
            ),
            expand_secret: SecretRef::of(source.node_expand_secret_ref.as_ref()),
        });
    }
    PodPlan::SetUp(ready)
}

/// How long a Pod waits for its volumes before a `FailedMount` event says why.
pub const REPORT_WAIT_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// The `FailedMount` message for a Pod that has waited `waited` for `reason`, when one is due:
/// after [`REPORT_WAIT_AFTER`], once per reason (`last` is the reason reported before).
pub fn wait_report(
    waited: std::time::Duration,
    last: Option<&str>,
    reason: &str,
) -> Option<String> {
    (waited >= REPORT_WAIT_AFTER && last != Some(reason))
        .then(|| format!("Unable to attach or mount volumes: {reason}"))
}

/// Whether the Pod's status already says it runs.
pub fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The status patch of a Pod whose volumes are ready: Running, every condition true and
/// every container running (no container runs here: the volumes are what is real).
pub fn running_status(pod: &Pod, now: &str) -> Value {
    let containers: Vec<Value> = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name,
                        "image": c.image.clone().unwrap_or_default(),
                        "imageID": "",
                        "ready": true,
                        "started": true,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "startTime": now,
        "conditions": [
            condition("PodReadyToStartContainers"),
            condition("Initialized"),
            condition("Ready"),
            condition("ContainersReady"),
            condition("PodScheduled"),
        ],
        "containerStatuses": containers,
    }})
}

/// The unique names kubelet reports in `status.volumesInUse` for the volumes recorded on
/// disk (staged or published), sorted.
pub fn volumes_in_use<'a>(records: impl IntoIterator<Item = &'a VolumeData>) -> Vec<String> {
    let names: BTreeSet<String> = records
        .into_iter()
        .filter(|d| !d.ephemeral)
        .map(|d| sidecar_kit::pv_csi::unique_volume_name(&d.driver_name, &d.volume_handle))
        .collect();
    names.into_iter().collect()
}

/// The staged volumes no published volume and no wanted volume needs any more.
pub fn unneeded_stages<'a>(
    staged: &'a [(PathBuf, VolumeData)],
    published: &[(PathBuf, VolumeData)],
    wanted_handles: &BTreeSet<String>,
) -> Vec<&'a (PathBuf, VolumeData)> {
    let used: BTreeSet<&str> = published
        .iter()
        .map(|(_, d)| d.volume_handle.as_str())
        .collect();
    staged
        .iter()
        .filter(|(_, d)| {
            !used.contains(d.volume_handle.as_str()) && !wanted_handles.contains(&d.volume_handle)
        })
        .collect()
}

/// The Pod uid of a published volume's directory (`pods/<uid>/volumes/kubernetes.io~csi/<pv>`).
pub fn pod_uid_of(paths: &Paths, dir: &Path) -> Option<String> {
    let rest = dir.strip_prefix(paths.pods()).ok()?;
    rest.components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
}
