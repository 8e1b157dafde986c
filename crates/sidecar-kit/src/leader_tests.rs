#![allow(clippy::unwrap_used)]

use super::*;

const D: Duration = Duration::from_secs(15);

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

#[test]
fn lease_names_follow_csi_lib_utils() {
    assert_eq!(lease_name("hostpath.csi.k8s.io"), "hostpath-csi-k8s-io");
    assert_eq!(lease_name("example.com/driver"), "example-com-driver");
    assert_eq!(lease_name("driver."), "driver-X");
    assert_eq!(lease_name("a-b"), "a-b");
    assert_eq!(lock_name("hostpath.csi.k8s.io"), "hostpath.csi.k8s.io");
    assert_eq!(lock_name("example.com/driver"), "example.com-driver");
}

#[test]
fn a_missing_lease_is_created_with_us_as_holder() {
    let LeaseAction::Write(spec) = decide(None, "me", at(0), D, Duration::ZERO) else {
        panic!("expected a write")
    };
    assert_eq!(spec.holder_identity.as_deref(), Some("me"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    assert_eq!(spec.acquire_time, spec.renew_time);
}

#[test]
fn a_valid_lease_of_another_holder_is_respected_and_an_expired_one_taken() {
    let LeaseAction::Write(theirs) = decide(None, "other", at(0), D, Duration::ZERO) else {
        panic!()
    };
    assert_eq!(
        decide(Some(&theirs), "me", at(10), D, Duration::from_secs(10)),
        LeaseAction::Wait {
            holder: "other".into()
        }
    );
    let LeaseAction::Write(mine) = decide(Some(&theirs), "me", at(16), D, Duration::from_secs(16))
    else {
        panic!("expired lease is taken")
    };
    assert_eq!(mine.holder_identity.as_deref(), Some("me"));
    assert_eq!(mine.lease_transitions, Some(1));
    assert_eq!(mine.acquire_time, Some(MicroTime(at(16))));
}

#[test]
fn expiry_follows_the_local_observation_not_the_holders_clock() {
    // A record renewed "an hour ago" by a holder whose clock is behind is still valid
    // until this replica has seen it unchanged for the lease duration.
    let LeaseAction::Write(theirs) = decide(None, "other", at(-3600), D, Duration::ZERO) else {
        panic!()
    };
    assert_eq!(
        decide(Some(&theirs), "me", at(0), D, Duration::ZERO),
        LeaseAction::Wait {
            holder: "other".into()
        }
    );
    assert_eq!(
        decide(Some(&theirs), "me", at(14), D, Duration::from_secs(14)),
        LeaseAction::Wait {
            holder: "other".into()
        }
    );
    // And a record renewed "in the future" expires after the duration all the same.
    let LeaseAction::Write(ahead) = decide(None, "other", at(3600), D, Duration::ZERO) else {
        panic!()
    };
    assert!(matches!(
        decide(Some(&ahead), "me", at(15), D, Duration::from_secs(15)),
        LeaseAction::Write(_)
    ));
}

#[test]
fn renewing_keeps_acquire_time_and_transitions() {
    let LeaseAction::Write(first) = decide(None, "me", at(0), D, Duration::ZERO) else {
        panic!()
    };
    let LeaseAction::Write(renewed) = decide(Some(&first), "me", at(5), D, Duration::from_secs(5))
    else {
        panic!()
    };
    assert_eq!(renewed.acquire_time, first.acquire_time);
    assert_eq!(renewed.renew_time, Some(MicroTime(at(5))));
    assert_eq!(renewed.lease_transitions, Some(0));
}

#[test]
fn a_released_lease_is_taken_at_once() {
    let LeaseAction::Write(theirs) = decide(None, "other", at(0), D, Duration::ZERO) else {
        panic!()
    };
    let free = released(&theirs, at(1));
    assert_eq!(free.holder_identity, None);
    assert_eq!(free.lease_duration_seconds, Some(1));
    let LeaseAction::Write(mine) = decide(Some(&free), "me", at(1), D, Duration::ZERO) else {
        panic!("a released lease is free")
    };
    assert_eq!(mine.holder_identity.as_deref(), Some("me"));
    assert_eq!(mine.lease_transitions, Some(1));
}
