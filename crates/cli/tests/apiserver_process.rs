//! `volstack apiserver` as a process: clients that exhaust its file descriptors make it pause,
//! not spin, and it serves again once they are gone.

#![allow(clippy::unwrap_used)]

use sidecar_kit::testing as poll;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cpu_seconds(pid: u32) -> f64 {
    cli::bench::cpu_seconds(pid).unwrap()
}

#[tokio::test]
async fn running_out_of_file_descriptors_pauses_accepting_instead_of_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    // Few file descriptors and a connection limit above them: accepting fails with EMFILE.
    let script = format!(
        "ulimit -n 48 && exec {} apiserver --bind 127.0.0.1:0 --kubeconfig {} --max-connections 1000 --tls-handshake-timeout 5m",
        env!("CARGO_BIN_EXE_volstack"),
        kubeconfig.display()
    );
    let log = dir.path().join("apiserver.log");
    let child = Kill(
        Command::new("sh")
            .args(["-c", &script])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let text = poll::poll_for(
        "the server's kubeconfig",
        Duration::from_secs(30),
        String::new,
        || async {
            std::fs::read_to_string(&kubeconfig)
                .ok()
                .filter(|text| text.contains("server:"))
                .ok_or_else(String::new)
        },
    )
    .await;
    let address = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .unwrap()
        .to_string();
    let mut idle = Vec::new();
    for _ in 0..80 {
        idle.push(std::net::TcpStream::connect(&address).unwrap());
    }
    // Once the accept loop has run into the limit (it says so), measure its CPU over 2 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("accept failed; pausing")
    {
        assert!(
            Instant::now() < deadline,
            "the server never ran out of file descriptors"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = cpu_seconds(pid);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_seconds(pid) - before;
    let wall = started.elapsed().as_secs_f64();
    assert!(
        used < wall * 0.25,
        "the accept loop burned {used:.2} s of CPU in {wall:.2} s with its file descriptors exhausted"
    );
    // Once the clients go, it serves again.
    drop(idle);
    let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let request = http::Request::get("/healthz").body(Vec::new()).unwrap();
        match client.request_text(request).await {
            Ok(body) => {
                assert_eq!(body, "ok");
                break;
            }
            Err(error) => {
                assert!(Instant::now() < deadline, "healthz never answered: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// `--token-auth-file` that cannot be read, or is not kube-apiserver's format, stops the start
/// with a message naming the flag (and the line).
#[test]
fn a_bad_token_file_stops_the_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("tokens.csv");
    std::fs::write(&broken, "good,alice,1\nonly-two,fields\n").unwrap();
    for (file, words) in [
        (dir.path().join("missing.csv"), "--token-auth-file: read"),
        (broken, "line 2"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_volstack"))
            .args([
                "apiserver",
                "--bind=127.0.0.1:0",
                &format!("--kubeconfig={}", dir.path().join("kc").display()),
                &format!("--token-auth-file={}", file.display()),
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--token-auth-file") && stderr.contains(words),
            "{stderr}"
        );
    }
}
