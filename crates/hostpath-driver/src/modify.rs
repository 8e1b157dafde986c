//! Mutable parameters (VolumeAttributesClass): which keys a volume may carry and change with
//! ControllerModifyVolume, and their values' rules.

use std::collections::{BTreeMap, HashMap};

use csi_proto::v1 as csi;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::state::{Change, Table};

/// `iops`: a whole number from 1 to 1,000,000 (recorded; the reference driver does not
/// throttle).
pub const IOPS: &str = "iops";
/// `tier`: `standard` or `premium`.
pub const TIER: &str = "tier";

/// Checks mutable parameters: every key known, every value valid. Nothing is applied when one
/// is not.
pub fn check_mutable(given: &HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    let mut checked = BTreeMap::new();
    for (key, value) in given {
        let valid = match key.as_str() {
            IOPS => value
                .parse::<u32>()
                .is_ok_and(|n| (1..=1_000_000).contains(&n)),
            TIER => matches!(value.as_str(), "standard" | "premium"),
            _ => return Err(Error::UnknownMutableParameter(key.clone())),
        };
        if !valid {
            return Err(Error::InvalidMutableParameter {
                key: key.clone(),
                value: value.clone(),
            });
        }
        checked.insert(key.clone(), value.clone());
    }
    Ok(checked)
}

/// Decides ControllerModifyVolume: the given parameters replace those of the same keys.
pub fn plan_modify(table: &Table, req: &csi::ControllerModifyVolumeRequest) -> Result<Vec<Change>> {
    if req.volume_id.is_empty() {
        return Err(Error::Missing("volume_id"));
    }
    if req.mutable_parameters.is_empty() {
        return Err(Error::Missing("mutable_parameters"));
    }
    let checked = check_mutable(&req.mutable_parameters)?;
    let record = table
        .get(&req.volume_id)
        .ok_or_else(|| Error::VolumeNotFound(req.volume_id.clone()))?;
    let mut modified = record.clone();
    modified.mutable_parameters.extend(checked);
    if modified == *record {
        return Ok(Vec::new());
    }
    Ok(vec![Change::Put(modified)])
}

pub(crate) async fn modify(
    driver: &Driver,
    req: csi::ControllerModifyVolumeRequest,
) -> Result<csi::ControllerModifyVolumeResponse> {
    crate::features::served(driver.cfg.features.modify, "ControllerModifyVolume")?;
    let (changed, seq) = driver.store.mutate(|table| {
        let changes = plan_modify(table, &req)?;
        Ok::<_, Error>((!changes.is_empty(), changes))
    })?;
    driver.store.wait_durable(seq).await?;
    if changed {
        tracing::info!(volume_id = %req.volume_id, "volume modified");
    }
    Ok(csi::ControllerModifyVolumeResponse {})
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::state::VolumeRecord;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn mutable_parameter_rules() {
        let ok = [
            params(&[]),
            params(&[("iops", "1")]),
            params(&[("iops", "1000000"), ("tier", "premium")]),
            params(&[("tier", "standard")]),
        ];
        for given in ok {
            assert_eq!(check_mutable(&given).unwrap().len(), given.len());
        }
        let refused = [
            params(&[("iops", "0")]),
            params(&[("iops", "1000001")]),
            params(&[("iops", "fast")]),
            params(&[("tier", "gold")]),
            params(&[("tier", "premium"), ("size", "1")]),
        ];
        for given in refused {
            assert_eq!(
                check_mutable(&given).unwrap_err().code(),
                Code::InvalidArgument,
                "{given:?}"
            );
        }
    }

    #[test]
    fn modify_merges_parameters_and_is_idempotent() {
        let mut table = Table::from_records([VolumeRecord {
            id: "v".into(),
            name: "v".into(),
            mutable_parameters: BTreeMap::from([("tier".into(), "standard".into())]),
            ..VolumeRecord::default()
        }]);
        let req = |id: &str, given: &[(&str, &str)]| csi::ControllerModifyVolumeRequest {
            volume_id: id.into(),
            mutable_parameters: params(given),
            ..Default::default()
        };
        let changes = plan_modify(&table, &req("v", &[("iops", "300")])).unwrap();
        for change in changes {
            table.apply(change);
        }
        assert_eq!(
            table.get("v").unwrap().mutable_parameters,
            BTreeMap::from([
                ("iops".to_string(), "300".to_string()),
                ("tier".to_string(), "standard".to_string())
            ])
        );
        assert!(
            plan_modify(&table, &req("v", &[("iops", "300")]))
                .unwrap()
                .is_empty()
        );
        let errors = [
            (req("x", &[("iops", "300")]), Code::NotFound),
            (req("v", &[("iops", "-1")]), Code::InvalidArgument),
            (req("v", &[]), Code::InvalidArgument),
            (req("", &[("iops", "1")]), Code::InvalidArgument),
        ];
        for (r, code) in errors {
            assert_eq!(plan_modify(&table, &r).unwrap_err().code(), code, "{r:?}");
        }
    }
}
