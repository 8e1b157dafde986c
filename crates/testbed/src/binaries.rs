//! Where the control plane's binaries come from: the gzip-compressed builds in
//! `../shared/kube/bin` (or `$VOLSTACK_KUBE_BIN`), unpacked once into `target/testbed/`. A
//! missing binary is an error naming where it was looked for: a test that needs the real
//! control plane fails without it, it never passes silently.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::Error;

/// The programs of the control plane.
pub const PROGRAMS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// The environment variable that names another directory of `<program>.gz` files.
pub const BIN_ENV: &str = "VOLSTACK_KUBE_BIN";

/// The repository's root (two levels above this crate).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding `<program>.gz`.
pub fn source_dir() -> PathBuf {
    match std::env::var_os(BIN_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("../shared/kube/bin"),
    }
}

/// Where unpacked programs are kept (under cargo's target directory).
fn unpack_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join("testbed")
}

/// The unpacked programs.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Finds every program and unpacks the ones not unpacked yet (or changed since: the
    /// unpacked name carries the archive's size and modification time). Safe to call from
    /// several tests and processes at once (a file lock, then an atomic rename).
    pub fn locate() -> Result<Binaries, Error> {
        Binaries::locate_in(&source_dir(), &unpack_dir())
    }

    /// [`Binaries::locate`] with the archives in `source`, unpacked into `dir`.
    pub fn locate_in(source: &Path, dir: &Path) -> Result<Binaries, Error> {
        let dir = dir.to_path_buf();
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let lock_path = dir.join(".lock");
        let lock = File::create(&lock_path).map_err(io("create", &lock_path))?;
        lock.lock().map_err(io("lock", &lock_path))?;
        for program in PROGRAMS {
            let archive = source.join(format!("{program}.gz"));
            let meta = std::fs::metadata(&archive).map_err(|source_error| Error::Missing {
                program,
                path: archive.clone(),
                source: source_error,
            })?;
            let stamp = stamp(&meta);
            let stamp_path = dir.join(format!("{program}.stamp"));
            let target = dir.join(program);
            let current = std::fs::read_to_string(&stamp_path).unwrap_or_default();
            if current == stamp && target.exists() {
                continue;
            }
            unpack(&archive, &target)?;
            std::fs::write(&stamp_path, &stamp).map_err(io("write", &stamp_path))?;
        }
        drop(lock);
        Ok(Binaries { dir })
    }

    /// The unpacked program's path.
    pub fn path(&self, program: &str) -> PathBuf {
        self.dir.join(program)
    }
}

fn stamp(meta: &std::fs::Metadata) -> String {
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    format!("{} {modified}", meta.len())
}

/// Decompresses `archive` into `target` (mode 0755) through a temporary file and a rename.
fn unpack(archive: &Path, target: &Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let input = File::open(archive).map_err(io("open", archive))?;
    let mut decoder = flate2::read::GzDecoder::new(std::io::BufReader::new(input));
    let partial = target.with_extension("partial");
    let mut output = File::create(&partial).map_err(io("create", &partial))?;
    std::io::copy(&mut decoder, &mut output).map_err(io("decompress", archive))?;
    output.flush().map_err(io("write", &partial))?;
    drop(output);
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))
        .map_err(io("chmod", &partial))?;
    std::fs::rename(&partial, target).map_err(io("rename", &partial))?;
    Ok(())
}

pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_an_error_naming_where_it_was_looked_for() {
        let empty = tempfile::tempdir().unwrap();
        let unpacked = tempfile::tempdir().unwrap();
        let error = Binaries::locate_in(empty.path(), unpacked.path()).unwrap_err();
        let text = error.to_string();
        assert!(
            matches!(
                error,
                Error::Missing {
                    program: "etcd",
                    ..
                }
            ),
            "{text}"
        );
        assert!(
            text.contains(&empty.path().join("etcd.gz").display().to_string()),
            "{text}"
        );
        assert!(text.contains("../shared/kube/bin"), "{text}");
    }

    #[test]
    fn a_changed_archive_gets_a_new_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, b"one").unwrap();
        let first = stamp(&std::fs::metadata(&path).unwrap());
        std::fs::write(&path, b"three").unwrap();
        let second = stamp(&std::fs::metadata(&path).unwrap());
        assert_ne!(first, second);
    }

    #[test]
    fn unpacking_writes_an_executable_with_the_archives_content() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("tool.gz");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(b"#!/bin/sh\necho hi\n").unwrap();
        std::fs::write(&archive, encoder.finish().unwrap()).unwrap();
        let target = dir.path().join("tool");
        unpack(&archive, &target).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"#!/bin/sh\necho hi\n");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
    }
}
