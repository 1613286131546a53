//! `infergate`: the gateway's command-line tool.
//!
//! `infergate explain --config <epp.yaml|json> --state <state.json> --request <body.json>
//! [--path /v1/chat/completions] [--seed N] [--now-ms T] [--rewrites FILE] [--sticky-key K]`
//! prints the decision record of one request as JSON: the pool's endpoints classified by
//! the gateway's candidate rules at `T` (dead, fresh, unknown, unscraped; fail open or
//! close), then the scheduler's record, or the rejection the gateway would answer with.
//! With `--rewrites` the request is first rewritten as the router's model rewrites would
//! (sticky on `K`, else drawn from the seed).
//!
//! `infergate render --objects DIR --flavor wasm|native --out DIR
//! [--target envoy|istio|envoy-gateway] [--istio-version 1.28|1.29|1.30]
//! [--endpoints POOL=IP[:PORT],...]
//! [--membership eds|static] [--eds-dir DIR]
//! [--listen ADDR:PORT] [--admin ADDR:PORT] [--module PATH] [--image oci://…] [--no-tenants]
//! [--jwks FILE] [--billing-log PATH] [--per-request-split]` renders the user's Kubernetes
//! objects as a gateway: an Envoy bootstrap (`--target envoy`, the default), Istio's
//! manifests (`istio`) or Envoy Gateway's (`envoy-gateway`), the field report and a
//! README into `--out` (see `infergate_cli::render`); the fields it does not support are
//! printed, one per line.
//!
//! `infergate plugins` prints the scheduling plugins' reference as Markdown, generated from
//! the code (see `infergate_cli::catalogue`): the page the book's configuration chapter
//! includes.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use infergate_cli::config::bootstrap::PeerMode;
use infergate_cli::config::{Flavor, Membership};
use infergate_cli::explain;
use infergate_cli::render::{self, GatewayInputs, RenderOptions};
use scheduler_core::types::Millis;
use std::net::SocketAddr;

/// In-Envoy LLM inference gateway tools
///
/// The operator's tool: `render` writes the gateway for the user's Kubernetes objects (an
/// Envoy bootstrap, or Istio's or Envoy Gateway's manifests), `explain` schedules one request
/// offline and shows why the picker chose what it chose.
#[derive(Parser)]
#[command(name = "infergate", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Schedule one request offline as the gateway would and print the decision record
    /// (JSON) on stdout; a pool the gateway would reject prints the rejection.
    ///
    /// The pool's endpoints are classified (dead, fresh, unknown, unscraped) and the
    /// candidates chosen by the same core rules the gateway's picker runs. The record holds
    /// each endpoint's class and the `selection` (`fresh`, `degraded` or `every_member`),
    /// then, per profile, which filter dropped which endpoint, each scorer's raw and
    /// weighted score per endpoint, the totals, the pick (`picked` names the endpoint) and
    /// the fallbacks (and, with disaggregation, the decider's verdict and the `prefiller`).
    /// A pool the gateway would reject prints `picked: null` with the gateway's `rejected`
    /// label and its 503 `message`.
    #[command(verbatim_doc_comment)]
    Explain {
        /// EndpointPickerConfig file (`.json` as JSON, anything else as YAML).
        #[arg(long)]
        config: PathBuf,
        /// Pool state (JSON): endpoints with their scrape records, in-flight load, routing
        /// history, and the pool's failure mode and staleness bounds (its keys: the book's CLI
        /// reference).
        #[arg(long)]
        state: PathBuf,
        /// Request body (JSON).
        #[arg(long)]
        request: PathBuf,
        /// API path the request was sent to.
        #[arg(long, default_value = "/v1/chat/completions")]
        path: String,
        /// Seed of the decision's random choices (ties, weighted picks).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The clock, in milliseconds: what endpoints are judged fresh against (an
        /// endpoint without `scraped_at_ms` counts as scraped now), and the scheduler's.
        #[arg(long, default_value_t = 0)]
        now_ms: u64,
        /// `InferenceModelRewrite` objects (YAML or JSON, one or more documents) the router
        /// rewrites the request's model with before it is scheduled; the record then holds
        /// `rewrite: {model, target_model, object, rule, split, sticky_key}`.
        #[arg(long)]
        rewrites: Option<PathBuf>,
        /// The request's sticky key for the rewrite's split (the session header's value,
        /// else the fairness id); without it the target is drawn per request from the seed.
        #[arg(long)]
        sticky_key: Option<String>,
    },
    /// Render the user's Kubernetes objects (InferencePool, HTTPRoute, the ConfigMap
    /// holding the EndpointPickerConfig, InferenceObjective, InferenceModelRewrite,
    /// TenantQuota) as a gateway: `envoy.yaml`, `istio.yaml` or `envoy-gateway.yaml` (by
    /// `--target`), `fields.md`, `README.md`.
    ///
    /// Writes into `--out` the Envoy bootstrap (`--target envoy`) and the pools' EDS files,
    /// or Istio's or Envoy Gateway's manifests, the field report (`fields.md`: what each
    /// object's fields became) and a README; prints what it wrote and each field it does
    /// not support, one per line.
    #[command(verbatim_doc_comment)]
    Render {
        /// The objects' directory (every *.yaml, *.yml, *.json in it).
        #[arg(long)]
        objects: PathBuf,
        /// What to render for: `envoy` (a bootstrap), `istio` or `envoy-gateway` (the control
        /// plane's manifests).
        #[arg(long, default_value = "envoy")]
        target: render::Target,
        /// The Istio release (`--target istio`): 1.28, 1.29 or 1.30.
        #[arg(long, default_value = "1.30")]
        istio_version: render::IstioVersion,
        /// `wasm` or `native`.
        #[arg(long)]
        flavor: Flavor,
        /// The output directory (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// A pool's endpoints, `POOL=IP[:PORT],...` (a bare IP takes each of the pool's
        /// targetPorts); repeat for each pool.
        #[arg(long = "endpoints", value_name = "POOL=IP[:PORT],...")]
        endpoints: Vec<String>,
        /// Where the pool clusters take their members from: `eds` (files Envoy watches, in
        /// `--eds-dir`) or `static` (the `--endpoints` lists).
        #[arg(long, default_value = "eds")]
        membership: String,
        /// The directory of the pools' EDS files as Envoy will see it (default `<out>/eds`);
        /// the files are written into `<out>/eds` either way.
        #[arg(long)]
        eds_dir: Option<PathBuf>,
        /// The gateway listener's address.
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// Envoy's admin address.
        #[arg(long, default_value = "127.0.0.1:9901")]
        admin: SocketAddr,
        /// The module's path on the Envoy host (default: the built artefact's path here).
        #[arg(long)]
        module: Option<PathBuf>,
        /// The module's OCI image (Istio, Envoy Gateway): the Wasm module the control plane
        /// fetches, or the image holding `libinfergate_envoy.so` at its root (native).
        #[arg(
            long,
            default_value = "oci://registry.example.internal/infergate/infergate-wasm:latest"
        )]
        image: String,
        /// Leave the TenantQuota objects out (reported): no authentication, no quotas.
        #[arg(long)]
        no_tenants: bool,
        /// The JWKS (JSON) of the issuer the tenants' `jwtClaims` name.
        #[arg(long)]
        jwks: Option<PathBuf>,
        /// Where Envoy writes the billing log (one JSON line per request).
        #[arg(long)]
        billing_log: Option<PathBuf>,
        /// Split a route's weights per request instead of sticky on `x-gateway-split-key`.
        #[arg(long)]
        per_request_split: bool,
        /// Where each cluster of the ClusterSet runs its gateway (llm-d's discovery file:
        /// `endpoints: [{name, address, port}]`), for the pools an InferencePoolImport names.
        #[arg(long)]
        peers: Option<PathBuf>,
        /// This cluster's name in the ClusterSet (never its own peer).
        #[arg(long)]
        cluster: Option<String>,
        /// How this cluster reaches the clusters it imports pools from: `parent` (through
        /// their gateways, which pick in their own pools) or `endpoint` (straight to the
        /// replicas their gateways publish; needs a network that reaches them).
        #[arg(long, default_value = "parent")]
        peer_mode: PeerMode,
        /// A file holding the API key this gateway presents to peer gateways that
        /// authenticate tenants (Parent Mode; the peers hold it as a tenant's key).
        #[arg(long)]
        peer_api_key_file: Option<PathBuf>,
        /// Exported pools list their members on their export pages too, for clusters that
        /// import them in Endpoint Mode (their replicas' addresses, with no credential).
        #[arg(long)]
        export_members: bool,
    },
    /// Print the scheduling plugins' reference (Markdown): every plugin type and its
    /// parameters.
    ///
    /// Every plugin type of the EndpointPickerConfig with its kind and what it does, then
    /// every parameter with its kind, default and accepted values, read from the code that
    /// compiles them; the book's configuration chapter includes the same page.
    Plugins,
}

/// `POOL=IP[:PORT],...` → (pool, endpoints).
fn endpoints_flag(flag: &str) -> anyhow::Result<(String, Vec<String>)> {
    let Some((pool, list)) = flag.split_once('=') else {
        anyhow::bail!("--endpoints {flag}: expected POOL=IP[:PORT],...");
    };
    Ok((
        pool.to_owned(),
        list.split(',')
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
    ))
}

/// Runs `render` and prints what was written and what is not supported.
fn run_render(opts: &RenderOptions) -> anyhow::Result<String> {
    let out = render::render(opts)?;
    let mut text = format!(
        "wrote {}\nwrote {}\nwrote {}",
        out.output.display(),
        out.fields.display(),
        out.readme.display()
    );
    text.push_str(&format!("\nnot supported ({}):", out.not_supported.len()));
    for line in &out.not_supported {
        text.push_str("\n  ");
        text.push_str(line);
    }
    Ok(text)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Explain {
            config,
            state,
            request,
            path,
            seed,
            now_ms,
            rewrites,
            sticky_key,
        } => explain::run(&explain::Inputs {
            config: &config,
            state: &state,
            request: &request,
            path: &path,
            seed,
            now: Millis(now_ms),
            rewrites: rewrites.as_deref(),
            sticky_key: sticky_key.as_deref(),
        }),
        Command::Render {
            objects,
            target,
            istio_version,
            flavor,
            out,
            endpoints,
            membership,
            eds_dir,
            listen,
            admin,
            module,
            image,
            no_tenants,
            jwks,
            billing_log,
            per_request_split,
            peers,
            cluster,
            peer_mode,
            peer_api_key_file,
            export_members,
        } => (|| {
            let peers = peers
                .as_deref()
                .map(infergate_cli::config::peers::PeersFile::load)
                .transpose()?;
            let endpoints = endpoints
                .iter()
                .map(|f| endpoints_flag(f))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let jwks = match jwks {
                Some(path) => Some(
                    std::fs::read_to_string(&path)
                        .map_err(|e| anyhow::anyhow!("reading --jwks {}: {e}", path.display()))?,
                ),
                None => None,
            };
            let peer_api_key = match peer_api_key_file {
                Some(path) => Some(
                    std::fs::read_to_string(&path)
                        .map_err(|e| {
                            anyhow::anyhow!("reading --peer-api-key-file {}: {e}", path.display())
                        })?
                        .trim()
                        .to_owned(),
                ),
                None => None,
            };
            let membership = match membership.as_str() {
                "eds" => Membership::Eds,
                "static" => Membership::Static,
                other => anyhow::bail!("--membership {other}: expected eds or static"),
            };
            run_render(&RenderOptions {
                objects,
                target,
                istio_version,
                out,
                membership,
                eds_dir,
                listen,
                admin,
                image,
                gateway: GatewayInputs {
                    flavor,
                    endpoints,
                    module,
                    no_tenants,
                    jwks,
                    billing_log,
                    per_request_split,
                    peers,
                    cluster,
                    peer_mode,
                    peer_api_key,
                    export_members,
                },
            })
        })(),
        Command::Plugins => infergate_cli::catalogue::markdown().map(|m| m.trim_end().to_owned()),
    };
    match result {
        Ok(json) => {
            // A closed pipe (`infergate explain … | head`) ends the output, not the process
            // with a panic.
            let mut out = std::io::stdout().lock();
            match writeln!(out, "{json}").and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("infergate: error: writing the output: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            eprintln!("infergate: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;
    use infergate_cli::reference::{self, Page};

    /// The test that checks, and with `INFERGATE_BLESS=1` rewrites, the book's page.
    const TEST: &str = "cargo test -p infergate-cli --bin infergate cli_reference";

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// `docs/src/cli/infergate.md` is what this parser says.
    #[test]
    fn the_cli_reference_is_current() {
        let page = Page {
            title: "`infergate`",
            source: "cli/src/main.rs",
            test: TEST,
            notes: &[],
        };
        let rendered = reference::markdown(Cli::command(), &page);
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/cli/infergate.md");
        if let Err(e) = reference::check_or_bless(&path, &rendered, TEST) {
            panic!("{e}");
        }
    }
}
