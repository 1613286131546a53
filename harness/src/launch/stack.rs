//! The whole stack for a test, a benchmark or a demo: the engine replicas (the simulator,
//! or backends the caller already runs) and one Envoy of a chosen flavour in front of them.

use super::envoy::{Envoy, EnvoyOptions};
use super::process::RunDir;
use super::sim::SimProcess;
use crate::sim::{SimConfig, SimHandle};
use anyhow::{bail, Context, Result};
use infergate_cli::config::bootstrap::write_eds_files;
use infergate_cli::config::bootstrap::{
    render, BootstrapParams, ClientTimeouts, FailureMode, Flavor, GatewaySettings, Peers,
    PluginConfigs, Pool,
};
use infergate_cli::config::eds::{EdsDir, Membership};
use infergate_cli::config::rewrites::{apply_rewrites, Split};
use infergate_cli::config::routes::RouteSpec;
use infergate_cli::config::tenancy::{Tenancy, BILLING_LOG_FLUSH, FILE_FLUSH_FLAG};
use std::net::SocketAddr;
use std::time::Duration;

/// The model name pools serve when the caller names none: the simulator's default.
pub const DEFAULT_MODEL: &str = "sim-model";

/// Where the replicas come from.
#[derive(Clone, Debug)]
pub enum Backends {
    /// Start `infergate-sim --replicas N --port 0 <args…>`.
    Simulator {
        /// Number of replicas.
        replicas: usize,
        /// Extra simulator arguments (calibration, models, …).
        args: Vec<String>,
    },
    /// Run the simulator in this process (`crate::sim::start`); its `replicas` count wins.
    InProcess(Box<SimConfig>),
    /// Replicas the caller already runs.
    External(Vec<SocketAddr>),
}

/// One pool, by replica index (filled in once the replicas' addresses are known).
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// The pool's own name (its cluster is `pool-<index>-<name>`); `None`: named after its
    /// base model. Two pools of one base model (a canary) are told apart by it.
    pub name: Option<String>,
    /// Base model name.
    pub base_model: String,
    /// LoRA adapters routed to this pool.
    pub adapters: Vec<String>,
    /// Indices into the replica list; empty means every replica (unless `no_endpoints`).
    pub replicas: Vec<usize>,
    /// A pool configured with no endpoint at all (every request to it is answered 503
    /// `rejected-no-endpoints`); `replicas` is ignored.
    pub no_endpoints: bool,
    /// Data parallelism: the ports each pod serves a rank on (see `Pool::target_ports`);
    /// the replicas are then every rank of every pod (e.g. the simulator's `listen` list).
    pub target_ports: Vec<u16>,
    /// Stale-metrics behaviour.
    pub failure_mode: FailureMode,
    /// The pool's `EndpointPickerConfig` (JSON), `null` for defaults.
    pub picker_config: serde_json::Value,
    /// Publish the pool's load for the gateways of other clusters.
    pub export: bool,
    /// With `export`, list the pool's members too (for importers in Endpoint Mode).
    pub export_members: bool,
    /// The gateways of other clusters that serve this pool too.
    pub peers: Option<Peers>,
}

impl PoolSpec {
    /// A pool of `base_model` on every replica.
    pub fn all(base_model: impl Into<String>) -> Self {
        PoolSpec {
            name: None,
            base_model: base_model.into(),
            adapters: Vec::new(),
            replicas: Vec::new(),
            no_endpoints: false,
            target_ports: Vec::new(),
            failure_mode: FailureMode::default(),
            picker_config: serde_json::Value::Null,
            export: false,
            export_members: false,
            peers: None,
        }
    }

    /// A pool of `base_model` on the replicas at `indices`.
    pub fn on(base_model: impl Into<String>, indices: &[usize]) -> Self {
        PoolSpec {
            replicas: indices.to_vec(),
            ..PoolSpec::all(base_model)
        }
    }

    /// A pool of `base_model` with no endpoint (the empty-pool case).
    pub fn empty(base_model: impl Into<String>) -> Self {
        PoolSpec {
            no_endpoints: true,
            ..PoolSpec::all(base_model)
        }
    }

    /// This pool, named `name` (see [`PoolSpec::name`]).
    pub fn named(self, name: impl Into<String>) -> Self {
        PoolSpec {
            name: Some(name.into()),
            ..self
        }
    }

    /// The pool over `replicas` (the replica list in order).
    pub fn resolve(&self, replicas: &[SocketAddr]) -> Result<Pool> {
        let endpoints = if self.no_endpoints {
            Vec::new()
        } else if self.replicas.is_empty() {
            replicas.to_vec()
        } else {
            self.replicas
                .iter()
                .map(|&i| {
                    replicas.get(i).copied().with_context(|| {
                        format!(
                            "pool {}: no replica {i} of {}",
                            self.base_model,
                            replicas.len()
                        )
                    })
                })
                .collect::<Result<_>>()?
        };
        Ok(Pool {
            name: self.name.clone(),
            base_model: self.base_model.clone(),
            adapters: self.adapters.clone(),
            endpoints,
            target_ports: self.target_ports.clone(),
            failure_mode: self.failure_mode,
            picker_config: self.picker_config.clone(),
            export: self.export,
            export_members: self.export_members,
            peers: self.peers.clone(),
        })
    }
}

/// How to bring a stack up.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// Envoy flavour.
    pub flavor: Flavor,
    /// The replicas.
    pub backends: Backends,
    /// The pools; default one pool of [`DEFAULT_MODEL`] on every replica.
    pub pools: Vec<PoolSpec>,
    /// Routes to the pools by index into `pools`: a model's traffic split across pools by
    /// weight (`RouteSpec::split`, per request or `sticky()` on `x-gateway-split-key`), a
    /// header-targeted rule (`RouteSpec::to(model, pool).when_header(name, value)`, always
    /// placed before the splits). Every model no route covers gets one route to its only
    /// pool (the default: none given, one route per pool); a model served by two pools
    /// needs a route. See [`infergate_cli::config::routes`].
    pub routes: Vec<RouteSpec>,
    /// The gateway's subset hint, by index into the replica list: every pick stays inside
    /// these endpoints (Envoy's `set_metadata` writes them into `envoy.lb.subset_hint` in
    /// front of the gateway filters). Empty (the default): no hint.
    pub subset_hint: Vec<usize>,
    /// Gateway settings for the plugin configurations.
    pub settings: GatewaySettings,
    /// Replaces the plugin configurations computed from `pools` and `settings`.
    pub plugins: Option<PluginConfigs>,
    /// Envoy process options (`concurrency`, log level, …).
    pub envoy: EnvoyOptions,
    /// How long the simulator may take to print its replicas.
    pub sim_timeout: Duration,
    /// `plain` only: the `probe` filter of this flavour's module in front of Envoy's router
    /// (see `envoy/config/plain.yaml`), from the module's bench build ([`probe_module`]: the
    /// release modules have no probe).
    pub probe: Option<Flavor>,
    /// The `/rr` round-robin baseline route and cluster (on by default: every stack runs
    /// for a demo, a benchmark or a test; off renders the deployment form).
    pub baseline: bool,
    /// The connection manager's client-side timeouts.
    pub timeouts: ClientTimeouts,
    /// Tenants, JWT verification and the billing log (none by default). With a billing
    /// log, Envoy writes its access log files out every [`BILLING_LOG_FLUSH`] unless
    /// `envoy.extra_args` already sets the interval.
    pub tenancy: Tenancy,
    /// `InferenceObjective` objects (JSON) for the picker, which maps a request's objective
    /// to its priority with them in every pool; the `InferenceObjective` objects of
    /// `tenancy` are added to these.
    pub objectives: Vec<serde_json::Value>,
    /// `InferenceModelRewrite` objects (JSON) for the router's `modelRewrites`; their
    /// `spec.poolRef.name` names a pool by its cluster name
    /// ([`infergate_cli::config::bootstrap::Pool::cluster_name`]).
    pub rewrites: Vec<serde_json::Value>,
    /// How the router splits a rewrite rule's traffic over its targets; `None` leaves the
    /// router's default (sticky, no session header).
    pub split: Option<Split>,
    /// Where the pool clusters take their members from: EDS files the stack writes (the
    /// default; a test rewrites them through [`Stack::set_members`] or [`Stack::eds`]),
    /// which the picker and the scraper then follow, or STATIC lists. The plain flavour
    /// always has STATIC clusters.
    pub membership: Membership,
    /// With membership `Eds`: the directory of EDS files to read, which the caller owns and
    /// may share between gateways (every gateway of a [`super::fleet::Fleet`] reads gateway
    /// 0's, as replicas of one gateway read one EDS source), already holding the members
    /// its owner announces; `None` (the default): a directory of the stack's own, where the
    /// stack writes the pools' endpoints before Envoy starts.
    pub eds_dir: Option<EdsDir>,
    /// Envoy's active health check of every pool member (`GET /health` at this period);
    /// `None` (the default): none.
    pub health_check: Option<Duration>,
    /// Keep the tenants' RPM and TPM in this global rate-limit service, shared with other
    /// gateways ([`super::global_quotas`]); `None`: in this gateway's process.
    pub global_quotas: Option<infergate_cli::config::global_quotas::GlobalQuotas>,
    /// Native only: the router and the picker as two filters even with nothing between
    /// them (`bench overhead`'s `native-two` arm); `false` (the default): one `gateway`
    /// filter unless the global rate-limit filter sits between them.
    pub two_filters: bool,
    /// The gateway listener's address; `None` (the default): 127.0.0.1 on a port the
    /// kernel chooses (or a free one, when a pool has peers).
    pub listener: Option<SocketAddr>,
}

impl StackOptions {
    /// Defaults for `flavor` on `backends`.
    pub fn new(flavor: Flavor, backends: Backends) -> Self {
        StackOptions {
            flavor,
            backends,
            pools: vec![PoolSpec::all(DEFAULT_MODEL)],
            routes: Vec::new(),
            subset_hint: Vec::new(),
            settings: GatewaySettings::default(),
            plugins: None,
            envoy: EnvoyOptions::default(),
            sim_timeout: Duration::from_secs(30),
            probe: None,
            baseline: true,
            timeouts: ClientTimeouts::default(),
            tenancy: Tenancy::default(),
            objectives: Vec::new(),
            rewrites: Vec::new(),
            split: None,
            membership: Membership::Eds,
            eds_dir: None,
            health_check: None,
            global_quotas: None,
            two_filters: false,
            listener: None,
        }
    }
}

/// The bench build of `flavor`'s module, the one with the `probe` filter
/// (`infergate_artefacts::BENCH_ARTEFACT_DIR`); `None` for `plain`.
pub fn probe_module(flavor: Flavor) -> Option<std::path::PathBuf> {
    match flavor {
        Flavor::Plain => None,
        Flavor::Wasm => Some(infergate_artefacts::Artefacts::wasm_probe_module()),
        Flavor::Native => Some(infergate_artefacts::Artefacts::native_probe_module()),
    }
}

/// A running stack; dropping it stops Envoy, then the simulator.
#[derive(Debug)]
pub struct Stack {
    flavor: Flavor,
    // Field order is drop order: Envoy stops before its upstreams.
    envoy: Envoy,
    sim: Option<SimProcess>,
    in_process: Option<SimHandle>,
    replicas: Vec<SocketAddr>,
    pools: Vec<Pool>,
    billing_log: Option<std::path::PathBuf>,
    eds: Option<EdsDir>,
    /// Holds the EDS files; removed after Envoy stopped.
    _eds_dir: Option<RunDir>,
}

impl Stack {
    /// Starts the replicas (if simulated) and Envoy, and waits until Envoy is ready.
    pub async fn start(opts: StackOptions) -> Result<Stack> {
        // The module this Envoy loads: its flavour's, or the probe's bench build on `plain`.
        match opts.probe {
            Some(probe) => {
                if let Some(module) = probe_module(probe) {
                    if !module.is_file() {
                        bail!(
                            "{probe} probe: module {} is not built (`cargo xtask bench \
                             overhead` builds it, with `--features probe`)",
                            module.display()
                        );
                    }
                }
            }
            None => {
                if let Some(module) = opts.flavor.artefact() {
                    if !module.is_file() {
                        bail!(
                            "{} flavour: module {} is not built (run `cargo xtask build`)",
                            opts.flavor,
                            module.display()
                        );
                    }
                }
            }
        }
        let (sim, in_process, replicas) = match &opts.backends {
            Backends::Simulator { replicas, args } => {
                let sim = SimProcess::start(*replicas, args, opts.sim_timeout).await?;
                let addrs = sim.replicas().to_vec();
                (Some(sim), None, addrs)
            }
            Backends::InProcess(cfg) => {
                let handle = crate::sim::start((**cfg).clone()).await?;
                let addrs = handle.addrs().to_vec();
                (None, Some(handle), addrs)
            }
            Backends::External(addrs) => (None, None, addrs.clone()),
        };
        if replicas.is_empty() {
            bail!("a stack needs at least one replica");
        }
        let pools = opts
            .pools
            .iter()
            .map(|p| p.resolve(&replicas))
            .collect::<Result<Vec<_>>>()?;
        let mut params = BootstrapParams::new(opts.flavor, pools.clone());
        params.rr_endpoints = replicas.clone();
        params.routes = opts.routes.clone();
        params.subset_hint =
            opts.subset_hint
                .iter()
                .map(|&i| {
                    replicas.get(i).copied().with_context(|| {
                        format!("subset hint: no replica {i} of {}", replicas.len())
                    })
                })
                .collect::<Result<_>>()?;
        params.baseline = opts.baseline;
        params.timeouts = opts.timeouts;
        params.tenancy = opts.tenancy.clone();
        params.objectives = opts.objectives.clone();
        if let Some(probe) = opts.probe {
            params.probe = Some(probe);
            params.module = probe_module(probe);
        }
        params.plugins = opts
            .plugins
            .clone()
            .unwrap_or_else(|| PluginConfigs::for_pools(&pools, &opts.settings));
        apply_rewrites(
            &mut params.plugins.router,
            &opts.rewrites,
            opts.split.as_ref(),
        )?;
        if let Some(listener) = opts.listener {
            params.listener_address = listener.ip();
            params.listener_port = listener.port();
        }
        if pools.iter().any(|p| p.peers.is_some()) && params.listener_port == 0 {
            // A pool with peers lists this gateway's own listener in its peers cluster.
            params.listener_port = free_port()?;
        }
        params.health_check = opts.health_check;
        params.global_quotas = opts.global_quotas.clone();
        params.two_filters = opts.two_filters;
        // The plain flavour (no gateway filters) has STATIC clusters only.
        let membership = if opts.flavor == Flavor::Plain {
            Membership::Static
        } else {
            opts.membership
        };
        params.membership = membership;
        let eds_dir = match membership {
            Membership::Static => None,
            Membership::Eds => {
                // A shared directory is its owner's to remove; a directory of our own
                // lives in a run directory of ours.
                let (run, eds) = match &opts.eds_dir {
                    Some(shared) => (None, shared.clone()),
                    None => {
                        let run = RunDir::new("eds")?;
                        let eds = EdsDir::create(run.path().join("eds"))?;
                        (Some(run), eds)
                    }
                };
                params.eds = Some(eds);
                if opts.flavor == Flavor::Wasm && params.admin_port == 0 {
                    // Its scraper reaches admin /clusters through a STATIC cluster, so the
                    // admin port must be known before Envoy starts.
                    params.admin_port = free_port()?;
                }
                // A shared directory already holds the members its owner announces.
                if run.is_some() {
                    write_eds_files(&params)?;
                }
                run
            }
        };
        let bootstrap = render(&params)?;
        let mut envoy_opts = opts.envoy.clone();
        if opts.tenancy.billing_log.is_some() {
            with_file_flush(&mut envoy_opts.extra_args);
        }
        let envoy = Envoy::start(&bootstrap, &envoy_opts).await?;
        if opts.flavor != Flavor::Plain {
            wait_first_snapshot(&envoy).await?;
            if opts.flavor == Flavor::Wasm && envoy_opts.concurrency == 1 {
                // The worker's VM claims the owner's lease at its first request only once
                // the roster has settled: past that, so the first request moves the state
                // before any other, not in the middle of a run.
                let settle = infergate_filters::election::CLAIM_SETTLE_MS;
                tokio::time::sleep(std::time::Duration::from_millis(settle)).await;
            }
            if membership == Membership::Eds {
                if opts.health_check.is_some() {
                    wait_health_checked(&envoy, &pools).await?;
                }
                // The members of the clusters the scraper follows (a data-parallel pool, or
                // a list a caller edited, keeps its static list).
                let followed = params
                    .plugins
                    .clone()
                    .follow_clusters(&pools, opts.flavor == Flavor::Wasm);
                let members = pools
                    .iter()
                    .enumerate()
                    .filter(|(i, p)| followed.contains(&p.cluster_name(*i)))
                    .map(|(_, p)| p.endpoints.len() as i64)
                    .sum();
                wait_members(&envoy, members).await?;
            }
        }
        Ok(Stack {
            flavor: opts.flavor,
            envoy,
            sim,
            in_process,
            replicas,
            pools,
            billing_log: opts.tenancy.billing_log.clone(),
            eds: params.eds.clone(),
            _eds_dir: eds_dir,
        })
    }

    /// The flavour Envoy runs.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// `http://127.0.0.1:PORT`: requests here go through the gateway filters.
    pub fn picker_url(&self) -> String {
        self.envoy.base_url()
    }

    /// `http://127.0.0.1:PORT/rr`: the round-robin baseline (no gateway filters), when the
    /// stack was started with it (the default).
    pub fn baseline_url(&self) -> String {
        format!("{}/rr", self.envoy.base_url())
    }

    /// The Envoy instance (admin, stats, log).
    pub fn envoy(&self) -> &Envoy {
        &self.envoy
    }

    /// Every replica, in order.
    pub fn replicas(&self) -> &[SocketAddr] {
        &self.replicas
    }

    /// The resolved pools.
    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    /// The billing log Envoy writes, when the stack has one ([`infergate_cli::config::tenancy::read_billing_log`]
    /// reads it).
    pub fn billing_log(&self) -> Option<&std::path::Path> {
        self.billing_log.as_deref()
    }

    /// The EDS files of the pool clusters (membership `Eds`): rewrite one to change its
    /// cluster's members (the file of pool `i` is `eds.path(&pools()[i].cluster_name(i))`).
    pub fn eds(&self) -> Option<&EdsDir> {
        self.eds.as_ref()
    }

    /// Announces `members` (all healthy) as the members of pool `index`'s cluster through
    /// its EDS file; an error without EDS membership.
    pub fn set_members(&self, index: usize, members: &[SocketAddr]) -> Result<()> {
        let (Some(eds), Some(pool)) = (&self.eds, self.pools.get(index)) else {
            bail!("pool {index}: no such pool, or the stack has no EDS membership");
        };
        eds.write_healthy(&pool.cluster_name(index), members)
    }

    /// Whether the replicas are a simulator this stack started.
    pub fn simulated(&self) -> bool {
        self.sim.is_some() || self.in_process.is_some()
    }

    /// The in-process simulator, if this stack runs one (engine stats per replica).
    pub fn sim(&self) -> Option<&SimHandle> {
        self.in_process.as_ref()
    }
}

/// A loopback port free right now (bound, read and released).
fn free_port() -> Result<u16> {
    let socket = std::net::TcpListener::bind(("127.0.0.1", 0)).context("finding a free port")?;
    Ok(socket.local_addr()?.port())
}

/// Adds `--file-flush-interval-msec` ([`BILLING_LOG_FLUSH`]) to Envoy's arguments, unless
/// they set it already.
pub fn with_file_flush(args: &mut Vec<String>) {
    if !args.iter().any(|a| a == FILE_FLUSH_FLAG) {
        args.push(FILE_FLUSH_FLAG.into());
        args.push(BILLING_LOG_FLUSH.as_millis().to_string());
    }
}

/// With an active health check, Envoy flags every new host as failing it until its first
/// check passes, and the Wasm scraper reads those flags (admin `/clusters`): waits until no
/// pool cluster's host is flagged, at most 15 s.
async fn wait_health_checked(envoy: &Envoy, pools: &[Pool]) -> Result<()> {
    let names = infergate_cli::config::bootstrap::cluster_names(pools);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let text = super::client::get(&format!("http://{}/clusters", envoy.admin()))
            .await?
            .text();
        let failing = text
            .lines()
            .filter(|l| names.iter().any(|n| l.starts_with(&format!("{n}::"))))
            .filter(|l| l.contains("::health_flags::") && l.contains("failed_active_hc"))
            .count();
        if failing == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{failing} pool members still fail Envoy's health check after 15 s");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// With EDS membership the first snapshot may come before the scraper learned the pool
/// clusters' members (Envoy hands the cluster its hosts as it initializes): waits until the
/// scraper counts `members` of them in all (`infergate.scraper.cluster_members`), at most
/// 15 s, so that a `FailClose` pool does not answer 503 to the first requests.
async fn wait_members(envoy: &Envoy, members: i64) -> Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let seen = envoy
            .stats()
            .await?
            .sum_containing("infergate.scraper.cluster_members");
        if seen >= members {
            // One more round, so the snapshot the pickers read holds them with metrics.
            let published = envoy
                .stats()
                .await?
                .sum_containing("infergate.scraper.publishes");
            while envoy
                .stats()
                .await?
                .sum_containing("infergate.scraper.publishes")
                < published + 4
            {
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the scraper knew {seen} of the pools' {members} EDS members after 15 s; \
                 log tail:\n{}",
                envoy.log_tail(30)
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Envoy reports `/ready` before the scraper's first round has landed; until then a
/// `FailClose` picker rightly answers 503. Waits for the first published snapshot so that
/// whoever uses the stack (a person after `up`, a benchmark, a test) meets a working gateway.
async fn wait_first_snapshot(envoy: &Envoy) -> Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        if envoy
            .stats()
            .await?
            .sum_containing("infergate.scraper.publishes")
            >= 1
        {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "the scraper published no snapshot within 15 s of Envoy being ready; log tail:\n{}",
                envoy.log_tail(30)
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
