//! Running one real Envoy: start it on a rendered bootstrap, wait until it is ready, learn
//! its ports, stop it.
//!
//! Ports are never guessed: the bootstrap asks for port 0 and Envoy binds what the kernel
//! gives it; the admin address comes back through `--admin-address-path` and the listener's
//! through admin `/listeners`. So parallel tests never race for a port. Hot restart is
//! disabled (`--disable-hot-restart`), so instances share no base id or shared memory.

use super::binary::envoy_binary;
use super::client;
use super::process::{problems, tail, ChildGuard, RunDir};
use super::stats::{Histograms, Stats};
use anyhow::{anyhow, bail, Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The listener every template names `gateway`.
pub const GATEWAY_LISTENER: &str = "gateway";

/// How to run Envoy.
#[derive(Clone, Debug)]
pub struct EnvoyOptions {
    /// Worker threads (`--concurrency`).
    pub concurrency: u32,
    /// Log level (`-l`): trace, debug, info, warning, error, critical, off.
    pub log_level: String,
    /// How long to wait for `/ready`.
    pub ready_timeout: Duration,
    /// Extra command-line arguments.
    pub extra_args: Vec<String>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            concurrency: 2,
            log_level: std::env::var("INFERGATE_ENVOY_LOG").unwrap_or_else(|_| "info".into()),
            ready_timeout: Duration::from_secs(60),
            extra_args: Vec::new(),
        }
    }
}

/// A running, ready Envoy; stopped on drop (SIGTERM, then SIGKILL).
#[derive(Debug)]
pub struct Envoy {
    // Field order matters: the process stops before its directory is removed.
    child: ChildGuard,
    admin: SocketAddr,
    listener: SocketAddr,
    log: PathBuf,
    config: PathBuf,
    _dir: RunDir,
}

impl Envoy {
    /// Writes `bootstrap` (YAML) to a fresh run directory, starts Envoy on it and waits for
    /// admin `/ready`. The error of a failed start carries the end of Envoy's log.
    pub async fn start(bootstrap: &str, opts: &EnvoyOptions) -> Result<Envoy> {
        let bin = envoy_binary()?;
        let dir = RunDir::new("envoy").context("creating the run directory")?;
        let config = dir.path().join("bootstrap.yaml");
        let log = dir.path().join("envoy.log");
        let admin_file = dir.path().join("admin-address");
        std::fs::write(&config, bootstrap).context("writing the bootstrap")?;
        let stderr = std::fs::File::create(dir.path().join("stderr.log"))?;
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&config)
            .arg("--concurrency")
            .arg(opts.concurrency.to_string())
            .arg("--disable-hot-restart")
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--log-path")
            .arg(&log)
            .arg("-l")
            .arg(&opts.log_level)
            .args(&opts.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let mut child = ChildGuard::new("envoy", child);
        let failed = |why: String, dir: &RunDir| {
            anyhow!(
                "Envoy did not become ready: {why}\n\
                 --- bootstrap: {} (INFERGATE_KEEP_RUNDIR=1 keeps it)\n\
                 --- envoy log, warnings and errors:\n{}\n\
                 --- envoy log tail:\n{}\n--- stderr tail:\n{}",
                config.display(),
                problems(&log, 20),
                tail(&log, 12),
                tail(&dir.path().join("stderr.log"), 20)
            )
        };
        let deadline = Instant::now() + opts.ready_timeout;
        // What the last readiness probe saw, for the error message.
        let mut last = String::from("the admin address file was never written");
        let admin = loop {
            if let Some(status) = child.exited() {
                return Err(failed(format!("exited with {status}"), &dir));
            }
            if Instant::now() > deadline {
                return Err(failed(
                    format!("not ready within {:?}: {last}", opts.ready_timeout),
                    &dir,
                ));
            }
            if let Some(admin) = read_admin(&admin_file) {
                match client::get(&format!("http://{admin}/ready")).await {
                    Ok(resp) if resp.status == 200 => break admin,
                    Ok(resp) => {
                        last = format!(
                            "admin /ready answered {} {} (a bootstrap extension or \
                             cluster still initialising?)",
                            resp.status,
                            resp.text().trim()
                        )
                    }
                    Err(e) => last = format!("admin /ready unreachable: {e:#}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let listener = listener_address(admin, GATEWAY_LISTENER)
            .await
            .map_err(|e| failed(format!("{e:#}"), &dir))?;
        Ok(Envoy {
            child,
            admin,
            listener,
            log,
            config,
            _dir: dir,
        })
    }

    /// The admin interface address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The gateway listener address.
    pub fn listener(&self) -> SocketAddr {
        self.listener
    }

    /// `http://<listener>` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.listener)
    }

    /// Envoy's log file.
    pub fn log_path(&self) -> &PathBuf {
        &self.log
    }

    /// The bootstrap file Envoy runs on.
    pub fn config_path(&self) -> &PathBuf {
        &self.config
    }

    /// The last `lines` lines of Envoy's log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// All counters and gauges from admin `/stats?format=json`.
    pub async fn stats(&self) -> Result<Stats> {
        Stats::fetch(self.admin).await
    }

    /// Admin histograms (sample counts; see [`Histograms`] for when samples show).
    pub async fn histograms(&self) -> Result<Histograms> {
        Histograms::fetch(self.admin).await
    }

    /// Envoy's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Stops Envoy now (drop does the same).
    pub fn stop(&mut self) {
        self.child.stop();
    }
}

fn read_admin(path: &PathBuf) -> Option<SocketAddr> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The bound address of listener `name`, from admin `/listeners?format=json`.
pub async fn listener_address(admin: SocketAddr, name: &str) -> Result<SocketAddr> {
    let resp = client::get(&format!("http://{admin}/listeners?format=json")).await?;
    let v: serde_json::Value = serde_json::from_slice(&resp.body).context("admin /listeners")?;
    let statuses = v["listener_statuses"]
        .as_array()
        .ok_or_else(|| anyhow!("admin /listeners: no listener_statuses"))?;
    for l in statuses {
        if l["name"] == name {
            let sa = &l["local_address"]["socket_address"];
            let ip = sa["address"].as_str().unwrap_or_default();
            let port = sa["port_value"].as_u64().unwrap_or_default();
            return format!("{ip}:{port}")
                .parse()
                .with_context(|| format!("listener {name} address {sa}"));
        }
    }
    bail!("admin /listeners has no listener named {name}")
}
