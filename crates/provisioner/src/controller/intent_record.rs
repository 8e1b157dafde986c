//! One record of the intent log and its encoding: the claim, the CreateVolume request without
//! secrets, and the secret's reference.
//!
//! A request with topology on a large cluster is large: without `--strict-topology` a late
//! claim's requisite lists every segment of the cluster and its preferred list the same
//! segments again, rotated (2,000 nodes: a 296 KB record, more than one Lease annotation may
//! hold, which stopped provisioning). The record keeps the request exactly, in less room:
//! when the preferred list is a rotation of the requisite it is stored as that rotation, and a
//! request over [`COMPRESS_OVER`] bytes is stored deflated (the same key in every segment and
//! similar values compress well). Older records (plain protobuf) read as before.

use std::io::{Read, Write};

use base64::Engine;
use csi_proto::v1 as csi;
use prost::Message;
use serde::{Deserialize, Serialize};

/// Encoded requests larger than this are deflated.
pub const COMPRESS_OVER: usize = 2048;

/// One record, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
    /// CreateVolumeRequest without secrets, protobuf (deflated when `deflated`), base64.
    pub request: String,
    /// Secret namespace/name for Create/DeleteVolume ("" for none).
    #[serde(default)]
    pub secret: String,
    /// The stored request's preferred topology was dropped: it is its requisite rotated left
    /// by this many places.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<usize>,
    /// The protobuf bytes are deflated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deflated: bool,
    /// The claim's class is the in-tree plugin's the driver stands in for: the `migrated`
    /// label of the CreateVolume repeated after a restart (records written by builds before
    /// 1ce92cf read as not migrated).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub migrated: bool,
}

/// How far `preferred` is `requisite` rotated left, if it is.
fn rotation_of(requisite: &[csi::Topology], preferred: &[csi::Topology]) -> Option<usize> {
    if requisite.len() != preferred.len() || requisite.is_empty() {
        return None;
    }
    let first = preferred.first()?;
    (0..requisite.len())
        .filter(|k| &requisite[*k] == first)
        .find(|k| {
            preferred
                .iter()
                .enumerate()
                .all(|(i, p)| &requisite[(k + i) % requisite.len()] == p)
        })
}

fn deflate(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut encoder =
        flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).ok()?;
    encoder.finish().ok()
}

/// The largest request a deflated record may inflate to: gRPC's default message limit, which a
/// CreateVolume request the driver accepted could not have passed. A record past it (a bomb
/// put in the Lease by hand) does not decode.
pub const MAX_INFLATED: u64 = 4 * 1024 * 1024;

fn inflate(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(bytes)
        .take(MAX_INFLATED + 1)
        .read_to_end(&mut out)
        .ok()?;
    (out.len() as u64 <= MAX_INFLATED).then_some(out)
}

impl Record {
    /// Encodes a request.
    pub fn new(
        namespace: &str,
        name: &str,
        uid: &str,
        request: &csi::CreateVolumeRequest,
        secret: Option<(String, String)>,
        migrated: bool,
    ) -> Record {
        let mut bare = request.clone();
        bare.secrets.clear();
        let mut rotation = None;
        if let Some(topology) = bare.accessibility_requirements.as_mut()
            && let Some(k) = rotation_of(&topology.requisite, &topology.preferred)
        {
            topology.preferred.clear();
            rotation = Some(k);
        }
        let mut bytes = bare.encode_to_vec();
        let mut deflated = false;
        if bytes.len() > COMPRESS_OVER
            && let Some(smaller) = deflate(&bytes)
        {
            bytes = smaller;
            deflated = true;
        }
        Record {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            request: base64::engine::general_purpose::STANDARD.encode(bytes),
            secret: secret
                .map(|(ns, n)| format!("{ns}/{n}"))
                .unwrap_or_default(),
            rotation,
            deflated,
            migrated,
        }
    }

    /// Decodes the request (exactly the one recorded, secrets aside).
    pub fn request(&self) -> Option<csi::CreateVolumeRequest> {
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.request)
            .ok()?;
        if self.deflated {
            bytes = inflate(&bytes)?;
        }
        let mut request = csi::CreateVolumeRequest::decode(bytes.as_slice()).ok()?;
        if let Some(k) = self.rotation {
            let topology = request.accessibility_requirements.as_mut()?;
            let n = topology.requisite.len();
            if n == 0 || k >= n {
                return None;
            }
            topology.preferred = (0..n)
                .map(|i| topology.requisite[(k + i) % n].clone())
                .collect();
        }
        Some(request)
    }

    /// The secret reference.
    pub fn secret(&self) -> Option<(String, String)> {
        self.secret
            .split_once('/')
            .map(|(ns, n)| (ns.to_string(), n.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_record_inflating_past_the_limit_does_not_decode() {
        let within = deflate(&vec![0u8; 1024]).unwrap();
        assert_eq!(inflate(&within).map(|b| b.len()), Some(1024));
        let limit = usize::try_from(MAX_INFLATED).unwrap();
        assert_eq!(
            inflate(&deflate(&vec![0u8; limit]).unwrap()).map(|b| b.len()),
            Some(limit)
        );
        // 4 MiB and one byte of zeros deflate to a few KiB.
        let bomb = deflate(&vec![0u8; limit + 1]).unwrap();
        assert!(bomb.len() < 16 * 1024, "{}", bomb.len());
        assert_eq!(inflate(&bomb), None);
    }

    #[test]
    fn records_round_trip_the_request_without_secrets() {
        let request = csi::CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 5,
                limit_bytes: 0,
            }),
            secrets: [("password".to_string(), "hunter2".to_string())].into(),
            ..Default::default()
        };
        let r = Record::new(
            "ns",
            "c",
            "uid",
            &request,
            Some(("ns".into(), "s".into())),
            false,
        );
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("hunter2"));
        assert!(
            !text.contains("rotation") && !text.contains("deflated"),
            "{text}"
        );
        let back: Record = serde_json::from_str(&text).unwrap();
        let decoded = back.request().unwrap();
        assert_eq!(decoded.name, "pvc-1");
        assert!(decoded.secrets.is_empty());
        assert_eq!(back.secret(), Some(("ns".into(), "s".into())));
        // Not migrated is not written; a migrated record says so and reads back so.
        assert!(!back.migrated && !text.contains("migrated"), "{text}");
        let migrated = Record {
            migrated: true,
            ..back
        };
        let text = serde_json::to_string(&migrated).unwrap();
        assert!(text.contains(r#""migrated":true"#), "{text}");
        assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), migrated);
    }

    fn segment(node: usize) -> csi::Topology {
        csi::Topology {
            segments: [(
                "topology.hostpath.csi.volstack.dev/node".to_string(),
                format!("node-{node}"),
            )]
            .into(),
        }
    }

    #[test]
    fn a_request_listing_every_node_of_a_large_cluster_fits_and_comes_back_exactly() {
        for (nodes, selected) in [(2_000, 1_234), (10_000, 0), (3, 2)] {
            let requisite: Vec<csi::Topology> = (0..nodes).map(segment).collect();
            let mut preferred = requisite.clone();
            preferred.rotate_left(selected);
            let request = csi::CreateVolumeRequest {
                name: "pvc-2".into(),
                accessibility_requirements: Some(csi::TopologyRequirement {
                    requisite,
                    preferred,
                }),
                ..Default::default()
            };
            let plain = request.encoded_len();
            let r = Record::new("ns", "c", "uid", &request, None, false);
            let stored = serde_json::to_string(&r).unwrap().len();
            assert_eq!(r.request().unwrap(), request, "{nodes} nodes");
            if nodes >= 2_000 {
                // 2,000 nodes: 296 KB before; a shard holds 200 KiB.
                assert!(r.deflated && r.rotation == Some(selected));
                assert!(
                    stored * 10 < plain,
                    "{nodes} nodes: {stored} bytes stored for {plain}"
                );
                assert!(stored < 60 * 1024, "{nodes} nodes: {stored} bytes");
            }
        }
    }

    #[test]
    fn preferred_lists_that_are_not_rotations_are_kept() {
        let requisite: Vec<csi::Topology> = (0..4).map(segment).collect();
        let preferred = vec![segment(2), segment(0), segment(1), segment(3)];
        let request = csi::CreateVolumeRequest {
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: requisite.clone(),
                preferred: preferred.clone(),
            }),
            ..Default::default()
        };
        let r = Record::new("ns", "c", "uid", &request, None, false);
        assert_eq!(r.rotation, None);
        assert_eq!(r.request().unwrap(), request);
        assert_eq!(rotation_of(&requisite, &requisite[..2]), None);
        assert_eq!(rotation_of(&[], &[]), None);
        // A stored rotation past the end is a broken record, not a panic.
        let mut broken = Record::new("ns", "c", "uid", &request, None, false);
        broken.rotation = Some(9);
        assert!(broken.request().is_none());
    }
}
