//! One Envoy on a translated configuration: the proxy a control plane would run, with the
//! environment its pod gets, stdout kept (the billing log under Istio goes there).

use anyhow::{anyhow, bail, Context, Result};
use infergate_harness::launch::binary::envoy_binary;
use infergate_harness::launch::client;
use infergate_harness::launch::envoy::listener_address;
use infergate_harness::launch::process::{tail, ChildGuard, RunDir};
use infergate_harness::launch::stats::Stats;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A running proxy; stopped on drop.
pub struct Proxy {
    child: ChildGuard,
    pub admin: SocketAddr,
    pub listener: SocketAddr,
    log: PathBuf,
    stdout: PathBuf,
}

impl Proxy {
    /// Starts Envoy on `bootstrap` (with `env`) at `workers` workers, waits for `/ready` and
    /// for the listener `listener`.
    pub async fn start(
        dir: &RunDir,
        bootstrap: &str,
        env: &[(String, String)],
        workers: u32,
        listener: &str,
    ) -> Result<Proxy> {
        let config = dir.path().join("bootstrap.json");
        std::fs::write(&config, bootstrap)?;
        let log = dir.path().join("envoy.log");
        let stdout = dir.path().join("stdout.log");
        let admin_file = dir.path().join("admin-address");
        let child = Command::new(envoy_binary()?)
            .arg("-c")
            .arg(&config)
            .args([
                "--concurrency",
                &workers.to_string(),
                "--disable-hot-restart",
            ])
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--log-path")
            .arg(&log)
            .args(["-l", "info", "--file-flush-interval-msec", "100"])
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(dir.path().join("stderr.log"))?)
            .spawn()
            .context("spawning envoy")?;
        let mut child = ChildGuard::new("envoy", child);
        let deadline = Instant::now() + Duration::from_secs(60);
        let failed = |why: String| {
            anyhow!(
                "{why}\n--- envoy log:\n{}\n--- stderr:\n{}",
                tail(&log, 30),
                tail(&dir.path().join("stderr.log"), 20)
            )
        };
        loop {
            if let Some(status) = child.exited() {
                return Err(failed(format!("envoy exited: {status}")));
            }
            if Instant::now() > deadline {
                return Err(failed("envoy not ready in 60 s".into()));
            }
            let admin = std::fs::read_to_string(&admin_file)
                .ok()
                .and_then(|s| s.trim().parse::<SocketAddr>().ok());
            if let Some(admin) = admin {
                if let Ok(r) = client::get(&format!("http://{admin}/ready")).await {
                    if r.status == 200 {
                        if let Ok(l) = listener_address(admin, listener).await {
                            return Ok(Proxy {
                                child,
                                admin,
                                listener: l,
                                log,
                                stdout,
                            });
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.listener)
    }

    pub async fn stats(&self) -> Result<Stats> {
        Stats::fetch(self.admin).await
    }

    /// The sum of every stat whose name contains `needle`.
    pub async fn stat(&self, needle: &str) -> i64 {
        self.stats()
            .await
            .map(|s| s.sum_containing(needle))
            .unwrap_or(-1)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Envoy's stdout, one JSON value per line that parses.
    pub fn stdout_json(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.stdout)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Admin `GET path` as JSON.
    pub async fn admin_json(&self, path: &str) -> Result<serde_json::Value> {
        let r = client::get(&format!("http://{}{path}", self.admin)).await?;
        if r.status != 200 {
            bail!("admin {path}: {}", r.status);
        }
        Ok(serde_json::from_slice(&r.body)?)
    }

    /// Whether Envoy still runs.
    pub fn running(&mut self) -> bool {
        self.child.exited().is_none()
    }
}
