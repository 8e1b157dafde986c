//! NodeGetVolumeStats and volume condition: usage measured on disk, inodes at one per 16 KiB of
//! the filesystem's size, and a condition that turns abnormal when the volume's content is gone
//! or holds more than its size (directories have no quota).

use csi::volume_usage::Unit;
use csi_proto::v1 as csi;

use crate::content::{BLOCK_IMAGE, BYTES_PER_INODE, Usage};
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::state::VolumeRecord;

/// What was found on disk for a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measured {
    /// A mount volume's directory and its usage.
    Directory(Usage),
    /// A block volume's image and its length.
    Image(i64),
    /// The content could not be read.
    Missing(String),
}

/// The condition of a volume given what was found on disk.
pub fn condition(record: &VolumeRecord, measured: &Measured) -> csi::VolumeCondition {
    let total = record.node_bytes.unwrap_or(record.capacity_bytes);
    let abnormal = |message: String| csi::VolumeCondition {
        abnormal: true,
        message,
    };
    match measured {
        Measured::Missing(detail) => abnormal(format!("volume content is not readable: {detail}")),
        Measured::Directory(used) if used.bytes > total => abnormal(format!(
            "volume holds {} bytes, more than its {total} bytes",
            used.bytes
        )),
        Measured::Image(len) if *len < record.capacity_bytes => abnormal(format!(
            "block image is {len} bytes, smaller than the volume's {} bytes",
            record.capacity_bytes
        )),
        Measured::Directory(_) | Measured::Image(_) => csi::VolumeCondition {
            abnormal: false,
            message: "volume is healthy".into(),
        },
    }
}

/// The usage figures: bytes and inodes for a mount volume, total bytes for a block volume.
pub fn usage_figures(record: &VolumeRecord, measured: &Measured) -> Vec<csi::VolumeUsage> {
    let figure = |unit: Unit, total: i64, used: i64| csi::VolumeUsage {
        available: (total - used).max(0),
        total,
        used,
        unit: unit as i32,
    };
    match measured {
        Measured::Directory(used) => {
            let total = record.node_bytes.unwrap_or(record.capacity_bytes);
            vec![
                figure(Unit::Bytes, total, used.bytes),
                figure(Unit::Inodes, total / BYTES_PER_INODE, used.inodes),
            ]
        }
        Measured::Image(len) => vec![csi::VolumeUsage {
            available: 0,
            total: *len,
            used: 0,
            unit: Unit::Bytes as i32,
        }],
        Measured::Missing(_) => Vec::new(),
    }
}

pub(crate) async fn volume_stats(
    driver: &Driver,
    req: csi::NodeGetVolumeStatsRequest,
) -> Result<csi::NodeGetVolumeStatsResponse> {
    crate::features::served(driver.cfg.features.volume_stats, "NodeGetVolumeStats")?;
    if req.volume_id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    if req.volume_path.is_empty() {
        return Err(Error::Missing("volume_path"));
    }
    let record = driver.volume(&req.volume_id).await?;
    if !record.targets.contains_key(&req.volume_path)
        && !record.staged.contains_key(&req.volume_path)
    {
        return Err(Error::NotAtPath {
            id: record.id.clone(),
            path: req.volume_path.clone(),
        });
    }
    let dir = driver.store.volume_dir(&record.id);
    let block = record.block;
    let measured = tokio::task::spawn_blocking(move || {
        if block {
            match std::fs::metadata(dir.join(BLOCK_IMAGE)) {
                Ok(meta) => Measured::Image(i64::try_from(meta.len()).unwrap_or(i64::MAX)),
                Err(e) => Measured::Missing(e.to_string()),
            }
        } else {
            match crate::content::usage(&dir) {
                Ok(used) => Measured::Directory(used),
                Err(e) => Measured::Missing(e.to_string()),
            }
        }
    })
    .await
    .unwrap_or_else(|e| Measured::Missing(e.to_string()));
    Ok(csi::NodeGetVolumeStatsResponse {
        usage: usage_figures(&record, &measured),
        volume_condition: driver
            .cfg
            .features
            .volume_condition
            .then(|| condition(&record, &measured)),
    })
}

/// The condition reported by ListVolumes and ControllerGetVolume (when VOLUME_CONDITION is
/// on): whether the volume's directory or image is there.
pub(crate) fn controller_condition(
    driver: &Driver,
    record: &VolumeRecord,
) -> Option<csi::VolumeCondition> {
    if !driver.cfg.features.volume_condition {
        return None;
    }
    if record.lazy_content {
        // Never used: its directory is made on first use, so none is expected yet.
        return Some(csi::VolumeCondition {
            abnormal: false,
            message: "volume is healthy".into(),
        });
    }
    let dir = driver.store.volume_dir(&record.id);
    let path = if record.block {
        dir.join(BLOCK_IMAGE)
    } else {
        dir
    };
    Some(match std::fs::symlink_metadata(&path) {
        Ok(_) => csi::VolumeCondition {
            abnormal: false,
            message: "volume is healthy".into(),
        },
        Err(e) => csi::VolumeCondition {
            abnormal: true,
            message: format!("volume content {} is missing: {e}", path.display()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(block: bool, capacity: i64, node_bytes: Option<i64>) -> VolumeRecord {
        VolumeRecord {
            id: "v".into(),
            block,
            capacity_bytes: capacity,
            node_bytes,
            ..VolumeRecord::default()
        }
    }

    #[test]
    fn usage_and_condition_per_volume_kind() {
        let used = Usage {
            bytes: 4096,
            inodes: 3,
        };
        let mount = record(false, 1 << 20, None);
        let figures = usage_figures(&mount, &Measured::Directory(used));
        assert_eq!(figures.len(), 2);
        assert_eq!(
            (
                figures[0].total,
                figures[0].used,
                figures[0].available,
                figures[0].unit
            ),
            ((1 << 20), 4096, (1 << 20) - 4096, Unit::Bytes as i32)
        );
        assert_eq!(
            (
                figures[1].total,
                figures[1].used,
                figures[1].available,
                figures[1].unit
            ),
            (64, 3, 61, Unit::Inodes as i32)
        );
        assert!(!condition(&mount, &Measured::Directory(used)).abnormal);
        // After NodeExpandVolume the filesystem's size is what the node saw.
        let grown = record(false, 2 << 20, Some(1 << 20));
        assert_eq!(
            usage_figures(&grown, &Measured::Directory(used))[0].total,
            1 << 20
        );
        let full = Usage {
            bytes: 2 << 20,
            inodes: 1,
        };
        let over = condition(&mount, &Measured::Directory(full));
        assert!(
            over.abnormal && over.message.contains("more than"),
            "{over:?}"
        );
        assert_eq!(
            usage_figures(&mount, &Measured::Directory(full))[0].available,
            0
        );

        let block = record(true, 1 << 20, None);
        let figures = usage_figures(&block, &Measured::Image(1 << 20));
        assert_eq!(figures.len(), 1);
        assert_eq!(figures[0].total, 1 << 20);
        assert!(!condition(&block, &Measured::Image(1 << 20)).abnormal);
        assert!(condition(&block, &Measured::Image(10)).abnormal);

        let gone = Measured::Missing("No such file or directory".into());
        assert!(condition(&mount, &gone).abnormal);
        assert!(usage_figures(&mount, &gone).is_empty());
    }
}
