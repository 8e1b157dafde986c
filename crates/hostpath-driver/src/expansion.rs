//! Volume expansion: ControllerExpandVolume grows a volume's capacity (taken from its pool) and
//! its block image; NodeExpandVolume grows the "filesystem" a mount volume shows at the node
//! (what NodeGetVolumeStats reports as its total). Online: published volumes may grow.

use csi_proto::v1 as csi;

use crate::config::DriverConfig;
use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::features::served;
use crate::state::{Change, Table};

/// The outcome of a controller expansion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expansion {
    /// The change to log (none when the volume is large enough already).
    pub change: Option<Change>,
    /// The volume's capacity afterwards.
    pub capacity_bytes: i64,
    /// Whether NodeExpandVolume must follow (mount volumes).
    pub node_expansion_required: bool,
    /// A block volume: its image grows with it.
    pub block: bool,
}

fn range(range: Option<&csi::CapacityRange>) -> Result<(i64, i64)> {
    let range = range.ok_or(Error::Missing("capacity_range"))?;
    let (required, limit) = (range.required_bytes, range.limit_bytes);
    if required < 0 || limit < 0 {
        return Err(Error::CapacityRange(format!(
            "required_bytes {required} and limit_bytes {limit} must not be negative"
        )));
    }
    if required == 0 && limit == 0 {
        return Err(Error::CapacityRange(
            "one of required_bytes and limit_bytes must be set".into(),
        ));
    }
    if limit > 0 && required > limit {
        return Err(Error::CapacityRange(format!(
            "required_bytes {required} is larger than limit_bytes {limit}"
        )));
    }
    Ok((required, limit))
}

/// Decides ControllerExpandVolume. A volume is never shrunk: a request at or below its size
/// answers its size (when the limit allows it).
pub fn plan_controller_expand(
    cfg: &DriverConfig,
    table: &Table,
    req: &csi::ControllerExpandVolumeRequest,
) -> Result<Expansion> {
    if req.volume_id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    let (required, limit) = range(req.capacity_range.as_ref())?;
    let record = table
        .get(&req.volume_id)
        .ok_or_else(|| Error::VolumeNotFound(req.volume_id.clone()))?;
    if let Some(cap) = &req.volume_capability {
        let checked = crate::plan::check_capability(cfg, cap)?;
        if checked.block != record.block {
            return Err(Error::Capability(format!(
                "volume {:?} is a {} volume",
                record.id,
                if record.block { "block" } else { "mount" }
            )));
        }
    }
    let wanted = if required > 0 { required } else { limit };
    let node_expansion_required = !record.block;
    if wanted <= record.capacity_bytes {
        if limit > 0 && record.capacity_bytes > limit {
            return Err(Error::ShrinkRefused {
                id: record.id.clone(),
                capacity: record.capacity_bytes,
                limit,
            });
        }
        return Ok(Expansion {
            change: None,
            capacity_bytes: record.capacity_bytes,
            node_expansion_required: node_expansion_required
                && record.node_bytes.is_some_and(|b| b < record.capacity_bytes),
            block: record.block,
        });
    }
    if let Some(max) = cfg.max_volume_size
        && wanted > max
    {
        return Err(Error::TooLarge {
            requested: wanted,
            max,
        });
    }
    if let Some(total) = cfg.capacity.get(&record.kind) {
        let free = total - table.used(&record.kind, record.node.as_deref());
        let more = wanted - record.capacity_bytes;
        if free < more {
            return Err(Error::NoCapacity(format!(
                "growing volume {:?} by {more} bytes; {} has {free} bytes free",
                record.id,
                record.node.as_deref().unwrap_or("the pool")
            )));
        }
    }
    let mut grown = record.clone();
    grown.capacity_bytes = wanted;
    if !record.block {
        // The filesystem at the node keeps its size until NodeExpandVolume grows it.
        grown.node_bytes = Some(record.node_bytes.unwrap_or(record.capacity_bytes));
    }
    Ok(Expansion {
        change: Some(Change::Put(grown)),
        capacity_bytes: wanted,
        node_expansion_required,
        block: record.block,
    })
}

/// Decides NodeExpandVolume: the filesystem at `volume_path` grows to the volume's capacity;
/// asking for more than the controller gave is OUT_OF_RANGE.
pub fn plan_node_expand(
    table: &Table,
    req: &csi::NodeExpandVolumeRequest,
) -> Result<(Vec<Change>, i64)> {
    if req.volume_id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    if req.volume_path.is_empty() {
        return Err(Error::Missing("volume_path"));
    }
    let record = table
        .get(&req.volume_id)
        .ok_or_else(|| Error::VolumeNotFound(req.volume_id.clone()))?;
    if !record.targets.contains_key(&req.volume_path)
        && !record.staged.contains_key(&req.volume_path)
    {
        return Err(Error::NotAtPath {
            id: record.id.clone(),
            path: req.volume_path.clone(),
        });
    }
    if let Some(range) = &req.capacity_range
        && range.required_bytes > record.capacity_bytes
    {
        return Err(Error::OutOfRange(format!(
            "required_bytes {} is more than the volume's capacity of {} bytes: ControllerExpandVolume first",
            range.required_bytes, record.capacity_bytes
        )));
    }
    if record.block || record.node_bytes == Some(record.capacity_bytes) {
        return Ok((Vec::new(), record.capacity_bytes));
    }
    let mut grown = record.clone();
    grown.node_bytes = Some(record.capacity_bytes);
    Ok((vec![Change::Put(grown)], record.capacity_bytes))
}

pub(crate) async fn controller_expand(
    driver: &Driver,
    req: csi::ControllerExpandVolumeRequest,
) -> Result<csi::ControllerExpandVolumeResponse> {
    served(driver.cfg.features.expansion, "ControllerExpandVolume")?;
    let (expansion, seq) = driver.store.mutate(|table| {
        let expansion = plan_controller_expand(&driver.cfg, table, &req)?;
        let changes = expansion.change.clone().into_iter().collect();
        Ok::<_, Error>((expansion, changes))
    })?;
    driver.store.wait_durable(seq).await?;
    if expansion.block {
        let image = driver
            .store
            .volume_dir(&req.volume_id)
            .join(crate::content::BLOCK_IMAGE);
        let bytes = expansion.capacity_bytes;
        let path = image.clone();
        crate::driver::on_disk("grow the block image", &image, move || {
            crate::content::grow_image(&path, bytes)
        })
        .await?;
    }
    if expansion.change.is_some() {
        tracing::info!(volume_id = %req.volume_id, bytes = expansion.capacity_bytes, "volume expanded");
    }
    Ok(csi::ControllerExpandVolumeResponse {
        capacity_bytes: expansion.capacity_bytes,
        node_expansion_required: expansion.node_expansion_required,
    })
}

pub(crate) async fn node_expand(
    driver: &Driver,
    req: csi::NodeExpandVolumeRequest,
) -> Result<csi::NodeExpandVolumeResponse> {
    served(driver.cfg.features.expansion, "NodeExpandVolume")?;
    let (capacity, seq) = driver.store.mutate(|table| {
        let (changes, capacity) = plan_node_expand(table, &req)?;
        Ok::<_, Error>((capacity, changes))
    })?;
    driver.store.wait_durable(seq).await?;
    Ok(csi::NodeExpandVolumeResponse {
        capacity_bytes: capacity,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use tonic::Code;

    use super::*;
    use crate::state::{NodeTarget, VolumeRecord};

    fn config(capacity: Option<i64>, max: Option<i64>) -> DriverConfig {
        let mut cfg = crate::config::test_config();
        cfg.capacity = capacity
            .map(|c| BTreeMap::from([(String::new(), c)]))
            .unwrap_or_default();
        cfg.max_volume_size = max;
        cfg
    }

    fn volume(id: &str, bytes: i64, block: bool) -> VolumeRecord {
        VolumeRecord {
            id: id.into(),
            name: id.into(),
            capacity_bytes: bytes,
            node: Some("n1".into()),
            block,
            targets: BTreeMap::from([(
                "/target".to_string(),
                NodeTarget {
                    readonly: false,
                    block,
                    how: "symlink".into(),
                },
            )]),
            ..VolumeRecord::default()
        }
    }

    fn expand(id: &str, required: i64, limit: i64) -> csi::ControllerExpandVolumeRequest {
        csi::ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: required,
                limit_bytes: limit,
            }),
            ..Default::default()
        }
    }

    /// Ok((new capacity, changed, node step)) or the error code.
    type Expected = std::result::Result<(i64, bool, bool), Code>;

    #[test]
    fn controller_expansion_decisions() {
        let table = Table::from_records([volume("m", 100, false), volume("b", 100, true)]);
        let cfg = config(Some(250), Some(180));
        // (request, Ok((new capacity, changed, node step)) or the error code)
        let cases: Vec<(csi::ControllerExpandVolumeRequest, Expected)> = vec![
            (expand("m", 150, 0), Ok((150, true, true))),
            (expand("b", 150, 0), Ok((150, true, false))),
            (expand("m", 0, 120), Ok((120, true, true))),
            (expand("m", 100, 0), Ok((100, false, false))),
            (expand("m", 50, 0), Ok((100, false, false))),
            (expand("m", 50, 60), Err(Code::OutOfRange)),
            (expand("m", 190, 0), Err(Code::OutOfRange)),
            // The pool has 250 - 200 = 50 bytes left.
            (expand("m", 160, 0), Err(Code::ResourceExhausted)),
            (expand("x", 150, 0), Err(Code::NotFound)),
            (expand("", 150, 0), Err(Code::InvalidArgument)),
            (expand("m", 0, 0), Err(Code::InvalidArgument)),
            (expand("m", 150, 140), Err(Code::InvalidArgument)),
            (
                csi::ControllerExpandVolumeRequest {
                    volume_id: "m".into(),
                    ..Default::default()
                },
                Err(Code::InvalidArgument),
            ),
        ];
        for (req, expected) in cases {
            match (plan_controller_expand(&cfg, &table, &req), expected) {
                (Ok(e), Ok((bytes, changed, node))) => assert_eq!(
                    (
                        e.capacity_bytes,
                        e.change.is_some(),
                        e.node_expansion_required
                    ),
                    (bytes, changed, node),
                    "{req:?}"
                ),
                (Err(error), Err(code)) => assert_eq!(error.code(), code, "{req:?}: {error}"),
                (got, expected) => panic!("{req:?}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn node_expansion_follows_the_controller() {
        let mut grown = volume("m", 150, false);
        grown.node_bytes = Some(100);
        let mut table = Table::from_records([grown, volume("b", 100, true)]);
        let req = |id: &str, path: &str, required: i64| csi::NodeExpandVolumeRequest {
            volume_id: id.into(),
            volume_path: path.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: required,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        let (changes, bytes) = plan_node_expand(&table, &req("m", "/target", 150)).unwrap();
        assert_eq!(bytes, 150);
        assert_eq!(changes.len(), 1);
        for change in changes {
            table.apply(change);
        }
        assert_eq!(table.get("m").unwrap().node_bytes, Some(150));
        assert!(
            plan_node_expand(&table, &req("m", "/target", 150))
                .unwrap()
                .0
                .is_empty()
        );
        assert!(
            plan_node_expand(&table, &req("b", "/target", 0))
                .unwrap()
                .0
                .is_empty()
        );
        let errors = [
            (req("m", "/target", 200), Code::OutOfRange),
            (req("m", "/elsewhere", 0), Code::NotFound),
            (req("x", "/target", 0), Code::NotFound),
            (req("", "/target", 0), Code::InvalidArgument),
            (req("m", "", 0), Code::InvalidArgument),
        ];
        for (r, code) in errors {
            assert_eq!(
                plan_node_expand(&table, &r).unwrap_err().code(),
                code,
                "{r:?}"
            );
        }
    }
}
