//! A child process of a test: its output appended to a log file of its own, killed when the
//! value is dropped, and (where util-linux's `setpriv` is installed) killed by the kernel too
//! if the test process itself dies, so no etcd or kube-apiserver outlives its test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use crate::Error;
use crate::binaries::io;

const SETPRIV: &str = "/usr/bin/setpriv";

/// A running (or exited) child.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    /// Starts `program args` with `env` added, output appended to `<log_dir>/<name>.log`.
    /// Call it from the test's own thread: the kernel's parent-death signal follows the
    /// thread that started the child.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log_dir: &Path,
    ) -> Result<Process, Error> {
        // Through `setpriv` a missing or non-executable program would start (setpriv itself)
        // and exit at once, leaving the caller waiting for what never comes: refused here,
        // naming it.
        if let Some((kind, why)) = not_runnable(program) {
            return Err(Error::Io {
                action: "start",
                path: program.to_path_buf(),
                source: std::io::Error::new(kind, why),
            });
        }
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io("open", &log))?;
        let err = out.try_clone().map_err(io("open", &log))?;
        let mut command = if Path::new(SETPRIV).exists() {
            let mut c = Command::new(SETPRIV);
            c.arg("--pdeathsig").arg("KILL").arg("--").arg(program);
            c
        } else {
            Command::new(program)
        };
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = command.spawn().map_err(io("start", program))?;
        Ok(Process {
            name: name.to_string(),
            child: Some(child),
            log,
        })
    }

    /// The name it was started under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id while it runs.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its name and process id while it runs (what a CPU meter reads `/proc` by).
    pub fn name_and_id(&self) -> Option<(String, u32)> {
        Some((self.name().to_string(), self.id()?))
    }

    /// Everything it printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log file's path.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its exit status, if it has exited (or was killed).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        match self.child.as_mut() {
            Some(child) => child.try_wait().ok().flatten(),
            None => None,
        }
    }

    /// Kills it (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asks it to stop (SIGTERM) and waits up to `grace` before killing it.
    pub fn terminate(&mut self, grace: std::time::Duration) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                self.child = None;
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.kill();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Why `program` cannot be run, if it cannot: absent, not a file, or executable by nobody.
fn not_runnable(program: &Path) -> Option<(std::io::ErrorKind, &'static str)> {
    use std::io::ErrorKind;
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(program) {
        Err(_) => Some((ErrorKind::NotFound, "no such program")),
        Ok(meta) if !meta.is_file() => Some((ErrorKind::InvalidInput, "not a file")),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => {
            Some((ErrorKind::PermissionDenied, "not executable"))
        }
        Ok(_) => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn output_goes_to_the_log_and_a_dropped_process_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Process::spawn(
            "sleeper",
            Path::new("/bin/sh"),
            &["-c".into(), "echo started; exec sleep 600".into()],
            &[],
            dir.path(),
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !p.log().contains("started") {
            assert!(std::time::Instant::now() < deadline, "no output in the log");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(p.exited().is_none());
        let pid = p.id().unwrap();
        drop(p);
        // The process is gone (or a zombie reaped by the wait in drop): /proc has no entry.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn a_program_that_cannot_run_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("csi-provisioner");
        let error = Process::spawn("missing", &missing, &[], &[], dir.path()).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("failed to start") && message.contains("csi-provisioner"),
            "{message}"
        );
        std::fs::write(&missing, "#!/bin/sh\n").unwrap();
        let error = Process::spawn("plain", &missing, &[], &[], dir.path()).unwrap_err();
        assert!(error.to_string().contains("not executable"), "{error}");
        let error = Process::spawn("dir", dir.path(), &[], &[], dir.path()).unwrap_err();
        assert!(error.to_string().contains("not a file"), "{error}");
    }

    #[test]
    fn terminate_stops_a_process_that_honours_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Process::spawn(
            "sleeper",
            Path::new("/bin/sleep"),
            &["600".into()],
            &[],
            dir.path(),
        )
        .unwrap();
        p.terminate(std::time::Duration::from_secs(20));
        assert!(p.id().is_none());
    }
}
