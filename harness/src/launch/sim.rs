//! Running the engine simulator binary (`infergate-sim`) as a child process and learning
//! its replicas' addresses from the lines it prints:
//! `replica K: http://127.0.0.1:PORT`, one per replica, once each replica listens.

use super::process::{spawn_announcing, ChildGuard};
use anyhow::{anyhow, bail, Result};
use infergate_artefacts::{Artefacts, SIM_BINARY, SIM_ENV};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The simulator binary: `INFERGATE_SIM`, else the release build, else the debug build.
pub fn sim_binary() -> Result<PathBuf> {
    infergate_artefacts::find_binary(SIM_ENV, SIM_BINARY).ok_or_else(|| {
        anyhow!(
            "simulator binary not found at {} (build it: cargo build --release -p \
             infergate-sim, or set {SIM_ENV})",
            Artefacts::locate().simulator.display()
        )
    })
}

/// A running simulator process; stopped on drop.
#[derive(Debug)]
pub struct SimProcess {
    replicas: Vec<SocketAddr>,
    _child: ChildGuard,
}

impl SimProcess {
    /// Starts `infergate-sim --replicas N --port 0 <extra_args…>` and waits (up to
    /// `timeout`) until it has printed every replica's address.
    pub async fn start(replicas: usize, extra_args: &[String], timeout: Duration) -> Result<Self> {
        let bin = sim_binary()?;
        let (guard, rx) = spawn_announcing(
            "infergate-sim",
            Command::new(&bin)
                .arg("--replicas")
                .arg(replicas.to_string())
                .arg("--port")
                .arg("0")
                .args(extra_args),
            parse_replica_line,
        )?;
        let found = tokio::task::spawn_blocking(move || {
            let mut found = Vec::with_capacity(replicas);
            let deadline = std::time::Instant::now() + timeout;
            while found.len() < replicas {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match rx.recv_timeout(left) {
                    Ok(addr) => found.push(addr),
                    Err(_) => break,
                }
            }
            found
        })
        .await?;
        if found.len() < replicas {
            bail!(
                "simulator printed {} of {replicas} replica addresses within {timeout:?}",
                found.len()
            );
        }
        Ok(SimProcess {
            replicas: found,
            _child: guard,
        })
    }

    /// The replicas' addresses, in replica order.
    pub fn replicas(&self) -> &[SocketAddr] {
        &self.replicas
    }
}

/// The extra arguments that turn on the simulator's KV events: replica `IP:P` publishes
/// vLLM's KV events at `tcp://IP:(P + offset)` (the simulator also prints
/// `replica K kv-events: tcp://…`, which [`parse_replica_line`] ignores). Default launches
/// pass nothing and publish nothing.
pub fn kv_events_args(offset: u16) -> Vec<String> {
    vec!["--kv-events-port-offset".into(), offset.to_string()]
}

/// Where a replica at `replica` publishes its KV events when started with
/// [`kv_events_args`]`(offset)`.
pub fn kv_events_endpoint(replica: SocketAddr, offset: u16) -> Option<SocketAddr> {
    let port = replica.port().checked_add(offset)?;
    Some(SocketAddr::new(replica.ip(), port))
}

/// `replica K: http://IP:PORT` → the address.
pub fn parse_replica_line(line: &str) -> Option<SocketAddr> {
    let rest = line.trim().strip_prefix("replica ")?;
    let (_, url) = rest.split_once(": ")?;
    url.trim()
        .strip_prefix("http://")?
        .trim_end_matches('/')
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_lines_parse_and_others_do_not() {
        assert_eq!(
            parse_replica_line("replica 3: http://127.0.0.1:41234"),
            Some(SocketAddr::from(([127, 0, 0, 1], 41234)))
        );
        assert_eq!(parse_replica_line("listening on 127.0.0.1:1"), None);
        assert_eq!(parse_replica_line("replica 0: https://127.0.0.1:1"), None);
        assert_eq!(
            parse_replica_line("replica 0 kv-events: tcp://127.0.0.1:9000"),
            None
        );
        assert_eq!(kv_events_args(1000), ["--kv-events-port-offset", "1000"]);
        assert_eq!(
            kv_events_endpoint(SocketAddr::from(([127, 0, 0, 1], 8000)), 1000),
            Some(SocketAddr::from(([127, 0, 0, 1], 9000)))
        );
        assert_eq!(
            kv_events_endpoint(SocketAddr::from(([127, 0, 0, 1], 65000)), 1000),
            None
        );
    }
}
