//! The checks of `volstack conformance`, each with real objects in the stack around the driver:
//! claims of the default class, Pods whose volumes the node agent stages and publishes, files
//! written and read back through the volume's directory on the node, VolumeSnapshots; and the
//! driver's own calls, repeated (`calls.rs`).

mod calls;
mod lifecycle;
mod modes;
mod resize;
pub mod restart;
mod topology;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use csi::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use sidecar_kit::driver::DriverInfo;

use super::ConformanceArgs;
use crate::stack::Running;

const NS: &str = "default";
const FILE: &str = "conformance.txt";
/// The class the stack makes for the driver.
const CLASS: &str = "hostpath";

/// How a check that ran without failing ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// It passed; what it found (the access modes accepted, for one).
    Passed(String),
    /// The driver declined what the check needs (a Block volume, say) or its node service does
    /// not advertise it: reported as skipped, with why.
    Declined(String),
}

/// What the checks share: the stack's client, where the nodes keep Pods' volumes, the driver,
/// and what earlier checks made.
pub struct World {
    client: kube::Client,
    kubelet: PathBuf,
    socket: String,
    /// node-1's node service.
    node_socket: String,
    driver: String,
    info: DriverInfo,
    parameters: BTreeMap<String, String>,
    /// The parameters of the VolumeAttributesClass `modify` makes.
    modify_parameters: BTreeMap<String, String>,
    size: String,
    /// The content written by `publish`, read back by the later checks.
    content: String,
    /// The volume handles made, for `delete` to look for at the driver.
    handles: BTreeSet<String>,
    /// What the check in progress waits for (a timeout's message says it).
    waiting: std::sync::Arc<parking_lot::Mutex<String>>,
    /// The objects the check in progress made or used: a failure shows their events.
    touched: parking_lot::Mutex<BTreeSet<String>>,
}

type Checked = Result<(), String>;

impl World {
    /// The world of a run against the stack `running` started.
    pub fn new(running: &Running, args: &ConformanceArgs, info: &DriverInfo) -> World {
        let node_socket = args
            .node_endpoints
            .iter()
            .find(|(node, _)| node == "node-1")
            .map(|(_, socket)| socket.clone())
            .unwrap_or_else(|| args.driver_endpoint.clone());
        World {
            client: running.stack.client.clone(),
            kubelet: running.data_dir.join("kubelet"),
            socket: args.driver_endpoint.clone(),
            node_socket,
            driver: info.name.clone(),
            info: info.clone(),
            parameters: args.class_parameters.iter().cloned().collect(),
            modify_parameters: args.modify_parameters.iter().cloned().collect(),
            size: args.volume_size.clone(),
            content: format!("volstack conformance {:016x}\n", rand::random::<u64>()),
            handles: BTreeSet::new(),
            waiting: Default::default(),
            touched: Default::default(),
        }
    }

    /// Runs the capability `name`.
    pub async fn check(&mut self, name: &str) -> Result<Done, String> {
        self.touched.lock().clear();
        self.waiting.lock().clear();
        let passed = |r: Checked| r.map(|()| Done::Passed(String::new()));
        match name {
            "provision" => passed(self.provision().await),
            "access-modes" => self.access_modes().await,
            "block" => self.block().await,
            "late-binding" => self.late_binding().await,
            "capacity" => self.capacity().await,
            "attach" => passed(self.attach().await),
            "publish" => passed(self.publish().await),
            "read-only" => passed(self.read_only().await),
            "stats" => self.stats().await,
            "republish" => passed(self.republish().await),
            "snapshot" => passed(self.snapshot().await),
            "clone" => passed(self.clone_volume().await),
            "expansion" => self.expansion().await,
            "modify" => self.modify().await,
            "idempotency" => self.idempotency().await,
            "delete" => passed(self.delete().await),
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

    /// The events of the objects the check in progress made or used, newest last (at most
    /// 10).
    pub async fn events(&self) -> Vec<String> {
        let touched = self.touched.lock().clone();
        if touched.is_empty() {
            return Vec::new();
        }
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
                    .is_some_and(|n| touched.contains(n))
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
        if let Some(name) = value["metadata"]["name"].as_str() {
            self.touched.lock().insert(name.to_string());
        }
        let object: K = serde_json::from_value(value).map_err(|e| e.to_string())?;
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => Ok(()),
            Err(error) => Err(format!("create: {error}")),
        }
    }

    /// A claim of the driver's class, ReadWriteOnce, of the volume size; `spec` is merged over
    /// that spec (another class, access modes, volume mode).
    fn claim_json(&self, name: &str, spec: Value) -> Value {
        let mut claim = json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                     "resources": {"requests": {"storage": self.size}}},
        });
        if let (Some(into), Value::Object(from)) = (claim["spec"].as_object_mut(), spec) {
            into.extend(from);
        }
        claim
    }

    async fn claim(&self, name: &str, data_source: Option<Value>) -> Checked {
        let spec = match data_source {
            Some(source) => json!({"dataSource": source}),
            None => json!({}),
        };
        self.create(&self.claims(), self.claim_json(name, spec))
            .await
    }

    /// Waits until the claim is Bound to a volume of the driver (`None`) or its provisioning
    /// failed (the provisioner's ProvisioningFailed message).
    async fn bound_or_refused(&mut self, name: &str) -> Result<Option<String>, String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        let selector = format!("involvedObject.name={name},reason=ProvisioningFailed");
        let verdict = self
            .until(
                &format!("claim {name} Bound or ProvisioningFailed"),
                || async {
                    let claim = self.claims().get_opt(name).await.ok()??;
                    if claim.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                        return Some(None);
                    }
                    let failed = events
                        .list(&ListParams::default().fields(&selector))
                        .await
                        .ok()?;
                    // The provisioner's: the PV controller's are about the claim (its class, a
                    // write of its annotation that conflicted), not the driver's answer.
                    failed
                        .items
                        .into_iter()
                        .find(|e| {
                            e.source.as_ref().and_then(|s| s.component.as_deref())
                                != Some("persistentvolume-controller")
                        })
                        .map(|e| Some(e.message.unwrap_or_default()))
                },
            )
            .await?;
        if verdict.is_none() {
            self.bound(name).await?;
        }
        Ok(verdict)
    }

    async fn delete_claim(&self, name: &str) -> Checked {
        match self.claims().delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(error) if sidecar_kit::api_errors::is_not_found(&error) => Ok(()),
            Err(error) => Err(format!("delete claim {name}: {error}")),
        }
    }

    /// Waits until the claim is Bound to a volume of the driver; returns the volume.
    async fn bound(&mut self, name: &str) -> Result<PersistentVolume, String> {
        self.touched.lock().insert(name.to_string());
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
        self.pod_with(name, json!({"claimName": claim}), json!({}))
            .await
    }

    /// A Pod with one volume, the claim reference `source`; `container` is merged over its
    /// container (`volumeDevices` for a Block volume).
    async fn pod_with(&self, name: &str, source: Value, container: Value) -> Checked {
        let mut app = json!({"name": "app", "image": "busybox"});
        if let (Some(into), Value::Object(from)) = (app.as_object_mut(), container) {
            into.extend(from);
        }
        self.create(
            &self.pods(),
            json!({
                "metadata": {"name": name},
                "spec": {"containers": [app],
                         "volumes": [{"name": "data", "persistentVolumeClaim": source}]},
            }),
        )
        .await
    }

    /// Waits until the Pod runs; returns the directory its volume is published at.
    async fn published(&self, name: &str, claim: &str) -> Result<PathBuf, String> {
        self.touched
            .lock()
            .extend([name.to_string(), claim.to_string()]);
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
