//! A child process that is stopped when its owner goes away, one that announces the
//! addresses it listens on, and a private scratch directory per launched instance.
//!
//! Stopping sends SIGTERM (Envoy and the simulator both shut down cleanly on it), waits a
//! grace period, then SIGKILLs: a test that fails half-way must not leave an Envoy holding
//! ports and CPU on a 2-core machine.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a child gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// Spawns `command` (stdin closed, stderr inherited) as `name` and reads its stdout for
/// the child's whole life, so it never blocks on a full pipe: every line `parse` turns
/// into an address is sent on the receiver, in order.
pub fn spawn_announcing(
    name: &'static str,
    command: &mut Command,
    parse: fn(&str) -> Option<SocketAddr>,
) -> anyhow::Result<(ChildGuard, mpsc::Receiver<SocketAddr>)> {
    use anyhow::Context;
    let program = PathBuf::from(command.get_program());
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {}", program.display()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("{name}: stdout not captured"))?;
    let guard = ChildGuard::new(name, child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = parse(&line) {
                let _ = tx.send(addr);
            }
        }
    });
    Ok((guard, rx))
}

/// A running child process, terminated on [`ChildGuard::stop`] or drop.
#[derive(Debug)]
pub struct ChildGuard {
    name: &'static str,
    child: Option<Child>,
}

impl ChildGuard {
    /// Takes ownership of `child`; `name` is used in messages.
    pub fn new(name: &'static str, child: Child) -> Self {
        ChildGuard {
            name,
            child: Some(child),
        }
    }

    /// The child's process id, while it is owned.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the child has exited, with its status.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM, wait up to the grace period, then SIGKILL. Returns the exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) takes plain integers and touches no memory of ours; `pid` is
            // our own not-yet-reaped child, so it cannot name an unrelated process.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + GRACE;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
        eprintln!("{}: no exit {GRACE:?} after SIGTERM, killing", self.name);
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh directory under the system temp dir, removed on drop unless
/// `INFERGATE_KEEP_RUNDIR` is set (then its path is printed, for post-mortems).
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `…/infergate-<label>-<pid>-<n>-<nanos>`.
    pub fn new(label: &str) -> std::io::Result<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "infergate-{label}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path)?;
        Ok(RunDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::env::var_os("INFERGATE_KEEP_RUNDIR").is_some() {
            eprintln!("kept run directory {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The last `lines` lines of a text file (empty if unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `lines` warning, error and critical lines of an Envoy log.
pub fn problems(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| {
            ["][warning][", "][error][", "][critical]["]
                .iter()
                .any(|m| l.contains(m))
        })
        .collect();
    bad[bad.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn stop_terminates_a_running_child_with_sigterm() {
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        let mut guard = ChildGuard::new("sleep", child);
        assert!(guard.exited().is_none());
        let started = Instant::now();
        let status = guard.stop().unwrap();
        assert!(started.elapsed() < GRACE, "SIGTERM alone should stop sleep");
        assert!(!status.success());
        assert!(guard.stop().is_none(), "second stop is a no-op");
    }

    #[test]
    fn run_dir_is_removed_on_drop_and_tail_reads_last_lines() {
        let dir = RunDir::new("unit").unwrap();
        let file = dir.path().join("log");
        std::fs::write(&file, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&file, 2), "b\nc");
        assert_eq!(tail(&file, 10), "a\nb\nc");
        std::fs::write(
            &file,
            "[t][1][info][x] ok\n[t][1][error][x] bad\n[t][1][critical][x] worse\n",
        )
        .unwrap();
        assert_eq!(
            problems(&file, 5),
            "[t][1][error][x] bad\n[t][1][critical][x] worse"
        );
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists() || std::env::var_os("INFERGATE_KEEP_RUNDIR").is_some());
    }
}
