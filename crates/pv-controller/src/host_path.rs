//! kube-controller-manager's hostPath deleter, made safe for a controller that may run on the
//! user's own machine (`volstack up`): the path is walked from `/tmp` one directory at a time,
//! each opened without following a link (`openat` with `O_NOFOLLOW`), and everything is
//! removed relative to those directories. A link anywhere in the path, or one swapped in
//! while the removal runs, cannot lead it out of `/tmp`; a link met is removed as a link.
//! What `decide::binder::host_path_deletable` accepts is all that reaches here.

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

/// Why a hostPath volume's path was not removed (its message becomes the volume's status).
#[derive(Debug, thiserror::Error)]
pub enum HostPathError {
    /// The path is not one under `/tmp/` the deleter takes.
    #[error("{0} is not a path under /tmp")]
    NotUnderTmp(String),
    /// A directory on the way could not be opened (a link there is refused).
    #[error("failed to open {path}: {source}")]
    Open {
        /// The directory, as far as the walk got.
        path: String,
        /// The system's error.
        source: Errno,
    },
    /// Something under the path could not be removed.
    #[error("failed to remove {path}: {source}")]
    Remove {
        /// The path given.
        path: String,
        /// The system's error.
        source: Errno,
    },
}

/// Removes `path` (under `/tmp/`) and whatever is under it, as Go's `os.RemoveAll` (a path
/// not there is no error), never leaving `/tmp` (see the module's words).
pub fn remove_under_tmp(path: &str) -> Result<(), HostPathError> {
    let not_under = || HostPathError::NotUnderTmp(path.to_string());
    let rest = path.strip_prefix("/tmp/").ok_or_else(not_under)?;
    let parts: Vec<&str> = rest
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(not_under());
    }
    let Some((last, dirs)) = parts.split_last() else {
        return Err(not_under());
    };
    let c = |part: &str| CString::new(part).map_err(|_| not_under());
    // /tmp itself may be a link (to /private/tmp, say): it is the one link followed.
    let mut dir =
        rustix::fs::openat(CWD, "/tmp", dir_flags(), Mode::empty()).map_err(|source| {
            HostPathError::Open {
                path: "/tmp".into(),
                source,
            }
        })?;
    let mut walked = String::from("/tmp");
    for part in dirs {
        walked.push('/');
        walked.push_str(part);
        dir = match rustix::fs::openat(&dir, c(part)?.as_c_str(), dir_flags(), Mode::empty()) {
            Ok(next) => next,
            Err(Errno::NOENT) => return Ok(()),
            Err(source) => {
                return Err(HostPathError::Open {
                    path: walked,
                    source,
                });
            }
        };
    }
    remove_at(&dir, c(last)?.as_c_str()).map_err(|source| HostPathError::Remove {
        path: path.to_string(),
        source,
    })
}

/// A directory opened for reading and walking, never through a link.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Removes `name` in `dir`: a directory with its contents (depth first, each opened without
/// following a link), anything else (a link included) as it is. Gone already is no error.
fn remove_at(dir: &OwnedFd, name: &CStr) -> Result<(), Errno> {
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(()),
        Err(error) => return Err(error),
    };
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        let sub = match rustix::fs::openat(dir, name, dir_flags(), Mode::empty()) {
            Ok(sub) => sub,
            Err(Errno::NOENT) => return Ok(()),
            Err(error) => return Err(error),
        };
        let mut names = Vec::new();
        for entry in Dir::read_from(&sub)? {
            let entry = entry?;
            let entry_name = entry.file_name();
            if entry_name != c"." && entry_name != c".." {
                names.push(entry_name.to_owned());
            }
        }
        for entry_name in names {
            remove_at(&sub, &entry_name)?;
        }
        return match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(error) => Err(error),
        };
    }
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A directory outside /tmp for the links to point at.
    fn outside() -> tempfile::TempDir {
        tempfile::Builder::new()
            .tempdir_in("/var/tmp")
            .or_else(|_| tempfile::Builder::new().tempdir_in("/dev/shm"))
            .unwrap()
    }

    #[test]
    fn the_removal_never_leaves_tmp() {
        let inside = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        let outside = outside();
        std::fs::create_dir_all(outside.path().join("precious/deep")).unwrap();
        std::os::unix::fs::symlink(outside.path(), inside.path().join("link")).unwrap();
        let under = |rest: &str| format!("{}/{rest}", inside.path().display());
        // A link on the way: refused (ELOOP/ENOTDIR), nothing removed.
        let error = remove_under_tmp(&under("link/precious")).unwrap_err();
        assert!(matches!(error, HostPathError::Open { .. }), "{error}");
        assert!(outside.path().join("precious/deep").exists());
        // A link inside the tree removed: the link goes, not what it names.
        let data = inside.path().join("data");
        std::fs::create_dir_all(data.join("a/b")).unwrap();
        std::fs::write(data.join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), data.join("a/out")).unwrap();
        remove_under_tmp(&under("data")).unwrap();
        assert!(!data.exists());
        assert!(outside.path().join("precious/deep").exists());
        // A link as the path itself: removed as a link.
        remove_under_tmp(&under("link")).unwrap();
        assert!(!inside.path().join("link").exists());
        assert!(outside.path().join("precious/deep").exists());
        // Not there (the path, or a directory on the way): no error, as os.RemoveAll.
        remove_under_tmp(&under("data")).unwrap();
        remove_under_tmp(&under("nowhere/data")).unwrap();
        // Not under /tmp at all.
        for path in ["/var/tmp/x", "/tmp/", "/tmp/a/../..", "/tmp/a\0b"] {
            assert!(
                matches!(remove_under_tmp(path), Err(HostPathError::NotUnderTmp(_))),
                "{path}"
            );
        }
    }
}
