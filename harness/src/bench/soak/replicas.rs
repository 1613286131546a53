//! Simulated replicas that can be killed and brought back: one `infergate-sim --replicas 1`
//! process per replica, so killing one (SIGKILL, as a crashed engine or a lost node) resets
//! exactly that replica's connections, and restarting it on the same port puts it back
//! where Envoy's static pool configuration expects it.

use crate::launch::process::ChildGuard;
use crate::launch::sim::{parse_replica_line, sim_binary};
use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a replica process may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Attempts at rebinding a killed replica's port (another process may hold it briefly).
const RESTART_ATTEMPTS: u32 = 20;

/// One replica per process; every process is stopped on drop.
#[derive(Debug)]
pub struct ReplicaSet {
    args: Vec<String>,
    addrs: Vec<SocketAddr>,
    children: Vec<Option<ChildGuard>>,
}

impl ReplicaSet {
    /// Starts `count` replicas on kernel-chosen ports, each `infergate-sim --replicas 1
    /// --port 0 <args…>`.
    pub fn start(count: usize, args: &[String]) -> Result<ReplicaSet> {
        let mut set = ReplicaSet {
            args: args.to_vec(),
            addrs: Vec::with_capacity(count),
            children: Vec::with_capacity(count),
        };
        for _ in 0..count {
            let (child, addr) = spawn(0, &set.args)?;
            set.addrs.push(addr);
            set.children.push(Some(child));
        }
        Ok(set)
    }

    /// Every replica's address, in order (a killed replica keeps its address).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Kills replica `index` with SIGKILL: its listener and every connection go at once,
    /// with no goodbye on any stream.
    pub fn kill(&mut self, index: usize) -> Result<()> {
        let slot = self
            .children
            .get_mut(index)
            .ok_or_else(|| anyhow!("no replica {index}"))?;
        let Some(mut child) = slot.take() else {
            bail!("replica {index} is not running");
        };
        if let Some(pid) = child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: kill(2) takes plain integers and touches no memory of ours; `pid` is
            // our own child, not yet reaped (the guard still owns it), so it names no other
            // process.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        // Reaps it (the process is already gone, so this does not wait).
        child.stop();
        Ok(())
    }

    /// Starts replica `index` again on its old port.
    pub fn restart(&mut self, index: usize) -> Result<()> {
        let addr = *self
            .addrs
            .get(index)
            .ok_or_else(|| anyhow!("no replica {index}"))?;
        let mut last = None;
        for _ in 0..RESTART_ATTEMPTS {
            match spawn(addr.port(), &self.args) {
                Ok((child, got)) if got == addr => {
                    if let Some(slot) = self.children.get_mut(index) {
                        *slot = Some(child);
                    }
                    return Ok(());
                }
                Ok((_, got)) => last = Some(anyhow!("came back on {got}, not {addr}")),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last.unwrap_or_else(|| anyhow!("no attempt made")))
            .with_context(|| format!("restarting replica {index} on {addr}"))
    }
}

/// Starts one single-replica simulator on `port` (0: any) and waits for its address line.
fn spawn(port: u16, args: &[String]) -> Result<(ChildGuard, SocketAddr)> {
    let bin = sim_binary()?;
    let mut child = Command::new(&bin)
        .arg("--replicas")
        .arg("1")
        .arg("--port")
        .arg(port.to_string())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning {}", bin.display()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("simulator stdout not captured"))?;
    let mut guard = ChildGuard::new("infergate-sim", child);
    let (tx, rx) = mpsc::channel();
    // Drains stdout for the process's whole life, so it never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(addr) = parse_replica_line(&line) {
                let _ = tx.send(addr);
            }
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(addr) => Ok((guard, addr)),
        Err(_) => {
            let status = guard.stop();
            bail!("simulator on port {port} printed no address (exit: {status:?})")
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// The status of `GET /health`, or why there was none.
    fn health(addr: SocketAddr) -> Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        Ok(answer.lines().next().unwrap_or_default().to_string())
    }

    #[test]
    fn a_killed_replica_is_gone_until_it_restarts_on_its_port() {
        if sim_binary().is_err() {
            eprintln!("SKIPPED: the simulator binary is not built (cargo xtask build)");
            return;
        }
        let mut set = ReplicaSet::start(2, &[]).unwrap();
        let addrs = set.addrs().to_vec();
        assert_eq!(addrs.len(), 2);
        assert_ne!(addrs[0], addrs[1]);
        assert!(health(addrs[0]).unwrap().contains(" 200"));
        set.kill(0).unwrap();
        assert!(health(addrs[0]).is_err(), "a killed replica still answers");
        assert!(set.kill(0).is_err(), "killing a dead replica is an error");
        assert!(
            health(addrs[1]).unwrap().contains(" 200"),
            "the other one lives"
        );
        set.restart(0).unwrap();
        assert_eq!(set.addrs(), &addrs[..]);
        assert!(health(addrs[0]).unwrap().contains(" 200"));
        assert!(set.restart(5).is_err());
    }
}
