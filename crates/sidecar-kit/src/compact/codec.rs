//! Shortens the JSON of cached objects by replacing the keys and values every claim and volume
//! repeats with one byte each.
//!
//! Compact JSON as `serde_json` writes it never holds a byte below 0x20: there is no
//! whitespace between tokens and control characters inside strings are escaped (`\n`,
//! `\u0001`). Bytes 0x01 to 0x1E are therefore free to stand for the 30 entries of
//! [`DICTIONARY`]; 0x00 for a UUID: 0x00 then the UUID's 16 bytes stand for its 36
//! characters (a claim holds two, its UID and its volume's name, and a PV four); and 0x1F for
//! one of the store's [`Words`]: 0x1F then the word's index (the driver's name, which every
//! claim and PV repeats up to four times). Everything else is copied as it is.

/// Why cached bytes could not be expanded (a bug of ours: they are our own encoding).
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// A byte below 0x20 that names no dictionary entry (none while the dictionary has 30
    /// entries, 0x00 is the UUID token and 0x1F the word token).
    #[error("byte {byte:#04x} at offset {offset} names no dictionary entry")]
    UnknownToken {
        /// The byte.
        byte: u8,
        /// Its offset in the encoded object.
        offset: usize,
    },
    /// A UUID token without its 16 bytes.
    #[error("the UUID at offset {offset} is cut short")]
    TruncatedUuid {
        /// Where its token is.
        offset: usize,
    },
    /// A word token without its index, or with an index naming no word.
    #[error("the word at offset {offset} names none of the store's words")]
    UnknownWord {
        /// Where its token is.
        offset: usize,
    },
}

/// The token of one of the store's words.
const WORD: u8 = 0x1F;

/// Words a store adds to the dictionary (at most 256, none empty): strings its objects repeat
/// that no fixed dictionary can know, such as the driver's name.
#[derive(Debug, Clone)]
pub struct Words {
    words: Vec<Box<[u8]>>,
    /// Whether some word starts with the byte: most bytes start none, and are passed over
    /// without a look at each word.
    starts: [bool; 256],
}

impl Default for Words {
    fn default() -> Self {
        Words::NONE
    }
}

impl Words {
    /// No words.
    pub const NONE: Words = Words {
        words: Vec::new(),
        starts: [false; 256],
    };

    /// The first 256 non-empty `words`.
    pub fn new<W: AsRef<str>>(words: impl IntoIterator<Item = W>) -> Self {
        let words: Vec<Box<[u8]>> = words
            .into_iter()
            .filter(|w| !w.as_ref().is_empty())
            .take(256)
            .map(|w| w.as_ref().as_bytes().into())
            .collect();
        let mut starts = [false; 256];
        for word in &words {
            if let Some(&first) = word.first() {
                starts[usize::from(first)] = true;
            }
        }
        Words { words, starts }
    }

    /// The index and length of the word `text` starts with, if any.
    fn find(&self, text: &[u8]) -> Option<(u8, usize)> {
        if !self.starts[usize::from(*text.first()?)] {
            return None;
        }
        let (index, word) = self
            .words
            .iter()
            .enumerate()
            .find(|(_, word)| text.starts_with(word))?;
        Some((u8::try_from(index).ok()?, word.len()))
    }

    /// Word `index`.
    fn get(&self, index: u8) -> Option<&[u8]> {
        self.words.get(usize::from(index)).map(|w| &w[..])
    }
}

/// The token of a packed UUID.
const UUID: u8 = 0x00;

/// Characters of a UUID as text: `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
const UUID_TEXT: usize = 36;

/// Where a UUID's text has its dashes.
const DASHES: [usize; 4] = [8, 13, 18, 23];

/// The 16 bytes of the lowercase UUID `text` starts with; `None` if it starts with none
/// (uppercase digits are left as they are: they would not come back the same).
fn pack_uuid(text: &[u8]) -> Option<[u8; 16]> {
    let text = text.get(..UUID_TEXT)?;
    if DASHES.iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let mut packed = [0u8; 16];
    let mut nibbles = 0;
    for (i, &byte) in text.iter().enumerate() {
        if DASHES.contains(&i) {
            continue;
        }
        let value = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => return None,
        };
        packed[nibbles / 2] |= if nibbles % 2 == 0 { value << 4 } else { value };
        nibbles += 1;
    }
    Some(packed)
}

/// Writes the text of the UUID `packed` holds.
fn unpack_uuid(packed: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in packed.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push(b'-');
        }
        out.push(HEX[usize::from(byte >> 4)]);
        out.push(HEX[usize::from(byte & 0x0f)]);
    }
}

/// What bytes 0x01 to 0x1E stand for, in that order: what serde_json writes for the fields of
/// `k8s-openapi` claims and volumes that every one of them has, and the annotations and
/// finalizers Kubernetes and the provisioner put on them.
const DICTIONARY: [&str; 30] = [
    r#"{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"#,
    r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"#,
    r#""annotations":{"#,
    r#""pv.kubernetes.io/bind-completed":"yes""#,
    r#""pv.kubernetes.io/bound-by-controller":"yes""#,
    r#""pv.kubernetes.io/provisioned-by":""#,
    r#""volume.beta.kubernetes.io/storage-provisioner":""#,
    r#""volume.kubernetes.io/storage-provisioner":""#,
    r#""volume.kubernetes.io/selected-node":""#,
    r#""finalizers":["kubernetes.io/pvc-protection""#,
    r#""finalizers":["kubernetes.io/pv-protection""#,
    r#""external-provisioner.volume.kubernetes.io/finalizer""#,
    r#""name":""#,
    r#""namespace":""#,
    r#""resourceVersion":""#,
    r#""uid":""#,
    r#""spec":{"accessModes":["ReadWriteOnce"]"#,
    r#""resources":{"requests":{"storage":""#,
    r#""storageClassName":""#,
    r#""volumeMode":"Filesystem""#,
    r#""volumeName":""#,
    r#""status":{"phase":""#,
    r#""claimRef":{"apiVersion":"v1","kind":"PersistentVolumeClaim","#,
    r#""persistentVolumeReclaimPolicy":"Delete""#,
    r#""csi":{"driver":""#,
    r#""volumeHandle":""#,
    r#""fsType":""#,
    r#""creationTimestamp":""#,
    r#""volume.kubernetes.io/provisioner-deletion-secret-"#,
    r#""spec":{"#,
];

/// The token of dictionary entry `index`.
fn token(index: usize) -> u8 {
    // The dictionary has 30 entries, so the token is at most 0x1E.
    u8::try_from(index + 1).unwrap_or(u8::MAX)
}

/// The dictionary's entries grouped by their second byte (every entry starts with `"` or `{`),
/// longest first: a place starting with `"` is checked against the one to seven entries whose
/// second byte is the next one, not all thirty.
static BY_SECOND_BYTE: std::sync::LazyLock<[Vec<u8>; 256]> = std::sync::LazyLock::new(|| {
    let mut table: [Vec<u8>; 256] = std::array::from_fn(|_| Vec::new());
    let mut order: Vec<usize> = (0..DICTIONARY.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(DICTIONARY[i].len()));
    for index in order {
        if let (Some(&second), Ok(index)) =
            (DICTIONARY[index].as_bytes().get(1), u8::try_from(index))
        {
            table[usize::from(second)].push(index);
        }
    }
    table
});

/// The longest dictionary entry `rest` starts with: its index and length.
fn entry_at(rest: &[u8]) -> Option<(usize, usize)> {
    if !matches!(rest.first(), Some(b'"' | b'{')) {
        return None;
    }
    let candidates = &BY_SECOND_BYTE[usize::from(*rest.get(1)?)];
    candidates.iter().find_map(|&index| {
        let index = usize::from(index);
        let entry = DICTIONARY[index].as_bytes();
        rest.starts_with(entry).then_some((index, entry.len()))
    })
}

/// [`shorten_into`] a new buffer.
#[cfg(test)]
pub fn shorten(json: &[u8], words: &Words) -> Vec<u8> {
    let mut out = Vec::new();
    shorten_into(json, words, &mut out);
    out
}

/// Appends `json` to `out` (a buffer the caller keeps from one object to the next) with
/// dictionary entries (longest first where several start at one place) and `words` replaced
/// by their tokens and lowercase UUIDs packed.
pub fn shorten_into(json: &[u8], words: &Words, out: &mut Vec<u8>) {
    out.reserve(json.len() / 2);
    let mut at = 0;
    while let Some(&byte) = json.get(at) {
        let rest = &json[at..];
        if let Some(packed) = byte.is_ascii_hexdigit().then(|| pack_uuid(rest)).flatten() {
            out.push(UUID);
            out.extend_from_slice(&packed);
            at += UUID_TEXT;
            continue;
        }
        if let Some((index, length)) = entry_at(rest) {
            out.push(token(index));
            at += length;
        } else if let Some((index, length)) = words.find(rest) {
            out.extend_from_slice(&[WORD, index]);
            at += length;
        } else {
            out.push(byte);
            at += 1;
        }
    }
}

/// [`expand_into`] a new buffer.
#[cfg(test)]
pub fn expand(short: &[u8], words: &Words) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    expand_into(short, words, &mut out)?;
    Ok(out)
}

/// Appends to `out` (a buffer the caller keeps from one object to the next) the JSON
/// [`shorten_into`] was given (with the same `words`).
pub fn expand_into(short: &[u8], words: &Words, out: &mut Vec<u8>) -> Result<(), CodecError> {
    out.reserve(short.len() * 3);
    let mut offset = 0;
    while let Some(&byte) = short.get(offset) {
        if byte >= 0x20 {
            out.push(byte);
            offset += 1;
            continue;
        }
        if byte == UUID {
            let packed = short
                .get(offset + 1..offset + 17)
                .ok_or(CodecError::TruncatedUuid { offset })?;
            unpack_uuid(packed, out);
            offset += 17;
            continue;
        }
        if byte == WORD {
            let word = short
                .get(offset + 1)
                .and_then(|&index| words.get(index))
                .ok_or(CodecError::UnknownWord { offset })?;
            out.extend_from_slice(word);
            offset += 2;
            continue;
        }
        let entry = usize::from(byte)
            .checked_sub(1)
            .and_then(|index| DICTIONARY.get(index))
            .ok_or(CodecError::UnknownToken { byte, offset })?;
        out.extend_from_slice(entry.as_bytes());
        offset += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    static NONE: Words = Words::NONE;

    #[test]
    fn every_entry_is_json_text_without_control_bytes_and_entries_are_distinct() {
        for (i, entry) in DICTIONARY.iter().enumerate() {
            assert!(entry.bytes().all(|b| b >= 0x20), "entry {i}");
            assert!(
                entry.starts_with('"') || entry.starts_with('{'),
                "entry {i}"
            );
            assert_eq!(
                DICTIONARY.iter().filter(|e| e == &entry).count(),
                1,
                "{entry}"
            );
        }
    }

    #[test]
    fn shortened_json_expands_to_the_same_bytes() {
        let cases = [
            r#"{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"annotations":{"pv.kubernetes.io/bind-completed":"yes","volume.kubernetes.io/storage-provisioner":"hostpath.csi.volstack.dev"},"finalizers":["kubernetes.io/pvc-protection"],"name":"data","namespace":"default","resourceVersion":"7","uid":"u"},"spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"1Gi"}},"storageClassName":"fast","volumeMode":"Filesystem"},"status":{"phase":"Pending"}}"#,
            // Entries inside string values, escapes, a prefix of an entry, and an empty object.
            r#"{"name":"\"name\":\"","x":"\u0001\n","namespac":"","spec":{}}"#,
            r#"{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"#,
            "",
            "\"",
        ];
        for case in cases {
            let short = shorten(case.as_bytes(), &NONE);
            assert!(short.len() <= case.len(), "{case}");
            assert_eq!(
                expand(&short, &NONE).expect("expands"),
                case.as_bytes(),
                "{case}"
            );
        }
        let claim = shorten(cases[0].as_bytes(), &NONE);
        assert!(claim.len() * 2 < cases[0].len(), "{} bytes", claim.len());
    }

    #[test]
    fn the_entry_found_is_the_longest_the_text_starts_with() {
        let every_entry = |rest: &[u8]| {
            DICTIONARY
                .iter()
                .enumerate()
                .filter(|(_, entry)| rest.starts_with(entry.as_bytes()))
                .max_by_key(|(_, entry)| entry.len())
                .map(|(index, entry)| (index, entry.len()))
        };
        for entry in DICTIONARY {
            for tail in ["", "x", "\"", "{\"a\":1}", "\"storage\":\"1Gi\""] {
                let text = format!("{entry}{tail}");
                for cut in 0..=text.len() {
                    let rest = &text.as_bytes()[..cut];
                    assert_eq!(entry_at(rest), every_entry(rest), "{:?}", &text[..cut]);
                }
            }
        }
        // A first byte no entry starts with, or one that leads into the wrong group.
        for text in [&b"x\"name\":\""[..], b"{name\":\"", b"\"\"", b"{", b"\""] {
            assert_eq!(entry_at(text), None, "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn the_longest_entry_wins_where_several_start_at_one_place() {
        let json = r#""spec":{"accessModes":["ReadWriteOnce"],"spec":{"a":1}"#;
        let short = shorten(json.as_bytes(), &NONE);
        assert_eq!(short[0], token(16));
        assert_eq!(expand(&short, &NONE).expect("expands"), json.as_bytes());
    }

    #[test]
    fn lowercase_uuids_are_packed_and_come_back_the_same() {
        let uid = "6c9bd80f-86a0-44f7-9a94-f044939d1075";
        let json = format!(r#"{{"uid":"{uid}","name":"pvc-{uid}","h":"{uid}{uid}x"}}"#);
        let short = shorten(json.as_bytes(), &NONE);
        // (This UUID's bytes hold no zero, so every zero byte is a token.)
        assert_eq!(short.iter().filter(|&&b| b == UUID).count(), 4);
        assert!(short.len() <= json.len() - 4 * (UUID_TEXT - 17));
        assert_eq!(expand(&short, &NONE).expect("expands"), json.as_bytes());
        // Not UUIDs (uppercase, a dash missing, a non-hex digit, cut short): copied as they are.
        for text in [
            "6C9BD80F-86A0-44F7-9A94-F044939D1075",
            "6c9bd80f-86a0-44f7-9a94_f044939d1075",
            "6c9bd80f-86a0-44f7-9a94-f044939d107g",
            "6c9bd80f-86a0-44f7-9a94-f044939d107",
        ] {
            let json = format!(r#"["{text}"]"#);
            let short = shorten(json.as_bytes(), &NONE);
            assert!(!short.contains(&UUID), "{text}");
            assert_eq!(expand(&short, &NONE).expect("expands"), json.as_bytes());
        }
    }

    #[test]
    fn the_stores_words_are_one_token_and_its_index() {
        let words = Words::new(["", "hostpath.csi.volstack.dev", "fast"]);
        let json =
            r#"{"csi":{"driver":"hostpath.csi.volstack.dev"},"storageClassName":"fast","x":"fas"}"#;
        let short = shorten(json.as_bytes(), &words);
        assert_eq!(short.iter().filter(|&&b| b == WORD).count(), 2);
        assert!(short.len() < json.len() - 24, "{} bytes", short.len());
        assert_eq!(expand(&short, &words).expect("expands"), json.as_bytes());
        // Without the words, the same bytes do not expand.
        assert!(matches!(
            expand(&short, &NONE),
            Err(CodecError::UnknownWord { .. })
        ));
        assert!(matches!(
            expand(&[b'a', WORD], &words),
            Err(CodecError::UnknownWord { offset: 1 })
        ));
        assert!(matches!(
            expand(&[WORD, 2], &words),
            Err(CodecError::UnknownWord { offset: 0 })
        ));
        assert_eq!(Words::new((0..300).map(|i| i.to_string())).words.len(), 256);
    }

    #[test]
    fn a_uuid_cut_short_is_an_error() {
        assert!(matches!(
            expand(b"ab\x7f\0", &NONE),
            Err(CodecError::TruncatedUuid { offset: 3 })
        ));
        assert!(matches!(
            expand(&[b'a', 0x00, 1, 2], &NONE),
            Err(CodecError::TruncatedUuid { offset: 1 })
        ));
        assert!(expand(&[0x1e], &NONE).is_ok());
        assert!(expand(&[0x00; 17], &NONE).is_ok());
    }
}
