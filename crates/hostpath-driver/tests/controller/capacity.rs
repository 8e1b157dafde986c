//! Capacity accounting and topology.

use super::*;

#[tokio::test]
async fn capacity_is_exhausted_exactly_and_freed_by_delete() {
    let h = Harness::start(&["--capacity=4Gi", "--capacity=fast=1Gi"]).await;
    let mut c = h.controller();
    let capacity = |kind: &'static str| {
        let mut c = h.controller();
        async move {
            let parameters = if kind.is_empty() {
                params(&[])
            } else {
                params(&[("kind", kind)])
            };
            c.get_capacity(csi::GetCapacityRequest {
                parameters,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .available_capacity
        }
    };
    assert_eq!(capacity("").await, 4 * GI);
    assert_eq!(capacity("fast").await, GI);
    let a = c
        .create_volume(create_request("a", 3 * GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(capacity("").await, GI);
    assert_eq!(capacity("fast").await, GI, "pools are separate");
    let err = c
        .create_volume(create_request("b", 2 * GI))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{}", err.message());
    c.create_volume(create_request("c", GI)).await.unwrap();
    assert_eq!(capacity("").await, 0);
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: a.volume_id,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(capacity("").await, 3 * GI);
    c.create_volume(create_request("b", 2 * GI)).await.unwrap();
    assert_eq!(capacity("").await, GI);
}

#[tokio::test]
async fn get_capacity_is_per_topology_segment_and_validates_its_input() {
    let h = Harness::start(&[
        "--capacity=2Gi",
        "--extra-node=node-2",
        "--max-volume-size=1Gi",
    ])
    .await;
    let mut c = h.controller();
    let at = |value: &'static str| {
        let mut c = h.controller();
        async move {
            c.get_capacity(csi::GetCapacityRequest {
                accessible_topology: Some(segment(KEY, value)),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let mut req = create_request("a", GI);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![segment(KEY, "node-2")],
        preferred: vec![],
    });
    let v = c
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.accessible_topology, vec![segment(KEY, "node-2")]);
    assert_eq!(at("node-1").await.available_capacity, 2 * GI);
    assert_eq!(at("node-2").await.available_capacity, GI);
    assert_eq!(
        at("node-2").await.maximum_volume_size,
        Some(GI),
        "capped by --max-volume-size"
    );
    assert_eq!(
        at("node-9").await.available_capacity,
        0,
        "a segment we do not serve has nothing"
    );
    let total = c
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(total.available_capacity, 3 * GI);

    let bad_key = c
        .get_capacity(csi::GetCapacityRequest {
            accessible_topology: Some(segment("zone", "x")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_key.code(), Code::InvalidArgument);
    let bad_kind = c
        .get_capacity(csi::GetCapacityRequest {
            parameters: params(&[("kind", "nope")]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_kind.code(), Code::InvalidArgument);

    let unlimited = Harness::start(&[]).await;
    let err = unlimited
        .controller()
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
}

#[tokio::test]
async fn topology_requirements_place_the_volume_or_exhaust() {
    let h = Harness::start(&["--extra-node=node-2", "--extra-node=node-3=rack-3"]).await;
    let mut c = h.controller();
    let mut req = create_request("t", GI);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![segment(KEY, "node-1"), segment(KEY, "rack-3")],
        preferred: vec![segment(KEY, "rack-3"), segment(KEY, "node-1")],
    });
    let v = c
        .create_volume(req.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.accessible_topology, vec![segment(KEY, "rack-3")]);
    req.name = "u".into();
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![segment(KEY, "elsewhere")],
        preferred: vec![],
    });
    assert_eq!(
        c.create_volume(req).await.unwrap_err().code(),
        Code::ResourceExhausted
    );

    let flat = Harness::start(&["--disable-topology"]).await;
    let v = flat
        .controller()
        .create_volume(create_request("x", GI))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(v.accessible_topology.is_empty());
}
