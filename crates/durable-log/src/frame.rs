//! The on-disk framing, pure (no I/O).
//!
//! A file is a sequence of frames: `[u32 LE payload length][u32 LE CRC-32 of payload][payload]`.
//! One group commit is one frame, written with one `write` and made durable with one fsync, so a
//! crash can only tear the last frame. A frame whose length runs past the end of the file, whose
//! checksum does not match while nothing but zeros follows it, or a header of zeros at the end,
//! is such a torn tail; a bad frame followed by more data is corruption and is reported, never
//! skipped: the records after it were acknowledged.
//!
//! Log frame payload: records `[u64 LE seq][u32 LE len][bytes]`, back to back.
//! Snapshot file: a header frame `SNAP` + `[u64 LE seq][u64 LE entry count]`, then frames whose
//! payloads are entries `[u32 LE len][bytes]`.

/// Bytes of a frame header.
pub(crate) const HEADER: usize = 8;
/// Magic at the start of a snapshot's header frame.
pub(crate) const SNAPSHOT_MAGIC: &[u8; 4] = b"SNAP";

/// Why a file's frames could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A complete frame with a wrong checksum, or a malformed payload, and data after it.
    #[error("corrupt frame at byte {offset}: {what}")]
    Corrupt {
        /// Where the frame starts.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
}

/// Frames read from a file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frames<'a> {
    /// Complete, verified payloads in file order.
    pub payloads: Vec<&'a [u8]>,
    /// Bytes that hold whole frames; anything after is a torn tail to cut.
    pub good_len: usize,
}

/// Appends one frame holding `payload` to `out`.
pub(crate) fn push_frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&frame_header(payload));
    out.extend_from_slice(payload);
}

/// A frame's header: the payload's length and CRC-32, little-endian.
fn frame_header(payload: &[u8]) -> [u8; HEADER] {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut header = [0u8; HEADER];
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    header
}

/// Splits a file into verified frames, telling a torn tail from corruption.
pub(crate) fn read_frames(bytes: &[u8]) -> Result<Frames<'_>, FrameError> {
    let mut payloads = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < HEADER {
            break;
        }
        let len = u32_at(rest, 0) as usize;
        let crc = u32_at(rest, 4);
        let Some(end) = HEADER.checked_add(len).filter(|end| *end <= rest.len()) else {
            // A frame cut short by a crash is the last one: nothing valid follows its header.
            // A length that was damaged instead runs past frames that were acknowledged.
            if valid_frame_in(&rest[HEADER..]) {
                return Err(FrameError::Corrupt {
                    offset: at,
                    what: "a frame's length runs past the end of the file but whole frames follow it",
                });
            }
            break;
        };
        let payload = &rest[HEADER..end];
        if crc32fast::hash(payload) != crc || (len == 0 && crc == 0) {
            if rest.iter().skip(end).all(|b| *b == 0) {
                break;
            }
            return Err(FrameError::Corrupt {
                offset: at,
                what: "checksum mismatch with data after it",
            });
        }
        payloads.push(payload);
        at += end;
    }
    Ok(Frames {
        payloads,
        good_len: at,
    })
}

/// Whether a whole frame (a non-empty payload whose checksum matches) starts anywhere in
/// `bytes`. Only read when a frame runs past the end of a file, so at most the size of the one
/// torn frame is searched.
fn valid_frame_in(bytes: &[u8]) -> bool {
    (0..bytes.len().saturating_sub(HEADER - 1)).any(|start| {
        let rest = &bytes[start..];
        let len = u32_at(rest, 0) as usize;
        HEADER
            .checked_add(len)
            .filter(|end| len > 0 && *end <= rest.len())
            .is_some_and(|end| crc32fast::hash(&rest[HEADER..end]) == u32_at(rest, 4))
    })
}

/// Appends one record to a log frame payload.
pub(crate) fn push_record(out: &mut Vec<u8>, seq: u64, record: &[u8]) {
    out.extend_from_slice(&seq.to_le_bytes());
    push_entry(out, record);
}

/// Appends one length-prefixed entry.
pub(crate) fn push_entry(out: &mut Vec<u8>, entry: &[u8]) {
    let len = u32::try_from(entry.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(entry);
}

/// The records of one verified log frame payload.
pub(crate) fn records(payload: &[u8], offset: usize) -> Result<Vec<(u64, Vec<u8>)>, FrameError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let rest = &payload[at..];
        if rest.len() < 12 {
            return Err(malformed(offset));
        }
        let seq = u64_at(rest, 0);
        let (entry, used) = entry(&rest[8..]).ok_or_else(|| malformed(offset))?;
        out.push((seq, entry.to_vec()));
        at += 8 + used;
    }
    Ok(out)
}

/// The entries of one verified snapshot frame payload.
pub(crate) fn entries(payload: &[u8], offset: usize) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let (entry, used) = entry(&payload[at..]).ok_or_else(|| malformed(offset))?;
        out.push(entry.to_vec());
        at += used;
    }
    Ok(out)
}

/// A snapshot header payload.
pub(crate) fn snapshot_header(seq: u64, count: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out
}

/// Snapshot entries per frame, roughly.
const SNAPSHOT_FRAME: usize = 1 << 20;

/// A whole snapshot file, frame by frame: its header frame (saying `count` entries), then the
/// entries in frames of about 1 MiB. Entries are taken from `entries` as frames are made and
/// dropped once framed, so a caller that writes the frames as they come holds one frame at a
/// time, never the whole file (a snapshot of a 100,000-claim stack is hundreds of MB).
pub(crate) fn snapshot_frames(
    seq: u64,
    count: u64,
    entries: impl Iterator<Item = Vec<u8>>,
) -> impl Iterator<Item = Vec<u8>> {
    let mut header = Vec::with_capacity(HEADER + 20);
    push_frame(&mut header, &snapshot_header(seq, count));
    let mut entries = entries.peekable();
    std::iter::once(header).chain(std::iter::from_fn(move || {
        entries.peek()?;
        // The frame's header is filled in once its payload is complete.
        let mut frame = Vec::with_capacity(HEADER + SNAPSHOT_FRAME + (64 << 10));
        frame.resize(HEADER, 0);
        for entry in entries.by_ref() {
            push_entry(&mut frame, &entry);
            if frame.len() - HEADER >= SNAPSHOT_FRAME {
                break;
            }
        }
        let header = frame_header(&frame[HEADER..]);
        frame[..HEADER].copy_from_slice(&header);
        Some(frame)
    }))
}

/// Reads a snapshot header payload: (seq, entry count).
pub(crate) fn parse_snapshot_header(payload: &[u8]) -> Option<(u64, u64)> {
    if payload.len() != 20 || &payload[..4] != SNAPSHOT_MAGIC {
        return None;
    }
    Some((u64_at(payload, 4), u64_at(payload, 12)))
}

fn malformed(offset: usize) -> FrameError {
    FrameError::Corrupt {
        offset,
        what: "a frame's payload does not hold whole records",
    }
}

fn entry(bytes: &[u8]) -> Option<(&[u8], usize)> {
    if bytes.len() < 4 {
        return None;
    }
    let len = u32_at(bytes, 0) as usize;
    let end = 4usize.checked_add(len)?;
    let entry = bytes.get(4..end)?;
    Some((entry, end))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn log_frame(records: &[(u64, &[u8])]) -> Vec<u8> {
        let mut payload = Vec::new();
        for (seq, r) in records {
            push_record(&mut payload, *seq, r);
        }
        let mut out = Vec::new();
        push_frame(&mut out, &payload);
        out
    }

    #[test]
    fn whole_frames_read_back_in_order() {
        let mut file = log_frame(&[(1, b"a"), (2, b"bb")]);
        file.extend(log_frame(&[(3, b"")]));
        let frames = read_frames(&file).unwrap();
        assert_eq!(frames.good_len, file.len());
        let all: Vec<_> = frames
            .payloads
            .iter()
            .flat_map(|p| records(p, 0).unwrap())
            .collect();
        assert_eq!(
            all,
            vec![(1, b"a".to_vec()), (2, b"bb".to_vec()), (3, Vec::new())]
        );
    }

    #[test]
    fn torn_tails_of_every_length_are_cut_at_the_last_whole_frame() {
        let first = log_frame(&[(1, b"kept")]);
        let second = log_frame(&[(2, b"torn record"), (3, b"another")]);
        for cut in 0..second.len() {
            let mut file = first.clone();
            file.extend_from_slice(&second[..cut]);
            let frames = read_frames(&file).unwrap();
            assert_eq!(frames.good_len, first.len(), "cut at {cut}");
            assert_eq!(frames.payloads.len(), 1);
        }
    }

    #[test]
    fn a_last_frame_with_unwritten_pages_is_a_torn_tail() {
        let first = log_frame(&[(1, b"kept")]);
        let mut second = log_frame(&[(2, b"0123456789abcdef")]);
        let n = second.len();
        second[n - 4..].fill(0);
        let mut file = first.clone();
        file.extend(second);
        file.extend([0u8; 64]);
        let frames = read_frames(&file).unwrap();
        assert_eq!(frames.good_len, first.len());
    }

    #[test]
    fn corruption_followed_by_frames_is_an_error_not_a_tail() {
        let mut file = log_frame(&[(1, b"first")]);
        let bad_at = file.len();
        let mut bad = log_frame(&[(2, b"flipped")]);
        let n = bad.len();
        bad[n - 1] ^= 0xff;
        file.extend(bad);
        file.extend(log_frame(&[(3, b"acknowledged later")]));
        assert_eq!(
            read_frames(&file),
            Err(FrameError::Corrupt {
                offset: bad_at,
                what: "checksum mismatch with data after it"
            })
        );
    }

    #[test]
    fn a_damaged_length_with_whole_frames_after_it_is_an_error_not_a_tail() {
        let mut file = log_frame(&[(1, b"first")]);
        let bad_at = file.len();
        let mut damaged = log_frame(&[(2, b"its length is damaged")]);
        damaged[3] = 0x7f;
        file.extend(damaged);
        file.extend(log_frame(&[(3, b"acknowledged later")]));
        assert_eq!(
            read_frames(&file),
            Err(FrameError::Corrupt {
                offset: bad_at,
                what: "a frame's length runs past the end of the file but whole frames follow it"
            })
        );
        // The same damage on the last frame, nothing after it: a torn tail, cut.
        let mut last = log_frame(&[(1, b"first")]);
        let mut torn = log_frame(&[(2, b"its length is damaged")]);
        torn[3] = 0x7f;
        last.extend(torn);
        assert_eq!(read_frames(&last).map(|f| f.good_len), Ok(bad_at));
    }

    #[test]
    fn snapshot_headers_round_trip_and_reject_other_payloads() {
        let header = snapshot_header(42, 7);
        assert_eq!(parse_snapshot_header(&header), Some((42, 7)));
        assert_eq!(parse_snapshot_header(b"SNAP"), None);
        assert_eq!(parse_snapshot_header(&[0u8; 20]), None);
    }

    #[test]
    fn a_snapshot_file_reads_back_as_its_header_and_entries() {
        let entries: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![u8::try_from(i % 251).unwrap(); 700])
            .collect();
        let bytes = snapshot_frames(9, 3000, entries.clone().into_iter())
            .collect::<Vec<_>>()
            .concat();
        let frames = read_frames(&bytes).unwrap();
        assert_eq!(frames.good_len, bytes.len());
        assert!(frames.payloads.len() > 2, "entries span several frames");
        let one_frame = frames.payloads[1].len();
        assert!(
            (SNAPSHOT_FRAME..SNAPSHOT_FRAME + 1000).contains(&one_frame),
            "a frame holds about {SNAPSHOT_FRAME} bytes: {one_frame}"
        );
        assert_eq!(parse_snapshot_header(frames.payloads[0]), Some((9, 3000)));
        let read: Vec<Vec<u8>> = frames.payloads[1..]
            .iter()
            .flat_map(|p| entries_of(p))
            .collect();
        assert_eq!(read, entries);
    }

    fn entries_of(payload: &[u8]) -> Vec<Vec<u8>> {
        entries(payload, 0).unwrap()
    }

    #[test]
    fn a_payload_that_does_not_hold_whole_records_is_corrupt() {
        let mut payload = Vec::new();
        push_record(&mut payload, 1, b"abc");
        payload.pop();
        assert!(records(&payload, 0).is_err());
        let mut entries_payload = Vec::new();
        push_entry(&mut entries_payload, b"abc");
        entries_payload.push(1);
        assert!(entries(&entries_payload, 0).is_err());
    }
}
