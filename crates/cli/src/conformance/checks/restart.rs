//! The stack killed mid-lifecycle and started again on its data: the stack runs as a
//! `volstack up` process, claims are made, the process gets SIGKILL once the provisioner is at
//! work, and the stack started again must provision each claim once, leaving the driver no
//! volume without a PV.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{Done, Rpc, World};
use crate::stack::{Running, UpArgs};

/// The stack as a `volstack up` process of this executable, on the data of `UpArgs`.
pub struct UpProcess {
    child: Option<Child>,
    kubeconfig: PathBuf,
    log: PathBuf,
}

impl UpProcess {
    /// Starts `volstack up` with the stack's flags (its API server on any free port); its
    /// output goes to `restart-up.log` beside the data directory.
    pub fn start(up: &UpArgs) -> Result<UpProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("find this executable: {e}"))?;
        let log = up
            .data_dir
            .parent()
            .unwrap_or(&up.data_dir)
            .join("restart-up.log");
        let file =
            std::fs::File::create(&log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let stderr = file
            .try_clone()
            .map_err(|e| format!("open {}: {e}", log.display()))?;
        let mut command = Command::new(exe);
        command
            .arg("up")
            .arg(format!("--data-dir={}", up.data_dir.display()))
            .arg("--bind=127.0.0.1:0")
            .arg(format!("--attach={}", up.attach));
        // The flags hold socket paths; the command line wants endpoints.
        let endpoint = |socket: &str| match socket.starts_with("unix://") {
            true => socket.to_string(),
            false => format!("unix://{socket}"),
        };
        if let Some(socket) = &up.driver_endpoint {
            command.arg(format!("--driver-endpoint={}", endpoint(socket)));
        }
        for (node, socket) in &up.node_endpoints {
            command.arg(format!("--node-endpoint={node}={}", endpoint(socket)));
        }
        for (key, value) in &up.class_parameters {
            command.arg(format!("--class-parameter={key}={value}"));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("start volstack up: {e}"))?;
        Ok(UpProcess {
            child: Some(child),
            kubeconfig: up.data_dir.join("kubeconfig"),
            log,
        })
    }

    /// A client of its API server, once it answers (the kubeconfig on its data directory is
    /// the last stack's until it writes its own: an answer can only come from it).
    pub async fn client(&mut self) -> Result<kube::Client, String> {
        loop {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "volstack up exited ({status}); see {}",
                    self.log.display()
                ));
            }
            let path = self.kubeconfig.display().to_string();
            let options =
                sidecar_kit::kubeclient::ClientOptions::unthrottled(&path, "volstack-conformance");
            if let Ok(client) = sidecar_kit::kubeclient::build_client(&options).await
                && client.apiserver_version().await.is_ok()
            {
                return Ok(client);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL, then waits for it (done once; later calls do nothing).
    pub fn kill(&mut self) -> Result<(), String> {
        if let Some(mut child) = self.child.take() {
            child.kill().map_err(|e| format!("kill volstack up: {e}"))?;
            child
                .wait()
                .map_err(|e| format!("wait for volstack up: {e}"))?;
        }
        Ok(())
    }
}

impl Drop for UpProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Claims made just before the kill.
const CLAIMS: usize = 10;

/// What was true before the stop.
pub struct BeforeRestart {
    /// The driver's volumes (ListVolumes), when it lists them.
    listed: Option<BTreeSet<String>>,
}

impl World {
    /// Lists the driver's volumes, then makes the claims without waiting for them.
    pub async fn before_restart(&mut self) -> Result<BeforeRestart, String> {
        self.touched.lock().clear();
        let listed = match self.info.has(Rpc::ListVolumes) {
            true => Some(self.driver_volumes().await?.into_iter().collect()),
            false => None,
        };
        for i in 0..CLAIMS {
            self.claim(&format!("conf-restart-{i}"), None).await?;
        }
        Ok(BeforeRestart { listed })
    }

    /// Talks to the stack started again.
    pub fn reconnect(&mut self, running: &Running) {
        self.client = running.stack.client.clone();
    }

    /// Talks to the stack through `client`.
    pub fn reconnect_client(&mut self, client: kube::Client) {
        self.client = client;
    }

    /// Waits until the provisioner has made a PV for one of the claims (looking every 20 ms,
    /// so that the others are likely still in flight); gives how many PVs there were then.
    pub async fn provisioning_started(&mut self) -> Result<usize, String> {
        *self.waiting.lock() = "a PV made for one of the claims".into();
        let volumes: kube::Api<k8s_openapi::api::core::v1::PersistentVolume> =
            kube::Api::all(self.client.clone());
        loop {
            if let Ok(list) = volumes.list(&Default::default()).await {
                let made = list
                    .items
                    .iter()
                    .filter(|pv| {
                        pv.spec
                            .as_ref()
                            .and_then(|s| s.claim_ref.as_ref())
                            .and_then(|r| r.name.as_deref())
                            .is_some_and(|n| n.starts_with("conf-restart-"))
                    })
                    .count();
                if made > 0 {
                    return Ok(made);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every claim Bound to a volume of its own, and (when the driver lists its volumes) the
    /// volumes the driver gained are exactly theirs: none made twice, none left without a PV.
    pub async fn after_restart(
        &mut self,
        before: BeforeRestart,
        made_at_kill: usize,
    ) -> Result<Done, String> {
        let mut made = BTreeSet::new();
        for i in 0..CLAIMS {
            let pv = self.bound(&format!("conf-restart-{i}")).await?;
            let handle = pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
            made.insert(handle.unwrap_or_default());
        }
        if made.len() != CLAIMS {
            return Err(format!(
                "{CLAIMS} claims are bound to {} volumes: {made:?}",
                made.len()
            ));
        }
        let Some(listed) = before.listed else {
            return Ok(Done::Passed(format!(
                "killed with PVs for {made_at_kill} of {CLAIMS} claims; ListVolumes not advertised: volumes made twice cannot be seen"
            )));
        };
        let now: BTreeSet<String> = self.driver_volumes().await?.into_iter().collect();
        let gained: BTreeSet<String> = now.difference(&listed).cloned().collect();
        let leaked: Vec<&String> = gained.difference(&made).collect();
        if !leaked.is_empty() {
            return Err(format!(
                "the driver lists volumes no PV names after the restart (made twice or leaked): {leaked:?}"
            ));
        }
        Ok(Done::Passed(format!(
            "killed with PVs for {made_at_kill} of {CLAIMS} claims: {CLAIMS} volumes after the restart, none without a PV"
        )))
    }
}
