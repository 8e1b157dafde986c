//! Provisioning a claim.
//!
//! Never leak, never duplicate: the CreateVolume name is the PV name, derived from the claim
//! UID, so every retry asks the driver for the same volume. Before the first CreateVolume the
//! request is put in flight (`in_flight`: recorded in the intent log, or marked for listing);
//! it stays there until the PV is saved or the driver gives a final answer. If the claim
//! disappears (or is replaced under the same name) while a volume may exist, the volume is
//! deleted. A PV whose save fails keeps its record, so the next attempt saves it again.

use std::collections::HashMap;
use std::sync::Arc;

use csi_proto::v1 as csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use sidecar_kit::events::EventType;
use sidecar_kit::update::{Updated, update_live};

use super::InFlight;
use super::data_sources::{self, Resolved};
use super::node_deployment::Gate;
use super::recovery;
use super::{ClaimKey, Provisioner};
use crate::decide::claim::{
    ANN_SELECTED_NODE, ClaimDecision, InFlightFate, decide_claim, in_flight_fate,
    provisioning_node, waits_for_node,
};
use crate::decide::classify::{
    CreateOutcome, DeleteOutcome, classify_create, classify_delete, may_reschedule,
};
use crate::decide::provision::{
    ProvisionPlan, build_pv, check_content_source, create_request, made_for_claim, plan_provision,
    vac_parameters,
};
use crate::decide::topology::Requirement;
use sidecar_kit::workqueue::Next;

pub use super::claim_error::ClaimError;
pub(crate) use sidecar_kit::vocabulary::reference;

/// What a provisioning pass did (for the metrics: only a provisioned volume is counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provisioned {
    /// A PV was saved.
    Volume,
    /// Nothing yet: the PV exists already, or the claim waits (the scheduler, a populator).
    NotNow,
}

/// A claim's progress through [`Provisioner::provision_claim`]: what [`Provisioner::prepare`]
/// found, read by the steps after it.
struct Provisioning {
    class_name: String,
    /// The claim's UID.
    uid: String,
    /// The PV's (and the volume's) name.
    pv_name: String,
    /// The node the scheduler selected, for a late-binding claim.
    selected: Option<String>,
    plan: ProvisionPlan,
    /// The topology requirement sent (computed once per claim and node).
    topology: Option<Requirement>,
    /// The provisioner secret's data.
    secrets: HashMap<String, String>,
    /// CreateVolume without secrets.
    request: csi::CreateVolumeRequest,
    /// Whether the volume is copied from a source (the answer must say so).
    copying: bool,
    /// The clone's source claim, protected before CreateVolume.
    protect: Option<ClaimKey>,
    /// The class is the in-tree plugin's, translated (CSI migration): the metrics' `migrated`.
    migrated: bool,
}

impl Provisioner {
    /// One pass over a claim; the runtime logs a failure and retries it after the key's
    /// backoff.
    pub(crate) async fn sync_claim(&self, key: &ClaimKey) -> Result<Next, ClaimError> {
        let live = self
            .caches
            .claims
            .get(key)
            .filter(|c| c.metadata.deletion_timestamp.is_none());
        let live_uid = live.as_ref().and_then(|c| c.metadata.uid.clone());
        let bound_to = live
            .as_ref()
            .and_then(|c| c.spec.as_ref()?.volume_name.clone());
        let fates: Vec<(String, InFlight, InFlightFate)> = self
            .ledger
            .of_claim(key)
            .into_iter()
            .map(|(n, f)| {
                let fate = in_flight_fate(
                    &n,
                    Some(&f.claim_uid) == live_uid.as_ref(),
                    bound_to.as_deref(),
                );
                (n, f, fate)
            })
            .collect();
        for (name, flight, fate) in fates {
            match fate {
                // Boxed (as the large steps of `provision_claim`): rare, and 7 KB inline.
                InFlightFate::CleanUp => Box::pin(recovery::clean_up(self, &name, &flight)).await?,
                InFlightFate::Keep => {}
            }
        }
        let Some(claim) = live else {
            self.forget_claim(key);
            return Ok(Next::Done);
        };
        let class_name = match decide_claim(
            &claim,
            &self.cfg.caps.name,
            self.cfg.caps.migrated_from.map(|p| p.in_tree_name()),
        ) {
            ClaimDecision::Provision { class } => class,
            ClaimDecision::NotOurs | ClaimDecision::AlreadyBound => {
                self.forget_claim(key);
                return Ok(Next::Done);
            }
        };
        if let Some(wait) = self.infeasible_wait(key, &claim, &class_name) {
            tracing::info!(
                wait = ?wait,
                "the driver refused this claim as infeasible (INVALID_ARGUMENT): its next attempt waits for --retry-interval-max"
            );
            return Ok(Next::After(wait));
        }
        if let Some(gate) = &self.gate
            && let Gate::Wait(next) = Box::pin(gate.admit(self, &claim, &class_name)).await
        {
            return Ok(next);
        }
        let started = std::time::Instant::now();
        let result = self.provision_claim(&claim, &class_name).await;
        // Upstream's `source` label: the kind of the claim's data source.
        let source = claim
            .spec
            .as_ref()
            .and_then(|s| s.data_source.as_ref())
            .map_or("", |d| d.kind.as_str());
        if let Err(error) = &result
            && error.infeasible()
        {
            self.mark_infeasible(key, &claim, &class_name);
        }
        match &result {
            Ok(Provisioned::Volume) => {
                self.metrics
                    .provision_total
                    .with_label_values(&[class_name.as_str(), source])
                    .inc();
                self.metrics
                    .provision_duration
                    .with_label_values(&[class_name.as_str(), source])
                    .observe(started.elapsed().as_secs_f64());
            }
            Ok(Provisioned::NotNow) => {}
            Err(_) => self
                .metrics
                .provision_failed
                .with_label_values(&[class_name.as_str(), source])
                .inc(),
        }
        let result = result.map(|_| Next::Done);
        if let Err(error) = &result
            && error.event_worthy()
        {
            self.recorder.record(
                &reference(&*claim),
                EventType::Warning,
                "ProvisioningFailed",
                &error.event_message(),
            );
        }
        result
    }

    /// Provisions one claim, step by step over a [`Provisioning`]: the checks that may end
    /// the pass early ([`Self::prepare`]), the clone source's protection, the in-flight entry
    /// and intent record, CreateVolume and its classification, the PV built from the answer,
    /// then saved and announced.
    ///
    /// Each step is boxed, and so is what it carries: a future is as large as its largest
    /// step (the CSI call's alone is 6 KB), and each of 100 workers held 14.7 KB when the steps
    /// were inline (2.6 KB with them boxed).
    async fn provision_claim(
        &self,
        claim: &Arc<PersistentVolumeClaim>,
        class_name: &str,
    ) -> Result<Provisioned, ClaimError> {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pv_name = self.cfg.options.naming.pv_name(&uid);
        if self.caches.volumes.contains(&ObjectRef::new(&pv_name)) {
            self.ledger.settle(&pv_name);
            return Ok(Provisioned::NotNow);
        }
        let Some(p) = Box::pin(self.prepare(claim, class_name, uid, pv_name)).await? else {
            return Ok(Provisioned::NotNow);
        };
        if let Some(source) = &p.protect {
            Box::pin(data_sources::protect_clone_source(self, source)).await?;
        }
        let request = Box::pin(self.open_flight(claim, &p)).await?;
        let volume = Box::pin(self.create(claim, &p, request)).await?;
        let pv = Box::pin(self.build(claim, &p, volume)).await?;
        Box::pin(self.finish(claim, &p, &pv)).await?;
        Ok(Provisioned::Volume)
    }

    /// Everything CreateVolume needs, or None when the claim must wait (for the scheduler, or
    /// for a populator).
    async fn prepare(
        &self,
        claim: &PersistentVolumeClaim,
        class_name: &str,
        uid: String,
        pv_name: String,
    ) -> Result<Option<Box<Provisioning>>, ClaimError> {
        let class = self
            .caches
            .classes
            .get(&ObjectRef::new(class_name))
            .ok_or_else(|| ClaimError::ClassNotFound(class_name.to_string()))?;
        // The claim names us, its class someone else (recreated under the same name): upstream
        // logs it and stops, with no event and no retry (errStopProvision); the claim's or the
        // class's next change brings it back.
        if !crate::decide::migration::provisions_for(
            &self.cfg.caps.name,
            self.cfg.caps.migrated_from,
            &class,
        ) {
            tracing::error!(class = class_name, provisioner = %class.provisioner, "Unknown provisioner requested in claim's StorageClass");
            return Ok(None);
        }
        if waits_for_node(claim, &class) {
            tracing::debug!("waiting for the scheduler to select a node");
            return Ok(None);
        }
        let (content_source, protect) =
            match Box::pin(data_sources::resolve(self, claim, class_name)).await? {
                Resolved::Empty => (None, None),
                Resolved::Populator => return Ok(None),
                Resolved::Copy { source, protect } => (Some(source), protect),
            };
        let mut plan = plan_provision(&self.cfg.caps, &self.cfg.options, claim, &class)?;
        let selected = provisioning_node(claim).map(str::to_string);
        let topology = self.topology.for_claim(claim, &class, selected.as_deref());
        if let Err(error) = &topology
            && error.sends_back_to_scheduler()
        {
            Box::pin(self.reschedule(claim)).await;
        }
        let topology = topology?;
        let secrets = Box::pin(self.fetch_secret(plan.provisioner_secret.as_ref())).await?;
        // After the topology and the secret, as upstream reads it.
        let vac = self.attributes_class(claim).await?;
        plan.mutable_parameters = vac_parameters(&self.cfg.caps, vac.as_ref())?;
        let copying = content_source.is_some();
        let mut request = create_request(&plan, HashMap::new(), topology.as_ref());
        request.volume_content_source = content_source;
        Ok(Some(Box::new(Provisioning {
            class_name: class_name.to_string(),
            uid,
            pv_name,
            selected,
            plan,
            topology,
            secrets,
            request,
            copying,
            protect,
            migrated: class.provisioner != self.cfg.caps.name,
        })))
    }

    /// The claim's VolumeAttributesClass, read live as upstream does: only claims that name a
    /// class need it (and only they need the `get` rule), so nothing waits for a watch of
    /// every class.
    async fn attributes_class(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<Option<VolumeAttributesClass>, ClaimError> {
        let name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_attributes_class_name.clone())
            .filter(|n| !n.is_empty());
        match name {
            Some(name) if self.cfg.options.attributes_classes => Ok(Some(
                Api::<VolumeAttributesClass>::all(self.client.clone())
                    .get_opt(&name)
                    .await
                    .map_err(ClaimError::VacLookup)?
                    .ok_or(ClaimError::VacNotFound(name))?,
            )),
            _ => Ok(None),
        }
    }

    /// Puts the volume in the in-flight ledger and, with the intent log, records it durably;
    /// returns the request to send (marked, with listed volumes).
    async fn open_flight(
        &self,
        claim: &PersistentVolumeClaim,
        p: &Provisioning,
    ) -> Result<csi::CreateVolumeRequest, ClaimError> {
        let flight = InFlight {
            claim: super::claim_key(claim),
            claim_uid: p.uid.clone(),
            request: p.request.clone(),
            secret: p.plan.provisioner_secret.clone(),
            listed: None,
            serial: None,
            migrated: p.migrated,
        };
        let record = self.intent_log().map(|_| flight.record());
        let request = self.ledger.open(&p.pv_name, flight, self.listing.get());
        if let (Some(log), Some(record)) = (self.intent_log(), record) {
            log.record(&p.pv_name, record)
                .await
                .map_err(ClaimError::Intent)?;
        }
        Ok(request)
    }

    /// CreateVolume with the secrets; a failure is classified: final ones and reschedules
    /// settle the entry (a reschedule also hands the claim back to the scheduler) and drop the
    /// topology requirement kept for retries, so the next attempt asks for the nodes of then,
    /// as upstream's per-claim cache is dropped on ProvisioningFinished and Reschedule; the
    /// others keep both for the next pass.
    async fn create(
        &self,
        claim: &PersistentVolumeClaim,
        p: &Provisioning,
        mut request: csi::CreateVolumeRequest,
    ) -> Result<Option<csi::Volume>, ClaimError> {
        request.secrets = p.secrets.clone();
        tracing::info!(volume = %p.pv_name, class = p.class_name, "calling CreateVolume");
        let error = match Box::pin(self.create_volume(request, p.migrated)).await {
            Ok(volume) => return Ok(volume),
            Err(error) => error,
        };
        let outcome = classify_create(
            Err(error.code),
            may_reschedule(p.selected.is_some(), p.topology.is_some()),
        );
        match outcome {
            CreateOutcome::InBackground | CreateOutcome::Conflict | CreateOutcome::Created => {}
            CreateOutcome::Final => {
                self.ledger.settle(&p.pv_name);
                self.topology.forget(&super::claim_key(claim));
                self.capacity_changed(&p.class_name, p.topology.as_ref());
            }
            CreateOutcome::Reschedule => {
                self.ledger.settle(&p.pv_name);
                self.topology.forget(&super::claim_key(claim));
                self.capacity_changed(&p.class_name, p.topology.as_ref());
                // The driver's refusal is what the claim's event reports, whether or not the
                // selected node could be removed.
                Box::pin(self.reschedule(claim)).await;
            }
        }
        Err(ClaimError::Create(error))
    }

    /// The PV from the driver's answer; an answer that cannot be used is deleted at once.
    async fn build(
        &self,
        claim: &PersistentVolumeClaim,
        p: &Provisioning,
        volume: Option<csi::Volume>,
    ) -> Result<Box<PersistentVolume>, ClaimError> {
        let identity = self.cfg.identity.clone();
        let built = check_content_source(p.copying, volume.as_ref()).and_then(|()| {
            build_pv(
                &p.plan,
                &self.cfg.caps,
                &self.cfg.options,
                claim,
                volume.as_ref(),
                &identity,
            )
            .map(Box::new)
        });
        match built {
            Ok(pv) => Ok(pv),
            Err(error) => {
                Box::pin(self.discard(&p.pv_name, volume.as_ref(), p.secrets.clone())).await;
                Err(ClaimError::Response(error))
            }
        }
    }

    /// Saves the PV, settles the entry, and tells whoever follows: the settled mark, capacity,
    /// the topology cache, the claim's events.
    async fn finish(
        &self,
        claim: &Arc<PersistentVolumeClaim>,
        p: &Provisioning,
        pv: &PersistentVolume,
    ) -> Result<(), ClaimError> {
        Box::pin(self.save_pv(pv, &p.uid)).await?;
        self.ledger.settle(&p.pv_name);
        self.retained(pv);
        if let Some(capacity) = &self.capacity {
            capacity.volume_changed(
                &p.class_name,
                pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()),
            );
        }
        self.forget_claim(&super::claim_key(claim));
        tracing::info!(volume = %p.pv_name, "volume provisioned");
        self.recorder.record(
            &reference(&**claim),
            EventType::Normal,
            "ProvisioningSucceeded",
            &format!("Successfully provisioned volume {}", p.pv_name),
        );
        Ok(())
    }

    /// Deletes a volume whose answer cannot be used (no PV will name it) and settles its
    /// record; when DeleteVolume must be retried the record stays, so the next pass repeats
    /// CreateVolume (idempotent by name) and tries again.
    pub(crate) async fn discard(
        &self,
        name: &str,
        volume: Option<&csi::Volume>,
        secrets: HashMap<String, String>,
    ) {
        if let Some(id) = volume
            .map(|v| v.volume_id.clone())
            .filter(|id| !id.is_empty())
            && classify_delete(
                // Counted as not migrated, as upstream's cleanupVolume.
                self.delete_volume_call(&id, secrets, false)
                    .await
                    .map_err(|e| e.code),
            ) == DeleteOutcome::Retry
        {
            return;
        }
        self.ledger.settle(name);
    }

    async fn save_pv(&self, pv: &PersistentVolume, claim_uid: &str) -> Result<(), ClaimError> {
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let name = pv.metadata.name.clone().unwrap_or_default();
        // The created PV is dropped at once: kept across the next await, it would make this
        // future 3.5 KB larger for every worker.
        match api.create(&PostParams::default(), pv).await.map(drop) {
            Ok(()) => return Ok(()),
            Err(error) if sidecar_kit::api_errors::is_already_exists(&error) => {}
            Err(source) => return Err(ClaimError::SavePv { name, source }),
        }
        let existing = api.get(&name).await.map_err(|source| ClaimError::SavePv {
            name: name.clone(),
            source,
        })?;
        if made_for_claim(&existing, claim_uid) {
            Ok(())
        } else {
            Err(ClaimError::PvConflict(name))
        }
    }

    /// The claim is provisioned, not ours or gone: what was kept for its attempts goes.
    fn forget_claim(&self, key: &ClaimKey) {
        self.infeasible.lock().remove(key);
        self.topology.forget(key);
        if let Some(gate) = &self.gate {
            gate.forget(key);
        }
    }

    /// A CreateVolume refused for good (often RESOURCE_EXHAUSTED): the published capacity of
    /// the segment asked for first (of every segment of the class without topology) is stale.
    fn capacity_changed(&self, class: &str, topology: Option<&Requirement>) {
        let Some(capacity) = &self.capacity else {
            return;
        };
        let first = topology
            .and_then(|(requisite, preferred)| preferred.first().or(requisite.first()).cloned());
        capacity.refresh(class, first);
    }

    /// Removes the selected node so the scheduler picks another. The claim is read live and
    /// written back whole (`update`, as upstream's RBAC grants: the cached claim is trimmed);
    /// only the node this decision was about is removed, not one chosen since. A failure is
    /// logged: as upstream, the claim's event reports why it was sent back, and the claim is
    /// tried again with backoff (and sent back again).
    async fn reschedule(&self, claim: &PersistentVolumeClaim) {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        let decided = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_SELECTED_NODE))
            .cloned();
        let result = update_live(&api, &name, |live| {
            let annotations = live.metadata.annotations.get_or_insert_default();
            if decided.is_some() && annotations.get(ANN_SELECTED_NODE) == decided.as_ref() {
                annotations.remove(ANN_SELECTED_NODE);
                true
            } else {
                false
            }
        })
        .await;
        match result {
            Ok(Updated::Written(_)) => {
                tracing::info!("removed the selected node so the scheduler picks another");
            }
            Ok(Updated::Unchanged(_) | Updated::Gone) => {}
            Err(error) => {
                tracing::warn!(%error, "removing the selected node failed; tried again later");
            }
        }
    }
}
