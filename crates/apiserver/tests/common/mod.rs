//! The server on a free port with a kubeconfig, and the real kubectl against it.

#![allow(dead_code, clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

pub struct Fixture {
    pub _dir: tempfile::TempDir,
    pub kubeconfig: std::path::PathBuf,
    pub server: apiserver::RunningServer,
    pub _stop: tokio::sync::oneshot::Sender<()>,
}

pub async fn start() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = apiserver::serve(
        apiserver::Config {
            kubeconfig_path: Some(kubeconfig.clone()),
            ..Default::default()
        },
        async {
            let _ = rx.await;
        },
    )
    .await
    .unwrap();
    Fixture {
        _dir: dir,
        kubeconfig,
        server,
        _stop: tx,
    }
}

/// kubectl's discovery cache for the server of `kubeconfig`, beside it: the shared one under
/// `~/.kube/cache` is keyed by host and port, and a port used again by another test's server
/// (with other resources) would find that server's answers there.
pub fn cache_dir(kubeconfig: &std::path::Path) -> String {
    let dir = kubeconfig
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("kubectl-cache");
    format!("--cache-dir={}", dir.display())
}

pub async fn kubectl(f: &Fixture, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let kubeconfig = f.kubeconfig.clone();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new("kubectl")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(cache_dir(&kubeconfig))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}
