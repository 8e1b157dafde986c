//! One cached object: its key and its shortened JSON in a single shared allocation.
//!
//! `[key length: 2 bytes, little-endian][key: namespace/name][shortened JSON]`. The store's
//! table holds only these (16 bytes a slot), hashed and compared by their key, and is looked
//! up with the key's bytes. A separate key would cost a second allocation per object and 16
//! more bytes a slot: about 1.3 MB for the 20,000 objects of a 10,000-claim storm.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A cached object (see the module).
#[derive(Clone)]
pub(super) struct Entry(Arc<[u8]>);

/// Bytes of the key length in front.
const LENGTH: usize = 2;

impl Entry {
    /// The entry of `key` holding `body`; `None` if the key is longer than 65,535 bytes
    /// (Kubernetes names and namespaces are far shorter).
    #[cfg(test)]
    pub(super) fn new(key: &str, body: &[u8]) -> Option<Entry> {
        Entry::build(key, &mut Vec::new(), |out| out.extend_from_slice(body))
    }

    /// The entry of `key` holding what `body` appends: written into `scratch` (a buffer the
    /// caller keeps; emptied first) and copied once into the entry's own allocation. `None`
    /// if the key is longer than 65,535 bytes.
    pub(super) fn build(
        key: &str,
        scratch: &mut Vec<u8>,
        body: impl FnOnce(&mut Vec<u8>),
    ) -> Option<Entry> {
        let length = u16::try_from(key.len()).ok()?;
        scratch.clear();
        scratch.extend_from_slice(&length.to_le_bytes());
        scratch.extend_from_slice(key.as_bytes());
        body(scratch);
        Some(Entry(Arc::from(&scratch[..])))
    }

    fn key_length(&self) -> usize {
        match self.0.get(..LENGTH) {
            Some(&[low, high]) => usize::from(u16::from_le_bytes([low, high])),
            _ => 0,
        }
    }

    /// The key's bytes.
    pub(super) fn key(&self) -> &[u8] {
        self.0
            .get(LENGTH..LENGTH + self.key_length())
            .unwrap_or_default()
    }

    /// The shortened JSON.
    pub(super) fn body(&self) -> &[u8] {
        self.0.get(LENGTH + self.key_length()..).unwrap_or_default()
    }

    /// Bytes held, key included.
    #[cfg(test)]
    pub(super) fn size(&self) -> usize {
        self.0.len()
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Entry {}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `[u8]` hashes, so that a lookup by the key's bytes finds the entry.
        self.key().hash(state);
    }
}

impl Borrow<[u8]> for Entry {
    fn borrow(&self) -> &[u8] {
        self.key()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn holds_its_key_and_body_and_is_found_by_the_key() {
        let entry = Entry::new("ns/c", b"{\"a\":1}").expect("short key");
        assert_eq!(entry.key(), b"ns/c");
        assert_eq!(entry.body(), b"{\"a\":1}");
        assert_eq!(entry.size(), 2 + 4 + 7);
        let empty = Entry::new("", b"").expect("short key");
        assert_eq!((empty.key(), empty.body()), (&b""[..], &b""[..]));

        let mut set = HashSet::new();
        set.insert(entry);
        assert!(set.contains(&b"ns/c"[..]));
        assert!(!set.contains(&b"ns/d"[..]));
        // Another body under the same key is the same entry: `replace` swaps it in.
        let newer = Entry::new("ns/c", b"{\"a\":2}").expect("short key");
        assert!(set.replace(newer).is_some());
        assert_eq!(set.len(), 1);
        assert_eq!(
            set.get(&b"ns/c"[..]).map(Entry::body),
            Some(&b"{\"a\":2}"[..])
        );
    }

    #[test]
    fn a_scratch_buffer_holding_bytes_is_emptied_first() {
        let mut scratch = b"left over from the last object".to_vec();
        let entry = Entry::build("ns/c", &mut scratch, |out| out.extend_from_slice(b"{}"))
            .expect("short key");
        assert_eq!((entry.key(), entry.body()), (&b"ns/c"[..], &b"{}"[..]));
        assert_eq!(entry.size(), 2 + 4 + 2);
    }

    #[test]
    fn a_key_too_long_for_its_length_is_refused() {
        assert!(Entry::new(&"k".repeat(65_536), b"{}").is_none());
        assert!(Entry::new(&"k".repeat(65_535), b"{}").is_some());
    }
}
