//! Global quotas for several gateway replicas: a tenant's requests and tokens per minute
//! shared by every Envoy through Envoy's global rate-limit protocol.
//!
//! Pieces, each started here for tests and `cargo xtask up --global-quotas`:
//! - [`RedisServer`]: a throwaway `redis-server` (Debian's) on a free loopback port, no
//!   persistence, its files in a scratch directory;
//! - [`RateLimitService`]: the `infergate-ratelimit` binary (limitador over that Redis),
//!   given the same `TenantQuota` objects as the gateways;
//! - [`GlobalQuotaBackend`]: both processes together, stopped on drop; its
//!   [`GlobalQuotaBackend::quotas`] is what a gateway's bootstrap gets
//!   ([`infergate_cli::config::global_quotas::GlobalQuotas`]).

use super::process::{spawn_announcing, ChildGuard, RunDir};
use anyhow::{anyhow, bail, Context, Result};
use infergate_artefacts::Service;
use infergate_cli::config::global_quotas::{GlobalQuotas, DOMAIN};
use serde_json::Value as Json;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long to wait for Redis and the rate-limit service to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A free loopback port (bound, then released for the child to take).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A `redis-server` of its own, stopped on drop.
#[derive(Debug)]
pub struct RedisServer {
    addr: SocketAddr,
    _child: ChildGuard,
    _dir: RunDir,
}

impl RedisServer {
    /// Starts `redis-server` (`INFERGATE_REDIS_SERVER`, else from `PATH`) on a free
    /// loopback port, without persistence, and waits until it accepts connections.
    pub fn start() -> Result<RedisServer> {
        let bin = std::env::var_os("INFERGATE_REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        let dir = RunDir::new("redis")?;
        let port = free_port()?;
        let child = Command::new(&bin)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| {
                format!(
                    "spawning {} (Debian: apt-get install redis-server)",
                    bin.display()
                )
            })?;
        let mut child = ChildGuard::new("redis-server", child);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = child.exited() {
                bail!("redis-server exited at start ({status}); port {port} taken?");
            }
            if Instant::now() > deadline {
                bail!("redis-server did not listen on {addr} within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(RedisServer {
            addr,
            _child: child,
            _dir: dir,
        })
    }

    /// The server's URL for a client.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The `infergate-ratelimit` binary: `INFERGATE_RATELIMIT`, else the release build, else
/// the debug build (`cargo xtask test` builds it; it is not a default member).
pub fn ratelimit_binary() -> Result<PathBuf> {
    let service = Service::RateLimit;
    service.find().ok_or_else(|| {
        anyhow!(
            "rate-limit service binary not found at {} (build it: cargo build -p {} \
             (needs Debian's librocksdb-dev), or set {})",
            service.built("debug").display(),
            service.package(),
            service.env()
        )
    })
}

/// A running `infergate-ratelimit`, stopped on drop.
#[derive(Debug)]
pub struct RateLimitService {
    addr: SocketAddr,
    _child: ChildGuard,
    _dir: RunDir,
}

impl RateLimitService {
    /// Starts the service over the Redis at `redis_url` with the limits of `objects` (the
    /// gateways' `TenantQuota` and `InferenceObjective` objects), and waits until it
    /// prints the address it serves on.
    pub fn start(objects: &[Json], redis_url: &str) -> Result<RateLimitService> {
        let bin = ratelimit_binary()?;
        let dir = RunDir::new("ratelimit")?;
        let file = dir.path().join("tenants.json");
        let text = objects
            .iter()
            .map(Json::to_string)
            .collect::<Vec<_>>()
            .join("\n---\n");
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        let (guard, rx) = spawn_announcing(
            "infergate-ratelimit",
            Command::new(&bin)
                .arg("--objects")
                .arg(&file)
                .args(["--redis", redis_url, "--domain", DOMAIN])
                .args(["--listen", "127.0.0.1:0"]),
            parse_listening_line,
        )?;
        let addr = rx
            .recv_timeout(START_TIMEOUT)
            .map_err(|_| anyhow!("infergate-ratelimit did not listen within {START_TIMEOUT:?}"))?;
        Ok(RateLimitService {
            addr,
            _child: guard,
            _dir: dir,
        })
    }

    /// The gRPC address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// `listening on IP:PORT` (what `infergate-ratelimit` prints) → the address.
pub fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    line.trim().strip_prefix("listening on ")?.parse().ok()
}

/// Redis and the rate-limit service over it, for every gateway of a fleet.
#[derive(Debug)]
pub struct GlobalQuotaBackend {
    // Dropped first: the service before the Redis it uses.
    service: RateLimitService,
    redis: RedisServer,
}

impl GlobalQuotaBackend {
    /// Starts Redis, then the service with `objects`' limits.
    pub fn start(objects: &[Json]) -> Result<GlobalQuotaBackend> {
        let redis = RedisServer::start()?;
        let service = RateLimitService::start(objects, &redis.url())?;
        Ok(GlobalQuotaBackend { service, redis })
    }

    /// What each gateway's bootstrap gets.
    pub fn quotas(&self) -> GlobalQuotas {
        GlobalQuotas::at(self.service.addr())
    }

    /// The Redis server.
    pub fn redis(&self) -> &RedisServer {
        &self.redis
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_parses() {
        assert_eq!(
            parse_listening_line("listening on 127.0.0.1:4001\n"),
            Some(SocketAddr::from(([127, 0, 0, 1], 4001)))
        );
        assert_eq!(parse_listening_line("replica 0: http://127.0.0.1:1"), None);
    }

    #[test]
    fn a_redis_server_starts_and_answers() {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(
                std::env::var_os("CI").is_none(),
                "redis-server is not installed (CI installs it)"
            );
            eprintln!("SKIPPED: redis-server is not installed");
            return;
        }
        let redis = RedisServer::start().unwrap();
        let mut conn = TcpStream::connect(redis.addr()).unwrap();
        use std::io::{Read, Write};
        conn.write_all(b"PING\r\n").unwrap();
        let mut reply = [0u8; 7];
        conn.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+PONG\r\n");
    }
}
