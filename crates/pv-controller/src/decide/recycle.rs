//! kube-controller-manager's recycler for hostPath and NFS volumes, as decisions: the Pod that
//! scrubs a Released volume with policy `Recycle` (its template, its name, its deadline), what
//! the Pod's phase means, which Pods still use the volume, and the words of the events. The
//! controller (`controller/recycle.rs`) creates the Pod, watches it and writes the outcome.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Container, HostPathVolumeSource, NFSVolumeSource, PersistentVolume, PersistentVolumeClaim, Pod,
    PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sidecar_kit::vocabulary::pod_claim_names;

use super::binder::claim_is_gone;
use super::consumers::pod_terminated;
use super::reclaim::reclaim_policy;

/// The image of kube-controller-manager's default recycler Pod (`pv-recycler`), as v1.36.2
/// makes it (the real-control-plane test compares the Pods).
pub const RECYCLER_IMAGE: &str = "registry.k8s.io/build-image/debian-base:bookworm-v1.0.6";

/// The shell line the default recycler Pod runs: everything under `/scrub` goes, and the Pod
/// fails if anything is left.
pub const SCRUB_SCRIPT: &str =
    "test -e /scrub && find /scrub -mindepth 1 -delete && test -z \"$(ls -A /scrub)\" || exit 1";

/// The event of a volume no recycler serves (a CSI volume, a local one...).
pub const NO_RECYCLER: &str = "No recycler plugin found for the volume!";

/// One plugin's recycler: its Pod template and its deadline's rule.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginRecycler {
    /// The Pod every recycle starts from; its first volume's source is replaced by the
    /// volume's own.
    pub template: Pod,
    /// The shortest deadline, in seconds.
    pub minimum_timeout: i64,
    /// Seconds added per whole GiB of the volume's capacity.
    pub timeout_increment: i64,
}

/// The recyclers of the two plugins that have one, as kube-controller-manager configures them
/// (`--pv-recycler-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct RecyclerConfig {
    /// hostPath volumes.
    pub host_path: PluginRecycler,
    /// NFS volumes.
    pub nfs: PluginRecycler,
    /// How much longer than its deadline a recycler Pod is waited for ([`PAST_DEADLINE`]; not
    /// a flag of kube-controller-manager's, whose recycler waits without end).
    pub past_deadline: std::time::Duration,
}

impl Default for RecyclerConfig {
    /// kube-controller-manager's defaults: the default template, 60 s + 30 s per GiB for
    /// hostPath, 300 s + 30 s per GiB for NFS.
    fn default() -> Self {
        RecyclerConfig {
            host_path: PluginRecycler {
                template: default_template(),
                minimum_timeout: 60,
                timeout_increment: 30,
            },
            nfs: PluginRecycler {
                template: default_template(),
                minimum_timeout: 300,
                timeout_increment: 30,
            },
            past_deadline: PAST_DEADLINE,
        }
    }
}

/// kube-controller-manager's default recycler Pod template (`NewPersistentVolumeRecyclerPodTemplate`):
/// in `default`, never restarted, one volume `vol` mounted at `/scrub`, a shell that empties
/// it.
pub fn default_template() -> Pod {
    Pod {
        metadata: ObjectMeta {
            generate_name: Some("pv-recycler-".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            active_deadline_seconds: Some(60),
            restart_policy: Some("Never".into()),
            volumes: Some(vec![Volume {
                name: "vol".into(),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: "pv-recycler".into(),
                image: Some(RECYCLER_IMAGE.into()),
                command: Some(vec!["/bin/sh".into()]),
                args: Some(vec!["-c".into(), SCRUB_SCRIPT.into()]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "vol".into(),
                    mount_path: "/scrub".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// Why a Pod template file cannot serve (kube-controller-manager's `ValidateRecyclerPodTemplate`).
pub fn validate_template(pod: &Pod) -> Result<(), String> {
    match pod.spec.as_ref().and_then(|s| s.volumes.as_ref()) {
        Some(volumes) if !volumes.is_empty() => Ok(()),
        _ => Err("does not contain any volume(s)".into()),
    }
}

/// The name of the recycler Pod of volume `pv`: one per volume, so a Pod left by an earlier
/// try is found.
pub fn pod_name(pv: &str) -> String {
    format!("recycler-for-{pv}")
}

/// The recycler Pod's deadline for `pv` (`CalculateTimeoutForVolume`): the increment per whole
/// GiB of its capacity, at least the minimum.
pub fn timeout_for(pv: &PersistentVolume, recycler: &PluginRecycler) -> i64 {
    let bytes = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| sidecar_kit::quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0);
    let gib = bytes / (1 << 30);
    gib.saturating_mul(recycler.timeout_increment)
        .max(recycler.minimum_timeout)
}

/// The Pod that scrubs `pv`, or `None` when no recycler serves its source (only hostPath and
/// NFS volumes have one): the plugin's template with the volume's name, its deadline and,
/// as the template's first volume, the volume's own hostPath (its path only) or NFS share.
/// A template without a namespace makes the Pod in `default`.
pub fn recycler_pod(pv: &PersistentVolume, config: &RecyclerConfig) -> Option<Pod> {
    let spec = pv.spec.as_ref()?;
    // The volume's source, as the Pod's first volume (a `Volume` flattens its source).
    let (recycler, source) = if let Some(host_path) = &spec.host_path {
        let source = Volume {
            host_path: Some(HostPathVolumeSource {
                path: host_path.path.clone(),
                type_: None,
            }),
            ..Default::default()
        };
        (&config.host_path, source)
    } else if let Some(nfs) = &spec.nfs {
        let source = Volume {
            nfs: Some(NFSVolumeSource {
                server: nfs.server.clone(),
                path: nfs.path.clone(),
                read_only: None,
            }),
            ..Default::default()
        };
        (&config.nfs, source)
    } else {
        return None;
    };
    let mut pod = recycler.template.clone();
    pod.metadata.name = Some(pod_name(pv.metadata.name.as_deref().unwrap_or_default()));
    pod.metadata.generate_name = None;
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".into());
    }
    let pod_spec = pod.spec.get_or_insert_with(Default::default);
    pod_spec.active_deadline_seconds = Some(timeout_for(pv, recycler));
    let volumes = pod_spec.volumes.get_or_insert_with(Vec::new);
    if volumes.is_empty() {
        volumes.push(Volume {
            name: "vol".into(),
            ..Default::default()
        });
    }
    let first = &mut volumes[0];
    *first = Volume {
        name: std::mem::take(&mut first.name),
        ..source
    };
    Some(pod)
}

/// What a recycler Pod's state means: done (`Ok`), failed with kube-controller-manager's
/// message, or not over yet (`None`).
pub fn pod_outcome(pod: &Pod) -> Option<Result<(), String>> {
    let status = pod.status.as_ref()?;
    match status.phase.as_deref() {
        Some("Succeeded") => Some(Ok(())),
        Some("Failed") => Some(Err(status
            .message
            .clone()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "pod failed, pod.Status.Message unknown".into()))),
        _ => None,
    }
}

/// How much longer than its deadline a recycler Pod is waited for before the recycle fails (a
/// Pod no node takes never starts its deadline; kube-controller-manager waits for its watches).
pub const PAST_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// How long the recycler Pod is waited for: its deadline and `past_deadline`
/// ([`RecyclerConfig::past_deadline`]).
pub fn wait_limit(pod: &Pod, past_deadline: std::time::Duration) -> std::time::Duration {
    let deadline = pod
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(0);
    std::time::Duration::from_secs(deadline) + past_deadline
}

/// The end of a recycler Pod whose deletion was seen before it finished.
pub const POD_DELETED: &str = "recycler pod was deleted";

/// The error of a recycle whose Pod of that name already existed (it is deleted; a later try
/// makes a new one).
pub const OLD_POD_FOUND: &str = "old recycler pod found, will retry later";

/// Whether the volume read again just before recycling is still to be recycled
/// (`isVolumeReleased`): its claim (`claim`, from the cache) is gone, or bound to another
/// volume. Ours also wants the policy still `Recycle` and no deletion under way: a volume whose
/// owner switched it to `Retain` meanwhile keeps its data.
pub fn recycle_stands(pv: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> bool {
    if reclaim_policy(pv) != "Recycle" || pv.metadata.deletion_timestamp.is_some() {
        return false;
    }
    if claim_is_gone(pv, claim) {
        return true;
    }
    // The claim is there with the volume's UID: released only if it bound another volume.
    let bound_elsewhere = claim
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty() && Some(v) != pv.metadata.name.as_deref());
    let has_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
        .is_some_and(|u| !u.is_empty());
    has_uid && bound_elsewhere
}

/// The Pods (`namespace/name`, sorted) not terminated that name the claim `pv` was bound to
/// (`isVolumeUsed`): a volume still in use is not scrubbed. None when a claim of that name is
/// in the cache (`cached`): the volume is released, so that is a new claim, and its Pods are
/// its own (kube-controller-manager's rule).
pub fn users_of(
    pv: &PersistentVolume,
    cached: Option<&PersistentVolumeClaim>,
    pods: &[Pod],
) -> Vec<String> {
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Vec::new();
    };
    if cached.is_some() {
        return Vec::new();
    }
    let users: BTreeSet<String> = pods
        .iter()
        .filter(|pod| pod.metadata.namespace == claim_ref.namespace)
        .filter(|pod| !pod_terminated(pod))
        .filter(|pod| {
            claim_ref
                .name
                .as_ref()
                .is_some_and(|claim| pod_claim_names(pod).contains(claim))
        })
        .map(|pod| {
            format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    users.into_iter().collect()
}

/// The Normal `VolumeFailedRecycle` event of a volume still in use.
pub fn used_by_message(users: &[String]) -> String {
    format!("Volume is used by pods: {}", users.join(","))
}

/// The Warning `VolumeFailedRecycle` event (and status message) of a recycle that failed.
pub fn failed_message(error: &str) -> String {
    format!("Recycle failed: {error}")
}

/// A recycler Pod's event, passed on to the volume as a `RecyclerPod` event.
pub fn forwarded_message(message: &str) -> String {
    format!("Recycler pod: {message}")
}

#[cfg(test)]
#[path = "recycle_tests.rs"]
mod tests;
