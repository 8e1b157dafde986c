//! What a set's status says, and when it is written.
//!
//! One condition, `Ready`: True when at least `minimumReplicas` volumes are Available
//! (`MinimumAvailable`), False while filling (`BelowMinimum`) or when the spec cannot be served
//! (`InvalidSpec`, with the reason). Its `lastTransitionTime` moves only when its status does.
//!
//! While the set is being filled or trimmed, counts are not written on every volume (a pool of
//! 1,000 would cost 1,000 status writes): the status is written when the condition or the
//! generation changes, and when the set is at rest.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::decide::SetPlan;
use super::types::{PersistentVolumeSet, PersistentVolumeSetStatus};

/// The condition type.
pub const READY: &str = "Ready";

/// The status a plan reports, keeping the transition time of an unchanged condition.
pub fn status(set: &PersistentVolumeSet, plan: &SetPlan, now: Time) -> PersistentVolumeSetStatus {
    let minimum = set.spec.minimum_replicas;
    let (state, reason, message) = match &plan.invalid {
        Some(why) => ("False", "InvalidSpec", why.clone()),
        None if plan.ready => (
            "True",
            "MinimumAvailable",
            format!(
                "{} volumes Available, {minimum} wanted at least",
                plan.status.unbound_replicas
            ),
        ),
        None => (
            "False",
            "BelowMinimum",
            format!(
                "{} volumes Available, {minimum} wanted at least",
                plan.status.unbound_replicas
            ),
        ),
    };
    let previous = set
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    let last_transition_time = match previous {
        Some(c) if c.status == state => c.last_transition_time.clone(),
        _ => now,
    };
    PersistentVolumeSetStatus {
        conditions: vec![Condition {
            type_: READY.into(),
            status: state.into(),
            reason: reason.into(),
            message,
            last_transition_time,
            observed_generation: set.metadata.generation,
        }],
        ..plan.status.clone()
    }
}

/// Whether to write `new` over the set's current status. `busy`: volumes are being made or
/// deleted for the set right now.
pub fn should_write(
    set: &PersistentVolumeSet,
    new: &PersistentVolumeSetStatus,
    busy: bool,
) -> bool {
    let Some(old) = set.status.as_ref() else {
        return true;
    };
    if old == new {
        return false;
    }
    let ready = |s: &PersistentVolumeSetStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == READY)
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    !busy || ready(old) != ready(new) || old.observed_generation != new.observed_generation
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn time(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    fn set_with(status: Option<serde_json::Value>) -> PersistentVolumeSet {
        let mut v = json!({"metadata": {"name": "p", "generation": 2}, "spec": {"minimumReplicas": 3, "maximumReplicas": 5}});
        if let Some(s) = status {
            v["status"] = s;
        }
        serde_json::from_value(v).unwrap()
    }

    fn plan(available: i32, ready: bool, invalid: Option<&str>) -> SetPlan {
        SetPlan {
            invalid: invalid.map(str::to_string),
            ready,
            status: PersistentVolumeSetStatus {
                unbound_replicas: available,
                replicas: available,
                observed_generation: Some(2),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_ready_condition_says_why_and_keeps_its_transition_time() {
        let now = time("2026-11-23T10:00:00Z");
        let fresh = set_with(None);
        // (plan, want status, want reason)
        let table = [
            (plan(3, true, None), "True", "MinimumAvailable"),
            (plan(1, false, None), "False", "BelowMinimum"),
            (plan(0, false, Some("bad selector")), "False", "InvalidSpec"),
        ];
        for (p, want_status, want_reason) in table {
            let s = status(&fresh, &p, now.clone());
            let c = &s.conditions[0];
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                (want_status, want_reason)
            );
            assert_eq!(c.observed_generation, Some(2));
            assert_eq!(c.last_transition_time, now);
        }
        let invalid = status(&fresh, &plan(0, false, Some("bad selector")), now.clone());
        assert_eq!(invalid.conditions[0].message, "bad selector");

        let earlier = time("2026-11-23T09:00:00Z");
        let was_ready = set_with(Some(
            json!({"conditions": [{"type": "Ready", "status": "True",
            "reason": "MinimumAvailable", "message": "", "lastTransitionTime": "2026-11-23T09:00:00Z"}]}),
        ));
        let still = status(&was_ready, &plan(4, true, None), now.clone());
        assert_eq!(still.conditions[0].last_transition_time, earlier);
        let fell = status(&was_ready, &plan(2, false, None), now.clone());
        assert_eq!(fell.conditions[0].last_transition_time, now);
    }

    #[test]
    fn counts_are_written_at_rest_and_condition_changes_at_once() {
        let now = time("2026-11-23T10:00:00Z");
        let fresh = set_with(None);
        let filling = status(&fresh, &plan(1, false, None), now.clone());
        assert!(
            should_write(&fresh, &filling, true),
            "a set without status gets one"
        );
        let mut written = fresh.clone();
        written.status = Some(filling.clone());
        assert!(!should_write(&written, &filling, false), "nothing changed");
        let more = status(&written, &plan(2, false, None), now.clone());
        assert!(
            !should_write(&written, &more, true),
            "a count while filling waits"
        );
        assert!(
            should_write(&written, &more, false),
            "a count at rest is written"
        );
        let ready = status(&written, &plan(3, true, None), now.clone());
        assert!(
            should_write(&written, &ready, true),
            "becoming Ready is written at once"
        );
        let mut next_generation = more.clone();
        next_generation.observed_generation = Some(3);
        assert!(should_write(&written, &next_generation, true));
    }
}
