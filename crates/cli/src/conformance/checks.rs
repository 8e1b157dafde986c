//! The checks of `volstack conformance`, each with real objects in the stack around the driver:
//! claims of the default class, Pods whose volumes the node agent stages and publishes, files
//! written and read back through the volume's directory on the node, VolumeSnapshots.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use sidecar_kit::driver::DriverInfo;
use stack::snapshots::types::VolumeSnapshot;

use super::ConformanceArgs;
use crate::stack::Running;

const NS: &str = "default";
const FILE: &str = "conformance.txt";
/// Prefix of every object the checks make.
const PREFIX: &str = "conf-";

/// What the checks share: the stack's client, where the nodes keep Pods' volumes, the driver,
/// and what earlier checks made.
pub struct World {
    client: kube::Client,
    kubelet: PathBuf,
    socket: String,
    driver: String,
    list_volumes: bool,
    size: String,
    /// The content written by `publish`, read back by the later checks.
    content: String,
    /// The volume handles made, for `delete` to look for at the driver.
    handles: BTreeSet<String>,
    /// What the check in progress waits for (a timeout's message says it).
    waiting: std::sync::Arc<parking_lot::Mutex<String>>,
}

type Checked = Result<(), String>;

impl World {
    /// The world of a run against the stack `running` started.
    pub fn new(running: &Running, args: &ConformanceArgs, info: &DriverInfo) -> World {
        World {
            client: running.stack.client.clone(),
            kubelet: running.data_dir.join("kubelet"),
            socket: args.driver_endpoint.clone(),
            driver: info.name.clone(),
            list_volumes: info.has(Rpc::ListVolumes),
            size: args.volume_size.clone(),
            content: format!("volstack conformance {:016x}\n", rand::random::<u64>()),
            handles: BTreeSet::new(),
            waiting: Default::default(),
        }
    }

    /// Runs the capability `name`.
    pub async fn check(&mut self, name: &str) -> Checked {
        match name {
            "provision" => self.provision().await,
            "attach" => self.attach().await,
            "publish" => self.publish().await,
            "republish" => self.republish().await,
            "snapshot" => self.snapshot().await,
            "clone" => self.clone_volume().await,
            "delete" => self.delete().await,
            other => Err(format!("no check named {other:?}")),
        }
    }

    /// What the check in progress was waiting for.
    pub fn waiting(&self) -> String {
        self.waiting.lock().clone()
    }

    /// Polls `f` every 200 ms until it gives a value (the caller's timeout bounds it).
    async fn until<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        *self.waiting.lock() = what.to_string();
        loop {
            if let Some(value) = f().await {
                return Ok(value);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The events of the objects the checks made, newest last (at most 10).
    pub async fn events(&self) -> Vec<String> {
        let Ok(list) = Api::<Event>::namespaced(self.client.clone(), NS)
            .list(&Default::default())
            .await
        else {
            return Vec::new();
        };
        let mut events: Vec<String> = list
            .items
            .iter()
            .filter(|e| {
                e.involved_object
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(PREFIX))
            })
            .map(|e| {
                format!(
                    "{}/{}: {} {} {}",
                    e.involved_object.kind.as_deref().unwrap_or_default(),
                    e.involved_object.name.as_deref().unwrap_or_default(),
                    e.type_.as_deref().unwrap_or_default(),
                    e.reason.as_deref().unwrap_or_default(),
                    e.message.as_deref().unwrap_or_default()
                )
            })
            .collect();
        let keep = events.len().saturating_sub(10);
        events.drain(..keep);
        events
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create<K>(&self, api: &Api<K>, value: Value) -> Checked
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let object: K = serde_json::from_value(value).map_err(|e| e.to_string())?;
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => Ok(()),
            Err(error) => Err(format!("create: {error}")),
        }
    }

    async fn claim(&self, name: &str, data_source: Option<Value>) -> Checked {
        let mut claim = json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "hostpath",
                     "resources": {"requests": {"storage": self.size}}},
        });
        if let Some(source) = data_source {
            claim["spec"]["dataSource"] = source;
        }
        self.create(&self.claims(), claim).await
    }

    /// Waits until the claim is Bound to a volume of the driver; returns the volume.
    async fn bound(&mut self, name: &str) -> Result<PersistentVolume, String> {
        let volume = self
            .until(&format!("claim {name} Bound"), || async {
                let claim = self.claims().get_opt(name).await.ok()??;
                (claim.status?.phase.as_deref() == Some("Bound")).then_some(())?;
                claim.spec?.volume_name
            })
            .await?;
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get(&volume)
            .await
            .map_err(|e| format!("read volume {volume}: {e}"))?;
        let csi = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .ok_or_else(|| format!("volume {volume} has no CSI source"))?;
        if csi.driver != self.driver {
            return Err(format!("volume {volume} is driver {:?}'s", csi.driver));
        }
        self.handles.insert(csi.volume_handle.clone());
        Ok(pv)
    }

    async fn pod(&self, name: &str, claim: &str) -> Checked {
        self.create(
            &self.pods(),
            json!({
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "app", "image": "busybox"}],
                         "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
            }),
        )
        .await
    }

    /// Waits until the Pod runs; returns the directory its volume is published at.
    async fn published(&self, name: &str, claim: &str) -> Result<PathBuf, String> {
        let (node, uid) = self
            .until(&format!("Pod {name} Running"), || async {
                let pod = self.pods().get_opt(name).await.ok()??;
                (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(())?;
                Some((pod.spec?.node_name?, pod.metadata.uid?))
            })
            .await?;
        let pv = self
            .claims()
            .get(claim)
            .await
            .ok()
            .and_then(|c| c.spec?.volume_name)
            .ok_or_else(|| format!("claim {claim} has no volume"))?;
        Ok(self
            .kubelet
            .join(node)
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi")
            .join(pv)
            .join("mount"))
    }

    async fn delete_pod(&self, name: &str) -> Checked {
        match self.pods().delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(error) if sidecar_kit::api_errors::is_not_found(&error) => {}
            Err(error) => return Err(format!("delete Pod {name}: {error}")),
        }
        self.until(
            &format!("Pod {name} gone (its volume unpublished)"),
            || async { matches!(self.pods().get_opt(name).await, Ok(None)).then_some(()) },
        )
        .await
    }

    /// Reads the file through a new Pod on `claim`, then lets the Pod go.
    async fn read_back(&self, pod: &str, claim: &str) -> Checked {
        self.pod(pod, claim).await?;
        let dir = self.published(pod, claim).await?;
        let read = std::fs::read_to_string(dir.join(FILE))
            .map_err(|e| format!("read {}: {e}", dir.join(FILE).display()))?;
        self.delete_pod(pod).await?;
        if read != self.content {
            return Err(format!(
                "{FILE} through Pod {pod} holds {read:?}, not what was written"
            ));
        }
        Ok(())
    }

    async fn provision(&mut self) -> Checked {
        self.claim("conf-data", None).await?;
        let pv = self.bound("conf-data").await?;
        if self.list_volumes {
            let handle = pv
                .spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .unwrap_or_default();
            if !self.driver_volumes().await?.contains(&handle) {
                return Err(format!("ListVolumes does not list {handle:?}"));
            }
        }
        Ok(())
    }

    async fn attach(&mut self) -> Checked {
        self.pod("conf-writer", "conf-data").await?;
        let pv = self
            .claims()
            .get("conf-data")
            .await
            .ok()
            .and_then(|c| c.spec?.volume_name)
            .ok_or("claim conf-data has no volume")?;
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        self.until(&format!("a VolumeAttachment of {pv} attached"), || async {
            let list = api.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|va| {
                    va.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str())
                        && va.spec.attacher == self.driver
                        && va.status.as_ref().is_some_and(|s| s.attached)
                })
                .then_some(())
        })
        .await
    }

    async fn publish(&mut self) -> Checked {
        self.pod("conf-writer", "conf-data").await?;
        let dir = self.published("conf-writer", "conf-data").await?;
        std::fs::write(dir.join(FILE), &self.content)
            .map_err(|e| format!("write {}: {e}", dir.join(FILE).display()))?;
        let read = std::fs::read_to_string(dir.join(FILE))
            .map_err(|e| format!("read {}: {e}", dir.join(FILE).display()))?;
        (read == self.content)
            .then_some(())
            .ok_or_else(|| "the file read back differs from what was written".to_string())
    }

    async fn republish(&mut self) -> Checked {
        self.delete_pod("conf-writer").await?;
        self.read_back("conf-reader", "conf-data").await
    }

    async fn snapshot(&mut self) -> Checked {
        let snapshots = kube::api::ApiResource::erase::<VolumeSnapshot>(&());
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.client.clone(), NS, &snapshots);
        self.create(
            &api,
            json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "conf-snap"},
                "spec": {"volumeSnapshotClassName": "csi-hostpath-snapclass",
                         "source": {"persistentVolumeClaimName": "conf-data"}},
            }),
        )
        .await?;
        self.until("VolumeSnapshot conf-snap readyToUse", || async {
            let snap = api.get_opt("conf-snap").await.ok()??;
            (snap.data["status"]["readyToUse"] == json!(true)).then_some(())
        })
        .await?;
        self.claim(
            "conf-restore",
            Some(json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "conf-snap"})),
        )
        .await?;
        self.bound("conf-restore").await?;
        self.read_back("conf-restore-reader", "conf-restore").await
    }

    async fn clone_volume(&mut self) -> Checked {
        self.claim(
            "conf-clone",
            Some(json!({"kind": "PersistentVolumeClaim", "name": "conf-data"})),
        )
        .await?;
        self.bound("conf-clone").await?;
        self.read_back("conf-clone-reader", "conf-clone").await
    }

    async fn delete(&mut self) -> Checked {
        let pods = self
            .pods()
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        for pod in pods.items.iter().filter_map(|p| p.metadata.name.clone()) {
            self.delete_pod(&pod).await?;
        }
        let snapshots = kube::api::ApiResource::erase::<VolumeSnapshot>(&());
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(self.client.clone(), NS, &snapshots);
        let _ = api.delete("conf-snap", &DeleteParams::default()).await;
        let claims = self
            .claims()
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        for claim in claims.items.iter().filter_map(|c| c.metadata.name.clone()) {
            if let Err(error) = self.claims().delete(&claim, &DeleteParams::default()).await
                && !sidecar_kit::api_errors::is_not_found(&error)
            {
                return Err(format!("delete claim {claim}: {error}"));
            }
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        self.until("every PV deleted", || async {
            pvs.list(&Default::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        })
        .await?;
        self.until("the snapshot deleted", || async {
            matches!(api.get_opt("conf-snap").await, Ok(None)).then_some(())
        })
        .await?;
        if self.list_volumes {
            let left: Vec<String> = self
                .driver_volumes()
                .await?
                .into_iter()
                .filter(|v| self.handles.contains(v))
                .collect();
            if !left.is_empty() {
                return Err(format!("the driver still lists {left:?}"));
            }
        }
        Ok(())
    }

    /// The volume ids ListVolumes gives (every page).
    async fn driver_volumes(&self) -> Result<Vec<String>, String> {
        let channel = sidecar_kit::csi::connect(&self.socket)
            .await
            .map_err(|e| format!("connect to the driver: {e}"))?;
        let mut client = csi::controller_client::ControllerClient::new(channel);
        let mut ids = Vec::new();
        let mut token = String::new();
        loop {
            let page = client
                .list_volumes(csi::ListVolumesRequest {
                    max_entries: 0,
                    starting_token: token.clone(),
                })
                .await
                .map_err(|e| format!("ListVolumes: {e}"))?
                .into_inner();
            ids.extend(
                page.entries
                    .into_iter()
                    .filter_map(|e| e.volume.map(|v| v.volume_id)),
            );
            if page.next_token.is_empty() {
                return Ok(ids);
            }
            token = page.next_token;
        }
    }
}
