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

/// [`create_private_dir`], each directory made durable in its parent before this returns: a
/// log (or a token, a key) acknowledged in a new directory must not vanish with it at a power
/// loss. For directories that hold state; a scratch directory needs only
/// [`create_private_dir`].
pub fn create_durable_private_dir(dir: &Path) -> io::Result<()> {
    let made = missing_levels(dir);
    create_private_dir(dir)?;
    for level in made.iter().rev() {
        sync_dir(parent_of(level))?;
    }
    Ok(())
}

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

/// The levels of `dir` that do not exist yet, deepest first (`dir` itself first, if missing).
fn missing_levels(dir: &Path) -> Vec<&Path> {
    dir.ancestors()
        .take_while(|level| !level.as_os_str().is_empty() && !level.exists())
        .collect()
}

/// The directory holding `path`'s entry (`.` for a bare relative name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
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

/// Tries at a fresh temporary name before giving up (a name is taken only by chance or by
/// someone else's doing).
const TEMPORARY_ATTEMPTS: usize = 16;

/// A name no one can guess: `<name>.<random>.tmp`, from the process's hashing keys (seeded by
/// the operating system) and a counter.
fn temporary_name(path: &Path) -> PathBuf {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{:016x}.tmp", hasher.finish()));
    path.with_file_name(name)
}

/// Creates a new 0600 file at a fresh temporary name beside `path`; never opens what is
/// already there (a file, or a link someone planted: `O_CREAT|O_EXCL` does not follow it).
fn create_temporary(path: &Path) -> io::Result<(PathBuf, File)> {
    let mut last = io::Error::other("no temporary name was tried");
    for _ in 0..TEMPORARY_ATTEMPTS {
        let tmp = temporary_name(path);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last = error,
            Err(error) => return Err(error),
        }
    }
    Err(last)
}

/// Writes `bytes` to `path` atomically: a new 0600 temporary file at a name no one can guess
/// or plant, fsync, rename, fsync the directory. A failure before the rename removes the
/// temporary file.
pub fn write_private_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    write_private_atomic_with(path, |file| file.write_all(bytes))
}

/// As [`write_private_atomic`], the content written by `write` into the temporary file (for
/// content made piece by piece, never held whole).
pub fn write_private_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let (tmp, mut file) = create_temporary(path)?;
    let written = write(&mut file)
        .and_then(|()| file.sync_all())
        .and_then(|()| fs::rename(&tmp, path));
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
    fn the_levels_a_durable_directory_makes_are_found_for_their_parents_to_be_synced() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b/c");
        fs::create_dir(root.path().join("a")).unwrap();
        assert_eq!(
            missing_levels(&dir),
            [dir.as_path(), root.path().join("a/b").as_path()]
        );
        assert_eq!(parent_of(&dir), root.path().join("a/b"));
        assert_eq!(parent_of(Path::new("data")), Path::new("."));
        assert!(missing_levels(Path::new("relative-missing-dir")).len() == 1);
        create_durable_private_dir(&dir).unwrap();
        assert!(missing_levels(&dir).is_empty());
        assert!(dir.is_dir());
    }

    #[test]
    fn an_atomic_write_that_fails_leaves_no_temporary_file() {
        let root = tempfile::tempdir().unwrap();
        // A non-empty directory where the file should go: the rename fails.
        let target = root.path().join("snapshot");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"x").unwrap();
        assert!(write_private_atomic(&target, b"data").is_err());
        let left: Vec<_> = fs::read_dir(root.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left,
            [std::ffi::OsString::from("snapshot")],
            "no temporary file left"
        );
        assert!(target.join("inside").exists());
    }

    /// Someone who may write in the directory plants the old fixed temporary name as a file
    /// and as a link to a file of theirs: the write never opens either, and what it writes
    /// goes only to the target, private.
    #[test]
    fn a_planted_temporary_file_or_link_is_never_opened() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path();
        let theirs = dir.join("theirs");
        fs::write(&theirs, b"").unwrap();
        fs::set_permissions(&theirs, fs::Permissions::from_mode(0o666)).unwrap();
        std::os::unix::fs::symlink(&theirs, dir.join("kubeconfig.tmp")).unwrap();
        fs::write(dir.join("token.tmp"), b"planted").unwrap();
        write_private_atomic(&dir.join("kubeconfig"), b"token: secret").unwrap();
        write_private_atomic(&dir.join("token"), b"secret").unwrap();
        assert_eq!(
            fs::read(&theirs).unwrap(),
            b"",
            "the link's target was not written"
        );
        assert_eq!(fs::read(dir.join("token.tmp")).unwrap(), b"planted");
        assert_eq!(fs::read(dir.join("kubeconfig")).unwrap(), b"token: secret");
        let mode = fs::metadata(dir.join("kubeconfig"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn temporary_names_differ_each_time() {
        let path = Path::new("/x/kubeconfig");
        let a = temporary_name(path);
        let b = temporary_name(path);
        assert_ne!(a, b);
        assert!(
            a.to_string_lossy().starts_with("/x/kubeconfig.")
                && a.to_string_lossy().ends_with(".tmp")
        );
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
