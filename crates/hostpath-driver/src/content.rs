//! A volume's content on disk: making it for CreateVolume ([`ContentJob`]) or at first use
//! ([`make_empty_dir`]), copying it (snapshots, restores, clones), growing a block image, and
//! measuring usage for NodeGetVolumeStats. Blocking file I/O only; callers run it on the
//! blocking pool.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags};

/// The name of a block volume's image inside its directory.
pub const BLOCK_IMAGE: &str = "block.img";

/// Bytes per inode the reference driver's "filesystem" offers (mkfs.ext4's default ratio):
/// a volume of N bytes has N / 16 KiB inodes.
pub const BYTES_PER_INODE: i64 = 16 * 1024;

const CHUNK: usize = 1 << 20;

/// Makes an empty volume directory `dir` (if it is not there) and makes it durable: the
/// directory and its entry in `parent` are fsynced.
pub fn make_empty_dir(dir: &Path, parent: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    File::open(dir)?.sync_all()?;
    File::open(parent)?.sync_all()
}

/// Making a new volume's content on disk: an empty directory (with a sparse image for a block
/// volume) or a copy of a snapshot or volume; then fsynced with its parent, so the directory is
/// durable before the record that names it.
pub(crate) struct ContentJob {
    pub(crate) dir: PathBuf,
    pub(crate) parent: PathBuf,
    pub(crate) copy_from: Option<PathBuf>,
    /// The source is a volume never used ([`crate::state::VolumeRecord::lazy_content`]): if
    /// its directory is not there, there is nothing to copy.
    pub(crate) source_unused: bool,
    pub(crate) image_bytes: Option<i64>,
}

impl ContentJob {
    pub(crate) fn run(self) -> std::io::Result<()> {
        let image = self.dir.join(BLOCK_IMAGE);
        let copy_from = match &self.copy_from {
            Some(from) if !nothing_to_copy(from, self.source_unused)? => Some(from),
            Some(_) | None => None,
        };
        match copy_from {
            Some(from) => {
                copy_tree(from, &self.dir)?;
                if let Some(bytes) = self.image_bytes {
                    grow_image(&image, bytes)?;
                }
                // Every copied file, the new directories and their entries, in one flush.
                return sync_filesystem(&self.dir);
            }
            None => {
                std::fs::create_dir_all(&self.dir)?;
                if let Some(bytes) = self.image_bytes {
                    let file = File::create(&image)?;
                    file.set_len(u64::try_from(bytes).unwrap_or(0))?;
                    file.sync_all()?;
                }
            }
        }
        File::open(&self.dir)?.sync_all()?;
        File::open(&self.parent)?.sync_all()
    }
}

/// Whether there is nothing to copy from `from`: its volume was never used
/// (`source_unused`, [`crate::state::VolumeRecord::lazy_content`]) and its directory is not
/// there. Only a missing directory counts; any other failure to read it is an error.
pub fn nothing_to_copy(from: &Path, source_unused: bool) -> std::io::Result<bool> {
    if !source_unused {
        return Ok(false);
    }
    match std::fs::symlink_metadata(from) {
        Ok(_) => Ok(false),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(error) => Err(error),
    }
}

/// Copies a directory tree from `from` into a new directory `to`: regular files (holes kept),
/// directories, symlinks; permissions kept. `to` must not exist.
///
/// The source is a volume its tenant writes to while it is copied, so nothing is opened by
/// path: each entry is looked at (`lstat`) and then opened relative to its directory's handle
/// with `O_NOFOLLOW` (`openat`), and the handle is checked to be what was looked at. An entry
/// swapped for a symlink in between fails the copy instead of reading outside the volume.
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let source = open_dir_at(CWD, from)?;
    std::fs::create_dir(to)?;
    let target = open_dir_at(CWD, to)?;
    copy_dir_at(&source, &target)
}

fn open_dir_at<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> std::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(dir, name, flags, Mode::empty())?)
}

/// Copies the entries of the open directory `source` into the open (new) directory `target`.
fn copy_dir_at(source: &OwnedFd, target: &OwnedFd) -> std::io::Result<()> {
    let meta = rustix::fs::fstat(source)?;
    rustix::fs::fchmod(target, Mode::from_raw_mode(meta.st_mode))?;
    for entry in rustix::fs::Dir::read_from(source)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let seen = rustix::fs::statat(source, name, AtFlags::SYMLINK_NOFOLLOW)?;
        copy_entry_at(source, name, FileType::from_raw_mode(seen.st_mode), target)?;
    }
    Ok(())
}

/// Copies the entry `name` of `source`, seen as a `seen`, into `target`. What is opened is
/// opened without following a link and checked to still be a `seen`.
fn copy_entry_at(
    source: &OwnedFd,
    name: &std::ffi::CStr,
    seen: FileType,
    target: &OwnedFd,
) -> std::io::Result<()> {
    let changed = || {
        std::io::Error::other(format!(
            "{} changed while it was copied; copy it again",
            name.to_string_lossy()
        ))
    };
    match seen {
        FileType::Directory => {
            let from = open_dir_at(source, name)?;
            rustix::fs::mkdirat(target, name, Mode::RWXU)?;
            let to = open_dir_at(target, name)?;
            copy_dir_at(&from, &to)
        }
        FileType::Symlink => {
            let link = rustix::fs::readlinkat(source, name, Vec::new())?;
            Ok(rustix::fs::symlinkat(link.as_c_str(), target, name)?)
        }
        FileType::RegularFile => {
            // O_NONBLOCK: an entry swapped for a fifo does not block the open.
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
            let from = rustix::fs::openat(source, name, flags, Mode::empty())?;
            let meta = rustix::fs::fstat(&from)?;
            if FileType::from_raw_mode(meta.st_mode) != FileType::RegularFile {
                return Err(changed());
            }
            let flags =
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let mode = Mode::from_raw_mode(meta.st_mode);
            let to = rustix::fs::openat(target, name, flags, mode)?;
            copy_sparse_open(File::from(from), File::from(to))
        }
        // Sockets, fifos and devices are not volume content; they are not copied.
        _ => Ok(()),
    }
}

/// Copies one file, leaving holes where the source reads as zeros (a mostly empty 1 GiB block
/// image stays mostly unallocated). Not synced: [`sync_filesystem`] makes a whole copy durable
/// at once.
pub fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    copy_sparse_open(File::open(from)?, File::create(to)?)
}

fn copy_sparse_open(mut source: File, mut target: File) -> std::io::Result<()> {
    let meta = source.metadata()?;
    target.set_permissions(meta.permissions())?;
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let read = read_full(&mut source, &mut buffer)?;
        if read == 0 {
            break;
        }
        let chunk = &buffer[..read];
        if chunk.iter().all(|b| *b == 0) {
            target.seek(SeekFrom::Current(read as i64))?;
        } else {
            target.write_all(chunk)?;
        }
    }
    target.set_len(meta.len())
}

/// Makes everything written to the filesystem holding `path` durable (syncfs): one flush for a
/// copy of many files instead of an fsync per file.
pub fn sync_filesystem(path: &Path) -> std::io::Result<()> {
    let handle = File::open(path)?;
    rustix::fs::syncfs(&handle).map_err(std::io::Error::from)
}

fn read_full(file: &mut File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Makes a block image at least `bytes` long (never shrinks it).
pub fn grow_image(image: &Path, bytes: i64) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(image)?;
    let wanted = u64::try_from(bytes).unwrap_or(0);
    if file.metadata()?.len() < wanted {
        file.set_len(wanted)?;
        file.sync_all()?;
    }
    Ok(())
}

/// What a volume's directory holds: bytes allocated on disk and the number of inodes
/// (files, directories, links) below it, the directory itself included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes allocated (st_blocks × 512).
    pub bytes: i64,
    /// Inodes used.
    pub inodes: i64,
}

/// Measures a directory tree without following symlinks (each directory is opened relative to
/// its parent's handle with `O_NOFOLLOW`, so one swapped for a link is not measured through).
pub fn usage(dir: &Path) -> std::io::Result<Usage> {
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Ok(Usage {
            bytes: allocated(&meta),
            inodes: 1,
        });
    }
    usage_at(&open_dir_at(CWD, dir)?)
}

fn usage_at(dir: &OwnedFd) -> std::io::Result<Usage> {
    let mut total = Usage {
        bytes: allocated_raw(&rustix::fs::fstat(dir)?),
        inodes: 1,
    };
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let meta = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(meta.st_mode) == FileType::Directory {
            let below = usage_at(&open_dir_at(dir, name)?)?;
            total.bytes += below.bytes;
            total.inodes += below.inodes;
        } else {
            total.bytes += allocated_raw(&meta);
            total.inodes += 1;
        }
    }
    Ok(total)
}

fn allocated_raw(meta: &rustix::fs::Stat) -> i64 {
    i64::try_from(
        u64::try_from(meta.st_blocks)
            .unwrap_or(0)
            .saturating_mul(512),
    )
    .unwrap_or(i64::MAX)
}

fn allocated(meta: &std::fs::Metadata) -> i64 {
    i64::try_from(meta.blocks().saturating_mul(512)).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_directory_of_a_volume_never_used_is_nothing_to_copy() {
        let root = tempfile::tempdir().unwrap();
        let present = root.path().join("present");
        std::fs::create_dir(&present).unwrap();
        let missing = root.path().join("missing");
        // (source, never used) → nothing to copy
        assert!(!nothing_to_copy(&present, true).unwrap());
        assert!(nothing_to_copy(&missing, true).unwrap());
        // A used volume's directory is always copied: its absence is the copy's error.
        assert!(!nothing_to_copy(&missing, false).unwrap());
        // Any other failure to look is an error, not an empty copy.
        let through_a_file = root.path().join("file");
        std::fs::write(&through_a_file, b"x").unwrap();
        assert!(nothing_to_copy(&through_a_file.join("below"), true).is_err());
    }

    #[test]
    fn a_tree_is_copied_with_files_links_and_holes() {
        let root = tempfile::tempdir().unwrap();
        let from = root.path().join("from");
        std::fs::create_dir_all(from.join("sub/deeper")).unwrap();
        std::fs::write(from.join("a.txt"), b"hello").unwrap();
        std::fs::write(from.join("sub/deeper/b.txt"), b"world").unwrap();
        std::os::unix::fs::symlink("a.txt", from.join("link")).unwrap();
        let image = from.join(BLOCK_IMAGE);
        {
            let mut f = File::create(&image).unwrap();
            f.set_len(64 << 20).unwrap();
            f.seek(SeekFrom::Start(32 << 20)).unwrap();
            f.write_all(b"data in the middle").unwrap();
        }
        let to = root.path().join("to");
        copy_tree(&from, &to).unwrap();
        assert_eq!(std::fs::read(to.join("a.txt")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read(to.join("sub/deeper/b.txt")).unwrap(),
            b"world"
        );
        assert_eq!(
            std::fs::read_link(to.join("link")).unwrap(),
            Path::new("a.txt")
        );
        let copied = std::fs::metadata(to.join(BLOCK_IMAGE)).unwrap();
        assert_eq!(copied.len(), 64 << 20);
        let mut f = File::open(to.join(BLOCK_IMAGE)).unwrap();
        f.seek(SeekFrom::Start(32 << 20)).unwrap();
        let mut text = [0u8; 18];
        f.read_exact(&mut text).unwrap();
        assert_eq!(&text, b"data in the middle");
        assert!(
            copied.blocks() * 512 < 8 << 20,
            "the copy keeps the holes ({} bytes allocated)",
            copied.blocks() * 512
        );
        assert!(copy_tree(&from, &to).is_err(), "the target must be new");
    }

    #[test]
    fn an_entry_swapped_for_a_link_after_it_was_looked_at_is_never_followed() {
        // The race is reproduced by handing the copy the type seen before the swap: a
        // directory or a file that is now a symlink to a directory outside the volume.
        let root = tempfile::tempdir().unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"another tenant's data").unwrap();
        let from = root.path().join("from");
        std::fs::create_dir(&from).unwrap();
        std::os::unix::fs::symlink(&outside, from.join("was-a-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), from.join("was-a-file")).unwrap();
        let to = root.path().join("to");
        std::fs::create_dir(&to).unwrap();
        let source = open_dir_at(CWD, &from).unwrap();
        let target = open_dir_at(CWD, &to).unwrap();
        for (name, seen) in [
            (c"was-a-dir", FileType::Directory),
            (c"was-a-file", FileType::RegularFile),
        ] {
            let error = copy_entry_at(&source, name, seen, &target).unwrap_err();
            // A link opened with O_NOFOLLOW: ELOOP, or ENOTDIR when a directory was asked for.
            let refused = [rustix::io::Errno::LOOP, rustix::io::Errno::NOTDIR]
                .map(|e| Some(e.raw_os_error()));
            assert!(refused.contains(&error.raw_os_error()), "{name:?}: {error}");
        }
        assert_eq!(std::fs::read_dir(&to).unwrap().count(), 0, "nothing copied");
        // The copy's source itself is never followed either.
        let linked = root.path().join("linked");
        std::os::unix::fs::symlink(&outside, &linked).unwrap();
        assert!(copy_tree(&linked, &root.path().join("to2")).is_err());
        assert!(!root.path().join("to2").exists());
        // Measuring does not go through a link.
        let used = usage(&from).unwrap();
        assert_eq!(used.inodes, 3, "the directory and two links");
    }

    #[test]
    fn usage_counts_allocated_bytes_and_inodes() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("v");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/one"), vec![7u8; 100_000]).unwrap();
        std::fs::write(dir.join("two"), b"x").unwrap();
        let used = usage(&dir).unwrap();
        assert_eq!(used.inodes, 4, "the directory, sub, one, two");
        assert!(used.bytes >= 100_000, "{used:?}");
        assert!(usage(&root.path().join("missing")).is_err());
    }

    #[test]
    fn an_image_grows_but_never_shrinks() {
        let root = tempfile::tempdir().unwrap();
        let image = root.path().join(BLOCK_IMAGE);
        File::create(&image).unwrap().set_len(1000).unwrap();
        grow_image(&image, 5000).unwrap();
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 5000);
        grow_image(&image, 10).unwrap();
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 5000);
    }
}
