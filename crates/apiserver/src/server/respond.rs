//! Answers and bodies: JSON answers, tables, content negotiation (protobuf in and out), and
//! reading a JSON body.

use super::*;

pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The answer to a write: the change's JSON when it made one (written once, see
/// [`crate::change::Change::json`]), else the object written again.
pub(crate) fn written_response(
    code: StatusCode,
    object: &Value,
    change: Option<&crate::change::Change>,
) -> Response {
    match change {
        Some(change) => (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            change.json(),
        )
            .into_response(),
        None => json_response(code, object),
    }
}

pub(crate) fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// For answers that exist only in JSON: the client must accept JSON (as `media::accepted`
/// reads `Accept`, `q=0` included).
pub(crate) fn check_accept(headers: &HeaderMap) -> Result<(), ApiError> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if media::accepted(accept).is_ok_and(|a| a.json) {
        return Ok(());
    }
    Err(ApiError::not_acceptable(format!(
        "only the following media types are accepted: application/json (asked for {:?})",
        accept.unwrap_or_default()
    )))
}

/// What the client accepts for this resource: a client that takes protobuf only gets 406 for
/// a kind that has no protobuf form (custom resources), before anything is done.
pub(crate) fn negotiate(target: &Target, headers: &HeaderMap) -> Result<media::Accepted, ApiError> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let accepted = media::accepted(accept)?;
    if accepted.preferred == Format::Protobuf
        && !accepted.json
        && !protobuf::supports(&target.rt.api_version(), &target.rt.kind)
    {
        return Err(ApiError::not_acceptable(format!(
            "{} is served as JSON only; only the following media types are accepted: application/json, application/yaml",
            target.rt.kind
        )));
    }
    Ok(accepted)
}

/// The body of a create, update or delete as JSON: protobuf bodies are converted here, so the
/// handlers see JSON only. Patches carry their own media types and pass through.
pub(crate) fn json_body(
    method: &Method,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Bytes, ApiError> {
    if !matches!(method.as_str(), "POST" | "PUT" | "DELETE") || body.is_empty() {
        return Ok(body);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    match media::body_format(content_type)? {
        Format::Json => Ok(body),
        Format::Protobuf => match protobuf::decode_object(&body) {
            Ok(object) => Ok(Bytes::from(object.to_string())),
            Err(error @ protobuf::ProtobufError::Unsupported { .. }) => {
                Err(ApiError::unsupported_media(format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json ({error})"
                )))
            }
            Err(error) => Err(ApiError::bad_request(format!(
                "the protobuf request body could not be read: {error}"
            ))),
        },
    }
}

/// Rewrites a JSON answer (object, list or Status) in protobuf. An object this server cannot
/// write in protobuf (a field outside its table) is answered in JSON, which client-go reads by
/// the answer's Content-Type.
pub(crate) async fn to_protobuf(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/json");
    if !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::internal("failed to read the answer").into_response();
    };
    let encoded = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .map(|value| protobuf::encode_object(&value));
    match encoded {
        Some(Ok(pb)) => {
            parts.headers.insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(protobuf::MEDIA_TYPE),
            );
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, axum::body::Body::from(pb))
        }
        Some(Err(error)) => {
            tracing::debug!(%error, "answering in JSON: no protobuf form");
            Response::from_parts(parts, axum::body::Body::from(bytes))
        }
        None => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}

pub(crate) fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}
