//! Which claims are ours, which class they name, and what size they ask for.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use sidecar_kit::quantity::Quantity;
use sidecar_kit::vocabulary::annotation;
pub use sidecar_kit::vocabulary::{
    ANN_BETA_STORAGE_CLASS, ANN_BETA_STORAGE_PROVISIONER, ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
};

/// Largest size we accept: above this the driver's int64 byte count would be meaningless.
pub const MAX_VOLUME_BYTES: i64 = 1 << 62;

/// What the provisioner does with a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Another provisioner's claim, or none asked for.
    NotOurs,
    /// `spec.volumeName` is set: bound or pre-bound, nothing to provision.
    AlreadyBound,
    /// Ours: provision with this class.
    Provision {
        /// StorageClass name.
        class: String,
    },
}

/// The provisioner named on the claim (new annotation first, then the beta one).
pub fn claim_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(&claim.metadata, ANN_BETA_STORAGE_PROVISIONER))
}

pub use sidecar_kit::vocabulary::claim_class;

/// The node picked by the scheduler, if any.
pub fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_SELECTED_NODE).filter(|n| !n.is_empty())
}

/// The selected node's annotation as Kubernetes 1.11 wrote it.
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";

/// The node whose topology a volume is provisioned for: the selected node, or where only the
/// 1.11 annotation is there, the node it names (external-provisioner's library reads the first
/// of the two present when it provisions; only the current one lets a late-binding claim be
/// provisioned, see [`waits_for_node`]).
pub fn provisioning_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_SELECTED_NODE)
        .or_else(|| annotation(&claim.metadata, ANN_ALPHA_SELECTED_NODE))
        .filter(|n| !n.is_empty())
}

/// A WaitForFirstConsumer class and no node selected yet: provisioning waits for the scheduler.
pub fn waits_for_node(
    claim: &PersistentVolumeClaim,
    class: &k8s_openapi::api::storage::v1::StorageClass,
) -> bool {
    class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        && selected_node(claim).is_none()
}

/// Decides whether the claim is ours to provision: it names our driver, or (CSI migration,
/// `in_tree` is the plugin our driver stands in for) it names that plugin and
/// kube-controller-manager marked it `pv.kubernetes.io/migrated-to` our driver.
pub fn decide_claim(
    claim: &PersistentVolumeClaim,
    driver: &str,
    in_tree: Option<&str>,
) -> ClaimDecision {
    let named = claim_provisioner(claim);
    let migrated = in_tree.is_some_and(|in_tree| {
        named == Some(in_tree)
            && annotation(&claim.metadata, sidecar_kit::migration::ANN_MIGRATED_TO) == Some(driver)
    });
    if named != Some(driver) && !migrated {
        return ClaimDecision::NotOurs;
    }
    if claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty())
    {
        return ClaimDecision::AlreadyBound;
    }
    match claim_class(claim) {
        Some(class) => ClaimDecision::Provision {
            class: class.to_string(),
        },
        // The PV controller never points a class-less claim at a provisioner; if someone
        // did, there is no class to read parameters from.
        None => ClaimDecision::NotOurs,
    }
}

/// Why the claim's size cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// `spec.resources.requests.storage` is missing.
    #[error("claim has no spec.resources.requests.storage")]
    Missing,
    /// The quantity does not parse.
    #[error("claim storage request {0:?} is not a valid quantity")]
    Unparsable(String),
    /// Zero or negative.
    #[error("claim storage request {0:?} must be greater than zero")]
    NotPositive(String),
    /// More than any driver can be asked for.
    #[error("claim storage request {0:?} is too large")]
    TooLarge(String),
}

/// The bytes the claim requests (`resources.requests.storage`). Its `resources.limits` are not
/// looked at: upstream sends CreateVolume no limit.
pub fn requested_bytes(claim: &PersistentVolumeClaim) -> Result<i64, SizeError> {
    let request = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or(SizeError::Missing)?;
    to_bytes(&request.0)
}

fn to_bytes(text: &str) -> Result<i64, SizeError> {
    let q = Quantity::parse(text).map_err(|_| SizeError::Unparsable(text.to_string()))?;
    if q.is_zero() || q.is_negative() {
        return Err(SizeError::NotPositive(text.to_string()));
    }
    match q.to_i64_ceil() {
        Some(bytes) if bytes <= MAX_VOLUME_BYTES => Ok(bytes),
        _ => Err(SizeError::TooLarge(text.to_string())),
    }
}

/// What a claim's pass does with a volume in flight for that claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlightFate {
    /// Nothing will use it: delete the volume (or settle it if its PV exists).
    CleanUp,
    /// The claim's provisioning finishes it, or its PV's first event settles it (the deletion
    /// path owns a volume once its PV exists).
    Keep,
}

/// The fate of in-flight volume `volume` of a claim: `same_claim` when the claim that put it in
/// flight still exists (same uid, not being deleted), `bound_to` the volume the claim is bound
/// to. A claim bound to another volume (a
/// pool's, or one a person made) while this one was being made will never use it: left alone,
/// it would stay in flight, and in the driver, for ever.
pub fn in_flight_fate(volume: &str, same_claim: bool, bound_to: Option<&str>) -> InFlightFate {
    match bound_to.filter(|b| !b.is_empty()) {
        _ if !same_claim => InFlightFate::CleanUp,
        Some(bound) if bound != volume => InFlightFate::CleanUp,
        Some(_) | None => InFlightFate::Keep,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decide::testing::claim;

    const DRIVER: &str = "hostpath.csi";

    #[test]
    fn a_late_binding_class_waits_for_the_scheduler_to_pick_a_node() {
        use crate::decide::testing::class;
        let late = class("fast", DRIVER).wait_for_first_consumer().build();
        let now = class("fast", DRIVER).build();
        let unscheduled = claim("c").build();
        let scheduled = claim("c").selected_node("n1").build();
        let cases = [
            (&unscheduled, &late, true),
            (&scheduled, &late, false),
            (&unscheduled, &now, false),
            (&scheduled, &now, false),
        ];
        for (c, k, waits) in cases {
            assert_eq!(waits_for_node(c, k), waits);
        }
    }

    #[test]
    fn the_node_provisioned_for_is_the_selected_one_or_the_one_named_as_in_1_11() {
        let alpha = |b: crate::decide::testing::ClaimBuilder, n: &str| {
            b.annotation(ANN_ALPHA_SELECTED_NODE, n)
        };
        // (claim, provisioned for, selected: a late-binding claim may go ahead)
        let rows = [
            (claim("c").build(), None, None),
            (
                claim("c").selected_node("n1").build(),
                Some("n1"),
                Some("n1"),
            ),
            (alpha(claim("c"), "n2").build(), Some("n2"), None),
            (
                alpha(claim("c").selected_node("n1"), "n2").build(),
                Some("n1"),
                Some("n1"),
            ),
            (claim("c").selected_node("").build(), None, None),
            (alpha(claim("c"), "").build(), None, None),
        ];
        for (i, (c, provisioned, selected)) in rows.iter().enumerate() {
            assert_eq!(provisioning_node(c), *provisioned, "row {i}");
            assert_eq!(selected_node(c), *selected, "row {i}");
        }
    }

    #[test]
    fn only_claims_annotated_for_us_and_unbound_are_provisioned() {
        let ours = claim("c").provisioner(DRIVER).class("fast").build();
        assert_eq!(
            decide_claim(&ours, DRIVER, None),
            ClaimDecision::Provision {
                class: "fast".into()
            }
        );
        let beta = claim("c").beta_provisioner(DRIVER).class("fast").build();
        assert_eq!(
            decide_claim(&beta, DRIVER, None),
            ClaimDecision::Provision {
                class: "fast".into()
            }
        );
        let other = claim("c").provisioner("other.csi").class("fast").build();
        assert_eq!(decide_claim(&other, DRIVER, None), ClaimDecision::NotOurs);
        let none = claim("c").class("fast").build();
        assert_eq!(decide_claim(&none, DRIVER, None), ClaimDecision::NotOurs);
        let bound = claim("c")
            .provisioner(DRIVER)
            .class("fast")
            .volume_name("pv-1")
            .build();
        assert_eq!(
            decide_claim(&bound, DRIVER, None),
            ClaimDecision::AlreadyBound
        );
        let classless = claim("c").provisioner(DRIVER).build();
        assert_eq!(
            decide_claim(&classless, DRIVER, None),
            ClaimDecision::NotOurs
        );
    }

    #[test]
    fn claims_of_the_migrated_plugin_are_ours_once_marked_migrated_to_our_driver() {
        const EBS: &str = "ebs.csi.aws.com";
        const IN_TREE: &str = "kubernetes.io/aws-ebs";
        let provision = ClaimDecision::Provision {
            class: "gp2".into(),
        };
        // (storage-provisioner, migrated-to, the plugin we stand in for, decision): the rows of
        // external-provisioner's migration tests.
        let table = [
            (EBS, None, Some(IN_TREE), provision.clone()),
            (IN_TREE, Some(EBS), Some(IN_TREE), provision.clone()),
            (IN_TREE, None, Some(IN_TREE), ClaimDecision::NotOurs),
            (IN_TREE, Some("foo"), Some(IN_TREE), ClaimDecision::NotOurs),
            // Not a migrated driver: the in-tree name is never ours.
            (IN_TREE, Some(EBS), None, ClaimDecision::NotOurs),
            // Marked for us, but naming a plugin we do not stand in for.
            (
                "kubernetes.io/gce-pd",
                Some(EBS),
                Some(IN_TREE),
                ClaimDecision::NotOurs,
            ),
        ];
        for (named, migrated_to, in_tree, want) in table {
            let mut c = claim("c").provisioner(named).class("gp2");
            if let Some(to) = migrated_to {
                c = c.annotation(sidecar_kit::migration::ANN_MIGRATED_TO, to);
            }
            assert_eq!(
                decide_claim(&c.build(), EBS, in_tree),
                want,
                "{named} migrated-to {migrated_to:?} standing in for {in_tree:?}"
            );
        }
    }

    #[test]
    fn the_new_provisioner_annotation_wins_over_the_beta_one() {
        let c = claim("c")
            .provisioner(DRIVER)
            .beta_provisioner("other")
            .class("x")
            .build();
        assert_eq!(claim_provisioner(&c), Some(DRIVER));
    }

    #[test]
    fn the_beta_class_annotation_wins_over_the_spec() {
        let c = claim("c")
            .class("spec-class")
            .annotation(ANN_BETA_STORAGE_CLASS, "beta-class")
            .build();
        assert_eq!(claim_class(&c), Some("beta-class"));
    }

    #[test]
    fn sizes_are_parsed_exactly_and_bad_sizes_refused() {
        assert_eq!(
            requested_bytes(&claim("c").size("1Gi").build()).unwrap(),
            1 << 30
        );
        assert_eq!(
            requested_bytes(&claim("c").size("1.5G").build()).unwrap(),
            1_500_000_000
        );
        // Limits are not looked at, below the request or not parsing (upstream's).
        for limit in ["2Gi", "1Mi", "lots"] {
            assert_eq!(
                requested_bytes(&claim("c").size("1Gi").limit(limit).build()).unwrap(),
                1 << 30,
                "{limit}"
            );
        }
        let table: Vec<(&str, SizeError)> = vec![
            ("lots", SizeError::Unparsable("lots".into())),
            ("0", SizeError::NotPositive("0".into())),
            ("-1Gi", SizeError::NotPositive("-1Gi".into())),
            ("7Ei", SizeError::TooLarge("7Ei".into())),
        ];
        for (size, want) in table {
            assert_eq!(
                requested_bytes(&claim("c").size(size).build()).unwrap_err(),
                want,
                "{size}"
            );
        }
        assert_eq!(
            requested_bytes(&claim("c").build()).unwrap_err(),
            SizeError::Missing
        );
    }

    #[test]
    fn a_volume_in_flight_for_a_claim_bound_elsewhere_is_cleaned_up() {
        use InFlightFate::*;
        // (same claim, bound to) → fate of "pvc-1"
        let cases = [
            (false, None, CleanUp),
            (false, Some("pvc-1"), CleanUp),
            (true, None, Keep),
            (true, Some(""), Keep),
            (true, Some("pool-7"), CleanUp),
            (true, Some("pvc-1"), Keep),
        ];
        for (same, bound, want) in cases {
            assert_eq!(
                in_flight_fate("pvc-1", same, bound),
                want,
                "{same} {bound:?}"
            );
        }
    }
}
