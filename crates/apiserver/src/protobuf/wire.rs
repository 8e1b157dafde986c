//! The protobuf wire format: varints, keys and length-delimited values.

/// Wire type of varints.
pub const VARINT: u8 = 0;
/// Wire type of 64-bit values.
pub const FIXED64: u8 = 1;
/// Wire type of length-delimited values.
pub const DELIMITED: u8 = 2;
/// Wire type of 32-bit values.
pub const FIXED32: u8 = 5;

/// Why bytes are not a protobuf message.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The bytes end inside a value.
    #[error("the message ends inside a value")]
    Truncated,
    /// A varint is longer than ten bytes.
    #[error("a varint is longer than ten bytes")]
    VarintTooLong,
    /// A key has a wire type protobuf does not have (or groups).
    #[error("field {field} has the unsupported wire type {wire_type}")]
    WireType {
        /// The field number.
        field: u32,
        /// The wire type.
        wire_type: u8,
    },
}

/// Appends a varint.
pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends a field key.
pub fn put_key(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire_type));
}

/// Appends a length-delimited field.
pub fn put_delimited(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, DELIMITED);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends a varint field.
pub fn put_varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    put_key(out, field, VARINT);
    put_varint(out, value);
}

/// A value read from the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// A varint.
    Varint(u64),
    /// Eight bytes, little-endian.
    Fixed64(u64),
    /// Four bytes, little-endian.
    Fixed32(u32),
    /// Length-delimited bytes.
    Delimited(&'a [u8]),
}

impl Value<'_> {
    /// Whether the value is the zero of its type (empty bytes for delimited): dropping it
    /// loses nothing.
    pub fn is_zero(&self) -> bool {
        match self {
            Value::Varint(v) | Value::Fixed64(v) => *v == 0,
            Value::Fixed32(v) => *v == 0,
            Value::Delimited(b) => b.is_empty(),
        }
    }
}

/// Reads the fields of a message in order.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn varint(&mut self) -> Result<u64, WireError> {
        let mut value = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.bytes.split_first().ok_or(WireError::Truncated)?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(WireError::VarintTooLong)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < n {
            return Err(WireError::Truncated);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// The next field, or `None` at the end.
    pub fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, WireError> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| WireError::WireType {
            field: u32::MAX,
            wire_type: (key & 7) as u8,
        })?;
        let wire_type = (key & 7) as u8;
        let value = match wire_type {
            VARINT => Value::Varint(self.varint()?),
            FIXED64 => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Value::Fixed64(u64::from_le_bytes(a))
            }
            DELIMITED => {
                let n = usize::try_from(self.varint()?).map_err(|_| WireError::Truncated)?;
                Value::Delimited(self.take(n)?)
            }
            FIXED32 => {
                let b = self.take(4)?;
                let mut a = [0u8; 4];
                a.copy_from_slice(b);
                Value::Fixed32(u32::from_le_bytes(a))
            }
            _ => return Err(WireError::WireType { field, wire_type }),
        };
        Ok(Some((field, value)))
    }

    /// Reads the varints of a packed repeated field.
    pub fn packed_varints(bytes: &'a [u8]) -> Result<Vec<u64>, WireError> {
        let mut reader = Reader::new(bytes);
        let mut out = Vec::new();
        while !reader.bytes.is_empty() {
            out.push(reader.varint()?);
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_as_written() {
        let mut out = Vec::new();
        put_varint_field(&mut out, 1, 300);
        put_delimited(&mut out, 2, b"abc");
        put_varint_field(&mut out, 1000, u64::MAX);
        let mut r = Reader::new(&out);
        assert_eq!(r.next_field().unwrap(), Some((1, Value::Varint(300))));
        assert_eq!(r.next_field().unwrap(), Some((2, Value::Delimited(b"abc"))));
        assert_eq!(
            r.next_field().unwrap(),
            Some((1000, Value::Varint(u64::MAX)))
        );
        assert_eq!(r.next_field().unwrap(), None);
    }

    #[test]
    fn broken_bytes_are_errors_not_panics() {
        let cases: &[(&[u8], WireError)] = &[
            (&[0x0a, 0x05, b'a'], WireError::Truncated),
            (&[0x08], WireError::Truncated),
            (
                &[
                    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                ],
                WireError::VarintTooLong,
            ),
            (
                &[0x0b],
                WireError::WireType {
                    field: 1,
                    wire_type: 3,
                },
            ),
            (&[0x09, 1, 2], WireError::Truncated),
        ];
        for (bytes, expected) in cases {
            let mut r = Reader::new(bytes);
            assert_eq!(r.next_field().unwrap_err(), *expected, "{bytes:?}");
        }
    }
}
