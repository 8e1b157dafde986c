//! Starts the driver in-process on a socket in a temporary directory.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Parser;
use csi::volume_capability::access_mode::Mode;
use csi_proto::v1 as csi;
use hostpath_driver::{Driver, DriverArgs, bind_socket};
use tokio::sync::oneshot;
use tonic::transport::Channel;

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    args: DriverArgs,
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub socket: String,
    pub args: Vec<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub channel: Channel,
}

impl Harness {
    pub async fn start(extra: &[&str]) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let (socket, stop, task, channel) = launch(dir.path().to_path_buf(), &args).await;
        Harness {
            dir,
            socket,
            args,
            stop: Some(stop),
            task: Some(task),
            channel,
        }
    }

    /// Stops the server gracefully and starts a new one on the same state directory.
    pub async fn restart(&mut self) {
        self.stop().await;
        let (socket, stop, task, channel) = launch(self.dir.path().to_path_buf(), &self.args).await;
        self.socket = socket;
        self.stop = Some(stop);
        self.task = Some(task);
        self.channel = channel;
    }

    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    pub fn fault_file(&self) -> PathBuf {
        self.dir.path().join("faults")
    }

    /// Replaces the fault control file atomically.
    pub fn set_faults(&self, text: &str) {
        let tmp = self.dir.path().join("faults.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.fault_file()).unwrap();
    }

    pub fn controller(&self) -> csi::controller_client::ControllerClient<Channel> {
        csi::controller_client::ControllerClient::new(self.channel.clone())
    }

    pub fn identity(&self) -> csi::identity_client::IdentityClient<Channel> {
        csi::identity_client::IdentityClient::new(self.channel.clone())
    }

    pub fn node(&self) -> csi::node_client::NodeClient<Channel> {
        csi::node_client::NodeClient::new(self.channel.clone())
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Every volume, following pages.
    /// ListVolumes without paging: every volume in one response.
    pub async fn list_unpaged(&self) -> csi::ListVolumesResponse {
        self.controller()
            .list_volumes(csi::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner()
    }

    pub async fn all_volumes(&self) -> Vec<csi::Volume> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let r = self
                .controller()
                .list_volumes(csi::ListVolumesRequest {
                    max_entries: 50,
                    starting_token: token,
                })
                .await
                .unwrap()
                .into_inner();
            out.extend(r.entries.into_iter().filter_map(|e| e.volume));
            if r.next_token.is_empty() {
                return out;
            }
            token = r.next_token;
        }
    }
}

async fn launch(
    dir: PathBuf,
    extra: &[String],
) -> (
    String,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    Channel,
) {
    let socket = dir.join("csi.sock").display().to_string();
    let state = dir.join("state").display().to_string();
    let faults = dir.join("faults").display().to_string();
    let mut argv = vec![
        "driver".to_string(),
        format!("--endpoint=unix://{socket}"),
        format!("--state-dir={state}"),
        format!("--fault-file={faults}"),
    ];
    if !extra.iter().any(|a| a.starts_with("--publish-mode")) {
        argv.push("--publish-mode=symlink".to_string());
    }
    argv.extend(extra.iter().cloned());
    let config = Wrapper::try_parse_from(argv)
        .unwrap()
        .args
        .into_config()
        .unwrap();
    let driver = Driver::open(config).await.unwrap();
    let listener = bind_socket(&socket).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        driver
            .serve_on(listener, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    let channel = sidecar_kit::csi::connect(&socket).await.unwrap();
    (socket, stop, task, channel)
}

pub fn mount(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability::mount("", mode)
}

pub fn block(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability::block(mode)
}

pub fn create_request(name: &str, bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

pub fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn segment(key: &str, value: &str) -> csi::Topology {
    csi::Topology {
        segments: params(&[(key, value)]),
    }
}

/// CreateVolume that must succeed; the volume.
pub async fn create(h: &Harness, req: csi::CreateVolumeRequest) -> csi::Volume {
    h.controller()
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
}
