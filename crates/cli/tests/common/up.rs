//! `volstack up` as a process, driven by kubectl: the helpers of the tests that use the
//! embedded stack as a newcomer does.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_volstack");

/// A running `volstack up` and its directory. Dropping it (a test that failed) kills the
/// process and unmounts what its node agent left mounted under the directory (as root the
/// driver bind-mounts volumes into Pods' directories; a failed test must not leave mounts
/// behind in /tmp). [`stop`] stops it as Ctrl-C does and leaves the mounts.
pub struct Up(pub Child, pub std::path::PathBuf);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        unmount_under(&self.1);
    }
}

pub fn up(dir: &Path) -> Up {
    up_with(dir, &[])
}

pub fn up_with(dir: &Path, extra: &[&str]) -> Up {
    let log = std::fs::File::create(dir.join("up.log")).unwrap();
    let child = Command::new(BIN)
        .args([
            "up",
            "--bind=127.0.0.1:0",
            &format!("--data-dir={}", dir.join("state").display()),
        ])
        .args(extra)
        .env(
            "RUST_LOG",
            "warn,stack=info,attacher=info,pv_controller=info",
        )
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    super::poll_blocking("volstack up to come up", Duration::from_secs(30), || {
        let log = std::fs::read_to_string(dir.join("up.log")).unwrap_or_default();
        if log.contains("volstack is up") {
            Ok(())
        } else {
            Err(String::new())
        }
    });
    Up(child, dir.to_path_buf())
}

/// Unmounts every mount point under `dir`, deepest first (as a reboot would).
pub fn unmount_under(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else { return };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<std::path::PathBuf> = sidecar_kit::mounts::mount_points(&info)
        .into_iter()
        .filter(|p| p.starts_with(&dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for point in points {
        let _ = Command::new("umount").arg("-l").arg(point).status();
    }
}

pub fn stop(mut up: Up) {
    Command::new("kill")
        .arg("-INT")
        .arg(up.0.id().to_string())
        .status()
        .unwrap();
    super::poll_blocking(
        "volstack up to stop on Ctrl-C",
        Duration::from_secs(20),
        || {
            if up.0.try_wait().unwrap().is_some() {
                Ok(())
            } else {
                Err("running".into())
            }
        },
    );
    // Stopped as a person stops it: what its Pods have mounted stays for the next `up`.
    up.1 = std::path::PathBuf::new();
}

/// kubectl's discovery cache for the stack in `dir`, inside it (see the API server tests'
/// `cache_dir`: the shared one is keyed by a port another test's server may use again).
pub fn cache_dir(dir: &Path) -> String {
    format!("--cache-dir={}", dir.join("kubectl-cache").display())
}

pub fn kubectl(dir: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("kubectl")
        .arg(format!(
            "--kubeconfig={}",
            dir.join("state/kubeconfig").display()
        ))
        .arg(cache_dir(dir))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl get <what> -o jsonpath=<path>`.
pub fn get(dir: &Path, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let jsonpath = format!("jsonpath={path}");
    args.extend(["-o", jsonpath.as_str()]);
    kubectl(dir, &args, None)
}

pub fn claims_yaml(prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {prefix}-{i}\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Like [`wait_for`]; on a timeout the panic shows the stack's log and events.
pub fn wait_for_in(dir: &Path, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let started = Instant::now();
    while !f() {
        if started.elapsed() > timeout {
            let log = std::fs::read_to_string(dir.join("up.log")).unwrap_or_default();
            let events = kubectl(dir, &["get", "events", "-A"], None);
            let claims = kubectl(
                dir,
                &[
                    "get",
                    "pvc,pv,volumesnapshots,volumesnapshotcontents",
                    "-A",
                    "-o",
                    "yaml",
                ],
                None,
            );
            panic!("timed out waiting for {what}\n{events}\n{claims}\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

pub fn phases(dir: &Path, kind: &str) -> Vec<String> {
    kubectl(
        dir,
        &[
            "get",
            kind,
            "-o",
            "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
        ],
        None,
    )
    .lines()
    .map(str::to_string)
    .filter(|l| !l.is_empty())
    .collect()
}

pub fn driver_volumes(dir: &Path) -> usize {
    let out = Command::new(BIN)
        .args([
            "csi",
            &format!("--endpoint=unix://{}", dir.join("state/csi.sock").display()),
            "list",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["entries"].as_array().unwrap().len()
}
