//! `cargo xtask up`: the stack for a person, on the simulated pool, until Ctrl-C.
//!
//! With `--tenants PATH` the gateway runs with the platform's `TenantQuota` and
//! `InferenceObjective` objects, and writes a billing log: `--billing-log FILE`, else
//! `billing.log` in a directory of the run's own under the system temp dir (kept after
//! exit, printed at start-up).
//!
//! With `--epp-config FILE` every pool runs that `EndpointPickerConfig` (flow control
//! included), given as the document itself or as the `ConfigMap` holding it; with
//! `--objectives FILE` the picker maps request objectives to priorities with that file's
//! `InferenceObjective` objects (the router's tenants, when there are any, get them too).
//!
//! With `--rewrites FILE` (YAML or JSON, one or more documents) the router rewrites
//! models with that file's `InferenceModelRewrite` objects; their `spec.poolRef.name`
//! names a pool as `up` names them (`pool-0-sim-model` for the first served model).
//!
//! `--pool NAME=MODEL[@I,J]` lays the pools out by hand (two pools of one model: a
//! canary), `--split MODEL=POOL:W,POOL:W [--sticky-split]` splits a model's traffic across
//! pools through Envoy's weighted clusters, and `--canary-header NAME=VALUE:POOL` sends the
//! requests carrying that header to one pool (see [`super::route_flags`]); a `--pool`
//! named NAME has the cluster (and `poolRef` name) `pool-<index>-<NAME>`. `--routes FILE`
//! reads Gateway API `HTTPRoute` objects verbatim (the seed's `httproute-canary.yaml`),
//! their `backendRefs` naming `--pool`s ([`super::httproute`]).
//!
//! `--gateways N` starts N Envoy gateways of the flavour over the one simulated pool, each
//! its own process with its own ports, admin and log ([`super::fleet`]), and prints
//! `gateway K: URL` for each: put an L4 balancer (or the load generator's
//! `--connections per-request`) in front of them. Each keeps its own picker state.
//!
//! `--clusters N` starts N clusters on loopback, each a gateway over a simulated pool of
//! its own on `127.0.1.<k+1>`, peers of each other ([`super::clusters`]), and prints
//! `cluster K: URL` for each.
//!
//! `--global-quotas` (with `--tenants`) shares the tenants' requests and tokens per minute
//! across the gateways: it starts a Redis of the run's own and the rate-limit service
//! `infergate-ratelimit` over it, and every gateway asks that service through Envoy's
//! `ratelimit` filter ([`super::global_quotas`]); without it each gateway keeps its own
//! buckets.

use super::clusters::Clusters;
use super::envoy::EnvoyOptions;
use super::fleet::Fleet;
use super::httproute;
use super::route_flags::{
    self, parse_canary, parse_pool, parse_split, CanaryFlag, PoolFlag, SplitFlag,
};
use super::stack::{Backends, PoolSpec, Stack, StackOptions};
use crate::sim::SimConfig;
use anyhow::{bail, Context, Result};
use infergate_cli::config::bootstrap::Flavor;
use infergate_cli::config::bootstrap::{PeerMode, Peers};
use infergate_cli::config::epp::{load_epp_config, load_objectives};
use infergate_cli::config::tenancy::{load_objects, Tenancy};
use std::path::{Path, PathBuf};
use tokio::signal::unix::{signal, SignalKind};

/// Options of `cargo xtask up`, and its flags.
#[derive(clap::Args, Clone, Debug)]
pub struct UpOptions {
    /// The gateway's flavour: wasm, native or plain (no gateway filter).
    #[arg(
        long,
        alias = "flavour",
        value_name = "wasm|native|plain",
        default_value = "wasm"
    )]
    pub flavor: Flavor,
    /// Simulated replicas.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub replicas: usize,
    /// Envoy worker threads.
    #[arg(long, value_name = "C", default_value_t = 2)]
    pub concurrency: u32,
    /// A `SimConfig` file (YAML/JSON); the simulator's calibration defaults otherwise.
    #[arg(long, value_name = "FILE")]
    pub sim_config: Option<PathBuf>,
    /// A directory or multi-document file of `TenantQuota` and `InferenceObjective`
    /// objects; the gateway runs with them and writes a billing log.
    #[arg(verbatim_doc_comment, long, value_name = "PATH")]
    pub tenants: Option<PathBuf>,
    /// Where Envoy writes one line per billed request (with `--tenants` and no
    /// `--billing-log`: billing.log in a directory of the run's own, printed at start-up).
    #[arg(verbatim_doc_comment, long, value_name = "FILE")]
    pub billing_log: Option<PathBuf>,
    /// An `EndpointPickerConfig`, or a `ConfigMap` holding one, for every pool (the
    /// picker's defaults otherwise).
    #[arg(verbatim_doc_comment, long, value_name = "FILE")]
    pub epp_config: Option<PathBuf>,
    /// `InferenceObjective` objects for every pool.
    #[arg(long, value_name = "FILE")]
    pub objectives: Option<PathBuf>,
    /// `InferenceModelRewrite` objects for the router (their `spec.poolRef.name` names a
    /// pool as `up` names them: `pool-0-sim-model` for the first served model).
    #[arg(verbatim_doc_comment, long, value_name = "FILE")]
    pub rewrites: Option<PathBuf>,
    /// A pool named NAME serving MODEL on those replica indices (every replica without
    /// `@`), repeatable, in order; given once or more, these replace the default pools
    /// (one per served model), and its cluster is `pool-<index>-<NAME>`.
    #[arg(verbatim_doc_comment, long = "pool", value_name = "NAME=MODEL[@I,J]", value_parser = parse_pool)]
    pub pools: Vec<PoolFlag>,
    /// MODEL's traffic split across pools (a `--pool` name or index) by weight through
    /// Envoy's weighted clusters, repeatable.
    #[arg(verbatim_doc_comment, long = "split", value_name = "MODEL=POOL:W,POOL:W", value_parser = parse_split)]
    pub splits: Vec<SplitFlag>,
    /// Every split (and `--routes`) draws from `x-gateway-split-key`: one pool per
    /// conversation.
    #[arg(verbatim_doc_comment, long)]
    pub sticky_split: bool,
    /// Requests carrying that header go to POOL, ahead of any split; repeatable.
    #[arg(long = "canary-header", value_name = "NAME=VALUE:POOL", value_parser = parse_canary)]
    pub canaries: Vec<CanaryFlag>,
    /// Gateway API `HTTPRoute` objects read verbatim, their `backendRefs` naming `--pool`s
    /// by name, with weights.
    #[arg(verbatim_doc_comment, long, value_name = "FILE")]
    pub routes: Option<PathBuf>,
    /// Envoy gateways over the one simulated pool, each its own process with its own
    /// ports (at least 1).
    #[arg(verbatim_doc_comment, long, value_name = "N", default_value_t = 1, value_parser = parse_gateways)]
    pub gateways: usize,
    /// With `--tenants`: the tenants' RPM and TPM shared across the gateways through the
    /// global rate-limit service (on a Redis of the run's own).
    #[arg(verbatim_doc_comment, long)]
    pub global_quotas: bool,
    /// STATIC pool clusters holding the replicas, instead of EDS ones the gateway follows
    /// (the default).
    #[arg(verbatim_doc_comment, long)]
    pub static_membership: bool,
    /// N clusters (at least 2), each a gateway over a simulated pool of its own on the
    /// loopback address 127.0.1.<k+1>; each exports its pools and lists the other
    /// clusters' gateways as peers.
    #[arg(verbatim_doc_comment, long, value_name = "N", default_value_t = 1, value_parser = parse_clusters)]
    pub clusters: usize,
    /// With --clusters: how a cluster reaches its peers, `parent` (through their gateways)
    /// or `endpoint` (straight to the replicas their gateways publish).
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "MODE",
        default_value = "parent"
    )]
    pub peer_mode: PeerMode,
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            flavor: Flavor::Wasm,
            replicas: 4,
            concurrency: 2,
            sim_config: None,
            tenants: None,
            billing_log: None,
            epp_config: None,
            objectives: None,
            rewrites: None,
            pools: Vec::new(),
            splits: Vec::new(),
            sticky_split: false,
            canaries: Vec::new(),
            routes: None,
            gateways: 1,
            global_quotas: false,
            static_membership: false,
            clusters: 1,
            peer_mode: PeerMode::Parent,
        }
    }
}

impl UpOptions {
    /// Parses `up`'s flags (`args` without the command) and [`UpOptions::check`]s them.
    pub fn parse(args: &[String]) -> Result<Self> {
        let opts: UpOptions = crate::bench::cli::parse_flags(args)?;
        opts.check()?;
        Ok(opts)
    }

    /// What the flags cannot say alone: the flags that need a gateway flavour are not
    /// given with `plain`, and `--global-quotas` has what it needs.
    pub fn check(&self) -> Result<()> {
        if self.flavor == Flavor::Plain {
            let gateway_only = [
                ("--tenants", self.tenants.is_some()),
                ("--billing-log", self.billing_log.is_some()),
                ("--epp-config", self.epp_config.is_some()),
                ("--objectives", self.objectives.is_some()),
                ("--rewrites", self.rewrites.is_some()),
            ];
            if let Some((flag, _)) = gateway_only.iter().find(|(_, set)| *set) {
                bail!("{flag} needs a gateway flavour (wasm or native), not plain");
            }
        }
        if self.clusters > 1 {
            if self.flavor == Flavor::Plain {
                bail!("--clusters needs a gateway flavour (wasm or native), not plain");
            }
            if self.gateways > 1 || self.global_quotas {
                bail!("--clusters runs one gateway per cluster: no --gateways, no --global-quotas");
            }
        } else if self.peer_mode != PeerMode::Parent {
            bail!("--peer-mode needs --clusters");
        }
        check_global_quotas(self)
    }
}

/// The tenancy `opts` asks for: the objects at `--tenants` (at least one), and the billing
/// log at `--billing-log` (made absolute; its directory must exist).
pub fn tenancy(opts: &UpOptions) -> Result<Tenancy> {
    let mut tenancy = Tenancy::default();
    if let Some(path) = &opts.tenants {
        tenancy.objects = load_objects(path).context("--tenants")?;
        if tenancy.objects.is_empty() {
            bail!(
                "--tenants {}: no TenantQuota or InferenceObjective object in it",
                path.display()
            );
        }
    }
    if let Some(file) = &opts.billing_log {
        let file = std::path::absolute(file)
            .with_context(|| format!("--billing-log {}", file.display()))?;
        match file.parent() {
            Some(dir) if dir.is_dir() => {}
            _ => bail!(
                "--billing-log {}: its directory does not exist",
                file.display()
            ),
        }
        tenancy.billing_log = Some(file);
    }
    Ok(tenancy)
}

/// `billing.log` in a fresh directory of this run under the system temp dir, which
/// outlives the run (the log is what a person looks at afterwards).
pub fn default_billing_log() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("infergate-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.join("billing.log"))
}

/// The stack `up` starts: the in-process simulator (calibration defaults, or
/// `--sim-config`), one pool per served model name, Envoy of the chosen flavour.
pub fn stack_options(opts: &UpOptions) -> Result<StackOptions> {
    let mut sim = match &opts.sim_config {
        Some(path) => SimConfig::from_file(path)
            .with_context(|| format!("reading simulator config {}", path.display()))?,
        None => SimConfig::default(),
    };
    sim.replicas = u32::try_from(opts.replicas).context("--replicas")?;
    // Every served name is a base model of its own pool over all replicas; the adapters
    // belong to the first (the simulator reports them on its base model).
    let mut pools: Vec<PoolSpec> = sim.models.iter().map(PoolSpec::all).collect();
    if let Some(first) = pools.first_mut() {
        first.adapters = sim.loras.clone();
    }
    // Pools laid out by hand: each pool of the first model serves its adapters too.
    if !opts.pools.is_empty() {
        let first_model = sim.models.first().cloned();
        pools = route_flags::pools(&opts.pools, pools);
        for pool in &mut pools {
            if Some(&pool.base_model) == first_model.as_ref() {
                pool.adapters = sim.loras.clone();
            }
        }
    }
    let mut routes = Vec::new();
    if let Some(path) = &opts.routes {
        let objects = load_objects(path).context("--routes")?;
        if objects.is_empty() {
            bail!("--routes {}: no HTTPRoute in it", path.display());
        }
        routes = httproute::routes(&objects, &pools, opts.sticky_split)
            .with_context(|| format!("--routes {}", path.display()))?;
    }
    routes.extend(route_flags::routes(
        &pools,
        &opts.splits,
        opts.sticky_split,
        &opts.canaries,
    )?);
    if let Some(path) = &opts.epp_config {
        let config = load_epp_config(path).context("--epp-config")?;
        for pool in &mut pools {
            pool.picker_config = config.clone();
        }
    }
    let mut stack_opts = StackOptions::new(opts.flavor, Backends::InProcess(Box::new(sim)));
    stack_opts.pools = pools;
    if opts.static_membership {
        stack_opts.membership = infergate_cli::config::eds::Membership::Static;
    }
    stack_opts.routes = routes;
    stack_opts.envoy = EnvoyOptions {
        concurrency: opts.concurrency,
        ..EnvoyOptions::default()
    };
    stack_opts.tenancy = tenancy(opts)?;
    if let Some(path) = &opts.objectives {
        stack_opts.objectives = load_objectives(path).context("--objectives")?;
        // The router's tenants name objectives too (their records carry the priority):
        // with tenants, it gets the same objects as the picker.
        if !stack_opts.tenancy.objects.is_empty() {
            for object in &stack_opts.objectives {
                if !stack_opts.tenancy.objects.contains(object) {
                    stack_opts.tenancy.objects.push(object.clone());
                }
            }
        }
    }
    if let Some(path) = &opts.rewrites {
        stack_opts.rewrites = load_objects(path).context("--rewrites")?;
        if stack_opts.rewrites.is_empty() {
            bail!("--rewrites {}: no object in it", path.display());
        }
        check_rewrites(&stack_opts).with_context(|| format!("--rewrites {}", path.display()))?;
    }
    Ok(stack_opts)
}

/// Compiles the rewrites against the pools as the router will, so that a mistake (a
/// `poolRef.name` that is not one of `up`'s pool names, a target the simulator does not
/// serve) is reported before Envoy starts, with the pools' names.
fn check_rewrites(opts: &StackOptions) -> Result<()> {
    let pools: Vec<infergate_filters::router::PoolModels> = opts
        .pools
        .iter()
        .enumerate()
        .map(|(i, p)| infergate_filters::router::PoolModels {
            name: infergate_cli::config::bootstrap::pool_cluster_name(
                i,
                p.name.as_deref().unwrap_or(&p.base_model),
            ),
            base_model: p.base_model.clone(),
            adapters: p.adapters.clone(),
            block_size_tokens: None,
        })
        .collect();
    if let Err(e) = infergate_filters::rewrite::Rewrites::compile(&opts.rewrites, &pools) {
        let served: Vec<String> = pools
            .iter()
            .map(|p| {
                format!(
                    "{} (base {}, adapters {:?})",
                    p.name, p.base_model, p.adapters
                )
            })
            .collect();
        bail!("{e}; up's pools: {}", served.join(", "));
    }
    Ok(())
}

/// The two lines `up` prints on stdout: `picker: URL` and `baseline: URL`.
pub fn announcement(stack: &Stack) -> [String; 2] {
    [
        format!("picker: {}", stack.picker_url()),
        format!("baseline: {}", stack.baseline_url()),
    ]
}

/// The line `up` prints on stdout when it writes a billing log: `billing log: PATH`.
pub fn billing_log_line(file: &Path) -> String {
    format!("billing log: {}", file.display())
}

/// Brings the stack up, prints `picker: URL` and `baseline: URL` on lines of their own
/// (and `billing log: PATH` with a billing log), and keeps it up until SIGINT or SIGTERM;
/// then stops Envoy and the simulator.
pub async fn up(mut opts: UpOptions) -> Result<()> {
    // Installed first, so a signal that arrives while Envoy starts still ends in a clean stop.
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    if opts.tenants.is_some() && opts.billing_log.is_none() {
        opts.billing_log = Some(default_billing_log()?);
    }
    let mut stack_opts = stack_options(&opts)?;
    let _global_quotas = start_global_quotas(&opts, &mut stack_opts)?;
    let billing_log = stack_opts.tenancy.billing_log.clone();
    if opts.clusters > 1 {
        for pool in &mut stack_opts.pools {
            pool.peers = Some(Peers {
                mode: opts.peer_mode,
                ..Peers::default()
            });
        }
        let clusters = Clusters::start(stack_opts, opts.clusters).await?;
        for (k, gateway) in clusters.gateways().iter().enumerate() {
            println!("cluster {k}: {}", gateway.picker_url());
        }
        for (k, gateway) in clusters.gateways().iter().enumerate() {
            eprintln!(
                "cluster {k}: replicas {:?}, Envoy admin http://{}, log {}",
                gateway.replicas(),
                gateway.envoy().admin(),
                gateway.envoy().log_path().display()
            );
        }
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("stopping the clusters");
        drop(clusters);
        return Ok(());
    }
    // Every gateway from the same options (`--gateways N`; one by default).
    let fleet = Fleet::start(stack_opts, opts.gateways).await?;
    for line in fleet_announcement(&fleet) {
        println!("{line}");
    }
    if billing_log.is_some() {
        for file in fleet.billing_logs() {
            println!("{}", billing_log_line(file));
        }
    }
    for line in fleet_details(&fleet) {
        eprintln!("{line}");
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("stopping Envoy and the simulator");
    drop(fleet);
    Ok(())
}

/// `--clusters N`: at least 1 (1, the default, is a single cluster).
fn parse_clusters(value: &str) -> Result<usize> {
    match value.parse::<usize>() {
        Ok(n) if (1..=254).contains(&n) => Ok(n),
        _ => bail!("expected a number of clusters, 1 to 254"),
    }
}

// ---- Several gateways (`--gateways N`) ----

/// `--gateways N`: a positive count.
fn parse_gateways(value: &str) -> Result<usize> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("expected a number of gateways, at least 1"),
    }
}

/// What `up` prints on stdout for its gateways: one gateway, [`announcement`]'s two lines
/// (`picker: URL`, `baseline: URL`); several, `gateway K: URL` for each, then gateway 0's
/// `baseline: URL`.
pub fn fleet_announcement(fleet: &Fleet) -> Vec<String> {
    match fleet.gateways() {
        [one] => announcement(one).to_vec(),
        many => many
            .iter()
            .enumerate()
            .map(|(k, g)| format!("gateway {k}: {}", g.picker_url()))
            .chain(
                many.first()
                    .map(|g| format!("baseline: {}", g.baseline_url())),
            )
            .collect(),
    }
}

/// What `up` prints on stderr: the flavour and replica count, then each gateway's admin
/// address and log.
fn fleet_details(fleet: &Fleet) -> Vec<String> {
    let flavor = fleet
        .gateways()
        .first()
        .map(|g| g.flavor().to_string())
        .unwrap_or_default();
    let mut lines = vec![format!(
        "flavour {flavor}, {} replicas, {} gateway(s); Ctrl-C stops",
        fleet.replicas().len(),
        fleet.len()
    )];
    lines.extend(fleet.gateways().iter().enumerate().map(|(k, g)| {
        format!(
            "gateway {k}: Envoy admin http://{}, log {}",
            g.envoy().admin(),
            g.envoy().log_path().display()
        )
    }));
    // Every gateway reads gateway 0's EDS files: rewriting one changes its pool's members.
    if let Some(eds) = fleet.gateways().first().and_then(Stack::eds) {
        lines.push(format!(
            "pool members (EDS, read by every gateway): {}",
            eds.dir().display()
        ));
    }
    lines
}

// ---- end of several gateways ----

// ---- Global quotas (`--global-quotas`) ----

/// `--global-quotas` needs tenants (whose limits it shares) and a gateway flavour.
fn check_global_quotas(opts: &UpOptions) -> Result<()> {
    if !opts.global_quotas {
        return Ok(());
    }
    if opts.flavor == Flavor::Plain {
        bail!("--global-quotas needs a gateway flavour (wasm or native), not plain");
    }
    if opts.tenants.is_none() {
        bail!("--global-quotas needs --tenants (the quotas it shares)");
    }
    Ok(())
}

/// With `--global-quotas`: starts Redis and the rate-limit service with the tenants'
/// objects, points every gateway's options at it, and prints where they are; the backend
/// runs as long as the value is kept.
fn start_global_quotas(
    opts: &UpOptions,
    stack_opts: &mut StackOptions,
) -> Result<Option<super::global_quotas::GlobalQuotaBackend>> {
    if !opts.global_quotas {
        return Ok(None);
    }
    let backend = super::global_quotas::GlobalQuotaBackend::start(&stack_opts.tenancy.objects)
        .context("--global-quotas")?;
    let quotas = backend.quotas();
    eprintln!(
        "global quotas: rate-limit service {} (domain {}), redis {}",
        quotas.service,
        quotas.domain,
        backend.redis().url()
    );
    stack_opts.global_quotas = Some(quotas);
    Ok(Some(backend))
}

// ---- end of global quotas ----

/// Runs [`up`] on a fresh Tokio runtime (for the synchronous xtask entry point).
pub fn up_blocking(opts: UpOptions) -> Result<()> {
    super::runtime()?.block_on(up(opts))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse_with_defaults_and_errors() {
        let o = UpOptions::parse(&strings(&["--flavor", "native", "--replicas", "8"])).unwrap();
        assert_eq!(
            (o.flavor, o.replicas, o.concurrency),
            (Flavor::Native, 8, 2)
        );
        let o = UpOptions::parse(&strings(&["--sim-config", "s.yaml"])).unwrap();
        assert_eq!(o.flavor, Flavor::Wasm);
        assert_eq!(o.sim_config, Some(PathBuf::from("s.yaml")));
        assert!(UpOptions::parse(&strings(&["--replicas"])).is_err());
        assert!(UpOptions::parse(&strings(&["--flavor", "grpc"])).is_err());
        assert!(UpOptions::parse(&strings(&["--bogus"])).is_err());
    }

    #[test]
    fn tenants_and_billing_log_parse_and_need_a_gateway_flavour() {
        let o = UpOptions::parse(&strings(&["--tenants", "t/", "--billing-log", "b.log"])).unwrap();
        assert_eq!(o.tenants, Some(PathBuf::from("t/")));
        assert_eq!(o.billing_log, Some(PathBuf::from("b.log")));
        let o = UpOptions::parse(&strings(&["--flavor", "native", "--tenants", "t"])).unwrap();
        assert_eq!((o.flavor, o.billing_log), (Flavor::Native, None));
        assert!(UpOptions::parse(&strings(&["--tenants"])).is_err());
        assert!(UpOptions::parse(&strings(&["--billing-log"])).is_err());
        for flag in [
            "--tenants",
            "--billing-log",
            "--epp-config",
            "--objectives",
            "--rewrites",
        ] {
            let err = UpOptions::parse(&strings(&["--flavor", "plain", flag, "x"])).unwrap_err();
            assert!(err.to_string().contains("plain"), "{err}");
            assert!(err.to_string().contains(flag), "{err}");
        }
    }

    #[test]
    fn the_stack_gets_the_objects_and_the_billing_log() {
        let dir = crate::launch::process::RunDir::new("up-tenants").unwrap();
        let quotas = dir.path().join("quotas.yaml");
        std::fs::write(
            &quotas,
            "kind: TenantQuota\nmetadata: {name: a}\n---\nkind: InferenceObjective\n\
             metadata: {name: p}\n",
        )
        .unwrap();
        let log = dir.path().join("billing.log");
        let opts = UpOptions {
            tenants: Some(quotas.clone()),
            billing_log: Some(log.clone()),
            ..UpOptions::default()
        };
        let t = stack_options(&opts).unwrap().tenancy;
        assert_eq!(t.objects.len(), 2);
        assert_eq!(t.objects[1]["kind"], "InferenceObjective");
        assert_eq!(t.billing_log, Some(log));
        assert!(t.jwt.is_none());
        assert!(stack_options(&UpOptions::default())
            .unwrap()
            .tenancy
            .is_empty());

        let empty = dir.path().join("empty.yaml");
        std::fs::write(&empty, "# nothing\n").unwrap();
        let no_objects = UpOptions {
            tenants: Some(empty),
            ..UpOptions::default()
        };
        assert!(stack_options(&no_objects).is_err());
        let nowhere = UpOptions {
            billing_log: Some(dir.path().join("no/such/dir/billing.log")),
            ..UpOptions::default()
        };
        let err = format!("{:#}", stack_options(&nowhere).unwrap_err());
        assert!(err.contains("no/such/dir"), "{err}");
        assert_eq!(
            billing_log_line(Path::new("/x/billing.log")),
            "billing log: /x/billing.log"
        );
    }

    #[test]
    fn epp_config_and_objectives_parse() {
        let o = UpOptions::parse(&strings(&[
            "--flavor",
            "native",
            "--epp-config",
            "cm.yaml",
            "--objectives",
            "o.yaml",
        ]))
        .unwrap();
        assert_eq!(o.epp_config, Some(PathBuf::from("cm.yaml")));
        assert_eq!(o.objectives, Some(PathBuf::from("o.yaml")));
        assert!(UpOptions::parse(&strings(&["--epp-config"])).is_err());
        assert!(UpOptions::parse(&strings(&["--objectives"])).is_err());
        let err = UpOptions::parse(&strings(&["--nope"])).unwrap_err();
        assert!(err.to_string().contains("--nope"), "{err}");
    }

    /// The seed's files as `up` reads them: every pool runs the ConfigMap's
    /// `EndpointPickerConfig`, and the objectives reach the picker (and, with tenants, the
    /// router, each object once).
    #[test]
    fn every_pool_gets_the_epp_config_and_the_picker_the_objectives() {
        let testdata = infergate_artefacts::workspace_root().join("testdata");
        let dir = crate::launch::process::RunDir::new("up-epp").unwrap();
        let sim = dir.path().join("sim.yaml");
        std::fs::write(&sim, "models: [m1, m2]\n").unwrap();
        let opts = UpOptions {
            sim_config: Some(sim.clone()),
            epp_config: Some(testdata.join("epp/epp-config-configmap.yaml")),
            objectives: Some(testdata.join("tenants/objectives.yaml")),
            ..UpOptions::default()
        };
        let s = stack_options(&opts).unwrap();
        assert_eq!(s.pools.len(), 2);
        for pool in &s.pools {
            assert_eq!(pool.picker_config["kind"], "EndpointPickerConfig");
            assert_eq!(
                pool.picker_config["flowControl"]["saturationDetector"]["pluginRef"],
                "concurrency-detector"
            );
        }
        let names: Vec<&str> = s
            .objectives
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["premium-traffic", "standard-traffic", "best-effort-traffic"]
        );
        assert!(
            s.tenancy.objects.is_empty(),
            "no tenants: the router gets none"
        );

        // With the tenants directory (which holds the same objectives file): once each.
        let with_tenants = UpOptions {
            tenants: Some(testdata.join("tenants")),
            ..opts.clone()
        };
        let s = stack_options(&with_tenants).unwrap();
        let objectives = s
            .tenancy
            .objects
            .iter()
            .filter(|o| o["kind"] == "InferenceObjective")
            .count();
        assert_eq!(objectives, 3);

        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "kind: Service\n").unwrap();
        for opts in [
            UpOptions {
                epp_config: Some(bad.clone()),
                ..UpOptions::default()
            },
            UpOptions {
                objectives: Some(bad.clone()),
                ..UpOptions::default()
            },
        ] {
            let err = format!("{:#}", stack_options(&opts).unwrap_err());
            assert!(err.contains("bad.yaml"), "{err}");
        }
        assert!(stack_options(&UpOptions::default())
            .unwrap()
            .objectives
            .is_empty());
    }

    /// The contract with the module: the seed's ConfigMap and objectives, as `up` passes
    /// them, are a picker configuration the picker compiles, flow control included; a band
    /// naming a policy the config does not declare is refused the same way.
    #[test]
    fn the_seed_files_make_a_picker_configuration_the_picker_compiles() {
        use infergate_cli::config::bootstrap::{GatewaySettings, PluginConfigs};
        use infergate_cli::config::epp::{apply_objectives, picker_objectives};
        use infergate_filters::picker::PickerShared;
        let testdata = infergate_artefacts::workspace_root().join("testdata");
        let opts = UpOptions {
            epp_config: Some(testdata.join("epp/epp-config-configmap.yaml")),
            objectives: Some(testdata.join("tenants/objectives.yaml")),
            tenants: Some(testdata.join("tenants")),
            ..UpOptions::default()
        };
        let s = stack_options(&opts).unwrap();
        let replicas = [std::net::SocketAddr::from(([127, 0, 0, 1], 8000))];
        let picker = |pools: &[crate::launch::stack::PoolSpec]| {
            let pools: Vec<_> = pools
                .iter()
                .map(|p| p.resolve(&replicas).unwrap())
                .collect();
            let mut picker = PluginConfigs::for_pools(&pools, &GatewaySettings::default()).picker;
            let objectives = picker_objectives(&s.objectives, &s.tenancy).unwrap();
            apply_objectives(&mut picker, &objectives).unwrap();
            picker.as_object_mut().unwrap().remove("role");
            picker
        };
        let config = picker(&s.pools);
        assert_eq!(config["objectives"].as_array().unwrap().len(), 3);
        if let Err(e) = PickerShared::from_json(config) {
            panic!("the seed's configuration does not compile: {e}");
        }
        let mut dangling = s.pools.clone();
        dangling[0].picker_config["flowControl"]["priorityBands"][0]["fairnessPolicyRef"] =
            "no-such-policy".into();
        let err = PickerShared::from_json(picker(&dangling)).err().unwrap();
        assert!(err.to_string().contains("no-such-policy"), "{err}");
    }

    /// `up --help`: clap's help of [`UpOptions`].
    fn help() -> String {
        use clap::Args;
        UpOptions::augment_args(clap::Command::new("up"))
            .render_long_help()
            .to_string()
    }

    #[test]
    fn membership_is_eds_unless_static_is_asked_for() {
        let eds = stack_options(&UpOptions::default()).unwrap();
        assert_eq!(eds.membership, infergate_cli::config::eds::Membership::Eds);
        let o = UpOptions::parse(&strings(&["--static-membership"])).unwrap();
        assert!(o.static_membership);
        let fixed = stack_options(&o).unwrap();
        assert_eq!(
            fixed.membership,
            infergate_cli::config::eds::Membership::Static
        );
        assert!(help().contains("--static-membership"));
    }

    #[test]
    fn gateways_parse() {
        assert_eq!(UpOptions::parse(&[]).unwrap().gateways, 1);
        let o = UpOptions::parse(&strings(&["--gateways", "4"])).unwrap();
        assert_eq!(o.gateways, 4);
        for bad in [
            &["--gateways", "0"][..],
            &["--gateways", "x"],
            &["--gateways"],
        ] {
            assert!(UpOptions::parse(&strings(bad)).is_err(), "{bad:?}");
        }
        assert!(help().contains("--gateways <N>"));
    }

    #[test]
    fn clusters_parse_and_exclude_what_one_cluster_has_alone() {
        assert_eq!(UpOptions::parse(&[]).unwrap().clusters, 1);
        let o = UpOptions::parse(&strings(&["--clusters", "3"])).unwrap();
        assert_eq!(o.clusters, 3);
        assert_eq!(o.peer_mode, PeerMode::Parent);
        let o = UpOptions::parse(&strings(&["--clusters", "2", "--peer-mode", "endpoint"]));
        assert_eq!(o.unwrap().peer_mode, PeerMode::Endpoint);
        for bad in [
            &["--clusters", "0"][..],
            &["--clusters", "255"],
            &["--clusters", "2", "--gateways", "2"],
            &["--clusters", "2", "--flavor", "plain"],
            &["--clusters", "2", "--peer-mode", "sideways"],
            &["--peer-mode", "endpoint"],
        ] {
            assert!(UpOptions::parse(&strings(bad)).is_err(), "{bad:?}");
        }
        assert!(help().contains("--clusters <N>"));
    }

    #[test]
    fn help_names_every_flag_within_100_columns() {
        let help = help();
        for line in help.lines() {
            assert!(line.chars().count() <= 100, "{line}");
        }
        for flag in [
            "--flavor",
            "--replicas",
            "--pool <NAME=MODEL[@I,J]>",
            "--split <MODEL=POOL:W,POOL:W>",
            "--sticky-split",
            "--canary-header <NAME=VALUE:POOL>",
            "--rewrites",
        ] {
            assert!(help.contains(flag), "{flag}");
        }
    }

    /// The seed's canary as flags: two named pools of the simulator's model, split 90/10
    /// on the sticky key, and `x-canary: fp8` to the canary pool first; the stack's routes
    /// and pools say exactly that, and the cluster names carry the pool names.
    #[test]
    fn pool_split_and_canary_flags_become_the_stacks_pools_and_routes() {
        let o = UpOptions::parse(&strings(&[
            "--replicas",
            "4",
            "--pool",
            "bf16=sim-model@0,1,2",
            "--pool",
            "fp8=sim-model@3",
            "--split",
            "sim-model=bf16:90,fp8:10",
            "--sticky-split",
            "--canary-header",
            "x-canary=fp8:fp8",
        ]))
        .unwrap();
        let s = stack_options(&o).unwrap();
        assert_eq!(s.pools.len(), 2);
        assert_eq!(s.pools[0].replicas, [0, 1, 2]);
        assert_eq!(s.pools[1].name.as_deref(), Some("fp8"));
        assert_eq!(
            s.routes,
            [
                crate::launch::RouteSpec::to("sim-model", 1).when_header("x-canary", "fp8"),
                crate::launch::RouteSpec::split("sim-model", &[(0, 90), (1, 10)]).sticky(),
            ]
        );
        let replicas: Vec<_> = (0..4)
            .map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], 8000 + p)))
            .collect();
        let pools: Vec<_> = s
            .pools
            .iter()
            .map(|p| p.resolve(&replicas).unwrap())
            .collect();
        assert_eq!(
            infergate_cli::config::bootstrap::cluster_names(&pools),
            ["pool-0-bf16", "pool-1-fp8"]
        );
        for bad in [
            &["--split", "sim-model=bf16:1,nope:1"][..],
            &["--pool", "a=sim-model", "--pool", "b=sim-model"][..],
            &["--canary-header", "x=y:7"][..],
        ] {
            let o = UpOptions::parse(&strings(bad)).unwrap();
            let built = stack_options(&o).and_then(|s| {
                let replicas = [std::net::SocketAddr::from(([127, 0, 0, 1], 8000))];
                let pools: Vec<_> = s
                    .pools
                    .iter()
                    .map(|p| p.resolve(&replicas))
                    .collect::<Result<_>>()?;
                infergate_cli::config::routes::resolve(&pools, &s.routes)
            });
            assert!(built.is_err(), "{bad:?}");
        }
        assert!(UpOptions::parse(&strings(&["--split", "m=a:1"])).is_err());
    }

    /// `--routes` reads the seed's `HTTPRoute` verbatim over pools named like its
    /// `InferencePool`s: the 90/10 split, sticky with `--sticky-split`.
    #[test]
    fn routes_reads_the_seeds_httproute() {
        let dir = crate::launch::process::RunDir::new("up-routes").unwrap();
        let route = dir.path().join("httproute-canary.yaml");
        std::fs::write(
            &route,
            "kind: HTTPRoute\nmetadata: {name: llama-70b}\nspec:\n  rules:\n  - matches:\n\
             \x20   - headers: [{name: X-Gateway-Base-Model-Name, value: llama-70b}]\n\
             \x20   backendRefs:\n\
             \x20   - {kind: InferencePool, name: llama-70b-bf16, weight: 90}\n\
             \x20   - {kind: InferencePool, name: llama-70b-fp8, weight: 10}\n",
        )
        .unwrap();
        let sim = dir.path().join("sim.yaml");
        std::fs::write(&sim, "models: [llama-70b]\n").unwrap();
        let o = UpOptions::parse(&strings(&[
            "--sim-config",
            &sim.to_string_lossy(),
            "--pool",
            "llama-70b-bf16=llama-70b@0,1,2",
            "--pool",
            "llama-70b-fp8=llama-70b@3",
            "--routes",
            &route.to_string_lossy(),
            "--sticky-split",
        ]))
        .unwrap();
        let s = stack_options(&o).unwrap();
        assert_eq!(
            s.routes,
            [crate::launch::RouteSpec::split("llama-70b", &[(0, 90), (1, 10)]).sticky()]
        );
        let unnamed = UpOptions {
            pools: Vec::new(),
            ..o
        };
        let err = format!("{:#}", stack_options(&unnamed).unwrap_err());
        assert!(err.contains("llama-70b-bf16"), "{err}");
    }

    /// `--rewrites` loads the objects, checked against `up`'s pools (the seed's names a
    /// pool `up` does not have); the stack adds them to the router configuration with the
    /// split setting.
    #[test]
    fn rewrites_are_checked_and_reach_the_router_configuration() {
        let seed = infergate_artefacts::workspace_root()
            .join("testdata/rewrite/inferencemodelrewrite.yaml");
        let o = UpOptions::parse(&strings(&["--rewrites", &seed.to_string_lossy()])).unwrap();
        let err = format!("{:#}", stack_options(&o).unwrap_err());
        assert!(
            err.contains("llama-70b-bf16") && err.contains("pool-0-sim-model"),
            "{err}"
        );
        // The same object over a simulator serving the adapters, naming up's pool.
        let dir = crate::launch::process::RunDir::new("up-rewrites").unwrap();
        let sim = dir.path().join("sim.yaml");
        std::fs::write(
            &sim,
            "loras: [support-assistant-v1, support-assistant-v2]\n",
        )
        .unwrap();
        let text = std::fs::read_to_string(&seed)
            .unwrap()
            .replace("name: llama-70b-bf16", "name: pool-0-sim-model");
        let rewrites = dir.path().join("rewrites.yaml");
        std::fs::write(&rewrites, text).unwrap();
        let o = UpOptions::parse(&strings(&[
            "--sim-config",
            &sim.to_string_lossy(),
            "--rewrites",
            &rewrites.to_string_lossy(),
        ]))
        .unwrap();
        let s = stack_options(&o).unwrap();
        assert_eq!(s.rewrites.len(), 1);
        assert_eq!(s.rewrites[0]["kind"], "InferenceModelRewrite");
        assert_eq!(
            s.rewrites[0]["spec"]["rules"][0]["targets"][1]["weight"],
            10
        );
        let mut router = serde_json::json!({"role": "router"});
        let split = infergate_cli::config::rewrites::Split {
            mode: infergate_cli::config::rewrites::SplitMode::PerRequest,
            session_header: Some("x-session-id".into()),
        };
        infergate_cli::config::rewrites::apply_rewrites(&mut router, &s.rewrites, Some(&split))
            .unwrap();
        assert_eq!(
            router["modelRewrites"],
            serde_json::Value::from(s.rewrites.clone())
        );
        assert_eq!(
            router["split"],
            serde_json::json!({"mode": "perRequest", "sessionHeader": "x-session-id"})
        );
        assert!(UpOptions::parse(&strings(&["--rewrites"])).is_err());
    }
    #[test]
    fn global_quotas_need_tenants_and_a_gateway_flavour() {
        let o = UpOptions::parse(&strings(&[
            "--flavor",
            "native",
            "--gateways",
            "2",
            "--tenants",
            "t/",
            "--global-quotas",
        ]))
        .unwrap();
        assert!(o.global_quotas);
        assert!(!UpOptions::parse(&[]).unwrap().global_quotas);
        let err = UpOptions::parse(&strings(&["--global-quotas"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--tenants"), "{err}");
        let err = UpOptions::parse(&strings(&["--flavor", "plain", "--global-quotas"]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("plain"), "{err}");
    }
}
