//! `cargo xtask up`: the stack for a person, on the simulated pool, until Ctrl-C.

use super::bootstrap::Flavor;
use super::envoy::EnvoyOptions;
use super::stack::{Backends, PoolSpec, Stack, StackOptions};
use crate::sim::SimConfig;
use anyhow::{Context, Result};
use std::path::PathBuf;
use tokio::signal::unix::{signal, SignalKind};

/// Options of `cargo xtask up`.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// `--flavor wasm|native|plain`.
    pub flavor: Flavor,
    /// `--replicas N`.
    pub replicas: usize,
    /// Envoy worker threads.
    pub concurrency: u32,
    /// A `SimConfig` file (YAML/JSON); the simulator's calibration defaults otherwise.
    pub sim_config: Option<PathBuf>,
}

impl Default for UpOptions {
    fn default() -> Self {
        UpOptions {
            flavor: Flavor::Wasm,
            replicas: 4,
            concurrency: 2,
            sim_config: None,
        }
    }
}

impl UpOptions {
    /// Parses `--flavor F --replicas N --concurrency C --sim-config FILE`.
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut opts = UpOptions::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--flavor" | "--flavour" => opts.flavor = value("--flavor")?.parse()?,
                "--replicas" => {
                    opts.replicas = value("--replicas")?.parse().context("--replicas")?
                }
                "--concurrency" => {
                    opts.concurrency = value("--concurrency")?.parse().context("--concurrency")?
                }
                "--sim-config" => opts.sim_config = Some(value("--sim-config")?.into()),
                other => anyhow::bail!(
                    "unknown argument `{other}`; usage: up [--flavor wasm|native|plain] \
                     [--replicas N] [--concurrency C] [--sim-config FILE]"
                ),
            }
        }
        Ok(opts)
    }
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
    let mut stack_opts = StackOptions::new(opts.flavor, Backends::InProcess(Box::new(sim)));
    stack_opts.pools = pools;
    stack_opts.envoy = EnvoyOptions {
        concurrency: opts.concurrency,
        ..EnvoyOptions::default()
    };
    Ok(stack_opts)
}

/// The two lines `up` prints on stdout: `picker: URL` and `baseline: URL`.
pub fn announcement(stack: &Stack) -> [String; 2] {
    [
        format!("picker: {}", stack.picker_url()),
        format!("baseline: {}", stack.baseline_url()),
    ]
}

/// Brings the stack up, prints `picker: URL` and `baseline: URL` on lines of their own,
/// and keeps it up until SIGINT or SIGTERM; then stops Envoy and the simulator.
pub async fn up(opts: UpOptions) -> Result<()> {
    // Installed first, so a signal that arrives while Envoy starts still ends in a clean stop.
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let stack = Stack::start(stack_options(&opts)?).await?;
    for line in announcement(&stack) {
        println!("{line}");
    }
    eprintln!(
        "flavour {}, {} replicas, Envoy admin http://{}, log {}; Ctrl-C stops",
        stack.flavor(),
        stack.replicas().len(),
        stack.envoy().admin(),
        stack.envoy().log_path().display()
    );
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("stopping Envoy and the simulator");
    drop(stack);
    Ok(())
}

/// Runs [`up`] on a fresh Tokio runtime (for the synchronous xtask entry point).
pub fn up_blocking(args: &[String]) -> Result<()> {
    let opts = UpOptions::parse(args)?;
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
}
