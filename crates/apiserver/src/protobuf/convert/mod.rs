//! JSON objects to protobuf messages and back, driven by the table in `schema.rs`.
//!
//! JSON is what the server stores; protobuf is converted at the boundary. Decoding follows
//! what kube-apiserver's Go types do with a protobuf body before writing JSON: a zero scalar
//! is dropped unless the Go field is a pointer or has no omitempty; an empty nested message
//! stays `{}`; a zero time is dropped.
//!
//! [`decode`] reads protobuf into JSON (`decode.rs`), [`encode`] writes JSON as protobuf
//! (`encode.rs`); both walk the same table and report the same errors.

mod decode;
mod encode;

pub use decode::decode;
pub use encode::encode;

use super::schema::{Message, Schema};
use super::wire::WireError;

/// Why a message and a JSON object could not be converted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    /// The protobuf bytes are broken.
    #[error("{path}: {source}")]
    Read {
        /// Where in the object the bytes broke (a JSON path).
        path: String,
        /// What the wire reader found.
        source: WireError,
    },
    /// The protobuf has a field this server does not know, with a value that is not zero.
    #[error(
        "{path}: field number {number} of {message} is not supported by this server's protobuf codec; send JSON"
    )]
    ReadUnknownField {
        /// The JSON path of the field.
        path: String,
        /// The message.
        message: String,
        /// The field number.
        number: u32,
    },
    /// A field arrived with a wire type its kind does not have, or bytes that are not its kind.
    #[error("{path}: not a valid {expected}")]
    ReadValue {
        /// The JSON path of the field.
        path: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The JSON object has a field the message does not have.
    #[error("{path}: no protobuf field for this JSON field")]
    WriteUnknownField {
        /// The JSON path of the field.
        path: String,
    },
    /// A JSON value is not of the field's type.
    #[error("{path}: expected {expected}")]
    WriteValue {
        /// The JSON path of the field.
        path: String,
        /// What was expected.
        expected: &'static str,
    },
}

fn lookup<'a>(schema: &'a Schema, name: &str, path: &str) -> Result<&'a Message, ConvertError> {
    schema.message(name).ok_or_else(|| ConvertError::ReadValue {
        path: path.to_string(),
        expected: "message known to the table",
    })
}

/// Seconds and nanoseconds of an RFC 3339 time (`Z` or a numeric offset, any fraction).
pub fn parse_time(text: &str) -> Option<(i64, i64)> {
    crate::time::parse(text, false).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
