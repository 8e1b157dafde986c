//! The one table that turns a CreateVolume/DeleteVolume outcome into what happens next.

use tonic::Code;

/// What a CreateVolume result means for the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateOutcome {
    /// The volume exists: write the PV.
    Created,
    /// The volume may exist or be in the making: keep calling CreateVolume with the same name
    /// (even if the claim is deleted meanwhile, then delete what it returns).
    InBackground,
    /// The selected node cannot hold the volume: remove `selected-node` so the scheduler
    /// picks another node. No volume exists.
    Reschedule,
    /// The driver refused: no volume exists. Report and retry with backoff.
    Final,
    /// `ALREADY_EXISTS`: a volume of this name exists, made with other parameters. It is not
    /// ours to forget: keep the intent record (so it is deleted if the claim goes away), report
    /// the conflict and retry with backoff.
    Conflict,
}

/// Classifies a CreateVolume result. `may_reschedule`: the claim has a selected node and the
/// driver uses topology. A transport failure arrives as `Unavailable`: in background, the
/// request may have reached the driver.
pub fn classify_create(result: Result<(), Code>, may_reschedule: bool) -> CreateOutcome {
    let code = match result {
        Ok(()) => return CreateOutcome::Created,
        Err(code) => code,
    };
    match code {
        Code::Ok => CreateOutcome::Created,
        Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted => {
            CreateOutcome::InBackground
        }
        Code::ResourceExhausted if may_reschedule => CreateOutcome::Reschedule,
        Code::AlreadyExists => CreateOutcome::Conflict,
        Code::ResourceExhausted
        | Code::Unknown
        | Code::InvalidArgument
        | Code::NotFound
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => CreateOutcome::Final,
    }
}

/// A claim whose CreateVolume the driver refused with INVALID_ARGUMENT ("infeasible", as
/// upstream calls it since v6.1): when, and the UIDs of the claim and of its class then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Infeasible {
    /// When the driver refused it.
    pub at: std::time::Instant,
    /// The claim's UID (a claim made again under the same name is another claim).
    pub claim_uid: String,
    /// Its class's UID (a class made again under the same name may accept it).
    pub class_uid: String,
}

/// How long a claim refused as infeasible still waits before its next attempt: `wait`
/// (`--retry-interval-max`, as upstream) from the refusal, whatever changes meanwhile except
/// the claim or its class being another object; None: it may try now.
pub fn infeasible_wait(
    marked: &Infeasible,
    claim_uid: &str,
    class_uid: &str,
    now: std::time::Instant,
    wait: std::time::Duration,
) -> Option<std::time::Duration> {
    if marked.claim_uid != claim_uid || marked.class_uid != class_uid {
        return None;
    }
    let remaining = (marked.at + wait).saturating_duration_since(now);
    (!remaining.is_zero()).then_some(remaining)
}

/// Whether a ResourceExhausted answer may send the claim back to the scheduler: it has a
/// selected node and the request carried topology.
pub fn may_reschedule(node_selected: bool, uses_topology: bool) -> bool {
    node_selected && uses_topology
}

/// What a DeleteVolume result means for the PV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The volume is gone: delete the PV and drop the finalizer.
    Deleted,
    /// Try again after backoff.
    Retry,
}

/// Classifies a DeleteVolume result. NotFound means the volume is already gone (upstream
/// retries it forever).
pub fn classify_delete(result: Result<(), Code>) -> DeleteOutcome {
    let Err(code) = result else {
        return DeleteOutcome::Deleted;
    };
    match code {
        Code::Ok | Code::NotFound => DeleteOutcome::Deleted,
        Code::Cancelled
        | Code::Unknown
        | Code::InvalidArgument
        | Code::DeadlineExceeded
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::Unavailable
        | Code::DataLoss
        | Code::Unauthenticated => DeleteOutcome::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_infeasible_claim_waits_from_its_refusal_unless_it_or_its_class_is_another_object() {
        use std::time::{Duration, Instant};
        let at = Instant::now();
        let wait = Duration::from_secs(300);
        let marked = Infeasible {
            at,
            claim_uid: "claim-1".into(),
            class_uid: "class-1".into(),
        };
        let cases = [
            // (claim uid, class uid, seconds since the refusal, expected wait in seconds)
            ("claim-1", "class-1", 0, Some(300)),
            ("claim-1", "class-1", 120, Some(180)),
            ("claim-1", "class-1", 300, None),
            ("claim-1", "class-1", 900, None),
            ("claim-1", "class-2", 0, None),
            ("claim-2", "class-1", 0, None),
        ];
        for (claim, class, since, expected) in cases {
            assert_eq!(
                infeasible_wait(&marked, claim, class, at + Duration::from_secs(since), wait),
                expected.map(Duration::from_secs),
                "{claim} {class} {since}"
            );
        }
    }

    #[test]
    fn only_a_selected_node_with_topology_may_be_rescheduled() {
        let cases = [
            (true, true, true),
            (true, false, false),
            (false, true, false),
            (false, false, false),
        ];
        for (selected, topology, expected) in cases {
            assert_eq!(may_reschedule(selected, topology), expected);
        }
    }

    #[test]
    fn every_create_code_is_classified_as_upstream_does() {
        use CreateOutcome::*;
        let table: &[(Code, CreateOutcome, CreateOutcome)] = &[
            (Code::Ok, Created, Created),
            (Code::Cancelled, InBackground, InBackground),
            (Code::Unknown, Final, Final),
            (Code::InvalidArgument, Final, Final),
            (Code::DeadlineExceeded, InBackground, InBackground),
            (Code::NotFound, Final, Final),
            (Code::AlreadyExists, Conflict, Conflict),
            (Code::PermissionDenied, Final, Final),
            (Code::ResourceExhausted, Final, Reschedule),
            (Code::FailedPrecondition, Final, Final),
            (Code::Aborted, InBackground, InBackground),
            (Code::OutOfRange, Final, Final),
            (Code::Unimplemented, Final, Final),
            (Code::Internal, Final, Final),
            (Code::Unavailable, InBackground, InBackground),
            (Code::DataLoss, Final, Final),
            (Code::Unauthenticated, Final, Final),
        ];
        assert_eq!(table.len(), 17, "every gRPC code is in the table");
        for (code, without, with) in table {
            assert_eq!(classify_create(Err(*code), false), *without, "{code:?}");
            assert_eq!(
                classify_create(Err(*code), true),
                *with,
                "{code:?} with a selected node"
            );
        }
        assert_eq!(classify_create(Ok(()), false), Created);
        assert_eq!(
            classify_create(Err(Code::Unavailable), false),
            InBackground,
            "transport errors (Unavailable) may have reached the driver"
        );
    }

    #[test]
    fn delete_treats_not_found_as_done() {
        assert_eq!(classify_delete(Ok(())), DeleteOutcome::Deleted);
        assert_eq!(classify_delete(Err(Code::NotFound)), DeleteOutcome::Deleted);
        for code in [
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::FailedPrecondition,
            Code::Internal,
        ] {
            assert_eq!(classify_delete(Err(code)), DeleteOutcome::Retry, "{code:?}");
        }
    }
}
