//! The stack stopped mid-lifecycle and started again on its data: claims made just before the
//! stop are provisioned once each, and the driver holds no volume without a PV.

use std::collections::BTreeSet;

use super::{Done, Rpc, World};
use crate::stack::Running;

/// Claims made just before the stop.
const CLAIMS: usize = 5;

/// What was true before the stop.
pub struct BeforeRestart {
    /// The driver's volumes (ListVolumes), when it lists them.
    listed: Option<BTreeSet<String>>,
}

impl World {
    /// Lists the driver's volumes, then makes the claims without waiting for them.
    pub async fn before_restart(&mut self) -> Result<BeforeRestart, String> {
        self.touched.lock().clear();
        let listed = match self.info.has(Rpc::ListVolumes) {
            true => Some(self.driver_volumes().await?.into_iter().collect()),
            false => None,
        };
        for i in 0..CLAIMS {
            self.claim(&format!("conf-restart-{i}"), None).await?;
        }
        Ok(BeforeRestart { listed })
    }

    /// Talks to the stack started again.
    pub fn reconnect(&mut self, running: &Running) {
        self.client = running.stack.client.clone();
    }

    /// Every claim Bound to a volume of its own, and (when the driver lists its volumes) the
    /// volumes the driver gained are exactly theirs: none made twice, none left without a PV.
    pub async fn after_restart(&mut self, before: BeforeRestart) -> Result<Done, String> {
        let mut made = BTreeSet::new();
        for i in 0..CLAIMS {
            let pv = self.bound(&format!("conf-restart-{i}")).await?;
            let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
            made.insert(handle.unwrap_or_default());
        }
        if made.len() != CLAIMS {
            return Err(format!(
                "{CLAIMS} claims are bound to {} volumes: {made:?}",
                made.len()
            ));
        }
        let Some(listed) = before.listed else {
            return Ok(Done::Passed(
                "ListVolumes not advertised: volumes made twice cannot be seen".into(),
            ));
        };
        let now: BTreeSet<String> = self.driver_volumes().await?.into_iter().collect();
        let gained: BTreeSet<String> = now.difference(&listed).cloned().collect();
        let leaked: Vec<&String> = gained.difference(&made).collect();
        if !leaked.is_empty() {
            return Err(format!(
                "the driver lists volumes no PV names after the restart (made twice or leaked): {leaked:?}"
            ));
        }
        Ok(Done::Passed(format!(
            "{CLAIMS} claims made just before the stop: {CLAIMS} volumes, none without a PV"
        )))
    }
}
