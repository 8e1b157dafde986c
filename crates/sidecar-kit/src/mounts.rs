//! The kernel's mount table (for the node side: the driver and the node agent), read as it is
//! written: `/proc/self/mountinfo` escapes a space,
//! tab, newline and backslash in a mount point as `\040`, `\011`, `\012` and `\134`, and names
//! it by its real path (no trailing slash, no symlinked part). A path is compared in that form,
//! so a target with a space in it, a trailing slash or a symlinked parent is recognised as
//! mounted.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// A mountinfo field with its octal escapes decoded.
pub fn decode(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match escape {
            Some(digits) => {
                let value = digits.iter().fold(0u32, |v, d| v * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount points of a mountinfo text (its fifth field of each line, decoded).
pub fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(decode(field)))
        .collect()
}

/// A path as the kernel names it in the mount table: resolved when it exists (symlinked parts,
/// `..`), else only without a trailing slash.
pub fn as_mounted(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| {
        let text = path.to_string_lossy();
        let trimmed = text.trim_end_matches('/');
        PathBuf::from(if trimmed.is_empty() { "/" } else { trimmed })
    })
}

/// The mount points of the host at one instant: read once, asked about many paths (a node
/// with a thousand volumes reads the table once per pass, not once per volume).
#[derive(Debug, Clone, Default)]
pub struct MountTable(HashSet<PathBuf>);

impl MountTable {
    /// The table now; `None` when `/proc/self/mountinfo` cannot be read (no check is possible).
    pub fn read() -> Option<MountTable> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        Some(MountTable::parse(&info))
    }

    /// A table from a mountinfo text.
    pub fn parse(mountinfo: &str) -> MountTable {
        MountTable(mount_points(mountinfo).into_iter().collect())
    }

    /// Whether `path` is a mount point in this table.
    pub fn is_mount_point(&self, path: &Path) -> bool {
        self.0.contains(&as_mounted(path))
    }

    /// Whether `path` shows a volume the way a node plugin shows one: a mount point, or (the
    /// reference driver without the right to mount) a symbolic link. A plain directory shows
    /// nothing: whatever was mounted there is gone.
    pub fn shows_a_volume(&self, path: &Path) -> bool {
        std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
            || self.is_mount_point(path)
    }
}

/// [`MountTable::shows_a_volume`] against the table now (a table that cannot be read shows
/// nothing).
pub fn shows_a_volume(path: &Path) -> bool {
    MountTable::read().is_some_and(|t| t.shows_a_volume(path))
}

/// Whether `path` is a mount point now.
pub fn is_mount_point(path: &Path) -> bool {
    MountTable::read().is_some_and(|t| t.is_mount_point(path))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_decoded_as_the_kernel_escapes_them() {
        let info = "36 35 98:0 / /mnt/with\\040space rw - ext4 /dev/root rw\n\
                    37 35 98:0 / /mnt/tab\\011and\\134slash rw - ext4 /dev/root rw\n\
                    38 35 98:0 / /plain rw - ext4 /dev/root rw\n\
                    broken line\n";
        assert_eq!(
            mount_points(info),
            [
                PathBuf::from("/mnt/with space"),
                PathBuf::from("/mnt/tab\tand\\slash"),
                PathBuf::from("/plain"),
            ]
        );
        assert_eq!(decode("a\\04"), "a\\04", "a cut escape stays as written");
        assert_eq!(
            decode("\\777x"),
            "?x",
            "an escape past a byte is not a panic"
        );
    }

    #[test]
    fn paths_are_compared_as_the_kernel_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let canonical = std::fs::canonicalize(&real).unwrap();
        assert_eq!(as_mounted(&link.join("")), canonical);
        assert_eq!(as_mounted(&real.join("")), canonical);
        assert_eq!(
            as_mounted(Path::new("/no/such/dir/")),
            PathBuf::from("/no/such/dir")
        );
        assert_eq!(as_mounted(Path::new("/")), PathBuf::from("/"));
    }

    #[test]
    fn a_table_shows_mount_points_and_links_and_not_plain_directories() {
        let dir = tempfile::tempdir().unwrap();
        let canonical = std::fs::canonicalize(dir.path()).unwrap();
        let mounted = canonical.join("with space");
        let plain = canonical.join("plain");
        std::fs::create_dir(&mounted).unwrap();
        std::fs::create_dir(&plain).unwrap();
        let link = canonical.join("link");
        std::os::unix::fs::symlink(&plain, &link).unwrap();
        let escaped = mounted.display().to_string().replace(' ', "\\040");
        let table = MountTable::parse(&format!("36 35 98:0 / {escaped} rw - ext4 /dev/root rw\n"));
        assert!(table.is_mount_point(&mounted));
        assert!(table.is_mount_point(&mounted.join("")), "a trailing slash");
        assert!(table.shows_a_volume(&mounted));
        assert!(table.shows_a_volume(&link), "a link shows its volume");
        assert!(
            !table.shows_a_volume(&plain),
            "a plain directory shows nothing"
        );
        assert!(!MountTable::default().shows_a_volume(&mounted));
    }
}
