//! The server's table of protobuf messages against k8s-pb's generated types: every field of
//! each message it covers whole.

use std::collections::BTreeSet;

use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;

/// heck-style snake case, as prost names fields.
fn snake(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
            if prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower)
            {
                out.push('_');
            }
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// Field names of a prost message, from its Debug form of the default value.
fn prost_fields(debug: &str) -> BTreeSet<String> {
    let inner = debug.split_once('{').map_or("", |(_, rest)| rest);
    inner
        .split(", ")
        .filter_map(|part| {
            part.trim()
                .split_once(':')
                .map(|(name, _)| name.trim().trim_start_matches("r#").to_string())
        })
        .filter(|n| !n.is_empty() && !n.contains('}'))
        // The proto field of Go's `UID` (JSON `uid`) is `uID`, which prost names `u_id`.
        .map(|n| if n == "u_id" { "uid".to_string() } else { n })
        .collect()
}

#[test]
fn the_table_has_every_field_of_the_messages_it_covers_whole() {
    use k8s_pb::api::authentication::v1 as authn;
    use k8s_pb::api::authorization::v1 as authz;
    use k8s_pb::api::coordination::v1 as coordination;
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::api::events::v1 as events;
    use k8s_pb::api::rbac::v1 as rbac;
    use k8s_pb::api::storage::v1 as storage;
    let schema = apiserver::protobuf::schema::Schema::builtin();
    macro_rules! whole {
        ($($name:literal => $ty:ty),* $(,)?) => {
            vec![$(($name, format!("{:?}", <$ty>::default()))),*]
        };
    }
    let cases = whole![
        "ObjectMeta" => meta::ObjectMeta, "OwnerReference" => meta::OwnerReference,
        "ManagedFieldsEntry" => meta::ManagedFieldsEntry, "ListMeta" => meta::ListMeta,
        "Status" => meta::Status, "StatusDetails" => meta::StatusDetails, "StatusCause" => meta::StatusCause,
        "DeleteOptions" => meta::DeleteOptions, "Preconditions" => meta::Preconditions,
        "LabelSelector" => meta::LabelSelector, "LabelSelectorRequirement" => meta::LabelSelectorRequirement,
        "Namespace" => core::Namespace, "NamespaceSpec" => core::NamespaceSpec, "NamespaceStatus" => core::NamespaceStatus,
        "NamespaceCondition" => core::NamespaceCondition, "ConfigMap" => core::ConfigMap, "Secret" => core::Secret,
        "ServiceAccount" => core::ServiceAccount, "ObjectReference" => core::ObjectReference,
        "Event" => core::Event, "EventSource" => core::EventSource, "EventSeries" => core::EventSeries,
        "PersistentVolume" => core::PersistentVolume, "PersistentVolumeSpec" => core::PersistentVolumeSpec,
        "PersistentVolumeStatus" => core::PersistentVolumeStatus,
        "CSIPersistentVolumeSource" => core::CSIPersistentVolumeSource, "HostPathVolumeSource" => core::HostPathVolumeSource,
        "NFSVolumeSource" => core::NfsVolumeSource, "LocalVolumeSource" => core::LocalVolumeSource,
        "SecretReference" => core::SecretReference, "VolumeNodeAffinity" => core::VolumeNodeAffinity,
        "NodeSelector" => core::NodeSelector, "NodeSelectorTerm" => core::NodeSelectorTerm,
        "NodeSelectorRequirement" => core::NodeSelectorRequirement, "TopologySelectorTerm" => core::TopologySelectorTerm,
        "TopologySelectorLabelRequirement" => core::TopologySelectorLabelRequirement,
        "PersistentVolumeClaim" => core::PersistentVolumeClaim, "PersistentVolumeClaimSpec" => core::PersistentVolumeClaimSpec,
        "PersistentVolumeClaimStatus" => core::PersistentVolumeClaimStatus,
        "PersistentVolumeClaimCondition" => core::PersistentVolumeClaimCondition,
        "VolumeResourceRequirements" => core::VolumeResourceRequirements,
        "TypedLocalObjectReference" => core::TypedLocalObjectReference, "TypedObjectReference" => core::TypedObjectReference,
        "ModifyVolumeStatus" => core::ModifyVolumeStatus,
        "StorageClass" => storage::StorageClass, "CSIDriver" => storage::CSIDriver, "CSIDriverSpec" => storage::CSIDriverSpec,
        "TokenRequest" => storage::TokenRequest, "CSINode" => storage::CSINode, "CSINodeSpec" => storage::CSINodeSpec,
        "CSINodeDriver" => storage::CSINodeDriver, "VolumeNodeResources" => storage::VolumeNodeResources,
        "CSIStorageCapacity" => storage::CSIStorageCapacity, "VolumeAttachment" => storage::VolumeAttachment,
        "VolumeAttachmentSpec" => storage::VolumeAttachmentSpec, "VolumeAttachmentSource" => storage::VolumeAttachmentSource,
        "VolumeAttachmentStatus" => storage::VolumeAttachmentStatus, "VolumeError" => storage::VolumeError,
        "VolumeAttributesClass" => storage::VolumeAttributesClass,
        "Lease" => coordination::Lease, "LeaseSpec" => coordination::LeaseSpec,
        "events.Event" => events::Event, "events.EventSeries" => events::EventSeries,
        "SelfSubjectReview" => authn::SelfSubjectReview, "UserInfo" => authn::UserInfo,
        "SelfSubjectAccessReview" => authz::SelfSubjectAccessReview,
        "SelfSubjectAccessReviewSpec" => authz::SelfSubjectAccessReviewSpec,
        "ResourceAttributes" => authz::ResourceAttributes, "NonResourceAttributes" => authz::NonResourceAttributes,
        "SubjectAccessReviewStatus" => authz::SubjectAccessReviewStatus,
        "SubjectAccessReview" => authz::SubjectAccessReview, "SubjectAccessReviewSpec" => authz::SubjectAccessReviewSpec,
        "SelfSubjectRulesReview" => authz::SelfSubjectRulesReview,
        "SelfSubjectRulesReviewSpec" => authz::SelfSubjectRulesReviewSpec,
        "SubjectRulesReviewStatus" => authz::SubjectRulesReviewStatus,
        "ResourceRule" => authz::ResourceRule, "NonResourceRule" => authz::NonResourceRule,
        "authentication.TokenRequest" => authn::TokenRequest,
        "authentication.TokenRequestSpec" => authn::TokenRequestSpec,
        "authentication.TokenRequestStatus" => authn::TokenRequestStatus,
        "BoundObjectReference" => authn::BoundObjectReference,
        "Role" => rbac::Role, "ClusterRole" => rbac::ClusterRole, "AggregationRule" => rbac::AggregationRule,
        "PolicyRule" => rbac::PolicyRule, "RoleBinding" => rbac::RoleBinding,
        "ClusterRoleBinding" => rbac::ClusterRoleBinding, "Subject" => rbac::Subject, "RoleRef" => rbac::RoleRef,
        "Deployment" => k8s_pb::api::apps::v1::Deployment, "DeploymentSpec" => k8s_pb::api::apps::v1::DeploymentSpec,
        "DeploymentStatus" => k8s_pb::api::apps::v1::DeploymentStatus,
        "StatefulSet" => k8s_pb::api::apps::v1::StatefulSet, "StatefulSetSpec" => k8s_pb::api::apps::v1::StatefulSetSpec,
        "StatefulSetStatus" => k8s_pb::api::apps::v1::StatefulSetStatus,
        "StatefulSetUpdateStrategy" => k8s_pb::api::apps::v1::StatefulSetUpdateStrategy,
        "RollingUpdateStatefulSetStrategy" => k8s_pb::api::apps::v1::RollingUpdateStatefulSetStrategy,
        "DaemonSet" => k8s_pb::api::apps::v1::DaemonSet, "DaemonSetSpec" => k8s_pb::api::apps::v1::DaemonSetSpec,
        "DaemonSetStatus" => k8s_pb::api::apps::v1::DaemonSetStatus,
        "ReplicaSet" => k8s_pb::api::apps::v1::ReplicaSet, "ReplicaSetSpec" => k8s_pb::api::apps::v1::ReplicaSetSpec,
        "ReplicaSetStatus" => k8s_pb::api::apps::v1::ReplicaSetStatus,
    ];
    let mut problems = Vec::new();
    for (name, debug) in cases {
        let message = schema
            .message(name)
            .unwrap_or_else(|| panic!("{name} is not in the table"));
        let ours: BTreeSet<String> = message.fields.iter().map(|f| snake(&f.json)).collect();
        let theirs = prost_fields(&debug);
        if ours != theirs {
            problems.push(format!(
                "{name}: only ours {:?}, only k8s-pb {:?}",
                ours.difference(&theirs).collect::<Vec<_>>(),
                theirs.difference(&ours).collect::<Vec<_>>()
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
