//! The sidecar under test and the stack it runs on: the stack's options, the command line
//! (ours or `--provisioner-cmd` / `--attacher-cmd`), and a guard that never leaves the process
//! behind.

use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

use super::BenchArgs;
use crate::embedded::{Stack, StackOptions};

/// The process under test (a provisioner or an attacher), started in a process group of its
/// own: stopped with SIGTERM to the group (and waited for) at the end of a run, the group
/// killed when the run fails half-way or is interrupted (dropped). A command line that wraps
/// the sidecar (`heaptrack`, a shell script) is covered too: the wrapper's children are in
/// the group, so no run leaves any of them behind.
pub(crate) struct UnderTest(Option<Child>);

impl UnderTest {
    /// Starts `command` as the leader of a new process group.
    pub(super) fn spawn(command: &mut Command) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt;
        Ok(UnderTest(Some(command.process_group(0).spawn()?)))
    }

    pub(super) fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// SIGTERM to the group, then waits for its leader to exit; what is left of the group
    /// then is killed.
    pub(super) async fn stop(mut self) {
        if let Some(mut child) = self.0.take() {
            signal_group(child.id(), "-TERM");
            let _ = tokio::task::spawn_blocking(move || {
                let _ = child.wait();
                signal_group(child.id(), "-KILL");
            })
            .await;
        }
    }
}

/// Sends `signal` to the process group `leader` leads.
fn signal_group(leader: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, "--", &format!("-{leader}")])
        .stderr(Stdio::null())
        .status();
}

impl Drop for UnderTest {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            signal_group(child.id(), "-KILL");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The stack a provisioning scenario runs on, in `dir`: a durable API server, the reference
/// driver with room for everything, the PV controller.
pub(super) fn stack_options(dir: &std::path::Path) -> StackOptions {
    StackOptions {
        durable: true,
        driver_args: vec![
            "--capacity=1Ei".to_string(),
            "--publish-mode=symlink".to_string(),
        ],
        pv_controller: Some((64, pv_controller::controller::default_backoff())),
        // The benchmark measures provisioning; snapshots stay out of the machine's budget.
        snapshots: false,
        ..StackOptions::new(dir.to_path_buf(), "volstack-bench/0.1")
    }
}

/// The provisioner under test (ours by default, else `--provisioner-cmd`) pointed at the
/// stack: its program, its arguments, and the command line as given.
pub(super) fn provisioner_command(
    args: &BenchArgs,
    stack: &Stack,
) -> anyhow::Result<(String, Vec<String>, String)> {
    command_line(
        args.provisioner_cmd.as_deref(),
        "csi-provisioner",
        "--provisioner-cmd",
        stack,
    )
}

/// A sidecar's command line pointed at the stack: `given` (from `flag`), else our binary `own`
/// beside this one. Returns its program, its arguments, and the command line as given.
pub(super) fn command_line(
    given: Option<&str>,
    own: &str,
    flag: &str,
    stack: &Stack,
) -> anyhow::Result<(String, Vec<String>, String)> {
    let command = match given {
        Some(command) => command.to_string(),
        None => std::env::current_exe()?
            .with_file_name(own)
            .display()
            .to_string(),
    };
    let mut words: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    if words.is_empty() {
        bail!("{flag} is empty");
    }
    let program = words.remove(0);
    // Each sidecar under its own ServiceAccount, with the RBAC of deploy/kubernetes.
    words.extend(match own {
        "csi-attacher" => stack.attacher_args(),
        _ => stack.provisioner_args(),
    });
    Ok((program, words, command))
}

/// Starts the provisioner under test (ours by default) against the stack; its log goes to
/// `dir/provisioner.log`. Returns the child and the command line it was started with.
pub(super) fn start_provisioner(
    args: &BenchArgs,
    scenario: &str,
    stack: &Stack,
    dir: &std::path::Path,
) -> anyhow::Result<(UnderTest, String)> {
    let (program, mut words, command) = provisioner_command(args, stack)?;
    if scenario != "defaults" {
        // storm, steady, backlog, pool: the client-side limits are lifted.
        lift_limits(&mut words);
    }
    let child = start_sidecar(
        "provisioner",
        &program,
        &words,
        &dir.join("provisioner.log"),
        &[],
    )?;
    Ok((child, command))
}

/// Lifts a sidecar's client-side API limits (`--kube-api-qps`, `--kube-api-burst`).
pub(super) fn lift_limits(words: &mut Vec<String>) {
    words.extend(["--kube-api-qps=10000", "--kube-api-burst=10000"].map(String::from));
}

/// Starts the sidecar `what` (`program` with `words`) under the guard, with `env` (warnings
/// logged unless it sets `RUST_LOG`) and its stderr in `log`.
pub(super) fn start_sidecar(
    what: &str,
    program: &str,
    words: &[String],
    log: &std::path::Path,
    env: &[(&str, String)],
) -> anyhow::Result<UnderTest> {
    let mut command = Command::new(program);
    command.args(words).env("RUST_LOG", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    UnderTest::spawn(
        command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?),
    )
    .with_context(|| format!("start the {what} {program:?}"))
}
