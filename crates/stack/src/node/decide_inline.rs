//! CSI ephemeral inline volumes (`spec.volumes[].csi`), as kubelet sets them up: only for a
//! CSIDriver whose `volumeLifecycleModes` has `Ephemeral`, never staged nor attached, published
//! under kubelet's volume id (`csi-<sha256 of the Pod UID and the volume name>`) with the
//! volume's attributes and, when the CSIDriver asks for the Pod's info, that info and
//! `csi.storage.k8s.io/ephemeral: "true"`.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, PersistentVolumeSpec, Pod, PodSpec,
};
use k8s_openapi::api::storage::v1::CSIDriver;

use super::decide::{PodVolume, SecretRef, World};

/// The lifecycle mode an inline volume needs.
const EPHEMERAL: &str = "Ephemeral";

/// kubelet's volume id of an inline volume: `csi-` and the SHA-256 of the Pod's UID followed
/// by the volume's name, in hex.
pub fn inline_handle(pod_uid: &str, volume: &str) -> String {
    let hex = sidecar_kit::pv_csi::sha256_hex(format!("{pod_uid}{volume}").as_bytes());
    format!("csi-{hex}")
}

/// The lifecycle modes of a CSIDriver (`Persistent` when it lists none, or when there is no
/// CSIDriver, as kubelet defaults them).
fn modes(driver: Option<&CSIDriver>) -> Vec<String> {
    driver
        .and_then(|d| d.spec.volume_lifecycle_modes.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| vec!["Persistent".to_string()])
}

/// The Pod's info for NodePublishVolume's context, when the CSIDriver has `podInfoOnMount`.
pub fn pod_info(pod: &Pod, spec: &PodSpec, ephemeral: bool) -> HashMap<String, String> {
    [
        (
            "csi.storage.k8s.io/pod.name",
            pod.metadata.name.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace",
            pod.metadata.namespace.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.uid",
            pod.metadata.uid.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/serviceAccount.name",
            spec.service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
        ),
        ("csi.storage.k8s.io/ephemeral", ephemeral.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A volume's attributes (NodeStageVolume's context) and NodePublishVolume's context: the
/// attributes and, when the CSIDriver asks for it, the Pod's info.
pub fn volume_contexts(
    volume_attributes: Option<&std::collections::BTreeMap<String, String>>,
    csi_driver: Option<&CSIDriver>,
    pod: &Pod,
    spec: &PodSpec,
    ephemeral: bool,
) -> (HashMap<String, String>, HashMap<String, String>) {
    let attributes: HashMap<String, String> = volume_attributes
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let mut publish = attributes.clone();
    if csi_driver.is_some_and(|d| d.spec.pod_info_on_mount == Some(true)) {
        publish.extend(pod_info(pod, spec, ephemeral));
    }
    (attributes, publish)
}

/// An inline volume of the Pod, ready to publish, or why it is not.
pub fn inline_volume(
    pod: &Pod,
    spec: &PodSpec,
    name: &str,
    source: &CSIVolumeSource,
    world: World<'_>,
) -> Result<PodVolume, String> {
    if source.driver != world.driver {
        return Err(format!(
            "driver name {} not found in the list of registered CSI drivers",
            source.driver
        ));
    }
    let csi_driver = world.drivers.get(&source.driver).copied();
    let modes = modes(csi_driver);
    if !modes.iter().any(|m| m == EPHEMERAL) {
        return Err(format!(
            "volume mode \"{EPHEMERAL}\" not supported by driver {} (only supports {modes:?})",
            source.driver
        ));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let handle = inline_handle(&uid, name);
    // The capability kubelet sends: a mount of the given fsType, single-node writer.
    let as_pv = PersistentVolumeSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        csi: Some(CSIPersistentVolumeSource {
            driver: source.driver.clone(),
            volume_handle: handle.clone(),
            fs_type: source.fs_type.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let capability = sidecar_kit::pv_csi::capability(&as_pv, false, "")
        .map_err(|error| format!("volume {name:?}: {error}"))?;
    let (attributes, publish_attributes) = volume_contexts(
        source.volume_attributes.as_ref(),
        csi_driver,
        pod,
        spec,
        true,
    );
    let publish_secret = source
        .node_publish_secret_ref
        .as_ref()
        .filter(|r| !r.name.is_empty())
        .map(|r| SecretRef {
            name: r.name.clone(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        });
    Ok(PodVolume {
        pv: name.to_string(),
        handle,
        driver: source.driver.clone(),
        capability,
        readonly: source.read_only.unwrap_or(false),
        publish_context: HashMap::new(),
        attributes,
        publish_attributes,
        stage_secret: None,
        publish_secret,
        ephemeral: true,
        expand: None,
        expand_secret: None,
    })
}
