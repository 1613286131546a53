//! Envoy with an external processor: the `plain` bootstrap plus Envoy's `ext_proc` HTTP
//! filter in front of the router, talking gRPC (HTTP/2, a STATIC cluster) to an
//! `infergate-extproc` process that sets the routing headers — the architecture of
//! llm-d's EPP, which `bench overhead` sets the in-proxy gateway against.
//!
//! The filter is configured as llm-d requires it: request headers `SEND`, the request body
//! `FULL_DUPLEX_STREAMED` (trailers `SEND`, as that mode demands) or `BUFFERED`
//! ([`BodyMode`]), nothing of the response, no mode override, failing closed, and a
//! message timeout long enough for a 512 KB body on a busy machine.
//!
//! - [`ExtProcessor`]: the processor process ([`processor_binary`] finds or builds it);
//! - [`with_ext_proc`]: the filter and its cluster spliced into a rendered bootstrap;
//! - [`ExtProcStack`]: both, in front of given replicas.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use infergate_artefacts::Service;
use serde_json::json;
use serde_yaml_ng::Value;

use super::envoy::{Envoy, EnvoyOptions, GATEWAY_LISTENER};
use super::process::{spawn_announcing, ChildGuard};
use super::stack::DEFAULT_MODEL;
use infergate_cli::config::bootstrap::{render, BootstrapParams, Flavor, Pool};

/// The cluster of the processor in the bootstrap.
pub const CLUSTER: &str = "infergate_extproc";

/// The filter's name in the chain.
pub const FILTER: &str = "envoy.filters.http.ext_proc";

/// How long the processor may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// What the processor does before it answers (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcessorMode {
    /// Answers as soon as the body is complete.
    Null,
    /// Parses the body and hashes its prompt first.
    Parse,
}

impl ProcessorMode {
    /// The `--mode` value.
    pub fn name(self) -> &'static str {
        match self {
            ProcessorMode::Null => "null",
            ProcessorMode::Parse => "parse",
        }
    }
}

/// How Envoy's filter sends the request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BodyMode {
    /// Streamed in chunks both ways; Envoy forwards what the processor streams back.
    FullDuplex,
    /// Buffered whole, sent once, forwarded by Envoy itself.
    Buffered,
}

impl BodyMode {
    /// The `request_body_mode` value of the filter's `processing_mode`.
    pub fn wire(self) -> &'static str {
        match self {
            BodyMode::FullDuplex => "FULL_DUPLEX_STREAMED",
            BodyMode::Buffered => "BUFFERED",
        }
    }
}

/// The `infergate-extproc` binary: `INFERGATE_EXTPROC`, else the release build, brought up
/// to date with `cargo build --release -p infergate-extproc` (a no-op when it is).
pub fn processor_binary() -> Result<PathBuf> {
    let service = Service::ExtProc;
    if let Some(p) = std::env::var_os(service.env()) {
        return Ok(PathBuf::from(p));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", service.package()])
        .current_dir(infergate_artefacts::workspace_root())
        .status()
        .with_context(|| format!("running cargo to build {}", service.package()))?;
    if !status.success() {
        bail!(
            "cargo build --release -p {} failed ({status})",
            service.package()
        );
    }
    let bin = service.built("release");
    if !bin.is_file() {
        bail!("{} missing after its build", bin.display());
    }
    Ok(bin)
}

/// A running `infergate-extproc`, stopped on drop.
#[derive(Debug)]
pub struct ExtProcessor {
    addr: SocketAddr,
    child: ChildGuard,
}

impl ExtProcessor {
    /// Starts `binary` in `mode`, routing to `endpoints` (`threads` Tokio workers), and
    /// waits until it prints the address it serves on.
    pub fn start(
        binary: &Path,
        mode: ProcessorMode,
        endpoints: &[SocketAddr],
        threads: usize,
    ) -> Result<ExtProcessor> {
        if endpoints.is_empty() {
            bail!("the external processor needs at least one endpoint");
        }
        let list: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
        let (child, rx) = spawn_announcing(
            "infergate-extproc",
            Command::new(binary)
                .args(["--listen", "127.0.0.1:0", "--mode", mode.name()])
                .args(["--endpoint", &list.join(",")])
                .args(["--model", DEFAULT_MODEL])
                .args(["--threads", &threads.to_string()]),
            parse_listening_line,
        )?;
        let addr = rx
            .recv_timeout(START_TIMEOUT)
            .map_err(|_| anyhow!("infergate-extproc did not listen within {START_TIMEOUT:?}"))?;
        Ok(ExtProcessor { addr, child })
    }

    /// The gRPC address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// `listening on IP:PORT` (what `infergate-extproc` prints) → the address.
pub fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    line.trim().strip_prefix("listening on ")?.parse().ok()
}

/// The `ext_proc` filter for a processor in `body` mode.
pub fn filter(body: BodyMode) -> serde_json::Value {
    // FULL_DUPLEX_STREAMED requires the request trailers to be sent (they end a body
    // whose last chunk did not); BUFFERED has no use for them.
    let trailers = match body {
        BodyMode::FullDuplex => "SEND",
        BodyMode::Buffered => "SKIP",
    };
    json!({
        "name": FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": CLUSTER}},
            "failure_mode_allow": false,
            "allow_mode_override": false,
            // The default (200 ms) would fail a 512 KB body behind a busy processor.
            "message_timeout": "10s",
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SKIP",
                "request_body_mode": body.wire(),
                "response_body_mode": "NONE",
                "request_trailer_mode": trailers,
                "response_trailer_mode": "SKIP"
            }
        }
    })
}

/// The processor's cluster: STATIC, HTTP/2.
pub fn cluster(processor: SocketAddr) -> serde_json::Value {
    json!({
        "name": CLUSTER,
        "type": "STATIC",
        "connect_timeout": "2s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        },
        "load_assignment": {
            "cluster_name": CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                "address": processor.ip().to_string(), "port_value": processor.port()}}}}]}]
        }
    })
}

/// `bootstrap` (YAML) with the `ext_proc` filter right before the router of the gateway
/// listener and the processor's cluster added.
pub fn with_ext_proc(bootstrap: &str, body: BodyMode, processor: SocketAddr) -> Result<String> {
    let mut doc: Value = serde_yaml_ng::from_str(bootstrap).context("parsing the bootstrap")?;
    let filters = gateway_http_filters(&mut doc)?;
    let router = filters
        .iter()
        .position(|f| f["name"].as_str() == Some("envoy.filters.http.router"))
        .context("the gateway listener has no router filter")?;
    filters.insert(router, serde_yaml_ng::to_value(filter(body))?);
    let clusters = doc["static_resources"]["clusters"]
        .as_sequence_mut()
        .context("the bootstrap has no static clusters")?;
    clusters.push(serde_yaml_ng::to_value(cluster(processor))?);
    Ok(serde_yaml_ng::to_string(&doc)?)
}

fn gateway_http_filters(doc: &mut Value) -> Result<&mut Vec<Value>> {
    let listeners = doc["static_resources"]["listeners"]
        .as_sequence_mut()
        .context("the bootstrap has no static listeners")?;
    let gateway = listeners
        .iter_mut()
        .find(|l| l["name"].as_str() == Some(GATEWAY_LISTENER))
        .context("no gateway listener")?;
    let chains = gateway["filter_chains"]
        .as_sequence_mut()
        .context("the gateway listener has no filter chains")?;
    for chain in chains {
        let Some(filters) = chain["filters"].as_sequence_mut() else {
            continue;
        };
        for f in filters {
            if f["name"].as_str() == Some("envoy.filters.network.http_connection_manager") {
                return f["typed_config"]["http_filters"]
                    .as_sequence_mut()
                    .context("the connection manager has no http_filters");
            }
        }
    }
    bail!("the gateway listener has no HTTP connection manager")
}

/// How to start an [`ExtProcStack`].
#[derive(Clone, Debug)]
pub struct ExtProcOptions {
    /// The processor binary ([`processor_binary`], or a test's own build).
    pub binary: PathBuf,
    /// What the processor does before it answers.
    pub mode: ProcessorMode,
    /// How Envoy sends it the body.
    pub body: BodyMode,
    /// The replicas the processor routes to (and the `plain` pool's).
    pub endpoints: Vec<SocketAddr>,
    /// The processor's Tokio workers.
    pub threads: usize,
    /// Envoy's options.
    pub envoy: EnvoyOptions,
}

/// A running processor and the Envoy that calls it; Envoy stops first on drop.
#[derive(Debug)]
pub struct ExtProcStack {
    // Field order is drop order.
    envoy: Envoy,
    processor: ExtProcessor,
}

impl ExtProcStack {
    /// Starts the processor, then Envoy on the `plain` bootstrap (one pool of
    /// [`DEFAULT_MODEL`] over `endpoints`, the `/rr` baseline) with the filter added.
    pub async fn start(opts: &ExtProcOptions) -> Result<ExtProcStack> {
        let processor =
            ExtProcessor::start(&opts.binary, opts.mode, &opts.endpoints, opts.threads)?;
        let mut params = BootstrapParams::new(
            Flavor::Plain,
            vec![Pool::new(DEFAULT_MODEL, opts.endpoints.clone())],
        );
        params.baseline = true;
        let bootstrap = with_ext_proc(&render(&params)?, opts.body, processor.addr())?;
        let envoy = Envoy::start(&bootstrap, &opts.envoy).await?;
        Ok(ExtProcStack { envoy, processor })
    }

    /// The Envoy.
    pub fn envoy(&self) -> &Envoy {
        &self.envoy
    }

    /// The processor.
    pub fn processor(&self) -> &ExtProcessor {
        &self.processor
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn plain_bootstrap() -> String {
        let eps: Vec<SocketAddr> = vec!["127.0.0.1:9001".parse().unwrap()];
        let mut params = BootstrapParams::new(Flavor::Plain, vec![Pool::new(DEFAULT_MODEL, eps)]);
        params.baseline = true;
        render(&params).unwrap()
    }

    #[test]
    fn the_filter_goes_right_before_the_router_with_its_cluster() {
        let processor: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        for body in [BodyMode::FullDuplex, BodyMode::Buffered] {
            let text = with_ext_proc(&plain_bootstrap(), body, processor).unwrap();
            let mut doc: Value = serde_yaml_ng::from_str(&text).unwrap();
            let names: Vec<String> = gateway_http_filters(&mut doc)
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(names, [FILTER, "envoy.filters.http.router"]);
            let f = &gateway_http_filters(&mut doc).unwrap()[0]["typed_config"];
            let mode = &f["processing_mode"];
            assert_eq!(mode["request_body_mode"].as_str(), Some(body.wire()));
            assert_eq!(mode["response_header_mode"].as_str(), Some("SKIP"));
            assert_eq!(f["failure_mode_allow"].as_bool(), Some(false));
            assert_eq!(f["allow_mode_override"].as_bool(), Some(false));
            let trailers = mode["request_trailer_mode"].as_str();
            assert_eq!(trailers == Some("SEND"), body == BodyMode::FullDuplex);
            let clusters = doc["static_resources"]["clusters"].as_sequence().unwrap();
            let c = clusters
                .iter()
                .find(|c| c["name"].as_str() == Some(CLUSTER))
                .unwrap();
            assert_eq!(c["type"].as_str(), Some("STATIC"));
            let sa = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"];
            assert_eq!(sa["port_value"].as_u64(), Some(7001));
        }
    }

    #[test]
    fn the_listening_line_parses() {
        assert_eq!(
            parse_listening_line("listening on 127.0.0.1:5\n"),
            Some("127.0.0.1:5".parse().unwrap())
        );
        assert_eq!(parse_listening_line("hello"), None);
    }
}
