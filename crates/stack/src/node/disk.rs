//! The node's record of what it staged and published: a `vol_data.json` next to each staging
//! and publish target, as kubelet keeps. It is written (durably) before the CSI call and
//! removed after the undoing call succeeded, so after a crash at any instant the node finds
//! every volume it may have set up.

use std::io;
use std::path::{Path, PathBuf};

use durable_log::files::{create_durable_private_dir, sync_dir, write_private_atomic};

use super::decide::{Paths, VolumeData};

const RECORD: &str = "vol_data.json";

/// A record that could not be written or removed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub struct DiskError {
    /// What failed.
    pub action: &'static str,
    /// The file or directory.
    pub path: String,
    /// The operating system's error.
    pub source: io::Error,
}

fn fail<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DiskError + 'a {
    move |source| DiskError {
        action,
        path: path.display().to_string(),
        source,
    }
}

/// Writes the record of the volume whose directory is `dir`.
pub fn write(dir: &Path, data: &VolumeData) -> Result<(), DiskError> {
    create_durable_private_dir(dir).map_err(fail("create", dir))?;
    let bytes = serde_json::to_vec_pretty(data).map_err(|e| DiskError {
        action: "encode",
        path: dir.display().to_string(),
        source: io::Error::other(e),
    })?;
    let path = dir.join(RECORD);
    write_private_atomic(&path, &bytes).map_err(fail("write", &path))
}

/// Reads a record (None: no record, or not readable as one).
pub fn read(dir: &Path) -> Option<VolumeData> {
    let bytes = std::fs::read(dir.join(RECORD)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Removes a record and its directory, then the empty directories above it up to `stop`
/// (never a non-empty one: what the driver left in a target stays for a person to see).
pub fn remove(dir: &Path, stop: &Path) -> Result<(), DiskError> {
    let path = dir.join(RECORD);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail("remove", &path)(e)),
    }
    let mut current = Some(dir.to_path_buf());
    while let Some(d) = current {
        if d == stop || !d.starts_with(stop) || std::fs::remove_dir(&d).is_err() {
            break;
        }
        current = d.parent().map(Path::to_path_buf);
    }
    if let Some(parent) = dir.parent()
        && parent.exists()
    {
        let _ = sync_dir(parent);
    }
    Ok(())
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// Every published volume recorded: (its directory, the record).
pub fn published(paths: &Paths) -> Vec<(PathBuf, VolumeData)> {
    let mut out = Vec::new();
    for pod in entries(&paths.pods()) {
        for volume in entries(&pod.join("volumes").join("kubernetes.io~csi")) {
            if let Some(data) = read(&volume) {
                out.push((volume, data));
            }
        }
    }
    out
}

/// Every staged volume of `driver` recorded: (its directory, the record).
pub fn staged(paths: &Paths, driver: &str) -> Vec<(PathBuf, VolumeData)> {
    entries(&paths.plugin(driver))
        .into_iter()
        .filter_map(|dir| read(&dir).map(|d| (dir, d)))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn data(handle: &str, pv: &str) -> VolumeData {
        VolumeData {
            driver_name: "d".into(),
            volume_handle: handle.into(),
            spec_vol_id: pv.into(),
            node_name: "n".into(),
            done: false,
            mounted: false,
            ephemeral: false,
        }
    }

    #[test]
    fn records_are_found_again_and_removal_keeps_what_is_not_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths {
            root: tmp.path().to_path_buf(),
        };
        let a = paths.pod_volume("uid-a", "pv-1");
        write(&a, &data("h1", "pv-1")).unwrap();
        let b = paths.pod_volume("uid-b", "pv-2");
        write(&b, &data("h2", "pv-2")).unwrap();
        std::fs::write(b.join("left-by-driver"), "x").unwrap();
        let s = paths.staging("d", "h1");
        write(
            &s,
            &VolumeData {
                done: true,
                ..data("h1", "pv-1")
            },
        )
        .unwrap();

        let mut found: Vec<String> = published(&paths)
            .into_iter()
            .map(|(_, d)| d.volume_handle)
            .collect();
        found.sort();
        assert_eq!(found, vec!["h1", "h2"]);
        let st = staged(&paths, "d");
        assert_eq!(st.len(), 1);
        assert!(st[0].1.done);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
            0o700
        );

        remove(&a, &paths.pods()).unwrap();
        assert!(!paths.pods().join("uid-a").exists(), "empty parents go");
        assert!(paths.pods().exists(), "not above the stop");
        remove(&b, &paths.pods()).unwrap();
        assert!(
            b.join("left-by-driver").exists(),
            "a directory with content stays"
        );
        assert!(read(&b).is_none());
        assert_eq!(published(&paths).len(), 0);
    }
}
