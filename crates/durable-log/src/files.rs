//! Files and directories of a log: private from the moment they exist (0700 directories, 0600
//! files, created with those modes rather than tightened afterwards), and the generation names.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of every directory we create.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file we create.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` and its missing parents as 0700; an existing directory that others can read
/// is narrowed to 0700 (it may hold Secrets).
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    let mode = fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Creates (or truncates) a 0600 file for writing.
pub fn create_private_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Opens a file for appending, creating it as 0600.
pub fn open_private_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Writes `bytes` to `path` atomically: a 0600 temporary file, fsync, rename, fsync the directory.
/// A failure before the rename removes the temporary file.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    let written = create_private_file(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    });
    if let Err(error) = written {
        let _ = fs::remove_file(&tmp);
        return Err(error);
    }
    sync_dir(dir)
}

/// Makes a directory's entries (creations, renames, removals) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `log-<generation>`.
pub fn log_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("log-{generation:020}"))
}

/// `snapshot-<generation>`.
pub fn snapshot_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("snapshot-{generation:020}"))
}

/// What a log directory holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Generations with a snapshot.
    pub snapshots: Vec<u64>,
    /// Generations with a log.
    pub logs: Vec<u64>,
    /// Leftover temporary files of an interrupted compaction.
    pub temporaries: Vec<PathBuf>,
}

/// Lists the log's files in `dir` (other files are left alone).
pub fn list(dir: &Path) -> io::Result<Listing> {
    let mut listing = Listing::default();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".tmp") && (name.starts_with("snapshot-") || name.starts_with("log-")) {
            listing.temporaries.push(entry.path());
        } else if let Some(generation) = name.strip_prefix("snapshot-").and_then(parse_gen) {
            listing.snapshots.push(generation);
        } else if let Some(generation) = name.strip_prefix("log-").and_then(parse_gen) {
            listing.logs.push(generation);
        }
    }
    listing.snapshots.sort_unstable();
    listing.logs.sort_unstable();
    Ok(listing)
}

fn parse_gen(text: &str) -> Option<u64> {
    (text.len() == 20 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn directories_and_files_are_private_from_creation() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        create_private_dir(&dir).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
        let file = dir.join("f");
        drop(create_private_file(&file).unwrap());
        assert_eq!(mode(&file), 0o600);
        drop(open_private_append(&dir.join("g")).unwrap());
        assert_eq!(mode(&dir.join("g")), 0o600);
        write_private_atomic(&dir.join("token"), b"secret").unwrap();
        assert_eq!(mode(&dir.join("token")), 0o600);
        assert_eq!(fs::read(dir.join("token")).unwrap(), b"secret");
    }

    #[test]
    fn an_atomic_write_that_fails_leaves_no_temporary_file() {
        let root = tempfile::tempdir().unwrap();
        // A non-empty directory where the file should go: the rename fails.
        let target = root.path().join("snapshot");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"x").unwrap();
        assert!(write_private_atomic(&target, b"data").is_err());
        assert!(!root.path().join("snapshot.tmp").exists());
        assert!(target.join("inside").exists());
    }

    #[test]
    fn an_existing_open_directory_is_narrowed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("open");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&dir).unwrap();
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }

    #[test]
    fn listing_finds_generations_and_temporaries_only() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        for name in [
            "log-00000000000000000003",
            "snapshot-00000000000000000003",
            "log-00000000000000000002",
            "snapshot-00000000000000000004.tmp",
            "token",
            "log-12",
        ] {
            fs::write(dir.join(name), b"").unwrap();
        }
        let listing = list(dir).unwrap();
        assert_eq!(listing.logs, vec![2, 3]);
        assert_eq!(listing.snapshots, vec![3]);
        assert_eq!(listing.temporaries.len(), 1);
    }
}
