//! Global quotas for several gateway replicas: a tenant's requests and tokens per minute
//! shared by every Envoy through Envoy's global rate-limit protocol.
//!
//! Pieces, each started here for tests and `cargo xtask up --global-quotas`:
//! - [`RedisServer`]: a throwaway `redis-server` (Debian's) on a free loopback port, no
//!   persistence, its files in a scratch directory;
//! - [`RateLimitService`]: the `infergate-ratelimit` binary (limitador over that Redis),
//!   given the same `TenantQuota` objects as the gateways;
//! - [`GlobalQuotas`]: what a gateway's bootstrap gets: the router config's
//!   `globalQuotas: true`, Envoy's `ratelimit` HTTP filter after the router filter
//!   (prototype `global_quota_filter`, spliced at `global_quota_filters`) and the cluster
//!   of the rate-limit service (prototype `global_quota_cluster`, spliced at
//!   `global_quota_clusters`).
//!
//! [`GlobalQuotaBackend`] is both processes together, stopped on drop.

use super::process::{spawn_announcing, ChildGuard, RunDir};
use super::template::{Template, Vars};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use serde_yaml_ng::Value;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The rate-limit domain the gateways send and the service serves.
pub const DOMAIN: &str = "infergate";

/// How long to wait for Redis and the rate-limit service to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// What one gateway needs to use the global rate-limit service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalQuotas {
    /// The rate-limit service's gRPC address.
    pub service: SocketAddr,
    /// The rate-limit domain.
    pub domain: String,
}

/// The list items [`GlobalQuotas`] adds to a template.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Splices {
    /// `global_quota_filters`: Envoy's `ratelimit` filter, or nothing.
    pub filters: Vec<Value>,
    /// `global_quota_clusters`: the rate-limit service's cluster, or nothing.
    pub clusters: Vec<Value>,
}

impl GlobalQuotas {
    /// Global quotas through the service at `service`, in [`DOMAIN`].
    pub fn at(service: SocketAddr) -> GlobalQuotas {
        GlobalQuotas {
            service,
            domain: DOMAIN.to_owned(),
        }
    }

    /// The items spliced at `global_quota_filters` and `global_quota_clusters`: none
    /// without global quotas.
    pub fn splices(global: Option<&GlobalQuotas>, template: &Template) -> Result<Splices> {
        let Some(global) = global else {
            return Ok(Splices::default());
        };
        if !template.has_prototype("global_quota_filter") {
            bail!("global quotas need the wasm or native flavour");
        }
        let mut vars = Vars::new();
        vars.insert(
            "rate_limit_domain".into(),
            Value::String(global.domain.clone()),
        );
        vars.insert(
            "rate_limit_address".into(),
            Value::String(global.service.ip().to_string()),
        );
        vars.insert("rate_limit_port".into(), Value::from(global.service.port()));
        Ok(Splices {
            filters: vec![template.prototype("global_quota_filter", &vars)?],
            clusters: vec![template.prototype("global_quota_cluster", &vars)?],
        })
    }

    /// Sets `globalQuotas: true` in the router configuration `router` (a JSON object) with
    /// global quotas; leaves it alone without.
    pub fn apply_to_router(global: Option<&GlobalQuotas>, router: &mut Json) -> Result<()> {
        if global.is_none() {
            return Ok(());
        }
        let Some(map) = router.as_object_mut() else {
            bail!("the router configuration is not a JSON object");
        };
        map.insert(
            infergate_filters::stages::tenancy::GLOBAL_QUOTAS_KEY.into(),
            Json::Bool(true),
        );
        Ok(())
    }
}

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
/// the debug build.
pub fn ratelimit_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("INFERGATE_RATELIMIT") {
        return Ok(PathBuf::from(p));
    }
    let target = crate::artefacts::target_dir();
    let candidates = [
        target.join("release/infergate-ratelimit"),
        target.join("debug/infergate-ratelimit"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            anyhow!(
                "rate-limit service binary not found at {} (build it: \
                 ROCKSDB_LIB_DIR=/usr/lib/x86_64-linux-gnu cargo build -p infergate-ratelimit, \
                 or set INFERGATE_RATELIMIT)",
                candidates[1].display()
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
    fn the_router_gets_the_flag_only_with_global_quotas() {
        let mut router = serde_json::json!({"role": "router"});
        GlobalQuotas::apply_to_router(None, &mut router).unwrap();
        assert!(router.get("globalQuotas").is_none());
        let g = GlobalQuotas::at(SocketAddr::from(([127, 0, 0, 1], 9)));
        GlobalQuotas::apply_to_router(Some(&g), &mut router).unwrap();
        assert_eq!(router["globalQuotas"], true);
    }

    /// Both gateway templates: the rate-limit filter right after the router filter, the
    /// service's cluster, the router's flag; none of it without global quotas; the plain
    /// template refuses them.
    #[test]
    fn the_templates_splice_the_filter_after_the_router_and_the_cluster() {
        use crate::launch::bootstrap::{render, BootstrapParams, Flavor, Pool};
        let pools = vec![Pool::new(
            "m",
            vec![SocketAddr::from(([127, 0, 0, 1], 8001))],
        )];
        let service = SocketAddr::from(([127, 0, 0, 1], 4321));
        for flavor in [Flavor::Native, Flavor::Wasm] {
            let mut params = BootstrapParams::new(flavor, pools.clone());
            params.module = Some(PathBuf::from("/nonexistent/module"));
            let hcm = |v: &Json| {
                v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
                    ["typed_config"]
                    .clone()
            };
            let plain: Json = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let filters = hcm(&plain)["http_filters"].clone();
            assert!(
                filters
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|f| f["name"] != "envoy.filters.http.ratelimit"),
                "{flavor}: {filters}"
            );
            params.global_quotas = Some(GlobalQuotas::at(service));
            let v: Json = serde_yaml_ng::from_str(&render(&params).unwrap()).unwrap();
            let filters = hcm(&v)["http_filters"].as_array().unwrap().clone();
            // After the router's header edits are applied (Wasm: the `headers` filter).
            let router = filters
                .iter()
                .position(|f| f["name"] == "infergate.headers")
                .or_else(|| filters.iter().position(|f| f["name"] == "infergate.router"))
                .unwrap();
            let rl = &filters[router + 1];
            assert_eq!(rl["name"], "envoy.filters.http.ratelimit", "{flavor}");
            let config = &rl["typed_config"];
            assert_eq!(config["domain"], DOMAIN, "{flavor}");
            assert_eq!(config["timeout"], "1s", "{flavor}");
            let limits = config["rate_limits"].as_array().unwrap();
            assert_eq!(limits.len(), 3, "{flavor}");
            assert_eq!(limits[2]["apply_on_stream_done"], true, "{flavor}");
            let state = if flavor == Flavor::Wasm {
                "%FILTER_STATE(wasm.infergate.quota.actual:PLAIN)%"
            } else {
                "%FILTER_STATE(infergate.quota.actual:PLAIN)%"
            };
            assert_eq!(limits[2]["hits_addend"]["format"], state, "{flavor}");
            let clusters = v["static_resources"]["clusters"].as_array().unwrap();
            let rls = clusters
                .iter()
                .find(|c| c["name"] == "infergate_ratelimit")
                .unwrap();
            let addr = &rls["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"];
            assert_eq!(addr["port_value"], 4321, "{flavor}");
            let router = filters
                .iter()
                .position(|f| f["name"] == "infergate.router")
                .unwrap();
            let typed = &filters[router]["typed_config"];
            let text = typed["filter_config"]["value"]
                .as_str()
                .or(typed["config"]["configuration"]["value"].as_str())
                .unwrap();
            let router_config: Json = serde_json::from_str(text).unwrap();
            assert_eq!(router_config["globalQuotas"], true, "{flavor}");
        }
        let mut plain = BootstrapParams::new(Flavor::Plain, pools);
        plain.global_quotas = Some(GlobalQuotas::at(service));
        assert!(render(&plain).is_err());
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
