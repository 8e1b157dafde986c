//! Optional CSI features of the reference driver. All are on by default; `--disable FEATURE`
//! turns one off, and its capability is then not advertised and its RPCs answer UNIMPLEMENTED,
//! so a sidecar can be tested against a driver without it.

/// A feature `--disable` can turn off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Feature {
    /// CREATE_DELETE_VOLUME: CreateVolume and DeleteVolume (a Pod's inline volumes are still
    /// made and removed by the node service).
    CreateDelete,
    /// CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT; CreateVolume from a snapshot.
    Snapshots,
    /// CLONE_VOLUME: CreateVolume from a volume.
    Clones,
    /// EXPAND_VOLUME (controller and node) and online VolumeExpansion.
    Expansion,
    /// STAGE_UNSTAGE_VOLUME: NodeStageVolume before NodePublishVolume.
    StageUnstage,
    /// GET_VOLUME_STATS.
    VolumeStats,
    /// VOLUME_CONDITION (controller and node).
    VolumeCondition,
    /// MODIFY_VOLUME: mutable parameters.
    Modify,
    /// The group controller service (CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT).
    GroupSnapshots,
}

/// Which optional features are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// CREATE_DELETE_VOLUME.
    pub create_delete: bool,
    /// CREATE_DELETE_SNAPSHOT and LIST_SNAPSHOTS (and the group controller).
    pub snapshots: bool,
    /// CLONE_VOLUME.
    pub clones: bool,
    /// EXPAND_VOLUME, on the controller and on the node.
    pub expansion: bool,
    /// STAGE_UNSTAGE_VOLUME: NodeStageVolume before NodePublishVolume.
    pub stage_unstage: bool,
    /// Volume statistics.
    pub volume_stats: bool,
    /// Volume condition.
    pub volume_condition: bool,
    /// Mutable parameters.
    pub modify: bool,
    /// Group snapshots.
    pub group_snapshots: bool,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            create_delete: true,
            snapshots: true,
            clones: true,
            expansion: true,
            stage_unstage: true,
            volume_stats: true,
            volume_condition: true,
            modify: true,
            group_snapshots: true,
        }
    }
}

/// An RPC of an optional feature: served while the feature is on, else UNIMPLEMENTED naming
/// the method.
pub fn served(on: bool, method: &'static str) -> crate::error::Result<()> {
    if on {
        Ok(())
    } else {
        Err(crate::error::Error::NotServed(method))
    }
}

impl Features {
    /// Every feature on except the disabled ones.
    pub fn without(disabled: &[Feature]) -> Features {
        let mut features = Features::default();
        for feature in disabled {
            let flag = match feature {
                Feature::CreateDelete => &mut features.create_delete,
                Feature::Snapshots => &mut features.snapshots,
                Feature::Clones => &mut features.clones,
                Feature::Expansion => &mut features.expansion,
                Feature::StageUnstage => &mut features.stage_unstage,
                Feature::VolumeStats => &mut features.volume_stats,
                Feature::VolumeCondition => &mut features.volume_condition,
                Feature::Modify => &mut features.modify,
                Feature::GroupSnapshots => &mut features.group_snapshots,
            };
            *flag = false;
        }
        features
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabling_turns_off_exactly_the_named_features() {
        assert_eq!(Features::without(&[]), Features::default());
        let f = Features::without(&[Feature::StageUnstage, Feature::GroupSnapshots]);
        assert!(!f.stage_unstage && !f.group_snapshots);
        assert!(f.snapshots && f.clones && f.expansion && f.volume_stats);
        assert!(f.volume_condition && f.modify && f.create_delete);
        assert!(!Features::without(&[Feature::CreateDelete]).create_delete);
    }
}
