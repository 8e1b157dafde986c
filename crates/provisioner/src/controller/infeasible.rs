//! Claims whose CreateVolume the driver refused as infeasible (INVALID_ARGUMENT): as upstream
//! since v6.1, their next attempt waits `--retry-interval-max` from the refusal, unless the
//! claim or its class is made again (`decide::classify::infeasible_wait`).

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::reflector::ObjectRef;

use super::{ClaimKey, Provisioner};
use crate::decide::classify::{Infeasible, infeasible_wait};

impl Provisioner {
    /// Notes that the driver refused the claim as infeasible just now.
    pub(super) fn mark_infeasible(
        &self,
        key: &ClaimKey,
        claim: &PersistentVolumeClaim,
        class_name: &str,
    ) {
        let marked = Infeasible {
            at: std::time::Instant::now(),
            claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
            class_uid: self.class_uid(class_name),
        };
        self.infeasible.lock().insert(key.clone(), marked);
    }

    /// How long a claim the driver refused as infeasible still waits (None: it may try now,
    /// and is no longer marked).
    pub(super) fn infeasible_wait(
        &self,
        key: &ClaimKey,
        claim: &PersistentVolumeClaim,
        class_name: &str,
    ) -> Option<std::time::Duration> {
        let marked = self.infeasible.lock().get(key).cloned()?;
        let wait = infeasible_wait(
            &marked,
            claim.metadata.uid.as_deref().unwrap_or_default(),
            &self.class_uid(class_name),
            std::time::Instant::now(),
            self.cfg.backoff.max,
        );
        if wait.is_none() {
            self.infeasible.lock().remove(key);
        }
        wait
    }

    /// The UID of class `name` as cached ("" when it is not).
    fn class_uid(&self, name: &str) -> String {
        self.caches
            .classes
            .get(&ObjectRef::new(name))
            .and_then(|c| c.metadata.uid.clone())
            .unwrap_or_default()
    }
}
