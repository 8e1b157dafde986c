//! `--node-deployment`: the per-node provisioner's gate in front of provisioning and deletion,
//! and its attempts to take Immediate claims (see `decide::node_deployment`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::selectors::{Labels, affinity_allows, allowed_topologies_admit};
use sidecar_kit::update::{Updated, update_live};
use sidecar_kit::workqueue::Next;

use super::{ClaimKey, Provisioner};
use crate::decide::claim::{ANN_SELECTED_NODE, requested_bytes};
use crate::decide::node_deployment::{NodeChoice, choose, take_delay};
use crate::decide::provision::{create_request, plan_provision};

/// This node, as NodeGetInfo describes it.
#[derive(Debug, Clone)]
pub struct NodeDeployment {
    /// `NODE_NAME`.
    pub name: String,
    /// NodeGetInfo's node id.
    pub node_id: String,
    /// NodeGetInfo's topology segment (the node's labels for the driver).
    pub labels: Labels,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay`.
    pub base_delay: Duration,
    /// `--node-deployment-max-delay`.
    pub max_delay: Duration,
}

/// Attempts to take one Immediate claim.
#[derive(Debug)]
pub(crate) struct Take {
    uid: String,
    failures: u32,
    due: Option<Instant>,
}

impl Take {
    fn new(uid: &str) -> Take {
        Take {
            uid: uid.to_string(),
            failures: 0,
            due: None,
        }
    }
}

/// Attempts in progress, by claim.
type Takes = parking_lot::Mutex<HashMap<ClaimKey, Take>>;

/// What the gate says about a claim.
pub(crate) enum Gate {
    /// Provision it here.
    Provision,
    /// Nothing to do now; look again as `Next` says.
    Wait(Next),
}

/// The per-node provisioner's gate: this node and its attempts to take Immediate claims.
pub(crate) struct NodeGate {
    node: NodeDeployment,
    takes: Takes,
}

impl NodeGate {
    pub(crate) fn new(node: NodeDeployment) -> Self {
        NodeGate {
            node,
            takes: Takes::default(),
        }
    }

    /// The claim is provisioned, not ours or gone: its attempts are forgotten.
    pub(crate) fn forget(&self, key: &ClaimKey) {
        self.takes.lock().remove(key);
    }

    /// Whether this node provisions the claim (and, for an Immediate claim not taken yet, an
    /// attempt to take it).
    pub(crate) async fn admit(
        &self,
        provisioner: &Provisioner,
        claim: &Arc<PersistentVolumeClaim>,
        class_name: &str,
    ) -> Gate {
        let node = &self.node;
        let key = super::claim_key(claim);
        let class = provisioner.caches.classes.get(&ObjectRef::new(class_name));
        match choose(claim, class.as_deref(), &node.name, node.immediate_binding) {
            NodeChoice::Ours => {
                self.forget(&key);
                Gate::Provision
            }
            NodeChoice::NotOurs => {
                self.forget(&key);
                Gate::Wait(Next::Done)
            }
            NodeChoice::TryToTake => match class {
                Some(class) => Gate::Wait(self.try_to_take(provisioner, claim, &class).await),
                None => Gate::Wait(Next::Done),
            },
        }
    }

    /// One step of taking a claim: wait out this node's delay, check the class admits the node
    /// and the node has room, then set the selected node on the claim read live, unless a node
    /// was chosen meanwhile (another node that was faster keeps it).
    async fn try_to_take(
        &self,
        provisioner: &Provisioner,
        claim: &Arc<PersistentVolumeClaim>,
        class: &StorageClass,
    ) -> Next {
        let node = &self.node;
        let key = super::claim_key(claim);
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let now = Instant::now();
        let delay = |failures| {
            take_delay(
                failures,
                node.base_delay,
                node.max_delay,
                rand::random::<f64>(),
            )
        };
        {
            let mut takes = self.takes.lock();
            let take = takes.entry(key.clone()).or_insert_with(|| Take::new(&uid));
            if take.uid != uid {
                *take = Take::new(&uid);
            }
            match take.due {
                None => {
                    let wait = delay(take.failures);
                    take.due = Some(now + wait);
                    return Next::After(wait);
                }
                Some(due) if now < due => return Next::After(due - now),
                Some(_) => take.due = None,
            }
        }
        let allowed = class.allowed_topologies.as_deref().unwrap_or_default();
        if provisioner.topology.enabled() && !allowed_topologies_admit(allowed, &node.labels) {
            tracing::info!(claim = %key, node = %node.name, "allowed topologies are not compatible with this node; leaving the claim to others");
            self.forget(&key);
            return Next::Done;
        }
        let backoff = |reason: &str| {
            let mut takes = self.takes.lock();
            let take = takes.entry(key.clone()).or_insert_with(|| Take::new(&uid));
            take.failures = take.failures.saturating_add(1);
            let wait = delay(take.failures);
            take.due = Some(Instant::now() + wait);
            tracing::info!(claim = %key, node = %node.name, reason, retry_in = ?wait, "did not take the claim");
            Next::After(wait)
        };
        if !has_room(provisioner, node, claim, class).await {
            return backoff("not enough capacity");
        }
        // Read live and written back whole (`update`, as upstream's RBAC grants; the cached
        // claim is trimmed): the node is set only while no node has been chosen and no volume
        // bound, so a faster node's take is never overwritten.
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(provisioner.client.clone(), key.namespace().unwrap_or(""));
        let taken = update_live(&api, key.name(), |live| {
            let unbound = live
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_none_or(str::is_empty);
            let annotations = live.metadata.annotations.get_or_insert_default();
            if !unbound || annotations.contains_key(ANN_SELECTED_NODE) {
                return false;
            }
            annotations.insert(ANN_SELECTED_NODE.to_string(), node.name.clone());
            true
        })
        .await;
        match taken {
            Ok(Updated::Written(_)) => {
                tracing::info!(claim = %key, node = %node.name, "took the claim for this node");
                self.forget(&key);
                // The watch brings the claim back with the annotation; then it is ours.
                Next::Done
            }
            Ok(Updated::Unchanged(_) | Updated::Gone) => {
                // Another node took it first, or it was bound or deleted meanwhile.
                self.forget(&key);
                Next::Done
            }
            Err(error) if sidecar_kit::api_errors::is_conflict(&error) => {
                backoff("changed meanwhile")
            }
            Err(error) => backoff(&format!("selecting node {:?} failed: {error}", node.name)),
        }
    }

    /// Whether this node deletes the volume: only one usable here.
    pub(crate) fn deletes(&self, pv: &PersistentVolume) -> bool {
        affinity_allows(
            pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()),
            &self.node.labels,
        )
    }
}

/// Whether GetCapacity says this node can hold the claim (true when it cannot tell: no
/// size, no GET_CAPACITY, or the call failed, as upstream proceeds then).
async fn has_room(
    provisioner: &Provisioner,
    node: &NodeDeployment,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
) -> bool {
    let size = requested_bytes(claim).unwrap_or(0);
    if size <= 0 || !provisioner.cfg.caps.get_capacity {
        return true;
    }
    let Ok(plan) = plan_provision(
        &provisioner.cfg.caps,
        &provisioner.cfg.options,
        claim,
        class,
    ) else {
        return true;
    };
    let Ok(topology) = provisioner
        .topology
        .for_claim(claim, class, Some(&node.name))
    else {
        return true;
    };
    let request = create_request(&plan, HashMap::new(), topology.as_ref());
    let segments: Vec<Option<csi::Topology>> = match &request.accessibility_requirements {
        Some(r) if !r.requisite.is_empty() => r.requisite.iter().cloned().map(Some).collect(),
        _ => vec![None],
    };
    let mut client = csi::controller_client::ControllerClient::new(provisioner.csi.clone());
    for topology in segments {
        let ask = csi::GetCapacityRequest {
            volume_capabilities: request.volume_capabilities.clone(),
            parameters: request.parameters.clone(),
            accessible_topology: topology,
        };
        match provisioner
            .csi_calls
            .call(
                "/csi.v1.Controller/GetCapacity",
                client.get_capacity(provisioner.csi_calls.request(ask)),
            )
            .await
        {
            Ok(answer) if answer.available_capacity >= size => return true,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "capacity check failed; taking the claim anyway");
                return true;
            }
        }
    }
    false
}

/// Stores holding only this node's CSINode and Node, made from NodeGetInfo (a per-node
/// provisioner does not watch the cluster's nodes; upstream does the same).
pub(crate) fn local_topology(
    node: &NodeDeployment,
    driver: &str,
) -> (
    kube::runtime::reflector::Store<k8s_openapi::api::storage::v1::CSINode>,
    kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Node>,
) {
    use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::{reflector, watcher};
    let meta = || ObjectMeta {
        name: Some(node.name.clone()),
        ..Default::default()
    };
    let csinode = CSINode {
        metadata: meta(),
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: driver.to_string(),
                node_id: node.node_id.clone(),
                topology_keys: Some(node.labels.keys().cloned().collect()),
                allocatable: None,
            }],
        },
    };
    let local = k8s_openapi::api::core::v1::Node {
        metadata: ObjectMeta {
            labels: Some(node.labels.clone()),
            ..meta()
        },
        ..Default::default()
    };
    let (csinodes, mut w1) = reflector::store();
    let (nodes, mut w2) = reflector::store();
    w1.apply_watcher_event(&watcher::Event::Init);
    w1.apply_watcher_event(&watcher::Event::InitApply(csinode));
    w1.apply_watcher_event(&watcher::Event::InitDone);
    w2.apply_watcher_event(&watcher::Event::Init);
    w2.apply_watcher_event(&watcher::Event::InitApply(local));
    w2.apply_watcher_event(&watcher::Event::InitDone);
    (csinodes, nodes)
}
