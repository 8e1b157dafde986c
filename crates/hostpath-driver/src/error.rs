//! Every way a driver RPC can fail, and the gRPC code each one is answered with.

use tonic::{Code, Status};

use crate::state::StoreError;

/// A refused or failed RPC. The message says what was wrong; [`Error::code`] is the one
/// exhaustive classification, following the error tables of the CSI specification.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required string field is empty.
    #[error("{0} is required")]
    Missing(&'static str),
    /// A volume capability is malformed or not supported.
    #[error("unsupported volume capability: {0}")]
    Capability(String),
    /// The capacity range is malformed.
    #[error("invalid capacity range: {0}")]
    CapacityRange(String),
    /// The requested size is above --max-volume-size.
    #[error("requested size {requested} bytes exceeds the maximum volume size of {max} bytes")]
    TooLarge {
        /// Requested bytes.
        requested: i64,
        /// The limit.
        max: i64,
    },
    /// A parameter the driver does not know.
    #[error(
        "unknown parameter {0:?}: this driver accepts only `kind` and the csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name metadata"
    )]
    UnknownParameter(String),
    /// The class names a capacity kind that is not configured.
    #[error("unknown kind {kind:?}: configured kinds are {known}")]
    UnknownKind {
        /// Requested kind.
        kind: String,
        /// Known kinds, comma separated.
        known: String,
    },
    /// A feature the request asks for is not supported (content source, mutable parameters).
    #[error("{0} is not supported by this driver")]
    Unsupported(&'static str),
    /// A volume with this name exists but differs from the request.
    #[error("volume {name:?} already exists with {difference}")]
    NameConflict {
        /// The name.
        name: String,
        /// How it differs.
        difference: String,
    },
    /// No node in the requested topology has room.
    #[error("not enough capacity: {0}")]
    NoCapacity(String),
    /// The accessibility requirements name no node of this driver.
    #[error("cannot provision in the requested topology: {0}")]
    Topology(String),
    /// GetCapacity topology or key is malformed.
    #[error("invalid topology: {0}")]
    InvalidTopology(String),
    /// The volume id is unknown.
    #[error("volume {0:?} does not exist")]
    VolumeNotFound(String),
    /// The node id is unknown.
    #[error("node {0:?} does not exist")]
    NodeNotFound(String),
    /// The volume is published and cannot be deleted.
    #[error("volume {id:?} is in use: {detail}")]
    InUse {
        /// Volume id.
        id: String,
        /// Where it is published.
        detail: String,
    },
    /// The volume cannot be published there (another node holds it, wrong node, not attached).
    #[error("{0}")]
    Precondition(String),
    /// Already published with other parameters.
    #[error("{0}")]
    PublishConflict(String),
    /// The node has reached its attach limit.
    #[error("node {node:?} already has the maximum of {limit} volumes attached")]
    AttachLimit {
        /// Node id.
        node: String,
        /// The limit.
        limit: i64,
    },
    /// ListVolumes starting_token was not produced by this driver.
    #[error("invalid starting_token {0:?}")]
    InvalidToken(String),
    /// max_entries is negative.
    #[error("max_entries must not be negative, got {0}")]
    InvalidMaxEntries(i32),
    /// The RPC is not served with this configuration.
    #[error("{0} is not supported by this driver configuration")]
    NotServed(&'static str),
    /// Making the volume visible at the target path failed.
    #[error("failed to {action} {path}: {detail}")]
    Filesystem {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: String,
        /// The OS or mount error.
        detail: String,
    },
    /// A CreateSnapshot or CreateVolumeGroupSnapshot parameter the driver does not know.
    #[error(
        "unknown snapshot parameter {0:?}: this driver accepts only the csi.storage.k8s.io snapshot metadata"
    )]
    UnknownSnapshotParameter(String),
    /// A snapshot with this name exists for another volume.
    #[error("snapshot {name:?} already exists for volume {volume:?}")]
    SnapshotNameConflict {
        /// The name.
        name: String,
        /// The volume it was taken of.
        volume: String,
    },
    /// The snapshot id is unknown.
    #[error("snapshot {0:?} does not exist")]
    SnapshotNotFound(String),
    /// A member of a group snapshot cannot be deleted alone.
    #[error(
        "snapshot {id:?} is part of group snapshot {group:?}: delete the group with DeleteVolumeGroupSnapshot"
    )]
    SnapshotInGroup {
        /// Snapshot id.
        id: String,
        /// Group snapshot id.
        group: String,
    },
    /// A group snapshot with this name exists for other volumes.
    #[error("group snapshot {name:?} already exists for volumes {sources}")]
    GroupNameConflict {
        /// The name.
        name: String,
        /// Its volumes, comma separated.
        sources: String,
    },
    /// The group snapshot id is unknown.
    #[error("group snapshot {0:?} does not exist")]
    GroupNotFound(String),
    /// The group's members are not all there (a member lost).
    #[error("{0}")]
    GroupPrecondition(String),
    /// The group request is invalid: a volume named twice, or snapshot ids that do not match.
    #[error("{0}")]
    GroupArgument(String),
    /// A volume is being restored from this snapshot.
    #[error("snapshot {0:?} is in use: a volume is being restored from it")]
    SnapshotInUse(String),
    /// The content source of CreateVolume does not exist.
    #[error("{kind} {id:?} (volume_content_source) does not exist")]
    SourceNotFound {
        /// `snapshot` or `volume`.
        kind: &'static str,
        /// Its id.
        id: String,
    },
    /// The content source cannot become this volume (access type).
    #[error("volume_content_source is incompatible: {0}")]
    SourceIncompatible(String),
    /// The capacity range is not possible for this volume.
    #[error("{0}")]
    OutOfRange(String),
    /// A volume is never shrunk.
    #[error(
        "volume {id:?} has {capacity} bytes, more than limit_bytes {limit}: volumes are never shrunk"
    )]
    ShrinkRefused {
        /// Volume id.
        id: String,
        /// Its capacity.
        capacity: i64,
        /// The limit asked for.
        limit: i64,
    },
    /// The volume is not published or staged at that path.
    #[error("volume {id:?} is not published or staged at {path:?}")]
    NotAtPath {
        /// Volume id.
        id: String,
        /// The path.
        path: String,
    },
    /// A mutable parameter the driver does not know.
    #[error("unknown mutable parameter {0:?}: this driver accepts iops and tier")]
    UnknownMutableParameter(String),
    /// A mutable parameter's value is invalid.
    #[error(
        "invalid mutable parameter {key}={value:?}: iops takes 1 to 1000000, tier takes standard or premium"
    )]
    InvalidMutableParameter {
        /// The parameter's name.
        key: String,
        /// The value given.
        value: String,
    },
    /// A create of this name is still being made (by a request that is no longer waiting).
    #[error("an operation for {0:?} is still in progress")]
    Pending(String),
    /// The task carrying out the request failed.
    #[error("the operation failed: {0}")]
    Task(String),
    /// The volume table could not be written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An ephemeral volume's request cannot be served (its id, its size, a persistent volume
    /// of that id).
    #[error("ephemeral volume: {0}")]
    Ephemeral(String),
    /// A secret `--require-secret` asks for is missing or wrong (never echoed).
    #[error("{method}: secret {key:?} is missing or does not have the required value")]
    SecretRequired {
        /// The method.
        method: &'static str,
        /// The secret's key.
        key: String,
    },
}

impl Error {
    /// The gRPC code of this error (one exhaustive match: a new variant must be classified).
    pub fn code(&self) -> Code {
        match self {
            Error::Missing(_)
            | Error::SecretRequired { .. }
            | Error::Capability(_)
            | Error::CapacityRange(_)
            | Error::UnknownParameter(_)
            | Error::UnknownKind { .. }
            | Error::Unsupported(_)
            | Error::InvalidTopology(_)
            | Error::InvalidMaxEntries(_)
            | Error::UnknownSnapshotParameter(_)
            | Error::SnapshotInGroup { .. }
            | Error::SourceIncompatible(_)
            | Error::UnknownMutableParameter(_)
            | Error::InvalidMutableParameter { .. }
            | Error::GroupArgument(_)
            | Error::Ephemeral(_) => Code::InvalidArgument,
            Error::TooLarge { .. } | Error::OutOfRange(_) | Error::ShrinkRefused { .. } => {
                Code::OutOfRange
            }
            Error::NameConflict { .. }
            | Error::PublishConflict(_)
            | Error::SnapshotNameConflict { .. }
            | Error::GroupNameConflict { .. } => Code::AlreadyExists,
            Error::NoCapacity(_) | Error::Topology(_) | Error::AttachLimit { .. } => {
                Code::ResourceExhausted
            }
            Error::VolumeNotFound(_)
            | Error::NodeNotFound(_)
            | Error::SnapshotNotFound(_)
            | Error::GroupNotFound(_)
            | Error::SourceNotFound { .. }
            | Error::NotAtPath { .. } => Code::NotFound,
            Error::InUse { .. }
            | Error::Precondition(_)
            | Error::GroupPrecondition(_)
            | Error::SnapshotInUse(_) => Code::FailedPrecondition,
            Error::InvalidToken(_) | Error::Pending(_) => Code::Aborted,
            Error::NotServed(_) => Code::Unimplemented,
            Error::Filesystem { .. } | Error::Task(_) => Code::Internal,
            Error::Store(StoreError::Failed(_)) => Code::Unavailable,
            Error::Store(
                StoreError::Io { .. }
                | StoreError::Open(_)
                | StoreError::Replay(_)
                | StoreError::Legacy(_),
            ) => Code::Internal,
        }
    }
}

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        Status::new(error.code(), error.to_string())
    }
}

/// Result of a driver operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
