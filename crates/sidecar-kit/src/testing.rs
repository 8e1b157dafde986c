//! Typed builders for the objects the crates' decision tables are written over (Pods, claims,
//! volumes, attachments, CSIDrivers). Built from `k8s-openapi` types, so a misspelt field does
//! not compile, where a JSON fixture would silently decode to a default. For tests only: the
//! `testing` feature, enabled by the crates' dev-dependencies.

#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Container, EmptyDirVolumeSource, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
    PersistentVolumeSpec, PersistentVolumeStatus, Pod, PodSpec, PodStatus, SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::{
    CSIDriver, CSIDriverSpec, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
    VolumeAttachmentStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Metadata with a name, and a namespace when given.
pub fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        ..ObjectMeta::default()
    }
}

/// A Pod in `default` with one container and no volumes, phase Pending.
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder(Pod {
        metadata: meta(name, Some("default")),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some("busybox".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Pending".into()),
            ..PodStatus::default()
        }),
    })
}

pub struct PodBuilder(Pod);

impl PodBuilder {
    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_with(PodSpec::default)
    }
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }
    pub fn node(mut self, node: &str) -> Self {
        self.spec().node_name = Some(node.into());
        self
    }
    pub fn phase(mut self, phase: &str) -> Self {
        self.0.status.get_or_insert_with(PodStatus::default).phase = Some(phase.into());
        self
    }
    /// A volume named `volume` for the claim `claim`.
    pub fn claim(mut self, volume: &str, claim: &str, read_only: bool) -> Self {
        self.spec().volumes.get_or_insert_default().push(Volume {
            name: volume.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: Some(read_only),
            }),
            ..Volume::default()
        });
        self
    }
    pub fn empty_dir(mut self, volume: &str) -> Self {
        self.spec().volumes.get_or_insert_default().push(Volume {
            name: volume.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
        self
    }
    pub fn build(self) -> Pod {
        self.0
    }
}

/// A claim in `default` that names the volume `volume`.
pub fn claim(name: &str, volume: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(name, Some("default")),
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: Some(volume.into()),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// A volume without a source (for decisions that read only its claimRef and phase).
pub fn volume(name: &str) -> VolumeBuilder {
    VolumeBuilder(PersistentVolume {
        metadata: meta(name, None),
        spec: Some(PersistentVolumeSpec::default()),
        status: None,
    })
}

/// A CSI volume of `driver` with the handle `h-<name>`.
pub fn csi_volume(name: &str, driver: &str) -> VolumeBuilder {
    VolumeBuilder(PersistentVolume {
        metadata: meta(name, None),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: driver.into(),
                volume_handle: format!("h-{name}"),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

pub struct VolumeBuilder(PersistentVolume);

impl VolumeBuilder {
    fn spec(&mut self) -> &mut PersistentVolumeSpec {
        self.0
            .spec
            .get_or_insert_with(PersistentVolumeSpec::default)
    }
    fn csi(&mut self) -> &mut CSIPersistentVolumeSource {
        self.spec()
            .csi
            .get_or_insert_with(CSIPersistentVolumeSource::default)
    }
    pub fn phase(mut self, phase: &str) -> Self {
        self.0.status = Some(PersistentVolumeStatus {
            phase: Some(phase.into()),
            ..PersistentVolumeStatus::default()
        });
        self
    }
    /// `spec.claimRef` to `namespace/name`, with `uid` when given (without: pre-bound by name).
    pub fn claim_ref(mut self, namespace: &str, name: &str, uid: Option<&str>) -> Self {
        self.spec().claim_ref = Some(ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: uid.map(str::to_string),
            ..ObjectReference::default()
        });
        self
    }
    /// `spec.capacity.storage`.
    pub fn capacity(mut self, size: &str) -> Self {
        self.spec().capacity = Some(BTreeMap::from([(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(size.into()),
        )]));
        self
    }
    /// A label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
    pub fn access_modes(mut self, modes: &[&str]) -> Self {
        self.spec().access_modes = Some(modes.iter().map(|m| m.to_string()).collect());
        self
    }
    pub fn attribute(mut self, key: &str, value: &str) -> Self {
        self.csi()
            .volume_attributes
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
    pub fn stage_secret(mut self, name: &str, namespace: &str) -> Self {
        self.csi().node_stage_secret_ref = Some(SecretReference {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
        });
        self
    }
    pub fn publish_secret(mut self, name: &str, namespace: &str) -> Self {
        self.csi().node_publish_secret_ref = Some(SecretReference {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
        });
        self
    }
    pub fn build(self) -> PersistentVolume {
        self.0
    }
}

/// A CSIDriver object.
pub fn csi_driver(name: &str, attach_required: bool, pod_info_on_mount: bool) -> CSIDriver {
    CSIDriver {
        metadata: meta(name, None),
        spec: CSIDriverSpec {
            attach_required: Some(attach_required),
            pod_info_on_mount: Some(pod_info_on_mount),
            ..CSIDriverSpec::default()
        },
    }
}

/// A VolumeAttachment of `driver` for the PV `volume` on `node`, without a status.
pub fn attachment(name: &str, driver: &str, node: &str, volume: &str) -> AttachmentBuilder {
    AttachmentBuilder(VolumeAttachment {
        metadata: meta(name, None),
        spec: VolumeAttachmentSpec {
            attacher: driver.into(),
            node_name: node.into(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(volume.into()),
                ..VolumeAttachmentSource::default()
            },
        },
        status: None,
    })
}

pub struct AttachmentBuilder(VolumeAttachment);

impl AttachmentBuilder {
    /// `status.attached`, with `metadata` as the attachment metadata.
    pub fn attached(mut self, attached: bool, metadata: &[(&str, &str)]) -> Self {
        self.0.status = Some(VolumeAttachmentStatus {
            attached,
            attachment_metadata: Some(
                metadata
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..VolumeAttachmentStatus::default()
        });
        self
    }
    pub fn build(self) -> VolumeAttachment {
        self.0
    }
}

// Waiting on observable state with a deadline: every poll of the tests goes through here, one
// step, one failure message.

/// How often a condition is looked at again.
pub const STEP: Duration = Duration::from_millis(50);

fn message(what: &str, seen: &str, context: &str) -> String {
    let seen = if seen.is_empty() {
        String::new()
    } else {
        format!(": last seen {seen}")
    };
    let context = if context.is_empty() {
        String::new()
    } else {
        format!("\n{context}")
    };
    format!("timed out waiting for {what}{seen}{context}")
}

/// The body of an HTTP/1.0 GET on loopback (a sidecar's `/metrics` or `/healthz`): a test's
/// plain TCP client, no curl needed. Panics when the request fails.
#[allow(clippy::unwrap_used)]
pub async fn http_get(port: u16, path: &str) -> String {
    crate::http::get_local(port, path).await.unwrap()
}

/// Whether a metrics page has the series `wanted`: a whole line when it gives a value
/// (`name{labels} 1` is not found in a line `name{labels} 10`), else a line of that series
/// whatever its value (`name{labels}`), or of that family (a bare `name`).
pub fn has_metric(page: &str, wanted: &str) -> bool {
    let bare = !wanted.contains(['{', ' ']);
    page.lines().any(|line| {
        line == wanted
            || line.starts_with(&format!("{wanted} "))
            || (bare && line.starts_with(&format!("{wanted}{{")))
    })
}

/// Polls `f` until it gives `Ok`; an `Err` says what was seen instead. After `timeout` the
/// test fails naming `what`, the last thing seen and `context()` (a process's log).
pub async fn poll_for<T, F, Fut>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut f: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let seen = match f().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            message(what, &seen, &context())
        );
        tokio::time::sleep(STEP).await;
    }
}

/// Polls `f` until it holds (as [`poll_for`]).
pub async fn poll_until<F, Fut>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut f: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    poll_for(what, timeout, context, || {
        let holds = f();
        async move {
            if holds.await {
                Ok(())
            } else {
                Err(String::new())
            }
        }
    })
    .await
}

/// [`poll_for`] for a test without a runtime: the thread sleeps between looks.
pub fn poll_blocking<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let seen = match f() {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            message(what, &seen, "")
        );
        std::thread::sleep(STEP);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {

    #[test]
    fn a_metric_is_found_by_its_whole_line() {
        let page = "# HELP x_total X.\nx_total{a=\"b\"} 10\nx_total{a=\"c\"} 1\ny_seconds_bucket{le=\"1\"} 3\nz 7\n";
        let rows = [
            ("x_total{a=\"b\"} 10", true),
            ("x_total{a=\"b\"} 1", false),
            ("x_total{a=\"c\"} 1", true),
            ("x_total{a=\"b\"}", true),
            ("x_total{a=\"d\"}", false),
            ("y_seconds_bucket", true),
            ("y_seconds", false),
            ("z", true),
            ("z 7", true),
            ("z 70", false),
        ];
        for (wanted, found) in rows {
            assert_eq!(has_metric(page, wanted), found, "{wanted}");
        }
    }

    use super::*;
    use serde_json::json;

    /// The builders write the fields a JSON fixture would, under the API's names.
    #[test]
    fn builders_write_the_api_fields() {
        let p = pod("app")
            .uid("u1")
            .node("n1")
            .claim("data", "c1", true)
            .empty_dir("scratch")
            .build();
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["spec"]["nodeName"], "n1");
        assert_eq!(
            v["spec"]["volumes"],
            json!([
                {"name": "data", "persistentVolumeClaim": {"claimName": "c1", "readOnly": true}},
                {"name": "scratch", "emptyDir": {}},
            ])
        );
        let pv = csi_volume("v", "d")
            .phase("Bound")
            .stage_secret("s", "ns")
            .build();
        let v = serde_json::to_value(&pv).unwrap();
        assert_eq!(v["spec"]["csi"]["volumeHandle"], "h-v");
        assert_eq!(
            v["spec"]["csi"]["nodeStageSecretRef"],
            json!({"name": "s", "namespace": "ns"})
        );
        assert_eq!(v["status"]["phase"], "Bound");
        let va = attachment("a", "d", "n1", "v")
            .attached(true, &[("k", "x")])
            .build();
        let v = serde_json::to_value(&va).unwrap();
        assert_eq!(v["spec"]["source"]["persistentVolumeName"], "v");
        assert_eq!(
            v["status"],
            json!({"attached": true, "attachmentMetadata": {"k": "x"}})
        );
    }
}
