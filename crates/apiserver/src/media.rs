//! Content negotiation: which encoding a request body is in (`Content-Type`) and which one
//! the answer is written in (`Accept`), refused as kube-apiserver refuses them (415, 406).

use crate::protobuf::MEDIA_TYPE;
use crate::status::ApiError;

/// An encoding of objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json`.
    Json,
    /// `application/vnd.kubernetes.protobuf`.
    Protobuf,
}

/// What a client accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// The first acceptable encoding in the client's order.
    pub preferred: Format,
    /// Whether JSON is acceptable too (the answer for a kind without protobuf form).
    pub json: bool,
}

/// The media types bodies may be sent in.
pub const REQUEST_TYPES: &str = "application/json, application/vnd.kubernetes.protobuf";
/// The media types answers may be asked for.
pub const RESPONSE_TYPES: &str =
    "application/json, application/yaml, application/vnd.kubernetes.protobuf";

fn media_and_params(part: &str) -> (String, Vec<(String, String)>) {
    let mut pieces = part.split(';');
    let media = pieces.next().unwrap_or("").trim().to_ascii_lowercase();
    let params = pieces
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
        })
        .collect();
    (media, params)
}

/// Reads `Accept`. Tables (`as=Table`) and discovery documents are JSON answers the caller
/// recognises itself; here a protobuf entry asking for another shape (`as=...`) is skipped.
pub fn accepted(accept: Option<&str>) -> Result<Accepted, ApiError> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(Accepted {
            preferred: Format::Json,
            json: true,
        });
    };
    let mut preferred = None;
    let mut json = false;
    for part in accept.split(',') {
        let (media, params) = media_and_params(part);
        let quality_zero = params
            .iter()
            .any(|(k, v)| k == "q" && v.parse::<f32>() == Ok(0.0));
        if quality_zero {
            continue;
        }
        let format = match media.as_str() {
            "application/json" | "application/yaml" | "*/*" | "application/*" | "" => Format::Json,
            m if m == MEDIA_TYPE && !params.iter().any(|(k, _)| k == "as") => Format::Protobuf,
            _ => continue,
        };
        if format == Format::Json {
            json = true;
        }
        preferred.get_or_insert(format);
    }
    match preferred {
        Some(preferred) => Ok(Accepted { preferred, json }),
        None => Err(ApiError::not_acceptable(format!(
            "only the following media types are accepted: {RESPONSE_TYPES}"
        ))),
    }
}

/// Reads `Content-Type` of a create, update or delete body.
pub fn body_format(content_type: Option<&str>) -> Result<Format, ApiError> {
    let (media, _) = media_and_params(content_type.unwrap_or(""));
    match media.as_str() {
        "" | "application/json" => Ok(Format::Json),
        m if m == MEDIA_TYPE => Ok(Format::Protobuf),
        other => Err(ApiError::unsupported_media(format!(
            "the body of the request was in an unknown format - accepted media types include: {REQUEST_TYPES} (got {other:?})"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::type_complexity)]
mod tests {
    use super::*;

    #[test]
    fn accept_headers_pick_the_first_encoding_the_server_has() {
        use Format::*;
        let cases: &[(Option<&str>, Option<(Format, bool)>)] = &[
            (None, Some((Json, true))),
            (Some("application/json"), Some((Json, true))),
            // client-go typed clients (kubectl create, the Go sidecars).
            (
                Some("application/vnd.kubernetes.protobuf, */*"),
                Some((Protobuf, true)),
            ),
            (
                Some("application/vnd.kubernetes.protobuf,application/json"),
                Some((Protobuf, true)),
            ),
            (
                Some("application/vnd.kubernetes.protobuf"),
                Some((Protobuf, false)),
            ),
            (
                Some("application/vnd.kubernetes.protobuf;stream=watch"),
                Some((Protobuf, false)),
            ),
            // Metadata-only protobuf is another shape: skipped, JSON answers.
            (
                Some(
                    "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
                ),
                Some((Json, true)),
            ),
            (
                Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
                Some((Json, true)),
            ),
            (
                Some("application/json;q=0, application/vnd.kubernetes.protobuf"),
                Some((Protobuf, false)),
            ),
            (Some("text/html"), None),
            (Some("application/cbor"), None),
        ];
        for (accept, expected) in cases {
            let got = accepted(*accept).ok().map(|a| (a.preferred, a.json));
            assert_eq!(got, *expected, "{accept:?}");
        }
        let refused = accepted(Some("text/html")).unwrap_err();
        assert_eq!(refused.code, 406);
        assert!(
            refused
                .message
                .contains("application/vnd.kubernetes.protobuf")
        );
    }

    #[test]
    fn bodies_are_json_or_protobuf() {
        assert_eq!(body_format(None).unwrap(), Format::Json);
        assert_eq!(
            body_format(Some("application/json; charset=utf-8")).unwrap(),
            Format::Json
        );
        assert_eq!(
            body_format(Some("application/vnd.kubernetes.protobuf")).unwrap(),
            Format::Protobuf
        );
        let refused = body_format(Some("application/cbor")).unwrap_err();
        assert_eq!(refused.code, 415);
        assert!(refused.message.contains(
            "accepted media types include: application/json, application/vnd.kubernetes.protobuf"
        ));
    }
}
