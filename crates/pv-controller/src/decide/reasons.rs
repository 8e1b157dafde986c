//! The reasons of the events the PV controller and its companions record: kube-controller-
//! manager's (`pkg/controller/volume/events` and the controllers' own), one variant each, so a
//! decision names a reason upstream uses and no other.

/// An event's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A claim waits for an external provisioner (Normal).
    ExternalProvisioning,
    /// A late-binding claim waits for a Pod to use it (Normal).
    WaitForFirstConsumer,
    /// A late-binding claim waits for its Pods to be scheduled (Normal).
    WaitForPodScheduled,
    /// No volume plugin or class can provision the claim (Warning).
    ProvisioningFailed,
    /// A claim or a Pod's ephemeral claim cannot be bound (Warning).
    FailedBinding,
    /// A volume and its claim disagree on their volume mode (Warning).
    VolumeMismatch,
    /// A bound claim lost its volume (Warning).
    ClaimLost,
    /// Another claim holds the volume a claim is bound to (Warning).
    ClaimMisbound,
    /// A volume could not be deleted (Warning).
    VolumeFailedDelete,
    /// A volume's reclaim policy is not one kube-controller-manager knows (Warning).
    VolumeUnknownReclaimPolicy,
    /// A volume could not be recycled, or is still in use (Warning, or Normal while in use).
    VolumeFailedRecycle,
    /// A volume was recycled (Normal).
    VolumeRecycled,
    /// An event of the recycler Pod, passed on to its volume.
    RecyclerPod,
    /// A Pod's volume cannot be attached (Warning).
    FailedAttachVolume,
}

impl Reason {
    /// The reason as the event carries it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::ExternalProvisioning => "ExternalProvisioning",
            Reason::WaitForFirstConsumer => "WaitForFirstConsumer",
            Reason::WaitForPodScheduled => "WaitForPodScheduled",
            Reason::ProvisioningFailed => "ProvisioningFailed",
            Reason::FailedBinding => "FailedBinding",
            Reason::VolumeMismatch => "VolumeMismatch",
            Reason::ClaimLost => "ClaimLost",
            Reason::ClaimMisbound => "ClaimMisbound",
            Reason::VolumeFailedDelete => "VolumeFailedDelete",
            Reason::VolumeUnknownReclaimPolicy => "VolumeUnknownReclaimPolicy",
            Reason::VolumeFailedRecycle => "VolumeFailedRecycle",
            Reason::VolumeRecycled => "VolumeRecycled",
            Reason::RecyclerPod => "RecyclerPod",
            Reason::FailedAttachVolume => "FailedAttachVolume",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Reason;

    #[test]
    fn each_reason_is_written_as_its_name() {
        let all = [
            Reason::ExternalProvisioning,
            Reason::WaitForFirstConsumer,
            Reason::WaitForPodScheduled,
            Reason::ProvisioningFailed,
            Reason::FailedBinding,
            Reason::VolumeMismatch,
            Reason::ClaimLost,
            Reason::ClaimMisbound,
            Reason::VolumeFailedDelete,
            Reason::VolumeUnknownReclaimPolicy,
            Reason::VolumeFailedRecycle,
            Reason::VolumeRecycled,
            Reason::RecyclerPod,
            Reason::FailedAttachVolume,
        ];
        for reason in all {
            assert_eq!(reason.as_str(), format!("{reason:?}"));
            assert_eq!(reason.to_string(), reason.as_str());
        }
    }
}
