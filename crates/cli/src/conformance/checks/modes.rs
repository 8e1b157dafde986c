//! How a volume may be used: the access modes the driver accepts, Block volumes handed to a Pod
//! as a device, and read-only publishing.

use serde_json::json;

use super::{Checked, Done, FILE, World};

/// The access modes tried besides ReadWriteOnce (which `provision` covers), with the name part
/// of their claims.
const MODES: [(&str, &str); 3] = [
    ("ReadWriteOncePod", "rwop"),
    ("ReadWriteMany", "rwx"),
    ("ReadOnlyMany", "rox"),
];

impl World {
    /// A claim of each access mode: Bound, or refused with a ProvisioningFailed event (a driver
    /// need not serve every mode); a claim left Pending without either fails the check.
    pub(super) async fn access_modes(&mut self) -> Result<Done, String> {
        for (mode, short) in MODES {
            let claim = self.claim_json(
                &format!("conf-mode-{short}"),
                json!({"accessModes": [mode]}),
            );
            self.create(&self.claims(), claim).await?;
        }
        let mut accepted = vec!["ReadWriteOnce"];
        let mut refused = Vec::new();
        for (mode, short) in MODES {
            let name = format!("conf-mode-{short}");
            match self.bound_or_refused(&name).await? {
                None => accepted.push(mode),
                Some(message) => {
                    // Deleted at once: the provisioner would retry it until `delete`.
                    self.delete_claim(&name).await?;
                    refused.push(format!("{mode} ({message})"));
                }
            }
        }
        let mut found = format!("accepted {}", accepted.join(", "));
        if !refused.is_empty() {
            found.push_str(&format!("; refused {}", refused.join(", ")));
        }
        Ok(Done::Passed(found))
    }

    /// A `volumeMode: Block` claim is provisioned and published into a Pod as a device (the
    /// driver places it at the target path, which is then no directory).
    pub(super) async fn block(&mut self) -> Result<Done, String> {
        let claim = self.claim_json("conf-block", json!({"volumeMode": "Block"}));
        self.create(&self.claims(), claim).await?;
        if let Some(message) = self.bound_or_refused("conf-block").await? {
            self.delete_claim("conf-block").await?;
            return Ok(Done::Declined(format!(
                "the driver refused a Block volume: {message}"
            )));
        }
        self.pod_with(
            "conf-block-user",
            json!({"claimName": "conf-block"}),
            json!({"volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}),
        )
        .await?;
        let target = self.published("conf-block-user", "conf-block").await?;
        // Followed through a symlink: what the Pod would get at its device path.
        let metadata = std::fs::metadata(&target)
            .map_err(|e| format!("the published device {}: {e}", target.display()))?;
        if metadata.is_dir() {
            return Err(format!(
                "{} is a directory, not the Block volume's device",
                target.display()
            ));
        }
        self.delete_pod("conf-block-user").await?;
        Ok(Done::Passed(String::new()))
    }

    /// A Pod that mounts the claim read-only reads the file, and cannot write beside it.
    pub(super) async fn read_only(&mut self) -> Checked {
        self.pod_with(
            "conf-read-only",
            json!({"claimName": "conf-data", "readOnly": true}),
            json!({}),
        )
        .await?;
        let dir = self.published("conf-read-only", "conf-data").await?;
        let read = std::fs::read_to_string(dir.join(FILE))
            .map_err(|e| format!("read {}: {e}", dir.join(FILE).display()))?;
        if read != self.content {
            return Err(format!(
                "{FILE} read-only holds {read:?}, not what was written"
            ));
        }
        let probe = dir.join("conformance-read-only.txt");
        let written = std::fs::write(&probe, b"must not be written");
        self.delete_pod("conf-read-only").await?;
        match written {
            Err(error) if error.kind() == std::io::ErrorKind::ReadOnlyFilesystem => Ok(()),
            Err(error) => Err(format!(
                "writing {} failed, but not as on a read-only file system: {error}",
                probe.display()
            )),
            Ok(()) => {
                let _ = std::fs::remove_file(&probe);
                Err(format!(
                    "{} was written: the volume was published writable (NodePublishVolume readonly=true)",
                    probe.display()
                ))
            }
        }
    }
}
